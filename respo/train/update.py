"""The update side of the loop: micro-batches, the training forward, one policy update, the optimizer.

Micro-batching: each mini-batch is processed in chunks of consecutive rows, ``micro_batch`` rows each
or, with ``micro_batch_tokens``, as many rows as fit a budget of padded tokens (`micro_batches`). Their
losses use the mini-batch's token/sequence counts as normaliser (``global_tokens``/``global_seqs``), so
the summed gradients equal the whole mini-batch's gradient up to float rounding.

Device and precision: a `Batch` lives on the CPU (buffer, checkpoints, metrics); each micro-batch is
moved to the model's device for its forward, which runs in ``cfg.dtype``
(`respo.runtime.precision.mixed_precision`); log-probs come back as float32.

MoE routing is decided in one place, `ForwardRouting`: sampling records the experts every token
used; the ``old_logp`` and training forwards replay them (``routing_replay``) or, for the training
forward, record what the current router picks, so the router shift since the rollout is logged.

The rollout side (`respo.train.rollout`) recomputes ``old_logp`` with `forward_logprobs` over the same
`micro_batches`, so the two forwards agree bitwise before any update.
"""

from __future__ import annotations

from typing import Any

import torch

from respo.core import Objective, build_objective, moe_metrics
from respo.runtime import moe
from respo.runtime.logprobs import token_logprobs
from respo.runtime.precision import mixed_precision
from respo.train.buffer import Batch
from respo.train.config import TrainConfig

__all__ = ["ForwardRouting", "replayed_routing", "micro_batches", "training_forward", "forward_logprobs",
           "run_objective", "update_step", "make_optimizer"]


class ForwardRouting:
    """Context for one forward pass of an MoE policy (a no-op for dense ones).

    Args:
        model: the policy.
        replay: ``(S, L, n_layers, k)`` recorded experts to force on the forward, or None.
        record: record the experts the router picks (when nothing is replayed and the model is MoE).

    Inside (or after) the context, `current(length)` is the routing the current router picks,
    ``(S, length, n_layers, k)``: its natural choice under replay, what it did when recording,
    None otherwise.
    """

    def __init__(self, model, *, replay: torch.Tensor | None = None, record: bool = False):
        self._replay = moe.routing_replay(model, replay) if replay is not None else None
        self._recorder = moe.RoutingRecorder(model) if replay is None and record and moe.is_moe(model) else None

    def __enter__(self) -> "ForwardRouting":
        for ctx in (self._replay, self._recorder):
            if ctx is not None:
                ctx.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for ctx in (self._replay, self._recorder):
            if ctx is not None:
                ctx.__exit__(*exc)

    def current(self, length: int) -> torch.Tensor | None:
        if self._replay is not None:
            return self._replay.router_routing()
        if self._recorder is not None:
            return self._recorder.routing(length=length)
        return None


def replayed_routing(batch: Batch, cfg: TrainConfig, model) -> torch.Tensor | None:
    """The routing a training-side forward over ``batch`` replays, on the model's device (None: the
    router decides)."""
    if not cfg.routing_replay or batch.routing is None:
        return None
    return batch.routing.to(next(model.parameters()).device)


def micro_batches(mask: torch.Tensor, response_start: int, cfg: TrainConfig) -> list[tuple[int, int]]:
    """Row ranges [i, j) covering a mini-batch in order, one per forward/backward.

    Rows mode (``micro_batch_tokens = 0``): ``micro_batch`` rows each (0: one range of all rows).
    Tokens mode: consecutive rows are packed while the trimmed forward stays within the budget,

        cost([i, j)) = (j - i) * (response_start + max_{i <= r < j} len_r) <= micro_batch_tokens,

    with len_r the response length of row r (a range holds at least one row). E.g. budget 40,
    response_start 6: lengths [2, 4, 4, 1] give one range [0, 4) (4 * (6 + 4) = 40 fits); lengths
    [2, 14, 4, 1] give [0, 2) (2 * 20 = 40 fits, 3 rows would cost 60) and [2, 4) (2 * 10 = 20).

    Args:
        mask: (S, T) response mask of the mini-batch.
    """
    S = mask.shape[0]
    if not cfg.micro_batch_tokens:
        m = cfg.micro_batch or S
        return [(i, min(i + m, S)) for i in range(0, S, m)]
    lengths = mask.sum(1).long().tolist()  # (S,)
    out, i, longest = [], 0, 0
    for j, n in enumerate(lengths):
        longest_with = max(longest, n)
        if j > i and (j + 1 - i) * (response_start + max(longest_with, 1)) > cfg.micro_batch_tokens:
            out.append((i, j))
            i, longest_with = j, n
        longest = longest_with
    out.append((i, S))
    return out


