"""The field's other policy-loss rules: verl 0.9.1's ``dro``, ``clip_cov``, ``kl_cov`` and ``gpg``, prime-rl's
default loss, SkyRL's off-policy masks and TRL's two-sided clip (docs/method.md gives their formulas and sources).

Pure functions of tensors (torch only), each rule an objective registered beside its function. Notation as in
``respo.core.corrections``: r_it = π_θ/π_old of the sampled token (with grad), log w_it = logp − old_logp (+ log ρ)
detached, ρ the rollout weight, Â the advantage, m the mask; every gradient is written
∇ℓ_it = (−c_it·Â_it + g_it)·∇logp_it with c the detached coefficient of the advantage term (what ``coef_mean``
and the starvation diagnostics read) and g the gradient of a penalty term, where the rule has one: c = ρ for gpg
and dro (g = β·log r·ρ), c = r·ρ for kl_cov (g = κ·sgn(log r)·S·ρ, S the top-k tokens by covariance), c = M·τ_A·w
for prime_rl (g = 2τ_KL·log w, w = r·ρ = π_θ/π_sampler), and clip_cov's K = 0 on k random tokens of the
covariance band.

The rules (``python scripts/catalogue.py`` writes the list from the registry):

    gpg            −Â·logp·ρ
                   no hyperparameters; token-mean
                   GPG, Chu et al. (2025), arXiv 2504.02546; verl 0.9.1 loss_mode='gpg' (no hyperparameters)
    dro            −(Â·logp − ½β(log r)²)·ρ
                   beta=1.0; token-mean
                   verl 0.9.1 loss_mode='dro' (policy_loss.dro_beta has no default, required > 0: β = 1 is respo's)
    kl_cov         −Â·r·ρ plus κ·|log r|·ρ on the k tokens of largest covariance
                   kl_cov_ratio=0.0002, ppo_kl_coef=0.1; token-mean
                   KL-Cov, Cui et al. (2025), arXiv 2505.22617; verl 0.9.1 loss_mode='kl_cov', PolicyLossConfig
                   kl_cov_ratio 2e-4, ppo_kl_coef 0.1
    clip_cov       PPO clip with the gradient of k random tokens of a covariance band detached
                   clip_ratio_low=0.2, clip_ratio_high=0.2, clip_cov_ratio=0.0002, clip_cov_lb=1.0, clip_cov_ub=5.0;
                   token-mean
                   Clip-Cov, Cui et al. (2025), arXiv 2505.22617; verl 0.9.1 loss_mode='clip_cov', PolicyLossConfig
                   clip_cov_ratio 2e-4, lb 1, ub 5, ActorConfig ε = 0.2
    prime_rl       −M·τ_A·Â·w + τ_KL·(log w)², M DPPO's binary-TV mask, w = π_θ/π_sampler
                   delta_low=0.2, delta_high=0.2, adv_tau=1.0, kl_tau=0.001; token-mean
                   prime-rl 0.8.0 default loss (DefaultLossConfig: dppo_mask 0.2, adv_tau 1, kl_tau 1e-3):
                   DPPO-Binary-TV, arXiv 2602.04879, + Kimi K2.5's (log r)², arXiv 2602.02276
    two_sided      −min(min(r, δ)·Â, clip(r)·Â)·ρ
                   clip_ratio_low=0.2, clip_ratio_high=0.2, delta=4.0; token-mean
                   INTELLECT-2, arXiv 2505.07291 (δ = 4, ε = 0.2); TRL 1.16 GRPOConfig delta

The covariance of a token is cov_it = (Â_it − Ā)(logp_it − l̄), Ā and l̄ the means over the valid tokens of the
batch (or of each of ``groups``): Clip-Cov and KL-Cov (Cui et al. 2025, "The entropy mechanism of reinforcement
learning for reasoning language models", arXiv 2505.22617) act on the few tokens whose covariance drives the
entropy down. Both select over the batch they are given, so, like M2PO, neither is invariant to micro-batching.

SkyRL's masks (``sequence_ratio_keep``, ``outlier_token_keep``) reject whole sequences by their importance
ratios before any policy loss; ``respo.core.objectives`` composes them with a base objective.

``penalty_metrics`` describes a penalty term (detached 0-d tensors): ``penalty/mean`` the masked token mean of
the penalty as it enters ℓ, ``penalty/grad_share`` = Σ m|g| / (Σ m|c·Â| + Σ m|g|), the share of the gradient's
magnitude that comes from the penalty rather than the advantage (NaN when both are 0).
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch

from respo.core.checks import LossInputs, check_clip, check_fraction, check_number, check_positive
from respo.core.corrections import Correction, correction_term, dppo_keep
from respo.core.diagnostics import clip_fractions, masked_frac, stat_dtype
from respo.core.ratios import LOG_W_CLAMP, ppo_clip
from respo.core.registry import Term, TermFn, objective, weigh

Metrics = Dict[str, torch.Tensor]

__all__ = [
    "clip_cov", "clip_cov_keep", "covariance", "kl_cov_select", "outlier_token_keep", "penalty_metrics", "prime_rl",
    "select_count", "sequence_ratio_keep", "two_sided_clip",
]  # fmt: skip


def _valid(mask: torch.Tensor) -> torch.Tensor:
    return mask > 0


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(stat_dtype(mask.dtype))
    zero = torch.zeros((), dtype=m.dtype, device=m.device)
    return (torch.where(m > 0, x.to(m.dtype), zero) * m).sum() / m.sum().clamp(min=1)


def penalty_metrics(penalty: torch.Tensor, coef: torch.Tensor, adv: torch.Tensor, grad: torch.Tensor,
                    mask: torch.Tensor) -> Metrics:  # fmt: skip
    """``penalty/mean`` and ``penalty/grad_share`` (module docstring) of a penalty term.

    Args:
      penalty: (B, T) the penalty's value as it enters ℓ; coef: (B, T) c; adv: (B, 1) or (B, T) Â;
      grad: (B, T) g, the penalty's coefficient of ∇logp; mask: (B, T) 0/1. All detached.
    """
    dtype = stat_dtype(mask.dtype)
    valid = _valid(mask)
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    pen = torch.where(valid, grad.detach().to(dtype).abs(), zero).sum()
    adv_part = torch.where(valid, (coef.detach().to(dtype) * adv.detach().to(dtype)).abs(), zero).sum()
    total = pen + adv_part
    share = torch.where(total > 0, pen / total.clamp(min=1e-38), torch.full((), math.nan, dtype=dtype, device=mask.device))
    return {"penalty/mean": _masked_mean(penalty.detach(), mask), "penalty/grad_share": share}


# --------------------------------------------------------------------------------------------------
# verl's gpg and dro
# --------------------------------------------------------------------------------------------------


@objective("gpg", family="rule", summary="−Â·logp·ρ",
           source="GPG, Chu et al. (2025), arXiv 2504.02546; verl 0.9.1 loss_mode='gpg' (no hyperparameters)")
def _gpg_objective() -> TermFn:
    """GPG (verl ``gpg``; Chu et al. 2025, arXiv 2504.02546): ℓ = −Â·logp·ρ, REINFORCE with the rollout weight
    multiplying the per-token loss as verl does (``reinforce`` ignores ρ). GPG's own advantage (verl's
    ``adv_estimator=gpg``) is the caller's; the loss has no hyperparameters. Coefficient c = ρ (1 without ρ).
    """

    def term(inputs: LossInputs, log_ratio: torch.Tensor, rho: Optional[torch.Tensor]) -> Term:
        values = weigh(-inputs.adv * inputs.logp, rho)  # (B, T)
        coef = torch.ones_like(log_ratio.detach()) if rho is None else rho
        return Term(values, coef)

    return term


@objective("dro", family="rule", scale_free=False, summary="−(Â·logp − ½β(log r)²)·ρ",
           source="verl 0.9.1 loss_mode='dro' (policy_loss.dro_beta has no default, required > 0: β = 1 is respo's)")
def _dro_objective(beta: float = 1.0) -> TermFn:
    """DRO (verl ``dro``): ℓ = −(Â·logp − ½β·(log r)²)·ρ, REINFORCE with a quadratic log-ratio penalty.

    ∇ℓ = −(Â − β·log r)·ρ·∇logp: c = ρ, the penalty's g = β·log r·ρ (metrics ``penalty/mean``,
    ``penalty/grad_share``).
    verl 0.9.1 ships no default (``policy_loss.dro_beta: null``, required > 0); β = 1 is respo's, the unit
    penalty, to be set by the run. Default aggregation ``token-mean``.
    """
    beta = check_positive("beta", beta, what="dro")

    def term(inputs: LossInputs, log_ratio: torch.Tensor, rho: Optional[torch.Tensor]) -> Term:
        values = weigh(-(inputs.adv * inputs.logp - 0.5 * beta * log_ratio.square()), rho)  # (B, T)
        with torch.no_grad():
            lr = log_ratio.detach()
            coef = torch.ones_like(lr) if rho is None else rho
            metrics = penalty_metrics(coef * 0.5 * beta * lr.square(), coef, inputs.adv, coef * beta * lr, inputs.mask)
        return Term(values, coef, metrics)

    return term


# --------------------------------------------------------------------------------------------------
# Covariance selections (Clip-Cov, KL-Cov)
# --------------------------------------------------------------------------------------------------


def covariance(logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """cov_it = (Â_it − Ā)(logp_it − l̄), Ā and l̄ the plain means over the valid tokens, (B, T), detached,
    in ``stat_dtype`` (float32 for half inputs); 0 off the mask."""
    dtype = stat_dtype(logp.dtype)
    valid = _valid(mask)
    a = adv.detach().to(dtype).expand_as(logp)
    lp = logp.detach().to(dtype)
    zero = torch.zeros((), dtype=dtype, device=logp.device)
    n = valid.sum().clamp(min=1).to(dtype)
    a_bar = torch.where(valid, a, zero).sum() / n
    l_bar = torch.where(valid, lp, zero).sum() / n
    return torch.where(valid, (a - a_bar) * (lp - l_bar), zero)


def select_count(ratio: float, n_valid: int) -> int:
    """How many tokens a covariance rule acts on: max(⌊ratio·N⌋, 1), N the valid tokens (verl's
    ``max(int(ratio * N), 1)``, the product taken in Python floats, as verl takes it)."""
    return max(int(ratio * float(n_valid)), 1)


def _per_group(fn, groups: Optional[torch.Tensor], mask: torch.Tensor, *tensors) -> torch.Tensor:
    """``fn(*tensors, mask)`` over the whole batch, or within each set of rows sharing a value of ``groups``
    (in increasing order of the value), as each micro-batch's own call made it."""
    if groups is None:
        return fn(*tensors, mask)
    out = torch.zeros_like(mask, dtype=torch.bool)
    for g in torch.unique(groups):
        rows = groups == g
        out[rows] = fn(*(t[rows] for t in tensors), mask[rows])
    return out


