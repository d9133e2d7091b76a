"""Async bookkeeping: staleness bound enforced, drops counted, every produced batch accounted for."""

import time
from types import SimpleNamespace

import pytest

from respo.train.async_ import AsyncRollouts


def _run(*, queue_size, max_staleness, sync_every, updates):
    def produce(v):
        time.sleep(0.001)
        return SimpleNamespace(version=v)

    loaded = []
    w = AsyncRollouts(produce, lambda sd: loaded.append(sd["w"].item()), queue_size=queue_size,
                      max_staleness=max_staleness).start()
    version, stale = 0, []
    try:
        for _ in range(updates):
            while w.queued < queue_size:  # let the worker fill the queue: the learner is the slow side
                time.sleep(0.001)
            item, _ = w.take(version)
            stale.append(version - item.version)
            version += 1  # the optimizer step
            if version % sync_every == 0:
                import torch
                w.publish({"w": torch.tensor(float(version))}, version)
    finally:
        w.stop()
    return w, stale, loaded


def test_on_policy_async_drops_everything_stale():
    # K = 1, max_staleness = 0: only samples of the current version may be used. After update 1 the
    # queue holds 2 version-0 batches, both produced before the worker could see version 1: >= 2 drops.
    w, stale, loaded = _run(queue_size=2, max_staleness=0, sync_every=1, updates=4)
    assert stale == [0, 0, 0, 0]
    assert w.dropped >= 2
    assert loaded and loaded == sorted(loaded)  # versions only move forward
    in_hand = w.produced - w.consumed - w.dropped - w.queued
    assert in_hand in (0, 1)  # the batch the worker held when it was stopped


def test_bounded_staleness_with_slower_sync():
    w, stale, _ = _run(queue_size=3, max_staleness=3, sync_every=2, updates=8)
    assert max(stale) <= 3 and len(stale) == 8
    assert max(stale) >= 1  # a full queue of 3 makes the learner consume old batches
    assert w.produced - w.consumed - w.dropped - w.queued in (0, 1)


def test_worker_errors_surface():
    def produce(v):
        raise ValueError("sampler exploded")

    w = AsyncRollouts(produce, lambda sd: None, queue_size=1, max_staleness=0).start()
    with pytest.raises(RuntimeError, match="rollout worker failed"):
        w.take(0, timeout=5)
    w.stop()


def test_async_training_run_end_to_end(tmp_path):
    # A real (tiny) async run: worker thread with its own snapshot, weights synced every 2 updates,
    # staleness bounded by max_staleness = 2 in every logged update, metrics and summary written.
    import json

    from respo.train.config import TrainConfig, apply_overrides
    from respo.train.trainer import train

    cfg = apply_overrides(TrainConfig(), dict(
        task_kwargs={"overlong": [12, 11]}, warm_start=False, prompts=2, group_size=4, max_new_tokens=12,
        eval_prompts=0, progress=False, tensorboard=False, lr=1e-3, warmup=0, mode="async", sync_every=2,
        max_staleness=2, queue_size=2, updates=6, threads=1, out_dir=str(tmp_path / "run")))
    run = train(cfg)
    recs = [json.loads(line) for line in open(run / "metrics.jsonl")]
    ups = [r for r in recs if "event" not in r]
    assert [r["update"] for r in ups] == [1, 2, 3, 4, 5, 6]
    assert all(0 <= r["staleness_mean"] <= r["staleness_max"] <= 2 for r in ups)
    assert all(r["time/update"] >= r["time/train"] > 0 for r in ups)  # the learner's wall time: its wait included
    assert ups[-1]["dropped_total"] == sum(r["dropped"] for r in ups)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["mode"] == "async" and summary["staleness_max"] <= 2
    assert (run / "final" / "config.json").is_file()
