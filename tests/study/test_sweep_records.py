"""What ``respo sweep`` records must be true: its run processes die with it, its summary counts what
it ran, what was finished before and what another sweep is still running, it refuses to reuse
runs made with other settings, and a lock left by a killed sweep never makes a run look busy.

Real ``respo train`` processes on the tiny ``quick`` preset (a few seconds each)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: The quick preset cut to one objective and no held-out evaluation.
QUICK = ["--preset", "quick", "--objectives", "grpo", "--no-prewarm", "--set", "eval_prompts=0"]


def _sweep_cmd(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "respo", "sweep", "--out", str(out), *QUICK, *extra]


def _summary(stdout: str) -> dict:
    """The JSON summary a sweep prints last."""
    return json.loads(stdout[stdout.rindex("\n{") + 1:])


def _alive(pid: int) -> bool:
    """True while ``pid`` is a running process (a zombie waiting to be reaped counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _wait(cond, timeout: float, what: str) -> None:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def _lock_pids(runs: Path) -> dict[str, int]:
    """Run name -> the process id its ``sweep.lock`` names (the run's `respo train` process)."""
    out = {}
    for lock in runs.glob("*/sweep.lock"):
        text = lock.read_text().split()
        if text and text[0].isdigit():
            out[lock.parent.name] = int(text[0])
    return out


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; the parent-death signal is Linux's")
def test_a_killed_sweep_takes_its_runs_with_it_and_a_second_sweep_counts_them_as_running(tmp_path):
    sweep = tmp_path / "sweep"
    # two long runs (N = 1 and 2, 10^5 updates each): they are still training when we look
    cmd = _sweep_cmd(sweep, "--jobs", "2", "--reuse", "1,2", "--updates", "100000")
    first = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    children: dict[str, int] = {}
    try:
        _wait(lambda: len(_lock_pids(sweep / "runs")) == 2, 60, "both runs of the first sweep to start")
        children = _lock_pids(sweep / "runs")
        assert all(_alive(p) for p in children.values())

        # the same command again, while the first sweep is training both runs: nothing is run, nothing is
        # counted as run, both are reported as running elsewhere, and the sweep is not done (exit != 0)
        second = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
        out = second.stdout
        res = _summary(out)
        assert res["ran"] == 0 and res["failed"] == [] and res["skipped"] == 0, out
        assert sorted(res["running"]) == sorted(children), out
        assert second.returncode != 0, out
        assert all(_alive(p) for p in children.values())  # the second sweep touched nothing

        first.send_signal(signal.SIGKILL)  # no handler can run: the children must go by themselves
        first.wait(10)
        _wait(lambda: not any(_alive(p) for p in children.values()), 10, "the killed sweep's runs to die")
    finally:
        if first.poll() is None:
            first.kill()
        first.wait()
        for pid in children.values():  # orphans of a sweep without the fix: do not leave them training
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _fake_finished_run(sweep: Path, max_new_tokens: int) -> str:
    """A finished quick-preset run made with ``max_new_tokens``, its config.json written as `respo train`
    writes it (every field of the config, as the sweep's command line sets it)."""
    from respo.study.grid import BASE_CONFIG, plan
    from respo.train.config import config_to_dict, load_config

    args = Namespace(updates=1, lrs=None, seeds=None, reuse=None, objectives=["grpo"],
                     set={"eval_prompts": 0, "max_new_tokens": max_new_tokens})
    (spec,) = plan("quick", args)
    run = sweep / "runs" / spec.name
    run.mkdir(parents=True)
    cfg = load_config(BASE_CONFIG, {**spec.overrides, "out_dir": str(run), "threads": 1})
    (run / "config.json").write_text(json.dumps({**config_to_dict(cfg), "policy": {}}))
    (run / "summary.json").write_text("{}")
    return spec.name


def test_a_finished_sweep_rerun_with_another_setting_is_refused_in_one_line(tmp_path, capsys):
    from respo.cli import main

    sweep = tmp_path / "sweep"
    name = _fake_finished_run(sweep, max_new_tokens=16)
    argv = ["sweep", "--out", str(sweep), *QUICK, "--updates", "1"]
    # the runs' own setting: nothing to do, the run counts as finished before
    assert main([*argv, "--set", "max_new_tokens=16"]) == 0
    res = _summary(capsys.readouterr().out)
    assert (res["skipped"], res["ran"], res.get("running", [])) == (1, 0, [])
    manifest = (sweep / "sweep.json").read_text()

    # another max_new_tokens: refused before anything is written, in one line naming the setting and the run
    assert main([*argv, "--set", "max_new_tokens=20"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("respo sweep: error:"), err
    assert "max_new_tokens" in err[0] and "16" in err[0] and "20" in err[0] and name in err[0], err
    assert (sweep / "sweep.json").read_text() == manifest  # the manifest still names the runs' settings
    assert json.loads((sweep / "runs" / name / "config.json").read_text())["max_new_tokens"] == 16


@pytest.mark.slow
def test_a_stale_lock_never_makes_a_run_look_busy_and_no_lock_is_left(tmp_path):
    sweep = tmp_path / "sweep"
    finished = _fake_finished_run(sweep, max_new_tokens=22)
    # a killed sweep's locks name a process id that has since been reused: here this test's own live process
    (sweep / "runs" / finished / "sweep.lock").write_text(str(os.getpid()))
    from respo.study.grid import plan

    args = Namespace(updates=1, lrs=None, seeds=None, reuse=[2], objectives=["grpo"],
                     set={"eval_prompts": 0, "max_new_tokens": 22})
    (todo,) = plan("quick", args)
    (sweep / "runs" / todo.name).mkdir()
    (sweep / "runs" / todo.name / "sweep.lock").write_text(str(os.getpid()))

    res = subprocess.run(_sweep_cmd(sweep, "--updates", "1", "--reuse", "4,2", "--set", "max_new_tokens=22",
                                    "--jobs", "1"), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    out = _summary(res.stdout)
    assert (out["ran"], out["skipped"], out.get("running", []), out["failed"]) == (1, 1, [], []), res.stdout
    assert (sweep / "runs" / todo.name / "summary.json").is_file()
    assert sorted(p.parent.name for p in (sweep / "runs").glob("*/sweep.lock")) == []


def test_a_second_sweep_invocation_reuses_its_warm_starts_baseline_evaluation(tmp_path, monkeypatch):
    """The "before RL" evaluation of a warm start is measured once per protocol: a later invocation into
    the same sweep directory (another seed, another N) reuses it, and any change of the policy or of the
    evaluation settings measures it again."""
    import respo.train.evaluate as evaluate
    import respo.train.policy as policy_mod
    from respo.runtime.models import build_policy
    from respo.runtime.tokenizer import build_char_tokenizer
    from respo.study.baseline import prewarm as _prewarm
    from respo.study.grid import RunSpec

    tok = build_char_tokenizer()
    info = {"warm_start": {"key": "k1", "pass_rate": 0.4}}
    evaluated = []
    monkeypatch.setattr(policy_mod, "load_run_policy",
                        lambda cfg: Namespace(model=build_policy("tiny-dense", tok), tokenizer=tok, info=dict(info)))
    monkeypatch.setattr(evaluate, "evaluate_held_out",
                        lambda policy, task, held_out, cfg, engine=None: evaluated.append(len(held_out)) or {"pass@1": 0.5})
    base = tmp_path / "base.toml"
    base.write_text('model = "tiny-dense"\nwarm_start = true\neval_prompts = 4\nprogress = false\n')
    sweep = tmp_path / "sweep"

    assert _prewarm([RunSpec("a", {})], base, threads=1, sweep_dir=sweep) == {"a"}
    # same policy, same protocol: not measured again, and both runs may skip their own before-evaluation
    assert _prewarm([RunSpec("b", {"seed": 1}), RunSpec("b2", {"seed": 2})], base, threads=1,
                    sweep_dir=sweep) == {"b", "b2"}
    assert evaluated == [4]
    record = json.loads((sweep / "baseline_eval" / "tiny-dense.json").read_text())
    assert record["protocol"]["eval_prompts"] == 4 and record["eval"] == {"pass@1": 0.5}

    _prewarm([RunSpec("c", {"eval_prompts": 6})], base, threads=1, sweep_dir=sweep)  # another protocol
    assert evaluated == [4, 6]
    info["warm_start"] = {"key": "k2", "pass_rate": 0.3}  # the warm start was rebuilt differently
    _prewarm([RunSpec("d", {"eval_prompts": 6})], base, threads=1, sweep_dir=sweep)
    assert evaluated == [4, 6, 6]
    assert json.loads((sweep / "baseline_eval" / "tiny-dense.json").read_text())["policy"]["warm_start"]["key"] == "k2"


def test_runs_whose_warm_start_the_sweep_measured_skip_their_own_before_evaluation(tmp_path, monkeypatch):
    """run_sweep turns ``eval_before`` off exactly for the runs `_prewarm` names (their starting policy is
    on record under their protocol), and the sweep still reuses those runs afterwards."""
    import respo.study.sweep as sweep

    base = tmp_path / "base.toml"
    base.write_text('model = "tiny-dense"\nwarm_start = false\nprompts = 2\ngroup_size = 2\nupdates = 1\n'
                    'max_new_tokens = 6\neval_prompts = 0\nprogress = false\ntensorboard = false\n'
                    'task_kwargs = {digits = 1}\n')
    specs = [sweep.RunSpec("measured", {"seed": 0}), sweep.RunSpec("own", {"seed": 1})]
    monkeypatch.setattr(sweep, "_prewarm", lambda todo, *a, **k: {"measured"})
    res = sweep.run_sweep(tmp_path / "sw", specs, jobs=1, base_config=base)
    assert res["ran"] == 2 and not res["failed"], res
    recorded = {s.name: json.loads((tmp_path / "sw" / "runs" / s.name / "config.json").read_text())["eval_before"]
                for s in specs}
    assert recorded == {"measured": False, "own": True}
    again = sweep.run_sweep(tmp_path / "sw", specs, jobs=1, base_config=base)  # eval_before is not a changed setting
    assert again["skipped"] == 2


def test_sweep_baseline_is_the_sweeps_record_only_for_the_same_policy_and_protocol(tmp_path):
    from respo.study.baseline import eval_protocol, sweep_baseline

    run = tmp_path / "sw" / "runs" / "r"
    run.mkdir(parents=True)
    cfg = {"model": "m", "policy": {"key": "k1"}, "eval_prompts": 64, "eval_k": 1, "max_new_tokens": 160,
           "prompt_format": "auto", "dtype": "float32", "device": "cpu", "eval_before": False}
    (run / "config.json").write_text(json.dumps(cfg))
    assert sweep_baseline(run) is None  # no record
    (tmp_path / "sw" / "baseline_eval").mkdir()
    rec = {"model": "m", "policy": {"key": "k1"}, "protocol": eval_protocol(cfg, "cpu"), "eval": {"pass@1": 0.53}}
    path = tmp_path / "sw" / "baseline_eval" / "m.json"
    path.write_text(json.dumps(rec))
    assert sweep_baseline(run) == {"pass@1": 0.53}
    path.write_text(json.dumps({**rec, "policy": {"key": "k2"}}))  # another warm start
    assert sweep_baseline(run) is None
    path.write_text(json.dumps({**rec, "protocol": {**rec["protocol"], "eval_k": 4}}))  # another protocol
    assert sweep_baseline(run) is None
    path.write_text(json.dumps({k: v for k, v in rec.items() if k != "protocol"}))  # written before protocols
    assert sweep_baseline(run) is None