def kl_cov_select(logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, *, ratio: float,
                  groups: Optional[torch.Tensor] = None) -> torch.Tensor:  # fmt: skip
    """KL-Cov's tokens S, (B, T) bool: the k = ``select_count(ratio, N)`` valid tokens of largest covariance.

    verl's ``compute_policy_loss_kl_cov`` takes ``torch.topk`` of the valid tokens' covariances (row-major order);
    the set of the k largest is the same whenever the k-th and (k+1)-th values differ. Ties at the boundary are
    broken here by position (a stable descending sort keeps the earlier token), where topk leaves the choice
    unspecified. ``groups``: select within each micro-batch.
    """

    def select(lp, a, m):
        valid = _valid(m)
        n = int(valid.sum().item())
        chosen = torch.zeros_like(valid)
        if n == 0:
            return chosen
        cov = covariance(lp, a, m)[valid]  # (n,) row-major
        order = torch.argsort(cov, descending=True, stable=True)[: select_count(ratio, n)]
        flat = torch.zeros(n, dtype=torch.bool, device=m.device)
        flat[order] = True
        chosen[valid] = flat
        return chosen

    return _per_group(select, groups, mask, logp, adv.expand_as(logp))


@objective("kl_cov", family="rule", scale_free=False,
           summary="−Â·r·ρ plus κ·|log r|·ρ on the k tokens of largest covariance",
           source="KL-Cov, Cui et al. (2025), arXiv 2505.22617; verl 0.9.1 loss_mode='kl_cov', "
                  "PolicyLossConfig kl_cov_ratio 2e-4, ppo_kl_coef 0.1")
