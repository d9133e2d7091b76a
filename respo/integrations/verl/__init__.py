"""respo's objectives as verl policy losses. Importing this module registers them.

    import respo.integrations.verl          # registers the losses listed below
    actor_rollout_ref.actor.policy_loss.loss_mode=respo

The losses it registers, with their defaults (``python scripts/catalogue.py`` writes the list from the registry):

    respo          pos=(2.0, 0.5, 2.0), neg=(1.0, 0.5, 2.0); token-mean
    vespo          pos=(2.0, 3.0), neg=(3.0, 2.0); token-mean
    reshaped       pos_kernel='respo(2,0.5,2)', neg_kernel='respo(1,0.5,2)'; token-mean
    topr           no hyperparameters; token-mean
    reinforce      no hyperparameters; token-mean
    m2po           tau=0.04; token-mean
    opsm           delta=0.5, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=None; token-mean
    luspo          clip_ratio_low=0.2, clip_ratio_high=0.2; seq-mean-token-sum

Every sequence-weight loss (``OBJECTIVES``: the core's objectives made of two kernels) is REINFORCE-shaped
with a detached sequence coefficient computed by respo's core, and aggregated by verl's own ``agg_loss``
with verl's global batch info (so verl's data-parallel and micro-batch normalisation applies unchanged):

    log W_i = clamp( Σ_t m_it (logp_it − old_logp_it) + Σ_t m_it log ρ_it, −20, 20 )
    φ_i     = pos_kernel(log W_i) if Â_i ≥ 0 else neg_kernel(log W_i)          (detached)
    L       = verl.agg_loss( −φ_i · Â_it · logp_it , mask, loss_agg_mode, **global_batch_info )

with Â_i the masked token mean of verl's (B, T) advantages and the kernels of each objective
(``sequence_kernels``; for ``reshaped`` any two named in the config, the core's ``kernel_from_spec``:
``"respo(2,0.5,2)"``, ``"vespo(3,2)"``, ``"unit"``, ``"truncated(1)"``).

verl 0.9.1 has none of these names. A name verl already has is never overridden: ours is then
registered as ``respo_<name>`` (``REGISTERED`` maps our objective to the name it got).

Rollout correction. verl's ``rollout_is_weights`` (training/inference mismatch, π_old/π_rollout,
from ``algorithm.rollout_correction.rollout_is``) are folded into log W in log space:
log ρ_it = log(rollout_is_weights_it). verl broadcasts a *sequence*-level weight to every token,
so for ``rollout_is=sequence`` the weight is folded once per sequence (log ρ_i = log w_i), not
T_i times. ``rollout_is_level`` says which: ``token``, ``sequence``, or ``auto`` (default: a row
whose valid weights are all equal is a sequence weight; where this is ambiguous, e.g. all weights
1, both readings give the same log W except for rows whose every token is truncated to the same
threshold). Zero weights (IcePop rejections) remove their tokens from log W and the loss, as
verl's multiplication by 0 does (the aggregation normaliser still counts them, as in verl).

Hyperparameters, without patching verl's classes. verl builds the actor config with Hydra's
``instantiate`` from the ``_target_`` of each node, so point ``policy_loss`` at
``RespoPolicyLossConfig`` (a subclass of verl's ``PolicyLossConfig`` with respo's fields) and
add the fields with Hydra's ``+``::

    actor_rollout_ref.actor.policy_loss._target_=respo.integrations.verl.RespoPolicyLossConfig
    +actor_rollout_ref.actor.policy_loss.respo_pos=[2.0,0.5,2.0]
    +actor_rollout_ref.actor.policy_loss.respo_neg=[1.0,0.5,2.0]

Kernel specs for ``reshaped`` must be quoted, or Hydra parses them as a function call:
``+actor_rollout_ref.actor.policy_loss.reshaped_neg='vespo(3,2)'``.

Without the ``_target_`` the loss runs with the published defaults (extra keys on verl's own
``PolicyLossConfig`` would be rejected by it). Setting the ``_target_`` also makes every worker
that builds the actor config import this module, i.e. register the losses where they run.

M2PO, which verl 0.9.1 lacks, is registered as ``loss_mode=m2po`` (``m2po_policy_loss``): the core's
``corrections.m2po`` on log w = logp − old_logp + log ρ, aggregated by verl's ``agg_loss``:

    ℓ_it = −M_it·r_it·Â_it,  r = π_θ/π_old·ρ,  M drops the tokens with the largest (log r)² until the mean
    (log r)² of the kept tokens is below τ (``+actor_rollout_ref.actor.policy_loss.m2po_tau``, default 0.04)

verl calls a policy loss once per micro-batch, so the M2PO selection is per micro-batch (as in AReaL's
loss function). To select over the whole update, make the micro-batch the mini-batch: with
``use_dynamic_bsz=False``, ``ppo_micro_batch_size_per_gpu`` equal to the mini-batch per GPU; with
``use_dynamic_bsz=True`` (``examples/verl/run_paper.sh``), ``ppo_max_token_len_per_gpu`` at least the
mini-batch's tokens per GPU, since dynamic batching packs micro-batches by that token budget.

OPSM (DeepSeek-V3.2's off-policy sequence masking), which verl 0.9.1 also lacks, is registered as
``loss_mode=opsm`` (``opsm_policy_loss``): verl's own PPO loss (``compute_policy_loss_vanilla``, with the
actor's ``clip_ratio_low``/``clip_ratio_high``/``clip_ratio_c``) with each row's weight multiplied by the
core's ``opsm_keep``: K_i = 0 for Â_i < 0 whose mean per-token KL_i = mean_t(log π_old − log π_θ − log ρ)
exceeds δ (``+actor_rollout_ref.actor.policy_loss.opsm_delta``, default 0.5). verl's rejection sampling
(``rollout_rs``) rejects by KL whatever the advantage sign, so it is not OPSM.

LUSPO (TRL's length-unbiased GSPO), which verl 0.9.1 lacks, is registered as ``loss_mode=luspo``
(``luspo_policy_loss``): the core's ``luspo`` term with the actor's ``clip_ratio_low``/``clip_ratio_high``,
aggregated by verl's ``agg_loss`` in ``seq-mean-token-sum`` (set ``actor.loss_agg_mode=seq-mean-token-sum``;
another mode is refused, as it would not be LUSPO).

The other staleness corrections verl ships itself (``algorithm.rollout_correction``: TIS, MIS/rejection,
IcePop, decoupled mode, the KL-estimator rejection ``rollout_rs`` and ``rollout_is_batch_normalize``),
DPPO (``loss_mode=dppo_tv|dppo_kl``) and its other loss modes (``gpg``, ``dro``, ``clip_cov``, ``kl_cov``,
``bypass_mode``), which respo's ``gpg``, ``dro``, ``clip_cov``, ``kl_cov``, ``grpo``/``klrs`` reproduce; docs/method.md
maps respo's names onto verl's settings.

Metrics: verl's keys (``actor/ppo_kl``, ``actor/pg_clipfrac``, ``actor/pg_clipfrac_lower``; verl
adds ``actor/pg_loss``) and the core's weight diagnostics under ``respo/`` (``respo/log_w/p10``,
``respo/frac_pos_low_w``, ``respo/pos_low_w_mass_share``, ``respo/frac_starved``, ...); a
diagnostic that is undefined on a micro-batch (NaN, e.g. no positive response) is left out.

References:
    Chen, Ban, Hsieh (2026), ReSPO, arXiv 2609.35433.
    verl ``trainer/ppo/core_algos.py`` (``register_policy_loss``, ``agg_loss``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, agg_loss, compute_policy_loss_vanilla, register_policy_loss
from verl.workers.config import PolicyLossConfig

from respo import OBJECTIVES as CORE_OBJECTIVES
from respo import (
    RESPO_NEG,
    RESPO_POS,
    VESPO_NEG,
    VESPO_POS,
    build_objective,
    fold_rollout_log_ratio,
    hyperparameters,
    sequence_kernels,
    sequence_log_ratio,
    two_branch,
    weight_diagnostics,
)
from respo.core import corrections
from respo.core.checks import check_inputs
from respo.core.kernels import Kernel
from respo.core.ratios import LOG_W_CLAMP, ROLLOUT_LEVELS, token_log_ratio

__all__ = [
    "OBJECTIVES",
    "REGISTERED",
    "RespoPolicyLossConfig",
    "fold_rollout_is_weights",
    "kernels_for",
    "luspo_policy_loss",
    "m2po_policy_loss",
    "opsm_policy_loss",
    "register",
    "reshaped_policy_loss",
    "verl_name",
]

#: respo's REINFORCE-shaped objectives offered to verl (verl 0.9.1 has none of them): the core's
#: objectives made of two kernels.
OBJECTIVES = tuple(name for name in CORE_OBJECTIVES if build_objective(name).kernels is not None)
#: staleness corrections and objectives verl 0.9.1 does not ship (it has TIS, MIS, IcePop, decoupled PPO, the
#: KL-estimator rejection (``rollout_rs``), batch-normalised IS weights and DPPO (``dppo_tv``, ``dppo_kl``) itself).
CORRECTIONS = ("m2po", "opsm", "luspo")
M2PO_TAU = hyperparameters("m2po")["tau"]  # AReaL's m2_threshold
OPSM_DELTA = hyperparameters("opsm")["delta"]  # TRL's documented off_policy_mask_threshold example
ROLLOUT_IS_LEVELS = ROLLOUT_LEVELS


@dataclass
class RespoPolicyLossConfig(PolicyLossConfig):
    """verl's ``PolicyLossConfig`` plus respo's kernel hyperparameters (all optional).

    Args:
        respo_pos, respo_neg: ReSPO (α, β, λ) for Â ≥ 0 / Â < 0; α > 0, 0 < β ≤ 1, λ ≥ 0.
        vespo_pos, vespo_neg: VESPO (k, λ) for Â ≥ 0 / Â < 0.
        reshaped_pos, reshaped_neg: kernel specs for ``loss_mode=reshaped`` (``respo.kernel_from_spec``:
            ``respo(a,b,l)``, ``vespo(k,l)``, ``unit``, ``truncated(max_w)``); default = respo's kernels.
        log_w_clamp: log W is clamped to [−c, c] before any kernel.
        rollout_is_level: how ``rollout_is_weights`` are folded: ``auto``, ``token`` or ``sequence``
            (set it to ``algorithm.rollout_correction.rollout_is``; None means ``auto``).
        m2po_tau: M2PO's second-moment threshold τ > 0 (``loss_mode=m2po``).
        opsm_delta: OPSM's KL threshold δ ≥ 0 (``loss_mode=opsm``).
    """

    respo_pos: list = field(default_factory=lambda: list(RESPO_POS))
    respo_neg: list = field(default_factory=lambda: list(RESPO_NEG))
    vespo_pos: list = field(default_factory=lambda: list(VESPO_POS))
    vespo_neg: list = field(default_factory=lambda: list(VESPO_NEG))
    reshaped_pos: str = hyperparameters("reshaped")["pos_kernel"]
    reshaped_neg: str = hyperparameters("reshaped")["neg_kernel"]
    log_w_clamp: float = LOG_W_CLAMP
    rollout_is_level: Optional[str] = "auto"
    m2po_tau: float = M2PO_TAU
    opsm_delta: float = OPSM_DELTA

    def __post_init__(self):
        # Fail at config time (in every worker), not at the first loss call.
        for objective in OBJECTIVES:
            build_objective(objective, **_hparams(objective, self))
        if self.rollout_is_level is not None and self.rollout_is_level not in ROLLOUT_IS_LEVELS:
            raise ValueError(f"rollout_is_level must be one of {ROLLOUT_IS_LEVELS} or None, got {self.rollout_is_level!r}")
        if not (math.isfinite(float(self.log_w_clamp)) and float(self.log_w_clamp) > 0):
            raise ValueError(f"log_w_clamp must be a positive number, got {self.log_w_clamp!r}")
        corrections.check_positive("m2po_tau", self.m2po_tau, what="m2po")
        corrections.check_positive("opsm_delta", self.opsm_delta, what="opsm", allow_zero=True)


def _floats(values: Sequence[Any], n: int, name: str) -> tuple:
    values = tuple(float(v) for v in values)
    if len(values) != n:
        raise ValueError(f"{name} needs {n} numbers, got {len(values)}: {values}")
    return values


def _get(policy_loss: Any, key: str, default: Any) -> Any:
    """A field of verl's policy-loss config, or ``default`` when the config lacks it (plain verl class)."""
    if policy_loss is None:
        return default
    value = policy_loss.get(key, None) if hasattr(policy_loss, "get") else getattr(policy_loss, key, None)
    return default if value is None else value


