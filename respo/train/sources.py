"""Where the learner's mini-batches come from: one small interface, a sync and an async source.

Synchronous (`SyncReuseSource`, the paper's staleness). One rollout step samples N*B prompts x G
responses with policy version v, recomputes ``old_logp`` with the same weights and hands out N
mini-batches of B prompts, one per update: mini-batch k has staleness k - 1. The first is flagged
on-policy (no update since its rollout), so its ``old_logp`` is the training forward itself and is
not recomputed. The loop computes each mini-batch's group advantages.

Asynchronous (`AsyncSource`). A worker thread (`respo.train.async_`) samples B x G batches with a
snapshot of the policy and recomputes their ``old_logp`` with that same snapshot; the learner trains
on them as they arrive and publishes its weights every ``sync_every`` updates; batches more than
``max_staleness`` versions behind are dropped, or with ``staleness_policy = "wait"`` never made. With
``segment_tokens`` the worker makes partial rollouts (`respo.train.partial`): it takes published weights
between segments, each token records its version, and its ``old_logp`` is scored by the snapshot of that
version. A checkpoint saves what the worker has in flight (`AsyncSource.checkpointing`), and a resumed
run continues from it.
"""

from __future__ import annotations

import copy
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Iterator, Protocol

import torch

from respo.runtime.engines import RolloutEngine
from respo.runtime.sampler import pad_token_id
from respo.train.async_ import AsyncRollouts, WholeBatch
from respo.train.buffer import Batch, PromptStream, RolloutBuffer, repeated_prompts
from respo.train.config import AsyncWorker, Rollouts
from respo.train.metrics import timed
from respo.train.partial import PartialRollout
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

    def checkpointing(self, version: int) -> Iterator[dict | None]:
        """A context for writing a checkpoint at learner ``version``: it yields what the source has in flight
        beyond the run state (the async worker's batches), or None, and holds it still meanwhile."""

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

    @contextmanager
    def checkpointing(self, version: int) -> Iterator[None]:
        yield None  # the rollout buffer is part of the run state

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
    """A rollout worker thread with its own snapshot model, generator and (shared) data cursor.

    The worker's jobs (`respo.train.async_.Job`) are whole rollouts, or with ``segment_tokens`` partial
    rollouts (`respo.train.partial.PartialRollout`) that take newly published weights between segments.
    ``resume``: what `checkpointing` yielded when the run was checkpointed; the worker continues from it
    (its snapshot's weights and version, its generator, the batches it had finished and the one it was
    making).
    """

    def __init__(self, policy: Policy, task, pool, rollouts: Rollouts, settings: AsyncWorker, *, stream: PromptStream,
                 version: int, engine: RolloutEngine, resume: dict | None = None):
        snapshot = copy.deepcopy(policy.model)  # the behaviour policy: the engine samples it, old_logp scores it
        snapshot.requires_grad_(False)
        if resume is not None and resume.get("snapshot") is not None:  # the worker was behind the learner
            snapshot.load_state_dict(resume["snapshot"])
        generator = torch.Generator(device=next(policy.model.parameters()).device)
        generator.manual_seed(settings.seed + WORKER_SEED_OFFSET)
        if resume is not None:
            generator.set_state(resume["generator"])
        self.sync_every, self.prompts, self.engine, self.snapshot = settings.sync_every, rollouts.prompts, engine, snapshot
        self.generator, self.repeats = generator, _RepeatedPrompts(rollouts)
        self._engine_lock = threading.Lock()  # the worker's sampling and syncs, or an evaluation: one at a time
        # weight-sync times, reported with the next mini-batch (those not yet reported when checkpointed, too)
        self._sync_s = list(resume.get("sync_s", [])) if resume else []
        self._sync_s.append(engine.sync_weights(snapshot))
        jobs = _WorkerJobs(self, policy, task, pool, rollouts, settings.segment_tokens, stream)

        def load(state_dict: dict) -> None:  # on the worker thread, at a boundary
            snapshot.load_state_dict(state_dict)
            with self._engine_lock:
                self._sync_s.append(engine.sync_weights(snapshot))

        self.worker = AsyncRollouts(producer=jobs, load_weights=load, queue_size=settings.queue_size,
                                    max_staleness=settings.max_staleness, initial_version=version,
                                    staleness_policy=settings.staleness_policy,
                                    resume=resume["worker"] if resume else None, load_job=jobs.load_job,
                                    load_item=_load_item)
        self._reported = dict(resume["reported"]) if resume else {"waited": 0, "wait_s": 0.0}
        self.worker.start()

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
        waited, wait_s = self.worker.waited, self.worker.wait_s  # the worker's totals; each record gets its share
        rec["waited"] = waited - self._reported["waited"]
        rec["time/worker_held"] = wait_s - self._reported["wait_s"]
        self._reported = {"waited": waited, "wait_s": wait_s}
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

    @contextmanager
    def checkpointing(self, version: int) -> Iterator[dict]:
        """Hold the worker at its next boundary and yield what is in flight (tensors and plain values), for a
        checkpoint written inside the block (the data cursor the worker draws from stands still meanwhile):
        the finished batches and the one in the making, the worker's counters and generator, and its
        snapshot's weights when its version is not the learner's ``version`` (otherwise they are the
        checkpoint's own)."""
        with self.worker.paused():
            behind = self.worker.worker_version != version
            yield {"worker": self.worker.state(job_state=lambda job: job.state(), item_state=_item_state),
                   "snapshot": {k: v.detach().clone() for k, v in self.snapshot.state_dict().items()} if behind else None,
                   "generator": self.generator.get_state(), "sync_s": list(self._sync_s),
                   "reported": dict(self._reported)}

    def close(self) -> None:
        self.worker.stop()


