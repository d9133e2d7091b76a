"""The staleness study pipeline: aggregation on hand-made run files, the report's structure, and the
``quick`` sweep preset end to end (real training processes, tiny budget)."""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from respo.study.aggregate import (Run, best_per_column, early_max, fmt_cell, late_mean, load_runs, mean_std,
                                   pass_at_1, pooled_low_fraction, run_mean)
from respo.study.plots import kernel_coefficients, logw_samples_from_quantiles
from respo.study.report import build_report
from respo.study.tables import TableError
from respo.study.grid import plan
from respo.study.names import ABLATION_KERNELS, objective_label, run_name

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------------
# aggregation (hand-worked numbers)
# ------------------------------------------------------------------------------------------------
def test_late_mean_and_early_max_by_hand():
    s = [i / 100 for i in range(16)]  # 0.00 .. 0.15
    # last eighth of 16 = 2 values: (0.14 + 0.15) / 2 = 0.145; first quarter = 4 values, max 0.03
    assert late_mean(s) == pytest.approx(0.145)
    assert early_max(s) == pytest.approx(0.03)
    # 7 updates: 7 // 8 = 0 -> at least the last one; 7 // 4 = 1 -> the first only
    s7 = [0.5, 0.9, 0.1, 0.2, 0.3, 0.4, 0.25]
    assert late_mean(s7) == pytest.approx(0.25)
    assert early_max(s7) == pytest.approx(0.5)
    assert math.isnan(late_mean([])) and math.isnan(early_max([]))


def test_mean_std_and_cell_format():
    m, s, n = mean_std([0.2, 0.4, 0.6])  # mean 0.4, sample std sqrt((0.04+0+0.04)/2) = 0.2
    assert (m, n) == (pytest.approx(0.4), 3) and s == pytest.approx(0.2)
    m1, s1, n1 = mean_std([0.3, float("nan"), None])  # non-finite values are dropped
    assert (m1, n1) == (pytest.approx(0.3), 1) and math.isnan(s1)
    assert fmt_cell(0.4, 0.2, 3) == "0.400 ± 0.200 (3)"
    assert fmt_cell(0.3, math.nan, 1, bold=True) == "**0.300 (1)**"
    assert fmt_cell(math.nan, math.nan, 0) == "–"


def test_best_per_column_marks_max_and_ties_and_skips_nan():
    table = {("grpo", 8): 0.3, ("respo", 8): 0.5, ("grpo", 32): 0.2, ("respo", 32): 0.2, ("vespo", 32): math.nan,
             ("vespo", 8): 0.1}
    assert best_per_column(table) == {("respo", 8), ("grpo", 32), ("respo", 32)}
    assert best_per_column(table, higher=False) == {("vespo", 8), ("grpo", 32), ("respo", 32)}


def _fake_run(root: Path, objective: str, reuse: int, lr: float, seed: int, scores: list[float], *,
              kwargs: dict | None = None, low_w: float = 0.1, finished: bool = True, budget: bool = False) -> Path:
    """A run directory shaped like `respo.train.trainer.train`'s output."""
    ov = {"objective": objective, "reuse": reuse, "lr": lr, "seed": seed, "model": "tiny-dense", "group_size": 8}
    if budget:  # a non-default number of updates (part of the run name, as in `respo sweep --updates`)
        ov["updates"] = len(scores)
    if kwargs:
        ov["objective_kwargs"] = kwargs
    d = root / "runs" / run_name(ov)
    d.mkdir(parents=True)
    cfg = {**ov, "objective_kwargs": kwargs or {}, "task": "addition", "task_kwargs": {"digits": 5},
           "routing_replay": False, "updates": len(scores), "policy": {"pass_rate": 0.2}}
    (d / "config.json").write_text(json.dumps(cfg))
    recs = []
    for u, s in enumerate(scores, 1):
        stale = (u - 1) % reuse
        recs.append({"update": u, "score": s, "staleness_mean": stale, "frac_pos_low_w": low_w if stale else 0.0,
                     "pos_low_w_mass_share": 0.2, "frac_starved": 0.0, "kl_k3": 0.01 * stale, "approx_kl": 0.01,
                     "coef_mean": 1.0, "phi/pos_mean": 1.0, "phi/neg_mean": None, "log_w/p01": -3.0 * stale,
                     "log_w/p10": -1.0 * stale, "log_w/p50": -0.2 * stale, "log_w/p90": 0.0, "log_w/p99": 0.1})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"update": 99, "sco')  # torn tail
    if finished:
        (d / "summary.json").write_text(json.dumps({"eval_after": {"pass@1": scores[-1], "prompts": 64, "k": 4}}))
    return d


def test_pooled_low_fraction_counts_stale_histograms_by_hand():
    h = "log_w_hist"
    records = [
        # on-policy update (staleness 0): its counts are not pooled
        {"staleness_mean": 0.0, f"{h}/pos/[-inf,-8)": 50.0, f"{h}/pos/[0,0.25)": 50.0},
        # stale: positives 1 in [-8,-4), 2 in [-2,-1), 1 in [-1,-0.5), 4 in [0,0.25); negatives 3 below -1 of 4
        {"staleness_mean": 1.0, f"{h}/pos/[-8,-4)": 1.0, f"{h}/pos/[-2,-1)": 2.0, f"{h}/pos/[-1,-0.5)": 1.0,
         f"{h}/pos/[0,0.25)": 4.0, f"{h}/neg/[-4,-2)": 3.0, f"{h}/neg/[2,+inf)": 1.0},
        # stale: positives 2 in [-0.5,-0.25), none below -1; negatives: no counts logged (None)
        {"staleness_mean": 2.0, f"{h}/pos/[-0.5,-0.25)": 2.0, f"{h}/neg/[-4,-2)": None},
    ]
    run = Run(Path("x"), {}, records, [], None)
    assert pooled_low_fraction(run, "pos") == pytest.approx(3 / 10)  # (1 + 2) of 8 + 2 stale positives
    assert pooled_low_fraction(run, "pos", below=-0.5) == pytest.approx(4 / 10)  # [-1,-0.5) too
    assert pooled_low_fraction(run, "neg") == pytest.approx(3 / 4)
    assert pooled_low_fraction(run, "pos", below=-8.0) == 0.0
    assert math.isnan(pooled_low_fraction(Run(Path("y"), {}, records[:1], [], None), "pos"))  # no stale update
    with pytest.raises(ValueError, match="not a histogram edge"):
        pooled_low_fraction(run, "pos", below=-3.0)


