"""One RL update end to end (sampling + old log-probs + training), respo vs TRL's GRPOTrainer.

Both sides get the same freshly initialised tiny preset (same seed), the same prompts (3-digit
addition), B prompts x G responses per update, the same maximum response length, one optimizer
step per rollout (on-policy, N = 1), GRPO's clipped objective, and the same torch thread count,
measured in one process one after the other. Rewards use DAPO's overlong penalty so a random policy
still gets non-zero advantages (both sides then really run backward).

Prints JSON lines: per side and preset, seconds per update (median of the measured steps after
warm-up), response tokens per second, and for respo the share of step time spent inside the
model's forward (every call of the top module: sampling decode steps, the old-logp forward, the
training forward) plus backward; the rest (sampling logic, log-softmax, loss, optimizer,
bookkeeping) is overhead. The same share is measured for TRL's step (its generate() decode calls,
forwards and backward). Finally the throughput ratio respo / TRL.

    .venv/bin/python benchmarks/bench_step.py [--presets tiny-dense tiny-moe] [--steps 3] [--threads 1]

Timings on a shared machine are noisy: compare ratios from one call, not absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch


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


def bench_respo(preset: str, B: int, G: int, T: int, steps: int, seed: int = 0) -> dict:
    from respo.runtime.models import build_policy
    from respo.runtime.tasks import get_task
    from respo.runtime.tokenizer import build_char_tokenizer
    from respo.train.config import TrainConfig, apply_overrides
    from respo.train.trainer import Policy, _optimizer, recompute_logp, rollout_batch, update_step

    tok = build_char_tokenizer()
    model = build_policy(preset, tok, seed=seed).train()
    task = get_task("addition", overlong=(T, T - 1))
    pool = task.examples("train", B * (steps + 1), seed)
    cfg = apply_overrides(TrainConfig(), {"model": preset, "warm_start": False, "objective": "grpo", "prompts": B,
                                          "group_size": G, "max_new_tokens": T, "lr": 1e-5, "warmup": 0})
    policy = Policy(model, tok, {})
    opt, sched = _optimizer(model, cfg)
    gen = torch.Generator().manual_seed(seed)
    clock = ModelClock(model)
    times, tokens, shares, phases = [], [], [], []
    try:
        for step in range(steps + 1):
            clock.reset()
            t0 = time.perf_counter()
            batch, rec = rollout_batch(policy, task, pool, list(range(step * B, (step + 1) * B)), cfg, gen, step)
            t1 = time.perf_counter()
            # as the sync trainer at N = 1: the only mini-batch is on-policy, old_logp = detached training forward
            batch.old_logp = recompute_logp(model, batch, cfg, start_row=cfg.mini_batch_seqs)
            t2 = time.perf_counter()
            update_step(model, opt, sched, batch, cfg, on_policy=True)
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

    from respo.runtime.models import build_policy
    from respo.runtime.tasks import get_task
    from respo.runtime.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    model = build_policy(preset, tok, seed=seed).train()
    task = get_task("addition", overlong=(T, T - 1))
    pool = task.examples("train", B * (steps + 1), seed)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["tiny-dense", "tiny-moe"])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--steps", type=int, default=3, help="measured updates per side (after 1 warm-up)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-trl", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    for preset in a.presets:
        r = bench_respo(preset, a.prompts, a.group_size, a.max_new_tokens, a.steps)
        print(json.dumps({**r, "threads": a.threads}), flush=True)
        if a.skip_trl:
            continue
        t = bench_trl(preset, a.prompts, a.group_size, a.max_new_tokens, a.steps)
        print(json.dumps({**t, "threads": a.threads}), flush=True)
        print(json.dumps({"preset": preset, "throughput_ratio_respo_over_trl": r["tokens_per_s"] / t["tokens_per_s"],
                          "step_time_ratio_trl_over_respo": t["s_per_update"] / r["s_per_update"]}), flush=True)


if __name__ == "__main__":
    main()
