"""Partial rollouts: responses generated in segments across weight publications, every token with the
version that sampled it, its behaviour log-prob and its old_logp under that version; and a worker's
bookkeeping carried across a checkpoint and a kill."""

import copy
import io
import json
import threading

import pytest
import torch

from respo.core.staleness import token_staleness_metrics
from respo.runtime.engines.respo import RespoEngine
from respo.runtime.logprobs import token_logprobs
from respo.runtime.models import build_policy
from respo.runtime.tasks import get_task
from respo.runtime.tokenizer import build_char_tokenizer
from respo.train import sources
from respo.train.buffer import PromptStream
from respo.train.config import AsyncWorker, Rollouts
from respo.train.partial import PartialRollout
from respo.train.policy import Policy

from trainer_support import small_cfg


def _move(model, version: int) -> None:
    """The learner's "update" to ``version``: every weight moved by noise seeded by the version."""
    g = torch.Generator().manual_seed(1000 + version)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))


def _logp(model, batch) -> torch.Tensor:
    with torch.no_grad():
        lp, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_start)  # (S, T)
    return lp * batch.mask


@pytest.fixture(scope="module")
def tiny():
    tok = build_char_tokenizer()
    task = get_task("addition", overlong=(12, 11))
    return tok, task, task.examples("train", 64, 0)


def test_a_response_spans_two_versions_with_each_tokens_own_log_probs(tiny):
    # Segments of 4 tokens: the first by version 0, the rest by version 1 (the engine synced in between).
    # Every token's version, behaviour log-prob and old_logp must be those of the weights that sampled it,
    # checked against the trainer's recompute of the finished responses under each version.
    tok, task, pool = tiny
    v0 = build_policy("tiny-dense", tok, seed=0, initializer_range=0.1)
    v1 = copy.deepcopy(v0)
    _move(v1, 1)
    cfg = small_cfg(mode="async", segment_tokens=4, max_new_tokens=12, group_size=2)
    examples = [pool[i] for i in range(3) for _ in range(2)]
    rows = tok([ex.prompt for ex in examples])["input_ids"]
    pr = PartialRollout(rows, torch.tensor([i for i in range(3) for _ in range(2)]), 12, tok.pad_token_id)
    engine, g = RespoEngine(v0, tok), torch.Generator().manual_seed(0)
    rollouts = Rollouts.of(cfg)
    assert not pr.step(engine, 0, 4, rollouts.sampling, g)  # segment 1, version 0
    pr.score(v0, rollouts)  # what the worker does before it installs other weights
    engine.sync_weights(v1)
    while not pr.step(engine, 1, 4, rollouts.sampling, g):  # segments 2 and 3, version 1
        pass
    pr.score(v1, rollouts)
    batch = pr.result(task, examples, tok, bypass=False)
    m, tv = batch.mask, batch.token_version
    lengths = m.sum(1).long()
    spanning = [r for r in range(6) if lengths[r] > 4]
    assert len(spanning) >= 2  # responses of both versions
    for r in range(6):
        n = int(lengths[r])
        assert tv[r, :min(n, 4)].eq(0).all() and tv[r, 4:n].eq(1).all()
    assert batch.version.eq(0).all()  # a row's version is its oldest token's
    assert pr.segments == 3
    lp0, lp1 = _logp(v0, batch), _logp(v1, batch)
    own = torch.where(tv == 0, lp0, lp1) * m  # each token under its own version
    torch.testing.assert_close(batch.behaviour_logp, own, atol=1e-5, rtol=0)
    torch.testing.assert_close(batch.old_logp, own, atol=1e-5, rtol=0)
    later = (tv == 1) & m.bool()
    assert float((lp0 - lp1)[later].abs().mean()) > 1e-2  # the versions differ there: the check has teeth
    # the sequence log-weight against a learner at version 1: log W = sum over version-0 tokens of
    # log pi_1 - log pi_0 (version-1 tokens contribute 0)
    log_w = ((lp1 - batch.old_logp) * m).sum(1)
    torch.testing.assert_close(log_w, ((lp1 - lp0) * (tv == 0) * m).sum(1), atol=1e-4, rtol=0)
    stale = token_staleness_metrics(batch.token_versions(), m, 1)
    assert stale["staleness_max"] == 1 and 0 < stale["staleness/mixed"] <= 1
    bypass = pr.result(task, examples, tok, bypass=True)
    assert torch.equal(bypass.old_logp, bypass.behaviour_logp)


class _Gate:
    """Lets the worker run one job step (one segment) per release: the test decides when each segment is
    generated and when weights are published, so two runs interleave in the same order. A killed gate
    stops its worker at its next step."""

    def __init__(self):
        self.sem, self.at_gate, self.killed = threading.Semaphore(0), threading.Event(), False

    def wrap(self, job):
        step = job.step

        def gated(version):
            self.at_gate.set()
            while not self.sem.acquire(timeout=0.01):
                if self.killed:
                    raise SystemExit("killed")
            if self.killed:
                raise SystemExit("killed")
            return step(version)

        job.step = gated
        return job

    def wait(self):
        assert self.at_gate.wait(60), "the worker did not come back to its gate"

    def release(self):
        """One step; back when the worker waits at the gate of the next."""
        self.wait()
        self.at_gate.clear()
        self.sem.release()
        self.wait()


