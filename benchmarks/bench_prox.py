"""What decoupled PPO's proximal log-probs cost in the trainer, side by side, as one JSON line.

π_prox for an update is the policy at the start of that update. The trainer takes one optimizer step
per mini-batch after every micro-batch's forward, so π_prox's log-probs are the training forward
itself (``update_step`` hands them to the objective) and cost nothing. Frameworks that take several
steps per batch need them from elsewhere: a separate no-grad forward of the pre-update policy
(`recompute_logp`), or AReaL's log-linear approximation from the behaviour and current log-probs and
each token's staleness (decoupled's ``prox_method="loglinear"``), which needs no forward. Three sides:

    reuse       update_step(decoupled)                                   (the trainer's path)
    recompute   recompute_logp(model, batch) + update_step(decoupled)    (a separate proximal forward)
    loglinear   update_step(decoupled, prox_method="loglinear")          (AReaL's approximation)

Every side is warmed up at full size, the order rotates between repeats, and each is the median of
``--repeats`` timings (the model and optimizer are restored before every timed step). The line also
records that the recomputed π_prox equals the training forward bitwise, and how far the log-linear
π_prox is from it at the batch's ``--staleness`` (its ``prox/abs_error``).

    python benchmarks/bench_prox.py                       # tiny-dense, 8 prompts x 8, 128 new tokens
    python benchmarks/bench_prox.py --prompts 4 --max-new-tokens 32 --repeats 5
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch

from respo.runtime.models import build_policy
from respo.runtime.tasks import get_task
from respo.runtime.tokenizer import build_char_tokenizer
from respo.train.config import Forward, Sampling, TrainConfig, apply_overrides
from respo.train.policy import Policy
from respo.runtime.engines.respo import RespoEngine
from respo.train.rollout import recompute_logp, sample_rollout
from respo.train.forward import forward_logprobs
from respo.train.update import UpdateSettings, make_optimizer, update_step


def setup(args):
    cfg = apply_overrides(TrainConfig(), dict(
        task_kwargs={"digits": args.digits, "scratchpad": True}, warm_start=False, prompts=args.prompts,
        group_size=args.group_size, max_new_tokens=args.max_new_tokens, eval_prompts=0, progress=False,
        tensorboard=False, lr=1e-4, warmup=0, micro_batch=args.micro_batch, objective="decoupled"))  # fmt: skip
    tok = build_char_tokenizer()
    model = build_policy(args.preset, tok, seed=0)
    task = get_task("addition", digits=args.digits, scratchpad=True)
    pool = task.examples("train", 64, 0)
    policy = Policy(model, tok, {})
    engine = RespoEngine(policy.model, policy.tokenizer, dtype=cfg.dtype)
    batch, _ = sample_rollout(engine, task, pool, list(range(args.prompts)), Sampling.of(cfg),
                              torch.Generator().manual_seed(0), 0)
    batch.old_logp = recompute_logp(model, batch, Forward.of(cfg), mini_batch=cfg.mini_batch_seqs)
    batch.adv = torch.randn(batch.mask.shape[0], generator=torch.Generator().manual_seed(1))
    opt, sched = make_optimizer(model, cfg)
    stale = UpdateSettings.of(apply_overrides(cfg, {"objective": "reinforce"}))
    update_step(model, opt, sched, batch, stale)  # the batch is now stale
    return cfg, model, batch


def side_config(side: str, cfg):
    return apply_overrides(cfg, {"objective_kwargs": {"prox_method": "loglinear"}}) if side == "loglinear" else cfg


def timed_step(side: str, cfg, model, batch, version: int) -> tuple[float, dict]:
    m = copy.deepcopy(model)
    opt, sched = make_optimizer(m, cfg)
    forward, settings = Forward.of(cfg), UpdateSettings.of(cfg)
    start = time.perf_counter()
    if side == "recompute":
        recompute_logp(m, batch, forward, mini_batch=cfg.mini_batch_seqs)  # the separate π_prox forward
    metrics, _ = update_step(m, opt, sched, batch, settings, version=version)
    return time.perf_counter() - start, metrics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny-dense")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--digits", type=int, default=21)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--staleness", type=int, default=4, help="updates since the batch was sampled (AReaL's alpha = (s-1)/s)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg, model, batch = setup(args)

    # π_prox recomputed with the pre-update policy against the training forward the trainer uses
    model.train()
    with torch.no_grad():
        forward, _ = forward_logprobs(model, batch.rows(0, batch.mask.shape[0]).trimmed(), Forward.of(cfg))
    recomputed = recompute_logp(model, batch, Forward.of(cfg), mini_batch=cfg.mini_batch_seqs)[:, : forward.shape[1]]
    same = bool(torch.equal(recomputed, forward.cpu() * batch.mask[:, : forward.shape[1]]))

    sides = ("reuse", "recompute", "loglinear")
    cfgs = {side: side_config(side, cfg) for side in sides}
    version = int(batch.version.max()) + args.staleness  # the learner's version: every row `staleness` behind
    for side in sides:  # warm-up at full size
        timed_step(side, cfgs[side], model, batch, version)
    times = {s: [] for s in sides}
    error = None
    for r in range(args.repeats):
        for side in sides[r % 3:] + sides[: r % 3]:  # the order rotates
            seconds, metrics = timed_step(side, cfgs[side], model, batch, version)
            times[side].append(seconds)
            if side == "loglinear":
                error = float(metrics["prox/abs_error"])  # |log π_prox − its approximation|, mean over tokens
    med = {s: statistics.median(v) for s, v in times.items()}
    print(json.dumps({
        "bench": "prox_logp", "preset": args.preset, "sequences": int(batch.mask.shape[0]),
        "tokens": int(batch.mask.sum()), "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
        "staleness": args.staleness, "reuse_s": round(med["reuse"], 4), "recompute_s": round(med["recompute"], 4),
        "loglinear_s": round(med["loglinear"], 4),
        "recompute_over_loglinear": round(med["recompute"] / med["loglinear"], 3),
        "recompute_over_reuse": round(med["recompute"] / med["reuse"], 3),
        "loglinear_over_reuse": round(med["loglinear"] / med["reuse"], 3),
        "recomputed_equals_training_forward": same, "loglinear_prox_abs_error": round(error, 6),
    }))


if __name__ == "__main__":
    main()