def _hparams(objective: str, policy_loss: Any) -> dict[str, Any]:
    """The core hyperparameters of ``objective`` read from verl's fields ``<objective>_pos``/``_neg``.

    The core names them (``pos``/``neg``, ``pos_kernel``/``neg_kernel``) and gives the defaults;
    a field missing from ``policy_loss`` (or None) takes the core's default.
    """
    out: dict[str, Any] = {}
    for key, default in hyperparameters(objective).items():
        name = f"{objective}_{key.removesuffix('_kernel')}"  # pos -> respo_pos, pos_kernel -> reshaped_pos
        value = _get(policy_loss, name, default)
        out[key] = value if isinstance(default, str) else _floats(value, len(default), name)
    return out


def kernels_for(objective: str, policy_loss: Any = None) -> tuple[Kernel, Kernel]:
    """(pos_kernel, neg_kernel) of ``objective`` with the hyperparameters in ``policy_loss`` (or defaults).

    The objective -> kernels mapping is the core's ``sequence_kernels``; this only reads verl's
    config fields (``respo_pos``, ``vespo_neg``, ``reshaped_pos``, ...) into its hyperparameters.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown respo objective {objective!r}; known: {', '.join(OBJECTIVES)}")
    return sequence_kernels(objective, **_hparams(objective, policy_loss))


def fold_rollout_is_weights(
    rollout_is_weights: Optional[torch.Tensor], mask: torch.Tensor, level: Optional[str] = "auto"
) -> tuple[Optional[torch.Tensor], torch.Tensor]:
    """verl's rollout-correction weights as per-token log ρ whose masked row sum is the sequence's log ρ.

        token:     log ρ_it = log w_it                       Σ_t m_it log ρ_it = Σ_t log w_it
        sequence:  log ρ_it = log w_it / T_i                 Σ_t m_it log ρ_it = log w_i
                   (verl broadcasts one weight w_i to all T_i valid tokens)
        auto:      ``sequence`` for rows whose valid weights are all equal, ``token`` otherwise

    Tokens with w = 0 (IcePop rejections) leave the mask, as verl's ``loss * 0`` removes them. The
    core's ``fold_rollout_log_ratio`` does the folding.

    Args:
        rollout_is_weights: (B, T) non-negative weights, or None.
        mask: (B, T) 0/1 (bool or float) response mask.
        level: ``auto`` (None means auto), ``token`` or ``sequence``.

    Returns:
        (log_rho (B, T) or None, mask (B, T) in the dtype of the weights, or unchanged when None).
    """
    if rollout_is_weights is None:
        return None, mask
    level = "auto" if level is None else level
    if level not in ROLLOUT_IS_LEVELS:
        raise ValueError(f"rollout_is_level must be one of {ROLLOUT_IS_LEVELS}, got {level!r}")
    return fold_rollout_log_ratio(rollout_is_weights, mask, level=level, name="rollout_is_weights")


def _float_metrics(metrics: dict[str, torch.Tensor]) -> dict[str, float]:
    """Detached 0-d tensors as Python floats in one device sync, NaN (undefined on this micro-batch) left out."""
    names = list(metrics)
    values = torch.stack([metrics[k].detach().to(torch.float64) for k in names]).tolist()
    return {k: v for k, v in zip(names, values) if math.isfinite(v)}


def reshaped_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
    *,
    objective: str = "respo",
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl policy loss: −agg[φ_i · Â_it · logp_it] with φ_i the detached two-branch coefficient.

    Args (verl's ``PolicyLossFn`` signature):
        old_log_prob: (B, T) log π_old.
        log_prob: (B, T) log π_θ (with grad).
        advantages: (B, T) token advantages (constant per row for GRPO).
        response_mask: (B, T) bool/0-1 mask.
        loss_agg_mode: verl's aggregation mode.
        config: verl ``ActorConfig``; its ``policy_loss`` may carry respo's fields and its
            ``global_batch_info`` (dp_size, batch_num_tokens, global_batch_size, ...) goes to ``agg_loss``.
        rollout_is_weights: (B, T) rollout-correction weights or None (folded into log W).
        objective: which kernels (``OBJECTIVES``).

    Returns:
        (loss, metrics) as verl's policy losses return them (metrics are Python floats).
    """
    policy_loss = getattr(config, "policy_loss", None)
    pos_kernel, neg_kernel = kernels_for(objective, policy_loss)
    clamp = float(_get(policy_loss, "log_w_clamp", LOG_W_CLAMP))
    level = _get(policy_loss, "rollout_is_level", "auto")

    log_rho, keep = fold_rollout_is_weights(rollout_is_weights, response_mask, level)
    m = keep.to(log_prob.dtype)  # (B, T) tokens in the objective (IcePop rejections removed)
    n_tok = m.sum(dim=-1)  # (B,)
    adv_seq = (advantages.detach() * m).sum(dim=-1) / n_tok.clamp(min=1)  # (B,)
    log_w = sequence_log_ratio(log_prob.detach(), old_log_prob.detach(), m, rollout_log_ratio=log_rho, clamp=clamp)  # (B,)
    with torch.no_grad():
        phi = two_branch(log_w, adv_seq, pos_kernel, neg_kernel)  # (B,)

    pg_losses = -phi.unsqueeze(-1) * advantages * log_prob  # (B, T)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * m  # rejected tokens: loss · 0 as in verl; the normaliser keeps them
    batch_info = dict(getattr(config, "global_batch_info", None) or {})
    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **batch_info)

    log_r = torch.where(m > 0, log_prob.detach() - old_log_prob.detach(), torch.zeros_like(m))  # (B, T)
    diag = weight_diagnostics(log_w, phi, adv_seq, m, token_log_ratio=log_r)
    ppo_kl = -log_r.sum() / m.sum().clamp(min=1)
    metrics: dict[str, Any] = {"actor/pg_clipfrac": 0.0, "actor/pg_clipfrac_lower": 0.0}
    metrics.update(_float_metrics({"actor/ppo_kl": ppo_kl, **{f"respo/{k}": v for k, v in diag.items()}}))
    return pg_loss, metrics


