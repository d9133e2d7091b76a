"""The benchmarks' timing procedure is warm and fair: every side warmed up at the full size before
any timing, the order of the sides alternating, medians of at least 3 repeats (fewer warned), and a
ratio from one repeat that agrees with the median of three."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import timing  # noqa: E402


def test_every_side_is_warmed_up_at_full_size_before_any_timing_and_the_order_alternates():
    calls = []
    run = {side: (lambda r, side=side: calls.append((side, r))) for side in ("a", "b", "c")}
    times = timing.time_sides(run, repeats=4)
    # warm-up: one untimed call of each side (repeat 0's arguments, i.e. the full measured size), then
    # repeats 0..3 in the order a b c / c b a / a b c / c b a
    assert calls[:3] == [("a", 0), ("b", 0), ("c", 0)]
    assert calls[3:] == [("a", 0), ("b", 0), ("c", 0), ("c", 1), ("b", 1), ("a", 1),
                         ("a", 2), ("b", 2), ("c", 2), ("c", 3), ("b", 3), ("a", 3)]
    assert {k: len(v) for k, v in times.items()} == {"a": 4, "b": 4, "c": 4}
    # with two sides each runs first in half of the repeats
    assert [timing.order(["x", "y"], r)[0] for r in range(4)] == ["x", "y", "x", "y"]


def test_bench_sampler_warms_each_side_up_at_the_measured_length_and_alternates(monkeypatch, capsys):
    # The real script with the two decoders replaced by recorders: every call's (method, new tokens,
    # seed) in order. The sides must first run untimed at the measured length (not a short warm-up
    # that leaves the first timed full-length call to pay the allocator's growth), then alternate.
    import bench_sampler

    calls = []

    def recorder(name):
        def fn(model, tok, prompts, new_tokens, seed):
            calls.append((name, new_tokens, seed))
            return len(prompts) * new_tokens, None
        return fn

    monkeypatch.setattr(bench_sampler, "run_generate", recorder("generate"))
    monkeypatch.setattr(bench_sampler, "run_sampler", recorder("sampler"))
    bench_sampler.main(["--presets", "tiny-dense", "--batch", "2", "--new-tokens", "48", "--repeats", "3"])
    assert calls == [("generate", 48, 0), ("sampler", 48, 0),  # warm-up, full length, untimed
                     ("generate", 48, 0), ("sampler", 48, 0),  # repeat 0
                     ("sampler", 48, 1), ("generate", 48, 1),  # repeat 1: the other side first
                     ("generate", 48, 2), ("sampler", 48, 2)]
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["method"] for x in lines if "tokens_per_s" in x] == ["generate", "sampler"]
    assert all(len(x["times_s"]) == 3 for x in lines if "tokens_per_s" in x)
    assert len([x for x in lines if "ratio_sampler_over_generate" in x]) == 1


def test_fewer_than_three_repeats_print_a_warning_line_and_none_is_refused(capsys):
    timing.check_repeats(3)
    assert capsys.readouterr().out == ""
    timing.check_repeats(1)
    line = json.loads(capsys.readouterr().out)
    assert "not a figure to quote" in line["warning"] and "--repeats 1 < 3" in line["warning"]
    with pytest.raises(SystemExit, match="at least 1"):
        timing.check_repeats(0)


def _ratio(repeats: int) -> float:
    cmd = [sys.executable, "benchmarks/bench_sampler.py", "--presets", "tiny-dense", "--batch", "64",
           "--new-tokens", "64", "--repeats", str(repeats)]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    (ratio,) = [x["ratio_sampler_over_generate"] for x in lines if "ratio_sampler_over_generate" in x]
    return ratio


@pytest.mark.slow
def test_one_repeat_and_the_median_of_three_give_the_same_ratio():
    # A cold side (a first full-size call that pays the allocator's growth, or one that always runs
    # first) shows up as a ratio at --repeats 1 away from the median of three. Before the warm-up at full
    # size and the alternating order, generate's first 64-token call took 3.40 s against a median of
    # 1.90 s here, and --repeats 1 gave 1.517 against 1.262 (a factor 1.20, but a second try came within
    # noise). A fair procedure leaves only timing noise between them; TOLERANCE bounds it (its comment).
    r1, r3 = _ratio(1), _ratio(3)
    assert abs(math.log(r1 / r3)) <= math.log(TOLERANCE), (r1, r3)


#: Largest factor allowed between the two ratios. Each ratio divides timings taken back to back in one
#: process, so a slow change of the machine's load cancels; what remains is the noise of single ~2 s
#: calls. On 2 cores at a load average of 5 to 8 (other jobs running), the fair procedure's --repeats 1
#: and --repeats 3 ratios differed by factors 1.03 and 1.12 at this size (and 1.02 to 1.16 at batch 16,
#: 128 tokens). 1.3 leaves room for that noise, so the check does not fail on a busy machine; it
#: catches a gross cold-start bias (1.84 at batch 64, 256 tokens with the old 4-token warm-up) but not
#: the old procedure's 1.20 at this small size, which is within a loaded machine's noise: the
#: procedure itself is checked exactly by the recorder test above.
TOLERANCE = 1.3