def _kl_cov_objective(kl_cov_ratio: float = 2e-4, ppo_kl_coef: float = 0.1) -> TermFn:
    """KL-Cov (verl ``kl_cov``; Cui et al. 2025, arXiv 2505.22617): ℓ = (−Â·r + κ·|log r|·S)·ρ, no clip.

    S marks the k = max(⌊ratio·N⌋, 1) valid tokens of largest covariance (Â_it − Ā)(logp_it − l̄) over the batch
    (``kl_cov_select``; within each of ``row_groups``, so not micro-batch invariant). c = r·ρ; the
    penalty's g = κ·sgn(log r)·S·ρ. Defaults are verl's ``PolicyLossConfig`` (``kl_cov_ratio`` 2e-4,
    ``ppo_kl_coef`` 0.1). Metrics ``penalty/token_frac`` (the share of tokens penalised), ``penalty/mean``,
    ``penalty/grad_share``.
    """
    ratio = check_fraction("kl_cov_ratio", kl_cov_ratio, what="kl_cov")
    kappa = check_positive("ppo_kl_coef", ppo_kl_coef, what="kl_cov", allow_zero=True)

    def term(inputs: LossInputs, log_ratio: torch.Tensor, rho: Optional[torch.Tensor]) -> Term:
        adv = inputs.adv
        with torch.no_grad():
            sel = kl_cov_select(inputs.logp, adv, inputs.mask, ratio=ratio, groups=inputs.row_groups)
            s = sel.to(log_ratio.dtype)
        values = weigh(-adv * torch.exp(log_ratio) + kappa * log_ratio.abs() * s, rho)  # (B, T)
        with torch.no_grad():
            lr = log_ratio.detach()
            coef = weigh(torch.exp(lr), rho)
            grad = weigh(kappa * torch.sign(lr) * s, rho)
            metrics = penalty_metrics(weigh(kappa * lr.abs() * s, rho), coef, adv, grad, inputs.mask)
            metrics["penalty/token_frac"] = masked_frac(sel, inputs.mask)
        return Term(values, coef, metrics)

    return term


