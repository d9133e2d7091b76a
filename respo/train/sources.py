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
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol

import torch

from respo.runtime.engines import RolloutEngine
from respo.train.async_ import AsyncRollouts
from respo.train.buffer import Batch, PromptStream, RolloutBuffer, repeated_prompts
from respo.train.config import Rollouts
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

    @property
    def version(self) -> torch.Tensor:
        """(B*G,) the policy version that sampled each row (what the async worker's staleness check reads)."""
        return self.batch.version


class MiniBatchSource(Protocol):
    def next(self, version: int) -> MiniBatch:
        """The mini-batch for the update that turns policy ``version`` into ``version + 1``."""

    def after_update(self, model: torch.nn.Module, update: int, version: int) -> None:
        """Called after every update with the new weights."""

    def evaluating(self, model: torch.nn.Module) -> Iterator[None]:
        """A context in which the engine samples ``model`` (the learner's current weights), for an evaluation."""

    def close(self) -> None:
        """Release what the source holds (threads); the engine stays open (the run closes it)."""


class _RepeatedPrompts:
    """Counts a rollout's repeated prompt draws into the update record (``repeated_prompts``) and says
    once on stderr that they happen."""

    def __init__(self, rollouts: Rollouts):
        self.group_size, self.train_pool, self.said = rollouts.sampling.group_size, rollouts.train_pool, False

    def note(self, rec: dict[str, Any], batch: Batch, draws: int) -> None:
        repeated = repeated_prompts(batch, self.group_size)
        if not repeated:
            return
        rec["repeated_prompts"] = repeated
        if not self.said:
            self.said = True
            print(f"[respo] warning: a rollout step draws {draws} prompts from a training pool of "
                  f"{self.train_pool}, so {repeated} of them repeat within the step (counted as repeated_prompts "
                  f"in metrics.jsonl); raise train_pool or lower reuse x prompts to avoid it", file=sys.stderr,
                  flush=True)


class SyncReuseSource:
    """Reuse-N: each rollout step serves N consecutive updates (state in ``stream``, ``buffer``, ``generator``)."""

    def __init__(self, policy: Policy, task, pool, rollouts: Rollouts, *, stream: PromptStream, buffer: RolloutBuffer,
                 generator: torch.Generator, engine: RolloutEngine):
        self.policy, self.task, self.pool, self.rollouts = policy, task, pool, rollouts
        self.stream, self.buffer, self.generator, self.engine = stream, buffer, generator, engine
        self.repeats = _RepeatedPrompts(rollouts)

    def next(self, version: int) -> MiniBatch:
        rec: dict[str, Any] = {}
        ro = self.rollouts
        if not self.buffer.remaining:  # a new rollout step with the current policy (version v)
            rec["time/sync"] = self.engine.sync_weights(self.policy.model)  # the engine samples version v
            batch, sampled = sample_rollout(self.engine, self.task, self.pool, self.stream.next(ro.prompts),
                                            ro.sampling, self.generator, version)
            rec.update(sampled)
            with timed(rec, "old_logp"):
                batch.old_logp = behaviour_or_recomputed(self.policy.model, batch, ro)
            self.buffer.put(batch)
        # every update record of a rollout step says how many of its prompt draws repeat (the step's whole
        # batch is in the buffer, checkpoints included, so a resumed run says it too)
        self.repeats.note(rec, self.buffer.batch, ro.prompts)
        on_policy = self.buffer.next_index == 0 and not ro.correction.bypass
        return MiniBatch(self.buffer.take(), on_policy, rec)

    def after_update(self, model: torch.nn.Module, update: int, version: int) -> None:
        pass

    @contextmanager
    def evaluating(self, model: torch.nn.Module) -> Iterator[None]:
        self.engine.sync_weights(model)  # the next rollout step syncs again before it samples
        yield

    def close(self) -> None:
        pass


def behaviour_or_recomputed(model: torch.nn.Module, batch: Batch, rollouts: Rollouts, *, start_row: int | None = None):
    """A rollout's ``old_logp``: recomputed by the trainer (rows from ``start_row``, by default the second
    mini-batch on: the first is trained before any update and takes the training forward itself), or with
    ``rollout_bypass`` the engine's own log-probs."""
    if rollouts.correction.bypass:
        return batch.behaviour_logp.clone()
    return recompute_logp(model, batch, rollouts.forward, mini_batch=rollouts.mini_batch,
                          start_row=rollouts.mini_batch if start_row is None else start_row)


class AsyncSource:
    """A rollout worker thread with its own snapshot model, generator and (shared) data cursor."""

    def __init__(self, policy: Policy, task, pool, rollouts: Rollouts, *, stream: PromptStream, version: int,
                 engine: RolloutEngine, seed: int, sync_every: int, queue_size: int, max_staleness: int):
        snapshot = copy.deepcopy(policy.model)  # the behaviour policy: the engine samples it, old_logp scores it
        snapshot.requires_grad_(False)
        generator = torch.Generator(device=next(policy.model.parameters()).device)
        generator.manual_seed(seed + WORKER_SEED_OFFSET)
        self.sync_every, self.prompts, self.engine, self.snapshot = sync_every, rollouts.prompts, engine, snapshot
        self.repeats = _RepeatedPrompts(rollouts)
        self._engine_lock = threading.Lock()  # the worker's sampling and syncs, or an evaluation: one at a time
        self._sync_s = [engine.sync_weights(snapshot)]  # weight-sync times, reported with the next mini-batch

        def produce(v: int) -> MiniBatch:
            with self._engine_lock:
                batch, rec = sample_rollout(engine, task, pool, stream.next(rollouts.prompts), rollouts.sampling,
                                            generator, v)
            with timed(rec, "old_logp"):
                batch.old_logp = behaviour_or_recomputed(snapshot, batch, rollouts, start_row=0)
            return MiniBatch(batch, False, {k.replace("time/", "time/worker_"): t for k, t in rec.items()})

        def load(state_dict: dict) -> None:  # on the worker thread, between batches
            snapshot.load_state_dict(state_dict)
            with self._engine_lock:
                self._sync_s.append(engine.sync_weights(snapshot))

        self.worker = AsyncRollouts(produce, load, queue_size=queue_size, max_staleness=max_staleness,
                                    initial_version=version).start()

    def next(self, version: int) -> MiniBatch:
        rec: dict[str, Any] = {}
        with timed(rec, "wait"):
            produced, dropped = self.worker.take(version)
        batch = produced.batch
        rec.update(produced.metrics)
        syncs, self._sync_s = self._sync_s, []
        if syncs:
            rec["time/sync"] = sum(syncs)
        rec["dropped"] = dropped
        self.repeats.note(rec, batch, self.prompts)
        return MiniBatch(batch, False, rec)

    def after_update(self, model: torch.nn.Module, update: int, version: int) -> None:
        if update % self.sync_every == 0:
            self.worker.publish(model.state_dict(), version)

    @contextmanager
    def evaluating(self, model: torch.nn.Module) -> Iterator[None]:
        with self._engine_lock:  # the worker waits; then the engine holds its snapshot again
            self.engine.sync_weights(model)
            try:
                yield
            finally:
                self.engine.sync_weights(self.snapshot)

    def close(self) -> None:
        self.worker.stop()
