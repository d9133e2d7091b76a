"""Bounded asynchronous rollouts: a worker thread samples with a policy snapshot while the learner trains.

    worker:  at a boundary: load published weights (version v) -> start a batch or run one more step of it
             (a whole rollout, or one segment of a partial rollout) -> finished batches go to a bounded queue
    learner: take() -> staleness s = current - oldest version in the batch; train
             every K updates: publish(weights, version) -> the worker loads them at its next boundary

A *job* is one batch in the making (`Job`): ``step(version)`` runs one piece of it with the worker's current
weights and says when the batch is complete. A whole rollout is one step; a partial rollout
(`respo.train.partial`) is one step per segment, so weights published while it is generated are taken
between its segments and one response spans several versions. Before the worker installs new weights it
calls ``job.before_switch()``, so the job can finish what needs the old ones (score its tokens under them).

How the bound ``max_staleness`` is kept (``staleness_policy``):

- ``drop``: the worker runs freely (at most ``queue_size`` batches waiting, plus the one in the making);
  the learner throws away a batch whose oldest token is more than ``max_staleness`` versions behind it
  (counted in ``dropped``).
- ``wait``: nothing is thrown away. The learner takes batches in order and each take is followed by at
  most one update, so a batch started now is taken at a version no later than ``t + a``, where ``t`` is the
  version of the learner's next take and ``a`` the batches finished and not yet taken. The worker starts
  a new batch only when its own version ``v`` satisfies ``t + a - v <= max_staleness``, otherwise it holds
  (counted once per held batch in ``waited``, its seconds in ``wait_s``) until new weights or a take let
  it. The learner then never meets a batch beyond the bound, and no fast rollout is preferred to a slow
  one. It cannot deadlock: with nothing finished (a = 0) the learner at version ``t`` has published
  a version ``>= t - (sync_every - 1) >= t - max_staleness`` (the config requires
  ``max_staleness >= sync_every - 1``).

The worker owns its own model copy, RNG generator and data cursor, so it never reads weights the
learner is changing.

Checkpoints: `paused` stops the worker at its next boundary (having loaded any published weights) and
`state` then describes everything in flight: the finished batches in the queue, the job in the making (a
partial rollout at a segment boundary, its tokens' versions and log-probs), the worker's version and
counters. A worker built with that state continues exactly there (`respo.train.sources.AsyncSource`
saves and restores the snapshot's weights with it), so a resumed run trains on the batches the
interrupted one had in flight, with the versions they were sampled with.
"""

from __future__ import annotations

import queue
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Protocol

import torch

__all__ = ["AsyncRollouts", "Job", "Producer", "STALENESS_POLICIES", "WholeBatch", "oldest_version"]

POLL_S = 0.05  # how often a blocked put/get/hold wakes up to check for stop requests and worker errors
TAKE_TIMEOUT_S = 600.0  # the learner gives up when no batch arrives for this long
JOIN_TIMEOUT_S = 60.0  # stop() waits this long for the worker to finish its current step
PAUSE_TIMEOUT_S = 600.0  # paused() gives up when the worker reaches no boundary for this long
STALENESS_POLICIES = ("drop", "wait")


class Job(Protocol):
    def step(self, version: int) -> bool:
        """Run one piece of the batch with the worker's current weights (``version``); True when it is complete."""

    def before_switch(self) -> None:
        """The worker is about to install new weights: do what still needs the current ones."""

    def result(self) -> Any:
        """The finished batch (an object with ``version``: an int or a (S,) tensor)."""


class Producer(Protocol):
    def start(self, version: int) -> Job:
        """A new batch in the making, started with the worker's current weights (``version``)."""


def oldest_version(item: Any) -> int:
    v = item.version
    return int(v.min().item()) if isinstance(v, torch.Tensor) else int(v)


class WholeBatch:
    """A job of one step (`Job`): ``produce(version)`` makes the whole batch."""

    def __init__(self, produce: Callable[[int], Any]):
        self._produce, self._item = produce, None

    def step(self, version: int) -> bool:
        self._item = self._produce(version)
        return True

    def before_switch(self) -> None:
        pass

    def result(self) -> Any:
        return self._item


class _WholeBatches:
    def __init__(self, produce: Callable[[int], Any]):
        self._produce = produce

    def start(self, version: int) -> Job:
        return WholeBatch(self._produce)


