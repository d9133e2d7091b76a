"""Policy objectives: one small function per objective, all with one calling convention.

Every objective has the signature

    fn(logp, old_logp, advantages, mask, *, <its hyperparameters with published defaults>,
       loss_agg_mode=None, rollout_log_ratio=None, global_tokens=None, global_seqs=None,
       loss_scale_factor=None, nan_policy="raise", diagnostics=True) -> (loss, metrics)

and, for the gradient, the form ∇L = −agg[c_it · Â_it · ∇logp_it] with an objective-specific,
*detached* coefficient c (φ_i for the reshaped sequence objectives, r_it·1[not clipped] for PPO, …).
``metrics["coef_mean"]`` and the starvation diagnostics use the per-sequence mean of c, so every
objective is measured on the same scale.

Sequence-weight objectives (REINFORCE-shaped, no clipping):

    reshaped   L = −agg[ φ_i Â_it logp_it ],  φ_i = K_sign(Â_i)(log W_i), detached, any two kernels
    respo      K⁺ = ReSPO(2, .5, 2),   K⁻ = ReSPO(1, .5, 2)
    vespo      K⁺ = gamma(k=2, λ=3),   K⁻ = gamma(k=3, λ=2)
    topr       K⁺ = 1,                 K⁻ = min(W, 1)
    reinforce  K± = 1 (the on-policy floor)

Ratio objectives (token-level unless noted; ``rollout_log_ratio`` multiplies the per-token loss by
ρ = exp(log ρ), as verl does with ``rollout_is_weights``; the sequence objectives above fold log ρ
into log W instead):

    grpo   PPO clip with dual clip: max(−rÂ, −clip(r, 1−ε_l, 1+ε_h)Â), and min(·, −cÂ) for Â < 0
    gspo   the same clip on the length-normalised sequence ratio s_i (token form sg(s_i)·π/sg(π))
    cispo  −sg(clip(r, 1−ε_l, 1+ε_h))·Â·logp
    sapo   −σ(τ(r−1))·(4/τ)·Â, τ = τ⁺ for Â > 0, τ⁻ otherwise
    gmpo   −Â_i·exp(mean_t sign-aware-clip(log r_it)) per sequence, mean over sequences

References:
    ReSPO: Chen, Ban, Hsieh (2026), arXiv 2609.35433. VESPO: arXiv 2602.10693. GRPO: Shao et al.
    (2024). GSPO: arXiv 2507.18071. CISPO: MiniMax-M1, arXiv 2506.13585. SAPO: arXiv 2511.20347.
    GMPO: arXiv 2507.20673. TOPR: Le Roux et al. (2025), arXiv 2503.14286. verl ``core_algos``.
"""

from __future__ import annotations

import inspect
import re
from typing import Callable, Dict, Optional, Tuple, Union

import torch

from respo.core.aggregation import AGG_MODES, agg_loss, agg_seq, check_agg_mode
from respo.core.checks import Batch, validate
from respo.core.diagnostics import weight_diagnostics
from respo.core.kernels import (
    RESPO_NEG,
    RESPO_POS,
    VESPO_NEG,
    VESPO_POS,
    Kernel,
    respo_kernel,
    truncated_kernel,
    two_branch,
    unit_kernel,
    vespo_kernel,
)
from respo.core.ratios import LOG_W_CLAMP, sequence_log_ratio

Metrics = Dict[str, torch.Tensor]
Objective = Callable[..., Tuple[torch.Tensor, Metrics]]

# Keyword arguments every objective takes; everything else an objective takes is a hyperparameter.
COMMON_KWARGS = (
    "loss_agg_mode",
    "rollout_log_ratio",
    "global_tokens",
    "global_seqs",
    "loss_scale_factor",
    "nan_policy",
    "diagnostics",
)


# --------------------------------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------------------------------


