"""Policy objectives: one pipeline, one small term per objective.

Every objective is called the same way,

    loss, metrics = policy_loss(name, logp, old_logp, advantages, mask, *, <its hyperparameters>,
                                loss_agg_mode=None, rollout_log_ratio=None, global_tokens=None,
                                global_seqs=None, loss_scale_factor=None, nan_policy="raise",
                                diagnostics=True)

and runs one pipeline:

    check_inputs → log r_it = clamp(logp − old_logp) → ρ_it = exp(log ρ_it) → term → agg → diagnostics

``build_objective(name, loss_agg_mode=None, **hparams)`` is the one way an objective is made: it checks
the hyperparameters, settles the aggregation once and returns an ``Objective``, the callable that runs
this pipeline, built once and called many times (the trainer builds one per run). The other ways are
thin aliases of it: ``policy_loss(name, ...)`` builds one and calls it, ``<name>_loss(logp, old_logp,
advantages, mask, ...)`` is ``policy_loss`` with the name bound (the factory's docstring, and its
hyperparameters in the signature), ``OBJECTIVES`` maps every registered name to its ``<name>_loss`` and
``get_objective(name)`` returns it. Every objective in the registry has its ``<name>_loss`` (here, in
``respo.core`` and in ``respo``), one registered after import too.

An objective differs only in its *term*: the per-token loss ℓ_it (per-sequence for gmpo), the
detached coefficient c of its gradient ∇L = −agg[c_it · Â_it · ∇logp_it], its default aggregation
and its extra metrics. ``metrics["coef_mean"]`` and the starvation diagnostics use the
per-sequence mean of c, so every objective is measured on the same scale.

Adding an objective is one factory and one registration, the ``objective`` decorator of
``respo.core.registry`` on it, in the module of its kind (this one, ``corrections``, ``rules``) or in
one's own. The factory takes the objective's hyperparameters as keyword arguments with their published
defaults (they become its ``hyperparameters(name)`` and the signature of ``<name>_loss``; its docstring
becomes the loss function's), checks them (a bad value raises ``ValueError`` in one line) and returns a
term ``term(inputs, log_ratio, rho) -> Term``: ``inputs`` the checked ``LossInputs``, ``log_ratio`` the
(B, T) clamped token log ratio with grad, ``rho`` the (B, T) detached rollout weight or None. The
registration gives the loss in one line (``summary``), the ``source`` of the formula and the defaults, the
``family`` (the section of the catalogue), the default aggregation (``default_agg=SEQ_MEAN``) and whether
the term's losses are per sequence (``per_sequence=True``, (B,) values).

An objective that needs another per-token tensor, e.g. a proximal policy's log-probs ``prox_logp``
(B, T), names it in its registration, ``inputs=("prox_logp",)``. Callers then pass it by name,
``objective(logp, old_logp, adv, mask, prox_logp=prox)`` or ``policy_loss(name, ..., prox_logp=prox)``;
an input listed in ``optional_inputs`` may be left out (or None), and the term then finds it missing
from ``inputs.extra``. The pipeline checks it like the other inputs (shape (B, T), floating point,
NaN/inf on a valid token raised or its row masked under ``nan_policy``), detaches it and hands it to the
term as ``inputs.extra["prox_logp"]``. A missing declared tensor, or one the objective does not
declare, is refused.

Every objective is in the registry (``respo hyperparameters`` and docs/method.md list them all); those whose
factory is in ``respo.core.corrections`` or ``respo.core.rules`` are listed in that module's docstring.

The objectives registered here (``python scripts/catalogue.py`` writes the list from the registry):

  Sequence-weight objectives (REINFORCE-shaped, a detached φ_i per sequence; log ρ folds into log W):
    respo          −φ_i·Â·logp, φ = ReSPO(α, β, λ) kernel per advantage sign, detached
                   pos=(2.0, 0.5, 2.0), neg=(1.0, 0.5, 2.0); token-mean
                   ReSPO, Chen, Ban, Hsieh (2026), arXiv 2609.35433: the published branches (2, .5, 2) / (1, .5, 2)
    vespo          −φ_i·Â·logp, φ = W^k·e^(λ(1−W)) per advantage sign
                   pos=(2.0, 3.0), neg=(3.0, 2.0); token-mean
                   VESPO, arXiv 2602.10693; TRL 1.16 loss_type='vespo': (k, λ) = (2, 3) / (3, 2)
    reshaped       −φ_i·Â·logp, φ = any two kernels, one per advantage sign (``kernel_from_spec``)
                   pos_kernel='respo(2,0.5,2)', neg_kernel='respo(1,0.5,2)'; token-mean
                   respo: any kernel per advantage sign; defaults ReSPO's branches
    topr           −φ_i·Â·logp, φ⁺ = 1, φ⁻ = min(W, 1)
                   no hyperparameters; token-mean
                   TOPR, Le Roux et al. (2025), arXiv 2503.14286 (no hyperparameters)
    reinforce      −Â·logp (φ ≡ 1, the on-policy floor)
                   no hyperparameters; token-mean
                   REINFORCE with the given advantages, the on-policy floor (no hyperparameters)
  Ratio objectives (a clip or gate on r = π_θ/π_old; ρ multiplies the per-token loss):
    grpo           PPO clip with dual clip: max(−rÂ, −clip(r, 1−ε_l, 1+ε_h)Â), and min(·, −cÂ) for Â < 0
                   clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0; token-mean
                   Shao et al. (2024); verl 0.9.1 loss_mode='vanilla', ActorConfig ε = 0.2, clip_ratio_c = 3
    gspo           grpo's clip on the length-normalised sequence ratio s_i (token form sg(s_i)·π/sg(π))
                   clip_ratio_low=0.0003, clip_ratio_high=0.0004; seq-mean-token-mean
                   GSPO, arXiv 2507.18071 (ε = 3e-4 / 4e-4, seq-mean-token-mean); verl 0.9.1 loss_mode='gspo'
    cispo          −sg(clip(r, 1−ε_l, 1+ε_h))·Â·logp
                   clip_ratio_low=0.2, clip_ratio_high=0.2; token-mean
                   MiniMax-M1, arXiv 2506.13585; verl 0.9.1 loss_mode='cispo', ActorConfig ε = 0.2
    sapo           −σ(τ(r−1))·(4/τ)·Â, τ = τ⁺ for Â > 0, τ⁻ otherwise
                   tau_pos=1.0, tau_neg=1.05; seq-mean-token-mean
                   SAPO, arXiv 2511.20347; verl 0.9.1 loss_mode='sapo': τ⁺ = 1.0, τ⁻ = 1.05
    gmpo           −Â_i·exp(mean_t sign-aware-clip(log r_it)) per sequence, mean over sequences
                   clip_ratio_low=0.4, clip_ratio_high=0.4; seq-mean-token-mean
                   GMPO, arXiv 2507.20673; verl 0.9.1 loss_mode='geo_mean', log-space clip 0.4
    luspo          GSPO's clip with each sequence's loss times its length
                   clip_ratio_low=0.2, clip_ratio_high=0.2; seq-mean-token-sum
                   LUSPO, arXiv 2602.05261; TRL 1.16 loss_type='luspo', ε = 0.2
  Staleness corrections the frameworks ship (log w = logp − old_logp + log ρ):
    klrs           any ``base`` objective on the tokens a k1/k2/k3 KL estimate (per token, row mean, sum or max) and
                   a veto keep
                   estimator='k3', agg='mean', threshold=0.01, lower=None, veto=None, base='reinforce',
                   base_kwargs=None; token-mean
                   Liu et al. (2025); verl 0.9.1 rollout_correction.rollout_rs, its seq_mean_k3 preset (0.01) on
                   bypass REINFORCE
  The frameworks' other policy-loss rules:
    geo_mask       any ``base`` objective on the rows whose geometric-mean ratio lies in [lo, hi]
                   lo=0.99, hi=1.01, base='grpo', base_kwargs=None; token-mean
                   SkyRL 0.3.0 off_policy_correction sequence_mask_metric='geometric', geo_mask_low/high 0.99 / 1.01
    product_mask   geo_mask with the product of the token ratios
                   lo=0.5, hi=2.0, base='grpo', base_kwargs=None; token-mean
                   SkyRL 0.3.0 off_policy_correction sequence_mask_metric='product', product_mask_low/high 0.5 / 2
    outlier_mask   any ``base`` objective on the rows with no token ratio outside [lo, hi]
                   lo=0.0001, hi=100.0, base='grpo', base_kwargs=None; token-mean
                   SkyRL 0.3.0 off_policy_correction outlier_token_is_threshold_low/high (off by default; its
                   suggested 1e-4 / 100)
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Tuple, Union

import torch

from respo.core.aggregation import AGG_MODES, agg_loss, agg_seq, check_agg_mode
from respo.core import corrections, rules
from respo.core.checks import (LossInputs, check_band, check_cap, check_choice, check_clip, check_inputs,
                               check_positive, check_row_groups)  # fmt: skip
from respo.core.diagnostics import clip_fractions, stat_dtype, weight_diagnostics
from respo.core.kernels import (RESPO_NEG, RESPO_PARAMS, RESPO_POS, VESPO_NEG, VESPO_PARAMS, VESPO_POS, Kernel,
                                kernel_from_spec, kernel_params, respo_kernel, truncated_kernel, two_branch, unit_kernel,
                                vespo_kernel)  # fmt: skip
from respo.core.ratios import LOG_W_CLAMP, ppo_clip, sequence_log_ratio, token_log_ratio
from respo.core.registry import (ObjectiveSpec, Term, TermFn, UnknownObjectiveError, get_spec, objective,
                                 objective_names, weigh)  # fmt: skip

Metrics = Dict[str, torch.Tensor]
LossFn = Callable[..., Tuple[torch.Tensor, Metrics]]

TOKEN_MEAN = "token-mean"
SEQ_MEAN = "seq-mean-token-mean"
SEQ_MEAN_TOKEN_SUM = "seq-mean-token-sum"
GSPO_LOG_S_MAX = 10.0  # verl clamps the token-form log s_it above at 10


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


@objective("respo", family="sequence-weight",
           summary="−φ_i·Â·logp, φ = ReSPO(α, β, λ) kernel per advantage sign, detached",
           source="ReSPO, Chen, Ban, Hsieh (2026), arXiv 2609.35433: the published branches (2, .5, 2) / (1, .5, 2)")
def _respo(pos: Tuple[float, float, float] = RESPO_POS, neg: Tuple[float, float, float] = RESPO_NEG) -> TermFn:
    """ReSPO: L = −agg[φ_i Â_it logp_it] with φ⁺ = ReSPO(pos), φ⁻ = ReSPO(neg), (α, β, λ) per branch.

    Each branch is exactly three numbers (α, β, λ), by position or by name ({"alpha", "beta", "lambda"}).

    Defaults are the published (2, 0.5, 2) for Â ≥ 0 and (1, 0.5, 2) for Â < 0, i.e.
    φ⁺(W) = ((1+W)/2)·e^(1−W) and φ⁻(W) = √W·e^(2(1−√W)). Default aggregation ``token-mean``.
    """
    pos, neg = (kernel_params(v, RESPO_PARAMS, param=n, what="respo") for n, v in (("pos", pos), ("neg", neg)))
    return SequenceWeightTerm(respo_kernel(*pos), respo_kernel(*neg))


@objective("vespo", family="sequence-weight", summary="−φ_i·Â·logp, φ = W^k·e^(λ(1−W)) per advantage sign",
           source="VESPO, arXiv 2602.10693; TRL 1.16 loss_type='vespo': (k, λ) = (2, 3) / (3, 2)")
def _vespo(pos: Tuple[float, float] = VESPO_POS, neg: Tuple[float, float] = VESPO_NEG) -> TermFn:
    """VESPO: L = −agg[φ_i Â_it logp_it], φ = W^k·e^(λ(1−W)), (k, λ) = (2, 3) for Â ≥ 0, (3, 2) for Â < 0.

    Each branch is exactly two numbers (k, λ), by position or by name ({"k", "lambda"}).
    """
    pos, neg = (kernel_params(v, VESPO_PARAMS, param=n, what="vespo") for n, v in (("pos", pos), ("neg", neg)))
    return SequenceWeightTerm(vespo_kernel(*pos), vespo_kernel(*neg))


@objective("reshaped", family="sequence-weight",
           summary="−φ_i·Â·logp, φ = any two kernels, one per advantage sign (``kernel_from_spec``)",
           source="respo: any kernel per advantage sign; defaults ReSPO's branches")
def _reshaped(pos_kernel: Union[str, Kernel] = "respo(2,0.5,2)",
              neg_kernel: Union[str, Kernel] = "respo(1,0.5,2)") -> TermFn:
    """Two-branch reshaped sequence objective L = −agg[φ_i·Â_it·logp_it], φ_i = K_{sign Â_i}(log W_i).

    log W_i = Σ_t m(logp − old_logp) + Σ_t m·log ρ, clamped to [−20, 20]; φ is detached, so
    ∇L = −agg[φ_i·Â_it·∇logp_it]. Branch by the sequence advantage: Â_i ≥ 0 uses ``pos_kernel``.
    ``pos_kernel``, ``neg_kernel``: callables log_w -> φ or spec strings (see ``kernel_from_spec``).
    Default aggregation ``token-mean``.
    """
    return SequenceWeightTerm(kernel_from_spec(pos_kernel), kernel_from_spec(neg_kernel))


@objective("topr", family="sequence-weight", summary="−φ_i·Â·logp, φ⁺ = 1, φ⁻ = min(W, 1)",
           source="TOPR, Le Roux et al. (2025), arXiv 2503.14286 (no hyperparameters)")
def _topr() -> TermFn:
    """TOPR: L = −agg[sg(α_i) Â_it logp_it], α_i = min(W_i, 1) for Â_i < 0 and 1 otherwise."""
    return SequenceWeightTerm(unit_kernel(), truncated_kernel(1.0))


@objective("reinforce", family="sequence-weight", summary="−Â·logp (φ ≡ 1, the on-policy floor)",
           source="REINFORCE with the given advantages, the on-policy floor (no hyperparameters)")
def _reinforce() -> TermFn:
    """REINFORCE: L = −agg[Â_it logp_it] (φ ≡ 1; ignores staleness, the on-policy floor)."""
    return SequenceWeightTerm(unit_kernel(), unit_kernel())


# --------------------------------------------------------------------------------------------------
# Ratio (clip / gate) objectives: a factory checks the hyperparameters and returns the term
# --------------------------------------------------------------------------------------------------


@objective("grpo", family="ratio",
           summary="PPO clip with dual clip: max(−rÂ, −clip(r, 1−ε_l, 1+ε_h)Â), and min(·, −cÂ) for Â < 0",
           source="Shao et al. (2024); verl 0.9.1 loss_mode='vanilla', ActorConfig ε = 0.2, clip_ratio_c = 3")
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
        values = weigh(clip.loss, rho)  # (B, T)
        with torch.no_grad():
            coef = weigh(torch.where(clip.active, ratio.detach(), torch.zeros_like(ratio)), rho)
            metrics = clip_fractions(inputs.mask, clip.high, clip.low, clip.dual if c is not None else None,
                                      clip.clipped)  # fmt: skip
        return Term(values, coef, metrics)

    return term


@objective("gspo", family="ratio", default_agg=SEQ_MEAN,
           summary="grpo's clip on the length-normalised sequence ratio s_i (token form sg(s_i)·π/sg(π))",
           source="GSPO, arXiv 2507.18071 (ε = 3e-4 / 4e-4, seq-mean-token-mean); verl 0.9.1 loss_mode='gspo'")
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
        values = weigh(clip.loss, rho)
        with torch.no_grad():
            coef = weigh(torch.where(clip.active, s.detach(), torch.zeros_like(s)), rho)
            metrics = clip_fractions(inputs.mask, clip.high, clip.low, either=clip.clipped)
        return Term(values, coef, metrics)

    return term


@objective("cispo", family="ratio", summary="−sg(clip(r, 1−ε_l, 1+ε_h))·Â·logp",
           source="MiniMax-M1, arXiv 2506.13585; verl 0.9.1 loss_mode='cispo', ActorConfig ε = 0.2")
def _cispo(clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2) -> TermFn:
    """CISPO: ℓ = −sg(clip(r, 1−ε_l, 1+ε_h))·Â·logp (clipped IS weight, gradient kept on every token).

    Defaults ε_l = ε_h = 0.2 are verl's ``ActorConfig`` defaults; the MiniMax-M1 paper effectively
    disables the lower bound and tunes ε_h. Default aggregation ``token-mean``.
    """
    low, high, _ = check_clip(clip_ratio_low, clip_ratio_high, what="cispo")

    def term(inputs: LossInputs, log_ratio: torch.Tensor, rho: Optional[torch.Tensor]) -> Term:
        with torch.no_grad():
            r = torch.exp(log_ratio.detach())  # (B, T)
            coef = weigh(r.clamp(1 - low, 1 + high), rho)
        values = -(coef * inputs.adv) * inputs.logp  # (B, T)
        return Term(values, coef, clip_fractions(inputs.mask, r > 1 + high, r < 1 - low))

    return term


@objective("sapo", family="ratio", default_agg=SEQ_MEAN, summary="−σ(τ(r−1))·(4/τ)·Â, τ = τ⁺ for Â > 0, τ⁻ otherwise",
           source="SAPO, arXiv 2511.20347; verl 0.9.1 loss_mode='sapo': τ⁺ = 1.0, τ⁻ = 1.05")
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
        values = weigh(-gate * adv, rho)  # (B, T)
        with torch.no_grad():
            sig = torch.sigmoid(tau * (ratio.detach() - 1.0))
            coef = weigh(4.0 * sig * (1.0 - sig) * ratio.detach(), rho)
        return Term(values, coef)

    return term


@objective("gmpo", family="ratio", default_agg=SEQ_MEAN, per_sequence=True,
           summary="−Â_i·exp(mean_t sign-aware-clip(log r_it)) per sequence, mean over sequences",
           source="GMPO, arXiv 2507.20673; verl 0.9.1 loss_mode='geo_mean', log-space clip 0.4")
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
        per_seq = weigh(-seq_adv * ratio, rho_seq)  # (B,)
        with torch.no_grad():
            cut_high, cut_low = (adv > 0) & (d.detach() > high), (adv < 0) & (d.detach() < -low)
            active = (~(cut_high | cut_low)).to(m.dtype)
            coef = weigh(ratio.detach().unsqueeze(-1) * active, None if rho_seq is None else rho_seq.unsqueeze(-1))
        return Term(per_seq, coef, clip_fractions(m, cut_high, cut_low))

    return term


@objective("luspo", family="ratio", default_agg=SEQ_MEAN_TOKEN_SUM,
           summary="GSPO's clip with each sequence's loss times its length",
           source="LUSPO, arXiv 2602.05261; TRL 1.16 loss_type='luspo', ε = 0.2")
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


# --------------------------------------------------------------------------------------------------
# Rejections composed with a base objective: KL estimators (corrections), SkyRL's masks (rules)
# --------------------------------------------------------------------------------------------------


#: The extra per-token inputs any objective reads (a composed objective passes its base's on).
_EXTRA_INPUTS = ("prox_logp", "staleness")


@objective("klrs", family="correction", optional_inputs=_EXTRA_INPUTS,
           summary="any ``base`` objective on the tokens a k1/k2/k3 KL estimate (per token, row mean, sum or max) "
                   "and a veto keep",
           source="Liu et al. (2025); verl 0.9.1 rollout_correction.rollout_rs, its seq_mean_k3 preset (0.01) on "
                  "bypass REINFORCE")
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
    est = check_choice("estimator", estimator, corrections.KL_ESTIMATORS, what=what)
    agg = check_choice("agg", agg, corrections.KL_AGGS, what=what)
    if est == "k1" and agg == "max":
        raise ValueError("klrs: agg='max' is for k2 and k3 (a k1 maximum is not a divergence bound, as in verl)")
    threshold = check_cap(threshold, what=what, name="threshold")
    lower = None if lower is None else check_cap(lower, what=what, name="lower")
    if lower is not None and (est != "k1" or not lower <= threshold):
        raise ValueError(f"klrs: lower is a ratio bound of k1, <= threshold; got lower={lower} with estimator={est!r}, "
                         f"threshold={threshold}")  # fmt: skip
    veto = None if veto is None else check_cap(veto, what=what, name="veto")
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
    return _build(get_spec(base), None, dict(base_kwargs or {}))


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


@objective("geo_mask", family="rule", optional_inputs=_EXTRA_INPUTS,
           summary="any ``base`` objective on the rows whose geometric-mean ratio lies in [lo, hi]",
           source="SkyRL 0.3.0 off_policy_correction sequence_mask_metric='geometric', geo_mask_low/high 0.99 / 1.01")
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


@objective("product_mask", family="rule", optional_inputs=_EXTRA_INPUTS,
           summary="geo_mask with the product of the token ratios",
           source="SkyRL 0.3.0 off_policy_correction sequence_mask_metric='product', product_mask_low/high 0.5 / 2")
def _product_mask(lo: float = 0.5, hi: float = 2.0, base: str = "grpo",
                  base_kwargs: Optional[Mapping[str, object]] = None) -> TermFn:  # fmt: skip
    """SkyRL's product sequence mask (``sequence_mask_metric="product"``): as ``geo_mask`` with the sequence ratio
    W_i = exp(clamp(Σ_t log w_it, ±20)). Defaults are SkyRL 0.3.0's ``product_mask_low/high`` (0.5, 2.0)."""
    return _sequence_mask("product_mask", "product", lo, hi, base, base_kwargs)


