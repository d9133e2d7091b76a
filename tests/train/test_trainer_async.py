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


def _paced(policy, *, queue_size, max_staleness, sync_every, updates, skip_every=0):
    """A slow learner (20 ms per update) against a fast worker: the worker gets as far ahead as it may.
    ``skip_every``: every such update is skipped (non-finite): the version does not advance."""
    import torch

    def produce(v):
        time.sleep(0.001)
        return SimpleNamespace(version=v)

    w = AsyncRollouts(produce, lambda sd: None, queue_size=queue_size, max_staleness=max_staleness,
                      staleness_policy=policy).start()
    version, stale = 0, []
    try:
        for u in range(1, updates + 1):
            time.sleep(0.02)
            item, _ = w.take(version, timeout=30)
            stale.append(version - item.version)
            version += 0 if skip_every and u % skip_every == 0 else 1
            if u % sync_every == 0:
                w.publish({"w": torch.tensor(0.0)}, version)
    finally:
        w.stop()
    return w, stale


def test_drop_throws_away_what_a_fast_worker_made_too_early():
    # queue of 3, bound 1, sync every update: the worker fills the queue with version-0 batches while the
    # learner's first update runs; at version 2 the third of them is 2 behind: dropped.
    w, stale = _paced("drop", queue_size=3, max_staleness=1, sync_every=1, updates=10)
    assert max(stale) <= 1 and w.dropped >= 1 and w.waited == 0


def test_wait_never_drops_and_never_exceeds_its_bound():
    # The same worker under wait: it starts a batch only when the learner cannot take it more than 1 version
    # behind. Learner at t with a finished batches waiting: the new one is taken at t + a at the latest, so
    # with its version v the worker needs t + a - v <= 1: with v = t it may have one batch waiting, not two
    # (the queue of 3 never fills), and it holds (waited) until the next take or publication.
    w, stale = _paced("wait", queue_size=3, max_staleness=1, sync_every=1, updates=10)
    assert w.dropped == 0 and max(stale) <= 1 and len(stale) == 10
    assert w.waited >= 1 and w.wait_s > 0  # it did hold back
    assert w.produced - w.consumed - w.queued in (0, 1)  # everything made was trained (or is in hand at the stop)


def test_wait_at_the_tightest_bound_with_rare_syncs_and_skipped_updates_goes_on():
    # max_staleness = sync_every - 1 = 2 (the least the config allows): the worker's weights are up to 2
    # versions old when published, so at times it may have no batch ahead at all; and every third update is
    # skipped (the version stays), which a bound counted in updates rather than versions would deadlock on.
    w, stale = _paced("wait", queue_size=2, max_staleness=2, sync_every=3, updates=12, skip_every=3)
    assert w.dropped == 0 and max(stale) <= 2 and len(stale) == 12


def test_the_staleness_policy_and_partial_rollouts_are_checked_up_front():
    from respo.train.config import ConfigError, TrainConfig, validate

    for kw, words in [({"mode": "async", "staleness_policy": "block"}, "staleness_policy 'block' is unknown; choose drop or wait"),
                      ({"mode": "async", "segment_tokens": -1}, "segment_tokens must be >= 0"),
                      ({"segment_tokens": 8}, "segment_tokens .partial rollouts. applies to async mode only"),
                      ({"mode": "async", "segment_tokens": 8, "model": "tiny-moe", "routing_replay": True},
                       "routing_replay with segment_tokens")]:
        with pytest.raises(ConfigError, match=words):
            validate(TrainConfig(**kw))
    with pytest.raises(ValueError, match="staleness_policy 'x' is unknown"):
        AsyncRollouts(lambda v: None, lambda sd: None, queue_size=1, max_staleness=0, staleness_policy="x")


def test_a_wait_run_records_its_policy_and_drops_nothing(tmp_path):
    # A real (tiny) async run under wait, bound 1 with weights synced every update and room for 2 waiting
    # batches: no update drops a batch, none is more than 1 version behind, the holds are counted.
    import json

    from respo.train.config import TrainConfig, apply_overrides
    from respo.train.trainer import train

    cfg = apply_overrides(TrainConfig(), dict(
        task_kwargs={"overlong": [12, 11]}, warm_start=False, prompts=2, group_size=4, max_new_tokens=12,
        eval_prompts=0, progress=False, tensorboard=False, lr=1e-3, warmup=0, mode="async", sync_every=1,
        max_staleness=1, queue_size=2, staleness_policy="wait", updates=5, threads=1, out_dir=str(tmp_path / "run")))
    run = train(cfg)
    ups = [json.loads(line) for line in open(run / "metrics.jsonl") if '"event"' not in line]
    assert json.loads((run / "config.json").read_text())["staleness_policy"] == "wait"
    assert [r["update"] for r in ups] == [1, 2, 3, 4, 5]
    assert all(r["dropped"] == 0 and r["staleness_max"] <= 1 for r in ups)
    assert ups[-1]["waited_total"] == sum(r["waited"] for r in ups)
    assert all(abs(sum(v for k, v in r.items() if k.startswith("staleness/lag_")) - 1) < 1e-9 for r in ups)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["dropped"] == 0 and summary["waited"] == ups[-1]["waited_total"]