def _seq_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked token mean per row, (B, T) -> (B,); 0 for an empty row."""
    return (x * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)


def _log_w(b: Batch) -> torch.Tensor:
    """log W of a validated batch, (B,): ``sequence_log_ratio`` without its NaN guards (values off the
    mask are already finite or zeroed by ``validate``)."""
    log_r = b.logp.detach() - b.old_logp  # (B, T)
    if b.rollout_log_ratio is not None:
        log_r = log_r + b.rollout_log_ratio
    return (log_r * b.mask).sum(dim=-1).clamp(-LOG_W_CLAMP, LOG_W_CLAMP)


def _masked_frac(cond: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Fraction of valid tokens where cond holds (verl's masked_mean of a 0/1 tensor)."""
    return (cond.to(mask.dtype) * mask).sum() / mask.sum().clamp(min=1)


def _metrics(
    b: Batch,
    loss: torch.Tensor,
    coef_seq: torch.Tensor,
    extra: Optional[Metrics],
    diagnostics: bool,
    log_w: Optional[torch.Tensor] = None,
) -> Metrics:
    """Loss, bad-row counts and (optionally) the weight diagnostics, all detached."""
    out: Metrics = {
        "loss": loss.detach(),
        "bad_rows/nonfinite": b.n_nonfinite,
        "bad_rows/empty": b.n_empty,
        "n_tokens": b.mask.sum(),
    }
    if diagnostics:
        log_w = _log_w(b) if log_w is None else log_w
        out.update(
            weight_diagnostics(log_w, coef_seq, b.seq_adv, b.mask, token_log_ratio=b.logp.detach() - b.old_logp)
        )
    if extra:
        out.update({k: v.detach() for k, v in extra.items()})
    return out


def _agg(
    values: torch.Tensor,
    b: Batch,
    loss_agg_mode: str,
    global_tokens,
    global_seqs,
    loss_scale_factor,
) -> torch.Tensor:
    return agg_loss(
        values,
        b.mask,
        loss_agg_mode,
        global_tokens=global_tokens,
        global_seqs=global_seqs,
        loss_scale_factor=loss_scale_factor,
    )


def _rho(b: Batch) -> Optional[torch.Tensor]:
    """Per-token rollout-correction weight ρ = exp(log ρ), detached, or None."""
    return None if b.rollout_log_ratio is None else torch.exp(b.rollout_log_ratio.clamp(-LOG_W_CLAMP, LOG_W_CLAMP))


_SPEC = re.compile(r"^\s*(respo|vespo|unit|truncated|topr)\s*(?:\(([^)]*)\))?\s*$")


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
    makers = {"respo": (respo_kernel, 3), "vespo": (vespo_kernel, 2), "unit": (unit_kernel, 0), "truncated": (truncated_kernel, 1)}
    maker, max_args = makers[name]
    if len(nums) > max_args:
        raise ValueError(f"bad kernel spec {spec!r}: {name} takes at most {max_args} argument(s)")
    return maker(*nums)


def sequence_kernels(name: str, **hparams) -> Tuple[Kernel, Kernel]:
    """(pos_kernel, neg_kernel) of the sequence-weight objective ``name`` with its hyperparameters.

    The one place that says which kernels ``respo``, ``vespo``, ``topr``, ``reinforce`` and
    ``reshaped`` use; integrations that aggregate with their framework's own code (verl) call it too.
    """
    if name == "respo":
        return respo_kernel(*hparams.get("pos", RESPO_POS)), respo_kernel(*hparams.get("neg", RESPO_NEG))
    if name == "vespo":
        return vespo_kernel(*hparams.get("pos", VESPO_POS)), vespo_kernel(*hparams.get("neg", VESPO_NEG))
    if name == "topr":
        return unit_kernel(), truncated_kernel(1.0)
    if name == "reinforce":
        return unit_kernel(), unit_kernel()
    if name == "reshaped":
        return (
            kernel_from_spec(hparams.get("pos_kernel", "respo(2,0.5,2)")),
            kernel_from_spec(hparams.get("neg_kernel", "respo(1,0.5,2)")),
        )
    raise ValueError(f"{name!r} is not a sequence-weight objective; known: respo, vespo, topr, reinforce, reshaped")


