"""scripts/real_bracket.py: the learning-rate bracket's verdict from the committed per-prompt evaluations."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "scripts" / "real_bracket.py"
spec = importlib.util.spec_from_file_location("real_bracket", SCRIPT)
real_bracket = importlib.util.module_from_spec(spec)
spec.loader.exec_module(real_bracket)


def _eval(per_prompt):
    n = len(per_prompt)
    return {"prompts": n, "k": 4, "pass@1": sum(per_prompt) / n, "pass@1_se": 0.0, "greedy_acc": 0.5,
            "greedy_acc_se": 0.0, "response_length": 100.0, "per_prompt_mean": per_prompt}


def _record(tmp_path, afters):
    before = [0.25, 0.5, 0.25, 0.5]
    rec = {"before": {"policy": "abc", "protocol": {}, "eval": _eval(before)},
           "runs": [{"run": f"r{lr}", "lr": lr, "reuse": 1, "updates": 24, "seed": 0, "start": "abc", "engine": "vllm",
                     "after": _eval(after)} for lr, after in afters]}
    path = tmp_path / "evals.json"
    path.write_text(json.dumps(rec))
    return path


def test_paired_interval_over_prompts():
    # differences after - before: 0.25, 0.25, 0.5, 0 -> mean 0.25, sample sd 0.2041, se 0.1021; t(0.975, 3) = 3.1824
    # -> 0.25 +- 0.3249 = [-0.0749, 0.5749]
    m, lo, hi = real_bracket.paired_interval([0.25, 0.5, 0.25, 0.5], [0.5, 0.75, 0.75, 0.5])
    assert m == pytest.approx(0.25) and lo == pytest.approx(-0.0749, abs=1e-3) and hi == pytest.approx(0.5749, abs=1e-3)


def test_the_rule_takes_the_smallest_rate_that_shows_a_gain(tmp_path, capsys):
    # lr 1e-6: no change (interval [0, 0]: not above zero); 3e-6 and 1e-5: +0.25 on every prompt (interval above zero)
    path = _record(tmp_path, [(1e-6, [0.25, 0.5, 0.25, 0.5]), (3e-6, [0.5, 0.75, 0.5, 0.75]),
                              (1e-5, [0.5, 0.75, 0.5, 0.75])])
    real_bracket.table(path)
    out = capsys.readouterr().out
    assert "| 3e-06 | 1 | 24 | 0.625 | +0.250 | [+0.250, +0.250] | 0.500 |" in out
    assert "the smallest rate whose interval lies above zero: lr 3e-06" in out


def test_without_a_gain_the_rule_takes_the_largest_harmless_rate(tmp_path, capsys):
    # 1e-6 unchanged (harmless); 1e-5 loses 0.25 on every prompt (interval below zero)
    path = _record(tmp_path, [(1e-6, [0.25, 0.5, 0.25, 0.5]), (1e-5, [0.0, 0.25, 0.0, 0.25])])
    real_bracket.table(path)
    assert "the largest whose interval does not lie below zero: lr 1e-06" in capsys.readouterr().out


def test_a_run_from_another_start_is_refused(tmp_path):
    path = _record(tmp_path, [(1e-6, [0.25, 0.5, 0.25, 0.5])])
    rec = json.loads(path.read_text())
    rec["runs"][0]["start"] = "def"
    path.write_text(json.dumps(rec))
    with pytest.raises(SystemExit, match="started from def, the baseline is abc"):
        real_bracket.table(path)
