"""The update side of the loop: one policy update on a mini-batch, and the optimizer.

Each mini-batch is scored by the training forward (`respo.train.forward`) in micro-batches whose
losses use the mini-batch's token/sequence counts as normaliser (``global_tokens``/``global_seqs``), so
the summed gradients equal the whole mini-batch's gradient up to float rounding. The rollout side
(`respo.train.rollout`) recomputes ``old_logp`` with the same forward over the same micro-batches, so
the two agree bitwise before any update.

`update_step` is three phases, each a function of its own: `accumulate` (forward and backward over the
micro-batches), `apply_if_finite` (clip, then the optimizer step unless the gradient is not finite) and
`diagnose` (the update's metrics). What an update reads of the run's config is `UpdateSettings`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from respo.core import Objective, build_objective, fold_rollout_log_ratio, moe_metrics
from respo.core.mismatch import nonfinite_rows, rollout_correction_weights
from respo.runtime import moe
from respo.train.buffer import Batch
from respo.train.config import Forward, RolloutCorrection, TrainConfig
from respo.train.forward import micro_batches, score

__all__ = ["UpdateSettings", "run_objective", "update_step", "accumulate", "apply_if_finite", "diagnose",
           "Accumulated", "Step", "make_optimizer"]


def run_objective(cfg: TrainConfig) -> Objective:
    """The run's objective, built once: ``cfg.objective`` with ``cfg.objective_kwargs`` and ``cfg.loss_agg_mode``."""
    return build_objective(cfg.objective, loss_agg_mode=cfg.loss_agg_mode or None, **cfg.objective_kwargs)


@dataclass(frozen=True)
class UpdateSettings:
    """What one update reads: the run's objective, its training forward, its rollout correction and the gradient
    clip (``grad_clip``, 0 = none)."""

    objective: Objective
    forward: Forward
    correction: RolloutCorrection
    grad_clip: float

    @classmethod
    def of(cls, cfg: TrainConfig, objective: Objective | None = None) -> "UpdateSettings":
        """``cfg``'s update settings; ``objective``: the run's objective (`run_objective`; built from ``cfg`` when
        not given)."""
        return cls(objective=run_objective(cfg) if objective is None else objective, forward=Forward.of(cfg),
                   correction=RolloutCorrection.of(cfg), grad_clip=cfg.grad_clip)


def update_step(model, optimizer, scheduler, batch: Batch, settings: UpdateSettings, *, on_policy: bool = False,
                version: int | None = None) -> tuple[dict[str, Any], torch.Tensor]:
    """One optimizer step on one mini-batch (gradient accumulation over micro-batches).

    With ``on_policy=True`` (no update since the rollout) ``batch.old_logp`` is not read: the old
    policy is the current one, so ``old_logp`` is the detached training forward itself, bitwise
    equal to `recompute_logp`.

    An objective that reads the proximal policy's log-probs (``decoupled``'s ``prox_logp``) gets the
    detached training forward: π_prox is the policy at the start of this update, and one optimizer step
    per mini-batch, taken after every micro-batch's forward, leaves it the policy being differentiated,
    so its log-probs are this forward (bitwise a recomputation) and cost no extra forward pass. One that
    reads ``staleness`` (decoupled's ``prox_method="loglinear"``) gets ``version − batch.token_versions()`` per token,
    ``version`` being the learner's current policy version.

    A step whose loss or gradient norm is not finite is not applied: no optimizer step (weights and AdamW moments
    unchanged), no scheduler step, the gradients dropped; its metrics hold ``skipped = 1``. A finite step that
    leaves a weight non-finite (overflow) is marked ``nonfinite_weights = 1``: the trainer stops there.

    Returns:
        Metrics (loss, grad_norm, grad_clipped, lr, entropy, the core's diagnostics from ``policy_loss`` on the
        whole mini-batch, recomputed from the detached micro-batch log-probs; MoE: router shift and
        expert load), and the ``old_logp`` the update used, (S, T).
    """
    model.train()
    optimizer.zero_grad(set_to_none=True)
    acc = accumulate(model, batch, settings, on_policy=on_policy, version=version)
    step = apply_if_finite(model, optimizer, scheduler, acc.loss, settings.grad_clip)
    return diagnose(model, batch, settings, acc, step), acc.old_logp


@dataclass
class Accumulated:
    """What `accumulate` leaves besides the gradient in the parameters' ``.grad``: on the CPU, detached."""

    ranges: list[tuple[int, int]]  # the micro-batches: row ranges [i, j), in order
    old_logp: torch.Tensor  # (S, T) the old policy's log-probs the loss read
    logp: torch.Tensor  # (S, T) the training forward's log-probs
    kept: torch.Tensor  # (S, T) the loss's mask: the response mask less the rows a rollout correction rejects
    log_rho: torch.Tensor | None  # (S, T) the rollout correction's log ρ; None without a correction
    stale: torch.Tensor | None  # (S, T) updates since each row was sampled; None unless the objective reads it
    loss: torch.Tensor  # 0-d, the micro-batches' losses summed
    entropy: torch.Tensor  # 0-d, the token entropies summed over the mask
    routing: list[torch.Tensor]  # MoE: the experts the current router picks, per micro-batch