# --------------------------------------------------------------------------------------------------
# Sequence-weight (REINFORCE-shaped) objectives
# --------------------------------------------------------------------------------------------------


def reshaped_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    pos_kernel: Union[str, Kernel] = "respo(2,0.5,2)",
    neg_kernel: Union[str, Kernel] = "respo(1,0.5,2)",
    loss_agg_mode: Optional[str] = None,
    rollout_log_ratio: Optional[torch.Tensor] = None,
    global_tokens=None,
    global_seqs=None,
    loss_scale_factor: Optional[float] = None,
    nan_policy: str = "raise",
    diagnostics: bool = True,
) -> Tuple[torch.Tensor, Metrics]:
    """Two-branch reshaped sequence objective L = −agg[φ_i·Â_it·logp_it], φ_i = K_{sign Â_i}(log W_i).

    log W_i = Σ_t m(logp − old_logp) + Σ_t m·log ρ, clamped to [−20, 20]; φ is detached, so
    ∇L = −agg[φ_i·Â_it·∇logp_it]. Branch by the sequence advantage: Â_i ≥ 0 uses ``pos_kernel``.

    Args:
      logp, old_logp, mask: (B, T). advantages: (B,) or (B, T).
      pos_kernel, neg_kernel: callables log_w -> φ or spec strings (see ``kernel_from_spec``).
      loss_agg_mode: default ``token-mean``.
    """
    mode = check_agg_mode(loss_agg_mode or "token-mean")
    pk, nk = kernel_from_spec(pos_kernel), kernel_from_spec(neg_kernel)
    b = validate(logp, old_logp, advantages, mask, rollout_log_ratio, nan_policy)
    with torch.no_grad():
        log_w = _log_w(b)  # (B,)
        phi = two_branch(log_w, b.seq_adv, pk, nk)  # (B,)
    values = -(phi.unsqueeze(-1) * b.adv) * b.logp  # (B, T)
    loss = _agg(values, b, mode, global_tokens, global_seqs, loss_scale_factor)
    return loss, _metrics(b, loss, phi, None, diagnostics, log_w)


def respo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    pos: Tuple[float, float, float] = RESPO_POS,
    neg: Tuple[float, float, float] = RESPO_NEG,
    **common,
) -> Tuple[torch.Tensor, Metrics]:
    """ReSPO: L = −agg[φ_i Â_it logp_it] with φ⁺ = ReSPO(pos), φ⁻ = ReSPO(neg), (α, β, λ) per branch.

    Defaults are the published (2, 0.5, 2) for Â ≥ 0 and (1, 0.5, 2) for Â < 0, i.e.
    φ⁺(W) = ((1+W)/2)·e^(1−W) and φ⁻(W) = √W·e^(2(1−√W)). ``**common`` are the keyword arguments
    every objective takes (``loss_agg_mode``, ``rollout_log_ratio``, ``global_tokens``,
    ``global_seqs``, ``loss_scale_factor``, ``nan_policy``, ``diagnostics``; see ``reshaped_loss``).
    """
    pos_kernel, neg_kernel = sequence_kernels("respo", pos=pos, neg=neg)
    return reshaped_loss(logp, old_logp, advantages, mask, pos_kernel=pos_kernel, neg_kernel=neg_kernel, **common)


def vespo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    pos: Tuple[float, float] = VESPO_POS,
    neg: Tuple[float, float] = VESPO_NEG,
    **common,
) -> Tuple[torch.Tensor, Metrics]:
    """VESPO: L = −agg[φ_i Â_it logp_it], φ = W^k·e^(λ(1−W)), (k, λ) = (2, 3) for Â ≥ 0, (3, 2) for Â < 0."""
    pos_kernel, neg_kernel = sequence_kernels("vespo", pos=pos, neg=neg)
    return reshaped_loss(logp, old_logp, advantages, mask, pos_kernel=pos_kernel, neg_kernel=neg_kernel, **common)


