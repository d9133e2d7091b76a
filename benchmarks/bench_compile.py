"""Does ``compile = true`` (torch.compile of the training forward) pay for itself?

Runs ``update_step`` (forward, loss, backward, AdamW) on synthetic on-policy mini-batches of B
rows whose response lengths vary from step to step (uniform in [T/2, T], as a run's trimmed
batches do), once eager and once with ``compile = true`` (``torch.compile(model, dynamic=True)``),
from the same initial weights. Prints one JSON line per (preset, T, device):

    compile_overhead_s = Σ_steps compiled - steps · median(compiled step)   (compilation, recompiles)
    saved_per_step_s   = median(eager step) - median(compiled step)
    break_even_updates = compile_overhead_s / saved_per_step_s               (inf when nothing is saved)

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


def run_steps(model, cfg, batches, device) -> list[float]:
    from respo.train.update import make_optimizer, update_step

    opt, sched = make_optimizer(model, cfg)
    times = []
    for batch in batches:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        update_step(model, opt, sched, batch, cfg, on_policy=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
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
    med = {}
    for compiled in (False, True):
        cfg = apply_overrides(TrainConfig(), {"model": preset, "objective": "grpo", "warmup": 0, "dtype": dtype,
                                              "compile": compiled, "prompts": rows, "group_size": 1,
                                              "adv_kind": "grpo", "device": str(device)})
        model = copy.deepcopy(base).to(device).train()
        times = run_steps(model, cfg, batches, device)
        name = "compiled" if compiled else "eager"
        med[name] = sorted(times)[len(times) // 2]
        out[f"{name}_total_s"] = sum(times)
        out[f"{name}_median_step_s"] = med[name]
        out[f"{name}_first_step_s"] = times[0]
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
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    device = resolve_device(a.device)
    for preset in a.presets:
        for T in a.max_new_tokens:
            r = measure(preset, T, a.rows, a.steps, device, a.dtype, a.seed)
            print(json.dumps({**r, "threads": a.threads}), flush=True)


if __name__ == "__main__":
    main()