def training_forward(model, cfg: TrainConfig):
    """What the old-logp and training forwards call: ``model``, or with ``cfg.compile`` its compiled
    wrapper (``torch.compile(model, dynamic=True)``, built once per model, sharing its parameters)."""
    if not cfg.compile:
        return model
    compiled = model.__dict__.get("_respo_compiled")  # a plain attribute: not a submodule, not in state_dict
    if compiled is None:
        compiled = torch.compile(model, dynamic=True)
        model.__dict__["_respo_compiled"] = compiled
    return compiled


def forward_logprobs(model, mb: Batch, cfg: TrainConfig, *, with_entropy: bool = False):
    """``token_logprobs`` of a micro-batch on the model's device in ``cfg.dtype``; float32 (m, t) results."""
    device = next(model.parameters()).device
    with mixed_precision(model, cfg.dtype):
        return token_logprobs(training_forward(model, cfg), mb.input_ids.to(device), mb.attention_mask.to(device),
                              mb.response_start, temperature=cfg.temperature, with_entropy=with_entropy)


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
    for i, j in ranges:
        mb = batch.rows(i, j).trimmed()
        t = mb.mask.shape[1]
        mask = mb.mask.to(device)  # (m, t)
        with ForwardRouting(model, replay=replayed_routing(mb, cfg, model), record=mb.routing is not None) as routing:
            logp, ent = forward_logprobs(model, mb, cfg, with_entropy=True)  # (m, t)
        if on_policy:
            old_logp[i:j, :t] = logp.detach().cpu() * mb.mask
        if mb.routing is not None:
            router_now.append(routing.current(length=mb.input_ids.shape[1]).cpu())
        prox = {"prox_logp": logp.detach()} if takes_prox else {}  # π_prox: the policy before this update's step
        if stale is not None:
            prox["staleness"] = stale[i:j, :t].to(device)
        loss, _ = objective(logp, old_logp[i:j, :t].to(device), mb.adv.to(device), mask,
                            global_tokens=global_tokens.to(device), global_seqs=global_seqs, diagnostics=False, **prox)
        loss.backward()
        loss_total += loss.detach().cpu()
        logp_all[i:j, :t] = logp.detach().cpu() * mb.mask
        ent_sum += (ent.detach().cpu() * mb.mask).sum()
    max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    scheduler.step()
    # the diagnostics of the whole mini-batch, each row in its micro-batch (M2PO selected within each)
    groups = torch.cat([torch.full((j - i,), k, dtype=torch.long) for k, (i, j) in enumerate(ranges)])  # (S,)
    with torch.no_grad():
        _, diag = objective(logp_all, old_logp, batch.adv, batch.mask, row_groups=groups,
                            **({"prox_logp": logp_all} if takes_prox else {}),
                            **({"staleness": stale} if stale is not None else {}))
    out = {"loss": loss_total, "grad_norm": grad_norm.cpu(), "lr": lr, "entropy": ent_sum / global_tokens.clamp_min(1),
           "grad_clipped": (grad_norm.cpu() > max_norm).float()}  # 1 when clipping scaled this update down
    out.update(diag)
    if router_now:  # MoE: router shift since the rollout (overall, per layer) and the rollout's expert load
        now = moe.cat_routings(router_now, length=batch.routing.shape[1])  # (S, L, n_layers, k)
        num_experts = moe.find_moe_layers(model)[0].num_experts
        out.update(moe_metrics(batch.routing, now, num_experts, batch.mask, prefix=""))
    return out, old_logp


def make_optimizer(model, cfg: TrainConfig):
    """AdamW with a linear warm-up over ``cfg.warmup`` updates: lr_u = lr * min(1, (u + 1) / warmup)."""
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=tuple(cfg.adam_betas), eps=cfg.adam_eps,
                            weight_decay=cfg.weight_decay)
    warm = cfg.warmup
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: min(1.0, (u + 1) / warm) if warm else 1.0)
    return opt, sched