def _correction_inputs(old_log_prob, log_prob, advantages, response_mask, config, rollout_is_weights):
    """What the correction losses share: (policy_loss config, log ρ (B, T) or None, the mask m (B, T) without
    the tokens whose rollout weight is 0, the sequence advantage (B,), log w = logp − old_logp + log ρ (B, T),
    detached)."""
    policy_loss = getattr(config, "policy_loss", None)
    log_rho, keep = fold_rollout_is_weights(rollout_is_weights, response_mask, _get(policy_loss, "rollout_is_level", "auto"))
    m = keep.to(log_prob.dtype)  # (B, T)
    adv_seq = (advantages.detach() * m).sum(dim=-1) / m.sum(dim=-1).clamp(min=1)  # (B,)
    log_w = corrections.token_log_weight(log_prob, old_log_prob, m, log_rho)  # (B, T)
    return policy_loss, log_rho, m, adv_seq, log_w


def m2po_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl policy loss for M2PO: agg(−M·r·Â), the core's ``corrections.m2po`` (see the module docstring).

    ``rollout_is_weights`` fold into log w like the other respo losses (``rollout_is_level``); tokens
    with weight 0 leave the selection and the loss (verl's normaliser still counts them).
    Metrics: ``actor/ppo_kl`` and the core's correction diagnostics under ``respo/`` (``respo/corr/mask_frac``,
    ``respo/corr/mask_frac/pos``, ``respo/corr/silenced_adv_share/pos``, ``respo/chi2_token``, ...).
    """
    policy_loss, log_rho, m, adv_seq, log_w = _correction_inputs(old_log_prob, log_prob, advantages, response_mask,
                                                                 config, rollout_is_weights)  # fmt: skip
    tau = corrections.check_positive("m2po_tau", _get(policy_loss, "m2po_tau", M2PO_TAU), what="m2po")
    corr = corrections.m2po(log_prob, old_log_prob.detach(), advantages.detach(), m, tau=tau, log_rho=log_rho)
    batch_info = dict(getattr(config, "global_batch_info", None) or {})
    pg_loss = agg_loss(loss_mat=corr.values * m, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **batch_info)
    diag = corrections.correction_diagnostics(corr, log_w, advantages.detach(), adv_seq, m)
    diag.update(corrections.chi2(log_w, m))
    ppo_kl = -corrections.token_log_weight(log_prob, old_log_prob, m).sum() / m.sum().clamp(min=1)
    metrics: dict[str, Any] = {"actor/pg_clipfrac": 0.0, "actor/pg_clipfrac_lower": 0.0}
    metrics.update(_float_metrics({"actor/ppo_kl": ppo_kl, **{f"respo/{k}": v for k, v in diag.items()}}))
    return pg_loss, metrics


def opsm_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl policy loss for OPSM: verl's ``compute_policy_loss_vanilla`` with the row weights K_i·ρ_it.

    K_i is the core's ``opsm_keep`` (see the module docstring) on log w = logp − old_logp + log ρ, ρ being
    ``rollout_is_weights`` folded per ``rollout_is_level``; verl's loss then multiplies the per-token
    PPO losses by K_i·ρ_it as it multiplies them by ρ_it alone (its aggregation, clip settings and metrics).
    Metrics: verl's, and the core's correction diagnostics under ``respo/`` (``respo/corr/mask_frac``:
    the share of rows masked, ``/neg``, ``respo/corr/silenced_adv_share/neg``, ``respo/chi2_seq``, ...).
    """
    policy_loss, log_rho, m, adv_seq, log_w = _correction_inputs(old_log_prob, log_prob, advantages, response_mask,
                                                                 config, rollout_is_weights)  # fmt: skip
    delta = corrections.check_positive("opsm_delta", _get(policy_loss, "opsm_delta", OPSM_DELTA), what="opsm",
                                       allow_zero=True)  # fmt: skip
    with torch.no_grad():  # the core's correction: its silenced rows are the mask, and its diagnostics
        corr = corrections.opsm(log_prob.detach(), old_log_prob.detach(), advantages.detach(), adv_seq, m, delta=delta,
                                log_rho=log_rho)  # fmt: skip
        diag = corrections.correction_diagnostics(corr, log_w, advantages.detach(), adv_seq, m)
        diag.update(corrections.chi2(log_w, m))
    # K_i (B, 1); a row with no token in m contributes nothing to verl's loss whatever its weight
    keep = (~corr.silenced.any(dim=-1, keepdim=True)).to(log_prob.dtype)
    weights = keep.expand_as(m) if rollout_is_weights is None else keep * rollout_is_weights
    pg_loss, metrics = compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
                                                   config, weights)  # fmt: skip
    metrics = dict(metrics)
    # the core's clip fractions (at its default ε) are left out: verl's own pg_clipfrac describes this loss
    metrics.update(_float_metrics({f"respo/{k}": v for k, v in diag.items() if not k.startswith("clip")}))
    return pg_loss, metrics


