"""respo.study.recommend: which objective to use per (response length, N) cell, from runs.csv rows.

The numbers are chosen so the Welch tests can be done by hand (comments), and the rules are checked
one at a time: an objective's best learning rate, the edge flag, "worse" only when p <= 0.05 on
either metric, cells kept apart by length, N and budget, and bad input refused by name.
"""

from __future__ import annotations

import csv

import pytest

from respo.study.recommend import RecommendError, load_rows, markdown, recommend


def _rows(objective, lr, lates, passes, *, reuse=32, length=128, updates=256):
    return [{"objective": objective, "lr": lr, "seed": s, "late_mean": late, "pass@1": p, "reuse": reuse,
             "length": length, "updates": updates}
            for s, (late, p) in enumerate(zip(lates, passes))]


def _cell(**kw):
    rows = []
    # vespo: mean late .6 at 3e-5, .5 at 1e-4: its best lr is 3e-5, the lowest it was run at (an edge).
    rows += _rows("vespo", 3e-5, [0.5, 0.6, 0.7], [0.5, 0.6, 0.7], **kw)
    rows += _rows("vespo", 1e-4, [0.4, 0.5, 0.6], [0.4, 0.5, 0.6], **kw)
    # respo: mean .2, variance .01 like vespo's. Welch: diff -.4, se^2 = .01/3 + .01/3 = .006667,
    # t = -.4 / .08165 = -4.899, df = se^4 / ((.01/3)^2/2 + (.01/3)^2/2) = 4, two-sided p = 0.0081.
    rows += _rows("respo", 3e-5, [0.1, 0.2, 0.3], [0.1, 0.2, 0.3], **kw)
    # grpo: late mean .55 (variance .0025): diff -.05, se^2 = .0025/3 + .01/3 = .0041667,
    # t = -.05 / .06455 = -0.775, p ~ 0.48: within noise. Its pass@1 equals vespo's.
    rows += _rows("grpo", 3e-5, [0.5, 0.55, 0.6], [0.5, 0.6, 0.7], **kw)
    # grpo is lower at 1e-5 (.45) and at 1e-4 (.35): its best, 3e-5, lies inside its grid.
    rows += _rows("grpo", 1e-5, [0.4, 0.45, 0.5], [0.4, 0.45, 0.5], **kw)
    rows += _rows("grpo", 1e-4, [0.3, 0.35, 0.4], [0.3, 0.35, 0.4], **kw)
    return rows


def test_best_objective_best_lr_and_the_welch_verdicts_by_hand():
    (cell,) = recommend(_cell())
    assert (cell.length, cell.reuse, cell.updates) == (128, 32, 256)
    assert (cell.best.objective, cell.best.lr) == ("vespo", 3e-5)
    assert cell.best.late_mean == pytest.approx(0.6)
    assert cell.best.edge  # 3e-5 is the lowest of vespo's {3e-5, 1e-4}
    by = {e.objective: e for e in cell.entries}
    assert by["grpo"].lr == 3e-5 and not by["grpo"].edge
    assert by["respo"].edge  # run at one learning rate only
    respo = by["respo"].vs_best["late mean"]
    assert respo.diff == pytest.approx(-0.4) and respo.t == pytest.approx(-4.899, abs=1e-3)
    assert respo.df == pytest.approx(4.0) and respo.p == pytest.approx(0.0081, abs=2e-4)
    assert by["respo"].worse
    grpo = by["grpo"].vs_best["late mean"]
    assert grpo.t == pytest.approx(-0.775, abs=1e-3) and grpo.verdict == "within noise"
    assert not by["grpo"].worse
    assert [e.objective for e in cell.use] == ["vespo", "grpo"]  # the best, then those within noise of it


def test_worse_on_held_out_pass_alone_is_worse():
    rows = _cell()
    for r in rows:  # grpo's training score stays within noise, its held-out pass@1 drops to .1-.3
        if r["objective"] == "grpo" and r["lr"] == 3e-5:
            r["pass@1"] -= 0.4
    (cell,) = recommend(rows)
    by = {e.objective: e for e in cell.entries}
    assert by["grpo"].vs_best["late mean"].verdict == "within noise"
    assert by["grpo"].vs_best["pass@1"].verdict == "a < b" and by["grpo"].worse
    assert [e.objective for e in cell.use] == ["vespo"]


