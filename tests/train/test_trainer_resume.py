"""Nothing lost: a run killed with SIGKILL after a checkpoint and resumed with --resume ends with
weights bitwise equal to an uninterrupted run of the same seed (CPU, 1 thread)."""

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

ARGS = ["--warm-start", "false", "--threads", "1", "--prompts", "2", "--group-size", "4", "--max-new-tokens", "12",
        "--reuse", "3", "--updates", "12", "--checkpoint-every", "2", "--lr", "1e-3", "--warmup", "2",
        "--task-kwargs", '{"overlong": [12, 11]}', "--eval-prompts", "4", "--eval-k", "2",
        "--progress", "false", "--tensorboard", "false", "--seed", "3"]


def _cmd(out, *extra):
    return [sys.executable, "-m", "respo", "train", *ARGS, "--out-dir", str(out), *extra]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}


def _weights(run):
    # safetensors' save_pretrained drops the tied lm_head copy; compare every stored tensor bitwise
    return load_file(str(Path(run) / "final" / "model.safetensors"))


@pytest.mark.slow
def test_sigkill_then_resume_is_bitwise_equal_to_uninterrupted(tmp_path):
    ref, killed = tmp_path / "ref", tmp_path / "killed"
    ref_proc = subprocess.Popen(_cmd(ref), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    proc = subprocess.Popen(_cmd(killed), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Kill as soon as the update-4 checkpoint exists: mid-way through the second rollout step (N = 3),
    # so the resumed run must restore the buffer's remaining mini-batches, not just the weights.
    deadline = time.time() + 300
    while not (killed / "ckpt" / "update-000004" / "manifest.json").exists():
        assert proc.poll() is None, "run ended before its update-4 checkpoint"
        assert time.time() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert not (killed / "final").exists()  # really killed before the end

    res = subprocess.run(_cmd(killed, "--resume"), env=_env(), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    _, ref_err = ref_proc.communicate(timeout=600)
    assert ref_proc.returncode == 0, ref_err[-2000:]
    a, b = _weights(ref), _weights(killed)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # The metrics file describes one run: updates 1..12 once each, same losses as the reference.
    def losses(run):
        recs = [json.loads(line) for line in open(Path(run) / "metrics.jsonl")]
        return [(r["update"], r["loss"]) for r in recs if "event" not in r]
    assert losses(killed) == losses(ref) and [u for u, _ in losses(ref)] == list(range(1, 13))
    sa, sb = (json.loads((Path(r) / "summary.json").read_text()) for r in (ref, killed))
    assert sa["eval_before"] == sb["eval_before"] and sa["eval_after"] == sb["eval_after"]


def test_resume_refuses_a_corrupt_checkpoint(tmp_path, capsys):
    from respo.cli import main

    out = tmp_path / "run"
    args = list(ARGS)
    args[args.index("--updates") + 1] = "2"
    args[args.index("--eval-prompts") + 1] = "0"
    assert main(["train", *args, "--out-dir", str(out)]) == 0
    ckpt = out / "ckpt" / "update-000002" / "trainer.pt"
    data = bytearray(ckpt.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit, same size
    ckpt.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["train", *args, "--out-dir", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "is corrupt" in err and "trainer.pt fails its SHA-256 check" in err


@pytest.mark.slow
def test_sigterm_checkpoints_at_an_update_boundary_then_resumes(tmp_path):
    # No periodic checkpoints: the only checkpoint is the one written on SIGTERM. The run stops with
    # a non-zero exit, the checkpoint verifies, and --resume finishes with the same weights as above.
    out, ref = tmp_path / "run", tmp_path / "ref"
    args = list(ARGS)
    args[args.index("--checkpoint-every") + 1] = "0"
    cmd = [sys.executable, "-m", "respo", "train", *args, "--out-dir", str(out)]
    ref_proc = subprocess.Popen([*cmd[:-1], str(ref)], env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    deadline = time.time() + 300
    while not (out / "metrics.jsonl").exists() or sum(1 for _ in open(out / "metrics.jsonl")) < 4:
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0 and "continue with --resume" in stdout
    from respo.train.checkpoint import latest_checkpoint, verify_checkpoint

    ck = latest_checkpoint(out / "ckpt")
    assert ck is not None and 0 < verify_checkpoint(ck)["update"] < 12
    assert subprocess.run([*cmd, "--resume"], env=_env(), capture_output=True).returncode == 0
    assert ref_proc.wait(timeout=600) == 0
    a, b = _weights(ref), _weights(out)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_eval_cadence_does_not_change_training(tmp_path):
    # Why eval_every may change on resume, and why a sweep may skip a run's eval_before: evaluation
    # draws from its own generator, so evaluating every 2 updates, or not before training, leaves
    # every update record (minus timings) and the final weights as they are.
    from respo.cli import main

    def updates(run):
        recs = [json.loads(line) for line in open(Path(run) / "metrics.jsonl")]
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in recs if "event" not in r]

    args = list(ARGS)
    args[args.index("--updates") + 1] = "4"
    args[args.index("--reuse") + 1] = "2"
    runs = {every: tmp_path / f"every{every}" for every in (0, 2)}
    for every, out in runs.items():
        assert main(["train", *args, "--out-dir", str(out), "--eval-every", str(every)]) == 0
    assert main(["train", *args, "--out-dir", str(tmp_path / "nobefore"), "--eval-before", "false"]) == 0
    assert updates(tmp_path / "nobefore") == updates(runs[0])
    assert json.loads((tmp_path / "nobefore" / "summary.json").read_text())["eval_before"] is None
    nb = _weights(tmp_path / "nobefore")
    assert all(torch.equal(nb[k], w) for k, w in _weights(runs[0]).items())

    assert updates(runs[0]) == updates(runs[2]) and len(updates(runs[0])) == 4
    evals = [json.loads(line)["update"] for line in open(runs[2] / "metrics.jsonl") if '"event"' in line]
    assert evals == [0, 2, 4]  # before, update 2, after
    a, b = _weights(runs[0]), _weights(runs[2])
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_resumed_extension_replaces_the_end_and_records_each_resume_once(tmp_path):
    # A finished 2-update run extended to 4: the old end (summary.json, its final evaluation) becomes
    # an intermediate point, the run ends again at 4, and config.json lists the one resume.
    from respo.cli import main

    args = list(ARGS)
    args[args.index("--updates") + 1] = "2"
    args[args.index("--reuse") + 1] = "1"
    out = tmp_path / "run"
    assert main(["train", *args, "--out-dir", str(out)]) == 0
    assert main(["train", *args, "--out-dir", str(out), "--resume", "--updates", "4", "--progress", "true"]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["resumed"] == [{"update": 2, "updates": [2, 4], "progress": [False, True]}]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates"] == 4 and list(summary["evals"]) == ["update_2"]
    evals = [json.loads(line)["update"] for line in open(out / "metrics.jsonl") if '"event"' in line]
    assert evals == [0, 2, 4]
    assert (out / "report.md").is_file()
    # ...and the extension trains exactly as a run asked for 4 updates from the start: the constant
    # learning rate after warm-up does not depend on `updates`, and evaluation has its own generator.
    fresh = tmp_path / "fresh"
    assert main(["train", *args, "--out-dir", str(fresh), "--updates", "4"]) == 0

    def updates(run):
        recs = [json.loads(line) for line in open(run / "metrics.jsonl")]
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in recs if "event" not in r]
    assert updates(out) == updates(fresh) and len(updates(fresh)) == 4
    a, b = _weights(out), _weights(fresh)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_refuses_a_starting_policy_whose_weights_changed(tmp_path, capsys):
    # a run started from a model directory records the directory's weights; if the directory is
    # rebuilt before the run is resumed, the record would name a start the run never had: refused
    from respo.cli import main
    from respo.runtime.models import build_policy
    from respo.runtime.tokenizer import build_char_tokenizer
    from respo.train.policy import weights_sha256

    tok = build_char_tokenizer()
    model = build_policy("tiny-dense", tok, seed=0)
    model.save_pretrained(tmp_path / "start")
    tok.save_pretrained(tmp_path / "start")
    args = list(ARGS)
    args[args.index("--updates") + 1] = "2"
    args[args.index("--reuse") + 1] = "1"
    out = tmp_path / "run"
    assert main(["train", *args, "--model", str(tmp_path / "start"), "--out-dir", str(out)]) == 0
    recorded = json.loads((out / "config.json").read_text())["policy"]["weights_sha256"]
    assert recorded == weights_sha256(model)
    capsys.readouterr()
    build_policy("tiny-dense", tok, seed=1).save_pretrained(tmp_path / "start")  # rebuilt: other weights
    before = (out / "config.json").read_text()
    assert main(["train", *args, "--model", str(tmp_path / "start"), "--out-dir", str(out), "--resume",
                 "--updates", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not the one this run started from" in err and recorded[:12] in err
    assert (out / "config.json").read_text() == before  # nothing rewritten
