"""The demo path end to end at toy size: train, evaluate before/after, write report.md and the PNG."""

import json

from respo.demo import demo_config, run_demo


def test_demo_settings_are_valid_and_off_policy():
    cfg = demo_config()
    assert cfg.objective == "respo" and cfg.reuse > 1 and cfg.mode == "sync"


def test_run_demo_writes_a_report(tmp_path):
    out = tmp_path / "demo"
    report = run_demo({"warm_start": False, "out_dir": str(out), "updates": 4, "reuse": 2, "prompts": 2,
                       "group_size": 4, "max_new_tokens": 8, "eval_prompts": 4, "eval_k": 2, "threads": 1,
                       "progress": False, "tensorboard": False, "task_kwargs": {"overlong": [8, 7]}})
    text = report.read_text()
    assert report == out / "report.md"
    for needle in ("Held-out accuracy", "mean@2", "Staleness reached", "reuse ratio N = 2", "max 1",
                   "Why these settings", "![training curve](curve.png)", "log W p10"):
        assert needle in text, needle
    png = (out / "curve.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    recs = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [r["staleness_max"] for r in recs if "event" not in r] == [0, 1, 0, 1]  # k-th mini-batch: k - 1
    assert sum(1 for r in recs if r.get("event") == "eval") == 2  # before and after