@pytest.fixture
def gated(monkeypatch):
    holder = {}
    start, load_job = sources._WorkerJobs.start, sources._WorkerJobs.load_job
    monkeypatch.setattr(sources._WorkerJobs, "start", lambda self, v: holder["gate"].wrap(start(self, v)))
    monkeypatch.setattr(sources._WorkerJobs, "load_job", lambda self, s: holder["gate"].wrap(load_job(self, s)))
    return holder


SCRIPT = ["step", "step", "update", "step", "update", "step", "step", "update", "ckpt", "step", "update", "step",
          "update", "step", "step", "update", "step", "step", "update", "step"]


def _drive(tiny, gated, *, kill: bool):
    """Run SCRIPT on a real AsyncSource (respo's sampler, tiny-dense, segments of 4 of 12 tokens): ``step`` lets
    the worker generate one segment, ``update`` takes a finished batch if there is one and moves the
    learner's weights one version (published: sync_every 1), ``ckpt`` checkpoints as the trainer does. With
    ``kill`` the run is killed right after the checkpoint, in the middle of its next segment, and a new
    source resumes from the checkpoint (serialized as trainer.pt is). Returns the batches taken, the
    in-flight state at the end, and each version's weights."""
    tok, task, pool = tiny
    cfg = small_cfg(mode="async", segment_tokens=4, max_new_tokens=12, group_size=2, queue_size=8, max_staleness=50)
    model = build_policy("tiny-dense", tok, seed=0, initializer_range=0.1)
    policy, stream = Policy(model, tok, {}), PromptStream(pool, 0)
    weights = {0: copy.deepcopy(model.state_dict())}
    gated["gate"] = _Gate()
    source = sources.AsyncSource(policy, task, pool, Rollouts.of(cfg), AsyncWorker.of(cfg), stream=stream, version=0,
                                 engine=RespoEngine(model, tok))
    version, taken = 0, []
    try:
        for action in SCRIPT:
            gate = gated["gate"]
            if action == "step":
                gate.release()
            elif action == "update":
                gate.wait()
                if source.worker.queued:
                    taken.append(source.next(version).batch)
                version += 1
                _move(policy.model, version)
                weights[version] = copy.deepcopy(policy.model.state_dict())
                source.after_update(policy.model, version, version)
            else:  # a checkpoint: the worker is held at its next boundary, which it reaches after one step
                gate.wait()
                gate.at_gate.clear()
                gate.sem.release()
                with source.checkpointing(version) as in_flight:
                    buf = io.BytesIO()
                    torch.save({"rollouts": in_flight, "model": policy.model.state_dict(), "cursor": stream.state()},
                               buf)
                if not kill:
                    gate.wait()
                    continue
                gate.wait()
                gate.at_gate.clear()
                gate.sem.release()  # into its next segment ...
                gate.killed = True  # ... and killed: what that segment made is lost
                source.close()
                saved = torch.load(io.BytesIO(buf.getvalue()), map_location="cpu", weights_only=True)
                model = build_policy("tiny-dense", tok, seed=1)  # other weights, replaced by the checkpoint's
                model.load_state_dict(saved["model"])
                policy, stream = Policy(model, tok, {}), PromptStream(pool, 0)
                stream.load_state(saved["cursor"])
                gated["gate"] = _Gate()
                source = sources.AsyncSource(policy, task, pool, Rollouts.of(cfg), AsyncWorker.of(cfg), stream=stream,
                                             version=version, engine=RespoEngine(model, tok), resume=saved["rollouts"])
                gated["gate"].wait()
        gated["gate"].wait()
        gated["gate"].at_gate.clear()
        gated["gate"].sem.release()
        with source.checkpointing(version) as end:
            end = copy.deepcopy(end)
    finally:
        gated["gate"].killed = True
        source.close()
    return taken, end, weights