def test_cells_are_kept_apart_by_length_n_and_budget():
    rows = _cell() + _cell(length=32) + _cell(reuse=8) + _cell(updates=64)
    cells = recommend(rows)
    assert [(c.length, c.reuse, c.updates) for c in cells] == [(32, 32, 256), (128, 8, 256), (128, 32, 64),
                                                               (128, 32, 256)]
    assert all(c.best.objective == "vespo" and len(c.entries) == 3 for c in cells)


def test_too_few_seeds_are_listed_not_ranked():
    rows = _cell() + _rows("gspo", 3e-5, [0.9, 0.9], [0.9, 0.9])  # 2 seeds: not enough for a verdict
    (cell,) = recommend(rows, min_seeds=3)
    assert cell.best.objective == "vespo"
    assert cell.unranked == ["gspo (lr 3e-05, 2 seeds)"]


def test_markdown_names_the_best_the_ties_and_the_losses(tmp_path):
    text = markdown(recommend(_cell()))
    assert "| 128 | 32 | 8 | vespo (3e-05, edge) |" in text
    assert "grpo (3e-05)" in text and "respo (3e-05, edge): late mean -0.400, p = 0.008" in text


def test_load_rows_reads_a_runs_csv_and_refuses_missing_columns(tmp_path):
    path = tmp_path / "runs.csv"
    cols = ["run", "model", "objective", "reuse", "group_size", "lr", "seed", "routing_replay", "updates",
            "finished", "late_mean", "pass@1"]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        w.writerow(["a", "tiny-dense", "grpo", "32", "8", "3e-05", "0", "False", "256", "True", "0.5", "0.625"])
        w.writerow(["b", "tiny-moe", "grpo", "32", "8", "3e-05", "0", "False", "256", "True", "0.5", "0.6"])
        w.writerow(["c", "tiny-dense", "grpo", "32", "8", "3e-05", "1", "False", "256", "False", "", ""])
    rows = load_rows(path, length=128, model="tiny-dense", group_size=8)
    assert rows == [{"objective": "grpo", "lr": 3e-5, "seed": 0, "late_mean": 0.5, "pass@1": 0.625, "reuse": 32,
                     "length": 128, "updates": 256}]  # the MoE row and the unfinished row are not read
    bad = tmp_path / "bad.csv"
    bad.write_text("run,objective\nx,grpo\n")
    with pytest.raises(RecommendError, match=r"bad.csv: missing column\(s\) .*late_mean"):
        load_rows(bad, length=32)


def test_respo_recommend_prints_the_table_and_names_bad_input(tmp_path, capsys):
    from respo.cli import main

    path = tmp_path / "runs.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, ["objective", "reuse", "lr", "seed", "updates", "finished", "late_mean", "pass@1",
                               "model", "group_size"])
        w.writeheader()
        for r in _cell():
            w.writerow({**{k: r[k] for k in ("objective", "reuse", "lr", "seed", "updates", "late_mean", "pass@1")},
                        "finished": "True", "model": "tiny-dense", "group_size": 8})
    assert main(["recommend", f"128={path}"]) == 0
    assert "| 128 | 32 | 8 | vespo (3e-05, edge) | 0.600 / 0.600 | grpo (3e-05) |" in capsys.readouterr().out
    assert main(["recommend", str(path)]) == 2
    assert "expected LENGTH=RUNS_CSV" in capsys.readouterr().err
    assert main(["recommend", f"128={tmp_path / 'none.csv'}"]) == 2
    assert "cannot read" in capsys.readouterr().err and not (tmp_path / "none.csv").exists()
    assert main(["recommend", f"128={path}", "--model", "tiny-moe"]) == 2
    assert "no finished tiny-moe runs" in capsys.readouterr().err
