"""Where the learner's mini-batches come from: one small interface, a sync and an async source.

Synchronous (`SyncReuseSource`, the paper's staleness). One rollout step samples N*B prompts x G
responses with policy version v, recomputes ``old_logp`` with the same weights and hands out N
mini-batches of B prompts, one per update: mini-batch k has staleness k - 1. The first is flagged
on-policy (no update since its rollout), so its ``old_logp`` is the training forward itself and is
not recomputed. The loop computes each mini-batch's group advantages.

Asynchronous (`AsyncSource`). A worker thread (`respo.train.async_`) samples B x G batches with a
snapshot of the policy and recomputes their ``old_logp`` with that same snapshot; the learner trains
on them as they arrive, publishes its weights every ``sync_every`` updates and drops batches more
than ``max_staleness`` versions behind.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from respo.train.async_ import AsyncRollouts
from respo.train.buffer import Batch, PromptStream, RolloutBuffer, repeated_prompts
from respo.train.config import TrainConfig
from respo.train.metrics import timed
from respo.train.policy import Policy
from respo.train.rollout import recompute_logp, sample_rollout

__all__ = ["MiniBatch", "MiniBatchSource", "SyncReuseSource", "AsyncSource"]

WORKER_SEED_OFFSET = 1  # the async worker samples from generator seed + 1, independent of the learner's


@dataclass(frozen=True)
class MiniBatch:
    """One update's data: B*G rows, whether it is on-policy, and how it was obtained (``time/*``, ``dropped``)."""

    batch: Batch
    on_policy: bool = False  # no update since its rollout: old_logp is the training forward itself
    metrics: dict[str, Any] = field(default_factory=dict)


class MiniBatchSource(Protocol):
    def next(self, version: int) -> MiniBatch:
        """The mini-batch for the update that turns policy ``version`` into ``version + 1``."""

    def after_update(self, model: torch.nn.Module, update: int, version: int) -> None:
        """Called after every update with the new weights."""

    def close(self) -> None:
        """Release what the source holds (threads)."""


class _RepeatedPrompts:
    """Counts a rollout's repeated prompt draws into the update record (``repeated_prompts``) and says
    once on stderr that they happen."""

    def __init__(self, cfg: TrainConfig):
        self.cfg, self.said = cfg, False

    def note(self, rec: dict[str, Any], batch: Batch, draws: int) -> None:
        repeated = repeated_prompts(batch, self.cfg.group_size)
        if not repeated:
            return
        rec["repeated_prompts"] = repeated
        if not self.said:
            self.said = True
            print(f"[respo] warning: a rollout step draws {draws} prompts from a training pool of "
                  f"{self.cfg.train_pool}, so {repeated} of them repeat within the step (counted as repeated_prompts "
                  f"in metrics.jsonl); raise train_pool or lower reuse x prompts to avoid it", file=sys.stderr,
                  flush=True)


class SyncReuseSource:
    """Reuse-N: each rollout step serves N consecutive updates (state in ``stream``, ``buffer``, ``generator``)."""

    def __init__(self, policy: Policy, task, pool, cfg: TrainConfig, *, stream: PromptStream, buffer: RolloutBuffer,
                 generator: torch.Generator):
        self.policy, self.task, self.pool, self.cfg = policy, task, pool, cfg
        self.stream, self.buffer, self.generator = stream, buffer, generator
        self.repeats = _RepeatedPrompts(cfg)

    def next(self, version: int) -> MiniBatch:
        rec: dict[str, Any] = {}
        if not self.buffer.remaining:  # a new rollout step with the current policy (version v)
            batch, rec = sample_rollout(self.policy, self.task, self.pool, self.stream.next(self.cfg.rollout_prompts),
                                       self.cfg, self.generator, version)
            with timed(rec, "old_logp"):  # the first mini-batch's rows are left to the on-policy update
                batch.old_logp = recompute_logp(self.policy.model, batch, self.cfg, start_row=self.cfg.mini_batch_seqs)
            self.buffer.put(batch)
        # every update record of a rollout step says how many of its prompt draws repeat (the step's whole
        # batch is in the buffer, checkpoints included, so a resumed run says it too)
        self.repeats.note(rec, self.buffer.batch, self.cfg.rollout_prompts)
        on_policy = self.buffer.next_index == 0
        return MiniBatch(self.buffer.take(), on_policy, rec)

    def after_update(self, model: torch.nn.Module, update: int, version: int) -> None:
        pass

    def close(self) -> None:
        pass


class AsyncSource:
    """A rollout worker thread with its own snapshot model, generator and (shared) data cursor."""

    def __init__(self, policy: Policy, task, pool, cfg: TrainConfig, *, stream: PromptStream, version: int):
        snapshot = Policy(copy.deepcopy(policy.model), policy.tokenizer, policy.info)
        snapshot.model.requires_grad_(False)
        generator = torch.Generator(device=next(policy.model.parameters()).device)
        generator.manual_seed(cfg.seed + WORKER_SEED_OFFSET)
        self.sync_every, self.prompts = cfg.sync_every, cfg.prompts
        self.repeats = _RepeatedPrompts(cfg)

        def produce(v: int) -> Batch:
            batch, _ = sample_rollout(snapshot, task, pool, stream.next(cfg.prompts), cfg, generator, v)
            batch.old_logp = recompute_logp(snapshot.model, batch, cfg)
            return batch

        self.worker = AsyncRollouts(produce, snapshot.model.load_state_dict, queue_size=cfg.queue_size,
                                    max_staleness=cfg.max_staleness, initial_version=version).start()

    def next(self, version: int) -> MiniBatch:
        rec: dict[str, Any] = {}
        with timed(rec, "wait"):
            batch, dropped = self.worker.take(version)
        rec["dropped"] = dropped
        self.repeats.note(rec, batch, self.prompts)
        return MiniBatch(batch, False, rec)

    def after_update(self, model: torch.nn.Module, update: int, version: int) -> None:
        if update % self.sync_every == 0:
            self.worker.publish(model.state_dict(), version)

    def close(self) -> None:
        self.worker.stop()
