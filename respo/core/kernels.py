"""Reshaping kernels: the sequence weight W turned into a gradient coefficient φ(W).

ReSPO's family (a power mean of 1 and W, then an exponential tilt):

    φ₀(W; α, β)    = [(1 − β) + β·W^(α−1)]^(1/(α−1))        α ≠ 1
    φ₀(W; 1, β)    = W^β                                      (the α → 1 limit)
    φ (W; α, β, λ) = φ₀ · exp(λ·(1 − φ₀))

computed in log space with p = α − 1:

    log φ₀ = (1/p)·logaddexp(log(1−β), log β + p·log W)       (|p| ≥ 1e-2)
           = (1/p)·log1p(β·expm1(p·log W))                     (|p| < 1e-2: no cancellation near α = 1)
           = β·log W                                           (α = 1)
    log φ  = log φ₀ + λ·(1 − exp(log φ₀))

Published branches (the library defaults): Â ≥ 0: (α, β, λ) = (2, 0.5, 2), φ⁺(W) = ((1+W)/2)·e^(1−W);
Â < 0: (1, 0.5, 2), φ⁻(W) = √W·e^(2(1−√W)).

VESPO's gamma kernel: φ(W; k, λ) = W^k·exp(λ(1 − W)), log φ = k·log W + λ(1 − W); (k, λ) = (2, 3) for
Â ≥ 0 and (3, 2) for Â < 0.

A *kernel* here is any function ``log_w (B,) -> phi (B,)``; ``respo_kernel``/``vespo_kernel`` build
them, ``kernel_from_spec`` builds one from a string such as ``respo(2,0.5,2)`` or ``truncated(1)``,
``two_branch`` picks one per advantage sign. The public ``respo_phi``/``vespo_phi`` are detached
coefficients; the kernels themselves are differentiable so their derivatives can be tested.

References:
    Chen, Ban, Hsieh (2026), ReSPO, arXiv 2609.35433, eq. (φ family).
    VESPO: Variational Sequence-Level Soft Policy Optimization, arXiv 2602.10693.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Callable, Tuple, Union

import torch

from respo.core.checks import check_number
from respo.core.ratios import LOG_W_CLAMP

Kernel = Callable[[torch.Tensor], torch.Tensor]

RESPO_POS = (2.0, 0.5, 2.0)  # (alpha, beta, lambda) for Â ≥ 0
RESPO_NEG = (1.0, 0.5, 2.0)  # (alpha, beta, lambda) for Â < 0
VESPO_POS = (2.0, 3.0)  # (k, lambda) for Â ≥ 0
VESPO_NEG = (3.0, 2.0)  # (k, lambda) for Â < 0

RESPO_PARAMS = ("alpha", "beta", "lambda")  # a ReSPO branch, by position or by name
VESPO_PARAMS = ("k", "lambda")  # a VESPO branch

_SERIES_P = 1e-2  # below this |α − 1| the log1p/expm1 form avoids cancellation


def kernel_params(value, names: Tuple[str, ...], *, param: str, what: str) -> Tuple[float, ...]:
    """A kernel branch's parameters as a tuple of floats in the order of ``names``.

    Accepts exactly ``len(names)`` numbers by position (a tuple or list) or by name (a mapping whose keys
    are ``names``; ``lam`` may stand for ``lambda``). Anything else, a missing, extra or unknown value
    included, is a one-line ``ValueError`` naming ``what: param``.
    """
    spelled = f"({', '.join(names)})"
    if isinstance(value, Mapping):
        keys = {("lambda" if k == "lam" else k): v for k, v in value.items()}
        if len(keys) != len(value) or set(keys) != set(names):
            raise ValueError(f"{what}: {param} by name needs exactly the keys {spelled}, got {sorted(value)}")
        values = tuple(keys[n] for n in names)
    elif isinstance(value, (tuple, list)):
        if len(value) != len(names):
            raise ValueError(f"{what}: {param} must be {spelled}: {len(names)} numbers, got {len(value)}: {tuple(value)!r}")
        values = tuple(value)
    else:
        raise ValueError(f"{what}: {param} must be {spelled} by position or by name, got {value!r}")
    return tuple(check_number(f"{param}.{n}", v, what=what) for n, v in zip(names, values))


def _check_respo_params(alpha: float, beta: float, lam: float) -> Tuple[float, float, float]:
    alpha, beta, lam = (check_number(n, v, what="ReSPO kernel") for n, v in zip(RESPO_PARAMS, (alpha, beta, lam)))
    if not (math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"ReSPO kernel needs alpha > 0, got alpha={alpha}")
    if not (math.isfinite(beta) and 0 < beta <= 1):
        raise ValueError(f"ReSPO kernel needs 0 < beta <= 1, got beta={beta}")
    if not (math.isfinite(lam) and lam >= 0):
        raise ValueError(f"ReSPO kernel needs lambda >= 0, got lambda={lam}")
    return alpha, beta, lam


def respo_log_phi0(log_w: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """log φ₀(W; α, β), elementwise, for log_w already clamped to a finite range."""
    p = alpha - 1.0
    if p == 0.0:
        return beta * log_w
    if abs(p) < _SERIES_P:
        return torch.log1p(beta * torch.expm1(p * log_w)) / p
    log_1mb = math.log1p(-beta) if beta < 1 else -math.inf
    a = torch.full_like(log_w, log_1mb)
    return torch.logaddexp(a, math.log(beta) + p * log_w) / p


def respo_kernel(alpha: float = 2.0, beta: float = 0.5, lam: float = 2.0, *, clamp: float = LOG_W_CLAMP) -> Kernel:
    """The ReSPO kernel φ(W; α, β, λ) as a function of log W (differentiable, not detached).

    Args:
      alpha: power-mean exponent, α > 0 (α = 1 is the exact limit W^β).
      beta: mixing weight of W, 0 < β ≤ 1.
      lam: exponential tilt λ ≥ 0; for λ > 0, φ ≤ (1/λ)·e^(λ−1).
      clamp: log W is clamped to [−clamp, clamp] first, so ±inf inputs give finite φ.

    Returns:
      ``kernel(log_w) -> phi`` of the same shape.
    """
    alpha, beta, lam = _check_respo_params(alpha, beta, lam)

    def kernel(log_w: torch.Tensor) -> torch.Tensor:
        lw = log_w.clamp(-clamp, clamp)
        log_phi0 = respo_log_phi0(lw, alpha, beta)
        return torch.exp(log_phi0 + lam * (1.0 - torch.exp(log_phi0)))

    kernel.__name__ = f"respo_kernel(alpha={alpha:g}, beta={beta:g}, lam={lam:g})"
    kernel.__qualname__ = kernel.__name__
    return kernel


def vespo_kernel(k: float = 2.0, lam: float = 3.0, *, clamp: float = LOG_W_CLAMP) -> Kernel:
    """VESPO's gamma kernel φ(W) = W^k·exp(λ(1 − W)) as a function of log W (φ(1) = 1).

    Args:
      k: power, k ≥ 0.
      lam: decay λ ≥ 0.
      clamp: log W is clamped to [−clamp, clamp] first.
    """
    k, lam = (check_number(n, v, what="VESPO kernel") for n, v in zip(VESPO_PARAMS, (k, lam)))
    if not (math.isfinite(k) and k >= 0):
        raise ValueError(f"VESPO kernel needs k >= 0, got k={k}")
    if not (math.isfinite(lam) and lam >= 0):
        raise ValueError(f"VESPO kernel needs lambda >= 0, got lambda={lam}")

    def kernel(log_w: torch.Tensor) -> torch.Tensor:
        lw = log_w.clamp(-clamp, clamp)
        return torch.exp(k * lw + lam * (1.0 - torch.exp(lw)))

    kernel.__name__ = f"vespo_kernel(k={k:g}, lam={lam:g})"
    kernel.__qualname__ = kernel.__name__
    return kernel


def unit_kernel() -> Kernel:
    """φ ≡ 1: plain REINFORCE on this branch (the on-policy floor)."""

    def kernel(log_w: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(log_w)

    kernel.__name__ = "unit_kernel()"
    return kernel


def truncated_kernel(max_w: float = 1.0, *, clamp: float = LOG_W_CLAMP) -> Kernel:
    """φ(W) = min(W, max_w): truncated importance weight (TOPR's negative branch with max_w = 1)."""
    max_w = float(max_w)
    if not max_w > 0:
        raise ValueError(f"truncated kernel needs max_w > 0, got {max_w}")
    log_max = math.log(max_w)

    def kernel(log_w: torch.Tensor) -> torch.Tensor:
        return torch.exp(log_w.clamp(-clamp, min(clamp, log_max)))

    kernel.__name__ = f"truncated_kernel(max_w={max_w:g})"
    return kernel


def two_branch(log_w: torch.Tensor, advantages: torch.Tensor, pos_kernel: Kernel, neg_kernel: Kernel) -> torch.Tensor:
    """φ_i = pos_kernel(log W_i) where Â_i ≥ 0, neg_kernel(log W_i) where Â_i < 0. Shapes (B,)."""
    if log_w.shape != advantages.shape:
        raise ValueError(f"log_w shape {tuple(log_w.shape)} does not match advantages shape {tuple(advantages.shape)}")
    return torch.where(advantages >= 0, pos_kernel(log_w), neg_kernel(log_w))


def respo_phi(
    log_w: torch.Tensor,
    advantages: torch.Tensor,
    *,
    pos: Tuple[float, float, float] = RESPO_POS,
    neg: Tuple[float, float, float] = RESPO_NEG,
) -> torch.Tensor:
    """Detached ReSPO coefficient φ_i, branch by the sign of the sequence advantage (Â ≥ 0 positive).

    Args:
      log_w: (B,) sequence log-weights (any real or ±inf; clamped to [−20, 20]).
      advantages: (B,) sequence advantages.
      pos, neg: (alpha, beta, lambda) per branch; defaults are the published (2, .5, 2) and (1, .5, 2).

    Returns:
      (B,) φ, finite and non-negative, with no autograd graph.
    """
    pos, neg = (kernel_params(v, RESPO_PARAMS, param=n, what="respo") for n, v in (("pos", pos), ("neg", neg)))
    with torch.no_grad():
        return two_branch(log_w.detach(), advantages.detach(), respo_kernel(*pos), respo_kernel(*neg))


def vespo_phi(
    log_w: torch.Tensor,
    advantages: torch.Tensor,
    *,
    pos: Tuple[float, float] = VESPO_POS,
    neg: Tuple[float, float] = VESPO_NEG,
) -> torch.Tensor:
    """Detached VESPO coefficient φ_i = W^k·e^(λ(1−W)), (k, λ) by the sign of Â_i. Shapes (B,)."""
    pos, neg = (kernel_params(v, VESPO_PARAMS, param=n, what="vespo") for n, v in (("pos", pos), ("neg", neg)))
    with torch.no_grad():
        return two_branch(log_w.detach(), advantages.detach(), vespo_kernel(*pos), vespo_kernel(*neg))


_SPEC = re.compile(r"^\s*(respo|vespo|unit|truncated|topr)\s*(?:\(([^)]*)\))?\s*$")
_SPEC_MAKERS = {"respo": (respo_kernel, 3), "vespo": (vespo_kernel, 2), "unit": (unit_kernel, 0), "truncated": (truncated_kernel, 1)}


def kernel_from_spec(spec: Union[str, Kernel]) -> Kernel:
    """A kernel from a callable or a string: ``respo(2,0.5,2)``, ``vespo(3,2)``, ``unit``, ``truncated(1)``.

    Strings let configs and the command line pick the kernel of each advantage sign (branch ablations).
    """
    if callable(spec):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"a kernel must be a callable log_w -> phi or a spec string, got {type(spec).__name__}")
    match = _SPEC.match(spec)
    if not match:
        raise ValueError(
            f"bad kernel spec {spec!r}; expected respo(alpha,beta,lambda), vespo(k,lambda), unit or truncated(max_w)"
        )
    name, args = match.group(1), match.group(2)
    try:
        nums = [float(a) for a in args.split(",")] if args and args.strip() else []
    except ValueError:
        raise ValueError(f"bad kernel spec {spec!r}: arguments must be numbers") from None
    name = "truncated" if name == "topr" else name
    maker, max_args = _SPEC_MAKERS[name]
    if len(nums) > max_args:
        raise ValueError(f"bad kernel spec {spec!r}: {name} takes at most {max_args} argument(s)")
    return maker(*nums)