def clip_cov_keep(logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, clipped: torch.Tensor, *, ratio: float,
                  lb: float, ub: float, groups: Optional[torch.Tensor] = None) -> torch.Tensor:  # fmt: skip
    """Clip-Cov's K, (B, T) bool: False on the tokens whose gradient it detaches.

    The candidates are the valid tokens the PPO clip leaves active (``clipped`` False) with lb < cov_it < ub
    (strict); k = ``select_count(ratio, N)`` of them (all of them when fewer) are drawn at random, as verl does:
    ``torch.randperm`` of the candidates in row-major order from torch's global generator, the first k kept.
    Seed the generator (``torch.manual_seed``) for a reproducible selection; verl's own call draws the same
    permutation from the same seed. ``groups``: one draw per micro-batch, in increasing order of the group.
    """

    def keep(lp, a, cl, m):
        valid = _valid(m)
        n = int(valid.sum().item())
        out = torch.ones_like(valid)
        if n == 0:
            return out
        cov = covariance(lp, a, m)
        band = valid & ~cl & (cov > lb) & (cov < ub)
        idx = torch.nonzero(band)  # (n_band, 2), row-major
        if len(idx) > 0:
            perm = torch.randperm(len(idx))
            idx = idx[perm[: min(select_count(ratio, n), len(idx))]]
            out[idx[:, 0], idx[:, 1]] = False
        return out

    return _per_group(keep, groups, mask, logp, adv.expand_as(logp), clipped)


def clip_cov(logp, old_logp, adv, mask, *, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
             clip_cov_ratio: float = 2e-4, clip_cov_lb: float = 1.0, clip_cov_ub: float = 5.0, log_rho=None,
             groups=None) -> Correction:  # fmt: skip
    """Clip-Cov: ℓ = max(−r·Â, −clip(r)·Â)·K·ρ with K = ``clip_cov_keep`` (PPO's clip, no dual clip, as verl).

    Coefficient c = r·ρ where the clip is inactive and K = 1, else 0. The silenced tokens are those K detached;
    metric ``clipfrac`` is their share of the valid tokens (verl's ``pg_clipfrac`` of this loss), and
    ``clipfrac_high``/``clipfrac_low`` the PPO clip's.
    """
    ratio = torch.exp((logp - old_logp.detach()).clamp(-LOG_W_CLAMP, LOG_W_CLAMP))  # (B, T) with grad
    clip = ppo_clip(adv, ratio, clip_ratio_low, clip_ratio_high)
    valid = _valid(mask)
    keep = clip_cov_keep(logp, adv, mask, clip.clipped & valid, ratio=clip_cov_ratio, lb=clip_cov_lb, ub=clip_cov_ub,
                         groups=groups)  # fmt: skip
    rho = 1.0 if log_rho is None else torch.exp(log_rho.detach().clamp(-LOG_W_CLAMP, LOG_W_CLAMP))
    k = keep.to(ratio.dtype) * rho
    coef = k * ratio.detach() * clip.active.to(ratio.dtype)
    silenced = ~keep & valid
    metrics = {"clipfrac": _masked_mean(silenced, mask), "clipfrac_high": _masked_mean(clip.high, mask),
               "clipfrac_low": _masked_mean(clip.low, mask)}  # fmt: skip
    return Correction(clip.loss * k, coef, torch.zeros_like(valid), silenced, "token", metrics)


