"""Does ``compile = true`` (torch.compile of the training forward) pay for itself?

Runs ``update_step`` (forward, loss, backward, AdamW) on synthetic on-policy mini-batches of B
rows whose response lengths vary from step to step (uniform in [T/2, T], as a run's trimmed
batches do), eager and with ``compile = true`` (``torch.compile(model, dynamic=True)``), from the
same initial weights, in one process: two models, each with its own optimizer, step i of both on
the same batch i, their order alternating from step to step (`timing.order`). Step 0 of each side
is its full-size warm-up (the compiled side compiles there); the medians are over the ``--steps``
- 1 steps after it (at least 3 for a figure to quote; fewer print a warning line). Prints one JSON
line per (preset, T, device):

    compile_overhead_s = Σ_steps compiled - steps · median(compiled step)   (compilation, recompiles)
    saved_per_step_s   = median(eager step) - median(compiled step)
    break_even_updates = compile_overhead_s / saved_per_step_s               (inf when nothing is saved)
    speedup_per_step   = median(eager step) / median(compiled step)

A run of U updates gains from ``compile`` when U > break_even_updates (the old-logp forwards of
reuse N > 1 add N - 1 compiled forwards per rollout step, so this is if anything pessimistic).

    .venv/bin/python benchmarks/bench_compile.py [--presets tiny-dense] [--max-new-tokens 32 256]
        [--rows 32] [--steps 20] [--device cpu]
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch
from timing import check_repeats, median, order

from respo.runtime.precision import resolve_device

#: Prompt columns of the synthetic rows.
PROMPT_LEN = 16
#: First ordinary character id of the char tokenizer (ids below are special tokens).
FIRST_CHAR_ID = 4


def synthetic_batch(B: int, T: int, vocab: int, gen: torch.Generator):
    """An on-policy mini-batch of B rows, response lengths uniform in [T/2, T], random advantages."""
    from respo.train.buffer import Batch

    L = PROMPT_LEN + T
    ids = torch.randint(FIRST_CHAR_ID, vocab, (B, L), generator=gen)  # (B, L)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=gen)  # (B,)
    mask = (torch.arange(T) < lengths[:, None]).float()  # (B, T)
    attn = torch.cat([torch.ones(B, PROMPT_LEN, dtype=torch.long), mask.long()], 1)  # (B, L)
    adv = torch.randn(B, generator=gen)  # (B,)
    return Batch(input_ids=ids, attention_mask=attn, response_start=PROMPT_LEN, mask=mask,
                 behaviour_logp=torch.zeros(B, T), rewards=torch.zeros(B), version=torch.zeros(B, dtype=torch.long),
                 adv=adv, old_logp=torch.zeros(B, T))


def run_sides(models: dict, cfgs: dict, batches, device) -> dict[str, list[float]]:
    """Seconds of each side's update on each batch, the sides alternating their order per batch."""
    from respo.train.update import UpdateSettings, make_optimizer, update_step

    opts = {k: make_optimizer(models[k], cfgs[k]) for k in models}
    settings = {k: UpdateSettings.of(cfgs[k]) for k in models}
    times: dict[str, list[float]] = {k: [] for k in models}
    for i, batch in enumerate(batches):
        for k in order(list(models), i):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            update_step(models[k], *opts[k], batch, settings[k], on_policy=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[k].append(time.perf_counter() - t0)
    return times


def measure(preset: str, T: int, rows: int, steps: int, device: torch.device, dtype: str, seed: int) -> dict:
    from respo.runtime.models import PRESETS, build_policy
    from respo.runtime.tokenizer import build_char_tokenizer
    from respo.train.config import TrainConfig, apply_overrides

    tok = build_char_tokenizer()
    base = build_policy(preset, tok, seed=seed, max_position_embeddings=max(PROMPT_LEN + T,
                                                                            PRESETS[preset]["max_position_embeddings"]))
    gen = torch.Generator().manual_seed(seed)
    batches = [synthetic_batch(rows, T, len(tok), gen) for _ in range(steps)]
    out = {"preset": preset, "T": T, "rows": rows, "steps": steps, "device": str(device), "dtype": dtype}
    cfgs = {name: apply_overrides(TrainConfig(), {"model": preset, "objective": "grpo", "warmup": 0, "dtype": dtype,
                                                  "compile": name == "compiled", "prompts": rows, "group_size": 1,
                                                  "adv_kind": "grpo", "device": str(device)})
            for name in ("eager", "compiled")}
    models = {name: copy.deepcopy(base).to(device).train() for name in cfgs}
    times = run_sides(models, cfgs, batches, device)
    med = {name: median(t[1:]) for name, t in times.items()}  # after each side's warm-up step
    for name, t in times.items():
        out[f"{name}_total_s"] = sum(t)
        out[f"{name}_median_step_s"] = med[name]
        out[f"{name}_first_step_s"] = t[0]
    overhead = out["compiled_total_s"] - steps * med["compiled"]
    saved = med["eager"] - med["compiled"]
    out.update({"compile_overhead_s": overhead, "saved_per_step_s": saved,
                "break_even_updates": overhead / saved if saved > 0 else float("inf"),
                "speedup_per_step": med["eager"] / med["compiled"]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["tiny-dense"])
    ap.add_argument("--max-new-tokens", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20, help="updates per side, the first a warm-up")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    check_repeats(a.steps - 1, "--steps - 1 (measured steps)")
    torch.set_num_threads(a.threads)
    device = resolve_device(a.device)
    for preset in a.presets:
        for T in a.max_new_tokens:
            r = measure(preset, T, a.rows, a.steps, device, a.dtype, a.seed)
            print(json.dumps({**r, "threads": a.threads}), flush=True)


if __name__ == "__main__":
    main()
