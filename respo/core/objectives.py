"""Policy objectives: one pipeline, one small term per objective.

Every objective is called the same way,

    loss, metrics = policy_loss(name, logp, old_logp, advantages, mask, *, <its hyperparameters>,
                                loss_agg_mode=None, rollout_log_ratio=None, global_tokens=None,
                                global_seqs=None, loss_scale_factor=None, nan_policy="raise",
                                diagnostics=True)

(or ``<name>_loss(logp, old_logp, advantages, mask, ...)``), and runs one pipeline:

    check_inputs → log r_it = clamp(logp − old_logp) → ρ_it = exp(log ρ_it) → term → agg → diagnostics

``build_objective(name, loss_agg_mode=None, **hparams)`` checks the hyperparameters and settles the
aggregation once and returns an ``Objective``: the callable that runs this pipeline, built once and
called many times (the trainer builds one per run). ``policy_loss(name, ...)`` and ``<name>_loss``
build one and call it.

An objective differs only in its *term*: the per-token loss ℓ_it (per-sequence for gmpo), the
detached coefficient c of its gradient ∇L = −agg[c_it · Â_it · ∇logp_it], its default aggregation
and its extra metrics. ``metrics["coef_mean"]`` and the starvation diagnostics use the
per-sequence mean of c, so every objective is measured on the same scale.

Adding an objective is one factory and one entry of ``_TABLE``. The factory takes the objective's
hyperparameters as keyword arguments with their published defaults (they become its
``hyperparameters(name)`` and the signature of ``<name>_loss``; its docstring becomes the loss
function's), checks them (a bad value raises ``ValueError`` in one line) and returns a term
``term(inputs, log_ratio, rho) -> Term``: ``inputs`` the checked ``LossInputs``, ``log_ratio`` the
(B, T) clamped token log ratio with grad, ``rho`` the (B, T) detached rollout weight or None. The
entry gives the default aggregation (``_Entry(factory, default_agg=SEQ_MEAN)``) and whether the term's
losses are per sequence (``per_sequence=True``, (B,) values).

An objective that needs another per-token tensor, e.g. a proximal policy's log-probs ``prox_logp``
(B, T), names it in its entry, ``_Entry(_factory, inputs=("prox_logp",))``. Callers then pass it by
name, ``objective(logp, old_logp, adv, mask, prox_logp=prox)`` or ``policy_loss(name, ...,
prox_logp=prox)``; an input listed in ``optional_inputs`` may be left out (or None), and the term
then finds it missing from ``inputs.extra``. The pipeline checks it like the other inputs (shape (B, T), floating point, NaN/inf
on a valid token raised or its row masked under ``nan_policy``), detaches it and hands it to the
term as ``inputs.extra["prox_logp"]``. A missing declared tensor, or one the objective does not
declare, is refused.

Sequence-weight objectives (REINFORCE-shaped, no clipping; presets of ``reshaped``):

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

Staleness corrections the frameworks ship (``respo.core.corrections``; log w = logp − old_logp + log ρ,
so ρ folds into the weight; docs/method.md gives sources, base objectives and the verl/TRL mapping):

    tis        −sg(min(w, C))·Â·logp, token or sequence w               (verl bypass REINFORCE + TIS)
    mis        −sg(w·1[lo ≤ w ≤ hi])·Â·logp, token or sequence w
    icepop     mis at token level on [0.5, 5]
    m2po       −M·r·Â, M drops the largest (log r)² until their batch mean is below τ (not micro-batch invariant)
    decoupled  b·PPO(π_θ/π_prox), b = π_prox/π_old masked (or truncated) above C; optional ``prox_logp``
               (default: the current policy, detached, i.e. one optimizer step per batch)
    opsm       K_i·PPO(π_θ/π_old), K_i = 0 for Â_i < 0 with mean_t log(π_old/π_θ) > δ
    dppo_tv    −M·sg(min(r, C))·ρ·Â·logp, M drops tokens whose probability moved past δ along Â's push (verl)
    dppo_kl    the same with the sampled token's binary KL
    klrs       any ``base`` objective on the tokens a k1/k2/k3 KL estimate (per token, row mean, sum or max)
               and a veto keep (verl ``rollout_rs``)
    (tis and mis take ``batch_normalize``; decoupled takes AReaL's ``prox_method="loglinear"``)

Newer sequence objective: ``luspo``, GSPO's clip with each sequence's loss times its length (TRL).

The frameworks' other policy-loss rules (``respo.core.rules``; docs/method.md gives sources and defaults):

    gpg           −Â·logp·ρ (verl ``gpg``)
    dro           −(Â·logp − ½β(log r)²)·ρ (verl ``dro``)
    clip_cov      PPO clip with the gradient of k random tokens of a covariance band detached (verl ``clip_cov``)
    kl_cov        −Â·r·ρ plus κ·|log r|·ρ on the k tokens of largest covariance (verl ``kl_cov``)
    prime_rl      −M·τ_A·Â·w + τ_KL·(log w)², M DPPO's binary-TV mask, w = π_θ/π_sampler (prime-rl's default)
    geo_mask      any ``base`` objective on the rows whose geometric-mean ratio lies in [lo, hi] (SkyRL)
    product_mask  the same with the product of the ratios (SkyRL)
    outlier_mask  the same, dropping rows with a token ratio outside [lo, hi] (SkyRL)
    two_sided     −min(min(r, δ)·Â, clip(r)·Â) (TRL's ``delta``, INTELLECT-2)

References:
    ReSPO: Chen, Ban, Hsieh (2026), arXiv 2609.35433. VESPO: arXiv 2602.10693. GRPO: Shao et al.
    (2024). GSPO: arXiv 2507.18071. CISPO: MiniMax-M1, arXiv 2506.13585. SAPO: arXiv 2511.20347.
    GMPO: arXiv 2507.20673. TOPR: Le Roux et al. (2025), arXiv 2503.14286. verl ``core_algos``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Tuple, Union

import torch

from respo.core.aggregation import AGG_MODES, agg_loss, agg_seq, check_agg_mode
from respo.core import corrections, rules
from respo.core.checks import LossInputs, check_clip, check_inputs, check_number, check_positive, check_row_groups
from respo.core.diagnostics import stat_dtype, weight_diagnostics
from respo.core.kernels import (RESPO_NEG, RESPO_PARAMS, RESPO_POS, VESPO_NEG, VESPO_PARAMS, VESPO_POS, Kernel,
                                kernel_from_spec, kernel_params, respo_kernel, truncated_kernel, two_branch, unit_kernel,
                                vespo_kernel)  # fmt: skip
from respo.core.ratios import LOG_W_CLAMP, ppo_clip, sequence_log_ratio, token_log_ratio

Metrics = Dict[str, torch.Tensor]
LossFn = Callable[..., Tuple[torch.Tensor, Metrics]]

TOKEN_MEAN = "token-mean"
SEQ_MEAN = "seq-mean-token-mean"
SEQ_MEAN_TOKEN_SUM = "seq-mean-token-sum"
GSPO_LOG_S_MAX = 10.0  # verl clamps the token-form log s_it above at 10



@dataclass(frozen=True)
class Term:
    """What one objective contributes to the pipeline.

    values: (B, T) per-token loss ℓ_it with grad, or (B,) per-sequence loss for a per-sequence objective.
    coef: detached gradient coefficient c, (B, T) per token or (B,) per sequence.
    metrics: extra detached metrics (clip fractions).
    log_w: (B,) log W when the term computed it (the diagnostics reuse it).
    """

    values: torch.Tensor
    coef: torch.Tensor
    metrics: Metrics = field(default_factory=dict)
    log_w: Optional[torch.Tensor] = None


# term(inputs, log_ratio (B, T) with grad, rho (B, T) or None) -> Term
TermFn = Callable[[LossInputs, torch.Tensor, Optional[torch.Tensor]], Term]


# --------------------------------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------------------------------


def _seq_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked token mean per row, (B, T) -> (B,); 0 for an empty row."""
    return (x * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)


def _log_w(inputs: LossInputs) -> torch.Tensor:
    """log W of checked inputs, (B,): ``sequence_log_ratio`` without its NaN guards (values off the
    mask are already finite or zeroed by ``check_inputs``)."""
    log_r = inputs.logp.detach() - inputs.old_logp  # (B, T)
    if inputs.rollout_log_ratio is not None:
        log_r = log_r + inputs.rollout_log_ratio
    return (log_r * inputs.mask).sum(dim=-1).clamp(-LOG_W_CLAMP, LOG_W_CLAMP)


def _rollout_weight(inputs: LossInputs) -> Optional[torch.Tensor]:
    """Per-token rollout-correction weight ρ = exp(log ρ), detached, or None."""
    rlr = inputs.rollout_log_ratio
    return None if rlr is None else torch.exp(rlr.clamp(-LOG_W_CLAMP, LOG_W_CLAMP))


def _weigh(x: torch.Tensor, weight: Optional[torch.Tensor]) -> torch.Tensor:
    """x · weight, or x itself without a weight."""
    return x if weight is None else x * weight


