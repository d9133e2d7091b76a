"""How much noise bfloat16 adds to log W, against the staleness-driven spread of log W.

The batch is sampled from the policy itself (``respo.runtime.sampler.sample``, EOS ignored, so every
row has exactly T response tokens). Same weights, same batch: the sequence log-prob sum_t m_t logp_t of every row is computed by a
float32 forward and by a bfloat16 forward (``respo.runtime.precision.mixed_precision``: float32
master weights, bf16 matrix work, float32 output layer). A stale policy is made by perturbing the
weights, θ' = θ + ε·σ_p·z (z ~ N(0, 1), σ_p the parameter tensor's std), with ε found by
bisection (mean log W falls with ε: a KL on the policy's own samples) so that the mean float32
log W over the batch is about ``TARGET_LOG_W`` (-1, the regime the study cares about):

    log W_fp32      = S(θ', fp32) - S(θ, fp32)       (the reference)
    log W_bf16      = S(θ', bf16) - S(θ, bf16)       (a bf16 run: both forwards in bf16)
    log W_bf16_cur  = S(θ', bf16) - S(θ, fp32)       (bf16 training forward, fp32 old log-probs)
    Δ = log W_bf16 - log W_fp32

Prints one JSON line per (preset, length): std and max |Δ| of both variants, the fraction of rows
whose sign of (log W + 1) flips, and the staleness spread std(log W_fp32) it compares with.

    .venv/bin/python benchmarks/bench_precision.py [--lengths 32 256 1024] [--rows 64]
        [--presets tiny-dense tiny-moe] [--init-range 0.02] [--device cpu]
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import time

import torch

from respo.runtime.logprobs import token_logprobs
from respo.runtime.precision import mixed_precision, resolve_device
from respo.runtime.sampler import sample

#: The log W the staleness study cares about: sign(log W + 1) splits its weight distribution.
TARGET_LOG_W = -1.0
#: Prompt columns before the scored response columns.
PROMPT_LEN = 16
#: First perturbation scale tried (relative to each parameter tensor's std), then rescaled.
EPS0 = 1e-2
#: Bisection steps of ε towards the target mean log W, its growth factor while bracketing, its cap.
EPS_ROUNDS = 6
EPS_GROWTH = 4.0
EPS_MAX = 10.0
#: Characters prompts are drawn from.
PROMPT_ALPHABET = "0123456789+="


def sequence_logp(model, input_ids, attention_mask, dtype: str, rows_per_forward: int,
                  response_start: int = PROMPT_LEN) -> torch.Tensor:
    """S = sum_t logp_t over the response columns of every row, (B,) float64 on the CPU."""
    out = []
    with torch.no_grad(), mixed_precision(model, dtype):
        for i in range(0, input_ids.shape[0], rows_per_forward):
            logp, _ = token_logprobs(model, input_ids[i:i + rows_per_forward],
                                     attention_mask[i:i + rows_per_forward], response_start)  # (b, T)
            out.append(logp.double().sum(-1).cpu())
    return torch.cat(out)


def perturbed(model, eps: float, seed: int):
    """θ + eps·std(θ_p)·z per parameter tensor p (a copy)."""
    other = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            z = torch.randn(p.shape, generator=gen).to(p.device)
            p.add_(eps * p.detach().float().std().clamp_min(1e-8) * z)
    return other


def measure(preset: str, T: int, rows: int, init_range: float, device: torch.device, seed: int,
            rows_per_forward: int) -> dict:
    from respo.runtime.models import PRESETS, build_policy
    from respo.runtime.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    L = PROMPT_LEN + T
    model = build_policy(preset, tok, seed=seed, initializer_range=init_range,
                         max_position_embeddings=max(L, PRESETS[preset]["max_position_embeddings"]))
    model = model.to(device).train()
    rng = random.Random(seed)
    prompts = ["".join(rng.choice(PROMPT_ALPHABET) for _ in range(PROMPT_LEN)) for _ in range(rows)]
    gen = torch.Generator(device=device).manual_seed(seed)
    ro = sample(model.eval(), tok, prompts, max_new_tokens=T, generator=gen, stop_at_eos=False)
    model.train()
    ids, attn, P = ro.input_ids, ro.attention_mask, ro.response_start  # (B, L)
    t0 = time.perf_counter()
    s_old = {d: sequence_logp(model, ids, attn, d, rows_per_forward, P) for d in ("float32", "bfloat16")}

    def mean_log_w(eps: float) -> float:
        s_eps = sequence_logp(perturbed(model, eps, seed + 1), ids, attn, "float32", rows_per_forward, P)
        return float((s_eps - s_old["float32"]).mean())

    lo, hi = 0.0, EPS0
    while mean_log_w(hi) > TARGET_LOG_W and hi < EPS_MAX:  # grow until the mean log W passes the target
        lo, hi = hi, hi * EPS_GROWTH
    for _ in range(EPS_ROUNDS):  # then bisect (geometrically once lo > 0)
        mid = (lo * hi) ** 0.5 if lo else hi / EPS_GROWTH
        lo, hi = (mid, hi) if mean_log_w(mid) > TARGET_LOG_W else (lo, mid)
    eps = hi
    stale = perturbed(model, eps, seed + 1)
    s_new = {d: sequence_logp(stale, ids, attn, d, rows_per_forward, P) for d in ("float32", "bfloat16")}
    log_w = s_new["float32"] - s_old["float32"]  # (B,) reference
    log_w_bf16 = s_new["bfloat16"] - s_old["bfloat16"]  # (B,)
    log_w_cur = s_new["bfloat16"] - s_old["float32"]  # (B,)
    out = {"preset": preset, "T": T, "rows": rows, "init_range": init_range, "device": str(device), "eps": eps,
           "log_w_fp32_mean": float(log_w.mean()), "log_w_fp32_std": float(log_w.std()),
           "seconds": time.perf_counter() - t0}
    for name, lw in (("bf16_both", log_w_bf16), ("bf16_current_only", log_w_cur)):
        delta = lw - log_w  # (B,)
        flips = (torch.sign(lw - TARGET_LOG_W) != torch.sign(log_w - TARGET_LOG_W)).double().mean()
        out[name] = {"delta_std": float(delta.std()), "delta_max_abs": float(delta.abs().max()),
                     "delta_mean": float(delta.mean()), "sign_flip_fraction": float(flips),
                     "noise_over_staleness_spread": float(delta.std() / log_w.std().clamp_min(1e-12))}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["tiny-dense"])
    ap.add_argument("--lengths", type=int, nargs="+", default=[32, 256, 1024])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--rows-per-forward", type=int, default=16)
    ap.add_argument("--init-range", type=float, nargs="+", default=[0.02],
                    help="initializer_range of the random init (larger: peakier next-token distributions)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    device = resolve_device(a.device)
    for preset in a.presets:
        for init_range in a.init_range:
            for T in a.lengths:
                r = measure(preset, T, a.rows, init_range, device, a.seed, a.rows_per_forward)
                print(json.dumps({**r, "threads": a.threads}), flush=True)


if __name__ == "__main__":
    main()