class AsyncRollouts:
    """A rollout worker thread feeding a bounded queue, with weight sync and a staleness bound.

    Args:
        produce: ``produce(version) -> batch`` samples one whole batch with the worker's current snapshot;
            the batch must carry ``version`` (an int or a (S,) tensor) telling which policy produced it.
            Give this or ``producer``.
        load_weights: ``load_weights(state_dict)`` installs published weights in the worker's snapshot
            (called on the worker thread at a boundary).
        queue_size: batches that may wait in the queue (>= 1).
        max_staleness: the most versions a trained batch's oldest token may be behind the learner.
        initial_version: version of the snapshot the worker starts from.
        staleness_policy: ``drop`` or ``wait`` (see the module docstring).
        producer: makes the jobs (`Producer`), e.g. partial rollouts; instead of ``produce``.
        resume: `state` of a worker that was paused for a checkpoint, with ``load_job`` / ``load_item``
            (the producer's) rebuilding its job and batches: the worker continues where that one stood.
    """

    def __init__(self, produce: Callable[[int], Any] | None = None, load_weights: Callable[[dict], None] = None, *,
                 queue_size: int, max_staleness: int, initial_version: int = 0, staleness_policy: str = "drop",
                 producer: Producer | None = None, resume: dict | None = None,
                 load_job: Callable[[Any], Job] | None = None, load_item: Callable[[Any], Any] | None = None):
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size}")
        if staleness_policy not in STALENESS_POLICIES:
            raise ValueError(f"staleness_policy {staleness_policy!r} is unknown; choose drop or wait")
        if (produce is None) == (producer is None):
            raise ValueError("give AsyncRollouts one of produce (whole batches) or producer (jobs)")
        self._producer = producer if producer is not None else _WholeBatches(produce)
        self._load = load_weights
        self.max_staleness, self.policy = max_staleness, staleness_policy
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._lock = threading.Lock()
        self._wake = threading.Event()  # set by the learner (a take, a publication): a held worker looks again
        self._pending: tuple[int, dict] | None = None
        self._job: Job | None = None  # the batch in the making
        self._outbox: Any = None  # a finished batch the full queue has no room for yet
        self.worker_version = initial_version
        self.produced = 0  # batches finished by the worker
        self.taken = 0  # batches the learner took from the queue (consumed + dropped)
        self.consumed = 0
        self.dropped = 0
        self.waited = 0  # batches the wait policy held back before starting them
        self.wait_s = 0.0  # seconds the worker spent holding them back
        self.syncs = 0
        self._next_take = initial_version  # the learner's version at its next take, at most
        self._holding_since: float | None = None
        self._pause_req = threading.Event()
        self._paused = threading.Event()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        if resume is not None:
            self._restore(resume, load_job, load_item)
        self._thread = threading.Thread(target=self._run, name="respo-rollout-worker", daemon=True)

    # --- worker side ---
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._boundary()
                if self._stop.is_set():
                    break
                if self._outbox is not None:
                    try:
                        self._queue.put(self._outbox, timeout=POLL_S)
                    except queue.Full:
                        continue
                    self._outbox = None
                    continue
                if self._job is None:
                    if not self._may_start():
                        self._hold()
                        continue
                    self._job = self._producer.start(self.worker_version)
                if self._job.step(self.worker_version):
                    self._outbox, self._job = self._job.result(), None
                    self.produced += 1
        except BaseException as err:  # surfaced to the learner in take()
            self._error = err

    def _boundary(self) -> None:
        """Between steps: install published weights (the job first finishes what needs the old ones), then
        pause here if a checkpoint asked for it (the pause request is read before the weights, so weights
        published before it are always installed before the pause)."""
        pausing = self._pause_req.is_set()
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            if self._job is not None:
                self._job.before_switch()
            self._load(pending[1])
            self.worker_version = pending[0]
            self.syncs += 1
        if pausing:
            self._paused.set()
            while self._pause_req.is_set() and not self._stop.is_set():
                time.sleep(POLL_S / 10)
            self._paused.clear()

    def _may_start(self) -> bool:
        """Whether a new batch may start now (always under ``drop``; see the module docstring for ``wait``)."""
        if self.policy == "drop":
            return True
        with self._lock:
            ahead = self.produced - self.taken  # finished, not yet taken (counted before the learner's take ends)
            latest = self._next_take + ahead  # the latest version the learner can take the new batch at
        if latest - self.worker_version <= self.max_staleness:
            if self._holding_since is not None:
                self.wait_s += time.perf_counter() - self._holding_since
                self._holding_since = None
            return True
        return False

    def _hold(self) -> None:
        if self._holding_since is None:
            self._holding_since = time.perf_counter()
            self.waited += 1
        self._wake.wait(POLL_S)
        self._wake.clear()

    # --- learner side ---
    def start(self) -> "AsyncRollouts":
        self._thread.start()
        return self

    def publish(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Hand the learner's weights (copied here) to the worker; it loads them at its next boundary."""
        copy = {k: v.detach().clone() for k, v in state_dict.items()}
        with self._lock:
            self._pending = (version, copy)
        self._wake.set()

    def take(self, current_version: int, timeout: float = TAKE_TIMEOUT_S) -> tuple[Any, int]:
        """Next batch whose staleness ``current_version - oldest version`` is <= max_staleness.

        Returns:
            (batch, number of batches dropped while looking for it).

        Raises:
            RuntimeError: the worker failed, or (``wait``) a batch beyond the bound arrived, which the
                policy rules out: it is not dropped silently.
        """
        with self._lock:
            self._next_take = current_version
        self._wake.set()
        dropped_now = 0
        while True:
            if self._error is not None:
                raise RuntimeError("the rollout worker failed") from self._error
            try:
                item = self._queue.get(timeout=POLL_S)
            except queue.Empty:
                timeout -= POLL_S
                if timeout <= 0:
                    raise TimeoutError("no rollout batch arrived from the worker") from None
                continue
            stale = current_version - oldest_version(item)
            with self._lock:
                self.taken += 1
                if stale <= self.max_staleness:
                    self.consumed += 1
                    self._next_take = current_version + 1  # one update, at most, before the next take
            self._wake.set()
            if stale <= self.max_staleness:
                return item, dropped_now
            if self.policy == "wait":
                raise RuntimeError(f"the wait policy let a batch {stale} versions behind the learner through "
                                   f"(max_staleness {self.max_staleness}): its bookkeeping is wrong")
            self.dropped += 1
            dropped_now += 1

    @contextmanager
    def paused(self, timeout: float = PAUSE_TIMEOUT_S) -> Iterator[None]:
        """Hold the worker at its next boundary for the duration of the block (a checkpoint reads `state`)."""
        self._pause_req.set()
        try:
            while not self._paused.is_set():
                if self._error is not None:
                    raise RuntimeError("the rollout worker failed") from self._error
                if not self._thread.is_alive():
                    break  # stopped (or never started): nothing moves
                timeout -= POLL_S / 10
                if timeout <= 0:
                    raise TimeoutError("the rollout worker reached no boundary to pause at")
                time.sleep(POLL_S / 10)
            yield
        finally:
            self._pause_req.clear()

    def state(self, job_state: Callable[[Job], Any], item_state: Callable[[Any], Any]) -> dict[str, Any]:
        """What is in flight, for a checkpoint (call inside `paused`): ``job_state`` / ``item_state`` turn the
        job in the making and each finished batch into tensors and plain values."""
        with self._queue.mutex:
            items = list(self._queue.queue)
        if self._outbox is not None:
            items.append(self._outbox)
        return {"worker_version": self.worker_version, "produced": self.produced, "taken": self.taken,
                "consumed": self.consumed, "dropped": self.dropped, "waited": self.waited, "wait_s": self.wait_s,
                "syncs": self.syncs, "items": [item_state(it) for it in items],
                "job": None if self._job is None else job_state(self._job)}

    def _restore(self, state: dict, load_job, load_item) -> None:
        for name in ("worker_version", "produced", "taken", "consumed", "dropped", "waited", "wait_s", "syncs"):
            setattr(self, name, state[name])
        items = [load_item(s) for s in state["items"]]
        if len(items) > self._queue.maxsize + 1:
            raise ValueError(f"the saved worker holds {len(items)} finished batches, more than queue_size "
                             f"{self._queue.maxsize} + 1")
        for it in items[:self._queue.maxsize]:
            self._queue.put_nowait(it)
        self._outbox = items[self._queue.maxsize] if len(items) > self._queue.maxsize else None
        self._job = None if state["job"] is None else load_job(state["job"])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=JOIN_TIMEOUT_S)

    @property
    def queued(self) -> int:
        return self._queue.qsize()