def _masked_frac(cond: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Fraction of valid tokens where cond holds (verl's masked_mean of a 0/1 tensor)."""
    m = mask.to(stat_dtype(mask.dtype))
    return (cond.to(m.dtype) * m).sum() / m.sum().clamp(min=1)


def _check_bool(name: str, value, *, what: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{what}: {name} must be true or false, got {value!r}")
    return value


def _clip_fractions(mask: torch.Tensor, high, low, dual=None, either=None) -> Metrics:
    """``clipfrac_high``, ``clipfrac_low``, ``clipfrac_dual`` and verl's ``clipfrac`` of the given cuts."""
    cuts = {"clipfrac_high": high, "clipfrac_low": low, "clipfrac_dual": dual, "clipfrac": either}
    return {key: _masked_frac(cut, mask) for key, cut in cuts.items() if cut is not None}


# --------------------------------------------------------------------------------------------------
# Sequence-weight objectives: one term, two kernels
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SequenceWeightTerm:
    """ℓ_it = −φ_i·Â_it·logp_it with the detached φ_i = two_branch(log W_i); log ρ folds into log W.

    The term of every sequence-weight objective; ``kernels`` is (pos_kernel, neg_kernel).
    """

    pos_kernel: Kernel
    neg_kernel: Kernel

    @property
    def kernels(self) -> Tuple[Kernel, Kernel]:
        return self.pos_kernel, self.neg_kernel

    def __call__(self, inputs: LossInputs, log_ratio: torch.Tensor, rho: Optional[torch.Tensor]) -> Term:
        with torch.no_grad():
            log_w = _log_w(inputs)  # (B,)
            phi = two_branch(log_w, inputs.seq_adv, self.pos_kernel, self.neg_kernel)  # (B,)
        values = -(phi.unsqueeze(-1) * inputs.adv) * inputs.logp  # (B, T)
        return Term(values, phi, log_w=log_w)


def _reshaped(pos_kernel: Union[str, Kernel] = "respo(2,0.5,2)",
              neg_kernel: Union[str, Kernel] = "respo(1,0.5,2)") -> TermFn:
    """Two-branch reshaped sequence objective L = −agg[φ_i·Â_it·logp_it], φ_i = K_{sign Â_i}(log W_i).

    log W_i = Σ_t m(logp − old_logp) + Σ_t m·log ρ, clamped to [−20, 20]; φ is detached, so
    ∇L = −agg[φ_i·Â_it·∇logp_it]. Branch by the sequence advantage: Â_i ≥ 0 uses ``pos_kernel``.
    ``pos_kernel``, ``neg_kernel``: callables log_w -> φ or spec strings (see ``kernel_from_spec``).
    Default aggregation ``token-mean``.
    """
    return SequenceWeightTerm(kernel_from_spec(pos_kernel), kernel_from_spec(neg_kernel))


def _respo(pos: Tuple[float, float, float] = RESPO_POS, neg: Tuple[float, float, float] = RESPO_NEG) -> TermFn:
    """ReSPO: L = −agg[φ_i Â_it logp_it] with φ⁺ = ReSPO(pos), φ⁻ = ReSPO(neg), (α, β, λ) per branch.

    Each branch is exactly three numbers (α, β, λ), by position or by name ({"alpha", "beta", "lambda"}).

    Defaults are the published (2, 0.5, 2) for Â ≥ 0 and (1, 0.5, 2) for Â < 0, i.e.
    φ⁺(W) = ((1+W)/2)·e^(1−W) and φ⁻(W) = √W·e^(2(1−√W)). Default aggregation ``token-mean``.
    """
    pos, neg = (kernel_params(v, RESPO_PARAMS, param=n, what="respo") for n, v in (("pos", pos), ("neg", neg)))
    return SequenceWeightTerm(respo_kernel(*pos), respo_kernel(*neg))


def _vespo(pos: Tuple[float, float] = VESPO_POS, neg: Tuple[float, float] = VESPO_NEG) -> TermFn:
    """VESPO: L = −agg[φ_i Â_it logp_it], φ = W^k·e^(λ(1−W)), (k, λ) = (2, 3) for Â ≥ 0, (3, 2) for Â < 0.

    Each branch is exactly two numbers (k, λ), by position or by name ({"k", "lambda"}).
    """
    pos, neg = (kernel_params(v, VESPO_PARAMS, param=n, what="vespo") for n, v in (("pos", pos), ("neg", neg)))
    return SequenceWeightTerm(vespo_kernel(*pos), vespo_kernel(*neg))


def _topr() -> TermFn:
    """TOPR: L = −agg[sg(α_i) Â_it logp_it], α_i = min(W_i, 1) for Â_i < 0 and 1 otherwise."""
    return SequenceWeightTerm(unit_kernel(), truncated_kernel(1.0))


def _reinforce() -> TermFn:
    """REINFORCE: L = −agg[Â_it logp_it] (φ ≡ 1; ignores staleness, the on-policy floor)."""
    return SequenceWeightTerm(unit_kernel(), unit_kernel())


# --------------------------------------------------------------------------------------------------
# Ratio (clip / gate) objectives: a factory checks the hyperparameters and returns the term
# --------------------------------------------------------------------------------------------------


def _grpo(clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2, clip_ratio_c: float = 3.0) -> TermFn:
    """GRPO/PPO token clip with dual clip (verl's ``vanilla``).

        r = exp(clamp(logp − old_logp, −20, 20))
        ℓ = max(−r·Â, −clip(r, 1−ε_l, 1+ε_h)·Â);   for Â < 0: ℓ = min(ℓ, −c·Â)

    Gradient coefficient c_it = r_it where the token is not clipped, else 0.
    Metrics ``clipfrac_high`` (Â > 0, r > 1+ε_h), ``clipfrac_low`` (Â < 0, r < 1−ε_l), ``clipfrac_dual``
    (Â < 0, r > c) and verl's ``clipfrac``. Default aggregation ``token-mean``.
    """
    low, high, c = check_clip(clip_ratio_low, clip_ratio_high, clip_ratio_c, what="grpo")

    def term(inputs: LossInputs, log_ratio: torch.Tensor, rho: Optional[torch.Tensor]) -> Term:
        ratio = torch.exp(log_ratio)  # (B, T)
        clip = ppo_clip(inputs.adv, ratio, low, high, c)
        values = _weigh(clip.loss, rho)  # (B, T)
        with torch.no_grad():
            coef = _weigh(torch.where(clip.active, ratio.detach(), torch.zeros_like(ratio)), rho)
            metrics = _clip_fractions(inputs.mask, clip.high, clip.low, clip.dual if c is not None else None,
                                      clip.clipped)  # fmt: skip
        return Term(values, coef, metrics)

    return term


def _gspo(clip_ratio_low: float = 3e-4, clip_ratio_high: float = 4e-4) -> TermFn:
    """GSPO: the PPO clip on the sequence ratio s_i = exp(mean_t log r_it), default seq-mean-token-mean.

    Token form (verl): log s_it = logp_it − sg(logp_it) + sg(log s_i), clamped above at 10, so every
    token of a sequence carries the sequence ratio and its own gradient:
        ℓ_it = max(−s_it·Â, −clip(s_it, 1−ε_l, 1+ε_h)·Â).
    Coefficient c_it = s_i where not clipped (Â > 0: s ≤ 1+ε_h; Â < 0: s ≥ 1−ε_l), else 0.
    """
    low, high, _ = check_clip(clip_ratio_low, clip_ratio_high, what="gspo")
    return _sequence_ratio_clip(low, high, GSPO_LOG_S_MAX)


def _sequence_ratio_clip(low: float, high: float, log_s_max: Optional[float]) -> TermFn:
    """The token form of the PPO clip on the length-normalised sequence ratio (GSPO's and LUSPO's term):
    log s_it = logp_it − sg(logp_it) + sg(log s_i), clamped above at ``log_s_max`` when set."""

    def term(inputs: LossInputs, log_ratio: torch.Tensor, rho: Optional[torch.Tensor]) -> Term:
        adv, logp = inputs.adv, inputs.logp
        with torch.no_grad():
            log_s = sequence_log_ratio(logp.detach(), inputs.old_logp, inputs.mask, length_normalize=True)  # (B,)
        log_s_it = logp - logp.detach() + log_s.unsqueeze(-1)  # (B, T)
        s = torch.exp(log_s_it if log_s_max is None else log_s_it.clamp(max=log_s_max))  # (B, T)
        clip = ppo_clip(adv, s, low, high)
        values = _weigh(clip.loss, rho)
        with torch.no_grad():
            coef = _weigh(torch.where(clip.active, s.detach(), torch.zeros_like(s)), rho)
            metrics = _clip_fractions(inputs.mask, clip.high, clip.low, either=clip.clipped)
        return Term(values, coef, metrics)

    return term


def _luspo(clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2) -> TermFn:
    """LUSPO (length-unbiased sequence policy optimization, TRL ``loss_type="luspo"``): GSPO's clip of the
    sequence ratio s_i = exp(mean_t log r_it) with each sequence's loss scaled by its length,

        L = (1/N_seq)·Σ_i T_i·max(−s_i·Â_i, −clip(s_i, 1−ε_l, 1+ε_h)·Â_i)

    i.e. the token form ℓ_it = max(−s_it·Â, −clip(s_it)·Â) aggregated ``seq-mean-token-sum`` (the default),
    so ∇L = −(1/N_seq)·Σ_i s_i·Â_i·Σ_t ∇logp_it for an unclipped row: no 1/T_i. Defaults ε_l = ε_h = 0.2
    are TRL's ``epsilon``; s is not clamped above (TRL does not clamp it; log s is within ±20).
    """
    low, high, _ = check_clip(clip_ratio_low, clip_ratio_high, what="luspo")
    return _sequence_ratio_clip(low, high, None)


def _cispo(clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2) -> TermFn:
    """CISPO: ℓ = −sg(clip(r, 1−ε_l, 1+ε_h))·Â·logp (clipped IS weight, gradient kept on every token).

    Defaults ε_l = ε_h = 0.2 are verl's ``ActorConfig`` defaults; the MiniMax-M1 paper effectively
    disables the lower bound and tunes ε_h. Default aggregation ``token-mean``.
    """
    low, high, _ = check_clip(clip_ratio_low, clip_ratio_high, what="cispo")

    def term(inputs: LossInputs, log_ratio: torch.Tensor, rho: Optional[torch.Tensor]) -> Term:
        with torch.no_grad():
            r = torch.exp(log_ratio.detach())  # (B, T)
            coef = _weigh(r.clamp(1 - low, 1 + high), rho)
        values = -(coef * inputs.adv) * inputs.logp  # (B, T)
        return Term(values, coef, _clip_fractions(inputs.mask, r > 1 + high, r < 1 - low))

    return term


def _sapo(tau_pos: float = 1.0, tau_neg: float = 1.05) -> TermFn:
    """SAPO: ℓ = −f(r)·Â with the soft gate f(r) = σ(τ(r − 1))·4/τ, τ = τ⁺ (Â > 0) or τ⁻ (Â ≤ 0).

    f'(r)·r = 4σ(1−σ)·r is the gradient coefficient (1 at r = 1). Default seq-mean-token-mean.
    """
    tau_pos = check_positive("tau_pos", tau_pos, what="sapo")  # finite: an infinite τ makes 4/τ·σ(·) 0·NaN
    tau_neg = check_positive("tau_neg", tau_neg, what="sapo")

    def term(inputs: LossInputs, log_ratio: torch.Tensor, rho: Optional[torch.Tensor]) -> Term:
        adv = inputs.adv
        ratio = torch.exp(log_ratio)  # (B, T)
        tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
        gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
        values = _weigh(-gate * adv, rho)  # (B, T)
        with torch.no_grad():
            sig = torch.sigmoid(tau * (ratio.detach() - 1.0))
            coef = _weigh(4.0 * sig * (1.0 - sig) * ratio.detach(), rho)
        return Term(values, coef)

    return term


def _gmpo(clip_ratio_low: float = 0.4, clip_ratio_high: float = 0.4) -> TermFn:
    """GMPO (verl's ``geo_mean``): geometric-mean ratio with a sign-aware clip in log space.

        d_it = logp − old_logp;  d̃_it = sgn(Â)·min(sgn(Â)·d, sgn(Â)·clip(d, −ε_l, ε_h))
        ℓ_i  = −Ā_i·exp(mean_t d̃_it),   L = mean over non-empty sequences

    GMPO is sequence-level by construction: only ``seq-mean-token-mean`` is accepted. Rollout weights
    enter as their per-sequence geometric mean, as in verl.
    """
    low, high, _ = check_clip(clip_ratio_low, clip_ratio_high, what="gmpo", log_space=True)

    def term(inputs: LossInputs, log_ratio: torch.Tensor, rho: Optional[torch.Tensor]) -> Term:
        adv, m = inputs.adv, inputs.mask
        d = inputs.logp - inputs.old_logp  # (B, T), not clamped
        sgn = torch.sign(adv)
        d_min = sgn * torch.minimum(sgn * d, sgn * d.clamp(-low, high))
        n_tok = m.sum(dim=-1).clamp(min=1)  # (B,)
        ratio = torch.exp((d_min * m).sum(dim=-1) / n_tok)  # (B,)
        seq_adv = (adv * m).sum(dim=-1) / n_tok  # (B,)
        rlr = inputs.rollout_log_ratio
        rho_seq = None if rlr is None else torch.exp((rlr * m).sum(dim=-1) / n_tok)  # (B,)
        per_seq = _weigh(-seq_adv * ratio, rho_seq)  # (B,)
        with torch.no_grad():
            cut_high, cut_low = (adv > 0) & (d.detach() > high), (adv < 0) & (d.detach() < -low)
            active = (~(cut_high | cut_low)).to(m.dtype)
            coef = _weigh(ratio.detach().unsqueeze(-1) * active, None if rho_seq is None else rho_seq.unsqueeze(-1))
        return Term(per_seq, coef, _clip_fractions(m, cut_high, cut_low))

    return term


# --------------------------------------------------------------------------------------------------
# Staleness corrections (respo.core.corrections): a factory checks the hyperparameters
# --------------------------------------------------------------------------------------------------


#: Arguments of a correction function that are tensors or call options, not hyperparameters.
_CALL_ARGS = ("log_rho", "groups", "prox_logp", "staleness")


def _hyperparameters_of(fn: Callable) -> Callable[[Callable[..., TermFn]], Callable[..., TermFn]]:
    """Give a correction's factory the hyperparameters of its function in ``corrections`` (the keyword-only
    arguments but ``_CALL_ARGS``), with that function's defaults: the published defaults are written once,
    where the formula is. Unset ones are filled in before the factory runs."""
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind is p.KEYWORD_ONLY and p.name not in _CALL_ARGS]  # fmt: skip
    sig = inspect.Signature(params)

    def decorate(factory: Callable[..., TermFn]) -> Callable[..., TermFn]:
        @functools.wraps(factory)
        def with_defaults(**hparams) -> TermFn:
            bound = sig.bind(**hparams)
            bound.apply_defaults()
            return factory(**bound.arguments)

        with_defaults.__signature__ = sig  # type: ignore[attr-defined]
        return with_defaults

    return decorate


def _correction_term(name: str, apply: Callable[[LossInputs], "corrections.Correction"]) -> TermFn:
    """The term of a correction: its loss and coefficient, and its diagnostics in the metrics."""

    def term(inputs: LossInputs, log_ratio: torch.Tensor, rho: Optional[torch.Tensor]) -> Term:
        corr = apply(inputs)
        with torch.no_grad():
            log_w = corrections.token_log_weight(inputs.logp, inputs.old_logp, inputs.mask, inputs.rollout_log_ratio)
            metrics = corrections.correction_diagnostics(corr, log_w, inputs.adv, inputs.seq_adv, inputs.mask)
        return Term(corr.values, corr.coef, metrics)

    term.__name__ = f"{name}_term"
    return term


@_hyperparameters_of(corrections.tis)
def _tis(*, level: str, cap: float, batch_normalize: bool) -> TermFn:
    """TIS: ℓ = −sg(min(w, C))·Â·logp with w = π_θ/π_old·ρ per token or per sequence (W_i on every token).

    REINFORCE-shaped, as verl's bypass mode with ``loss_type="reinforce"``; defaults are verl's
    ``rollout_is="sequence"``, ``rollout_is_threshold=2.0`` (its ``bypass_pg_is`` preset).
    Metrics ``corr/trunc_frac`` (/pos, /neg): the share of sequences (tokens) whose weight the cap cut.
    ``batch_normalize``: divide the truncated weights by their batch mean (verl's
    ``rollout_is_batch_normalize``; within each of ``row_groups``, so not micro-batch invariant).
    """
    level = corrections.check_level(level, what="tis")
    cap = corrections.check_cap(cap, what="tis")
    norm = _check_bool("batch_normalize", batch_normalize, what="tis")
    return _correction_term("tis", lambda i: corrections.tis(i.logp, i.old_logp, i.adv, i.mask, level=level, cap=cap,
                                                             batch_normalize=norm, log_rho=i.rollout_log_ratio,
                                                             groups=i.row_groups))  # fmt: skip


@_hyperparameters_of(corrections.mis)
def _mis(*, level: str, lo: float, hi: float, batch_normalize: bool) -> TermFn:
    """MIS: ℓ = −sg(w·1[lo ≤ w ≤ hi])·Â·logp, w per token or per sequence; weights outside are silenced.

    Defaults are TRL's ``vllm_importance_sampling_mode="sequence_mask"`` with ``clip_max=3.0`` (no lower
    bound); verl's Seq-MIS preset uses [0.5, 2]. Metrics ``corr/mask_frac``, ``corr/silenced_adv_share/pos``, ...
    ``batch_normalize``: divide the weights by their batch mean, as ``tis``.
    """
    level = corrections.check_level(level, what="mis")
    lo, hi = corrections.check_band(lo, hi, what="mis")
    norm = _check_bool("batch_normalize", batch_normalize, what="mis")
    return _correction_term("mis", lambda i: corrections.mis(i.logp, i.old_logp, i.adv, i.mask, level=level, lo=lo, hi=hi,
                                                             batch_normalize=norm, log_rho=i.rollout_log_ratio,
                                                             groups=i.row_groups))  # fmt: skip


@_hyperparameters_of(corrections.icepop)
def _icepop(*, lo: float, hi: float) -> TermFn:
    """IcePop: token-level MIS, ℓ = −sg(w_it·1[α ≤ w_it ≤ β])·Â·logp with [α, β] = [0.5, 5] (verl's
    ``bypass_pg_token_icepop``)."""
    lo, hi = corrections.check_band(lo, hi, what="icepop")
    return _correction_term("icepop", lambda i: corrections.icepop(i.logp, i.old_logp, i.adv, i.mask, lo=lo, hi=hi,
                                                                   log_rho=i.rollout_log_ratio))  # fmt: skip


@_hyperparameters_of(corrections.m2po)
def _m2po(*, tau: float) -> TermFn:
    """M2PO: ℓ = −M_it·r_it·Â_it (gradient through r = π_θ/π_old·ρ), M drops the tokens with the largest
    (log r)² until the mean (log r)² of the kept tokens of the batch is below τ (AReaL ``m2_threshold``).

    The selection spans the batch of the call, so M2PO is not invariant to micro-batching.
    """
    tau = corrections.check_positive("tau", tau, what="m2po")
    return _correction_term("m2po", lambda i: corrections.m2po(i.logp, i.old_logp, i.adv, i.mask, tau=tau,
                                                               log_rho=i.rollout_log_ratio, groups=i.row_groups))  # fmt: skip


@_hyperparameters_of(corrections.decoupled)
def _decoupled(*, clip_ratio_low: float, clip_ratio_high: float, clip_ratio_c: Optional[float], cap: float,
               cap_mode: str, prox_method: str) -> TermFn:  # fmt: skip
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
    low, high, c = corrections.check_clip(clip_ratio_low, clip_ratio_high, clip_ratio_c, what="decoupled")
    cap = corrections.check_cap(cap, what="decoupled")
    mode = corrections.check_cap_mode(cap_mode, what="decoupled")
    method = corrections.check_choice("prox_method", prox_method, corrections.PROX_METHODS, what="decoupled")
    return _correction_term("decoupled", lambda i: corrections.decoupled(
        i.logp, i.old_logp, i.adv, i.mask, prox_logp=i.extra.get("prox_logp"), clip_ratio_low=low,
        clip_ratio_high=high, clip_ratio_c=c, cap=cap, cap_mode=mode, prox_method=method, log_rho=i.rollout_log_ratio,
        staleness=i.extra.get("staleness")))  # fmt: skip


@_hyperparameters_of(corrections.opsm)
def _opsm(*, delta: float, clip_ratio_low: float, clip_ratio_high: float, clip_ratio_c: Optional[float]) -> TermFn:
    """OPSM (DeepSeek-V3.2): ℓ = K_i·ρ·PPO(π_θ/π_old), K_i = 0 for Â_i < 0 whose mean per-token
    KL_i = mean_t(log π_old − log π_θ − log ρ) exceeds δ (TRL ``off_policy_mask_threshold``).

    Default δ = 0.5 is TRL's documented example; the clip is TRL's default loss (ε = 0.2, no dual clip).
    """
    delta = corrections.check_positive("delta", delta, what="opsm", allow_zero=True)
    low, high, c = corrections.check_clip(clip_ratio_low, clip_ratio_high, clip_ratio_c, what="opsm")
    return _correction_term("opsm", lambda i: corrections.opsm(
        i.logp, i.old_logp, i.adv, i.seq_adv, i.mask, delta=delta, clip_ratio_low=low, clip_ratio_high=high,
        clip_ratio_c=c, log_rho=i.rollout_log_ratio))  # fmt: skip


@_hyperparameters_of(corrections.dppo_tv)
def _dppo_tv(*, delta_low: float, delta_high: float, cap: float) -> TermFn:
    """DPPO-Binary-TV (arXiv 2602.04879; verl ``dppo_tv``): ℓ = −M_it·sg(min(r, C))·ρ·Â·logp with
    M_it = 0 where the sampled token's probability moved past δ in the direction the advantage pushes:
    Â > 0 and π_θ − π_old > δ_h, or Â ≤ 0 and π_θ − π_old < −δ_l (probabilities, not the ratio).

    Defaults δ_l = δ_h = 0.15 and C = 10⁴ (a truncation kept out of the way, the paper's advice) are
    verl's DPPO recipe (``examples/dppo_trainer``: ``clip_ratio_low/high`` 0.15, ``clip_ratio_c`` 10000).
    """
    return _dppo("dppo_tv", corrections.dppo_tv, delta_low, delta_high, cap)


@_hyperparameters_of(corrections.dppo_kl)
def _dppo_kl(*, delta_low: float, delta_high: float, cap: float) -> TermFn:
    """DPPO-Binary-KL (verl ``dppo_kl``): ``dppo_tv`` with the binary KL of the sampled token,
    D = q·log(q/p) + (1 − q)·log((1 − q)/(1 − p)), p = π_θ, q = π_old: M_it = 0 where D > δ and the
    probability moved in the advantage's direction. Defaults δ = 0.05 and C = 10⁴ (verl's DPPO recipe).
    """
    return _dppo("dppo_kl", corrections.dppo_kl, delta_low, delta_high, cap)


def _dppo(name: str, fn: Callable, delta_low, delta_high, cap) -> TermFn:
    lo = corrections.check_positive("delta_low", delta_low, what=name, allow_zero=True)
    hi = corrections.check_positive("delta_high", delta_high, what=name, allow_zero=True)
    cap = corrections.check_cap(cap, what=name)
    return _correction_term(name, lambda i: fn(i.logp, i.old_logp, i.adv, i.mask, delta_low=lo, delta_high=hi, cap=cap,
                                               log_rho=i.rollout_log_ratio))  # fmt: skip


#: The extra per-token inputs any objective reads (a composed objective passes its base's on).
_EXTRA_INPUTS = ("prox_logp", "staleness")


def _klrs(estimator: str = "k3", agg: str = "mean", threshold: float = 0.01, lower: Optional[float] = None,
          veto: Optional[float] = None, base: str = "reinforce", base_kwargs: Optional[Mapping[str, object]] = None,
          ) -> TermFn:  # fmt: skip
    """KL-estimator rejection (verl's ``rollout_rs`` modes) composed with any objective ``base``.

        s_it = k1: −log w | k2: (log w)²/2 | k3: w − 1 − log w,   log w = logp − old_logp (+ log ρ)
        S = s_it (agg="token") or the row's mean, sum or max of s;  reject where S > threshold (k1: outside
        [log lower, log threshold], the bounds being ratios, lower = 1/threshold by default), and every
        token of a row with a token whose w < ``veto`` (the token-level veto of outliers; None: off)

    The rejected tokens leave ``base``'s objective (its log W, its clip, its mask) and carry no loss or
    gradient; the aggregation still counts them (a rejection is a weight of 0, as in ``mis``). Defaults:
    verl's K3 preset (``seq_mean_k3``, threshold 0.01) on REINFORCE, verl's bypass mode with
    ``loss_type="reinforce"``. ``base``/``base_kwargs``: any objective and its hyperparameters; its default
    aggregation and extra inputs become this objective's. Metrics ``rs/masked_tokens``, ``rs/masked_seqs``,
    ``rs/mask_frac/pos|neg``, ``rs/silenced_adv_share/pos|neg``, ``rs/kept_low_w_mass_share/pos|neg``.
    """
    what = "klrs"
    est = corrections.check_choice("estimator", estimator, corrections.KL_ESTIMATORS, what=what)
    agg = corrections.check_choice("agg", agg, corrections.KL_AGGS, what=what)
    if est == "k1" and agg == "max":
        raise ValueError("klrs: agg='max' is for k2 and k3 (a k1 maximum is not a divergence bound, as in verl)")
    threshold = corrections.check_cap(threshold, what=what, name="threshold")
    lower = None if lower is None else corrections.check_cap(lower, what=what, name="lower")
    if lower is not None and (est != "k1" or not lower <= threshold):
        raise ValueError(f"klrs: lower is a ratio bound of k1, <= threshold; got lower={lower} with estimator={est!r}, "
                         f"threshold={threshold}")  # fmt: skip
    veto = None if veto is None else corrections.check_cap(veto, what=what, name="veto")
    inner = _base_objective(what, base, base_kwargs)
    keep_fn = functools.partial(corrections.kl_reject_keep, estimator=est, agg=agg, threshold=threshold, lower=lower,
                                veto=veto)  # fmt: skip
    return RejectionTerm(inner, keep_fn)


def _base_objective(what: str, base, base_kwargs) -> "Objective":
    """The base objective a rejection is composed with: another objective's name and its hyperparameters."""
    if base == what or not isinstance(base, str):
        raise ValueError(f"{what}: base must be the name of another objective, got {base!r}")
    if base_kwargs is not None and not isinstance(base_kwargs, Mapping):
        raise ValueError(f"{what}: base_kwargs must be a mapping of {base!r}'s hyperparameters, got {base_kwargs!r}")
    return _build(base, _entry(base), None, dict(base_kwargs or {}))


@dataclass(frozen=True)
class RejectionTerm:
    """A rejection composed with a base objective's term: the kept tokens go to ``base``, the rest are
    silenced (see ``_klrs``). Carries the base's default aggregation and extra inputs."""

    base: "Objective"
    keep: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (log_w (B, T), mask (B, T)) -> keep (B, T) bool

    @property
    def default_agg(self) -> str:
        return self.base.default_agg

    @property
    def per_sequence(self) -> bool:
        return self.base.per_sequence

    @property
    def inputs(self) -> Tuple[str, ...]:
        return self.base.inputs

    @property
    def optional_inputs(self) -> Tuple[str, ...]:
        return self.base.optional_inputs

    def __call__(self, inputs: LossInputs, log_ratio: torch.Tensor, rho: Optional[torch.Tensor]) -> Term:
        with torch.no_grad():
            log_w = corrections.token_log_weight(inputs.logp, inputs.old_logp, inputs.mask, inputs.rollout_log_ratio)
            keep = self.keep(log_w, inputs.mask)  # (B, T) bool, within the mask
            k = keep.to(inputs.mask.dtype)
        kept = dataclasses.replace(inputs, mask=inputs.mask * k)
        t = self.base.term(kept, log_ratio, rho)
        if self.per_sequence:  # (B,) values: a row keeps its loss while it keeps a token
            row = keep.any(dim=-1).to(t.values.dtype)
            values, coef = t.values * row, t.coef * (row if t.coef.dim() == 1 else row.unsqueeze(-1))
        else:  # a per-row coefficient (a sequence-weight base's φ_i) is spread over the row's kept tokens
            values = torch.where(keep, t.values, torch.zeros_like(t.values))
            coef = (t.coef.unsqueeze(-1) if t.coef.dim() == 1 else t.coef) * k
        with torch.no_grad():
            valid = inputs.mask > 0
            corr = corrections.Correction(values, coef, torch.zeros_like(keep), valid & ~keep, "token", {})
            coef_tok = coef if coef.dim() == 2 else coef.unsqueeze(-1).expand_as(log_w)
            corr = dataclasses.replace(corr, coef=coef_tok)
            diag = corrections.correction_diagnostics(corr, log_w, inputs.adv, inputs.seq_adv, inputs.mask, prefix="rs/")
        return Term(values, coef, {**t.metrics, **diag})  # log W of the whole batch in the diagnostics


# --------------------------------------------------------------------------------------------------
# The frameworks' other policy-loss rules (respo.core.rules)
# --------------------------------------------------------------------------------------------------


def _gpg() -> TermFn:
    """GPG (verl ``gpg``; Chu et al. 2025, arXiv 2504.02546): ℓ = −Â·logp·ρ, REINFORCE with the rollout weight
    multiplying the per-token loss as verl does (``reinforce`` ignores ρ). GPG's own advantage (verl's
    ``adv_estimator=gpg``) is the caller's; the loss has no hyperparameters. Coefficient c = ρ (1 without ρ).
    """

    def term(inputs: LossInputs, log_ratio: torch.Tensor, rho: Optional[torch.Tensor]) -> Term:
        values = _weigh(-inputs.adv * inputs.logp, rho)  # (B, T)
        coef = torch.ones_like(log_ratio.detach()) if rho is None else rho
        return Term(values, coef)

    return term


def _dro(beta: float = 1.0) -> TermFn:
    """DRO (verl ``dro``): ℓ = −(Â·logp − ½β·(log r)²)·ρ, REINFORCE with a quadratic log-ratio penalty.

    ∇ℓ = −(Â − β·log r)·ρ·∇logp: c = ρ, the penalty's g = β·log r·ρ (metrics ``penalty/mean``,
    ``penalty/grad_share``).
    verl 0.9.1 ships no default (``policy_loss.dro_beta: null``, required > 0); β = 1 is respo's, the unit
    penalty, to be set by the run. Default aggregation ``token-mean``.
    """
    beta = check_positive("beta", beta, what="dro")

    def term(inputs: LossInputs, log_ratio: torch.Tensor, rho: Optional[torch.Tensor]) -> Term:
        values = _weigh(-(inputs.adv * inputs.logp - 0.5 * beta * log_ratio.square()), rho)  # (B, T)
        with torch.no_grad():
            lr = log_ratio.detach()
            coef = torch.ones_like(lr) if rho is None else rho
            metrics = rules.penalty_metrics(coef * 0.5 * beta * lr.square(), coef, inputs.adv, coef * beta * lr,
                                            inputs.mask)  # fmt: skip
        return Term(values, coef, metrics)

    return term


def _check_fraction(name: str, value, *, what: str) -> float:
    x = check_positive(name, value, what=what)
    if x > 1:
        raise ValueError(f"{what}: {name} is a fraction of the tokens, in (0, 1], got {x}")
    return x


def _kl_cov(kl_cov_ratio: float = 2e-4, ppo_kl_coef: float = 0.1) -> TermFn:
    """KL-Cov (verl ``kl_cov``; Cui et al. 2025, arXiv 2505.22617): ℓ = (−Â·r + κ·|log r|·S)·ρ, no clip.

    S marks the k = max(⌊ratio·N⌋, 1) valid tokens of largest covariance (Â_it − Ā)(logp_it − l̄) over the batch
    (``rules.kl_cov_select``; within each of ``row_groups``, so not micro-batch invariant). c = r·ρ; the
    penalty's g = κ·sgn(log r)·S·ρ. Defaults are verl's ``PolicyLossConfig`` (``kl_cov_ratio`` 2e-4,
    ``ppo_kl_coef`` 0.1). Metrics ``penalty/token_frac`` (the share of tokens penalised), ``penalty/mean``,
    ``penalty/grad_share``.
    """
    ratio = _check_fraction("kl_cov_ratio", kl_cov_ratio, what="kl_cov")
    kappa = check_positive("ppo_kl_coef", ppo_kl_coef, what="kl_cov", allow_zero=True)

    def term(inputs: LossInputs, log_ratio: torch.Tensor, rho: Optional[torch.Tensor]) -> Term:
        adv = inputs.adv
        with torch.no_grad():
            sel = rules.kl_cov_select(inputs.logp, adv, inputs.mask, ratio=ratio, groups=inputs.row_groups)
            s = sel.to(log_ratio.dtype)
        values = _weigh(-adv * torch.exp(log_ratio) + kappa * log_ratio.abs() * s, rho)  # (B, T)
        with torch.no_grad():
            lr = log_ratio.detach()
            coef = _weigh(torch.exp(lr), rho)
            grad = _weigh(kappa * torch.sign(lr) * s, rho)
            metrics = rules.penalty_metrics(_weigh(kappa * lr.abs() * s, rho), coef, adv, grad, inputs.mask)
            metrics["penalty/token_frac"] = _masked_frac(sel, inputs.mask)
        return Term(values, coef, metrics)

    return term


@_hyperparameters_of(rules.clip_cov)
def _clip_cov(*, clip_ratio_low: float, clip_ratio_high: float, clip_cov_ratio: float, clip_cov_lb: float,
              clip_cov_ub: float) -> TermFn:  # fmt: skip
    """Clip-Cov (verl ``clip_cov``; Cui et al. 2025, arXiv 2505.22617): ℓ = max(−r·Â, −clip(r)·Â)·K·ρ.

    K = 0 on k = max(⌊ratio·N⌋, 1) tokens drawn at random (torch's global generator, as verl: seed it) among the
    valid tokens the clip leaves active whose covariance (Â_it − Ā)(logp_it − l̄) lies strictly inside
    (lb, ub) (``rules.clip_cov_keep``; within each of ``row_groups``). Defaults are verl's ``PolicyLossConfig``
    (``clip_cov_ratio`` 2e-4, ``clip_cov_lb`` 1, ``clip_cov_ub`` 5) and ``ActorConfig`` (ε = 0.2, no dual clip).
    Metrics: ``clipfrac`` the share of tokens detached (verl's), the correction diagnostics of that set.
    """
    what = "clip_cov"
    low, high, _ = check_clip(clip_ratio_low, clip_ratio_high, what=what)
    ratio = _check_fraction("clip_cov_ratio", clip_cov_ratio, what=what)
    lb, ub = check_number("clip_cov_lb", clip_cov_lb, what=what), check_number("clip_cov_ub", clip_cov_ub, what=what)
    if not lb < ub:
        raise ValueError(f"{what}: need clip_cov_lb < clip_cov_ub, got {lb} and {ub}")
    return _correction_term(what, lambda i: rules.clip_cov(
        i.logp, i.old_logp, i.adv, i.mask, clip_ratio_low=low, clip_ratio_high=high, clip_cov_ratio=ratio,
        clip_cov_lb=lb, clip_cov_ub=ub, log_rho=i.rollout_log_ratio, groups=i.row_groups))  # fmt: skip


@_hyperparameters_of(rules.prime_rl)
def _prime_rl(*, delta_low: float, delta_high: float, adv_tau: float, kl_tau: float) -> TermFn:
    """prime-rl's default loss (prime-rl 0.8.0, ``trainer/rl/loss.py`` ``default_loss_fn``): DPPO-Binary-TV
    (arXiv 2602.04879) with Kimi K2.5's squared log ratio (arXiv 2602.02276),

        ℓ = −M·τ_A·Â·w + τ_KL·(log w)²,   w = π_θ/π_sampler = r·ρ (gradient through w)

    M drops a token whose probability moved past δ along Â's push, against the sampler's probability π_old/ρ
    (``rules.prime_rl``); the squared log ratio acts on every valid token. Defaults are prime-rl's
    ``DefaultLossConfig`` (``dppo_mask_low/high`` 0.2, ``adv_tau`` 1, ``kl_tau`` 1e-3); default aggregation
    ``token-mean`` (prime-rl divides the summed loss by the batch's loss tokens).
    """
    what = "prime_rl"
    lo = corrections.check_positive("delta_low", delta_low, what=what, allow_zero=True)
    hi = corrections.check_positive("delta_high", delta_high, what=what, allow_zero=True)
    a_tau = corrections.check_positive("adv_tau", adv_tau, what=what, allow_zero=True)
    k_tau = corrections.check_positive("kl_tau", kl_tau, what=what, allow_zero=True)
    return _correction_term(what, lambda i: rules.prime_rl(
        i.logp, i.old_logp, i.adv, i.mask, delta_low=lo, delta_high=hi, adv_tau=a_tau, kl_tau=k_tau,
        log_rho=i.rollout_log_ratio))  # fmt: skip


def _geo_mask(lo: float = 0.99, hi: float = 1.01, base: str = "grpo",
              base_kwargs: Optional[Mapping[str, object]] = None) -> TermFn:  # fmt: skip
    """SkyRL's geometric-mean sequence mask (``off_policy_correction.sequence_mask_metric="geometric"``) on any
    objective ``base``: a row whose W̄_i = exp(mean_t log w_it) lies outside [lo, hi] leaves the base objective
    (log w = logp − old_logp + log ρ, the ratio against the sampler; ``rules.sequence_ratio_keep``).

    Defaults are SkyRL 0.3.0's ``geo_mask_low/high`` (0.99, 1.01). ``base``/``base_kwargs`` as ``klrs``; the default
    ``grpo`` (ε = 0.2, dual clip c = 3) is SkyRL's ``policy_loss_type="dual_clip"`` at its defaults, and
    ``base_kwargs={"clip_ratio_c": None}`` its default ``"regular"``. The rejected rows count at weight 0 in the
    aggregation (SkyRL scales the advantages by the token count before masking). Metrics under ``rs/``, as ``klrs``.
    """
    return _sequence_mask("geo_mask", "geometric", lo, hi, base, base_kwargs)


def _product_mask(lo: float = 0.5, hi: float = 2.0, base: str = "grpo",
                  base_kwargs: Optional[Mapping[str, object]] = None) -> TermFn:  # fmt: skip
    """SkyRL's product sequence mask (``sequence_mask_metric="product"``): as ``geo_mask`` with the sequence ratio
    W_i = exp(clamp(Σ_t log w_it, ±20)). Defaults are SkyRL 0.3.0's ``product_mask_low/high`` (0.5, 2.0)."""
    return _sequence_mask("product_mask", "product", lo, hi, base, base_kwargs)


def _sequence_mask(what: str, metric: str, lo, hi, base, base_kwargs) -> TermFn:
    lo, hi = corrections.check_band(lo, hi, what=what)
    inner = _base_objective(what, base, base_kwargs)
    return RejectionTerm(inner, functools.partial(rules.sequence_ratio_keep, metric=metric, lo=lo, hi=hi))


def _outlier_mask(lo: Optional[float] = 1e-4, hi: Optional[float] = 100.0, base: str = "grpo",
                  base_kwargs: Optional[Mapping[str, object]] = None) -> TermFn:  # fmt: skip
    """SkyRL's outlier-token mask (``outlier_token_is_threshold_low/high``): a row with any valid token whose
    w_it = exp(log w_it) is below ``lo`` or above ``hi`` leaves the base objective (``rules.outlier_token_keep``;
    None turns a side off). SkyRL 0.3.0 ships both off; the defaults are the values its configuration suggests
    (1e-4 and 100). ``base``/``base_kwargs`` and the metrics as ``geo_mask``.
    """
    what = "outlier_mask"
    if lo is None and hi is None:
        raise ValueError(f"{what}: lo and hi are both None; set at least one bound")
    lo = None if lo is None else corrections.check_cap(lo, what=what, name="lo")
    hi = None if hi is None else corrections.check_cap(hi, what=what, name="hi")
    if lo is not None and hi is not None and not lo < hi:
        raise ValueError(f"{what}: need lo < hi, got lo={lo}, hi={hi}")
    inner = _base_objective(what, base, base_kwargs)
    return RejectionTerm(inner, functools.partial(rules.outlier_token_keep, lo=lo, hi=hi))


def _two_sided(clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2, delta: float = 4.0) -> TermFn:
    """Two-sided GRPO clip (TRL ``GRPOConfig.delta``; INTELLECT-2, arXiv 2505.07291):

        ℓ = −min(min(r, δ)·Â, clip(r, 1−ε_l, 1+ε_h)·Â)·ρ

    δ bounds the ratio of a negative-advantage token from above (``rules.two_sided_clip``); with δ ≥ 1 + ε_h it
    is PPO's dual clip at c = δ. Defaults: TRL's ``epsilon`` 0.2 and δ = 4, the INTELLECT-2 setting (section 4.1)
    TRL's paper index gives; default aggregation ``token-mean`` (TRL's default ``loss_type="dapo"``). Metrics
    ``clipfrac_high``, ``clipfrac_low`` and ``clipfrac_dual`` (Â < 0, r > δ).
    """
    low, high, _ = check_clip(clip_ratio_low, clip_ratio_high, what="two_sided")
    delta = check_positive("delta", delta, what="two_sided")

    def term(inputs: LossInputs, log_ratio: torch.Tensor, rho: Optional[torch.Tensor]) -> Term:
        loss, coef, cuts = rules.two_sided_clip(inputs.adv, torch.exp(log_ratio), low, high, delta)
        with torch.no_grad():
            metrics = _clip_fractions(inputs.mask, cuts["high"], cuts["low"], cuts["delta"])
        return Term(_weigh(loss, rho), _weigh(coef, rho), metrics)

    return term


# --------------------------------------------------------------------------------------------------
# The table: one entry per objective
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    """One objective: the factory of its term, where its formula and defaults come from, its default
    aggregation, and what its term needs."""

    factory: Callable[..., TermFn]  # hyperparameters (with their published defaults) -> term; checks them
    source: str = ""  # the publication and the framework setting its formula and defaults are taken from
    default_agg: str = TOKEN_MEAN
    per_sequence: bool = False  # the term gives per-sequence losses (only ``default_agg`` is accepted)
    inputs: Tuple[str, ...] = ()  # extra (B, T) tensors the term reads from ``inputs.extra``
    optional_inputs: Tuple[str, ...] = ()  # extra (B, T) tensors a call may leave out


_TABLE: Dict[str, _Entry] = {
    "respo": _Entry(_respo, "ReSPO, Chen, Ban, Hsieh (2026), arXiv 2609.35433: the published branches (2, .5, 2) / (1, .5, 2)"),
    "vespo": _Entry(_vespo, "VESPO, arXiv 2602.10693; TRL 1.16 loss_type='vespo': (k, λ) = (2, 3) / (3, 2)"),
    "reshaped": _Entry(_reshaped, "respo: any kernel per advantage sign; defaults ReSPO's branches"),
    "grpo": _Entry(_grpo, "Shao et al. (2024); verl 0.9.1 loss_mode='vanilla', ActorConfig ε = 0.2, clip_ratio_c = 3"),
    "gspo": _Entry(_gspo, "GSPO, arXiv 2507.18071 (ε = 3e-4 / 4e-4, seq-mean-token-mean); verl 0.9.1 loss_mode='gspo'",
                   default_agg=SEQ_MEAN),
    "cispo": _Entry(_cispo, "MiniMax-M1, arXiv 2506.13585; verl 0.9.1 loss_mode='cispo', ActorConfig ε = 0.2"),
    "sapo": _Entry(_sapo, "SAPO, arXiv 2511.20347; verl 0.9.1 loss_mode='sapo': τ⁺ = 1.0, τ⁻ = 1.05", default_agg=SEQ_MEAN),
    "gmpo": _Entry(_gmpo, "GMPO, arXiv 2507.20673; verl 0.9.1 loss_mode='geo_mean', log-space clip 0.4", default_agg=SEQ_MEAN,
                   per_sequence=True),
    "topr": _Entry(_topr, "TOPR, Le Roux et al. (2025), arXiv 2503.14286 (no hyperparameters)"),
    "reinforce": _Entry(_reinforce, "REINFORCE with the given advantages, the on-policy floor (no hyperparameters)"),
    "tis": _Entry(_tis, "TIS, Yao et al. (2025); verl 0.9.1 rollout_correction, its bypass_pg_is preset (sequence, C = 2)"),
    "mis": _Entry(_mis, "MIS, Liu, Li et al. (2025); TRL 1.16 vllm_importance_sampling_mode='sequence_mask', clip_max 3"),
    "icepop": _Entry(_icepop, "IcePop, Ring-1T, arXiv 2510.18855; verl 0.9.1 bypass_pg_token_icepop preset, [0.5, 5]"),
    "m2po": _Entry(_m2po, "M2PO, Zheng et al. (2025), arXiv 2510.01161; AReaL actor.m2_threshold = 0.04"),
    "decoupled": _Entry(_decoupled, "Hilton et al. (2022), arXiv 2110.00641; AReaL use_decoupled_loss, behav_imp_weight_cap 5",
                        optional_inputs=("prox_logp", "staleness")),
    "opsm": _Entry(_opsm, "OPSM, DeepSeek-V3.2, arXiv 2512.02556 eq. 9; TRL 1.16 off_policy_mask_threshold (its example 0.5)"),
    "dppo_tv": _Entry(_dppo_tv, "DPPO, arXiv 2602.04879; verl 0.9.1 loss_mode='dppo_tv', its DPPO recipe (δ = 0.15, C = 1e4)"),
    "dppo_kl": _Entry(_dppo_kl, "DPPO, arXiv 2602.04879; verl 0.9.1 loss_mode='dppo_kl', its DPPO recipe (δ = 0.05, C = 1e4)"),
    "luspo": _Entry(_luspo, "LUSPO, arXiv 2602.05261; TRL 1.16 loss_type='luspo', ε = 0.2", default_agg=SEQ_MEAN_TOKEN_SUM),
    "klrs": _Entry(_klrs, "Liu et al. (2025); verl 0.9.1 rollout_correction.rollout_rs, its seq_mean_k3 preset (0.01) on "
                          "bypass REINFORCE", optional_inputs=_EXTRA_INPUTS),
    "gpg": _Entry(_gpg, "GPG, Chu et al. (2025), arXiv 2504.02546; verl 0.9.1 loss_mode='gpg' (no hyperparameters)"),
    "dro": _Entry(_dro, "verl 0.9.1 loss_mode='dro' (policy_loss.dro_beta has no default, required > 0: β = 1 is respo's)"),
    "clip_cov": _Entry(_clip_cov, "Clip-Cov, Cui et al. (2025), arXiv 2505.22617; verl 0.9.1 loss_mode='clip_cov', "
                                  "PolicyLossConfig clip_cov_ratio 2e-4, lb 1, ub 5, ActorConfig ε = 0.2"),
    "kl_cov": _Entry(_kl_cov, "KL-Cov, Cui et al. (2025), arXiv 2505.22617; verl 0.9.1 loss_mode='kl_cov', "
                              "PolicyLossConfig kl_cov_ratio 2e-4, ppo_kl_coef 0.1"),
    "prime_rl": _Entry(_prime_rl, "prime-rl 0.8.0 default loss (DefaultLossConfig: dppo_mask 0.2, adv_tau 1, kl_tau 1e-3): "
                                  "DPPO-Binary-TV, arXiv 2602.04879, + Kimi K2.5's (log r)², arXiv 2602.02276"),
    "geo_mask": _Entry(_geo_mask, "SkyRL 0.3.0 off_policy_correction sequence_mask_metric='geometric', geo_mask_low/high "
                                  "0.99 / 1.01", optional_inputs=_EXTRA_INPUTS),
    "product_mask": _Entry(_product_mask, "SkyRL 0.3.0 off_policy_correction sequence_mask_metric='product', "
                                          "product_mask_low/high 0.5 / 2", optional_inputs=_EXTRA_INPUTS),
    "outlier_mask": _Entry(_outlier_mask, "SkyRL 0.3.0 off_policy_correction outlier_token_is_threshold_low/high (off by "
                                          "default; its suggested 1e-4 / 100)", optional_inputs=_EXTRA_INPUTS),
    "two_sided": _Entry(_two_sided, "INTELLECT-2, arXiv 2505.07291 (δ = 4, ε = 0.2); TRL 1.16 GRPOConfig delta"),
}  # fmt: skip


#: The factories whose term is a ``SequenceWeightTerm`` (two kernels, REINFORCE-shaped).
_SEQUENCE_WEIGHT_FACTORIES = (_respo, _vespo, _reshaped, _topr, _reinforce)


class UnknownObjectiveError(ValueError):
    """``name`` is not an objective; ``valid`` lists the objectives."""

    def __init__(self, name: object, valid: List[str]):
        self.name, self.valid = name, valid
        super().__init__(f"unknown objective {name!r}; valid objectives: {', '.join(valid)}")


class UnknownHyperparameterError(ValueError):
    """Objective ``objective`` has no hyperparameter(s) ``unknown``; ``valid`` maps its own to their defaults."""

    def __init__(self, objective: str, unknown: List[str], valid: Dict[str, object]):
        self.objective, self.unknown, self.valid = objective, unknown, valid
        listed = ", ".join(f"{k}={v!r}" for k, v in valid.items()) or "none"
        super().__init__(f"unknown hyperparameter(s) {unknown} for objective {objective!r}; valid: {listed}")


def _entry(name: str) -> _Entry:
    try:
        return _TABLE[name]
    except (KeyError, TypeError):
        raise UnknownObjectiveError(name, sorted(_TABLE)) from None


def _defaults(entry: _Entry) -> Dict[str, object]:
    """The hyperparameters of ``entry``'s factory with their published defaults."""
    return {p.name: p.default for p in inspect.signature(entry.factory).parameters.values()}


def hyperparameters(name: str) -> Dict[str, object]:
    """The hyperparameters of objective ``name`` with their published defaults."""
    return _defaults(_entry(name))


def objective_source(name: str) -> str:
    """Where objective ``name``'s formula and defaults come from: the publication and the framework setting."""
    return _entry(name).source


def default_agg_mode(name: str) -> str:
    """The aggregation objective ``name`` uses unless a call names another."""
    return _entry(name).default_agg


# --------------------------------------------------------------------------------------------------
# The Objective: the pipeline, built once
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Objective:
    """One objective with checked hyperparameters and a settled aggregation: the pipeline as a callable.

    Built by ``build_objective``; call it like ``policy_loss`` without the name and the
    hyperparameters. ``kernels`` is (pos_kernel, neg_kernel) for a sequence-weight objective, else None.
    """

    name: str
    term: TermFn
    default_agg: str = TOKEN_MEAN
    per_sequence: bool = False
    loss_agg_mode: str = TOKEN_MEAN  # the aggregation a call uses unless it names another
    inputs: Tuple[str, ...] = ()  # extra (B, T) tensors a call must pass by name
    optional_inputs: Tuple[str, ...] = ()  # extra (B, T) tensors a call may pass by name

    @property
    def kernels(self) -> Optional[Tuple[Kernel, Kernel]]:
        return getattr(self.term, "kernels", None)

    @property
    def hyperparameters(self) -> Dict[str, object]:
        """Hyperparameter names of this objective with their published defaults."""
        return _defaults(_TABLE[self.name])

    def agg_mode(self, loss_agg_mode: Optional[str] = None) -> str:
        """The aggregation ``loss_agg_mode`` names, or the objective's default when None/empty (checked)."""
        mode = loss_agg_mode or self.default_agg
        if self.per_sequence and mode != self.default_agg:
            raise ValueError(
                f"{self.name} aggregates per sequence; loss_agg_mode must be {self.default_agg!r}, got {mode!r}"
            )
        return check_agg_mode(mode)

    def __call__(
        self,
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
        row_groups: Optional[torch.Tensor] = None,
        **extra: torch.Tensor,
    ) -> Tuple[torch.Tensor, Metrics]:
        """Loss and metrics of this objective (see ``policy_loss`` for the arguments).

        ``loss_agg_mode`` None uses the mode the objective was built with; ``extra`` are the per-token
        tensors its entry declares (``self.inputs``).
        """
        undeclared = sorted(set(extra) - set(self.inputs) - set(self.optional_inputs))
        if undeclared:
            raise ValueError(f"unknown keyword argument(s) {undeclared}: the hyperparameters of a built "
                             f"objective ({self.name!r}) are set by build_objective")  # fmt: skip
        missing = [k for k in self.inputs if k not in extra]
        if missing:
            raise ValueError(f"objective {self.name!r} needs the per-token input(s) {missing}, each (B, T)")
        mode = self.loss_agg_mode if not loss_agg_mode else self.agg_mode(loss_agg_mode)
        # The pipeline: check → token log ratio → rollout weight → term → aggregate → metrics.
        extra = {k: v for k, v in extra.items() if v is not None or k in self.inputs}  # an optional one left out
        inputs = check_inputs(logp, old_logp, advantages, mask, rollout_log_ratio, nan_policy, extra)
        if row_groups is not None:
            inputs = dataclasses.replace(inputs, row_groups=check_row_groups(row_groups, logp.shape[0]))
        log_ratio = token_log_ratio(inputs.logp, inputs.old_logp)  # (B, T), with grad
        term = self.term(inputs, log_ratio, _rollout_weight(inputs))
        if self.per_sequence:
            loss = agg_seq(term.values, inputs.mask.sum(dim=-1), global_seqs=global_seqs)
        else:
            loss = agg_loss(
                term.values, inputs.mask, mode,
                global_tokens=global_tokens, global_seqs=global_seqs, loss_scale_factor=loss_scale_factor,
            )  # fmt: skip
        count = stat_dtype(inputs.mask.dtype)  # counts and diagnostics in float32 for half inputs
        metrics: Metrics = {
            "loss": loss.detach(),
            "bad_rows/nonfinite": inputs.n_nonfinite.to(count),
            "bad_rows/empty": inputs.n_empty.to(count),
            "n_tokens": inputs.mask.to(count).sum(),
        }
        if diagnostics:
            log_w = _log_w(inputs) if term.log_w is None else term.log_w  # (B,)
            coef = term.coef if term.coef.dim() == 1 else _seq_mean(term.coef, inputs.mask)  # (B,)
            token_log_r = inputs.logp.detach() - inputs.old_logp  # (B, T)
            metrics.update(weight_diagnostics(log_w, coef, inputs.seq_adv, inputs.mask, token_log_ratio=token_log_r))
            rlr = inputs.rollout_log_ratio
            metrics.update(corrections.chi2(token_log_r if rlr is None else token_log_r + rlr, inputs.mask))
        metrics.update({k: v.detach() for k, v in term.metrics.items()})
        return loss, metrics


_CALL = inspect.signature(Objective.__call__)
#: Keyword arguments every objective takes (``Objective.__call__``); everything else is a hyperparameter.
COMMON_KWARGS = tuple(p.name for p in _CALL.parameters.values() if p.kind is p.KEYWORD_ONLY)


def build_objective(name: str, *, loss_agg_mode: Optional[str] = None, **hparams) -> Objective:
    """The objective ``name`` with hyperparameters ``hparams`` (unset ones take the published defaults).

    ``loss_agg_mode``: the aggregation its calls use (one of ``AGG_MODES``); None uses the
    objective's published default (``token-mean``; ``seq-mean-token-mean`` for gspo, sapo, gmpo).

    Raises:
      ValueError: an unknown name or hyperparameter (the message lists the valid ones; the errors are
        ``UnknownObjectiveError`` and ``UnknownHyperparameterError``), a bad value or aggregation.
    """
    return _build(name, _entry(name), loss_agg_mode, hparams)


def _build(name: str, entry: _Entry, loss_agg_mode: Optional[str], hparams: Mapping[str, object]) -> Objective:
    """``build_objective`` with the table entry already looked up (once per build)."""
    valid = _defaults(entry)
    unknown = sorted(set(hparams) - set(valid))
    if unknown:
        raise UnknownHyperparameterError(name, unknown, valid)
    term = entry.factory(**hparams)
    # a composed term (``RejectionTerm``) carries its base objective's aggregation and extra inputs
    default_agg, per_sequence, inputs, optional = (getattr(term, k, getattr(entry, k)) for k in
                                                   ("default_agg", "per_sequence", "inputs", "optional_inputs"))  # fmt: skip
    objective = Objective(name, term, default_agg, per_sequence, default_agg, inputs, optional)
    mode = objective.agg_mode(loss_agg_mode)
    return objective if mode == objective.loss_agg_mode else dataclasses.replace(objective, loss_agg_mode=mode)


def sequence_kernels(name: str, **hparams) -> Tuple[Kernel, Kernel]:
    """(pos_kernel, neg_kernel) of the sequence-weight objective ``name`` with its hyperparameters.

    The one place that says which kernels ``respo``, ``vespo``, ``topr``, ``reinforce`` and
    ``reshaped`` use (their factories); integrations that aggregate with their framework's own code
    (verl) call it too.
    """
    objective = build_objective(name, **hparams)
    if objective.kernels is None:
        known = [k for k, entry in _TABLE.items() if entry.factory in _SEQUENCE_WEIGHT_FACTORIES]
        raise ValueError(f"{name!r} is not a sequence-weight objective; known: {', '.join(known)}")
    return objective.kernels


def policy_loss(
    name: Union[str, Objective],
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_agg_mode: Optional[str] = None,
    **kwargs,
) -> Tuple[torch.Tensor, Metrics]:
    """Loss and metrics of the objective ``name`` (see the module docstring for the list).

    ``build_objective(name, loss_agg_mode=loss_agg_mode, **hparams)`` called on the tensors; build the
    objective once instead when calling it many times.

    Args:
      name: objective name, a key of ``OBJECTIVES``, or an ``Objective`` from ``build_objective``.
      logp: (B, T) log π_θ of the response tokens, with grad.
      old_logp: (B, T) log π_old (behaviour policy as recomputed by the trainer).
      advantages: (B,) sequence advantages or (B, T) token advantages.
      mask: (B, T) 0/1 validity mask.
      loss_agg_mode: one of ``AGG_MODES``; None uses the objective's published default
        (``token-mean``; ``seq-mean-token-mean`` for gspo, sapo, gmpo).
      **kwargs: the keyword arguments of every objective's call (``COMMON_KWARGS``, see
        ``Objective.__call__``): ``rollout_log_ratio`` optional (B, T) per-token log ρ (training/
        inference mismatch correction); ``global_tokens``, ``global_seqs`` counts of the global batch,
        for micro-batch invariance; ``loss_scale_factor`` H for ``seq-mean-token-sum-norm``;
        ``nan_policy`` ``raise`` (default) or ``mask`` (drop and count bad rows); ``diagnostics``
        (on by default; cheap, (B,)-sized); ``row_groups`` optional (B,) integer micro-batch of each
        row, within which a selection spanning the batch (M2PO's) is made (None: the whole batch).
        Then the extra (B, T) tensors the objective's entry declares (e.g. ``prox_logp``), and its
        hyperparameters (``hyperparameters(name)`` lists them).

    Returns:
      (loss 0-d tensor with grad, metrics dict of detached 0-d tensors).
    """
    if isinstance(name, Objective):
        return name(logp, old_logp, advantages, mask, loss_agg_mode=loss_agg_mode, **kwargs)
    entry = _entry(name)
    call_names = set(COMMON_KWARGS) | set(entry.inputs) | set(entry.optional_inputs)
    hparams = {k: kwargs.pop(k) for k in list(kwargs) if k not in call_names}
    objective = _build(name, entry, loss_agg_mode, hparams)
    return objective(logp, old_logp, advantages, mask, **kwargs)


def _loss_function(name: str) -> LossFn:
    """``<name>_loss(logp, old_logp, advantages, mask, **kwargs)``: ``policy_loss(name, ...)``, with the
    factory's docstring and the signature of an objective's call with its hyperparameters (and extra
    inputs) added as keyword-only arguments."""

    def loss(logp, old_logp, advantages, mask, **kwargs):
        return policy_loss(name, logp, old_logp, advantages, mask, **kwargs)

    entry = _entry(name)
    params = [p for p in _CALL.parameters.values() if p.name != "self"]
    tensors = [p for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    options = [p for p in params if p.kind is p.KEYWORD_ONLY]
    own = [p.replace(kind=p.KEYWORD_ONLY) for p in inspect.signature(entry.factory).parameters.values()]
    own += [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, annotation=torch.Tensor) for k in entry.inputs]
    own += [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Optional[torch.Tensor])
            for k in entry.optional_inputs]  # fmt: skip
    loss.__signature__ = inspect.Signature(tensors + own + options)  # type: ignore[attr-defined]
    loss.__name__ = loss.__qualname__ = f"{name}_loss"
    loss.__doc__ = entry.factory.__doc__
    return loss


OBJECTIVES: Dict[str, LossFn] = {name: _loss_function(name) for name in _TABLE}
respo_loss, vespo_loss, reshaped_loss = OBJECTIVES["respo"], OBJECTIVES["vespo"], OBJECTIVES["reshaped"]
topr_loss, reinforce_loss = OBJECTIVES["topr"], OBJECTIVES["reinforce"]
grpo_loss, gspo_loss, cispo_loss = OBJECTIVES["grpo"], OBJECTIVES["gspo"], OBJECTIVES["cispo"]
sapo_loss, gmpo_loss = OBJECTIVES["sapo"], OBJECTIVES["gmpo"]
tis_loss, mis_loss, icepop_loss = OBJECTIVES["tis"], OBJECTIVES["mis"], OBJECTIVES["icepop"]
m2po_loss, decoupled_loss, opsm_loss = OBJECTIVES["m2po"], OBJECTIVES["decoupled"], OBJECTIVES["opsm"]


def get_objective(name: str) -> LossFn:
    """The loss function ``<name>_loss`` of objective ``name``."""
    _entry(name)
    return OBJECTIVES[name]


__all__ = [
    "AGG_MODES", "COMMON_KWARGS", "OBJECTIVES", "Objective", "SequenceWeightTerm", "Term", "UnknownHyperparameterError",
    "UnknownObjectiveError", "build_objective", "cispo_loss", "decoupled_loss", "default_agg_mode", "get_objective",
    "gmpo_loss", "grpo_loss", "gspo_loss", "hyperparameters", "icepop_loss", "kernel_from_spec", "m2po_loss",
    "mis_loss", "objective_source", "opsm_loss", "policy_loss", "reinforce_loss", "reshaped_loss", "respo_loss",
    "sapo_loss", "sequence_kernels", "tis_loss", "topr_loss", "vespo_loss",
]  # fmt: skip