def accumulate(model, batch: Batch, settings: UpdateSettings, *, on_policy: bool = False,
               version: int | None = None) -> Accumulated:
    """Forward and backward over the mini-batch's micro-batches (`micro_batches`), each loss normalised by the
    whole mini-batch's token and sequence counts, so the gradients summed in ``.grad`` are the mini-batch's.

    A rollout correction folds ρ = π_trainer/π_engine into each micro-batch's loss as its own factor; the rows it
    rejects leave the mask (`_rollout_correction`). ``on_policy`` and ``version``: as in `update_step`."""
    device = next(model.parameters()).device
    S, T = batch.mask.shape
    global_tokens = batch.mask.sum()  # 0-d
    objective, correcting = settings.objective, settings.correction.correcting
    acc = Accumulated(ranges=micro_batches(batch.mask, batch.response_start, settings.forward.micro),
                      old_logp=torch.zeros_like(batch.mask) if on_policy else batch.old_logp,
                      logp=torch.zeros(S, T), kept=batch.mask.clone() if correcting else batch.mask,
                      log_rho=torch.zeros(S, T) if correcting else None, stale=_staleness(batch, objective, version),
                      loss=torch.zeros(()), entropy=torch.zeros(()), routing=[])
    for i, j in acc.ranges:
        mb = batch.rows(i, j).trimmed()
        t = mb.mask.shape[1]
        mask = mb.mask.to(device)  # (m, t)
        logp, ent, routing = score(model, mb, settings.forward, with_entropy=True, record=mb.routing is not None)
        if on_policy:
            acc.old_logp[i:j, :t] = logp.detach().cpu() * mb.mask
        if routing is not None:
            acc.routing.append(routing.cpu())
        log_rho = None
        if correcting:  # ρ on these rows; rejected rows leave the mask
            log_rho, kept = _rollout_correction(acc.old_logp[i:j, :t], mb.behaviour_logp, mb.mask, settings.correction)
            acc.log_rho[i:j, :t], acc.kept[i:j, :t] = log_rho, kept
            mask, log_rho = kept.to(device), log_rho.to(device)
        stale = None if acc.stale is None else acc.stale[i:j, :t].to(device)
        loss, _ = objective(logp, acc.old_logp[i:j, :t].to(device), mb.adv.to(device), mask,
                            global_tokens=global_tokens.to(device), global_seqs=S, diagnostics=False,
                            **_extra_inputs(settings, logp.detach(), stale, log_rho))
        loss.backward()
        acc.loss += loss.detach().cpu()
        acc.logp[i:j, :t] = logp.detach().cpu() * mb.mask
        acc.entropy += (ent.detach().cpu() * mb.mask).sum()
    return acc


def _staleness(batch: Batch, objective: Objective, version: int | None) -> torch.Tensor | None:
    """(S, T) ``version − batch.token_versions()`` per token (partial rollouts mix versions within a row), for an
    objective that reads ``staleness`` (else None)."""
    if version is None or "staleness" not in objective.inputs + objective.optional_inputs:
        return None
    return (version - batch.token_versions()).to(batch.mask.dtype)


def _extra_inputs(settings: UpdateSettings, logp: torch.Tensor, stale: torch.Tensor | None,
                  log_rho: torch.Tensor | None) -> dict[str, Any]:
    """The objective's inputs beyond logp, old_logp, adv and mask, the same for the loss and its diagnostics:
    π_prox's log-probs (the detached forward ``logp``: the policy before this update's step) for an objective that
    reads them, the rows' staleness, and, where the engine's log-probs reach the loss, ``nan_policy="mask"`` (its
    non-finite rows dropped, counted) and the rollout correction's ``log_rho``."""
    objective, extra = settings.objective, {}
    if "prox_logp" in objective.inputs + objective.optional_inputs:
        extra["prox_logp"] = logp
    if stale is not None:
        extra["staleness"] = stale
    if settings.correction.from_engine:
        extra["nan_policy"] = "mask"
    if log_rho is not None:
        extra["rollout_log_ratio"] = log_rho
    return extra