def topr_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    **common,
) -> Tuple[torch.Tensor, Metrics]:
    """TOPR: L = −agg[sg(α_i) Â_it logp_it], α_i = min(W_i, 1) for Â_i < 0 and 1 otherwise."""
    pos_kernel, neg_kernel = sequence_kernels("topr")
    return reshaped_loss(logp, old_logp, advantages, mask, pos_kernel=pos_kernel, neg_kernel=neg_kernel, **common)


def reinforce_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    **common,
) -> Tuple[torch.Tensor, Metrics]:
    """REINFORCE: L = −agg[Â_it logp_it] (φ ≡ 1; ignores staleness, the on-policy floor)."""
    pos_kernel, neg_kernel = sequence_kernels("reinforce")
    return reshaped_loss(logp, old_logp, advantages, mask, pos_kernel=pos_kernel, neg_kernel=neg_kernel, **common)


# --------------------------------------------------------------------------------------------------
# Ratio (clip / gate) objectives
# --------------------------------------------------------------------------------------------------


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: Optional[str] = None,
    rollout_log_ratio: Optional[torch.Tensor] = None,
    global_tokens=None,
    global_seqs=None,
    loss_scale_factor: Optional[float] = None,
    nan_policy: str = "raise",
    diagnostics: bool = True,
) -> Tuple[torch.Tensor, Metrics]:
    """GRPO/PPO token clip with dual clip (verl's ``vanilla``).

        r = exp(clamp(logp − old_logp, −20, 20))
        ℓ = max(−r·Â, −clip(r, 1−ε_l, 1+ε_h)·Â);   for Â < 0: ℓ = min(ℓ, −c·Â)

    Gradient coefficient c_it = r_it where the token is not clipped, else 0.
    Metrics ``clipfrac_high`` (Â > 0, r > 1+ε_h), ``clipfrac_low`` (Â < 0, r < 1−ε_l), ``clipfrac_dual``
    (Â < 0, r > c) and verl's ``clipfrac``.
    """
    if not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (dual clip lower bound), got {clip_ratio_c}")
    mode = check_agg_mode(loss_agg_mode or "token-mean")
    b = validate(logp, old_logp, advantages, mask, rollout_log_ratio, nan_policy)
    adv = b.adv  # (B, T)
    ratio = torch.exp((b.logp - b.old_logp).clamp(-LOG_W_CLAMP, LOG_W_CLAMP))  # (B, T)
    l1 = -adv * ratio
    l2 = -adv * ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high)
    clipped = torch.maximum(l1, l2)
    dual = torch.minimum(clipped, -adv * clip_ratio_c)
    values = torch.where(adv < 0, dual, clipped)  # (B, T)
    rho = _rho(b)
    if rho is not None:
        values = values * rho
    loss = _agg(values, b, mode, global_tokens, global_seqs, loss_scale_factor)
    with torch.no_grad():
        r = ratio.detach()
        hi = (adv > 0) & (r > 1 + clip_ratio_high)
        lo = (adv < 0) & (r < 1 - clip_ratio_low)
        du = (adv < 0) & (r > clip_ratio_c)
        coef = torch.where(hi | lo | du, torch.zeros_like(r), r) * (1 if rho is None else rho)
        extra = {
            "clipfrac_high": _masked_frac(hi, b.mask),
            "clipfrac_low": _masked_frac(lo, b.mask),
            "clipfrac_dual": _masked_frac(du, b.mask),
            "clipfrac": _masked_frac(l2.detach() > l1.detach(), b.mask),
        }
    return loss, _metrics(b, loss, _seq_mean(coef, b.mask), extra, diagnostics)