def _sequence_mask(what: str, metric: str, lo, hi, base, base_kwargs) -> TermFn:
    lo, hi = check_band(lo, hi, what=what)
    inner = _base_objective(what, base, base_kwargs)
    return RejectionTerm(inner, functools.partial(rules.sequence_ratio_keep, metric=metric, lo=lo, hi=hi))


@objective("outlier_mask", family="rule", optional_inputs=_EXTRA_INPUTS,
           summary="any ``base`` objective on the rows with no token ratio outside [lo, hi]",
           source="SkyRL 0.3.0 off_policy_correction outlier_token_is_threshold_low/high (off by default; its "
                  "suggested 1e-4 / 100)")
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
    lo = None if lo is None else check_cap(lo, what=what, name="lo")
    hi = None if hi is None else check_cap(hi, what=what, name="hi")
    if lo is not None and hi is not None and not lo < hi:
        raise ValueError(f"{what}: need lo < hi, got lo={lo}, hi={hi}")
    inner = _base_objective(what, base, base_kwargs)
    return RejectionTerm(inner, functools.partial(rules.outlier_token_keep, lo=lo, hi=hi))


# --------------------------------------------------------------------------------------------------
# What the registry says of an objective
# --------------------------------------------------------------------------------------------------


class UnknownHyperparameterError(ValueError):
    """Objective ``objective`` has no hyperparameter(s) ``unknown``; ``valid`` maps its own to their defaults."""

    def __init__(self, objective: str, unknown: List[str], valid: Dict[str, object]):
        self.objective, self.unknown, self.valid = objective, unknown, valid
        listed = ", ".join(f"{k}={v!r}" for k, v in valid.items()) or "none"
        super().__init__(f"unknown hyperparameter(s) {unknown} for objective {objective!r}; valid: {listed}")


