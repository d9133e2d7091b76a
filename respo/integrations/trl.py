"""respo's objectives inside TRL: ``GRPOTrainer`` with ``loss_type="respo"``.

    from respo.integrations.trl import RespoGRPOConfig, RespoGRPOTrainer

    args = RespoGRPOConfig(output_dir="out", loss_type="respo", respo_pos=[2, 0.5, 2], respo_neg=[1, 0.5, 2])
    trainer = RespoGRPOTrainer(model="path/to/model", reward_funcs=reward, args=args, train_dataset=ds)
    trainer.train()

The smallest hook TRL 1.16 allows: ``_compute_loss`` is overridden only for respo's loss types
and hands every other ``loss_type`` (``grpo``, ``dapo``, ``vespo``, ...) to TRL unchanged. For
respo's types it recomputes the per-token log-probs with TRL's own
``_get_per_token_logps_and_entropies`` and calls the core's ``policy_loss``:

    loss_type             core objective
    respo, gspo, gmpo,    the same name (TRL has no such loss_type)
    topr, reinforce,
    reshaped
    respo_<name>          <name>, for the names TRL also has (respo_vespo, respo_grpo,
                          respo_cispo, respo_sapo, respo_luspo), so TRL's own versions stay reachable

The staleness corrections and objectives TRL lacks run the same way: ``loss_type="m2po"`` (M2PO),
``"decoupled"`` (decoupled PPO; one optimizer step sees one accumulation window, so the proximal policy
is the current one and ``prox_logp`` is left to the core's default; AReaL's ``prox_method="loglinear"``
needs token versions TRL does not record and is refused), ``"dppo_tv"``/``"dppo_kl"`` (DPPO), ``"klrs"``
(KL-estimator rejection on any base objective, ``respo_hparams={"base": ..., "base_kwargs": ...}``), and
``"tis"``/``"mis"`` with ``{"batch_normalize": true}`` (normalised within each micro-batch: the objective
is called once per micro-batch), and the other frameworks' rules (``"gpg"``, ``"dro"``, ``"clip_cov"``,
``"kl_cov"``, ``"prime_rl"``, SkyRL's ``"geo_mask"``/``"product_mask"``/``"outlier_mask"``, ``"two_sided"``, which
reproduces TRL's own ``delta``). TRL has TIS and MIS itself (``vllm_importance_sampling_mode``, on
π_old/π_vLLM), OPSM (``off_policy_mask_threshold``, which respo's ``opsm`` reproduces) and LUSPO
(``loss_type="luspo"``, which respo's ``respo_luspo`` reproduces: tests/integrations/test_integration_trl.py);
docs/method.md maps them.

Normalisation follows TRL's ``dapo``: ``token-mean`` divides by the token count of the whole
accumulation window (``num_items_in_batch / num_processes · grad_accum / steps_per_generation``),
so gradient accumulation and data parallelism give the full-batch loss. Other modes
(``respo_loss_agg_mode``): ``seq-mean-*`` divide by the window's sequence count, and
``seq-mean-token-sum-norm`` by ``max_completion_length``.

vLLM importance-sampling correction (``vllm_importance_sampling_correction``, on by default when
vLLM generates) is kept: TRL's ``importance_sampling_ratio`` ρ = π_old/π_vLLM is folded into the
core's ``rollout_log_ratio`` in log space. Token modes give log ρ_it per token (log W gains
Σ_t log ρ_it); sequence modes give one ρ_i per row, spread as log ρ_i / T_i over its tokens so
log W gains exactly log ρ_i. Zero ratios (``*_mask`` modes reject out-of-band tokens/sequences)
remove those tokens from the objective, as TRL's multiplication by 0 does. For the ratio
objectives (gspo, gmpo, respo_grpo, ...) the core multiplies the per-token loss by ρ, as TRL does.

Logged: TRL's usual metrics plus the core's diagnostics under ``respo/`` (``respo/log_w/p10``,
``respo/frac_pos_low_w``, ``respo/pos_low_w_mass_share``, ``respo/frac_starved``, ``respo/ess_phi``,
``respo/phi/pos_mean``, ...), each the mean over processes of the per-micro-batch value.

Not supported with respo's loss types (a clear error at construction): ``top_entropy_quantile``
< 1, ``off_policy_mask_threshold``, the entropy bonus (``entropy_coef``/adaptive entropy) and
``use_liger_kernel``. ``importance_sampling_level`` does not apply (each objective defines its
ratio). The KL penalty (``beta``) and the MoE router aux loss work as in TRL.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch
from trl import GRPOConfig, GRPOTrainer

import respo

__all__ = [
    "TRL_LOSS_TYPES",
    "RespoGRPOConfig",
    "RespoGRPOTrainer",
    "fold_importance_sampling_ratio",
    "objective_for",
]

#: TRL 1.16's own loss types (handled by TRL itself).
TRL_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
_MULTIMODAL_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)


def objective_for(loss_type: str) -> Optional[str]:
    """The core objective for a ``loss_type`` this trainer handles, or None for TRL's own types."""
    if loss_type.startswith("respo_") and loss_type[len("respo_") :] in respo.OBJECTIVES:
        return loss_type[len("respo_") :]
    if loss_type in respo.OBJECTIVES and loss_type not in TRL_LOSS_TYPES:
        return loss_type
    return None


