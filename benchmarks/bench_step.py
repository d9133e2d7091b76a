"""One RL update end to end (sampling + old log-probs + training), respo vs TRL's GRPOTrainer.

Both sides get the same freshly initialised tiny preset (same seed), the same prompts (3-digit
addition), B prompts x G responses per update, the same maximum response length, one optimizer
step per rollout (on-policy, N = 1), GRPO's clipped objective, and the same torch thread count,
measured in one process one after the other. Responses are really ``--max-new-tokens`` long on
both sides: a bench-only hook on the output layer pushes the EOS logit to ``EOS_LOGIT_PENALTY`` in
every forward (sampling, old log-probs, training), so no row stops early. Every row is then cut
at the maximum length and gets the same reward, so the advantages are 0; that changes no work:
both sides run the loss, backward and the optimizer step unconditionally.

Timing (`timing`): each side is measured ``--repeats`` times (default 3; fewer print a warning
line), respo and TRL alternating which goes first; each measurement builds its side afresh and runs
one full-size warm-up update before its ``--steps`` measured ones. Prints JSON lines: per side,
preset and repeat, seconds per update (median of the measured steps), response tokens per second, and for respo the share of step time spent inside the
model's forward (every call of the top module: sampling decode steps, the old-logp forward, the
training forward) plus backward; the rest (sampling logic, log-softmax, loss, optimizer,
bookkeeping) is overhead. The same share is measured for TRL's step (its generate() decode calls,
forwards and backward). Finally the throughput ratio respo / TRL of the medians over the repeats,
per preset and length.

Then the training forward+backward alone (``token_logprobs`` of a (B, L) batch, a loss, backward)
in float32 and under bfloat16 autocast, one model, both dtypes warmed up at the full size and then
``--repeats`` steps of each, alternating: tokens/s and achieved FLOP/s (counted by
``torch.utils.flop_counter``) as a fraction of the single-thread matmul peak measured here
(a square ``MATMUL_PEAK_SIZE`` matmul in each dtype), and the ratio bfloat16 / float32 of tokens/s.

    .venv/bin/python benchmarks/bench_step.py [--presets tiny-dense tiny-moe] [--max-new-tokens 32 256]
        [--steps 3] [--repeats 3] [--threads 1] [--skip-trl] [--skip-step] [--skip-train] [--device cpu]

A quick look (not a figure to quote): ``--presets tiny-dense --prompts 4 --group-size 4
--max-new-tokens 32 --steps 1 --repeats 1``.

Timings on a busy machine are noisy: compare ratios from one call, not absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch
from timing import check_repeats, median, order, time_sides
from torch.utils.flop_counter import FlopCounterMode

from respo.runtime.precision import resolve_device

#: Added to the EOS logit by the bench-only hook: exp(-1e4) is 0 in float32 and bfloat16, so no
#: row samples EOS, while log-probs and entropies stay finite.
EOS_LOGIT_PENALTY = -1e4
#: Side of the square matmul that measures the machine's single-thread peak.
MATMUL_PEAK_SIZE = 1024
#: Prompt columns of the synthetic training batch (left part of each row, not scored).
TRAIN_PROMPT_LEN = 24


def suppress_eos(model, eos_id: int):
    """Forward hook on the output layer: logits[..., eos] += EOS_LOGIT_PENALTY. Returns the handle."""
    head = model.get_output_embeddings()
    bias = torch.zeros(head.out_features)  # (V,)
    bias[eos_id] = EOS_LOGIT_PENALTY
    return head.register_forward_hook(lambda module, args, out: out + bias.to(out.device, out.dtype))


def policy_for(preset: str, tok, seed: int, positions: int):
    """A preset policy with room for ``positions`` positions (RoPE has no table: no number changes)."""
    from respo.runtime.models import PRESETS, build_policy

    return build_policy(preset, tok, seed=seed,
                        max_position_embeddings=max(positions, PRESETS[preset]["max_position_embeddings"]))

class ModelClock:
    """Wall time inside the model's forward calls and inside autograd backward calls."""

    def __init__(self, model):
        self.fwd = 0.0
        self.bwd = 0.0
        self._depth = 0
        model.register_forward_pre_hook(self._pre)
        model.register_forward_hook(self._post)
        self._orig_backward = torch.Tensor.backward
        clock = self

        def backward(tensor, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return clock._orig_backward(tensor, *args, **kwargs)
            finally:
                clock.bwd += time.perf_counter() - t0

        torch.Tensor.backward = backward

    def _pre(self, module, args):
        if self._depth == 0:
            self._t0 = time.perf_counter()
        self._depth += 1

    def _post(self, module, args, out):
        self._depth -= 1
        if self._depth == 0:
            self.fwd += time.perf_counter() - self._t0

    def reset(self):
        self.fwd = self.bwd = 0.0

    def close(self):
        torch.Tensor.backward = self._orig_backward


def update_setup(preset: str, B: int, T: int, steps: int, seed: int):
    """What each side of the update benchmark starts from: ``(tok, model, task, pool)``, the char tokenizer, the
    preset policy in train mode with EOS suppressed and room for T + 64 positions, addition with DAPO's overlong
    penalty at T, and B prompts for each of the ``steps`` + 1 updates (the first is the warm-up)."""
    from respo.runtime.tasks import get_task
    from respo.runtime.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    model = policy_for(preset, tok, seed, T + 64).train()
    suppress_eos(model, tok.eos_token_id)
    task = get_task("addition", overlong=(T, T - 1))
    return tok, model, task, task.examples("train", B * (steps + 1), seed)


def bench_respo(preset: str, B: int, G: int, T: int, steps: int, seed: int = 0) -> dict:
    from respo.train.config import Forward, Sampling, TrainConfig, apply_overrides
    from respo.train.policy import Policy
    from respo.core import group_advantages
    from respo.runtime.engines.respo import RespoEngine
    from respo.train.rollout import recompute_logp, sample_rollout
    from respo.train.update import UpdateSettings, make_optimizer, update_step

    tok, model, task, pool = update_setup(preset, B, T, steps, seed)
    cfg = apply_overrides(TrainConfig(), {"model": preset, "warm_start": False, "objective": "grpo", "prompts": B,
                                          "group_size": G, "max_new_tokens": T, "lr": 1e-5, "warmup": 0})
    policy = Policy(model, tok, {})
    opt, sched = make_optimizer(model, cfg)
    sampling, forward, settings = Sampling.of(cfg), Forward.of(cfg), UpdateSettings.of(cfg)
    gen = torch.Generator().manual_seed(seed)
    clock = ModelClock(model)
    times, tokens, shares, phases = [], [], [], []
    try:
        for step in range(steps + 1):
            clock.reset()
            t0 = time.perf_counter()
            engine = RespoEngine(policy.model, policy.tokenizer, dtype=cfg.dtype)
            batch, rec = sample_rollout(engine, task, pool, list(range(step * B, (step + 1) * B)), sampling, gen, step)
            batch.adv = group_advantages(batch.rewards, G)  # as the loop computes them
            t1 = time.perf_counter()
            # as the sync trainer at N = 1: the only mini-batch is on-policy, old_logp = detached training forward
            batch.old_logp = recompute_logp(model, batch, forward, mini_batch=cfg.mini_batch_seqs,
                                            start_row=cfg.mini_batch_seqs)
            t2 = time.perf_counter()
            update_step(model, opt, sched, batch, settings, on_policy=True)
            t3 = time.perf_counter()
            if step == 0:
                continue  # warm-up
            times.append(t3 - t0)
            tokens.append(float(batch.mask.sum()))
            shares.append((clock.fwd + clock.bwd) / (t3 - t0))
            phases.append((t1 - t0, t2 - t1, t3 - t2))
    finally:
        clock.close()
    i = sorted(range(len(times)), key=times.__getitem__)[len(times) // 2]  # the median step
    return {"side": "respo", "preset": preset, "B": B, "G": G, "T": T, "s_per_update": times[i],
            "response_tokens_per_update": tokens[i], "tokens_per_s": tokens[i] / times[i],
            "model_compute_share": shares[i], "phase_s": {"sample": phases[i][0], "old_logp": phases[i][1],
                                                          "train": phases[i][2]}}


def bench_trl(preset: str, B: int, G: int, T: int, steps: int, seed: int = 0) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tok, model, task, pool = update_setup(preset, B, T, steps, seed)
    ds = Dataset.from_list([{"prompt": e.prompt, "idx": i} for i, e in enumerate(pool)])

    def reward(prompts, completions, idx, completion_ids=None, **kw):
        lengths = [len(c) for c in completion_ids] if completion_ids is not None else [None] * len(completions)
        return [task.score(c, pool[i], length=n) for c, i, n in zip(completions, idx, lengths)]

    model_clock = ModelClock(model)

    class Clock(TrainerCallback):
        def __init__(self):
            self.times, self.tokens, self.shares = [], [], []

        def on_step_begin(self, args, state, control, **kw):
            model_clock.reset()
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self.t0)
            self.shares.append((model_clock.fwd + model_clock.bwd) / self.times[-1])

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                self.tokens.append(float(logs["completions/mean_length"]) * B * G)

    clock = Clock()
    out = tempfile.mkdtemp(prefix="respo-bench-trl-")
    args = GRPOConfig(output_dir=out, per_device_train_batch_size=B * G, num_generations=G, max_completion_length=T,
                      steps_per_generation=1, num_iterations=1, max_steps=steps + 1, beta=0.0, learning_rate=1e-5,
                      loss_type="grpo", temperature=1.0, report_to=[], logging_steps=1, save_strategy="no",
                      use_cpu=True, bf16=False, disable_dropout=True, shuffle_dataset=False, seed=seed,
                      disable_tqdm=True)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok,
                          callbacks=[clock])
    try:
        trainer.train()
    finally:
        model_clock.close()
    times, tokens = clock.times[1:], clock.tokens[1:]
    i = sorted(range(len(times)), key=times.__getitem__)[len(times) // 2]  # the median step
    return {"side": "trl", "preset": preset, "B": B, "G": G, "T": T, "s_per_update": times[i],
            "response_tokens_per_update": tokens[i], "tokens_per_s": tokens[i] / times[i],
            "model_compute_share": clock.shares[1:][i]}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak_flops(dtype: torch.dtype, reps: int = 5, device: torch.device = torch.device("cpu")) -> float:
    """FLOP/s of the best of ``reps`` (n, n) @ (n, n) matmuls, n = MATMUL_PEAK_SIZE (2 n³ FLOPs each)."""
    n = MATMUL_PEAK_SIZE
    a, b = torch.randn(n, n).to(device, dtype), torch.randn(n, n).to(device, dtype)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def bench_train(preset: str, B: int, L: int, dtypes: list[torch.dtype], repeats: int, seed: int = 0,
                device: torch.device = torch.device("cpu")) -> dict[str, dict]:
    """Forward (``token_logprobs``) + backward of a (B, L) batch, prompts of TRAIN_PROMPT_LEN columns,
    in each of ``dtypes`` as a run computes it (`respo.runtime.precision.mixed_precision`), timed with
    `timing.time_sides` (one model; each dtype warmed up at the full size, alternating order)."""
    from respo.runtime.logprobs import token_logprobs
    from respo.runtime.precision import mixed_precision
    from respo.runtime.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    model = policy_for(preset, tok, seed, L).to(device).train()
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, len(tok), (B, L), generator=gen).to(device)  # (B, L) ordinary characters
    attention_mask = torch.ones_like(input_ids)  # (B, L)

    def step(dtype_name):
        def call(_r=0):
            with mixed_precision(model, dtype_name):
                logp, _ = token_logprobs(model, input_ids, attention_mask, TRAIN_PROMPT_LEN)  # (B, T)
            (-logp.mean()).backward()
            model.zero_grad(set_to_none=True)
        return call

    names = [str(d).removeprefix("torch.") for d in dtypes]
    run = {n: step(n) for n in names}
    flops = {}
    for n in names:
        with FlopCounterMode(display=False) as counter:
            run[n]()
        flops[n] = counter.get_total_flops()
    times = time_sides(run, repeats, sync=lambda: _sync(device))
    out = {}
    for n, d in zip(names, dtypes):
        t = median(times[n])
        peak = matmul_peak_flops(d, device=device)
        out[n] = {"side": "train_forward_backward", "preset": preset, "dtype": n, "device": str(device),
                  "B": B, "L": L, "repeats": repeats, "response_tokens": B * (L - TRAIN_PROMPT_LEN), "s_per_step": t,
                  "times_s": [round(x, 4) for x in times[n]], "tokens_per_s": B * L / t,
                  "response_tokens_per_s": B * (L - TRAIN_PROMPT_LEN) / t, "flops_per_step": flops[n],
                  "achieved_flops_per_s": flops[n] / t, "matmul_peak_flops_per_s": peak,
                  "fraction_of_matmul_peak": flops[n] / t / peak}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["tiny-dense", "tiny-moe"])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--steps", type=int, default=3, help="measured updates per side and repeat (after 1 warm-up)")
    ap.add_argument("--repeats", type=int, default=3, help="repeats of each side, alternating order; medians over them")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-trl", action="store_true")
    ap.add_argument("--skip-step", action="store_true", help="only the training forward+backward")
    ap.add_argument("--skip-train", action="store_true", help="no separate training forward+backward")
    ap.add_argument("--train-batch", type=int, default=64)
    ap.add_argument("--train-len", type=int, default=280, help="columns per row, prompt included")
    ap.add_argument("--device", default="cpu", help="device of the training forward+backward (cpu, cuda, auto)")
    a = ap.parse_args()
    check_repeats(a.repeats)
    torch.set_num_threads(a.threads)
    for preset in a.presets:
        for T in ([] if a.skip_step else a.max_new_tokens):
            sides = {"respo": bench_respo} if a.skip_trl else {"respo": bench_respo, "trl": bench_trl}
            res: dict[str, list[dict]] = {k: [] for k in sides}
            for r in range(a.repeats):
                for side in order(list(sides), r):
                    out = sides[side](preset, a.prompts, a.group_size, T, a.steps)
                    res[side].append(out)
                    print(json.dumps({**out, "repeat": r, "threads": a.threads}), flush=True)
            tps = {k: median([o["tokens_per_s"] for o in v]) for k, v in res.items()}
            spu = {k: median([o["s_per_update"] for o in v]) for k, v in res.items()}
            for k in sides:
                print(json.dumps({"side": k, "preset": preset, "T": T, "repeats": a.repeats, "threads": a.threads,
                                  "median_tokens_per_s": tps[k], "median_s_per_update": spu[k]}), flush=True)
            if "trl" in sides:
                print(json.dumps({"preset": preset, "T": T, "repeats": a.repeats,
                                  "throughput_ratio_respo_over_trl": tps["respo"] / tps["trl"],
                                  "step_time_ratio_trl_over_respo": spu["trl"] / spu["respo"]}), flush=True)
        if not a.skip_train:
            r = bench_train(preset, a.train_batch, a.train_len, [torch.float32, torch.bfloat16], a.repeats,
                            device=resolve_device(a.device))
            for line in r.values():
                print(json.dumps({**line, "threads": a.threads}), flush=True)
            print(json.dumps({"side": "train_forward_backward", "preset": preset, "B": a.train_batch, "L": a.train_len,
                              "repeats": a.repeats, "threads": a.threads, "ratio_bfloat16_over_float32_tokens_per_s":
                              r["bfloat16"]["tokens_per_s"] / r["float32"]["tokens_per_s"]}), flush=True)


if __name__ == "__main__":
    main()