def gspo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio_low: float = 3e-4,
    clip_ratio_high: float = 4e-4,
    loss_agg_mode: Optional[str] = None,
    rollout_log_ratio: Optional[torch.Tensor] = None,
    global_tokens=None,
    global_seqs=None,
    loss_scale_factor: Optional[float] = None,
    nan_policy: str = "raise",
    diagnostics: bool = True,
) -> Tuple[torch.Tensor, Metrics]:
    """GSPO: the PPO clip on the sequence ratio s_i = exp(mean_t log r_it), default seq-mean-token-mean.

    Token form (verl): log s_it = logp_it − sg(logp_it) + sg(log s_i), clamped above at 10, so every
    token of a sequence carries the sequence ratio and its own gradient:
        ℓ_it = max(−s_it·Â, −clip(s_it, 1−ε_l, 1+ε_h)·Â).
    Coefficient c_it = s_i where not clipped (Â > 0: s ≤ 1+ε_h; Â < 0: s ≥ 1−ε_l), else 0.
    """
    mode = check_agg_mode(loss_agg_mode or "seq-mean-token-mean")
    b = validate(logp, old_logp, advantages, mask, rollout_log_ratio, nan_policy)
    adv = b.adv
    with torch.no_grad():
        log_s = sequence_log_ratio(b.logp.detach(), b.old_logp, b.mask, length_normalize=True)  # (B,)
    log_st = (b.logp - b.logp.detach() + log_s.unsqueeze(-1)).clamp(max=10.0)  # (B, T)
    s = torch.exp(log_st)
    l1 = -adv * s
    l2 = -adv * s.clamp(1 - clip_ratio_low, 1 + clip_ratio_high)
    values = torch.maximum(l1, l2)
    rho = _rho(b)
    if rho is not None:
        values = values * rho
    loss = _agg(values, b, mode, global_tokens, global_seqs, loss_scale_factor)
    with torch.no_grad():
        sd = s.detach()
        hi = (adv > 0) & (sd > 1 + clip_ratio_high)
        lo = (adv < 0) & (sd < 1 - clip_ratio_low)
        coef = torch.where(hi | lo, torch.zeros_like(sd), sd) * (1 if rho is None else rho)
        extra = {
            "clipfrac_high": _masked_frac(hi, b.mask),
            "clipfrac_low": _masked_frac(lo, b.mask),
            "clipfrac": _masked_frac(l2.detach() > l1.detach(), b.mask),
        }
    return loss, _metrics(b, loss, _seq_mean(coef, b.mask), extra, diagnostics)


def cispo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    loss_agg_mode: Optional[str] = None,
    rollout_log_ratio: Optional[torch.Tensor] = None,
    global_tokens=None,
    global_seqs=None,
    loss_scale_factor: Optional[float] = None,
    nan_policy: str = "raise",
    diagnostics: bool = True,
) -> Tuple[torch.Tensor, Metrics]:
    """CISPO: ℓ = −sg(clip(r, 1−ε_l, 1+ε_h))·Â·logp (clipped IS weight, gradient kept on every token).

    Defaults ε_l = ε_h = 0.2 are verl's ``ActorConfig`` defaults; the MiniMax-M1 paper effectively
    disables the lower bound and tunes ε_h.
    """
    mode = check_agg_mode(loss_agg_mode or "token-mean")
    b = validate(logp, old_logp, advantages, mask, rollout_log_ratio, nan_policy)
    with torch.no_grad():
        r = torch.exp((b.logp.detach() - b.old_logp).clamp(-LOG_W_CLAMP, LOG_W_CLAMP))  # (B, T)
        coef = r.clamp(1 - clip_ratio_low, 1 + clip_ratio_high)
        rho = _rho(b)
        if rho is not None:
            coef = coef * rho
    values = -(coef * b.adv) * b.logp
    loss = _agg(values, b, mode, global_tokens, global_seqs, loss_scale_factor)
    extra = {
        "clipfrac_high": _masked_frac(r > 1 + clip_ratio_high, b.mask),
        "clipfrac_low": _masked_frac(r < 1 - clip_ratio_low, b.mask),
    }
    return loss, _metrics(b, loss, _seq_mean(coef, b.mask), extra, diagnostics)


