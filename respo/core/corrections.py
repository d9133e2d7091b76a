"""Staleness corrections the RL frameworks ship: TIS, MIS, IcePop, M2PO, decoupled PPO, OPSM, DPPO's
binary TV/KL trust regions and rejection by KL estimators (docs/method.md gives their formulas and sources).

Pure functions of tensors (torch only). Each correction turns the per-token log importance weight

    log w_it = log π_θ(y_it) − log π_old(y_it)  [+ log ρ_it]        (π_old: the behaviour policy)

into a per-token loss ℓ_it (with grad) and a detached gradient coefficient c_it, so that
∇L = −agg[c_it · Â_it · ∇logp_it] as for every other objective. ``log ρ`` is the optional
rollout-correction log weight π_old/π_rollout (training/inference mismatch); it is folded into
log w, so w is the weight of the current policy against the policy that actually sampled.

REINFORCE-shaped corrections (tis, mis, icepop, dppo_*: verl's ``bypass_mode`` with ``loss_type="reinforce"``,
where the stale policy is the only "old" policy and the correction is a detached coefficient on −Â·logp) use

    token level:    w_it = exp(clamp(log w_it, ±20))
    sequence level: w_i  = exp(clamp(Σ_t m_it log w_it, ±20)), the same for every token of row i

and the ratio-shaped ones (m2po, decoupled, opsm) let the gradient flow through r = π_θ/π_·, with

    PPO(r) = max(−r·Â, −clip(r, 1−ε_l, 1+ε_h)·Â), and min(·, −c·Â) for Â < 0 when a dual clip c is set.

Each correction is a pure function here (``tis``, ``mis``, ...) and an objective registered beside it
(``policy_loss("tis", ...)``), whose factory checks the hyperparameters and has the function's defaults
(``same_defaults_as``: a default that differs is refused when it is registered).

The corrections (``python scripts/catalogue.py`` writes the list from the registry):

    tis            −sg(min(w, C))·Â·logp, w per token or per sequence (W_i on every token of row i)
                   level='sequence', cap=2.0, batch_normalize=False; token-mean
                   TIS, Yao et al. (2025); verl 0.9.1 rollout_correction, its bypass_pg_is preset (sequence, C = 2)
    mis            −sg(w·1[lo ≤ w ≤ hi])·Â·logp, w per token or per sequence; weights outside are silenced
                   level='sequence', lo=0.0, hi=3.0, batch_normalize=False; token-mean
                   MIS, Liu, Li et al. (2025); TRL 1.16 vllm_importance_sampling_mode='sequence_mask', clip_max 3
    icepop         mis at token level on [0.5, 5]
                   lo=0.5, hi=5.0; token-mean
                   IcePop, Ring-1T, arXiv 2510.18855; verl 0.9.1 bypass_pg_token_icepop preset, [0.5, 5]
    m2po           −M·r·Â, M drops the largest (log r)² until their batch mean is below τ (not micro-batch
                   invariant)
                   tau=0.04; token-mean
                   M2PO, Zheng et al. (2025), arXiv 2510.01161; AReaL actor.m2_threshold = 0.04
    decoupled      b·PPO(π_θ/π_prox), b = π_prox/π_old masked (or truncated) above C; ``prox_logp`` optional (the
                   current policy by default), or AReaL's ``prox_method='loglinear'``
                   clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=None, cap=5.0, cap_mode='mask',
                   prox_method='given'; token-mean
                   Hilton et al. (2022), arXiv 2110.00641; AReaL use_decoupled_loss, behav_imp_weight_cap 5
    opsm           K_i·ρ·PPO(π_θ/π_old), K_i = 0 for Â_i < 0 with mean_t log(π_old/π_θ) > δ
                   delta=0.5, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=None; token-mean
                   OPSM, DeepSeek-V3.2, arXiv 2512.02556 eq. 9; TRL 1.16 off_policy_mask_threshold (its example 0.5)
    dppo_tv        −M·sg(min(r, C))·ρ·Â·logp, M drops tokens whose probability moved past δ along Â's push
                   delta_low=0.15, delta_high=0.15, cap=10000.0; token-mean
                   DPPO, arXiv 2602.04879; verl 0.9.1 loss_mode='dppo_tv', its DPPO recipe (δ = 0.15, C = 1e4)
    dppo_kl        dppo_tv's mask with the sampled token's binary KL in place of the probability change
                   delta_low=0.05, delta_high=0.05, cap=10000.0; token-mean
                   DPPO, arXiv 2602.04879; verl 0.9.1 loss_mode='dppo_kl', its DPPO recipe (δ = 0.05, C = 1e4)

The pieces they share: ``m2po_keep`` (the tokens with the largest (log r)² dropped until the mean of the
kept ones is below τ), ``opsm_keep``, ``dppo_keep`` (probability TV or binary KL past δ),
``kl_reject_keep`` (the tokens a k1/k2/k3 estimate, per token or row mean/sum/max, and a veto keep),
``batch_mean_weight`` (``batch_normalize`` in tis and mis: the weights divided by their batch mean) and
``loglinear_prox_logp`` (AReaL's log π_prox ≈ log π_old + α(log π_θ − log π_old), α = clamp((s−1)/s, 0, 1)).

M2PO's selection is over the whole batch passed in, so it is NOT invariant to micro-batching:
splitting a batch changes which tokens are masked (every other correction here decides per token
or per sequence and is invariant given the global token/sequence counts).

Diagnostics (``correction_diagnostics``), detached 0-d tensors, NaN for an empty set:

    corr/trunc_frac, corr/trunc_frac/pos|neg           share of the correction's units (tokens for a
                                                       token-level correction, sequences for a
                                                       sequence-level one) whose weight the cap cut
    corr/mask_frac, corr/mask_frac/pos|neg             share of units the correction silenced (c = 0)
    corr/silenced_seqs/pos|neg                         share of rows of that advantage sign with every
                                                       valid token silenced
    corr/silenced_adv_share/pos|neg                    Σ|Â| over silenced tokens / Σ|Â| over all valid
                                                       tokens of that sign: the share of the batch's
                                                       positive (negative) learning signal removed
    corr/masked_tokens, corr/masked_seqs               share of valid tokens silenced, and of rows with
                                                       at least one silenced token (whatever the unit)
    corr/kept_low_w_mass_share/pos|neg                 of the coefficient mass Σ_t |c_it| of the kept rows
                                                       of that sign (rows not wholly silenced), the share
                                                       carried by rows with log W < −1: where the
                                                       correction's remaining signal goes

``chi2`` gives χ² of the weights as verl logs them (every objective's metrics carry it):

    chi2_token = mean_tokens(w_it²) − 1                χ² of the token weights (verl's ``chi2_token``)
    chi2_seq   = mean_rows(W_i²) − 1                   χ² of the sequence weights (verl's ``chi2_seq``)

Signs follow the sequence advantage Â_i (the masked token mean of Â_it). Truncation (TIS,
decoupled ``truncate``) reduces a weight without silencing it; PPO clipping inside decoupled and
OPSM is the base objective's, not the correction's, and is reported by the clip fractions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch

from respo.core.checks import (LEVELS, LossInputs, check_band, check_bool, check_cap, check_choice,  # noqa: F401
                               check_clip, check_level, check_number, check_positive)  # fmt: skip
from respo.core.diagnostics import masked_frac, stat_dtype
from respo.core.ratios import LOG_W_CLAMP, ppo_clip
from respo.core.registry import Term, TermFn, objective

CAP_MODES = ("mask", "truncate")

Metrics = Dict[str, torch.Tensor]


def check_cap_mode(cap_mode: str, *, what: str) -> str:
    return check_choice("cap_mode", cap_mode, CAP_MODES, what=what)


# --------------------------------------------------------------------------------------------------
# Weights and masks
# --------------------------------------------------------------------------------------------------


def _valid(mask: torch.Tensor) -> torch.Tensor:
    return mask > 0


def token_log_weight(
    logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, log_rho: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Detached log w_it = logp − old_logp (+ log ρ), 0 off the mask, (B, T) (not clamped)."""
    log_w = logp.detach() - old_logp.detach()
    if log_rho is not None:
        log_w = log_w + log_rho.detach()
    return torch.where(_valid(mask), log_w, torch.zeros((), dtype=log_w.dtype, device=log_w.device))


