"""The update side of the loop: one policy update on a mini-batch, and the optimizer.

Each mini-batch is scored by the training forward (`respo.train.forward`) in micro-batches whose
losses use the mini-batch's token/sequence counts as normaliser (``global_tokens``/``global_seqs``), so
the summed gradients equal the whole mini-batch's gradient up to float rounding. The rollout side
(`respo.train.rollout`) recomputes ``old_logp`` with the same forward over the same micro-batches, so
the two agree bitwise before any update.
"""

from __future__ import annotations

from typing import Any

import torch

from respo.core import Objective, build_objective, fold_rollout_log_ratio, moe_metrics
from respo.core.mismatch import nonfinite_rows, rollout_correction_weights
from respo.runtime import moe
from respo.train.buffer import Batch
from respo.train.config import TrainConfig
from respo.train.forward import micro_batches, score

__all__ = ["run_objective", "update_step", "make_optimizer"]


def run_objective(cfg: TrainConfig) -> Objective:
    """The run's objective, built once: ``cfg.objective`` with ``cfg.objective_kwargs`` and ``cfg.loss_agg_mode``."""
    return build_objective(cfg.objective, loss_agg_mode=cfg.loss_agg_mode or None, **cfg.objective_kwargs)


def update_step(model, optimizer, scheduler, batch: Batch, cfg: TrainConfig, *, on_policy: bool = False,
                objective: Objective | None = None, version: int | None = None) -> tuple[dict[str, Any], torch.Tensor]:
    """One optimizer step on one mini-batch (gradient accumulation over micro-batches).

    ``objective``: the run's objective (`run_objective`; built from ``cfg`` when not given).

    With ``on_policy=True`` (no update since the rollout) ``batch.old_logp`` is not read: the old
    policy is the current one, so ``old_logp`` is the detached training forward itself, bitwise
    equal to `recompute_logp`.

    An objective that reads the proximal policy's log-probs (``decoupled``'s ``prox_logp``) gets the
    detached training forward: π_prox is the policy at the start of this update, and one optimizer step
    per mini-batch, taken after every micro-batch's forward, leaves it the policy being differentiated,
    so its log-probs are this forward (bitwise a recomputation) and cost no extra forward pass. One that
    reads ``staleness`` (decoupled's ``prox_method="loglinear"``) gets ``version − batch.version`` per row,
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
    device = next(model.parameters()).device
    S, T = batch.mask.shape
    global_tokens = batch.mask.sum()  # 0-d
    global_seqs = S
    old_logp = torch.zeros_like(batch.mask) if on_policy else batch.old_logp  # (S, T)
    logp_all = torch.zeros(S, T)  # (S, T) detached, for diagnostics
    ent_sum = torch.zeros(())
    loss_total = torch.zeros(())
    router_now = []  # MoE: the experts the current router picks, per micro-batch
    objective = run_objective(cfg) if objective is None else objective
    takes_prox = "prox_logp" in objective.inputs + objective.optional_inputs
    stale = None  # (S, T) updates since each row was sampled, for an objective that reads it
    if version is not None and "staleness" in objective.inputs + objective.optional_inputs:
        stale = (version - batch.version).to(batch.mask.dtype).unsqueeze(-1).expand_as(batch.mask)
    ranges = micro_batches(batch.mask, batch.response_start, cfg)
    correcting = cfg.rollout_correction != "off"
    from_engine = correcting or cfg.rollout_bypass  # the engine's log-probs reach the loss: its NaN rows are dropped, counted
    log_rho_all = torch.zeros(S, T) if correcting else None  # (S, T) the correction, for the diagnostics
    kept_all = batch.mask.clone() if correcting else batch.mask  # (S, T) rows the correction keeps
    for i, j in ranges:
        mb = batch.rows(i, j).trimmed()
        t = mb.mask.shape[1]
        mask = mb.mask.to(device)  # (m, t)
        logp, ent, routing = score(model, mb, cfg, with_entropy=True, record=mb.routing is not None)  # (m, t)
        if on_policy:
            old_logp[i:j, :t] = logp.detach().cpu() * mb.mask
        if routing is not None:
            router_now.append(routing.cpu())
        prox = {"prox_logp": logp.detach()} if takes_prox else {}  # π_prox: the policy before this update's step
        if stale is not None:
            prox["staleness"] = stale[i:j, :t].to(device)
        corr = {"nan_policy": "mask"} if from_engine else {}
        if correcting:  # ρ = π_trainer/π_engine on these rows, folded into the loss as its own factor
            log_rho, kept = _rollout_correction(old_logp[i:j, :t], mb.behaviour_logp, mb.mask, cfg)
            log_rho_all[i:j, :t], kept_all[i:j, :t] = log_rho, kept
            mask = kept.to(device)
            corr["rollout_log_ratio"] = log_rho.to(device)  # rejected rows leave the mask
        loss, _ = objective(logp, old_logp[i:j, :t].to(device), mb.adv.to(device), mask,
                            global_tokens=global_tokens.to(device), global_seqs=global_seqs, diagnostics=False,
                            **prox, **corr)
        loss.backward()
        loss_total += loss.detach().cpu()
        logp_all[i:j, :t] = logp.detach().cpu() * mb.mask
        ent_sum += (ent.detach().cpu() * mb.mask).sum()
    max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    lr = optimizer.param_groups[0]["lr"]
    applied = bool(torch.isfinite(loss_total) & torch.isfinite(grad_norm).cpu())  # a NaN/inf gradient is never applied
    nonfinite_weights = False
    if applied:
        optimizer.step()
        scheduler.step()  # then a finite step that overflowed a weight: its norm is not finite
        nonfinite_weights = not bool(torch.isfinite(torch.stack(torch._foreach_norm(list(model.parameters())))).all())
    else:  # no optimizer step, no scheduler step, moments untouched
        optimizer.zero_grad(set_to_none=True)
    # the diagnostics of the whole mini-batch, each row in its micro-batch (M2PO selected within each)
    groups = torch.cat([torch.full((j - i,), k, dtype=torch.long) for k, (i, j) in enumerate(ranges)])  # (S,)
    with torch.no_grad():
        corr = {"nan_policy": "mask"} if from_engine else {}
        if correcting:
            corr["rollout_log_ratio"] = log_rho_all
        _, diag = objective(logp_all, old_logp, batch.adv, kept_all, row_groups=groups,
                            **({"prox_logp": logp_all} if takes_prox else {}),
                            **({"staleness": stale} if stale is not None else {}), **corr)
    out = {"loss": loss_total, "grad_norm": grad_norm.cpu(), "lr": lr, "entropy": ent_sum / global_tokens.clamp_min(1),
           "grad_clipped": (grad_norm.cpu() > max_norm).float()}  # 1 when clipping scaled this update down
    if not applied:
        out["skipped"] = 1
    if nonfinite_weights:
        out["nonfinite_weights"] = 1
    out.update(diag)
    if router_now:  # MoE: router shift since the rollout (overall, per layer) and the rollout's expert load
        now = moe.cat_routings(router_now, length=batch.routing.shape[1])  # (S, L, n_layers, k)
        num_experts = moe.find_moe_layers(model)[0].num_experts
        out.update(moe_metrics(batch.routing, now, num_experts, batch.mask, prefix=""))
    return out, old_logp


def _rollout_correction(old_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor,
                        cfg: TrainConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """``cfg.rollout_correction``'s per-token log ρ and kept mask for rows whose trainer log-probs are
    ``old_logp`` and engine log-probs ``behaviour_logp`` (all (m, t)); rows it rejects leave the mask.

    A row with a non-finite engine (or trainer) log-prob on a valid token gets log ρ = NaN on its tokens, whatever
    the correction: the loss (``nan_policy="mask"``) then drops it and counts it in ``bad_rows/nonfinite``, the
    one rule for every correction, instead of a truncation raising on it or a rejection dropping it unsaid."""
    valid = mask.bool()
    bad = nonfinite_rows(old_logp, behaviour_logp, mask).unsqueeze(-1)  # (m, 1)
    clean = torch.where(bad, torch.zeros_like(behaviour_logp), behaviour_logp)
    old = torch.where(bad, torch.zeros_like(old_logp), old_logp)
    w, level = rollout_correction_weights(old, clean, mask, cfg.rollout_correction, cfg.rollout_correction_threshold)
    log_rho, kept = fold_rollout_log_ratio(w, mask, level=level, name="rollout correction weights")
    nan = torch.full_like(log_rho, float("nan"))
    return torch.where(bad & valid, nan, log_rho), torch.where(bad, mask.to(kept.dtype), kept)


def make_optimizer(model, cfg: TrainConfig):
    """AdamW with a linear warm-up over ``cfg.warmup`` updates: lr_u = lr * min(1, (u + 1) / warmup)."""
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=tuple(cfg.adam_betas), eps=cfg.adam_eps,
                            weight_decay=cfg.weight_decay)
    warm = cfg.warmup
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: min(1.0, (u + 1) / warm) if warm else 1.0)
    return opt, sched