def sapo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    loss_agg_mode: Optional[str] = None,
    rollout_log_ratio: Optional[torch.Tensor] = None,
    global_tokens=None,
    global_seqs=None,
    loss_scale_factor: Optional[float] = None,
    nan_policy: str = "raise",
    diagnostics: bool = True,
) -> Tuple[torch.Tensor, Metrics]:
    """SAPO: ℓ = −f(r)·Â with the soft gate f(r) = σ(τ(r − 1))·4/τ, τ = τ⁺ (Â > 0) or τ⁻ (Â ≤ 0).

    f'(r)·r = 4σ(1−σ)·r is the gradient coefficient (1 at r = 1). Default seq-mean-token-mean.
    """
    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(f"SAPO temperatures must be positive, got tau_pos={tau_pos}, tau_neg={tau_neg}")
    mode = check_agg_mode(loss_agg_mode or "seq-mean-token-mean")
    b = validate(logp, old_logp, advantages, mask, rollout_log_ratio, nan_policy)
    adv = b.adv
    ratio = torch.exp((b.logp - b.old_logp).clamp(-LOG_W_CLAMP, LOG_W_CLAMP))  # (B, T)
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    values = -gate * adv
    rho = _rho(b)
    if rho is not None:
        values = values * rho
    loss = _agg(values, b, mode, global_tokens, global_seqs, loss_scale_factor)
    with torch.no_grad():
        sig = torch.sigmoid(tau * (ratio.detach() - 1.0))
        coef = 4.0 * sig * (1.0 - sig) * ratio.detach() * (1 if rho is None else rho)
    return loss, _metrics(b, loss, _seq_mean(coef, b.mask), None, diagnostics)


def gmpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.4,
    clip_ratio_high: float = 0.4,
    loss_agg_mode: Optional[str] = None,
    rollout_log_ratio: Optional[torch.Tensor] = None,
    global_tokens=None,
    global_seqs=None,
    loss_scale_factor: Optional[float] = None,
    nan_policy: str = "raise",
    diagnostics: bool = True,
) -> Tuple[torch.Tensor, Metrics]:
    """GMPO (verl's ``geo_mean``): geometric-mean ratio with a sign-aware clip in log space.

        d_it = logp − old_logp;  d̃_it = sgn(Â)·min(sgn(Â)·d, sgn(Â)·clip(d, −ε_l, ε_h))
        ℓ_i  = −Ā_i·exp(mean_t d̃_it),   L = mean over non-empty sequences

    GMPO is sequence-level by construction: only ``seq-mean-token-mean`` is accepted. Rollout weights
    enter as their per-sequence geometric mean, as in verl.
    """
    mode = loss_agg_mode or "seq-mean-token-mean"
    if mode != "seq-mean-token-mean":
        raise ValueError(f"gmpo aggregates per sequence; loss_agg_mode must be 'seq-mean-token-mean', got {mode!r}")
    b = validate(logp, old_logp, advantages, mask, rollout_log_ratio, nan_policy)
    adv, m = b.adv, b.mask
    d = b.logp - b.old_logp  # (B, T)
    sgn = torch.sign(adv)
    d_clip = d.clamp(-clip_ratio_low, clip_ratio_high)
    d_min = sgn * torch.minimum(sgn * d, sgn * d_clip)
    n_tok = m.sum(dim=-1)  # (B,)
    ratio = torch.exp((d_min * m).sum(dim=-1) / n_tok.clamp(min=1))  # (B,)
    seq_adv = (adv * m).sum(dim=-1) / n_tok.clamp(min=1)  # (B,)
    per_seq = -seq_adv * ratio  # (B,)
    rho_seq = None
    if b.rollout_log_ratio is not None:
        rho_seq = torch.exp((b.rollout_log_ratio * m).sum(dim=-1) / n_tok.clamp(min=1))
        per_seq = per_seq * rho_seq
    loss = agg_seq(per_seq, n_tok, global_seqs=global_seqs)
    with torch.no_grad():
        dd = d.detach()
        hi = (adv > 0) & (dd > clip_ratio_high)
        lo = (adv < 0) & (dd < -clip_ratio_low)
        active = (~(hi | lo)).to(m.dtype)
        coef_tok = ratio.detach().unsqueeze(-1) * active * (1 if rho_seq is None else rho_seq.unsqueeze(-1))
        extra = {"clipfrac_high": _masked_frac(hi, m), "clipfrac_low": _masked_frac(lo, m)}
    return loss, _metrics(b, loss, _seq_mean(coef_tok, m), extra, diagnostics)