LUSPO_AGG = "seq-mean-token-sum"


def luspo_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl policy loss for LUSPO: the core's ``luspo`` term (GSPO's clip of the length-normalised sequence
    ratio, s not clamped) with the actor's ``clip_ratio_low``/``clip_ratio_high``, times ``rollout_is_weights``
    as verl weighs its own losses, aggregated by verl's ``agg_loss`` in ``seq-mean-token-sum``: each
    sequence's loss scaled by its length. Another ``actor.loss_agg_mode`` is refused (it would not be LUSPO).
    Metrics: ``actor/pg_clipfrac`` (the share of tokens whose sequence ratio was clipped), ``actor/ppo_kl``.
    """
    if loss_agg_mode != LUSPO_AGG:
        raise ValueError(f"loss_mode=luspo aggregates {LUSPO_AGG!r} (the length-unbiased sum per sequence); set "
                         f"actor_rollout_ref.actor.loss_agg_mode={LUSPO_AGG}, got {loss_agg_mode!r}")  # fmt: skip
    low = _get(config, "clip_ratio_low", None)
    high = _get(config, "clip_ratio_high", None)
    clip = _get(config, "clip_ratio", hyperparameters("luspo")["clip_ratio_low"])
    objective = build_objective("luspo", clip_ratio_low=clip if low is None else low, clip_ratio_high=clip if high is None else high)
    m = response_mask.to(log_prob.dtype)
    inputs = check_inputs(log_prob, old_log_prob, advantages, m)
    term = objective.term(inputs, token_log_ratio(inputs.logp, inputs.old_logp), None)
    pg_losses = term.values if rollout_is_weights is None else term.values * rollout_is_weights
    batch_info = dict(getattr(config, "global_batch_info", None) or {})
    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **batch_info)
    log_r = corrections.token_log_weight(log_prob, old_log_prob, m)
    metrics = {"actor/pg_clipfrac": term.metrics["clipfrac"], "actor/pg_clipfrac_lower": term.metrics["clipfrac_low"],
               "actor/ppo_kl": -log_r.sum() / m.sum().clamp(min=1)}  # fmt: skip
    return pg_loss, _float_metrics(metrics)


def verl_name(objective: str) -> str:
    """The registry name our ``objective`` gets: itself, or ``respo_<objective>`` if verl has that name."""
    fn = POLICY_LOSS_REGISTRY.get(objective)
    if fn is None or getattr(fn, "__respo_objective__", None) == objective:
        return objective
    return f"respo_{objective}"


#: objective -> the verl registry name it was registered under (filled by ``register``).
REGISTERED: dict[str, str] = {}


def register() -> dict[str, str]:
    """Register every objective in ``OBJECTIVES`` and ``CORRECTIONS`` with verl (idempotent); returns ``REGISTERED``."""
    for objective in OBJECTIVES + CORRECTIONS:
        name = verl_name(objective)
        if objective in CORRECTIONS:
            base = {"m2po": m2po_policy_loss, "opsm": opsm_policy_loss, "luspo": luspo_policy_loss}[objective]
            fn = functools.partial(base)
            functools.update_wrapper(fn, base)
        else:
            fn = functools.partial(reshaped_policy_loss, objective=objective)
            functools.update_wrapper(fn, reshaped_policy_loss)
        fn.__respo_objective__ = objective  # type: ignore[attr-defined]
        register_policy_loss(name)(fn)
        REGISTERED[objective] = name
    return REGISTERED


register()