def _same_batch(a, b) -> None:
    for name in ("input_ids", "mask", "token_version", "version", "behaviour_logp", "old_logp", "rewards",
                 "example_index"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_a_worker_killed_mid_segment_resumes_with_the_same_versions_and_log_probs(tiny, gated):
    ref_taken, ref_end, weights = _drive(tiny, gated, kill=False)
    taken, end, _ = _drive(tiny, gated, kill=True)
    # every batch trained, before and after the kill, is the uninterrupted run's: tokens, every token's
    # version, behaviour log-prob and old_logp, rewards and prompts
    assert len(taken) == len(ref_taken) >= 4
    for a, b in zip(ref_taken, taken):
        _same_batch(a, b)
    # and so is what is in flight at the end: the finished batches, the one in the making, the counters
    assert len(end["worker"]["items"]) == len(ref_end["worker"]["items"])
    for a, b in zip(ref_end["worker"]["items"], end["worker"]["items"]):
        for name in ("token_version", "behaviour_logp", "old_logp", "input_ids"):
            assert torch.equal(a["batch"][name], b["batch"][name]), name
    ja, jb = ref_end["worker"]["job"], end["worker"]["job"]
    assert (ja is None) == (jb is None)
    if ja is not None:
        for name in ("tokens", "token_version", "behaviour_logp", "old_logp", "length", "scored"):
            assert torch.equal(ja["rollout"][name], jb["rollout"][name]), name
    for name in ("worker_version", "produced", "taken", "consumed", "dropped", "syncs"):
        assert ref_end["worker"][name] == end["worker"][name], name
    # the script published between segments of one batch: responses spanning versions were trained, and each
    # token's log-probs are those of its own version's weights
    mixed = [b for b in ref_taken if (b.token_version.max(1).values > b.token_version.min(1).values).any()]
    assert mixed
    tok = tiny[0]
    model = build_policy("tiny-dense", tok, seed=0)
    for b in ref_taken:
        own = torch.zeros_like(b.mask)
        for v in b.token_version[b.mask.bool()].unique().tolist():
            model.load_state_dict(weights[v])
            own = torch.where(b.token_version == v, _logp(model, b), own)
        torch.testing.assert_close(b.behaviour_logp, own * b.mask, atol=1e-5, rtol=0)
        torch.testing.assert_close(b.old_logp, own * b.mask, atol=1e-5, rtol=0)


ARGS = ["--warm-start", "false", "--threads", "1", "--prompts", "2", "--group-size", "4", "--max-new-tokens", "12",
        "--mode", "async", "--segment-tokens", "4", "--staleness-policy", "wait", "--max-staleness", "2",
        "--sync-every", "1", "--queue-size", "2", "--updates", "8", "--checkpoint-every", "2", "--lr", "1e-3",
        "--warmup", "0", "--task-kwargs", '{"overlong": [12, 11]}', "--eval-prompts", "0", "--progress", "false",
        "--tensorboard", "false", "--seed", "1"]


def _records(run):
    return [json.loads(line) for line in open(run / "metrics.jsonl") if '"event"' not in line]


def test_a_partial_async_run_killed_and_resumed_trains_what_it_had_in_flight(tmp_path):
    # A run with partial rollouts under wait, SIGKILLed after a checkpoint and resumed: every update is logged
    # once, the bound holds throughout and nothing is dropped, the counters go on, and the first updates after
    # the resume train exactly the batches the checkpoint held in flight (their per-token staleness is what the
    # saved token versions give against the learner), not fresh batches of the learner's version.
    import os
    import signal
    import subprocess
    import sys
    import time

    from respo.train.buffer import Batch
    from respo.train.checkpoint import load_trainer_state

    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    cmd = [sys.executable, "-m", "respo", "train", *ARGS, "--out-dir", str(run)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 600
    while not (run / "ckpt" / "update-000004" / "manifest.json").exists():
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read().decode()[-2000:]
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL and not (run / "final").exists()
    ckpt = sorted(p for p in (run / "ckpt").glob("update-*") if (p / "manifest.json").exists())[-1]
    saved = load_trainer_state(ckpt / "trainer.pt")
    before = _records(run)
    u = saved["update"]
    res = subprocess.run([*cmd, "--resume"], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    recs = _records(run)
    assert [r["update"] for r in recs] == list(range(1, 9))
    assert recs[:u] == before[:u]  # the records up to the checkpoint are the killed run's
    assert all(r["dropped"] == 0 and r["staleness_max"] <= 2 for r in recs)
    assert recs[-1]["waited_total"] == sum(r["waited"] for r in recs)
    assert json.loads((run / "summary.json").read_text())["waited"] == recs[-1]["waited_total"]
    flight = saved["rollouts"]["worker"]
    assert flight["produced"] - flight["taken"] == len(flight["items"])  # every finished batch not yet trained
    for i, item in enumerate(flight["items"]):  # trained by updates u + 1, u + 2, ...
        b, rec = Batch.from_state(item["batch"]), recs[u + i]
        current = rec["version"] - 1  # the learner's version when it took the batch (no update was skipped)
        want = token_staleness_metrics(b.token_versions(), b.mask, current)
        assert {k: rec[k] for k in want} == pytest.approx(want), (u + i + 1, want)
        assert rec["response_length"] == pytest.approx(float(b.mask.sum(1).mean()))
    job = flight["job"]
    if job is not None:  # the partial rollout in the making goes on: its old tokens keep their versions
        rec = recs[u + len(flight["items"])]
        made = job["rollout"]["length"] > 0
        if bool(made.any()):
            oldest = int(job["rollout"]["token_version"][made, 0].min())
            assert rec["staleness_max"] >= rec["version"] - 1 - oldest