def _rollout_correction(old_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor,
                        correction: RolloutCorrection) -> tuple[torch.Tensor, torch.Tensor]:
    """``correction``'s per-token log ρ and kept mask for rows whose trainer log-probs are
    ``old_logp`` and engine log-probs ``behaviour_logp`` (all (m, t)); rows it rejects leave the mask.

    A row with a non-finite engine (or trainer) log-prob on a valid token gets log ρ = NaN on its tokens, whatever
    the correction: the loss (``nan_policy="mask"``) then drops it and counts it in ``bad_rows/nonfinite``, the
    one rule for every correction, instead of a truncation raising on it or a rejection dropping it unsaid."""
    valid = mask.bool()
    bad = nonfinite_rows(old_logp, behaviour_logp, mask).unsqueeze(-1)  # (m, 1)
    clean = torch.where(bad, torch.zeros_like(behaviour_logp), behaviour_logp)
    old = torch.where(bad, torch.zeros_like(old_logp), old_logp)
    w, level = rollout_correction_weights(old, clean, mask, correction.kind, correction.threshold)
    log_rho, kept = fold_rollout_log_ratio(w, mask, level=level, name="rollout correction weights")
    nan = torch.full_like(log_rho, float("nan"))
    return torch.where(bad & valid, nan, log_rho), torch.where(bad, mask.to(kept.dtype), kept)


@dataclass(frozen=True)
class Step:
    """What `apply_if_finite` did."""

    grad_norm: torch.Tensor  # 0-d, on the CPU: the gradient's global norm before clipping
    max_norm: float  # the clip (inf: none)
    lr: float  # the learning rate of this update
    applied: bool  # the optimizer and scheduler stepped
    nonfinite_weights: bool  # the step left a weight non-finite


def apply_if_finite(model, optimizer, scheduler, loss: torch.Tensor, grad_clip: float) -> Step:
    """Clip the accumulated gradient to global norm ``grad_clip`` (0: no clipping), then take the optimizer and
    scheduler step, unless ``loss`` or the gradient norm is not finite: then nothing is applied (weights, AdamW
    moments and learning-rate schedule unchanged) and the gradient is dropped. Whether a step taken left a weight
    non-finite (an overflow) is checked after it."""
    max_norm = grad_clip if grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    lr = optimizer.param_groups[0]["lr"]
    applied = bool(torch.isfinite(loss) & torch.isfinite(grad_norm).cpu())  # a NaN/inf gradient is never applied
    nonfinite_weights = False
    if applied:
        optimizer.step()
        scheduler.step()  # then a finite step that overflowed a weight: its norm is not finite
        nonfinite_weights = not bool(torch.isfinite(torch.stack(torch._foreach_norm(list(model.parameters())))).all())
    else:  # no optimizer step, no scheduler step, moments untouched
        optimizer.zero_grad(set_to_none=True)
    return Step(grad_norm=grad_norm.cpu(), max_norm=max_norm, lr=lr, applied=applied,
                nonfinite_weights=nonfinite_weights)


def diagnose(model, batch: Batch, settings: UpdateSettings, acc: Accumulated, step: Step) -> dict[str, Any]:
    """The update's metrics: loss, grad_norm, lr, entropy, grad_clipped, ``skipped``/``nonfinite_weights`` when so,
    the objective's diagnostics of the whole mini-batch (recomputed from the detached log-probs, each row in its
    micro-batch, so M2PO's selection is the one each micro-batch applied) and, for MoE, the router shift since the
    rollout (overall, per layer) and the rollout's expert load."""
    groups = torch.cat([torch.full((j - i,), k, dtype=torch.long) for k, (i, j) in enumerate(acc.ranges)])  # (S,)
    with torch.no_grad():
        _, diag = settings.objective(acc.logp, acc.old_logp, batch.adv, acc.kept, row_groups=groups,
                                     **_extra_inputs(settings, acc.logp, acc.stale, acc.log_rho))
    out = {"loss": acc.loss, "grad_norm": step.grad_norm, "lr": step.lr,
           "entropy": acc.entropy / batch.mask.sum().clamp_min(1),
           "grad_clipped": (step.grad_norm > step.max_norm).float()}  # 1 when clipping scaled this update down
    if not step.applied:
        out["skipped"] = 1
    if step.nonfinite_weights:
        out["nonfinite_weights"] = 1
    out.update(diag)
    if acc.routing:
        now = moe.cat_routings(acc.routing, length=batch.routing.shape[1])  # (S, L, n_layers, k)
        num_experts = moe.find_moe_layers(model)[0].num_experts
        out.update(moe_metrics(batch.routing, now, num_experts, batch.mask, prefix=""))
    return out


def make_optimizer(model, cfg: TrainConfig):
    """AdamW with a linear warm-up over ``cfg.warmup`` updates: lr_u = lr * min(1, (u + 1) / warmup)."""
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=tuple(cfg.adam_betas), eps=cfg.adam_eps,
                            weight_decay=cfg.weight_decay)
    warm = cfg.warmup
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: min(1.0, (u + 1) / warm) if warm else 1.0)
    return opt, sched
