"""Bounded asynchronous rollouts: a worker thread samples with a policy snapshot while the learner trains.

    worker:  snapshot(version v) -> produce() -> Batch(version = v) -> bounded queue
    learner: take() -> staleness s = current - v; s > max_staleness: drop (counted); else train
             every K updates: publish(weights, version) -> worker loads them before its next batch

The queue is bounded (``queue_size``), so the worker can run at most ``queue_size`` batches ahead
(plus the one it is producing); staleness of consumed samples is therefore at most about
``queue_size + sync_every`` versions, and ``max_staleness`` enforces a hard bound by dropping.
The worker owns its own model copy, RNG generator and data cursor, so it never reads weights the
learner is changing.

Checkpoint rule: the queue is not saved. A resumed async run restarts the worker from the
learner's current weights (staleness starts again at 0); sync-mode resume is bitwise, async is not.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

import torch

__all__ = ["AsyncRollouts"]

POLL_S = 0.05  # how often a blocked put/get wakes up to check for stop requests and worker errors
TAKE_TIMEOUT_S = 600.0  # the learner gives up when no batch arrives for this long
JOIN_TIMEOUT_S = 60.0  # stop() waits this long for the worker to finish its current batch


class AsyncRollouts:
    """A rollout worker thread feeding a bounded queue, with weight sync and staleness-based dropping.

    Args:
        produce: ``produce(version) -> batch`` samples one batch with the worker's current snapshot;
            the batch must carry ``version`` (an int or a (S,) tensor) telling which policy produced it.
        load_weights: ``load_weights(state_dict)`` installs published weights in the worker's snapshot
            (called on the worker thread between batches).
        queue_size: batches that may wait in the queue (>= 1).
        max_staleness: a batch more than this many versions behind the learner is dropped.
        initial_version: version of the snapshot the worker starts from.
    """

    def __init__(self, produce: Callable[[int], Any], load_weights: Callable[[dict], None], *, queue_size: int,
                 max_staleness: int, initial_version: int = 0):
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size}")
        self._produce, self._load = produce, load_weights
        self.max_staleness = max_staleness
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._lock = threading.Lock()
        self._pending: tuple[int, dict] | None = None
        self.worker_version = initial_version
        self.produced = 0
        self.consumed = 0
        self.dropped = 0
        self.syncs = 0
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="respo-rollout-worker", daemon=True)

    # --- worker side ---
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                with self._lock:
                    pending, self._pending = self._pending, None
                if pending is not None:
                    self._load(pending[1])
                    self.worker_version = pending[0]
                    self.syncs += 1
                item = self._produce(self.worker_version)
                self.produced += 1
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=POLL_S)
                        break
                    except queue.Full:
                        continue
        except BaseException as err:  # surfaced to the learner in take()
            self._error = err

    # --- learner side ---
    def start(self) -> "AsyncRollouts":
        self._thread.start()
        return self

    def publish(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Hand the learner's weights (copied here) to the worker; it loads them before its next batch."""
        copy = {k: v.detach().clone() for k, v in state_dict.items()}
        with self._lock:
            self._pending = (version, copy)

    def take(self, current_version: int, timeout: float = TAKE_TIMEOUT_S) -> tuple[Any, int]:
        """Next batch whose staleness ``current_version - version`` is <= max_staleness.

        Returns:
            (batch, number of batches dropped while looking for it).
        """
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
            v = item.version
            oldest = int(v.min().item()) if isinstance(v, torch.Tensor) else int(v)
            if current_version - oldest > self.max_staleness:
                self.dropped += 1
                dropped_now += 1
                continue
            self.consumed += 1
            return item, dropped_now

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=JOIN_TIMEOUT_S)

    @property
    def queued(self) -> int:
        return self._queue.qsize()