def test_pass_at_1_reads_the_final_evaluation():
    assert pass_at_1(Run(Path("a"), {}, [], [], {"eval_after": {"pass@1": 0.25}})) == 0.25
    assert pass_at_1(Run(Path("b"), {}, [], [], {"eval_after": {"mean@1": 0.5}})) == 0.5  # older summaries
    assert math.isnan(pass_at_1(Run(Path("c"), {}, [], [], None)))  # unfinished: no summary


def test_load_runs_and_stale_only_means(tmp_path):
    d = _fake_run(tmp_path, "grpo", 4, 3e-5, 0, [0.1] * 8, low_w=0.3)
    (run,) = load_runs([tmp_path])
    assert run.path == d and run.finished and len(run.records) == 8  # the torn last line is skipped
    assert run.coords["objective"] == "grpo" and run.coords["reuse"] == 4
    # updates 1..8 at N = 4 have staleness 0,1,2,3,0,1,2,3: frac_pos_low_w is 0.3 on the 6 stale ones
    assert run_mean(run, "frac_pos_low_w", stale_only=True) == pytest.approx(0.3)
    assert run_mean(run, "frac_pos_low_w") == pytest.approx(0.3 * 6 / 8)
    assert math.isnan(run_mean(run, "phi/neg_mean"))  # None values are skipped; all None -> NaN


def test_report_tables_from_hand_made_runs(tmp_path):
    sweep = tmp_path / "sweep"
    # lr 3e-5 (shared: most runs): 2 seeds each. late mean over the last 16 // 8 = 2 updates.
    up = [0.2] * 14 + [0.4, 0.6]  # late mean 0.5, early max 0.2
    down = [0.3] * 14 + [0.1, 0.1]  # late mean 0.1, early max 0.3
    for seed in (0, 1):
        for N in (1, 8):
            _fake_run(sweep, "grpo", N, 3e-5, seed, up)
            _fake_run(sweep, "respo", N, 3e-5, seed, down if N == 8 else up)
    _fake_run(sweep, "respo", 8, 1e-5, 0, [0.7] * 16)  # respo's best lr at N = 8 (one seed): 0.7
    _fake_run(sweep, "reshaped", 8, 3e-5, 0, [0.35] * 16, kwargs=dict(zip(("pos_kernel", "neg_kernel"),
                                                                            ABLATION_KERNELS["respo+/vespo-"])))
    _fake_run(sweep, "grpo", 32, 3e-5, 0, [0.1] * 5, finished=False)
    _fake_run(sweep, "grpo", 8, 3e-5, 0, [0.9] * 32, budget=True)  # a longer budget: its own section only
    out = tmp_path / "report"
    path = build_report([sweep], out, command="respo report sweep")
    text = path.read_text()
    for head in ("## Main comparison: tiny-dense (G = 8, shared lr = 3e-05)", "### Late mean", "### Early max",
                 "### Held-out sampled pass@1", "### Late mean at each objective's best learning rate per N",
                 "### Stability map", "### Starvation diagnostic", "### log W histograms", "## Branch ablation",
                 "## Runs not finished", "respo report sweep"):
        assert head in text, head
    late = text.split("### Late mean (training score")[1].split("###")[0]
    # grpo: 0.5 at N = 1 and N = 8 (2 seeds, std 0); respo: 0.5 at N = 1 (tie -> both bold), 0.1 at N = 8
    assert "| grpo | **0.500 ± 0.000 (2)** | **0.500 ± 0.000 (2)** |" in late
    assert "| respo | **0.500 ± 0.000 (2)** | 0.100 ± 0.000 (2) |" in late
    early = text.split("### Early max")[1].split("###")[0]
    assert "| respo | **0.200 ± 0.000 (2)** | **0.300 ± 0.000 (2)** |" in early  # N = 1: a tie at 0.2
    best = text.split("best learning rate per N")[1].split("###")[0]
    assert "| respo | **0.500 ± 0.000 (2)** [3e-05] | **0.700 (1)** [1e-05] |" in best
    assert "No run here got past its first rollout step" not in best  # 16 updates at N = 8: two steps
    abl = text.split("## Branch ablation")[1]
    assert re.search(r"\| respo\+/vespo- \| \*\*0\.350 \(1\)\*\* \|", abl) is None  # grpo's 0.5 is best at N = 8
    assert "| respo+/vespo- | 0.350 (1) |" in abl
    assert "grpo_N32_G8_lr3e-05_s0`: 5 updates logged" in text
    import csv

    rows = list(csv.DictReader((out / "runs.csv").open()))
    assert len(rows) == len(list((sweep / "runs").iterdir())) == 12  # 8 + lr 1e-5 + ablation + unfinished + longer
    by = {r["run"]: r for r in rows}
    assert float(by["tiny-dense_respo_N8_G8_lr3e-05_s0"]["late_mean"]) == pytest.approx(0.1)
    assert float(by["tiny-dense_grpo_N8_G8_lr3e-05_s0"]["stale_mean:frac_pos_low_w"]) == pytest.approx(0.1)
    longer = text.split("## Longer budget")[1].split("## ")[0]
    assert "| grpo | **0.500 ± 0.000 (2)** | **0.900 (1)** |" in longer  # 16 vs 32 updates at N = 8 (one row: bold)
    for png in re.findall(r"\]\(([^)]+\.png)\)", text):
        assert (out / png).stat().st_size > 1000, png