@objective("clip_cov", family="rule", scale_free=False, same_defaults_as=clip_cov,
           summary="PPO clip with the gradient of k random tokens of a covariance band detached",
           source="Clip-Cov, Cui et al. (2025), arXiv 2505.22617; verl 0.9.1 loss_mode='clip_cov', "
                  "PolicyLossConfig clip_cov_ratio 2e-4, lb 1, ub 5, ActorConfig ε = 0.2")
def _clip_cov_objective(clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2, clip_cov_ratio: float = 2e-4,
                        clip_cov_lb: float = 1.0, clip_cov_ub: float = 5.0) -> TermFn:  # fmt: skip
    """Clip-Cov (verl ``clip_cov``; Cui et al. 2025, arXiv 2505.22617): ℓ = max(−r·Â, −clip(r)·Â)·K·ρ.

    K = 0 on k = max(⌊ratio·N⌋, 1) tokens drawn at random (torch's global generator, as verl: seed it) among the
    valid tokens the clip leaves active whose covariance (Â_it − Ā)(logp_it − l̄) lies strictly inside
    (lb, ub) (``clip_cov_keep``; within each of ``row_groups``). Defaults are verl's ``PolicyLossConfig``
    (``clip_cov_ratio`` 2e-4, ``clip_cov_lb`` 1, ``clip_cov_ub`` 5) and ``ActorConfig`` (ε = 0.2, no dual clip).
    Metrics: ``clipfrac`` the share of tokens detached (verl's), the correction diagnostics of that set.
    """
    what = "clip_cov"
    low, high, _ = check_clip(clip_ratio_low, clip_ratio_high, what=what)
    ratio = check_fraction("clip_cov_ratio", clip_cov_ratio, what=what)
    lb, ub = check_number("clip_cov_lb", clip_cov_lb, what=what), check_number("clip_cov_ub", clip_cov_ub, what=what)
    if not lb < ub:
        raise ValueError(f"{what}: need clip_cov_lb < clip_cov_ub, got {lb} and {ub}")
    return correction_term(what, lambda i: clip_cov(
        i.logp, i.old_logp, i.adv, i.mask, clip_ratio_low=low, clip_ratio_high=high, clip_cov_ratio=ratio,
        clip_cov_lb=lb, clip_cov_ub=ub, log_rho=i.rollout_log_ratio, groups=i.row_groups))  # fmt: skip


# --------------------------------------------------------------------------------------------------
# prime-rl's default loss
# --------------------------------------------------------------------------------------------------


def prime_rl(logp, old_logp, adv, mask, *, delta_low: float = 0.2, delta_high: float = 0.2, adv_tau: float = 1.0,
             kl_tau: float = 1e-3, log_rho=None) -> Correction:  # fmt: skip
    """prime-rl's default loss: ℓ = −M·τ_A·Â·w + τ_KL·(log w)² with w = π_θ/π_sampler (gradient through w).

    log w = clamp(logp − old_logp) + log ρ: the ratio against the policy that sampled (π_old/ρ, prime-rl's
    inference log-probs). M is DPPO's binary-TV mask on the probabilities p = π_θ and q = π_sampler of the
    sampled token (``dppo_keep(..., "tv")``: Â > 0 keeps p − q ≤ δ_h, Â ≤ 0 keeps p − q ≥ −δ_l); the
    squared log ratio acts on every valid token, masked or not. c = M·τ_A·w, g = 2τ_KL·log w.
    """
    log_rho_d = None if log_rho is None else log_rho.detach()
    log_r = (logp - old_logp.detach()).clamp(-LOG_W_CLAMP, LOG_W_CLAMP)
    log_w = log_r if log_rho_d is None else log_r + log_rho_d  # (B, T) with grad
    w = torch.exp(log_w)
    sampler_logp = old_logp.detach() if log_rho_d is None else old_logp.detach() - log_rho_d
    keep = dppo_keep(logp, sampler_logp, adv.expand_as(logp), "tv", delta_low, delta_high)  # (B, T)
    valid = _valid(mask)
    k = keep.to(w.dtype)
    values = -(k * adv_tau * adv) * w + kl_tau * log_w.square()
    coef = k * adv_tau * w.detach()
    grad = 2 * kl_tau * log_w.detach()
    metrics = penalty_metrics(kl_tau * log_w.detach().square(), coef, adv, grad, mask)
    metrics["clipfrac"] = _masked_mean(~keep, mask)  # the share the trust region masked (prime-rl's is_masked)
    return Correction(values, coef, torch.zeros_like(valid), ~keep & valid, "token", metrics)


