"""The demo path end to end at toy size: several objectives from one start, evaluated before/after, one
report.md and one figure beside each run's own report."""

import json

import pytest

from respo.demo import DEMO_OBJECTIVES, demo_config, run_demo
from respo.study.names import objective_label
from respo.train.config import ConfigError

TOY = {"warm_start": False, "updates": 4, "reuse": 2, "prompts": 2, "group_size": 4, "max_new_tokens": 8,
       "eval_prompts": 4, "eval_k": 2, "threads": 1, "progress": False, "tensorboard": False,
       "task_kwargs": {"overlong": [8, 7]}}


def test_demo_settings_are_valid_and_off_policy():
    cfg = demo_config()
    assert cfg.reuse > 1 and cfg.mode == "sync"
    assert DEMO_OBJECTIVES == ("vespo", "respo", "respo+/vespo-")  # ReSPO's branches against VESPO's


def test_run_demo_puts_objectives_side_by_side(tmp_path):
    out = tmp_path / "demo"
    report = run_demo({**TOY, "out_dir": str(out)}, objectives=["vespo", "respo+/vespo-"])
    assert report == out / "report.md"
    text = report.read_text()
    for needle in ("| vespo |", "| respo+/vespo- |", "stale positives below log W = −1", "![the runs side by side](demo.png)",
                   "Why these settings", "[vespo](vespo/report.md)", "[respopos.vesponeg](respopos.vesponeg/report.md)"):
        assert needle in text, needle
    png = (out / "demo.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    firsts = []
    for d, label in (("vespo", "vespo"), ("respopos.vesponeg", "respo+/vespo-")):
        assert (out / d / "report.md").is_file() and (out / d / "curve.png").is_file()
        recs = [json.loads(line) for line in open(out / d / "metrics.jsonl")]
        assert [r["staleness_max"] for r in recs if "event" not in r] == [0, 1, 0, 1]  # k-th mini-batch: k - 1
        assert sum(1 for r in recs if r.get("event") == "eval") == 2  # before and after
        firsts.append(next(r for r in recs if "event" not in r))
        cfg = json.loads((out / d / "config.json").read_text())
        assert objective_label(cfg["objective"], cfg["objective_kwargs"]) == label
    # one seed, one start: the first rollout step is the same batch, and at W = 1 both kernels give φ = 1,
    # so the first update's score and loss agree exactly
    assert firsts[0]["score"] == firsts[1]["score"] and firsts[0]["loss"] == firsts[1]["loss"]


def test_demo_objective_flags(tmp_path):
    with pytest.raises(ConfigError, match="--objectives or --objective, not both"):
        run_demo({**TOY, "out_dir": str(tmp_path), "objective": "grpo"}, objectives=["vespo"])
    with pytest.raises(ConfigError, match="names no objective"):
        run_demo({**TOY, "out_dir": str(tmp_path)}, objectives=[])
    with pytest.raises(Exception, match="nope"):  # every objective is validated before the first run trains
        run_demo({**TOY, "out_dir": str(tmp_path)}, objectives=["vespo", "nope"])
    assert not (tmp_path / "vespo").exists()