# ------------------------------------------------------------------------------------------------
# kernels drawn from the core, histogram reconstruction, sweep planning
# ------------------------------------------------------------------------------------------------
def test_kernel_coefficients_match_design_values():
    lw = torch.log(torch.tensor([0.01, 2.0, 4.0], dtype=torch.float64))
    # Kernel values (docs/method.md): φ+(0.01) = 1.35907, φ+(2) = 0.55182; φ-(0.01) = 0.1·e^1.8 = 0.604965, φ-(4) = 0.27067
    pos = kernel_coefficients("respo", lw, 1.0)
    neg = kernel_coefficients("respo", lw, -1.0)
    assert pos[:2].tolist() == pytest.approx([1.35907, 0.55182], abs=1e-5)
    assert [neg[0].item(), neg[2].item()] == pytest.approx([0.60497, 0.27067], abs=1e-5)
    # GRPO's token clip: r = 0.01 unclipped for Â > 0 (its gradient is r), r = 2 > 1.2 clipped -> 0;
    # for Â < 0, r = 0.01 < 0.8 clipped -> 0, r = 2 in [0.8, 3] -> 2, r = 4 > c = 3 (dual clip) -> 0
    assert kernel_coefficients("grpo", lw, 1.0).abs().tolist() == pytest.approx([0.01, 0.0, 0.0])
    assert kernel_coefficients("grpo", lw, -1.0).abs().tolist() == pytest.approx([0.0, 2.0, 0.0])


def test_logw_samples_from_quantiles_interpolate_inverse_cdf():
    rec = {"log_w/p01": -4.0, "log_w/p10": -2.0, "log_w/p50": -1.0, "log_w/p90": 0.0, "log_w/p99": 1.0}
    x = logw_samples_from_quantiles([rec, {"log_w/p01": None}], n_per_record=5)  # probs .01,.255,.5,.745,.99
    # p = 0.255 lies between 0.10 (−2) and 0.50 (−1): −2 + (0.155 / 0.4) = −1.6125; 0.745 -> −1 + 0.245/0.4
    assert x.tolist() == pytest.approx([-4.0, -1.6125, -1.0, -0.3875, 1.0])


def _args(**kw):
    base = dict(updates=0, lrs=None, seeds=None, reuse=None, objectives=None, set=None)
    return Namespace(**{**base, **kw})


def test_plan_presets_sizes_and_names():
    full = plan("full", _args(lrs=[3e-5]))
    assert len(full) == 4 * 4 * 3  # objectives x N x seeds
    assert [s.overrides["seed"] for s in full[:16]] == [0] * 16  # seed varies slowest
    assert len({s.name for s in full}) == len(full)
    abl = plan("ablation", _args(seeds=[0]))
    assert {objective_label(s.overrides["objective"], s.overrides["objective_kwargs"]) for s in abl} == set(ABLATION_KERNELS)
    rep = plan("replay", _args(seeds=[0], reuse=[16]))
    assert sorted(s.overrides["routing_replay"] for s in rep) == [False, True]
    assert all(s.name.endswith("_rr") == s.overrides["routing_replay"] for s in rep)
    q = plan("quick", _args(set={"max_new_tokens": 20}))
    assert all(s.overrides["updates"] == 8 and s.overrides["max_new_tokens"] == 20 for s in q)
    with pytest.raises(ValueError, match="unknown sweep preset"):
        plan("nope", _args())