@objective("prime_rl", family="rule", scale_free=False, same_defaults_as=prime_rl,
           summary="−M·τ_A·Â·w + τ_KL·(log w)², M DPPO's binary-TV mask, w = π_θ/π_sampler",
           source="prime-rl 0.8.0 default loss (DefaultLossConfig: dppo_mask 0.2, adv_tau 1, kl_tau 1e-3): "
                  "DPPO-Binary-TV, arXiv 2602.04879, + Kimi K2.5's (log r)², arXiv 2602.02276")
def _prime_rl_objective(delta_low: float = 0.2, delta_high: float = 0.2, adv_tau: float = 1.0,
                        kl_tau: float = 1e-3) -> TermFn:  # fmt: skip
    """prime-rl's default loss (prime-rl 0.8.0, ``trainer/rl/loss.py`` ``default_loss_fn``): DPPO-Binary-TV
    (arXiv 2602.04879) with Kimi K2.5's squared log ratio (arXiv 2602.02276),

        ℓ = −M·τ_A·Â·w + τ_KL·(log w)²,   w = π_θ/π_sampler = r·ρ (gradient through w)

    M drops a token whose probability moved past δ along Â's push, against the sampler's probability π_old/ρ
    (``prime_rl``); the squared log ratio acts on every valid token. Defaults are prime-rl's
    ``DefaultLossConfig`` (``dppo_mask_low/high`` 0.2, ``adv_tau`` 1, ``kl_tau`` 1e-3); default aggregation
    ``token-mean`` (prime-rl divides the summed loss by the batch's loss tokens).
    """
    what = "prime_rl"
    lo = check_positive("delta_low", delta_low, what=what, allow_zero=True)
    hi = check_positive("delta_high", delta_high, what=what, allow_zero=True)
    a_tau = check_positive("adv_tau", adv_tau, what=what, allow_zero=True)
    k_tau = check_positive("kl_tau", kl_tau, what=what, allow_zero=True)
    return correction_term(what, lambda i: prime_rl(
        i.logp, i.old_logp, i.adv, i.mask, delta_low=lo, delta_high=hi, adv_tau=a_tau, kl_tau=k_tau,
        log_rho=i.rollout_log_ratio))  # fmt: skip


# --------------------------------------------------------------------------------------------------
# SkyRL's off-policy masks
# --------------------------------------------------------------------------------------------------


SEQUENCE_METRICS = ("geometric", "product")


def sequence_ratio_keep(log_w: torch.Tensor, mask: torch.Tensor, *, metric: str, lo: float, hi: float) -> torch.Tensor:
    """SkyRL's sequence mask, (B, T) bool: a row is kept when its sequence ratio lies in [lo, hi].

        geometric:  W̄_i = exp(clamp(Σ_t m·log w_it / max(T_i, 1), ±20))   (the geometric mean of the token ratios)
        product:    W_i  = exp(clamp(Σ_t m·log w_it, ±20))

    (SkyRL's ``compute_sequence_mask``: ``geo_mask_low/high``, ``product_mask_low/high``.)
    """
    m = mask.to(log_w.dtype)
    total = (log_w * m).sum(dim=-1, keepdim=True)
    if metric == "geometric":
        total = total / m.sum(dim=-1, keepdim=True).clamp(min=1)
    ratio = torch.exp(total.clamp(-LOG_W_CLAMP, LOG_W_CLAMP))  # (B, 1)
    keep = (ratio >= lo) & (ratio <= hi)
    return keep.expand_as(mask) & _valid(mask)