# --------------------------------------------------------------------------------------------------
# One entry point
# --------------------------------------------------------------------------------------------------

OBJECTIVES: Dict[str, Objective] = {
    "respo": respo_loss,
    "vespo": vespo_loss,
    "reshaped": reshaped_loss,
    "grpo": grpo_loss,
    "gspo": gspo_loss,
    "cispo": cispo_loss,
    "sapo": sapo_loss,
    "gmpo": gmpo_loss,
    "topr": topr_loss,
    "reinforce": reinforce_loss,
}


def hyperparameters(name: str) -> Dict[str, object]:
    """The hyperparameters of objective ``name`` with their published defaults."""
    fn = get_objective(name)
    return {
        p.name: p.default
        for p in inspect.signature(fn).parameters.values()
        if p.kind is p.KEYWORD_ONLY and p.name not in COMMON_KWARGS
    }


def get_objective(name: str) -> Objective:
    try:
        return OBJECTIVES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown objective {name!r}; valid objectives: {', '.join(sorted(OBJECTIVES))}") from None


def policy_loss(
    name: str,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_agg_mode: Optional[str] = None,
    rollout_log_ratio: Optional[torch.Tensor] = None,
    global_tokens=None,
    global_seqs=None,
    loss_scale_factor: Optional[float] = None,
    nan_policy: str = "raise",
    diagnostics: bool = True,
    **hparams,
) -> Tuple[torch.Tensor, Metrics]:
    """Loss and metrics of the objective ``name`` (see the module docstring for the list).

    Args:
      name: objective name, a key of ``OBJECTIVES``.
      logp: (B, T) log π_θ of the response tokens, with grad.
      old_logp: (B, T) log π_old (behaviour policy as recomputed by the trainer).
      advantages: (B,) sequence advantages or (B, T) token advantages.
      mask: (B, T) 0/1 validity mask.
      loss_agg_mode: one of ``AGG_MODES``; None uses the objective's published default
        (``token-mean``; ``seq-mean-token-mean`` for gspo, sapo, gmpo).
      rollout_log_ratio: optional (B, T) per-token log ρ (training/inference mismatch correction).
      global_tokens, global_seqs: counts of the global batch, for micro-batch invariance.
      loss_scale_factor: H for ``seq-mean-token-sum-norm``.
      nan_policy: ``raise`` (default) or ``mask`` (drop and count bad rows).
      diagnostics: compute the weight diagnostics (on by default; cheap, (B,)-sized).
      **hparams: the objective's hyperparameters (``hyperparameters(name)`` lists them).

    Returns:
      (loss 0-d tensor with grad, metrics dict of detached 0-d tensors).
    """
    fn = get_objective(name)
    valid = hyperparameters(name)
    unknown = sorted(set(hparams) - set(valid))
    if unknown:
        listed = ", ".join(f"{k}={v!r}" for k, v in valid.items()) or "none"
        raise ValueError(f"unknown hyperparameter(s) {unknown} for objective {name!r}; valid: {listed}")
    return fn(
        logp, old_logp, advantages, mask,
        loss_agg_mode=loss_agg_mode, rollout_log_ratio=rollout_log_ratio, global_tokens=global_tokens,
        global_seqs=global_seqs, loss_scale_factor=loss_scale_factor, nan_policy=nan_policy,
        diagnostics=diagnostics, **hparams,
    )  # fmt: skip


__all__ = [
    "AGG_MODES",
    "COMMON_KWARGS",
    "OBJECTIVES",
    "cispo_loss",
    "get_objective",
    "gmpo_loss",
    "grpo_loss",
    "gspo_loss",
    "hyperparameters",
    "kernel_from_spec",
    "policy_loss",
    "reinforce_loss",
    "reshaped_loss",
    "respo_loss",
    "sequence_kernels",
    "sapo_loss",
    "topr_loss",
    "vespo_loss",
]