# ------------------------------------------------------------------------------------------------
# the quick preset end to end: real `respo train` processes, then `respo report`
# ------------------------------------------------------------------------------------------------
def test_quick_sweep_end_to_end_and_resume(tmp_path):
    sweep, out = tmp_path / "sweep", tmp_path / "report"
    cmd = [sys.executable, "-m", "respo", "sweep", "--preset", "quick", "--out", str(sweep), "--jobs", "2",
           "--updates", "4", "--set", "eval_prompts=4"]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    runs = sorted((sweep / "runs").iterdir())
    assert len(runs) == 2
    for rd in runs:
        summary = json.loads((rd / "summary.json").read_text())
        assert summary["updates"] == 4 and summary["reuse"] == 4
        recs = [json.loads(x) for x in (rd / "metrics.jsonl").read_text().splitlines()]
        assert [r["staleness_mean"] for r in recs if "event" not in r] == [0, 1, 2, 3]
    manifest = json.loads((sweep / "sweep.json").read_text())
    assert manifest["invocations"][0]["preset"] == "quick" and "--preset quick" in manifest["invocations"][0]["command"]
    # a second invocation skips the finished runs
    res2 = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res2.returncode == 0 and "2 already finished, 0 to run" in res2.stdout, res2.stdout + res2.stderr

    res3 = subprocess.run([sys.executable, "-m", "respo", "report", str(sweep), "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert res3.returncode == 0, res3.stdout + res3.stderr
    text = (out / "report.md").read_text()
    late = text.split("### Late mean (training score")[1].split("###")[0]
    rows = [ln for ln in late.splitlines() if ln.startswith("| ") and not ln.startswith("| objective")]
    assert [r.split(" | ")[0] for r in rows] == ["| grpo", "| respo"]
    assert all(re.search(r"\d\.\d{3} \(1\)", r) for r in rows)
    assert "--preset quick" in text and "respo report" in text
    pngs = re.findall(r"\]\(([^)]+\.png)\)", text)
    assert {"kernels.png", "curves_tiny-dense.png", "logw_hist_tiny-dense.png"} <= set(pngs)
    for png in pngs:
        assert (out / png).stat().st_size > 1000, png
    # runs.csv carries what the real update records hold: per-token entropy early and late, the score of
    # each rollout step (4 updates at N = 4: one step, the mean of the 4 scores), the pooled histograms
    import csv

    for row in csv.DictReader((out / "runs.csv").open()):
        assert 0 < float(row["entropy_early"]) and 0 < float(row["entropy_late"]), row
        rd = sweep / "runs" / row["run"]
        scores = [json.loads(x)["score"] for x in (rd / "metrics.jsonl").read_text().splitlines()
                  if "event" not in json.loads(x)]
        assert json.loads(row["step_scores"]) == pytest.approx([sum(scores) / 4], abs=1e-6)
        assert 0 <= float(row["pooled_neg_low_w"] or 0) <= 1


def test_score_windows_are_the_papers():
    # The paper: late mean over the last 128 of 1,024 updates, early max over the first 256.
    from respo.train.scores import early_count, late_count

    assert late_count(1024) == 128 and early_count(1024) == 256
    assert late_count(64) == 8 and early_count(64) == 16  # the study's 64-update runs
    assert late_count(3) == 1 and early_count(3) == 1  # at least one update each
    # late mean of 1..1024 / 1024: mean of 897..1024 = (897 + 1024)/2 = 960.5 -> 0.93798828125
    s = [i / 1024 for i in range(1, 1025)]
    assert late_mean(s) == pytest.approx(960.5 / 1024)
    assert early_max(s) == pytest.approx(256 / 1024)


def test_report_says_when_no_run_left_its_first_rollout_step(tmp_path):
    # GRPO at N = 8, 8 updates each, two learning rates: every update trains on the first rollout step's
    # samples (the starting policy's), so their scores are the same and the best-lr table ranks nothing.
    sweep = tmp_path / "sweep"
    for lr in (1e-6, 1e-5):
        _fake_run(sweep, "grpo", 8, lr, 0, [0.4] * 7 + [0.6])
    text = build_report([sweep], tmp_path / "report", command="respo report sweep").read_text()
    best = text.split("best learning rate per N")[1].split("###")[0]
    assert "No run here got past its first rollout step" in best


def _one_run_report(tmp_path) -> str:
    """The report of one GRPO run (seed 0, every score 0.5, no evaluation, one start) under ``tmp_path/one``."""
    _fake_run(tmp_path / "one", "grpo", 8, 1e-5, 0, [0.5] * 16)
    return build_report([tmp_path / "one"], tmp_path / "report-one").read_text()


def test_report_shows_greedy_accuracy_with_the_sweeps_starting_policy(tmp_path):
    sweep = tmp_path / "sweep"
    greedy = {("grpo", 0): 0.625, ("grpo", 1): 0.575, ("respo", 0): 0.2, ("respo", 1): 0.3}
    for (obj, seed), g in greedy.items():
        d = _fake_run(sweep, obj, 8, 1e-5, seed, [0.5] * 16)
        (d / "summary.json").write_text(json.dumps({"eval_after": {"pass@1": 0.5, "prompts": 64, "k": 1,
                                                                   "greedy_acc": g}}))
    (sweep / "baseline_eval").mkdir()
    (sweep / "baseline_eval" / "tiny-dense.json").write_text(json.dumps(
        {"model": "tiny-dense", "policy": {"config": {"preset": "tiny-dense"}},
         "eval": {"pass@1": 0.531, "pass@1_se": 0.063, "greedy_acc": 0.5625}}))
    text = build_report([sweep], tmp_path / "report").read_text()
    section = text.split("### Held-out greedy accuracy after training")[1].split("\n\n", 2)[1]
    # grpo: mean (0.625 + 0.575)/2 = 0.600, sample std 0.0354; respo: 0.250 ± 0.071; the start: 0.5625
    assert "| grpo | **0.600 ± 0.035 (2)** |" in section and "| respo | 0.250 ± 0.071 (2) |" in section
    assert "| before RL (the starting policy, same protocol) | 0.562 |" in section
    # runs without a greedy evaluation get no such section
    assert "greedy accuracy" not in _one_run_report(tmp_path)


def test_report_names_the_starting_policies_when_runs_hold_two(tmp_path):
    # grpo seeds 0 and 1 from weights aaaa…, seed 2 from bbbb…: the report says so before its tables
    sweep = tmp_path / "sweep"
    for seed, sha in ((0, "a"), (1, "a"), (2, "b")):
        d = _fake_run(sweep, "grpo", 8, 1e-5, seed, [0.5] * 16)
        cfg = json.loads((d / "config.json").read_text())
        cfg["policy"] = {"source": "dir", "path": "w", "weights_sha256": sha * 64}
        (d / "config.json").write_text(json.dumps(cfg))
    # two recorded starts are refused, as `respo table` refuses them, naming a run of each
    with pytest.raises(TableError, match=r"two starting policies in one report: \S*grpo\S*_s0 started from aaaaaaaaaaaa "
                                         r"and \S*_s2 from bbbbbbbbbbbb; .* --starts-by-seed"):
        build_report([sweep], tmp_path / "report")
    # ... and pooled where each seed's runs share one start, under the flag the report names
    text = build_report([sweep], tmp_path / "report", starts_by_seed=True).read_text()
    section = text.split("## Starting policies")[1].split("\n## ")[0]
    assert "These runs start from 2 policies" in section and "Pooled under `--starts-by-seed`" in section
    assert "aaaaaaaaaaaa: 2 runs, seeds 0, 1; bbbbbbbbbbbb: 1 run, seed 2." in section
    # one start: no such section
    assert "## Starting policies" not in _one_run_report(tmp_path)


def _two_seeds_reported(tmp_path):
    """Two GRPO seeds (every score 0.5, every score 0.7) under ``tmp_path/sweep``, reported to
    ``tmp_path/report``: (sweep, run a, run b, the report's runs.csv lines)."""
    sweep = tmp_path / "sweep"
    a = _fake_run(sweep, "grpo", 8, 1e-5, 0, [0.5] * 16)
    b = _fake_run(sweep, "grpo", 8, 1e-5, 1, [0.7] * 16)
    build_report([sweep], tmp_path / "report")
    before = (tmp_path / "report" / "runs.csv").read_text().splitlines()
    assert [ln.split(",")[0] for ln in before[1:]] == [a.name, b.name]
    return sweep, a, b, before


def test_report_keeps_the_rows_of_runs_whose_directories_are_gone(tmp_path):
    import shutil
    sweep, a, b, before = _two_seeds_reported(tmp_path)
    shutil.rmtree(b)
    for png in (tmp_path / "report").glob("*.png"):  # the figures below must be drawn again, from seed 0 alone
        png.unlink()
    # --keep-rows: seed 1's row is kept as written, seed 0's rebuilt from its directory; report.md names the kept run
    text = build_report([sweep], tmp_path / "report", keep_rows=True).read_text()
    assert (tmp_path / "report" / "runs.csv").read_text().splitlines() == before
    assert "The tables also hold 1 earlier run whose directory was not given here" in text
    assert f"`{b.name}`" in text
    # ... and its row counts in every table: late mean over the two seeds = (0.5 + 0.7)/2 = 0.600, sample std
    # |0.7 - 0.5|/sqrt(2) = 0.141; the runs-compared table lists both runs, the figures only the run given
    late = text.split("### Late mean")[1].split("\n\n", 2)[1]
    assert "| grpo | **0.600 ± 0.141 (2)** |" in late
    runs_rows = [ln for ln in text.split("## Runs compared")[1].split("\n## ")[0].splitlines() if ln.startswith("| `")]
    assert [ln.split("`")[1] for ln in runs_rows] == [a.name, b.name]
    assert "figures show only the runs whose directories were given" in text
    for fig in ("runs_compared.png", "curves_tiny-dense.png", "logw_hist_tiny-dense.png"):
        assert (tmp_path / "report" / fig).is_file()
    # a model whose every run is a kept row gets its tables and, in place of each figure, a line saying why not
    m = _fake_run(tmp_path / "moe", "grpo", 8, 1e-5, 7, [0.25] * 16)  # a seed of its own: rows are keyed by run name
    cfg = json.loads((m / "config.json").read_text())
    (m / "config.json").write_text(json.dumps({**cfg, "model": "tiny-moe"}))
    build_report([sweep, tmp_path / "moe"], tmp_path / "report", keep_rows=True)
    shutil.rmtree(m)
    text = build_report([sweep], tmp_path / "report", keep_rows=True).read_text()
    moe = text.split("## Main comparison: tiny-moe")[1].split("\n## ")[0]
    assert "| grpo | **0.250 (1)** |" in moe  # late mean of the kept row alone (one seed: no std)
    assert moe.count("No figure: its runs are kept rows whose directories were not given.") == 4  # curves, KL, coef, hist
    assert "the number of prompts and k are in the runs' summary.json, not in the kept rows" in moe
    assert "Starting policy's sampled pass rate" not in moe  # the SFT record is in config.json, not in the row
    assert "The tables also hold 2 earlier runs whose directories were not given here" in text
    # without it the runs.csv holds the runs given, as before
    build_report([sweep], tmp_path / "report")
    assert (tmp_path / "report" / "runs.csv").read_text().splitlines() == before[:2]
    # kept rows are read by column name, as `respo table` reads them: a runs.csv without the start column (as
    # written before it existed) keeps its row, start left empty; one with a column this version does not write is
    # refused (its values would be lost), naming the column
    table = list(csv.reader(before))
    i = table[0].index("start")
    with (tmp_path / "report" / "runs.csv").open("w", newline="") as f:
        csv.writer(f).writerows([v for j, v in enumerate(row) if j != i] for row in (table[0], table[2]))
    build_report([sweep], tmp_path / "report", keep_rows=True)
    kept = {r["run"]: r for r in csv.DictReader((tmp_path / "report" / "runs.csv").open())}
    assert kept[b.name]["start"] == "" and float(kept[b.name]["late_mean"]) == pytest.approx(0.7)  # seed 1: 0.7
    (tmp_path / "report" / "runs.csv").write_text("\n".join([before[0] + ",my_note", before[2] + ",x"]) + "\n")
    with pytest.raises(TableError, match="column 'my_note' is not one a runs.csv of this version holds"):
        build_report([sweep], tmp_path / "report", keep_rows=True)


def test_report_is_redrawn_from_its_kept_rows_when_no_run_directory_is_left(tmp_path):
    import shutil
    from respo.errors import RespoError

    sweep, a, b, before = _two_seeds_reported(tmp_path)
    shutil.rmtree(sweep)
    # a row taken out of the folder's runs.csv by hand (e.g. a run set aside) leaves the tables when the report is
    # redrawn from the rows alone: seed 0's late mean 0.5 stays, one seed, no std
    (tmp_path / "report" / "runs.csv").write_text("\n".join(before[:2]) + "\n")
    text = build_report([], tmp_path / "report", keep_rows=True).read_text()
    assert (tmp_path / "report" / "runs.csv").read_text().splitlines() == before[:2]
    assert "from no run directory and the runs.csv rows of 1 earlier run (`--keep-rows`)" in text
    late = text.split("### Late mean")[1].split("\n\n", 2)[1]
    assert "| grpo | **0.500 (1)** |" in late
    assert f"`{b.name}`" not in text and f"`{a.name}`" in text
    assert "No figure: its runs are kept rows whose directories were not given." in text
    # with no run directory the rows are all there is: without --keep-rows, or with no rows to keep, it is an error
    with pytest.raises(RespoError, match="give a sweep or run directory, or --keep-rows"):
        build_report([], tmp_path / "report")
    with pytest.raises(RespoError, match="no runs.csv rows to keep in"):
        build_report([], tmp_path / "fresh", keep_rows=True)
    assert not (tmp_path / "fresh").exists()


def test_reports_of_one_folder_can_share_one_kernels_figure(tmp_path):
    from respo.errors import RespoError

    sweep, a, b, before = _two_seeds_reported(tmp_path)
    shared = tmp_path / "reports" / "kernels.png"
    for sub in ("one", "two/deeper"):
        text = build_report([sweep], tmp_path / "reports" / sub, kernels_figure=shared).read_text()
        link = "../kernels.png" if sub == "one" else "../../kernels.png"
        assert f"![kernels]({link})" in text
        assert not (tmp_path / "reports" / sub / "kernels.png").exists()
        assert (tmp_path / "reports" / sub / link).resolve() == shared.resolve()
    assert shared.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # without the flag the report draws its own copy, as before
    assert "![kernels](kernels.png)" in build_report([sweep], tmp_path / "own").read_text()
    assert (tmp_path / "own" / "kernels.png").is_file()
    # a figure whose folder cannot be made is refused in one line before anything is written
    (tmp_path / "file").write_text("x")
    with pytest.raises(RespoError, match="kernels figure's directory .* is not a directory; choose another --kernels-figure"):
        build_report([sweep], tmp_path / "three", kernels_figure=tmp_path / "file" / "kernels.png")
    assert not (tmp_path / "three").exists()


def test_report_compares_a_few_ordinary_runs(tmp_path):
    # two plain runs (not a study grid): one table row each and one figure with both curves.
    # late mean = mean of the last 16 // 8 = 2 scores: grpo (0.4 + 0.6) / 2 = 0.5, respo (0.7 + 0.9) / 2 = 0.8
    _fake_run(tmp_path, "grpo", 1, 1e-3, 0, [0.2] * 14 + [0.4, 0.6])
    _fake_run(tmp_path, "respo", 1, 1e-3, 0, [0.2] * 14 + [0.7, 0.9])
    text = build_report([tmp_path / "runs"], tmp_path / "cmp").read_text()
    section = text.split("## Runs compared")[1].split("\n## ")[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| `")]
    assert len(rows) == 2
    assert "| grpo | 1 | 0.001 | 0 | 16 | 0.500 |" in section and "| respo | 1 | 0.001 | 0 | 16 | 0.800 |" in section
    assert (tmp_path / "cmp" / "runs_compared.png").is_file()


def test_report_without_runs_is_an_error_and_writes_nothing(tmp_path):
    from respo.errors import RespoError

    (tmp_path / "empty").mkdir()
    with pytest.raises(RespoError, match="no runs found under"):
        build_report([tmp_path / "empty"], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_sweep_resumes_from_a_checkpoint_and_restarts_a_run_killed_before_its_first(tmp_path):
    # A run with a checkpoint continues (--resume); one killed before its first checkpoint left only
    # partial records, which cannot be continued, so it starts again (--overwrite) instead of being
    # refused as a used directory on every relaunch.
    from respo.study.grid import RunSpec
    from respo.study.supervise import train_command

    spec = RunSpec(name="r", overrides={"lr": 1e-4})
    run = tmp_path / "r"
    (run / "ckpt" / "update-000002").mkdir(parents=True)
    (run / "ckpt" / "update-000002" / "manifest.json").write_text("{}")
    assert "--resume" in train_command(spec, run, tmp_path / "base.toml", 1)
    fresh = tmp_path / "fresh"
    (fresh).mkdir()
    (fresh / "metrics.jsonl").write_text('{"update": 1}\n')
    cmd = train_command(spec, fresh, tmp_path / "base.toml", 1)
    assert "--overwrite" in cmd and "--resume" not in cmd


# ------------------------------------------------------------------------------------------------
# the long-response study: runs.csv's columns and the long-* presets
# ------------------------------------------------------------------------------------------------
def _long_fake_run(root: Path, ov: dict, recs: list[dict]) -> Path:
    """A finished run directory written by hand, with the long study's per-update metrics."""
    ov = {"lr": 3e-5, "seed": 0, **ov}
    d = root / "runs" / run_name(ov)
    d.mkdir(parents=True)
    cfg = {"model": "tiny-dense", "group_size": 8, "objective_kwargs": {}, "loss_agg_mode": "", "routing_replay": False,
           "updates": len(recs), "prompts": 4, "task": "addition", "task_kwargs": {"digits": 42, "scratchpad": True}, **ov}
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "metrics.jsonl").write_text("".join(json.dumps({"update": u, **r}) + "\n" for u, r in enumerate(recs, 1)))
    (d / "summary.json").write_text(json.dumps({"eval_after": {"pass@1": 0.5}}))
    return d


def test_runs_csv_long_study_columns(tmp_path):
    import csv

    # 4 updates at N = 2: staleness 0, 1, 0, 1. Same-batch numbers on the stale updates (2 and 4) only.
    recs = [{"score": 0.5, "staleness_mean": s, "response_length": L, "grad_clipped": g,
             "same_batch/frac_pos_low_w": f, "same_batch/respo_pos_low_w_mass_share": rs,
             "same_batch/vespo_pos_low_w_mass_share": vs}
            for s, L, g, f, rs, vs in [(0, 250.0, 1.0, 0.0, 0.0, 0.0), (1, 254.0, 0.0, 0.2, 0.3, 0.05),
                                       (0, 252.0, 0.0, 0.0, 0.0, 0.0), (1, 256.0, 1.0, 0.4, 0.5, 0.15)]]
    _long_fake_run(tmp_path, {"objective": "reshaped", "reuse": 2,
                              "objective_kwargs": {"pos_kernel": "respo(2, 0.5, 2)", "neg_kernel": "vespo(3,2)"}}, recs)
    _long_fake_run(tmp_path, {"objective": "gspo", "reuse": 2, "loss_agg_mode": "token-mean"}, recs[:2])
    _long_fake_run(tmp_path, {"objective": "reshaped", "reuse": 2}, recs[:1])  # the core's default branches
    out = tmp_path / "report"
    build_report([tmp_path], out)
    rows = {r["run"]: r for r in csv.DictReader((out / "runs.csv").open())}
    assert len(rows) == 3
    r = rows["tiny-dense_respopos.vesponeg_N2_G8_lr3e-05_s0"]
    assert r["objective"] == "respo+/vespo-" and r["kernels"] == "respo(2,0.5,2)+/vespo(3,2)-"
    assert (r["task"], json.loads(r["task_kwargs"]), r["B"], r["loss_agg_mode"]) == \
        ("addition", {"digits": 42, "scratchpad": True}, "4", "")
    assert float(r["response_length"]) == pytest.approx(253.0)  # (250 + 254 + 252 + 256) / 4, every update
    assert float(r["same_batch_frac_pos_low_w"]) == pytest.approx(0.3)  # (0.2 + 0.4) / 2, stale updates
    assert float(r["same_batch_respo_mass_share"]) == pytest.approx(0.4)  # (0.3 + 0.5) / 2
    assert float(r["same_batch_vespo_mass_share"]) == pytest.approx(0.1)  # (0.05 + 0.15) / 2
    assert float(r["grad_clip_rate"]) == pytest.approx(0.5)  # 2 of 4 updates clipped
    assert float(r["late_mean"]) == pytest.approx(0.5) and r["reuse"] == "2"  # the existing columns stay
    g = rows["tiny-dense_gspo_N2_G8_lr3e-05_s0_token-mean"]  # an aggregation override: its own run and row
    assert (g["objective"], g["kernels"], g["loss_agg_mode"]) == ("gspo@token-mean", "gspo", "token-mean")
    assert float(g["grad_clip_rate"]) == pytest.approx(0.5) and float(g["response_length"]) == pytest.approx(252.0)
    d = rows["tiny-dense_respo-2-0.5-2-pos.respo-1-0.5-2-neg_N2_G8_lr3e-05_s0"]
    assert d["kernels"] == "respo(2,0.5,2)+/respo(1,0.5,2)-"
    assert d["same_batch_frac_pos_low_w"] == ""  # no stale update: NaN is written empty


def test_long_presets_plan_their_grids():
    from respo.study.grid import LONG_LR
    from respo.study.names import LONG_KERNELS

    main = plan("long-main", _args())
    labels = {"grpo", "vespo", "respo", "respo+/vespo-", "respo+/respo0-"}
    assert len(main) == len(labels) * 2 * 3 == len({s.name for s in main})  # objectives x N {1, 32} x seeds {0, 1, 2}
    assert {(objective_label(s.overrides["objective"], s.overrides.get("objective_kwargs")), s.overrides["reuse"],
             s.overrides["seed"], s.overrides["lr"]) for s in main} == \
        {(o, n, k, LONG_LR) for o in labels for n in (1, 32) for k in (0, 1, 2)}
    kw = {objective_label(s.overrides["objective"], s.overrides.get("objective_kwargs")): s.overrides.get("objective_kwargs")
          for s in main}
    assert kw["respo+/vespo-"] == {"pos_kernel": "respo(2,0.5,2)", "neg_kernel": "vespo(3,2)"}
    assert kw["respo+/respo0-"] == {"pos_kernel": "respo(2,0.5,2)", "neg_kernel": "respo(1,0.5,0)"}
    assert plan("long-main", _args(lrs=[1e-5]))[0].overrides["lr"] == 1e-5

    neg = plan("long-negative", _args())
    assert len(neg) == 8 * 2 * 3 == len({s.name for s in neg})
    cells = {(s.overrides["objective"], (s.overrides.get("objective_kwargs") or {}).get("neg_kernel"),
              s.overrides.get("loss_agg_mode", "")) for s in neg}
    assert cells == {("reshaped", "vespo(3,2)", ""), ("reshaped", "truncated(1)", ""), ("reshaped", "respo(1,0.5,0)", ""),
                     ("respo", None, ""), ("reinforce", None, ""), ("grpo", None, ""), ("gspo", None, ""),
                     ("gspo", None, "token-mean")}
    assert all(s.overrides["objective_kwargs"]["pos_kernel"] == "respo(2,0.5,2)" for s in neg
               if s.overrides["objective"] == "reshaped")
    assert {s.overrides["reuse"] for s in neg} == {1, 32} and {s.overrides["seed"] for s in neg} == {0, 1, 2}
    gspo = sorted(s.name for s in neg if s.overrides["objective"] == "gspo" and s.overrides["reuse"] == 1
                  and s.overrides["seed"] == 0)
    assert gspo == ["tiny-dense_gspo_N1_G8_lr3e-05_s0", "tiny-dense_gspo_N1_G8_lr3e-05_s0_token-mean"]
    # shared coordinates give the same run names, so a shared sweep directory runs them once
    shared = {s.name for s in main} & {s.name for s in neg}
    assert len(shared) == 4 * 2 * 3  # grpo, respo, respo+/vespo-, respo+/respo0-
    assert set(LONG_KERNELS) == {"respo+/truncated-", "respo+/respo0-"}
    assert len(plan("long-negative", _args(objectives=["grpo@seq-mean-token-mean"], seeds=[0], reuse=[1]))) == 1
    with pytest.raises(ValueError, match="unknown loss_agg_mode"):
        plan("long-negative", _args(objectives=["gspo@mean"]))


def test_long_calibrate_preset_plans_its_grid():
    # grpo, vespo x N {1, 32} x lr {3e-5, 1e-4, 1e-5} x seed {0} = 2 * 2 * 3 = 12 runs of 64 updates
    runs = plan("long-calibrate", _args())
    grid = {(s.overrides["objective"], s.overrides["reuse"], s.overrides["lr"], s.overrides["seed"]) for s in runs}
    assert grid == {(o, n, lr, 0) for o in ("grpo", "vespo") for n in (1, 32) for lr in (3e-5, 1e-4, 1e-5)}
    assert len(runs) == len(grid) == 12
    assert all(s.overrides["updates"] == 64 for s in runs)  # 64 / 32 = 2 rollout steps at N = 32
    # learning rate varies slowest (one seed): 1e-5 comes last, so the grid can be cut by dropping it
    assert [s.overrides["lr"] for s in runs] == [3e-5] * 4 + [1e-4] * 4 + [1e-5] * 4
    assert len(plan("long-calibrate", _args(lrs=[3e-5, 1e-4]))) == 8


def test_report_states_the_sft_prompt_count_and_the_papers_figures_from_their_records(tmp_path, monkeypatch):
    """The starting policy's pass rate is said with the number of prompts its SFT record names (64 here, not a
    number written into the code), and the paper's figures come from respo/study/paper.toml."""
    from respo.study import paper

    sweep = tmp_path / "sweep"
    for seed in (0, 1):
        for n in (1, 8):
            d = _fake_run(sweep, "grpo", n, 3e-5 if seed == 0 else 1e-4, seed, [0.2] * 16)
            cfg = json.loads((d / "config.json").read_text())
            cfg["policy"] = {"pass_rate": 0.46875, "config": {"eval_n": 64},
                             "pass_rate_measured_on": "64 held-out prompts, one sample each, temperature 1"}
            (d / "config.json").write_text(json.dumps(cfg))
    text = build_report([sweep], tmp_path / "r", shared_lr=3e-5).read_text()
    assert "as recorded by its SFT (64 prompts, one sample each): 0.46875." in text
    assert "512" not in text
    # 22.8 %, 38.5 % and 15.5 % are paper.toml's figures: another file, other words
    assert "(22.8 % in Chen, Ban, Hsieh 2026)" in text and "38.5 % of ReSPO's mass vs 15.5 % under VESPO" in text
    fake = tmp_path / "paper.toml"
    fake.write_text(paper.PAPER_FILE.read_text().replace("value = 0.228", "value = 0.311"))
    monkeypatch.setattr(paper, "PAPER_FILE", fake)
    paper._paper.cache_clear()
    try:
        text = build_report([sweep], tmp_path / "r2", shared_lr=3e-5).read_text()
    finally:
        paper._paper.cache_clear()
    # 0.311 -> "31.1 %", rounded to ten points "about 30 %"
    assert "about 30 % of positives at log W < −1 at high N (31.1 % in Chen, Ban, Hsieh 2026)" in text
    assert "22.8" not in text


def test_paper_figures_name_their_source():
    from respo.study.paper import paper_figure

    f = paper_figure("frac_pos_low_w")
    assert (f.value, f.percent, f.about, f.cite, f.arxiv) == (0.228, "22.8 %", "about 20 %", "Chen, Ban, Hsieh 2026",
                                                              "2609.35433")
    assert f.setting == "N = 32 on Qwen3-30B-A3B" and f.where
    with pytest.raises(KeyError, match="no figure 'nope'"):
        paper_figure("nope")


def test_report_shows_the_engine_mismatch_of_runs_that_logged_it(tmp_path):
    # a run sampled by an engine logs rollout_corr/* on every update; its report sets the mismatch beside
    # the staleness (respo table mismatch's numbers): abs diff .02 per token, sequence p10 -1.3, p90 +.5,
    # beyond +-1 .2; stale updates' log W p10 = -1 (the fake run's -1 x staleness at N = 2: staleness 1)
    d = _fake_run(tmp_path / "vllm", "vespo", 2, 1e-5, 0, [0.5] * 16)
    recs = [json.loads(ln) for ln in (d / "metrics.jsonl").read_text().splitlines()[:-1]]  # the torn tail left out
    for r in recs:
        r.update({"rollout_corr/abs_diff": 0.02, "rollout_corr/seq_log_ratio_p10": -1.3,
                  "rollout_corr/seq_log_ratio_p90": 0.5, "rollout_corr/seq_frac_beyond_1": 0.2})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    text = build_report([tmp_path / "vllm"], tmp_path / "report").read_text()
    section = text.split("## Engine–trainer mismatch (tiny-dense)")[1].split("\n## ")[0]
    assert "| 1e-05 | 2 | vespo | 1 | 0.020 | -1.30 | +0.50 | 0.200 | -1.00 |" in section
    # runs of respo's own sampler log none: no such section
    _fake_run(tmp_path / "plain", "grpo", 2, 1e-5, 0, [0.5] * 16)
    assert "Engine–trainer mismatch" not in build_report([tmp_path / "plain"], tmp_path / "report2").read_text()


def test_report_refuses_a_run_without_the_endpoint_its_cell_has_or_names_it_under_skip_missing(tmp_path):
    # three GRPO seeds at one (lr, N): seed 2's held-out evaluation is missing (summary.json without pass@1). The
    # late-mean table would pool 3 seeds and the pass@1 table 2, without a word: refused, naming its directory
    sweep = tmp_path / "sweep"
    for seed, score in ((0, 0.5), (1, 0.7), (2, 0.9)):
        d = _fake_run(sweep, "grpo", 8, 1e-5, seed, [score] * 16)
    (d / "summary.json").write_text(json.dumps({"eval_after": {}}))
    with pytest.raises(TableError, match=rf"{re.escape(str(d))}, column pass@1: run {d.name} finished with pass@1 "
                                         r"empty or nan, while other runs of its cell have one; .*--skip-missing"):
        build_report([sweep], tmp_path / "report")
    text = build_report([sweep], tmp_path / "report", skip_missing=True).read_text()
    assert f"Left out under --skip-missing, finished without an endpoint the other runs of their cell have: " \
           f"{d.name} (pass@1 empty or nan)." in text
    late = text.split("### Late mean")[1].split("\n\n", 2)[1]
    assert "| grpo | **0.600 ± 0.141 (2)** |" in late  # seeds 0 and 1 only: (0.5 + 0.7)/2, |0.7 - 0.5|/sqrt(2)
    # its row is still recorded in runs.csv: nothing is dropped from the record
    assert d.name in (tmp_path / "report" / "runs.csv").read_text()
    # a cell where no run was evaluated has no gap: its pass@1 is simply not measured
    plain = tmp_path / "plain"
    for seed in (0, 1):
        e = _fake_run(plain, "grpo", 8, 1e-5, seed, [0.5] * 16)
        (e / "summary.json").write_text(json.dumps({"eval_after": {}}))
    assert "Left out" not in build_report([plain], tmp_path / "report2").read_text()