@dataclass
class RespoGRPOConfig(GRPOConfig):
    """``GRPOConfig`` plus respo's hyperparameters (TRL's ``loss_type`` picks the objective).

    Args:
        respo_pos: ReSPO (α, β, λ) for Â ≥ 0 (``loss_type="respo"``); the paper's (2, 0.5, 2).
        respo_neg: ReSPO (α, β, λ) for Â < 0; the paper's (1, 0.5, 2).
        respo_loss_agg_mode: aggregation (verl's names); None is the objective's published default
            (``token-mean``; ``seq-mean-token-mean`` for gspo, sapo, gmpo).
        respo_hparams: other hyperparameters of the chosen core objective, as a dict or a JSON
            string, e.g. ``{"pos_kernel": "respo(2,0.5,2)", "neg_kernel": "vespo(3,2)"}`` for
            ``reshaped`` or ``{"clip_ratio_low": 3e-4}`` for ``gspo`` (``respo.hyperparameters(name)``
            lists them).
    """

    respo_pos: list[float] = field(
        default_factory=lambda: list(respo.RESPO_POS),
        metadata={"help": "ReSPO (alpha, beta, lambda) for non-negative advantages."},
    )
    respo_neg: list[float] = field(
        default_factory=lambda: list(respo.RESPO_NEG),
        metadata={"help": "ReSPO (alpha, beta, lambda) for negative advantages."},
    )
    respo_loss_agg_mode: Optional[str] = field(
        default=None,
        metadata={"help": "token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm | token-sum"},
    )
    respo_hparams: Optional[Union[dict, str]] = field(
        default=None,
        metadata={"help": "JSON object of further hyperparameters of the respo objective."},
    )

    def __post_init__(self):
        super().__post_init__()
        objective = objective_for(self.loss_type)
        if objective is not None:
            self.objective_hparams()  # fail early on a bad name or value
            if self.respo_loss_agg_mode is not None and self.respo_loss_agg_mode not in respo.AGG_MODES:
                raise ValueError(
                    f"respo_loss_agg_mode must be one of {', '.join(respo.AGG_MODES)}, got {self.respo_loss_agg_mode!r}"
                )

    def objective_hparams(self) -> dict[str, Any]:
        """Keyword hyperparameters for the core objective of ``loss_type``, checked by the core."""
        objective = objective_for(self.loss_type)
        if objective is None:
            return {}
        extra = self.respo_hparams or {}
        if isinstance(extra, str):
            extra = json.loads(extra)
        if not isinstance(extra, dict):
            raise ValueError(f"respo_hparams must be a dict or a JSON object, got {type(extra).__name__}")
        hparams: dict[str, Any] = {}
        if objective == "respo":
            hparams = {"pos": tuple(float(x) for x in self.respo_pos), "neg": tuple(float(x) for x in self.respo_neg)}
        hparams.update(extra)
        built = respo.build_objective(objective, **hparams)  # unknown names (listing the valid ones) and bad values raise
        if "staleness" in built.inputs or _loglinear(objective, hparams):
            raise ValueError(f"loss_type={self.loss_type!r}: prox_method='loglinear' needs each token's policy version, "
                             "which TRL does not record; use the default prox_method='given'")  # fmt: skip
        return hparams


def _loglinear(objective: str, hparams: dict[str, Any]) -> bool:
    """Whether the objective (or a rejection's base) asks for AReaL's log-linear π_prox, which needs versions."""
    if objective == "klrs":
        return _loglinear(hparams.get("base", "reinforce"), dict(hparams.get("base_kwargs") or {}))
    return objective == "decoupled" and hparams.get("prox_method") == "loglinear"


def fold_importance_sampling_ratio(
    ratio: Optional[torch.Tensor], mask: torch.Tensor
) -> tuple[Optional[torch.Tensor], torch.Tensor]:
    """TRL's vLLM ``importance_sampling_ratio`` as per-token log ρ (masked row sum = the row's log ρ).

        token modes     ratio (B, T):  log ρ_it = log ratio_it
        sequence modes  ratio (B, 1):  log ρ_it = log ratio_i / T_i  (Σ_t m_it log ρ_it = log ratio_i)

    The core's ``fold_rollout_log_ratio`` does the folding (tokens whose ratio is 0 leave the mask).

    Args:
        ratio: (B, T) or (B, 1) non-negative ratios, or None (no correction).
        mask: (B, T) 0/1 completion mask (float).

    Returns:
        (log_rho (B, T) or None, mask (B, T) without the tokens whose ratio is 0).
    """
    if ratio is None:
        return None, mask
    B, T = mask.shape
    if ratio.shape not in ((B, T), (B, 1)):
        raise ValueError(f"importance_sampling_ratio must have shape ({B}, {T}) or ({B}, 1), got {tuple(ratio.shape)}")
    level = "sequence" if ratio.shape[1] == 1 and T > 1 else "token"
    r = ratio.detach().to(mask.dtype).expand(B, T)  # (B, T)
    return respo.fold_rollout_log_ratio(r, mask, level=level, name="importance_sampling_ratio")


class RespoGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose ``_compute_loss`` runs respo's core objective for respo's loss types."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.respo_objective = objective_for(self.loss_type)
        if self.respo_objective is None:
            return
        a = self.args
        unsupported = {
            "top_entropy_quantile < 1": self.top_entropy_quantile < 1.0,
            "off_policy_mask_threshold": self.off_policy_mask_threshold is not None,
            "entropy bonus (entropy_coef / adaptive entropy)": bool(getattr(self, "_entropy_bonus_enabled", False)),
            "use_liger_kernel": bool(getattr(a, "use_liger_kernel", False)),
        }
        bad = [name for name, on in unsupported.items() if on]
        if bad:
            raise ValueError(f"loss_type={self.loss_type!r} (respo) does not support: {', '.join(bad)}")
        self.respo_hparams = a.objective_hparams() if isinstance(a, RespoGRPOConfig) else {}
        self.respo_loss_agg_mode = getattr(a, "respo_loss_agg_mode", None)
        self._respo_built: Optional[tuple] = None

    def _compute_loss(self, model, inputs):
        if self.respo_objective is None:
            return super()._compute_loss(model, inputs)

        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)
        logp, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            **{k: inputs.get(k) for k in _MULTIMODAL_KEYS},
        )  # logp (B, T)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        mask = mask.to(logp.dtype)  # (B, T)
        old_logp = inputs.get("old_per_token_logps")
        old_logp = logp.detach() if old_logp is None else old_logp  # (B, T); on-policy when TRL skipped it
        log_rho, obj_mask = fold_importance_sampling_ratio(inputs.get("importance_sampling_ratio"), mask)

        mode = "train" if self.model.training else "eval"
        # TRL's dapo normaliser: tokens of one accumulation window on this process.
        global_tokens = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
        accum = 1
        if mode == "train":
            accum = self.current_gradient_accumulation_steps
            global_tokens = global_tokens * accum / self.args.steps_per_generation
        global_seqs = logp.size(0) * accum
        agg_mode = self.respo_loss_agg_mode
        objective = self._respo_loss_fn()
        loss, metrics = objective(
            logp,
            old_logp,
            inputs["advantages"],
            obj_mask,
            loss_agg_mode=agg_mode,
            rollout_log_ratio=log_rho,
            global_tokens=global_tokens,
            global_seqs=global_seqs,
            loss_scale_factor=self.max_completion_length,
            nan_policy="mask",
        )

        if self.beta != 0.0:
            ref = inputs["ref_per_token_logps"]
            per_token_kl = torch.exp(ref - logp) - (ref - logp) - 1  # (B, T), k3 as in TRL
            kl_mode = objective.agg_mode(agg_mode)
            kl_loss = respo.agg_loss(
                per_token_kl, mask, kl_mode, global_tokens=global_tokens, global_seqs=global_seqs,
                loss_scale_factor=self.max_completion_length,
            )  # fmt: skip
            loss = loss + self.beta * kl_loss
            metrics["kl"] = self._global_masked_mean(per_token_kl.detach(), mask)
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss / accum
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())

        self._log_respo_metrics(mode, metrics, entropies, mask)
        return loss

    def _respo_loss_fn(self):
        """The core objective, built once per (objective, hyperparameters) rather than per micro-batch
        (objectives are frozen dataclasses; rebuilt only if those attributes are reassigned)."""
        key = (self.respo_objective, json.dumps(self.respo_hparams, sort_keys=True, default=repr))
        if self._respo_built is None or self._respo_built[0] != key:
            self._respo_built = (key, respo.build_objective(self.respo_objective, **self.respo_hparams))
        return self._respo_built[1]

    def _global_masked_mean(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        totals = self.accelerator.reduce(torch.stack([(x * mask).sum(), mask.sum()]), reduction="sum")
        return totals[0] / totals[1].clamp(min=1.0)

    def _log_respo_metrics(self, mode: str, metrics: dict, entropies: torch.Tensor, mask: torch.Tensor) -> None:
        """TRL's entropy plus the core's metrics under ``respo/`` (one gather for all of them)."""
        self._metrics[mode]["entropy"].append(self._global_masked_mean(entropies.detach(), mask).item())
        kl = metrics.pop("kl", None)
        if kl is not None:
            self._metrics[mode]["kl"].append(kl.item())
        keys = [k for k in metrics if k != "loss"]
        if not keys:
            return
        local = torch.stack([metrics[k].detach().to(torch.float32) for k in keys])  # (K,)
        gathered = self.accelerator.gather(local.unsqueeze(0)).reshape(-1, len(keys))  # (P, K)
        for key, value in zip(keys, gathered.nanmean(dim=0).tolist()):
            if value == value:  # skip NaN (undefined on this step, e.g. no positive response)
                self._metrics[mode][f"respo/{key}"].append(value)