def _item_state(item: MiniBatch) -> dict:
    return {"batch": item.batch.state(), "metrics": dict(item.metrics)}


def _load_item(state: dict) -> MiniBatch:
    return MiniBatch(Batch.from_state(state["batch"]), False, dict(state["metrics"]))


class _WorkerJobs:
    """The async worker's jobs (`respo.train.async_.Producer`): each draws the next B prompts from the data
    cursor and makes their B x G responses, whole or in segments."""

    def __init__(self, source: AsyncSource, policy: Policy, task, pool, rollouts: Rollouts, segment_tokens: int,
                 stream: PromptStream):
        self.source, self.task, self.pool, self.stream = source, task, pool, stream
        self.rollouts, self.segment_tokens = rollouts, segment_tokens
        self.tokenizer, self.pad = policy.tokenizer, pad_token_id(policy.tokenizer)

    def start(self, version: int):
        indices = self.stream.next(self.rollouts.prompts)
        return _PartialJob(self, indices) if self.segment_tokens else WholeBatch(partial(self._whole, indices))

    def _whole(self, indices: list[int], version: int) -> MiniBatch:
        """A whole rollout of the prompts ``indices`` with one version, then its ``old_logp`` under that version's
        snapshot."""
        src = self.source
        with src._engine_lock:
            batch, rec = sample_rollout(src.engine, self.task, self.pool, indices, self.rollouts.sampling,
                                        src.generator, version)
        with timed(rec, "old_logp"):
            batch.old_logp = behaviour_or_recomputed(src.snapshot, batch, self.rollouts, start_row=0)
        return MiniBatch(batch, False, {k.replace("time/", "time/worker_"): t for k, t in rec.items()})

    def load_job(self, state: dict):
        return _PartialJob(self, list(state["indices"]), PartialRollout.from_state(state["rollout"]),
                           dict(state["metrics"]))


class _PartialJob:
    """A partial rollout: one segment per step; before the worker installs new weights, and when the batch is
    complete, the tokens not yet scored get their ``old_logp`` from the snapshot of the version that sampled
    them (`respo.train.partial`)."""

    def __init__(self, jobs: _WorkerJobs, indices: list[int], rollout: PartialRollout | None = None,
                 metrics: dict | None = None):
        sampling = jobs.rollouts.sampling
        self.jobs, self.indices = jobs, indices
        self.examples = [jobs.pool[i] for i in indices for _ in range(sampling.group_size)]
        if rollout is None:
            rows = jobs.tokenizer([ex.prompt for ex in self.examples])["input_ids"]
            index = torch.tensor([i for i in indices for _ in range(sampling.group_size)], dtype=torch.long)
            rollout = PartialRollout(rows, index, sampling.max_new_tokens, jobs.pad)
        self.rollout = rollout
        self.metrics = metrics if metrics is not None else {"time/worker_sample": 0.0, "time/worker_old_logp": 0.0}

    def step(self, version: int) -> bool:
        j, src = self.jobs, self.jobs.source
        t0 = time.perf_counter()
        with src._engine_lock:
            done = self.rollout.step(src.engine, version, j.segment_tokens, j.rollouts.sampling, src.generator)
        self.metrics["time/worker_sample"] += time.perf_counter() - t0
        if done:
            self.before_switch()
        return done

    def before_switch(self) -> None:
        if self.jobs.rollouts.correction.bypass:
            return
        t0 = time.perf_counter()
        self.rollout.score(self.jobs.source.snapshot, self.jobs.rollouts)
        self.metrics["time/worker_old_logp"] += time.perf_counter() - t0

    def result(self) -> MiniBatch:
        j = self.jobs
        batch = self.rollout.result(j.task, self.examples, j.tokenizer, bypass=j.rollouts.correction.bypass)
        return MiniBatch(batch, False, {**self.metrics, "segments": self.rollout.segments})

    def state(self) -> dict:
        return {"indices": list(self.indices), "rollout": self.rollout.state(), "metrics": dict(self.metrics)}
