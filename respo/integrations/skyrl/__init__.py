"""respo's objectives as SkyRL policy losses. Importing this module registers them.

    import respo.integrations.skyrl           # registers respo, vespo, topr, reinforce, reshaped, grpo, ...
    trainer.algorithm.policy_loss_type=respo

SkyRL (``skyrl`` 0.3) keeps its policy losses in ``PolicyLossRegistry``
(``skyrl.backends.skyrl_train.utils.ppo_utils``) and its workers call the one named by
``trainer.algorithm.policy_loss_type`` once per micro-batch as

    loss, metrics = fn(log_probs, old_log_probs, advantages, config=AlgorithmConfig,
                       loss_mask=..., rollout_logprobs=...)

with the advantages already scaled by its loss reduction (``apply_loss_reduction_to_advantages_minibatch``:
``token_mean`` divides them by the mini-batch's token count, ``sequence_mean`` row i's by B·T_i,
``seq_mean_token_sum_norm`` by B·max_seq_len, ``prompt_mean`` by the prompts and each prompt's tokens),
and each loss returns the masked *sum* of its per-token losses. A respo loss does the same:

    L = Σ_it m_it · ℓ_it(Â'_it)         (respo's objective with ``loss_agg_mode="token-sum"``)

with Â' SkyRL's scaled advantages. Every objective offered here has a per-token loss that scales with
a positive factor on a row's advantages (ℓ(c·Â) = c·ℓ(Â) for c > 0, which keeps the sign of Â_i that
picks a kernel), so L is respo's objective on the unscaled advantages with the matching aggregation:

    token_mean               token-mean              (N = the mini-batch's valid tokens)
    sequence_mean            seq-mean-token-mean     (the mini-batch's rows)
    seq_mean_token_sum_norm  seq-mean-token-sum-norm (H = max_seq_len)
    prompt_mean              the token mean within each prompt, averaged over prompts (no respo name)

SkyRL sums the micro-batch losses of a mini-batch, so the sum is the mini-batch's loss. The selections
that span the batch they are given (``m2po``; ``tis``/``mis`` with ``batch_normalize``) are made per
micro-batch. ``gmpo`` (a per-sequence loss) is not offered, nor are the objectives whose loss does not scale
with the advantages (``NOT_SCALE_FREE``: ``dro``'s and ``prime_rl``'s penalties on log r carry no Â, ``kl_cov``
and ``clip_cov`` pick tokens by thresholds on Â's covariance with log π), since SkyRL hands the loss only
the scaled Â: their SkyRL losses would not be respo's objective under any reduction. ``luspo`` needs
``loss_reduction=seq_mean_token_sum_norm`` (LUSPO's seq-mean-token-sum over max_seq_len) and refuses
the others, as the verl plug-in refuses another aggregation.

Names. SkyRL 0.3.0 has ``regular``, ``dual_clip``, ``gspo``, ``cispo``, ``sapo``, ``dppo``, ... A name SkyRL
already has is never overridden: respo's is then registered as ``respo_<name>`` (``respo_gspo``,
``respo_cispo``, ``respo_sapo``); ``REGISTERED`` maps each objective to the name it got.

Hyperparameters are set when a loss is registered, not read from SkyRL's config (its ``AlgorithmConfig``
has no field for them): ``register("respo", name="respo_sharp", pos=(3, 0.5, 2))`` registers a second
ReSPO under its own name; without arguments ``register()`` (run on import) registers every objective
with the published defaults. Register in the process that starts SkyRL: when SkyRL starts Ray it copies
the driver's registry to its registry actor (a registration after that goes to the actor directly), and
the workers fetch the losses from there. A loss pickles as its objective's name and hyperparameters, so
respo must be installed where the workers run.

Rollout log-probs. When SkyRL passes ``rollout_logprobs`` (``generator.sampling_params.logprobs=1``),
log ρ = old_log_probs − rollout_logprobs (π_old/π_rollout, the training/inference mismatch and, in
fully-async training, the staleness the rollout saw) is respo's ``rollout_log_ratio``: the sequence
objectives fold it into log W, the ratio objectives weight each token by ρ. ``decoupled`` maps
SkyRL's inputs onto decoupled PPO instead, as AReaL defines it: π_prox = ``old_log_probs`` (the
recomputed policy), π_behaviour = ``rollout_logprobs`` (without them π_behaviour = π_prox, i.e. PPO).
SkyRL's own ``trainer.algorithm.off_policy_correction`` is refused with a respo loss, since it would
correct the same mismatch a second time.

Metrics: ``clip_ratio`` (the share of clipped tokens for a clipped objective, for ``cispo`` of the
tokens whose ratio is outside the range, else 0, as SkyRL's own losses report it) and respo's diagnostics under ``respo/`` (``respo/frac_starved``, ``respo/log_w/p10``,
``respo/corr/mask_frac``, ...; a diagnostic undefined on a micro-batch, NaN, is left out). The
diagnostics that weigh tokens by |Â| see SkyRL's scaled advantages.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import torch
from skyrl.backends.skyrl_train.utils.off_policy_correction_utils import off_policy_correction_enabled
from skyrl.backends.skyrl_train.utils.ppo_utils import PolicyLossRegistry, PolicyLossType

from respo import OBJECTIVES as CORE_OBJECTIVES
from respo import build_objective
from respo.core.registry import get_spec

__all__ = ["OBJECTIVES", "NOT_SCALE_FREE", "REDUCTIONS", "REGISTERED", "RespoPolicyLoss", "register", "skyrl_name"]

#: respo's objectives offered to SkyRL: those whose per-sequence loss scales with the advantages (``scale_free``), but
#: the per-sequence ``gmpo``.
OBJECTIVES = tuple(name for name in CORE_OBJECTIVES if get_spec(name).scale_free and not build_objective(name).per_sequence)
#: respo's objectives SkyRL's pre-scaled advantages cannot carry (a term not multiplied by Â, or a selection by a
#: threshold on Â's scale: ``dro``, ``prime_rl``, ``kl_cov``, ``clip_cov``).
NOT_SCALE_FREE = tuple(name for name in CORE_OBJECTIVES if not get_spec(name).scale_free)
#: SkyRL's loss reduction -> respo's aggregation of the same loss (``prompt_mean`` has no respo name).
REDUCTIONS = {"token_mean": "token-mean", "sequence_mean": "seq-mean-token-mean",
              "seq_mean_token_sum_norm": "seq-mean-token-sum-norm", "prompt_mean": None}  # fmt: skip
LUSPO_REDUCTION = "seq_mean_token_sum_norm"
#: objective (or the name given to ``register``) -> the name it has in SkyRL's registry
REGISTERED: Dict[str, str] = {}


def _get(config: Any, key: str, default: Any = None) -> Any:
    if config is None:
        return default
    value = config.get(key, None) if isinstance(config, dict) else getattr(config, key, None)
    return default if value is None else value


def _skyrl_correction_enabled(config: Any) -> bool:
    """Whether SkyRL's own ``off_policy_correction`` (TIS or a mask) is switched on in ``config`` (SkyRL's test)."""
    opc = _get(config, "off_policy_correction")
    return opc is not None and off_policy_correction_enabled(opc)


def _float_metrics(metrics: Dict[str, torch.Tensor]) -> Dict[str, float]:
    """Detached 0-d tensors as Python floats in one device sync, NaN (undefined on this micro-batch) left out."""
    names = list(metrics)
    if not names:
        return {}
    values = torch.stack([metrics[k].detach().to(torch.float64) for k in names]).tolist()
    return {k: v for k, v in zip(names, values) if math.isfinite(v)}


class RespoPolicyLoss:
    """One respo objective as a SkyRL policy loss (SkyRL's ``PolicyLossRegistry`` signature).

    Pickles as the objective's name and hyperparameters (what SkyRL ships to its registry actor and
    workers); the objective is built, and its hyperparameters checked, on construction and on unpickling.
    """

    def __init__(self, objective: str, **hparams: Any):
        if objective in NOT_SCALE_FREE:
            raise ValueError(f"respo objective {objective!r} cannot run in SkyRL: its loss does not scale with the "
                             f"advantages, which SkyRL has already scaled by its loss reduction")
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown respo objective for SkyRL {objective!r}; known: {', '.join(OBJECTIVES)}")
        self.objective, self.hparams = objective, dict(hparams)
        self._built = build_objective(objective, loss_agg_mode="token-sum", **self.hparams)

    def __getstate__(self) -> Dict[str, Any]:
        return {"objective": self.objective, "hparams": self.hparams}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(state["objective"], **state["hparams"])

    def __repr__(self) -> str:
        return f"RespoPolicyLoss({self.objective!r}, **{self.hparams!r})"

    def __call__(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        config: Any = None,
        loss_mask: Optional[torch.Tensor] = None,
        rollout_logprobs: Optional[torch.Tensor] = None,
    ) -> Tuple[torch.Tensor, Dict[str, float]]:
        """Σ m·ℓ of the objective on SkyRL's (already reduction-scaled) advantages, and float metrics.

        Args (SkyRL's policy-loss signature): log_probs (B, T) log π_θ with grad; old_log_probs (B, T);
        advantages (B, T) scaled by SkyRL's loss reduction; config SkyRL's ``AlgorithmConfig`` (its
        ``loss_reduction`` and ``off_policy_correction`` are read); loss_mask (B, T) 0/1 or None (all
        tokens); rollout_logprobs (B, T) the generator's log-probs or None.
        """
        if _skyrl_correction_enabled(config):
            raise ValueError(f"SkyRL's trainer.algorithm.off_policy_correction is on with respo's loss "
                             f"{self.objective!r}, which corrects with the rollout log-probs itself: turn "
                             "off_policy_correction off (keep generator.sampling_params.logprobs=1)")  # fmt: skip
        reduction = _get(config, "loss_reduction", "token_mean")
        if self.objective == "luspo" and reduction != LUSPO_REDUCTION:
            raise ValueError(f"luspo needs trainer.algorithm.loss_reduction={LUSPO_REDUCTION} "
                             f"(LUSPO's seq-mean-token-sum over max_seq_len), got {reduction!r}")  # fmt: skip
        mask = torch.ones_like(log_probs) if loss_mask is None else loss_mask
        if self.objective == "decoupled":
            behaviour = old_log_probs if rollout_logprobs is None else rollout_logprobs
            loss, metrics = self._built(log_probs, behaviour, advantages, mask, prox_logp=old_log_probs)
        else:
            log_rho = None if rollout_logprobs is None else (old_log_probs - rollout_logprobs).detach()
            loss, metrics = self._built(log_probs, old_log_probs, advantages, mask, rollout_log_ratio=log_rho)
        clip = metrics.get("clipfrac")
        if clip is None and "clipfrac_high" in metrics and "clipfrac_low" in metrics:  # cispo: r outside the range
            clip = metrics["clipfrac_high"] + metrics["clipfrac_low"]
        out: Dict[str, float] = {"clip_ratio": 0.0 if clip is None else float(clip)}
        out.update(_float_metrics({f"respo/{k}": v for k, v in metrics.items() if k != "loss"}))
        return loss, out


def _taken() -> set:
    """Names SkyRL has or will have (its built-ins are re-added by ``repopulate_registry``)."""
    return set(PolicyLossRegistry.list_available()) | {t.value for t in PolicyLossType}


def skyrl_name(objective: str) -> str:
    """The registry name respo's ``objective`` gets: its own, or ``respo_<name>`` where SkyRL has the name."""
    builtin = {t.value for t in PolicyLossType}
    return f"respo_{objective}" if objective in builtin else objective


def register(objective: Optional[str] = None, *, name: Optional[str] = None, **hparams: Any) -> Dict[str, str]:
    """Register respo's losses in SkyRL's ``PolicyLossRegistry`` (idempotent); returns ``REGISTERED``.

    Without arguments: every objective in ``OBJECTIVES`` with its published defaults, each under
    ``skyrl_name(objective)``. With ``objective`` (and optionally ``name`` and hyperparameters): that
    objective alone, under ``name`` (default ``skyrl_name(objective)``).

    Raises:
      ValueError: an unknown objective or hyperparameter, a bad value, or a ``name`` SkyRL (or another
        registration) already uses for a different loss.
    """
    if objective is None:
        if name is not None or hparams:
            raise ValueError("register(): name and hyperparameters need an objective")
        for obj in OBJECTIVES:
            register(obj)
        return REGISTERED
    loss = RespoPolicyLoss(objective, **hparams)
    target = skyrl_name(objective) if name is None else str(name)
    if target in _taken():
        existing = PolicyLossRegistry.get(target) if target in PolicyLossRegistry.list_available() else None
        if isinstance(existing, RespoPolicyLoss) and (existing.objective, existing.hparams) == (objective, loss.hparams):
            REGISTERED[name or objective] = target
            return REGISTERED
        raise ValueError(f"SkyRL already has a policy loss named {target!r}; register respo's {objective!r} "
                         "under another name")  # fmt: skip
    PolicyLossRegistry.register(target, loss)
    REGISTERED[name or objective] = target
    return REGISTERED


register()