def hyperparameters(name: str) -> Dict[str, object]:
    """The hyperparameters of objective ``name`` with their published defaults."""
    return get_spec(name).hyperparameters


def objective_source(name: str) -> str:
    """Where objective ``name``'s formula and defaults come from: the publication and the framework setting."""
    return get_spec(name).source


def default_agg_mode(name: str) -> str:
    """The aggregation objective ``name`` uses unless a call names another."""
    return get_spec(name).default_agg


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
        return get_spec(self.name).hyperparameters

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
    return _build(get_spec(name), loss_agg_mode, hparams)


def _build(spec: ObjectiveSpec, loss_agg_mode: Optional[str], hparams: Mapping[str, object]) -> Objective:
    """``build_objective`` with the registration already looked up (once per build)."""
    name, valid = spec.name, spec.hyperparameters
    unknown = sorted(set(hparams) - set(valid))
    if unknown:
        raise UnknownHyperparameterError(name, unknown, valid)
    term = spec.factory(**hparams)
    # a composed term (``RejectionTerm``) carries its base objective's aggregation and extra inputs
    default_agg, per_sequence, inputs, optional = (getattr(term, k, getattr(spec, k)) for k in
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
        known = objective_names(family="sequence-weight")
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
    spec = get_spec(name)
    call_names = set(COMMON_KWARGS) | set(spec.inputs) | set(spec.optional_inputs)
    hparams = {k: kwargs.pop(k) for k in list(kwargs) if k not in call_names}
    objective = _build(spec, loss_agg_mode, hparams)
    return objective(logp, old_logp, advantages, mask, **kwargs)


# --------------------------------------------------------------------------------------------------
# The loss functions: ``<name>_loss`` and ``OBJECTIVES`` for every objective in the registry
# --------------------------------------------------------------------------------------------------


def _loss_function(spec: ObjectiveSpec) -> LossFn:
    """``<name>_loss(logp, old_logp, advantages, mask, **kwargs)``: ``policy_loss(name, ...)``, with the
    factory's docstring and, as its signature, an objective's call with the factory's hyperparameters (and
    the registered extra inputs) added as keyword-only arguments."""
    name = spec.name

    def loss(logp, old_logp, advantages, mask, **kwargs):
        return policy_loss(name, logp, old_logp, advantages, mask, **kwargs)

    params = [p for p in _CALL.parameters.values() if p.name != "self"]
    tensors = [p for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    options = [p for p in params if p.kind is p.KEYWORD_ONLY]
    own = [p.replace(kind=p.KEYWORD_ONLY) for p in inspect.signature(spec.factory).parameters.values()]
    own += [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, annotation=torch.Tensor) for k in spec.inputs]
    own += [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Optional[torch.Tensor])
            for k in spec.optional_inputs]  # fmt: skip
    loss.__signature__ = inspect.Signature(tensors + own + options)  # type: ignore[attr-defined]
    loss.__name__ = loss.__qualname__ = f"{name}_loss"
    loss.__doc__ = spec.factory.__doc__
    return loss


