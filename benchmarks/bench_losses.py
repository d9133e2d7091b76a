"""Forward + backward cost of each objective, side by side in one process, as JSON lines.

For each shape, every respo objective, verl's own policy-loss functions on the same inputs, and the
floor (respo's ``reinforce``: −Â·logp with the same validation and diagnostics) are timed over the
same tensors; each line carries its ratio to the floor and, for objectives verl also implements,
to verl's function. Memory is reported as the bytes autograd saves for backward (exact, device
independent) and, on CUDA, the peak allocated during the step.

    python benchmarks/bench_losses.py                  # B=512, T=2048 and B=8, T=65536 on the CPU
    python benchmarks/bench_losses.py --device cuda --repeats 50

Target: respo within 1.15x of the floor and no slower than verl's ``vanilla``.

Timing (`timing`): ``--warmup`` untimed rounds of every implementation at the measured shape, then
``--repeats`` rounds (at least 3 for a figure to quote; fewer print a warning line), one step of
each implementation per round, the order reversed every other round; medians per implementation.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch
from timing import check_repeats, order

from respo import OBJECTIVES, build_objective, policy_loss

VERL_EQUIVALENT = {"grpo": "vanilla", "gspo": "gspo", "cispo": "cispo", "sapo": "sapo", "gmpo": "geo_mean"}


def make_inputs(B: int, T: int, device: str, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g) * 3).to(device=device, dtype=dtype)
    old = (logp.float().cpu() + 0.05 * torch.randn(B, T, generator=g)).to(device=device, dtype=dtype)
    lengths = torch.randint(T // 4, T + 1, (B,), generator=g)
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).to(device=device, dtype=dtype)
    adv = torch.randn(B, generator=g).to(device=device, dtype=dtype)
    return logp, old, adv, mask


def saved_bytes(step: Callable[[torch.Tensor], torch.Tensor], logp: torch.Tensor) -> int:
    """Bytes of the distinct tensors autograd saves for backward in one forward pass."""
    seen: Dict[int, int] = {}

    def pack(t: torch.Tensor):
        try:
            key = t.untyped_storage().data_ptr()
            seen[key] = max(seen.get(key, 0), t.untyped_storage().nbytes())
        except RuntimeError:
            pass
        return t

    x = logp.detach().clone().requires_grad_(True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = step(x)
    del loss
    return sum(seen.values())


def one_step(step: Callable[[torch.Tensor], torch.Tensor], logp: torch.Tensor) -> Tuple[float, Optional[int]]:
    """Seconds for one forward + backward, and the CUDA peak above the baseline (None on the CPU)."""
    cuda = logp.is_cuda
    x = logp.detach().clone().requires_grad_(True)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    step(x).backward()
    if cuda:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    return dt, (torch.cuda.max_memory_allocated() - base) if cuda else None


def time_round_robin(steps: Dict[str, Callable], logp: torch.Tensor, repeats: int, warmup: int):
    """Median seconds and CUDA peak per step, measured interleaved (one of each per round, the order
    reversed every other round) so that a change of machine load during the run affects every
    implementation alike and none always runs right after the same other one."""
    times: Dict[str, List[float]] = {k: [] for k in steps}
    peaks: Dict[str, Optional[int]] = {k: None for k in steps}
    for r in range(warmup + repeats):
        for key in order(list(steps), r):
            dt, peak = one_step(steps[key], logp)
            if r >= warmup:
                times[key].append(dt)
                if peak is not None:
                    peaks[key] = max(peaks[key] or 0, peak)
    return {k: statistics.median(v) for k, v in times.items()}, peaks


def respo_step(name: str, old, adv, mask, diagnostics: bool):
    def step(x):
        return policy_loss(name, x, old, adv, mask, diagnostics=diagnostics)[0]

    return step


def verl_step(ours: str, old, adv, mask):
    """verl's equivalent of our objective ``ours``, with our objective's default aggregation."""
    from verl.trainer.ppo import core_algos
    from verl.workers.config import FSDPActorConfig

    verl_name = VERL_EQUIVALENT[ours]
    kw = {}
    if verl_name == "gspo":
        kw = dict(clip_ratio_low=3e-4, clip_ratio_high=4e-4)
    if verl_name == "geo_mean":
        kw = dict(clip_ratio=0.4, clip_ratio_low=0.4, clip_ratio_high=0.4)
    config = FSDPActorConfig(
        strategy="fsdp", rollout_n=8, ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=8, use_dynamic_bsz=False, **kw
    )
    fn = core_algos.get_policy_loss_fn(verl_name)
    adv_tok = adv.unsqueeze(-1).expand_as(old)
    mode = build_objective(ours).default_agg

    def step(x):
        return fn(old, x, adv_tok, mask, loss_agg_mode=mode, config=config)[0]

    return step


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float64"])
    ap.add_argument("--shapes", default="512x2048,8x65536", help="comma-separated BxT")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    ap.add_argument("--no-verl", action="store_true", help="skip verl's functions")
    ap.add_argument("--no-diagnostics", action="store_true", help="time respo without the weight diagnostics")
    args = ap.parse_args(argv)
    check_repeats(args.repeats)
    if args.warmup < 1:
        raise SystemExit(f"--warmup must be at least 1 (a full-size round before timing), got {args.warmup}")
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    diagnostics = not args.no_diagnostics
    have_verl = False
    if not args.no_verl:
        try:
            import verl.trainer.ppo.core_algos  # noqa: F401

            have_verl = True
        except ImportError:
            print(json.dumps({"note": "verl not installed; verl columns skipped"}), file=sys.stderr)
    for shape in args.shapes.split(","):
        B, T = (int(v) for v in shape.lower().split("x"))
        logp, old, adv, mask = make_inputs(B, T, args.device, dtype)
        common = dict(B=B, T=T, device=args.device, dtype=args.dtype, threads=torch.get_num_threads(), diagnostics=diagnostics)
        steps: Dict[str, Callable] = {f"respo:{n}": respo_step(n, old, adv, mask, diagnostics) for n in sorted(OBJECTIVES)}
        if have_verl:
            steps.update({f"verl:{theirs}": verl_step(ours, old, adv, mask) for ours, theirs in VERL_EQUIVALENT.items()})
        med, peaks = time_round_robin(steps, logp, args.repeats, args.warmup)
        floor = med["respo:reinforce"]
        for key, t in med.items():
            impl, name = key.split(":")
            line = {**common, "impl": impl, "objective": name, "ms": round(t * 1e3, 3),
                    "ratio_to_floor": round(t / floor, 3), "saved_bytes": saved_bytes(steps[key], logp),
                    "cuda_peak_bytes": peaks[key]}  # fmt: skip
            ours_to_verl = VERL_EQUIVALENT.get(name) if impl == "respo" else None
            if ours_to_verl and f"verl:{ours_to_verl}" in med:
                line["ratio_to_verl"] = round(t / med[f"verl:{ours_to_verl}"], 3)
            if "verl:vanilla" in med:
                line["ratio_to_verl_vanilla"] = round(t / med["verl:vanilla"], 3)
            print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
