"""The pieces of one training step: rollout, ``old_logp`` recomputation, one policy update.

Micro-batching: each mini-batch is processed in chunks of ``micro_batch`` sequences whose losses use
the mini-batch's token/sequence counts as normaliser (``global_tokens``/``global_seqs``), so the
summed gradients equal the whole mini-batch's gradient.

MoE routing is decided in one place, `ForwardRouting`: sampling records the experts every token
used; the ``old_logp`` and training forwards replay them (``routing_replay``) or, for the training
forward, record what the current router picks, so the router shift since the rollout is logged.
"""

from __future__ import annotations

from typing import Any

import torch

from respo import group_advantages, policy_loss
from respo.runtime import moe
from respo.runtime.logprobs import token_logprobs
from respo.runtime.sampler import sample
from respo.runtime.tasks import score_rollout
from respo.train.buffer import Batch, staleness_stats
from respo.train.config import TrainConfig
from respo.train.metrics import timed
from respo.train.policy import Policy

__all__ = ["ForwardRouting", "rollout_batch", "recompute_logp", "update_step", "make_optimizer", "batch_metrics"]


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


def _replayed(batch: Batch, cfg: TrainConfig) -> torch.Tensor | None:
    """The routing a training-side forward over ``batch`` replays (None: the router decides)."""
    return batch.routing if cfg.routing_replay else None


# ----------------------------------------------------------------------------------------------
# Rollout
# ----------------------------------------------------------------------------------------------
@torch.no_grad()
def rollout_batch(policy: Policy, task, pool, indices: list[int], cfg: TrainConfig, generator: torch.Generator,
                  version: int) -> tuple[Batch, dict]:
    """Sample G responses for each example ``pool[i]``, score them, and compute group advantages.

    Returns:
        The batch (prompt-major, ``old_logp`` not yet computed) and sampling metrics.
    """
    model, G = policy.model, cfg.group_size
    examples = [pool[i] for i in indices for _ in range(G)]
    rec: dict[str, Any] = {}
    model.eval()
    with timed(rec, "sample"), ForwardRouting(model, record=True) as routing:
        ro = sample(model, policy.tokenizer, [ex.prompt for ex in examples], max_new_tokens=cfg.max_new_tokens,
                    temperature=cfg.temperature, top_p=cfg.top_p, generator=generator, version=version)
    model.train()
    rewards = torch.tensor(score_rollout(task, ro, examples))  # (S,)
    adv = group_advantages(rewards, G, kind=cfg.adv_kind)  # (S,)
    batch = Batch(input_ids=ro.input_ids, attention_mask=ro.attention_mask, response_start=ro.response_start,
                  mask=ro.response_mask.float(), behaviour_logp=ro.behaviour_logp.float(), rewards=rewards,
                  version=torch.full((len(examples),), version, dtype=torch.long), adv=adv,
                  routing=routing.current(length=ro.input_ids.shape[1]),
                  example_index=torch.tensor([i for i in indices for _ in range(G)], dtype=torch.long))
    return batch, rec


def _chunks(n_rows: int, micro: int) -> list[tuple[int, int]]:
    """Row ranges [i, j) of ``micro`` rows each (0: one chunk of all rows)."""
    m = micro or n_rows
    return [(i, min(i + m, n_rows)) for i in range(0, n_rows, m)]


@torch.no_grad()
def recompute_logp(model, batch: Batch, cfg: TrainConfig, *, start_row: int = 0) -> torch.Tensor:
    """``old_logp``: the behaviour policy's log-probs recomputed by the trainer, (S, T).

    Uses exactly the chunking, trimming and module mode of `update_step`'s training forward (the
    model stays in ``train()``; the presets have no dropout), so a mini-batch trained before any
    update gets log W = 0 exactly. Micro-batch boundaries line up with mini-batch boundaries because
    ``micro_batch`` divides B*G.

    Rows before ``start_row`` are left at 0: the sync loop passes ``start_row = B*G`` because the
    first mini-batch is trained before any update, where ``old_logp`` equals the training forward's
    detached log-probs bitwise (tested), so `update_step(on_policy=True)` takes them from there and
    saves one forward pass per rollout step.
    """
    model.train()
    old = torch.zeros_like(batch.mask)  # (S, T)
    if start_row % cfg.mini_batch_seqs:
        raise ValueError(f"start_row {start_row} is not a mini-batch boundary ({cfg.mini_batch_seqs} rows)")
    for mb_start in range(start_row, batch.size, cfg.mini_batch_seqs):
        for i, j in _chunks(min(cfg.mini_batch_seqs, batch.size - mb_start), cfg.micro_batch):
            mb = batch.rows(mb_start + i, mb_start + j).trimmed()
            with ForwardRouting(model, replay=_replayed(mb, cfg)):
                logp, _ = token_logprobs(model, mb.input_ids, mb.attention_mask, mb.response_start,
                                         temperature=cfg.temperature)
            old[mb_start + i:mb_start + j, :logp.shape[1]] = logp * mb.mask  # (m, t)
    return old