class _LossFunctions(Mapping):
    """name -> ``<name>_loss`` for every objective in the registry, in catalogue order (read when used, so an
    objective registered later is in it)."""

    def __init__(self):
        self._made: Dict[str, Tuple[ObjectiveSpec, LossFn]] = {}

    def __getitem__(self, name: str) -> LossFn:
        try:
            spec = get_spec(name)
        except UnknownObjectiveError:
            raise KeyError(name) from None
        made = self._made.get(name)
        if made is None or made[0] is not spec:
            made = self._made[name] = (spec, _loss_function(spec))
        return made[1]

    def __iter__(self) -> Iterator[str]:
        return iter(objective_names())

    def __len__(self) -> int:
        return len(objective_names())

    def __repr__(self) -> str:
        return f"OBJECTIVES({', '.join(self)})"


#: name -> ``<name>_loss`` of every registered objective.
OBJECTIVES: Mapping[str, LossFn] = _LossFunctions()


def get_objective(name: str) -> LossFn:
    """The loss function ``<name>_loss`` of objective ``name`` (``OBJECTIVES[name]``)."""
    get_spec(name)
    return OBJECTIVES[name]


def loss_function_name(attr: str) -> Optional[str]:
    """The objective whose loss function is called ``attr`` (``<name>_loss``), or None."""
    name = attr[: -len("_loss")] if attr.endswith("_loss") else None
    return name if name in OBJECTIVES else None


#: ``<name>_loss`` of the objectives registered when this module is imported, as module attributes.
LOSS_FUNCTIONS: Tuple[str, ...] = tuple(f"{name}_loss" for name in OBJECTIVES)
globals().update({f"{name}_loss": OBJECTIVES[name] for name in OBJECTIVES})


def __getattr__(attr: str) -> LossFn:
    """``<name>_loss`` of an objective registered after this module was imported."""
    name = loss_function_name(attr)
    if name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
    return OBJECTIVES[name]


__all__ = [
    "AGG_MODES", "COMMON_KWARGS", "LOSS_FUNCTIONS", "OBJECTIVES", "Objective", "SequenceWeightTerm", "Term",
    "UnknownHyperparameterError", "UnknownObjectiveError", "build_objective", "default_agg_mode", "get_objective",
    "hyperparameters", "kernel_from_spec", "objective_source", "policy_loss", "sequence_kernels", *LOSS_FUNCTIONS,
]  # fmt: skip