def outlier_token_keep(log_w: torch.Tensor, mask: torch.Tensor, *, lo: Optional[float], hi: Optional[float]) -> torch.Tensor:
    """SkyRL's outlier-token mask, (B, T) bool: a row is dropped when any valid token's w_it = exp(clamp(log w, ±20))
    is above ``hi`` or below ``lo`` (None: that side off) (SkyRL's ``compute_outlier_token_mask``)."""
    valid = _valid(mask)
    w = torch.exp(log_w.clamp(-LOG_W_CLAMP, LOG_W_CLAMP))
    out = torch.zeros_like(valid)
    if hi is not None:
        out = out | (w > hi)
    if lo is not None:
        out = out | (w < lo)
    bad_row = (out & valid).any(dim=-1, keepdim=True)
    return ~bad_row & valid


# --------------------------------------------------------------------------------------------------
# TRL's two-sided clip
# --------------------------------------------------------------------------------------------------


def two_sided_clip(adv: torch.Tensor, ratio: torch.Tensor, low: float, high: float, delta: float
                   ) -> Tuple[torch.Tensor, torch.Tensor, Dict[str, torch.Tensor]]:  # fmt: skip
    """TRL's two-sided GRPO clip (``GRPOConfig.delta``): ℓ = −min(min(r, δ)·Â, clip(r, 1−ε_l, 1+ε_h)·Â).

    Returns (ℓ (B, T) with grad, the detached coefficient c (B, T) of −Â·∇logp, the cuts): c = r where the chosen
    term still depends on r (min(r, δ) with r < δ, or clip(r) with r inside [1−ε_l, 1+ε_h]), else 0. The cuts are
    ``high`` (Â > 0, r > 1+ε_h), ``low`` (Â < 0, r < 1−ε_l) and ``delta`` (Â < 0, r > δ: the bound δ sets on a
    negative advantage's ratio). With δ ≥ 1 + ε_h this is PPO's dual clip at c = δ.
    """
    c1 = ratio.clamp(max=delta)
    c2 = ratio.clamp(1 - low, 1 + high)
    l1, l2 = c1 * adv, c2 * adv
    loss = -torch.minimum(l1, l2)
    with torch.no_grad():
        r = ratio.detach()
        first = l1.detach() <= l2.detach()  # min picks the first term (ties: both equal r inside the clip)
        live1, live2 = r < delta, (r >= 1 - low) & (r <= 1 + high)
        live = torch.where(first, live1, live2)
        coef = torch.where(live, r, torch.zeros_like(r))
        cuts = {"high": (adv > 0) & (r > 1 + high), "low": (adv < 0) & (r < 1 - low), "delta": (adv < 0) & (r > delta)}
    return loss, coef, cuts


@objective("two_sided", family="rule", summary="−min(min(r, δ)·Â, clip(r)·Â)·ρ",
           source="INTELLECT-2, arXiv 2505.07291 (δ = 4, ε = 0.2); TRL 1.16 GRPOConfig delta")
def _two_sided_objective(clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2, delta: float = 4.0) -> TermFn:
    """Two-sided GRPO clip (TRL ``GRPOConfig.delta``; INTELLECT-2, arXiv 2505.07291):

        ℓ = −min(min(r, δ)·Â, clip(r, 1−ε_l, 1+ε_h)·Â)·ρ

    δ bounds the ratio of a negative-advantage token from above (``two_sided_clip``); with δ ≥ 1 + ε_h it
    is PPO's dual clip at c = δ. Defaults: TRL's ``epsilon`` 0.2 and δ = 4, the INTELLECT-2 setting (section 4.1)
    TRL's paper index gives; default aggregation ``token-mean`` (TRL's default ``loss_type="dapo"``). Metrics
    ``clipfrac_high``, ``clipfrac_low`` and ``clipfrac_dual`` (Â < 0, r > δ).
    """
    low, high, _ = check_clip(clip_ratio_low, clip_ratio_high, what="two_sided")
    delta = check_positive("delta", delta, what="two_sided")

    def term(inputs: LossInputs, log_ratio: torch.Tensor, rho: Optional[torch.Tensor]) -> Term:
        loss, coef, cuts = two_sided_clip(inputs.adv, torch.exp(log_ratio), low, high, delta)
        with torch.no_grad():
            metrics = clip_fractions(inputs.mask, cuts["high"], cuts["low"], cuts["delta"])
        return Term(weigh(loss, rho), weigh(coef, rho), metrics)

    return term