def level_log_weight(log_w: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """The log weight a correction acts on, clamped to ±20, (B, T).

        token:    clamp(log w_it)
        sequence: clamp(Σ_t m_it log w_it), broadcast over the row
    """
    if level == "token":
        return log_w.clamp(-LOG_W_CLAMP, LOG_W_CLAMP)
    seq = (log_w * mask).sum(dim=-1, keepdim=True).clamp(-LOG_W_CLAMP, LOG_W_CLAMP)  # (B, 1)
    return seq.expand_as(log_w)


def truncated_weight(log_w: torch.Tensor, cap: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """TIS weight min(w, C) and where the cap cut (w > C), both (B, T), from a clamped log w."""
    w = torch.exp(log_w)
    return w.clamp(max=cap), w > cap


def masked_weight(log_w: torch.Tensor, lo: float, hi: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """MIS weight w·1[lo ≤ w ≤ hi] and the rejected positions (w outside [lo, hi]), both (B, T)."""
    w = torch.exp(log_w)
    out = (w < lo) | (w > hi)
    return torch.where(out, torch.zeros_like(w), w), out


def m2po_keep(log_w: torch.Tensor, mask: torch.Tensor, tau: float,
              groups: Optional[torch.Tensor] = None) -> torch.Tensor:
    """M2PO's second-moment mask M over the valid tokens of the whole batch, (B, T) bool.

    Sort the valid tokens by v = (log w)² in descending order, v_(1) ≥ … ≥ v_(n). The mean of the
    n − k smallest, A_k = (1/(n−k)) Σ_{j>k} v_(j), does not increase with k; drop the k* largest with
    k* = the first k such that A_k < τ (AReaL's ``_get_m2po_loss_mask``), and keep at least one
    token (k* ≤ n − 1). Ties are broken by the sort order.

    ``groups`` (B,) integer: select within each set of rows sharing a value (the micro-batches of a
    step, each of which selected on its own), instead of over the whole batch.
    """
    if groups is not None:
        keep = torch.zeros_like(mask, dtype=torch.bool)
        for g in torch.unique(groups):
            rows = groups == g
            keep[rows] = m2po_keep(log_w[rows], mask[rows], tau)
        return keep
    valid = _valid(mask)  # (B, T)
    v = torch.where(valid, log_w.detach().square(), torch.full_like(log_w, -1.0)).flatten()  # invalid sort last
    n = valid.sum()
    order = torch.argsort(v, descending=True, stable=True)  # (B*T,)
    v_sorted = torch.where(v[order] < 0, torch.zeros_like(v), v[order])
    suffix = v_sorted.flip(0).cumsum(0).flip(0)  # Σ_{j ≥ i} over sorted positions (invalid add 0)
    pos = torch.arange(v.numel(), device=v.device)
    count = (n - pos).clamp(min=1).to(v.dtype)  # valid tokens from position i on
    avg = suffix / count  # (B*T,), meaningful for i < n
    below = (avg < tau) & (pos < n)
    first = torch.where(below, pos, torch.full_like(pos, v.numel())).min()  # first i with A_i < τ
    k = torch.where(below.any(), first, (n - 1).clamp(min=0))  # tokens to drop
    keep_sorted = pos >= k
    keep = torch.empty_like(keep_sorted)
    keep[order] = keep_sorted
    return keep.view_as(valid) & valid


def opsm_keep(log_w: torch.Tensor, seq_adv: torch.Tensor, mask: torch.Tensor, delta: float) -> torch.Tensor:
    """OPSM's sequence mask K_i, (B,) bool: drop Â_i < 0 with KL_i = mean_t(−log w_it) > δ.

    KL_i = (1/T_i) Σ_t m_it (log π_old − log π_θ) is the k1 estimate of KL(π_old ‖ π_θ) per token
    (DeepSeek-V3.2 eq. 9; TRL ``get_off_policy_mask``, which keeps Â ≥ 0 or KL ≤ δ).
    """
    n_tok = mask.sum(dim=-1).clamp(min=1)  # (B,)
    kl = -(log_w.detach() * mask).sum(dim=-1) / n_tok  # (B,)
    return (seq_adv >= 0) | (kl <= delta)


# --------------------------------------------------------------------------------------------------
# The corrections: per-token loss, detached coefficient and what the correction cut
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Correction:
    """One correction applied to a batch.

    values: (B, T) per-token loss ℓ_it with grad (aggregate it with ``agg_loss``).
    coef: (B, T) detached gradient coefficient c_it of ∇L = −agg[c·Â·∇logp].
    truncated: (B, T) bool, tokens whose weight a cap reduced (not silenced).
    silenced: (B, T) bool, valid tokens whose coefficient the correction set to 0.
    level: ``token`` or ``sequence``: the unit the correction decides on (for the fractions).
    metrics: extra detached metrics (clip fractions of the base objective).
    """

    values: torch.Tensor
    coef: torch.Tensor
    truncated: torch.Tensor
    silenced: torch.Tensor
    level: str
    metrics: Metrics


def _nothing(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(like, dtype=torch.bool)


def batch_mean_weight(weight: torch.Tensor, mask: torch.Tensor, level: str,
                      groups: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The batch mean a weight is divided by under ``batch_normalize`` (verl's ``rollout_is_batch_normalize``),
    broadcast to (B, T):

        token:     w̄ = Σ_it m_it w_it / Σ_it m_it             (the mean of the valid tokens' weights)
        sequence:  w̄ = Σ_i W_i / #{non-empty rows}              (one weight per row)

    and 1 where w̄ ≤ 1e-8 (as verl). ``groups`` (B,) integer: one mean per set of rows sharing a value (the
    micro-batches a step normalised separately) instead of one over the batch.
    """
    m = mask.to(weight.dtype)
    rows = (m.sum(dim=-1) > 0).to(weight.dtype)  # (B,)
    if level == "token":
        num, den = (weight * m).sum(dim=-1), m.sum(dim=-1)  # (B,) per-row sums
    else:
        num, den = (weight * m).sum(dim=-1) / m.sum(dim=-1).clamp(min=1), rows  # W_i (masked row mean), (B,)
    if groups is None:
        mean = (num.sum() / den.sum().clamp(min=1e-8)).expand_as(num)  # (B,)
    else:
        same = (groups.unsqueeze(0) == groups.unsqueeze(1)).to(weight.dtype)  # (B, B)
        mean = (same @ num) / (same @ den).clamp(min=1e-8)  # (B,) the mean of each row's group
    mean = torch.where(mean > 1e-8, mean, torch.ones_like(mean))
    return mean.unsqueeze(-1).expand_as(weight)


def _normalised(coef: torch.Tensor, mask: torch.Tensor, level: str, batch_normalize: bool, groups) -> Tuple[torch.Tensor, Metrics]:
    if not batch_normalize:
        return coef, {}
    mean = batch_mean_weight(coef, mask, level, groups)  # (B, T)
    return coef / mean, {"corr/batch_norm_factor": mean[:, 0].mean()}


def correction_term(name: str, apply: Callable[[LossInputs], Correction]) -> TermFn:
    """The term of a correction's objective: ``apply(inputs)``'s loss and coefficient, and its diagnostics
    (``correction_diagnostics``) in the metrics."""

    def term(inputs: LossInputs, log_ratio: torch.Tensor, rho: Optional[torch.Tensor]) -> Term:
        corr = apply(inputs)
        with torch.no_grad():
            log_w = token_log_weight(inputs.logp, inputs.old_logp, inputs.mask, inputs.rollout_log_ratio)
            metrics = correction_diagnostics(corr, log_w, inputs.adv, inputs.seq_adv, inputs.mask)
        return Term(corr.values, corr.coef, metrics)

    term.__name__ = f"{name}_term"
    return term


def tis(logp, old_logp, adv, mask, *, level: str = "sequence", cap: float = 2.0, batch_normalize: bool = False,
        log_rho=None, groups=None) -> Correction:  # fmt: skip
    """TIS: ℓ = −sg(min(w, C))·Â·logp (token or sequence w; see the module docstring); with
    ``batch_normalize`` the truncated weights are divided by their batch mean (``batch_mean_weight``)."""
    log_w = level_log_weight(token_log_weight(logp, old_logp, mask, log_rho), mask, level)
    coef, cut = truncated_weight(log_w, cap)
    coef, metrics = _normalised(coef, mask, level, batch_normalize, groups)
    valid = _valid(mask)
    return Correction(-(coef * adv) * logp, coef, cut & valid, _nothing(cut), level, metrics)


@objective("tis", family="correction", same_defaults_as=tis,
           summary="−sg(min(w, C))·Â·logp, w per token or per sequence (W_i on every token of row i)",
           source="TIS, Yao et al. (2025); verl 0.9.1 rollout_correction, its bypass_pg_is preset (sequence, C = 2)")
def _tis_objective(level: str = "sequence", cap: float = 2.0, batch_normalize: bool = False) -> TermFn:
    """TIS: ℓ = −sg(min(w, C))·Â·logp with w = π_θ/π_old·ρ per token or per sequence (W_i on every token).

    REINFORCE-shaped, as verl's bypass mode with ``loss_type="reinforce"``; defaults are verl's
    ``rollout_is="sequence"``, ``rollout_is_threshold=2.0`` (its ``bypass_pg_is`` preset).
    Metrics ``corr/trunc_frac`` (/pos, /neg): the share of sequences (tokens) whose weight the cap cut.
    ``batch_normalize``: divide the truncated weights by their batch mean (verl's
    ``rollout_is_batch_normalize``; within each of ``row_groups``, so not micro-batch invariant).
    """
    level = check_level(level, what="tis")
    cap = check_cap(cap, what="tis")
    norm = check_bool("batch_normalize", batch_normalize, what="tis")
    return correction_term("tis", lambda i: tis(i.logp, i.old_logp, i.adv, i.mask, level=level, cap=cap,
                                                batch_normalize=norm, log_rho=i.rollout_log_ratio, groups=i.row_groups))


def mis(logp, old_logp, adv, mask, *, level: str = "sequence", lo: float = 0.0, hi: float = 3.0,
        batch_normalize: bool = False, log_rho=None, groups=None) -> Correction:  # fmt: skip
    """MIS: ℓ = −sg(w·1[lo ≤ w ≤ hi])·Â·logp (token or sequence w); with ``batch_normalize`` the masked
    weights are divided by their batch mean (silenced ones count as 0 in it, as in verl)."""
    log_w = level_log_weight(token_log_weight(logp, old_logp, mask, log_rho), mask, level)
    coef, out = masked_weight(log_w, lo, hi)
    coef, metrics = _normalised(coef, mask, level, batch_normalize, groups)
    valid = _valid(mask)
    return Correction(-(coef * adv) * logp, coef, _nothing(out), out & valid, level, metrics)


@objective("mis", family="correction", same_defaults_as=mis,
           summary="−sg(w·1[lo ≤ w ≤ hi])·Â·logp, w per token or per sequence; weights outside are silenced",
           source="MIS, Liu, Li et al. (2025); TRL 1.16 vllm_importance_sampling_mode='sequence_mask', clip_max 3")
def _mis_objective(level: str = "sequence", lo: float = 0.0, hi: float = 3.0, batch_normalize: bool = False) -> TermFn:
    """MIS: ℓ = −sg(w·1[lo ≤ w ≤ hi])·Â·logp, w per token or per sequence; weights outside are silenced.

    Defaults are TRL's ``vllm_importance_sampling_mode="sequence_mask"`` with ``clip_max=3.0`` (no lower
    bound); verl's Seq-MIS preset uses [0.5, 2]. Metrics ``corr/mask_frac``, ``corr/silenced_adv_share/pos``, ...
    ``batch_normalize``: divide the weights by their batch mean, as ``tis``.
    """
    level = check_level(level, what="mis")
    lo, hi = check_band(lo, hi, what="mis")
    norm = check_bool("batch_normalize", batch_normalize, what="mis")
    return correction_term("mis", lambda i: mis(i.logp, i.old_logp, i.adv, i.mask, level=level, lo=lo, hi=hi,
                                                batch_normalize=norm, log_rho=i.rollout_log_ratio, groups=i.row_groups))


def icepop(logp, old_logp, adv, mask, *, lo: float = 0.5, hi: float = 5.0, log_rho=None) -> Correction:
    """IcePop: token-level MIS, ℓ = −sg(w_it·1[α ≤ w_it ≤ β])·Â·logp, [α, β] = [0.5, 5]."""
    return mis(logp, old_logp, adv, mask, level="token", lo=lo, hi=hi, log_rho=log_rho)


@objective("icepop", family="correction", same_defaults_as=icepop, summary="mis at token level on [0.5, 5]",
           source="IcePop, Ring-1T, arXiv 2510.18855; verl 0.9.1 bypass_pg_token_icepop preset, [0.5, 5]")
def _icepop_objective(lo: float = 0.5, hi: float = 5.0) -> TermFn:
    """IcePop: token-level MIS, ℓ = −sg(w_it·1[α ≤ w_it ≤ β])·Â·logp with [α, β] = [0.5, 5] (verl's
    ``bypass_pg_token_icepop``)."""
    lo, hi = check_band(lo, hi, what="icepop")
    return correction_term("icepop", lambda i: icepop(i.logp, i.old_logp, i.adv, i.mask, lo=lo, hi=hi,
                                                      log_rho=i.rollout_log_ratio))


def m2po(logp, old_logp, adv, mask, *, tau: float = 0.04, log_rho=None, groups=None) -> Correction:
    """M2PO: ℓ = −M·r·Â with r = exp(clamp(log w)) (gradient through r) and M = ``m2po_keep`` (within
    each of ``groups`` when given)."""
    log_w = token_log_weight(logp, old_logp, mask, log_rho)  # (B, T) detached
    keep = m2po_keep(log_w, mask, tau, groups)  # (B, T)
    log_r = logp - old_logp.detach() if log_rho is None else logp - old_logp.detach() + log_rho.detach()
    ratio = torch.exp(log_r.clamp(-LOG_W_CLAMP, LOG_W_CLAMP))  # (B, T) with grad
    k = keep.to(ratio.dtype)
    valid = _valid(mask)
    return Correction(-(k * adv) * ratio, k * ratio.detach(), _nothing(keep), valid & ~keep, "token", {})


@objective("m2po", family="correction", same_defaults_as=m2po,
           summary="−M·r·Â, M drops the largest (log r)² until their batch mean is below τ (not micro-batch invariant)",
           source="M2PO, Zheng et al. (2025), arXiv 2510.01161; AReaL actor.m2_threshold = 0.04")
def _m2po_objective(tau: float = 0.04) -> TermFn:
    """M2PO: ℓ = −M_it·r_it·Â_it (gradient through r = π_θ/π_old·ρ), M drops the tokens with the largest
    (log r)² until the mean (log r)² of the kept tokens of the batch is below τ (AReaL ``m2_threshold``).

    The selection spans the batch of the call, so M2PO is not invariant to micro-batching.
    """
    tau = check_positive("tau", tau, what="m2po")
    return correction_term("m2po", lambda i: m2po(i.logp, i.old_logp, i.adv, i.mask, tau=tau, log_rho=i.rollout_log_ratio,
                                                  groups=i.row_groups))  # fmt: skip


def _clip_metrics(clip, mask: torch.Tensor) -> Metrics:
    m = mask.to(torch.float64 if mask.dtype == torch.float64 else torch.float32)
    n = m.sum().clamp(min=1)
    return {"clipfrac": (clip.clipped.to(m.dtype) * m).sum() / n,
            "clip_inactive_frac": ((~clip.active).to(m.dtype) * m).sum() / n}  # fmt: skip


PROX_METHODS = ("given", "loglinear")


def decoupled(
    logp, old_logp, adv, mask, *, prox_logp=None, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
    clip_ratio_c: Optional[float] = None, cap: float = 5.0, cap_mode: str = "mask", prox_method: str = "given",
    log_rho=None, staleness=None,
) -> Correction:
    """Decoupled PPO: ℓ = b·PPO(π_θ/π_prox), b = π_prox/π_old (× ρ) masked (b > C → 0) or truncated (min(b, C)).

    π_prox by ``prox_method``:
      ``given``: ``prox_logp``; None means π_prox is the current policy at this evaluation (logp detached):
        the case of one optimizer step per batch, where r = 1 and ∇L = −agg[b·Â·∇logp].
      ``loglinear``: AReaL's approximation ``loglinear_prox_logp(logp, old_logp, staleness)`` from the (B, T)
        ``staleness`` (no proximal forward); a ``prox_logp`` given too is only compared with it
        (metrics ``prox/abs_error``, the mean |log π_prox − its approximation|, and ``prox/weight_error``,
        the mean |b − b_approx| before the cap), as AReaL's ``metrics`` mode does.
    """
    metrics: Metrics = {}
    if prox_method == "loglinear":
        if staleness is None:
            raise ValueError("decoupled: prox_method='loglinear' needs the per-token input staleness (B, T) = "
                             "v_theta - v_behaviour, the updates since each token was sampled")  # fmt: skip
        prox = loglinear_prox_logp(logp, old_logp, staleness)
        if prox_logp is not None:
            metrics = _prox_error(prox, prox_logp.detach(), old_logp.detach(), mask)
    else:
        prox = logp.detach() if prox_logp is None else prox_logp.detach()
    log_b = token_log_weight(prox, old_logp, mask, log_rho).clamp(-LOG_W_CLAMP, LOG_W_CLAMP)  # (B, T)
    if cap_mode == "mask":
        b, silenced = masked_weight(log_b, 0.0, cap)
        truncated = _nothing(silenced)
    else:
        b, truncated = truncated_weight(log_b, cap)
        silenced = _nothing(truncated)
    ratio = torch.exp((logp - prox).clamp(-LOG_W_CLAMP, LOG_W_CLAMP))  # (B, T) with grad
    clip = ppo_clip(adv, ratio, clip_ratio_low, clip_ratio_high, clip_ratio_c)
    valid = _valid(mask)
    coef = b * ratio.detach() * clip.active.to(b.dtype)
    return Correction(b * clip.loss, coef, truncated & valid, silenced & valid, "token",
                      {**_clip_metrics(clip, mask), **metrics})  # fmt: skip


@objective("decoupled", family="correction", same_defaults_as=decoupled, optional_inputs=("prox_logp", "staleness"),
           summary="b·PPO(π_θ/π_prox), b = π_prox/π_old masked (or truncated) above C; ``prox_logp`` optional "
                   "(the current policy by default), or AReaL's ``prox_method='loglinear'``",
           source="Hilton et al. (2022), arXiv 2110.00641; AReaL use_decoupled_loss, behav_imp_weight_cap 5")  # fmt: skip
def _decoupled_objective(clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2, clip_ratio_c: Optional[float] = None,
                         cap: float = 5.0, cap_mode: str = "mask", prox_method: str = "given") -> TermFn:  # fmt: skip
    """Decoupled PPO: ℓ = b·PPO(π_θ/π_prox), b = π_prox/π_old·ρ masked above C (``cap_mode="mask"``,
    AReaL's ``behav_imp_weight_cap``) or truncated at C (``"truncate"``, verl's decoupled mode).

    ``prox_logp`` (B, T), optional: the proximal policy's log-probs (the policy at the start of the
    update). Left out, π_prox is the current policy (logp detached): exact when a batch gets one
    optimizer step, as in respo's trainer, where r = 1 and ∇L = −agg[b·Â·∇logp].

    ``prox_method="loglinear"``: AReaL's log-linear proximal policy instead, log π_prox = log π_old +
    α·(log π_θ − log π_old), α = clamp((s − 1)/s, 0, 1), from the per-token ``staleness`` s (B, T), the
    updates since the token was sampled (no proximal forward); a ``prox_logp`` passed too is compared
    with it (``prox/abs_error``, ``prox/weight_error``).
    """
    low, high, c = check_clip(clip_ratio_low, clip_ratio_high, clip_ratio_c, what="decoupled")
    cap = check_cap(cap, what="decoupled")
    mode = check_cap_mode(cap_mode, what="decoupled")
    method = check_choice("prox_method", prox_method, PROX_METHODS, what="decoupled")
    return correction_term("decoupled", lambda i: decoupled(
        i.logp, i.old_logp, i.adv, i.mask, prox_logp=i.extra.get("prox_logp"), clip_ratio_low=low,
        clip_ratio_high=high, clip_ratio_c=c, cap=cap, cap_mode=mode, prox_method=method, log_rho=i.rollout_log_ratio,
        staleness=i.extra.get("staleness")))  # fmt: skip


def _prox_error(approx: torch.Tensor, given: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> Metrics:
    """How far an approximated log π_prox is from the given one over the valid tokens (detached)."""
    clamp = LOG_W_CLAMP
    b_err = (torch.exp((approx - old_logp).clamp(-clamp, clamp)) - torch.exp((given - old_logp).clamp(-clamp, clamp))).abs()
    return {"prox/abs_error": _masked_mean((approx - given).abs(), mask), "prox/weight_error": _masked_mean(b_err, mask)}


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(stat_dtype(mask.dtype))
    return (torch.where(m > 0, x.to(m.dtype), torch.zeros((), dtype=m.dtype)) * m).sum() / m.sum().clamp(min=1)


def opsm(
    logp, old_logp, adv, seq_adv, mask, *, delta: float = 0.5, clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2, clip_ratio_c: Optional[float] = None, log_rho=None,
) -> Correction:
    """OPSM: ℓ = K_i·ρ·PPO(π_θ/π_old) with K from ``opsm_keep`` on log w = log π_θ − log π_old (+ log ρ)."""
    log_w = token_log_weight(logp, old_logp, mask, log_rho)
    keep = opsm_keep(log_w, seq_adv, mask, delta).unsqueeze(-1)  # (B, 1)
    ratio = torch.exp((logp - old_logp).clamp(-LOG_W_CLAMP, LOG_W_CLAMP))  # (B, T) with grad
    clip = ppo_clip(adv, ratio, clip_ratio_low, clip_ratio_high, clip_ratio_c)
    rho = 1.0 if log_rho is None else torch.exp(log_rho.detach().clamp(-LOG_W_CLAMP, LOG_W_CLAMP))
    k = keep.to(ratio.dtype) * rho
    valid = _valid(mask)
    coef = k * ratio.detach() * clip.active.to(ratio.dtype)
    silenced = (~keep).expand_as(valid) & valid
    return Correction(k * clip.loss, coef, _nothing(valid), silenced, "sequence", _clip_metrics(clip, mask))


@objective("opsm", family="correction", same_defaults_as=opsm,
           summary="K_i·ρ·PPO(π_θ/π_old), K_i = 0 for Â_i < 0 with mean_t log(π_old/π_θ) > δ",
           source="OPSM, DeepSeek-V3.2, arXiv 2512.02556 eq. 9; TRL 1.16 off_policy_mask_threshold (its example 0.5)")
def _opsm_objective(delta: float = 0.5, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
                    clip_ratio_c: Optional[float] = None) -> TermFn:  # fmt: skip
    """OPSM (DeepSeek-V3.2): ℓ = K_i·ρ·PPO(π_θ/π_old), K_i = 0 for Â_i < 0 whose mean per-token
    KL_i = mean_t(log π_old − log π_θ − log ρ) exceeds δ (TRL ``off_policy_mask_threshold``).

    Default δ = 0.5 is TRL's documented example; the clip is TRL's default loss (ε = 0.2, no dual clip).
    """
    delta = check_positive("delta", delta, what="opsm", allow_zero=True)
    low, high, c = check_clip(clip_ratio_low, clip_ratio_high, clip_ratio_c, what="opsm")
    return correction_term("opsm", lambda i: opsm(
        i.logp, i.old_logp, i.adv, i.seq_adv, i.mask, delta=delta, clip_ratio_low=low, clip_ratio_high=high,
        clip_ratio_c=c, log_rho=i.rollout_log_ratio))  # fmt: skip


def dppo_keep(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, divergence: str, delta_low: float,
              delta_high: float) -> torch.Tensor:  # fmt: skip
    """DPPO's trust-region mask M_it, (B, T) bool, from the current and behaviour probabilities of the sampled token.

        p = π_θ(y_t), q = π_old(y_t) (exp of the log-probs, not clamped)
        tv:  Â > 0: keep p − q ≤ δ_h;                         Â ≤ 0: keep p − q ≥ −δ_l
        kl:  D = q·log(q/p) + (1 − q)·log((1 − q + 1e-8)/(1 − p + 1e-8))   (the binary KL of the Bernoulli
             "sampled token or not" under π_old and π_θ; 1e-8 as verl)
             Â > 0: keep D ≤ δ_h or p ≤ q;                    Â ≤ 0: keep D ≤ δ_l or p ≥ q

    A token leaves the gradient only when its divergence passes δ in the direction the advantage pushes.
    """
    lp, lq = logp.detach(), old_logp.detach()
    p, q = torch.exp(lp), torch.exp(lq)
    if divergence == "tv":
        pos, neg = (p - q) <= delta_high, (p - q) >= -delta_low
    else:
        d = q * (lq - lp) + (1 - q) * torch.log((1.0 - q + 1e-8) / (1.0 - p + 1e-8))
        pos, neg = (d <= delta_high) | (p <= q), (d <= delta_low) | (p >= q)
    return torch.where(adv > 0, pos, neg)


def dppo_tv(logp, old_logp, adv, mask, *, delta_low: float = 0.15, delta_high: float = 0.15, cap: float = 10000.0,
            log_rho=None) -> Correction:  # fmt: skip
    """DPPO-Binary-TV: ℓ = −M_it·sg(min(r, C))·ρ·Â·logp, M = ``dppo_keep(..., "tv")``, r = π_θ/π_old."""
    return _dppo(logp, old_logp, adv, mask, "tv", delta_low, delta_high, cap, log_rho)


def dppo_kl(logp, old_logp, adv, mask, *, delta_low: float = 0.05, delta_high: float = 0.05, cap: float = 10000.0,
            log_rho=None) -> Correction:  # fmt: skip
    """DPPO-Binary-KL: ℓ = −M_it·sg(min(r, C))·ρ·Â·logp, M = ``dppo_keep(..., "kl")``, r = π_θ/π_old."""
    return _dppo(logp, old_logp, adv, mask, "kl", delta_low, delta_high, cap, log_rho)


def _dppo(logp, old_logp, adv, mask, divergence, delta_low, delta_high, cap, log_rho) -> Correction:
    keep = dppo_keep(logp, old_logp, adv.expand_as(logp), divergence, delta_low, delta_high)  # (B, T)
    ratio = torch.exp((logp.detach() - old_logp.detach()).clamp(-LOG_W_CLAMP, LOG_W_CLAMP))  # (B, T), r not π_θ/π_old·ρ
    rho = 1.0 if log_rho is None else torch.exp(log_rho.detach().clamp(-LOG_W_CLAMP, LOG_W_CLAMP))
    coef = ratio.clamp(max=cap) * keep.to(ratio.dtype) * rho  # (B, T) detached
    valid = _valid(mask)
    metrics = {"clipfrac": masked_frac(~keep, mask)}  # verl's pg_clipfrac: the share of tokens the trust region masked
    return Correction(-(coef * adv) * logp, coef, (ratio > cap) & keep & valid, ~keep & valid, "token", metrics)


@objective("dppo_tv", family="correction", same_defaults_as=dppo_tv,
           summary="−M·sg(min(r, C))·ρ·Â·logp, M drops tokens whose probability moved past δ along Â's push",
           source="DPPO, arXiv 2602.04879; verl 0.9.1 loss_mode='dppo_tv', its DPPO recipe (δ = 0.15, C = 1e4)")
def _dppo_tv_objective(delta_low: float = 0.15, delta_high: float = 0.15, cap: float = 10000.0) -> TermFn:
    """DPPO-Binary-TV (arXiv 2602.04879; verl ``dppo_tv``): ℓ = −M_it·sg(min(r, C))·ρ·Â·logp with
    M_it = 0 where the sampled token's probability moved past δ in the direction the advantage pushes:
    Â > 0 and π_θ − π_old > δ_h, or Â ≤ 0 and π_θ − π_old < −δ_l (probabilities, not the ratio).

    Defaults δ_l = δ_h = 0.15 and C = 10⁴ (a truncation kept out of the way, the paper's advice) are
    verl's DPPO recipe (``examples/dppo_trainer``: ``clip_ratio_low/high`` 0.15, ``clip_ratio_c`` 10000).
    """
    return _dppo_objective("dppo_tv", dppo_tv, delta_low, delta_high, cap)


@objective("dppo_kl", family="correction", same_defaults_as=dppo_kl,
           summary="dppo_tv's mask with the sampled token's binary KL in place of the probability change",
           source="DPPO, arXiv 2602.04879; verl 0.9.1 loss_mode='dppo_kl', its DPPO recipe (δ = 0.05, C = 1e4)")
def _dppo_kl_objective(delta_low: float = 0.05, delta_high: float = 0.05, cap: float = 10000.0) -> TermFn:
    """DPPO-Binary-KL (verl ``dppo_kl``): ``dppo_tv`` with the binary KL of the sampled token,
    D = q·log(q/p) + (1 − q)·log((1 − q)/(1 − p)), p = π_θ, q = π_old: M_it = 0 where D > δ and the
    probability moved in the advantage's direction. Defaults δ = 0.05 and C = 10⁴ (verl's DPPO recipe).
    """
    return _dppo_objective("dppo_kl", dppo_kl, delta_low, delta_high, cap)


def _dppo_objective(name: str, fn: Callable, delta_low, delta_high, cap) -> TermFn:
    lo = check_positive("delta_low", delta_low, what=name, allow_zero=True)
    hi = check_positive("delta_high", delta_high, what=name, allow_zero=True)
    cap = check_cap(cap, what=name)
    return correction_term(name, lambda i: fn(i.logp, i.old_logp, i.adv, i.mask, delta_low=lo, delta_high=hi, cap=cap,
                                              log_rho=i.rollout_log_ratio))  # fmt: skip


KL_ESTIMATORS = ("k1", "k2", "k3")
KL_AGGS = ("token", "mean", "sum", "max")


def kl_estimate(log_w: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of the divergence between the behaviour and the current policy, from l = clamp(log w, ±20):

        k1 = −l       k2 = l²/2       k3 = e^l − 1 − l      (verl's ``token_k1/k2/k3``)
    """
    lw = log_w.clamp(-LOG_W_CLAMP, LOG_W_CLAMP)
    if estimator == "k1":
        return -lw
    if estimator == "k2":
        return 0.5 * lw**2
    return torch.exp(lw) - 1.0 - lw


def kl_reject_keep(log_w: torch.Tensor, mask: torch.Tensor, *, estimator: str, agg: str, threshold: float,
                   lower: Optional[float] = None, veto: Optional[float] = None) -> torch.Tensor:  # fmt: skip
    """The tokens a KL-estimator rejection keeps, (B, T) bool (verl's ``rollout_rs`` modes, plus a veto).

        s_it = kl_estimate(log w_it);   S = s_it (token), mean_t, Σ_t or max_t of m·s (per row, broadcast)
        k2, k3:  keep S ≤ threshold
        k1:      keep log(lower) ≤ S ≤ log(threshold): the bounds are ratios, lower = 1/threshold when None
        veto:    also drop every token of a row with a valid token whose w_it < veto (a catastrophic outlier)

    Args:
      log_w: (B, T) detached log w = logp − old_logp (+ log ρ), 0 off the mask.
      mask: (B, T) 0/1.
    """
    valid = _valid(mask)
    m = mask.to(log_w.dtype)
    stat = kl_estimate(log_w, estimator)  # (B, T)
    if agg == "sum":
        stat = (stat * m).sum(dim=-1, keepdim=True)
    elif agg == "mean":
        stat = (stat * m).sum(dim=-1, keepdim=True) / m.sum(dim=-1, keepdim=True).clamp(min=1)
    elif agg == "max":
        big = torch.finfo(stat.dtype).max
        stat = torch.where(valid, stat, torch.full_like(stat, -big)).amax(dim=-1, keepdim=True)
    if estimator == "k1":
        lo = math.log(1.0 / threshold if lower is None else lower)
        keep = (stat >= lo) & (stat <= math.log(threshold))
    else:
        keep = stat <= threshold
    keep = keep.expand_as(valid)
    if veto is not None:
        outlier = valid & (log_w.clamp(-LOG_W_CLAMP, LOG_W_CLAMP) < math.log(veto))
        keep = keep & ~outlier.any(dim=-1, keepdim=True)
    return keep & valid


def loglinear_prox_logp(logp: torch.Tensor, old_logp: torch.Tensor, staleness: torch.Tensor) -> torch.Tensor:
    """AReaL's log-linear proximal policy: log π_prox ≈ log π_old + α·(log π_θ − log π_old), detached.

    With v_θ the current version, v_b the version that sampled the token (s = v_θ − v_b, the staleness)
    and v_prox = v_θ − 1:

        α = clamp((v_prox − v_b)/(v_θ − v_b), 0, 1) = clamp((s − 1)/s, 0, 1) for s > 0, and α = 0 for s ≤ 0

    so a token sampled by the previous version (s = 1) keeps π_old and one sampled long ago moves toward π_θ.
    """
    s = staleness.detach().to(logp.dtype)
    alpha = torch.where(s > 0, (s - 1) / s.clamp(min=1), torch.zeros_like(s)).clamp(0.0, 1.0)  # (B, T)
    old = old_logp.detach()
    return old + alpha * (logp.detach() - old)


# --------------------------------------------------------------------------------------------------
# Diagnostics
# --------------------------------------------------------------------------------------------------


def _nan(like: torch.Tensor) -> torch.Tensor:
    return torch.full((), math.nan, dtype=like.dtype, device=like.device)


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    return torch.where(den > 0, num / den.clamp(min=1e-38), _nan(num))


def chi2(log_w: torch.Tensor, mask: torch.Tensor) -> Metrics:
    """χ² of the importance weights, as verl's ``compute_offpolicy_metrics`` logs them.

        chi2_token = Σ_it m·w_it² / Σ m − 1,     w_it = exp(clamp(log w_it, ±20))
        chi2_seq   = mean over non-empty rows of W_i² − 1,   W_i = exp(clamp(Σ_t m log w_it, ±20))
    """
    log_w = log_w.detach().to(stat_dtype(log_w.dtype))
    m = mask.to(log_w.dtype)
    valid = m > 0
    zero = torch.zeros((), dtype=log_w.dtype, device=log_w.device)
    w2 = torch.exp(2 * log_w.clamp(-LOG_W_CLAMP, LOG_W_CLAMP))
    chi_tok = _ratio(torch.where(valid, w2, zero).sum(), m.sum()) - 1
    rows = m.sum(dim=-1) > 0
    seq = torch.exp(2 * (log_w * m).sum(dim=-1).clamp(-LOG_W_CLAMP, LOG_W_CLAMP))  # (B,)
    chi_seq = _ratio(torch.where(rows, seq, zero).sum(), rows.to(log_w.dtype).sum()) - 1
    return {"chi2_token": chi_tok, "chi2_seq": chi_seq}


def correction_diagnostics(corr: Correction, log_w: torch.Tensor, adv: torch.Tensor, seq_adv: torch.Tensor,
                           mask: torch.Tensor, prefix: str = "corr/") -> Metrics:
    """The fractions a correction truncated and silenced per advantage sign and the share of each sign's
    learning signal it silenced (keys in the module docstring; ``chi2`` gives χ² of W).

    Args:
      corr: the ``Correction``.
      log_w: (B, T) log w = logp − old_logp (+ log ρ), detached.
      adv: (B, 1) or (B, T) advantages; seq_adv: (B,) the row's advantage (its sign splits pos/neg).
      mask: (B, T) 0/1.
      prefix: of the keys (``corr/``; a correction composed with another objective uses its own).
    """
    dtype = stat_dtype(log_w.dtype)
    m = mask.to(dtype)
    valid = m > 0
    rows = valid.any(dim=-1)  # (B,)
    zero = torch.zeros((), dtype=dtype, device=m.device)
    out: Metrics = {}
    signs = {"": rows, "/pos": rows & (seq_adv > 0), "/neg": rows & (seq_adv < 0)}
    for key, cut in (("trunc_frac", corr.truncated), ("mask_frac", corr.silenced)):
        for suffix, sel in signs.items():
            if corr.level == "sequence":  # one decision per row
                hit = (cut & valid).any(dim=-1) & sel
                out[f"{prefix}{key}{suffix}"] = _ratio(hit.to(dtype).sum(), sel.to(dtype).sum())
            else:
                tok = valid & sel.unsqueeze(-1)
                out[f"{prefix}{key}{suffix}"] = _ratio((cut & tok).to(dtype).sum(), tok.to(dtype).sum())
    # per token and per sequence whatever the correction's unit: silenced tokens, rows with any silenced token
    silenced = corr.silenced & valid
    out[f"{prefix}masked_tokens"] = _ratio(silenced.to(dtype).sum(), m.sum())
    out[f"{prefix}masked_seqs"] = _ratio((silenced.any(dim=-1) & rows).to(dtype).sum(), rows.to(dtype).sum())
    a = adv.detach().to(dtype).abs().expand_as(m)
    for suffix in ("/pos", "/neg"):
        sel = signs[suffix]
        tok = valid & sel.unsqueeze(-1)
        all_silenced = ((corr.silenced | ~valid).all(dim=-1)) & sel
        out[f"{prefix}silenced_seqs{suffix}"] = _ratio(all_silenced.to(dtype).sum(), sel.to(dtype).sum())
        signal = torch.where(tok, a, zero).sum()
        out[f"{prefix}silenced_adv_share{suffix}"] = _ratio(torch.where(tok & corr.silenced, a, zero).sum(), signal)
        # the coefficient mass of the kept rows of that sign going to its under-generated rows (log W < −1)
        kept_rows = sel & ~all_silenced
        mass = torch.where(valid, corr.coef.detach().to(dtype).abs(), zero).sum(dim=-1)  # (B,)
        low = kept_rows & ((log_w.to(dtype) * m).sum(dim=-1) < -1.0)
        out[f"{prefix}kept_low_w_mass_share{suffix}"] = _ratio(torch.where(low, mass, zero).sum(),
                                                               torch.where(kept_rows, mass, zero).sum())  # fmt: skip
    out.update({k: v.detach() for k, v in corr.metrics.items()})
    return out


__all__ = [
    "CAP_MODES", "Correction", "LEVELS", "chi2", "correction_diagnostics", "decoupled", "icepop", "level_log_weight",
    "m2po", "m2po_keep", "masked_weight", "mis", "opsm", "opsm_keep", "ppo_clip", "tis", "token_log_weight",
    "truncated_weight",
]  # fmt: skip
