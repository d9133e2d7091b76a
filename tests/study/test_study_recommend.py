"""respo.study.recommend: which objective to use per (response length, N) cell, from runs.csv rows.

The numbers are chosen so the Welch tests can be done by hand (comments), and the rules are checked
one at a time: an objective's best learning rate, the edge flag, "worse" only when the adjusted p <= 0.05
on either metric, "equivalent" only by TOST, cells kept apart by length, N and budget, and bad input
refused by name.
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
    # t = -.05 / .06455 = -0.775, df = se^4 / ((.0025/3)^2/2 + (.01/3)^2/2) = 2.941, p = .496: no difference
    # detected. Its pass@1 equals vespo's (p = 1).
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
    assert grpo.t == pytest.approx(-0.775, abs=1e-3) and grpo.p == pytest.approx(0.496, abs=1e-3)
    assert grpo.verdict.startswith("no difference detected (95 % CI ")
    assert not by["grpo"].worse
    # Benjamini–Hochberg over the table's 4 tests, p = [.0081 (respo late), .0081 (respo pass@1), .496, 1]:
    # 1·4/4 = 1; .496·4/3 = .661; .0081·4/2 = .0162 (both respo tests) -> respo is still worse, adjusted
    assert respo.p_adj == pytest.approx(2 * respo.p) and by["respo"].vs_best["pass@1"].p_adj == respo.p_adj
    assert grpo.p_adj == pytest.approx(grpo.p * 4 / 3) and by["grpo"].vs_best["pass@1"].p_adj == 1.0
    assert respo.verdict == "worse"
    assert [e.objective for e in cell.use] == ["vespo", "grpo"]  # the best, then those within noise of it


def test_worse_on_held_out_pass_alone_is_worse():
    rows = _cell()
    for r in rows:  # grpo's training score stays within noise, its held-out pass@1 drops to .1-.3
        if r["objective"] == "grpo" and r["lr"] == 3e-5:
            r["pass@1"] -= 0.4
    (cell,) = recommend(rows)
    by = {e.objective: e for e in cell.entries}
    assert by["grpo"].vs_best["late mean"].verdict.startswith("no difference detected")
    assert by["grpo"].vs_best["pass@1"].verdict == "worse" and by["grpo"].worse
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
    assert cell.unranked == ["gspo (lr 3e-05: 2 seeds)"]


def test_markdown_names_the_best_the_losses_and_which_p_it_shows(tmp_path):
    text = markdown(recommend(_cell()))
    # one row per objective: late mean, its difference from the best, raw p, adjusted p, verdict; then pass@1
    assert "| 128 | 32 | 8 | vespo (3e-05, edge) **best** | 3 | 0.600 | — | — | — | best | 0.600 |" in text
    assert "| late mean vs best (δ = ±0.03) |" in text
    assert "| 128 | 32 | 8 | respo (3e-05, edge) | 3 | 0.200 | -0.400 | 0.008 | 0.016 | worse | 0.200 | -0.400 | " \
           "0.008 | 0.016 | worse |" in text
    assert "| grpo (3e-05) | 3 | 0.550 | -0.050 | 0.496 | 0.661 | no difference detected (95 % CI " in text
    # the summary: the best, those not shown worse, the worse ones with their adjusted p's
    assert "| 128 | 32 | 8 | vespo (3e-05, edge): 0.600 / 0.600 | grpo (3e-05) | respo (3e-05, edge) (0.016 / 0.016) " \
           "| — |" in text
    assert "Benjamini–Hochberg" in text and "each cell (4–4 with a p" in text and "δ = ±0.03" in text
    assert "Winner's curse" in text
    assert "late mean -0.400, p = 0.008" not in text  # no single p under a two-metric header any more


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
        w.writerow(["d", "tiny-dense", "grpo", "32", "8", "3e-05", "2", "True", "256", "True", "0.25", "0.5"])
    rows = load_rows(path, length=128, model="tiny-dense", group_size=8)
    assert rows == [{"objective": "grpo", "lr": 3e-5, "seed": 0, "late_mean": 0.5, "pass@1": 0.625, "reuse": 32,
                     "length": 128, "start": "", "weights": "", "engine": "respo", "run": "a", "updates": 256,
                     "where": f"{path} line 2"}]  # a runs.csv without the engine column: respo's sampler
    # the MoE row, the unfinished row and the routing-replay row are not read; asked for, only the last is
    replay = load_rows(path, length=128, model="tiny-dense", group_size=8, routing_replay=True)
    assert [(r["run"], r["seed"], r["late_mean"]) for r in replay] == [("d", 2, 0.25)]
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
    assert "| 128 | 32 | 8 | vespo (3e-05, edge): 0.600 / 0.600 | grpo (3e-05) |" in capsys.readouterr().out
    assert main(["recommend", str(path)]) == 2
    assert "expected LENGTH=RUNS_CSV" in capsys.readouterr().err
    assert main(["recommend", f"128:={path}"]) == 2  # a START label cannot be empty
    assert "LENGTH:START=RUNS_CSV" in capsys.readouterr().err
    assert main(["recommend", f"128={tmp_path / 'none.csv'}"]) == 2
    assert "cannot read" in capsys.readouterr().err and not (tmp_path / "none.csv").exists()
    assert main(["recommend", f"128={path}", "--model", "tiny-moe"]) == 2
    assert "no finished tiny-moe runs" in capsys.readouterr().err
    assert main(["recommend", f"128={path}", "--routing-replay"]) == 2  # no row has routing replay
    assert "no finished tiny-dense runs with G = 8 and routing replay" in capsys.readouterr().err


# --- false records: each of these printed a wrong table or a traceback before ----------------------------------------

COLS = ["run", "model", "objective", "reuse", "group_size", "lr", "seed", "routing_replay", "updates", "finished",
        "late_mean", "pass@1"]


def _write_runs(path, rows, *, name=lambda r: f"{r['objective']}_N{r['reuse']}_lr{r['lr']:g}_s{r['seed']}"):
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, COLS)
        w.writeheader()
        for r in rows:
            w.writerow({"run": name(r), "model": "tiny-dense", "objective": r["objective"], "reuse": r["reuse"],
                        "group_size": 8, "lr": r["lr"], "seed": r["seed"], "routing_replay": "False",
                        "updates": r["updates"], "finished": "True", "late_mean": r["late_mean"],
                        "pass@1": r["pass@1"]})
    return path


def _main(argv, capsys):
    from respo.cli import main

    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_same_runs_csv_twice_is_refused_in_one_line(tmp_path, capsys):
    # every seed would count twice: grpo's p = .48 (within noise) would shrink as if there were 6 seeds
    path = _write_runs(tmp_path / "runs.csv", _cell())
    code, out, err = _main(["recommend", f"128={path}", f"128={path}"], capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "duplicate" in err and "line 2" in err and str(path) in err


def test_a_renamed_copy_of_the_same_seeds_is_refused_too(tmp_path, capsys):
    # the same objective, learning rate and seed in one cell twice, under other run names
    a = _write_runs(tmp_path / "a.csv", _cell())
    b = _write_runs(tmp_path / "b.csv", _cell(), name=lambda r: f"copy_{r['objective']}_{r['lr']:g}_{r['seed']}")
    code, out, err = _main(["recommend", f"128={a}", f"128={b}"], capsys)
    assert code == 2 and "duplicate" in err and "seed 0" in err and len(err.strip().splitlines()) == 1


def test_the_same_runs_continued_to_a_longer_budget_are_not_duplicates(tmp_path, capsys):
    # a 64-update sweep and the same runs continued to 256 updates (another budget): two cells, not a duplicate
    short = _write_runs(tmp_path / "short.csv", _cell(updates=64))
    long = _write_runs(tmp_path / "long.csv", _cell(updates=256))
    code, out, err = _main(["recommend", f"128={short}", f"128={long}"], capsys)
    assert code == 0 and err == ""
    assert "| 128 | 32 | 2 |" in out and "| 128 | 32 | 8 |" in out
    # ... and the output says the two cells are not independent: 6 objective/lr pairs × 3 seeds in both
    assert "the 2- and 8-rollout-step cells share 18 objective/lr/seed combinations" in out


def test_one_seed_per_cell_says_why_there_is_no_verdict(tmp_path, capsys):
    rows = [r for r in _cell() if r["seed"] == 0]
    path = _write_runs(tmp_path / "runs.csv", rows)
    code, out, err = _main(["recommend", f"128={path}"], capsys)
    assert code == 0
    assert "no objective has 3 seeds at one learning rate" in out and "1 seed" in out
    assert "the table is empty" in out
    assert "| 128 | 32 |" not in out  # no row at all: no best, no verdict


def test_min_seeds_1_never_gives_a_verdict_without_a_test(tmp_path, capsys):
    rows = [r for r in _cell() if r["seed"] == 0]
    path = _write_runs(tmp_path / "runs.csv", rows)
    code, out, err = _main(["recommend", f"128={path}", "--min-seeds", "1"], capsys)
    assert code == 0 and "no test (n = 1)" in out
    rows = [line for line in out.splitlines() if line.startswith("| 128 |")]
    assert len(rows) == 4  # grpo (the best on seed 0), vespo and respo, and the cell's summary
    assert all("no difference detected (" not in r and "| worse" not in r and "equivalent" not in r for r in rows)
    assert "| 128 | 32 | 8 | grpo (3e-05): 0.500 / 0.500 | — | — | vespo (3e-05, edge), respo (3e-05, edge) |" in out


@pytest.mark.parametrize("content, problem", [
    (b"", "empty file"),
    (b"\xff\xfe\x00r\x00u\x00n", "not UTF-8"),
    (None, "late_mean 'n/a' is not a number"),
])
def test_bad_files_give_one_line_naming_file_row_and_problem(tmp_path, capsys, content, problem):
    path = tmp_path / "runs.csv"
    if content is None:
        _write_runs(path, _cell())
        lines = path.read_text().splitlines()
        lines[3] = lines[3].replace(",0.7,", ",n/a,")  # vespo seed 2's late mean (line 4 of the file)
        assert "n/a" in lines[3]
        path.write_text("\n".join(lines) + "\n")
    else:
        path.write_bytes(content)
    code, out, err = _main(["recommend", f"128={path}"], capsys)
    assert code == 2 and out == "" and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and str(path) in err and problem in err
    if content is None:
        assert "line 4" in err


def test_min_seeds_below_one_is_refused(tmp_path, capsys):
    path = _write_runs(tmp_path / "runs.csv", _cell())
    code, out, err = _main(["recommend", f"128={path}", "--min-seeds", "0"], capsys)
    assert code == 2 and "--min-seeds" in err


def test_holm_and_per_cell_families(tmp_path):
    # Holm over the same 4 tests, p = [.0081, .0081, .496, 1]: 4·.0081 = .0324, max(.0324, 3·.0081) = .0324,
    # max(.0324, 2·.496) = .992, 1 -> respo still worse (.0324 <= .05)
    (cell,) = recommend(_cell(), method="holm")
    by = {e.objective: e for e in cell.entries}
    respo, grpo = by["respo"].vs_best["late mean"], by["grpo"].vs_best["late mean"]
    assert respo.p_adj == pytest.approx(4 * respo.p) and grpo.p_adj == pytest.approx(2 * grpo.p)
    assert by["respo"].worse
    # two identical cells, one family (8 tests) or two (4 each): BH is invariant to duplicating the family
    # here (every p·m/rank is the same), Holm is not: 8·.0081 = .0648 > .05 over the table, .0324 per cell
    rows = _cell() + _cell(length=32)
    table = recommend(rows, method="holm", family="table")
    assert all(not c.entries[2].worse for c in table) and "no difference detected after adjustment" in \
        table[0].entries[2].vs_best["late mean"].verdict
    assert "all the two-sided tests of this table (8 with a p" in markdown(table, method="holm", family="table")
    per_cell = recommend(rows, method="holm")  # the default family: each cell
    assert all(c.entries[2].objective == "respo" and c.entries[2].worse for c in per_cell)


def test_equivalent_only_by_tost_by_hand():
    # best vespo late = pass@1 = [.600, .610, .620] (mean .61, s² = .0001), grpo [.595, .605, .615] (mean .605):
    # diff −.005, se = √(2·.0001/3) = .008165, df = 4. δ = .03: t_l = .025/.008165 = 3.0619 (t² = 9.375),
    # F_4 = .5 + .75·√(9.375/13.375)·(1 − 9.375/40.125) = .5 + .75·.837219·.766355 = .981205, p_l = .018795;
    # t_u = −.035/.008165 = −4.2866 (t² = 18.375): F_4 = .5 + .75·.906217·.726257 = .993610, p_u = .006390.
    # TOST p = .018795 for both metrics; BH over the two: .018795 -> equivalent within ±0.03.
    # The two-sided p is .573 (t = −.6124): no difference either. At δ = .01 the TOST fails (t_u = −1.837).
    rows = _rows("vespo", 3e-5, [0.600, 0.610, 0.620], [0.600, 0.610, 0.620])
    rows += _rows("grpo", 3e-5, [0.595, 0.605, 0.615], [0.595, 0.605, 0.615])
    (cell,) = recommend(rows, margin=0.03)
    t = cell.entries[1].vs_best["late mean"]
    assert t.tost.p_lower == pytest.approx(0.018795, abs=1e-6) and t.tost.p_upper == pytest.approx(0.006390, abs=1e-6)
    assert t.p_tost_adj == pytest.approx(0.018795, abs=1e-6) and t.verdict == "equivalent within ±0.03"
    # 95 % CI: −.005 ± 2.776445·.008165 = (−.027669, +.017669)
    (narrow,) = recommend(rows, margin=0.01)
    assert narrow.entries[1].vs_best["late mean"].verdict.startswith("no difference detected (95 % CI -0.028, +0.018")
    (off,) = recommend(rows, margin=None)
    assert off.entries[1].vs_best["pass@1"].tost is None and off.entries[1].vs_best["pass@1"].verdict.startswith(
        "no difference detected")


def test_held_out_seeds_pick_on_some_and_test_on_the_others():
    # seeds 3 and 4 as well: seeds 0 and 1 again, shifted by +.01
    rows = _cell() + [{**r, "seed": r["seed"] + 3, "late_mean": r["late_mean"] + 0.01} for r in _cell() if r["seed"] < 2]
    # picked on seeds 0 and 1 (vespo 3e-5: mean .55; vespo 1e-4: .45; grpo 3e-5: .525): vespo at 3e-5 is the best,
    # then tested on seeds 2, 3, 4: vespo late [.7, .51, .61], respo [.3, .11, .21]
    (cell,) = recommend(rows, select_seeds=[0, 1])
    assert cell.best.objective == "vespo" and cell.best.lr == 3e-5
    assert sorted(cell.best.late) == pytest.approx([0.51, 0.61, 0.7])
    by = {e.objective: e for e in cell.entries}
    assert sorted(by["respo"].late) == pytest.approx([0.11, 0.21, 0.3])
    text = markdown([cell], select_seeds=[0, 1])
    assert "Held-out seeds: learning rates and the best picked on seeds 0, 1" in text and "Winner's curse" not in text
    # with no seed left to test on, nothing is ranked
    (empty,) = recommend(_cell(), select_seeds=[0, 1, 2])
    assert empty.entries == [] and "0 seeds" in empty.unranked[0]


def test_the_committed_runs_csv_files_recommend_without_a_false_duplicate(capsys):
    # the 128-token 8-step runs continue the 2-step runs (names *_u256, 256 updates): two cells, no duplicate
    from pathlib import Path

    root = Path(__file__).parents[2]
    files = ["32=reports/staleness/runs.csv", "128=reports/long/headline-128/runs.csv",
             "128=reports/long/main-128/runs.csv", "256=reports/long/calib-256/runs.csv"]
    code, out, err = _main(["recommend", *[f.replace("=", f"={root}/") for f in files]], capsys)
    assert code == 0 and err == ""
    for cell in ("| 32 | 32 | 2 |", "| 128 | 32 | 2 |", "| 128 | 32 | 8 |", "| 256 | 32 | 2 |"):
        assert cell in out
    # the README's command (whatever files it names) runs too
    readme = (root / "README.md").read_text()
    line = next(x for x in readme.splitlines() if "respo recommend " in x and x.startswith(".venv/bin/python"))
    args = line.split("respo recommend ", 1)[1].split()
    code, out, err = _main(["recommend", *[a.replace("=", f"={root}/") for a in args]], capsys)
    assert code == 0 and err == ""


@pytest.mark.parametrize("edit, problem", [
    (lambda line: line.replace(",True,", ",maybe,"), "finished 'maybe' is not true or false"),
    (lambda line: line.rsplit(",", 2)[0], "2 fields fewer than the header"),
    (lambda line: line + ",extra", "more fields than the header"),
    (lambda line: line.replace(",0.7,", ",inf,"), "late_mean 'inf' is not a finite number"),
    (lambda line: line.replace(",3e-05,", ",fast,"), "lr 'fast' is not a number"),
])
def test_a_malformed_row_is_named_not_dropped(tmp_path, capsys, edit, problem):
    # each of these rows used to be skipped without a word (finished 'maybe', a short row) or to end
    # in a traceback (a long row's extra field, a non-numeric lr); inf would have been dropped by the tests
    path = _write_runs(tmp_path / "runs.csv", _cell())
    lines = path.read_text().splitlines()
    lines[3] = edit(lines[3])
    path.write_text("\n".join(lines) + "\n")
    code, out, err = _main(["recommend", f"128={path}"], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"{path} line 4" in err and problem in err


def test_a_filter_column_that_is_missing_is_named(tmp_path, capsys):
    path = tmp_path / "runs.csv"
    path.write_text("objective,reuse,lr,seed,updates,finished,late_mean,pass@1\ngrpo,32,3e-05,0,256,True,0.5,0.5\n")
    code, out, err = _main(["recommend", f"128={path}"], capsys)
    assert code == 2 and "no model column" in err and str(path) in err
    assert load_rows(path, length=128)[0]["late_mean"] == 0.5  # no filter asked for: read as it is


def test_the_late_mean_p_is_shown_under_late_mean_not_the_smaller_of_two(capsys):
    # 128 tokens, N = 32, 8 rollout steps: respo vs vespo had "late mean -0.294, p = 0.007" printed, but 0.007 is
    # the pass@1 p; the late-mean p is 0.008 (Welch over the committed per-seed values)
    from pathlib import Path

    root = Path(__file__).parents[2]
    code, out, err = _main(["recommend", f"128={root}/reports/long/main-128/runs.csv"], capsys)
    row = next(line for line in out.splitlines() if line.startswith("| 128 | 32 | 8 | respo (0.0001, edge) |"))
    cols = [c.strip() for c in row.strip("|").split("|")]
    assert cols[5:8] == ["0.338", "-0.294", "0.008"] and cols[10:13] == ["0.474", "-0.227", "0.007"]


def test_a_utf8_byte_order_mark_is_not_a_missing_column(tmp_path):
    # spreadsheet programs write a BOM before the first header; "\ufeffobjective" would be "missing objective"
    path = tmp_path / "runs.csv"
    path.write_bytes("objective,reuse,lr,seed,updates,finished,late_mean,pass@1\ngrpo,32,3e-05,0,256,True,0.5,0.5\n"
                     .encode("utf-8-sig"))
    assert load_rows(path, length=128)[0]["objective"] == "grpo"


# --- starting policies: a cell never pools two -------------------------------------------------------------------------

def _with_column(path, name, value):
    """Append a column ``name`` holding ``value`` on every row, as respo report writes it."""
    rows = list(csv.reader(path.open(newline="")))
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(rows[0] + [name])
        w.writerows(r + [value] for r in rows[1:])
    return path


def _with_start(path, weights):
    """Append a ``start`` column (the starting policy's weights digest)."""
    return _with_column(path, "start", weights)


def test_two_starting_policies_in_one_cell_are_refused_until_labelled_apart(tmp_path, capsys):
    # the same sweep run from two warm starts built by the same settings but with different weights:
    # pooled, vespo's seed 0 would count twice; and even without a shared seed the cell would mix policies
    a = _with_start(_write_runs(tmp_path / "a.csv", _cell()), "aaaaaaaaaaaa")
    b = _with_start(_write_runs(tmp_path / "b.csv", [r for r in _cell() if r["objective"] == "vespo"],
                                name=lambda r: f"b{r['seed']}_{r['lr']:g}"), "bbbbbbbbbbbb")
    c = _with_start(_write_runs(tmp_path / "c.csv", [{**r, "seed": r["seed"] + 10} for r in _cell()]), "cccccccccccc")
    code, out, err = _main(["recommend", f"128={a}", f"128={c}"], capsys)  # no seed shared: still refused
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "two starting policies in one cell (128 tokens, N = 32, 256 updates)" in err
    assert "aaaaaaaaaaaa" in err and "cccccccccccc" in err and "128:rebuilt=" in err
    # labelled, they are two cells, each tested on its own; the label is printed with the length
    code, out, err = _main(["recommend", f"128:first={a}", f"128:rebuilt={b}"], capsys)
    assert code == 0 and err == ""
    assert "| 128 (first) | 32 | 8 | vespo (3e-05, edge): 0.600 / 0.600 |" in out
    assert "| 128 (rebuilt) | 32 | 8 | vespo (3e-05, edge): 0.600 / 0.600 | — | — | — |" in out
    assert "128 (rebuilt) tokens, N = 32, 8 rollout steps: only vespo has 3 seeds" in out
    # the same weights in two files pool as before (one cell)
    d = _with_start(_write_runs(tmp_path / "d.csv", [{**r, "seed": r["seed"] + 10} for r in _cell()]), "aaaaaaaaaaaa")
    code, out, err = _main(["recommend", f"128={a}", f"128={d}"], capsys)
    assert code == 0 and "| 128 | 32 | 8 | vespo (3e-05, edge): 0.600 / 0.600 |" in out
    (cell,) = recommend(load_rows(a, length=128) + load_rows(d, length=128))
    assert len(cell.best.late) == 6  # six seeds of vespo at 3e-5


def test_two_rollout_engines_in_one_cell_are_refused_until_labelled_apart(tmp_path, capsys):
    # the same cell sampled by respo's sampler (a file from before the engine column) and by vLLM, other seeds
    a = _write_runs(tmp_path / "a.csv", _cell())
    v = _with_column(_write_runs(tmp_path / "v.csv", [{**r, "seed": r["seed"] + 10} for r in _cell()]), "engine", "vllm")
    code, out, err = _main(["recommend", f"128={a}", f"128={v}"], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "two rollout engines in one cell (128 tokens, N = 32, 256 updates): respo in" in err and "vllm in" in err
    code, out, err = _main(["recommend", f"128:respo={a}", f"128:vllm={v}"], capsys)  # two cells, each on its own
    assert code == 0 and "| 128 (vllm) | 32 | 8 | vespo (3e-05, edge): 0.600 / 0.600 |" in out


def test_a_label_does_not_hide_a_duplicate_within_it(tmp_path, capsys):
    a = _write_runs(tmp_path / "a.csv", _cell())
    code, out, err = _main(["recommend", f"128:x={a}", f"128:x={a}"], capsys)
    assert code == 2 and "duplicate" in err and "start x" in err


def test_a_length_label_the_runs_contradict_is_refused(tmp_path, capsys):
    """`respo recommend 32=...` on 128-token runs headed its table "32 response tokens"; the label is checked
    against the runs' recorded mean response length (median over the file's runs)."""
    from respo.cli import main

    from pathlib import Path

    root = Path(__file__).parents[2]
    main128 = f"{root}/reports/long/main-128/runs.csv"  # recorded lengths 127.7 .. 127.9
    assert main(["recommend", f"32={main128}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "labelled 32 response tokens" in err[0] and "127.8 tokens" in err[0], err
    assert f"128={main128}" in err[0]
    assert main(["recommend", f"256={main128}"]) == 2  # 127.8 is 50 % below 256
    capsys.readouterr()
    assert main(["recommend", f"128={main128}"]) == 0
    # within the tolerance: 25 % of 110 = 27.5 tokens (127.8 - 110 = 17.8); 25 % of 100 = 25 < 27.8 is not
    assert main(["recommend", f"110={main128}"]) == 0
    assert main(["recommend", f"100={main128}"]) == 2
    # a file written before the column existed cannot be checked and passes
    assert main(["recommend", f"32={root}/reports/staleness/runs.csv"]) == 0


def test_a_finished_row_whose_log_lost_updates_is_refused(tmp_path, capsys):
    from respo.cli import main

    from pathlib import Path

    with (Path(__file__).parents[2] / "reports/long/main-128/runs.csv").open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    rows[3]["updates_logged"] = "100"  # finished at 256 updates with 100 records: windows on a damaged log
    path = tmp_path / "runs.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    assert main(["recommend", f"128={path}"]) == 2
    err = capsys.readouterr().err
    assert f"{path} line 5" in err and "its log holds 100 update record(s)" in err, err
    assert main(["table", "headline", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: line 5" in err and "its log holds 100 update record(s)" in err, err


def test_paired_recommend_pairs_each_seeds_runs(tmp_path, capsys):
    from respo.cli import main

    cols = ["run", "model", "objective", "reuse", "group_size", "lr", "seed", "routing_replay", "updates",
            "finished", "late_mean", "pass@1", "start", "step_scores"]
    path = tmp_path / "runs.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for obj, xs in (("respo", [0.5, 0.6, 0.7]), ("vespo", [0.4, 0.45, 0.65])):
            for s, x in enumerate(xs):
                w.writerow([f"{obj}_s{s}", "tiny-dense", obj, "8", "8", "3e-05", s, "False", "16", "True", x, x,
                            "abc", "[0.45, 0.5]"])
    assert main(["recommend", f"32={path}", "--paired"]) == 0
    out = capsys.readouterr().out
    # vespo - respo per seed: -.10, -.15, -.05: paired p = .074 (Welch's would be .359)
    vespo = next(ln for ln in out.splitlines() if "| vespo (3e-05, edge) |" in ln)
    assert "| -0.100 | 0.074 |" in vespo and "95 % CI -0.224, +0.024" in vespo, vespo
    assert "the paired two-sided t-test over the seeds both ran" in out
    assert main(["recommend", f"32={path}"]) == 0
    assert "| -0.100 | 0.359 |" in capsys.readouterr().out
    text = path.read_text().replace("vespo_s1,tiny-dense,vespo,8,8,3e-05,1,False,16,True,0.45,0.45,abc,\"[0.45, 0.5]\"",
                                    "vespo_s1,tiny-dense,vespo,8,8,3e-05,1,False,16,True,0.45,0.45,abc,\"[0.41, 0.5]\"")
    assert text != path.read_text()
    path.write_text(text)
    assert main(["recommend", f"32={path}", "--paired"]) == 2
    assert "did not share their first rollout step" in capsys.readouterr().err


def test_a_cell_pooled_from_files_that_record_no_start_is_labelled(tmp_path, capsys):
    """main-128/runs.csv records no starting policy; pooled with main-128-corrections (which records one) the
    128-token 8-step cell cannot show one starting policy and says so; each file alone is not labelled."""
    from pathlib import Path

    from respo.cli import main

    root = Path(__file__).parents[2] / "reports" / "long"
    assert main(["recommend", f"128={root}/main-128/runs.csv", f"128={root}/main-128-corrections/runs.csv"]) == 0
    out = capsys.readouterr().out
    assert (f"- 128 tokens, N = 32, 8 rollout steps: pooled from several runs.csv files, and {root}/main-128/runs.csv "
            "records no starting policy (`start`) for its runs") in out
    for f in ("main-128", "main-128-corrections"):
        assert main(["recommend", f"128={root}/{f}/runs.csv"]) == 0
        assert "no starting policy" not in capsys.readouterr().out