# ----------------------------------------------------------------------------------------------
# One policy update
# ----------------------------------------------------------------------------------------------
def update_step(model, optimizer, scheduler, batch: Batch, cfg: TrainConfig, *,
                on_policy: bool = False) -> tuple[dict[str, Any], torch.Tensor]:
    """One optimizer step on one mini-batch (gradient accumulation over micro-batches).

    With ``on_policy=True`` (no update since the rollout) ``batch.old_logp`` is not read: the old
    policy is the current one, so ``old_logp`` is the detached training forward itself, bitwise
    equal to `recompute_logp`.

    Returns:
        Metrics (loss, grad_norm, lr, entropy, the core's diagnostics from ``policy_loss`` on the
        whole mini-batch, recomputed from the detached micro-batch log-probs; MoE: router shift and
        expert load), and the ``old_logp`` the update used, (S, T).
    """
    model.train()
    optimizer.zero_grad(set_to_none=True)
    S, T = batch.mask.shape
    global_tokens = batch.mask.sum()  # 0-d
    global_seqs = S
    old_logp = torch.zeros_like(batch.mask) if on_policy else batch.old_logp  # (S, T)
    logp_all = torch.zeros(S, T)  # (S, T) detached, for diagnostics
    ent_sum = torch.zeros(())
    loss_total = torch.zeros(())
    router_now = []  # MoE: the experts the current router picks, per micro-batch
    for i, j in _chunks(S, cfg.micro_batch):
        mb = batch.rows(i, j).trimmed()
        t = mb.mask.shape[1]
        with ForwardRouting(model, replay=_replayed(mb, cfg), record=mb.routing is not None) as routing:
            logp, ent = token_logprobs(model, mb.input_ids, mb.attention_mask, mb.response_start,
                                       temperature=cfg.temperature, with_entropy=True)  # (m, t)
        if on_policy:
            old_logp[i:j, :t] = logp.detach() * mb.mask
        if mb.routing is not None:
            router_now.append(routing.current(length=mb.input_ids.shape[1]))
        loss, _ = policy_loss(cfg.objective, logp, old_logp[i:j, :t], mb.adv, mb.mask,
                              loss_agg_mode=cfg.loss_agg_mode or None, global_tokens=global_tokens,
                              global_seqs=global_seqs, diagnostics=False, **cfg.objective_kwargs)
        loss.backward()
        loss_total += loss.detach()
        logp_all[i:j, :t] = logp.detach() * mb.mask
        ent_sum += (ent.detach() * mb.mask).sum()
    max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    scheduler.step()
    with torch.no_grad():
        _, diag = policy_loss(cfg.objective, logp_all, old_logp, batch.adv, batch.mask,
                              loss_agg_mode=cfg.loss_agg_mode or None, **cfg.objective_kwargs)
    out = {"loss": loss_total, "grad_norm": grad_norm, "lr": lr, "entropy": ent_sum / global_tokens.clamp_min(1)}
    out.update(diag)
    if router_now:  # MoE: router shift since the rollout (overall, per layer) and the rollout's expert load
        now = moe.cat_routings(router_now, length=batch.routing.shape[1])  # (S, L, n_layers, k)
        num_experts = moe.find_moe_layers(model)[0].num_experts
        out.update(moe.moe_metrics(batch.routing, now, num_experts, batch.mask, prefix=""))
    return out, old_logp


def make_optimizer(model, cfg: TrainConfig):
    """AdamW with a linear warm-up over ``cfg.warmup`` updates: lr_u = lr * min(1, (u + 1) / warmup)."""
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=tuple(cfg.adam_betas), eps=cfg.adam_eps,
                            weight_decay=cfg.weight_decay)
    warm = cfg.warmup
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: min(1.0, (u + 1) / warm) if warm else 1.0)
    return opt, sched


def batch_metrics(batch: Batch, old_logp: torch.Tensor, version: int) -> dict[str, Any]:
    """Score, pass rate, length and staleness of a mini-batch, and the rollout mismatch

        mismatch = sum_t m_t |old_logp_t - behaviour_logp_t| / sum_t m_t

    (training vs sampling log-probs of the same weights; 0 up to kernel differences).
    """
    s_mean, s_max = staleness_stats(batch.version, version)
    tokens = batch.mask.sum().clamp_min(1)
    mismatch = ((old_logp - batch.behaviour_logp).abs() * batch.mask).sum() / tokens
    return {"score": ((batch.rewards + 1) / 2).mean(), "pass_rate": (batch.rewards > 0).float().mean(),
            "response_length": batch.mask.sum(1).mean(), "staleness_mean": s_mean, "staleness_max": s_max,
            "rollout_mismatch": mismatch}
