"""respo table: runs.csv rows from run directories and back, and the tables built from either."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from respo.study.aggregate import load_runs
from respo.study.tables import (COLUMNS, TableError, _select, calib_table, factorial_table, fill, headline_tables,
                                read_rows, regime_table, replay_table, run_row, write_runs_csv)

REPO = Path(__file__).resolve().parents[2]


def _run(root: Path, objective: str, reuse: int, seed: int, scores: list[float], *, lr: float = 3e-5,
         entropy: list[float] | None = None, pass1: float = 0.5) -> Path:
    d = root / f"{objective}_N{reuse}_s{seed}"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"objective": objective, "reuse": reuse, "lr": lr, "seed": seed,
                                               "model": "tiny-dense", "group_size": 8, "updates": len(scores),
                                               "task": "addition", "prompts": 8}))
    recs = []
    for u, s in enumerate(scores):
        stale = u % reuse
        rec = {"update": u + 1, "score": s, "staleness_mean": stale, "kl_k3": 0.01 * stale,
               "log_w_hist/neg/[-2,-1)": 3.0, "log_w_hist/neg/[0,0.25)": 1.0, "log_w_hist/pos/[0,0.25)": 2.0}
        if entropy is not None:
            rec["entropy"] = entropy[u]
        recs.append(rec)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (d / "summary.json").write_text(json.dumps({"eval_after": {"pass@1": pass1}}))
    return d


def test_run_row_new_columns_by_hand(tmp_path):
    # 16 updates at N = 4: 4 rollout steps. Scores 0.00 .. 0.15.
    scores = [i / 100 for i in range(16)]
    ent = [1.0] * 4 + [0.5] * 10 + [0.2, 0.4]
    _run(tmp_path, "grpo", 4, 0, scores, entropy=ent)
    (run,) = load_runs([tmp_path])
    row = run_row(run)
    assert row["first8_score"] == pytest.approx(sum(scores[:8]) / 8)  # 0.035
    assert row["last8_score"] == pytest.approx(sum(scores[8:]) / 8)  # 0.115
    # early window = first quarter (4 updates): entropy 1.0; late window = last eighth (2 updates): (0.2 + 0.4)/2
    assert row["entropy_early"] == pytest.approx(1.0) and row["entropy_late"] == pytest.approx(0.3)
    # per-step means: (0 + .01 + .02 + .03)/4 = .015, then .055, .095, .135
    assert row["step_scores"] == pytest.approx([0.015, 0.055, 0.095, 0.135])
    # stale updates only (12 of 16): negatives 3 of 4 below -1 in every one; no positive below -1
    assert row["pooled_neg_low_w"] == pytest.approx(0.75) and row["pooled_pos_low_w"] == 0.0


def test_runs_csv_round_trip_and_older_files(tmp_path):
    for seed in (0, 1):
        _run(tmp_path / "runs", "grpo", 4, seed, [0.1 * seed + i / 100 for i in range(16)], entropy=[0.5] * 16)
    write_runs_csv(load_runs([tmp_path / "runs"]), tmp_path / "runs.csv")
    header = next(csv.reader((tmp_path / "runs.csv").open()))
    assert tuple(header) == COLUMNS
    from_csv, absent = read_rows([tmp_path / "runs.csv"])
    from_dirs, _ = read_rows([tmp_path / "runs"])
    assert absent == set()
    assert calib_table(from_csv) == calib_table(from_dirs)
    # an older runs.csv (the first 14 columns only): the missing columns print as — and are named
    with (tmp_path / "runs.csv").open() as f, (tmp_path / "old.csv").open("w", newline="") as g:
        w = csv.writer(g)
        for r in csv.reader(f):
            w.writerow(r[:14])
    rows, absent = read_rows([tmp_path / "old.csv"])
    assert "entropy_late" in absent and math.isnan(rows[0]["entropy_late"]) and rows[0]["step_scores"] == []
    table = calib_table(rows, absent)
    assert table[2].split(" | ")[5] == "—"  # first 8
    assert "not in the given runs.csv" in table[-1] and "`entropy_early`" in table[-1]


def test_greedy_accuracy_is_a_column_and_the_calib_table_shows_it_only_where_recorded(tmp_path):
    d = _run(tmp_path / "runs", "grpo", 4, 0, [0.5] * 8)
    (d / "summary.json").write_text(json.dumps({"eval_after": {"pass@1": 0.453, "greedy_acc": 0.625}}))
    write_runs_csv(load_runs([tmp_path / "runs"]), tmp_path / "runs.csv")
    rows, absent = read_rows([tmp_path / "runs.csv"])
    assert rows[0]["greedy_acc"] == 0.625 and "greedy_acc" not in absent
    table = calib_table(rows, absent)
    head = table[0].split(" | ")
    assert head[9:11] == ["pass@1", "greedy"] and table[2].split(" | ")[9:11] == ["0.453", "0.625"]
    # a runs.csv written before the column: the table leaves it out instead of printing an empty column
    with (tmp_path / "runs.csv").open() as f, (tmp_path / "old.csv").open("w", newline="") as g:
        w = csv.writer(g)
        lines = list(csv.reader(f))
        keep = [i for i, c in enumerate(lines[0]) if c not in ("greedy_acc", "start")]  # the columns added since
        for r in lines:
            w.writerow([r[i] for i in keep])
    rows, absent = read_rows([tmp_path / "old.csv"])
    old = calib_table(rows, absent)
    assert "greedy" not in old[0] and old[0].split(" | ")[10] == "pos logW<-1" and old[-1].startswith("| grpo")


def test_start_column_names_the_starting_policys_weights(tmp_path):
    # a run whose config records its starting policy's weights gets their first 12 hex digits; a preset
    # from scratch and a run recorded before the fingerprint get an empty cell, read back as ""
    a = _run(tmp_path / "runs", "grpo", 4, 0, [0.5] * 8)
    cfg = json.loads((a / "config.json").read_text())
    cfg["policy"] = {"source": "dir", "path": "w", "weights_sha256": "0123456789abcdef" * 4}
    (a / "config.json").write_text(json.dumps(cfg))
    _run(tmp_path / "runs", "vespo", 4, 0, [0.5] * 8)
    write_runs_csv(load_runs([tmp_path / "runs"]), tmp_path / "runs.csv")
    rows, absent = read_rows([tmp_path / "runs.csv"])
    assert {r["objective"]: r["start"] for r in rows} == {"grpo": "0123456789ab", "vespo": ""}
    assert "start" not in absent


def test_read_rows_refuses_bad_input_in_one_line(tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(TableError, match="x.csv: not a runs.csv"):
        read_rows([tmp_path / "x.csv"])
    header = ",".join(COLUMNS[:14])
    (tmp_path / "y.csv").write_text(header + "\n" + "r,tiny-dense,grpo,4,8,3e-5,0,False,16,True,16,abc,0.1,0.5\n")
    with pytest.raises(TableError, match="y.csv: line 2, column late_mean: not a number: 'abc'"):
        read_rows([tmp_path / "y.csv"])
    (tmp_path / "z.csv").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TableError, match="z.csv: not a UTF-8"):
        read_rows([tmp_path / "z.csv"])


def _rows(obj: str, late: list[float], pass1: list[float], reuse: int = 32) -> list[dict]:
    return [{"lr": 3e-5, "reuse": reuse, "objective": obj, "finished": True, "late_mean": x, "pass@1": p,
             "step_scores": [], **{c: math.nan for c in COLUMNS if c not in ("lr", "reuse", "objective", "finished",
                                                                            "late_mean", "pass@1", "step_scores")}}
            for x, p in zip(late, pass1)]


def test_headline_tables_adjust_within_the_table_and_state_the_margin():
    rows = (_rows("vespo", [0.60, 0.62, 0.61], [0.60, 0.62, 0.61]) + _rows("grpo", [0.50, 0.52, 0.51], [0.60, 0.63, 0.60])
            + _rows("respo", [0.30, 0.33, 0.31], [0.30, 0.31, 0.35]))
    out = headline_tables(rows, margin=0.03, method="holm")
    tests = [line for line in out if " vs vespo " in line]
    assert len(tests) == 4  # grpo and respo, two metrics each, against the best baseline (vespo)
    assert "adjusted over the 4 tests of this table" in "\n".join(out) and "TOST p (δ = 0.03)" in "\n".join(out)
    # grpo's late mean: the same spread as vespo's, difference exactly -0.10: Welch t = -0.1/sqrt(2·0.0001/3)
    # = -12.25 on df = 4, p ≈ 2.5e-4; Holm multiplies the smallest of 4 p values by 4 -> still < .05: "worse"
    grpo_late = next(line for line in tests if line.startswith("| 3e-05 | 32 | grpo") and "late mean" in line)
    assert "-0.100" in grpo_late and "-12.25 (4.0)" in grpo_late and grpo_late.rstrip(" |").endswith("worse")
    assert out[-1].startswith("Not in the given runs.csv")  # no step_scores


def test_regime_table_one_budget_and_mean_over_seeds():
    def row(reuse, seed, updates, frac, late=0.5):
        r = _rows("grpo", [late], [late], reuse=reuse)[0]
        r.update({"seed": seed, "updates": updates, "routing_replay": False, "stale_mean:frac_pos_low_w": frac})
        return r
    rows = [row(1, 0, 64, math.nan, 0.6), row(32, 0, 64, 0.002), row(32, 1, 64, 0.004), row(32, 0, 128, 0.5)]
    out = regime_table([(32, rows, set())])
    (line,) = [x for x in out if x.startswith("| 32 |")]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[2] == "0.600 (1)" and cells[4] == "2" and cells[5] == "0.0030"  # the 128-update run left out


def test_fill_regenerates_marked_blocks(tmp_path, monkeypatch):
    for seed in (0, 1):
        _run(tmp_path / "runs", "grpo", 4, seed, [i / 100 for i in range(16)])
    write_runs_csv(load_runs([tmp_path / "runs"]), tmp_path / "runs.csv")
    md = tmp_path / "r.md"
    md.write_text("# R\n<!-- respo table calib runs.csv -->\nstale text\n<!-- /respo -->\nend\n")
    monkeypatch.chdir(tmp_path)
    assert fill(md) == 1
    text = md.read_text()
    assert "stale text" not in text and "| grpo | 4 | 3e-05 | 0 | 16/16 |" in text and text.endswith("end\n")
    md.write_text("<!-- respo table calib runs.csv -->\nno end\n")
    with pytest.raises(TableError, match="no closing"):
        fill(md)
    md.write_text("<!-- respo train --updates 1 -->\n<!-- /respo -->\n")
    with pytest.raises(TableError, match="a block runs respo table or respo recommend"):
        fill(md)
    md.write_text("<!-- respo table calib missing.csv -->\n<!-- /respo -->\n")
    with pytest.raises(TableError, match="line 1: respo table: cannot read missing.csv"):
        fill(md)

def test_a_run_given_twice_is_refused_naming_both_places(tmp_path):
    # Two seeds of grpo (N = 4, 8 updates) in one runs.csv; the same file given twice, or a re-run of seed 0 in a
    # second sweep directory next to it, would pool seed 0 twice (mean and spread over 3 "seeds" instead of 2).
    for seed in (0, 1):
        _run(tmp_path / "a", "grpo", 4, seed, [0.5] * 8)
    write_runs_csv(load_runs([tmp_path / "a"]), tmp_path / "a.csv")
    rows, _ = read_rows([tmp_path / "a.csv"])
    assert [r["seed"] for r in rows] == [0, 1]
    with pytest.raises(TableError, match=r"duplicate run: grpo lr 3e-05 N 4 seed 0 \(8 updates\) is in "
                                         r".*a\.csv line 2 and in .*a\.csv line 2; each seed may count once"):
        read_rows([tmp_path / "a.csv", tmp_path / "a.csv"])
    again = _run(tmp_path / "b", "grpo", 4, 0, [0.6] * 8)
    with pytest.raises(TableError, match=rf"seed 0 .* is in .*a\.csv line 2 and in {again}; each seed"):
        read_rows([tmp_path / "a.csv", tmp_path / "b"])
    # not duplicates: another learning rate, another N, another budget for the same seed
    _run(tmp_path / "c", "grpo", 4, 0, [0.5] * 8, lr=1e-4)
    _run(tmp_path / "d", "grpo", 2, 0, [0.5] * 8)
    _run(tmp_path / "e", "grpo", 4, 0, [0.5] * 16)
    rows, _ = read_rows([tmp_path / "a.csv", tmp_path / "c", tmp_path / "d", tmp_path / "e"])
    assert len(rows) == 5
    # an unfinished run is not pooled by any table, so a finished re-run of it is no duplicate
    rows[0]["finished"] = False
    from respo.study.tables import _check_duplicates
    _check_duplicates([rows[0], dict(rows[0], finished=True)], ["x", "y"])
    with pytest.raises(TableError, match="is in x and in y"):
        _check_duplicates([dict(rows[0], finished=True)] * 2, ["x", "y"])


def test_cli_table_refuses_a_duplicate_run_in_one_line(tmp_path):
    _run(tmp_path / "a", "grpo", 4, 0, [0.5] * 8)
    write_runs_csv(load_runs([tmp_path / "a"]), tmp_path / "a.csv")
    p = subprocess.run([sys.executable, "-m", "respo", "table", "headline", str(tmp_path / "a.csv"),
                        str(tmp_path / "a.csv")], cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.count("\n") == 1
    assert "duplicate run: grpo lr 3e-05 N 4 seed 0" in p.stderr

def _two_start_runs(tmp_path):
    """grpo seeds 0 and 1 from weights 0123…, seed 2 from weights fedc…, seed 3 recording none (a run from
    before the column), in tmp_path/runs.csv; returns `respo table`'s parser and its run function."""
    import argparse

    from respo.study.tables import add_arguments, run as table_run
    for seed, sha in ((0, "0123456789abcdef"), (1, "0123456789abcdef"), (2, "fedcba9876543210"), (3, "")):
        d = _run(tmp_path / "runs", "grpo", 4, seed, [0.5] * 8)
        cfg = json.loads((d / "config.json").read_text())
        if sha:
            cfg["policy"] = {"source": "dir", "path": "w", "weights_sha256": sha * 4}
        (d / "config.json").write_text(json.dumps(cfg))
    write_runs_csv(load_runs([tmp_path / "runs"]), tmp_path / "runs.csv")
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p, table_run


def test_tables_that_pool_seeds_refuse_two_starting_policies(tmp_path, capsys):
    # the headline table would pool the two starts' seeds as one objective's seeds; the calib table lists runs
    # one per row and keeps them; an empty start (a run recorded before the column) is not told apart from either
    p, table_run = _two_start_runs(tmp_path)
    with pytest.raises(TableError, match=r"two starting policies in one table: grpo_N4_s0 started from 0123456789ab "
                                         r"and grpo_N4_s2 from fedcba987654"):
        table_run(p.parse_args(["headline", str(tmp_path / "runs.csv")]))
    assert table_run(p.parse_args(["calib", str(tmp_path / "runs.csv")])) == 0
    capsys.readouterr()
    # without seed 2: one starting policy and a run that recorded none, pooled over 3 seeds
    with (tmp_path / "runs.csv").open() as f, (tmp_path / "one.csv").open("w", newline="") as g:
        w = csv.writer(g)
        w.writerows(r for r in csv.reader(f) if "grpo_N4_s2" not in r)
    assert table_run(p.parse_args(["headline", str(tmp_path / "one.csv")])) == 0
    assert "| 3e-05 | 4 | grpo | 0.500 ± 0.000 (3) |" in capsys.readouterr().out


def test_starts_by_seed_pools_seeds_of_two_starts_as_blocks(tmp_path, capsys):
    p, table_run = _two_start_runs(tmp_path)
    # seed 3 recorded no start: blocks cannot be told apart
    with pytest.raises(TableError, match="--starts-by-seed needs every run's starting policy, and grpo_N4_s3 records none"):
        table_run(p.parse_args(["staleness", "--starts-by-seed", str(tmp_path / "runs.csv")]))
    with (tmp_path / "runs.csv").open() as f, (tmp_path / "three.csv").open("w", newline="") as g:
        csv.writer(g).writerows(r for r in csv.reader(f) if "grpo_N4_s3" not in r)
    assert table_run(p.parse_args(["staleness", "--starts-by-seed", str(tmp_path / "three.csv")])) == 0
    out = capsys.readouterr().out
    assert "grpo, N = 4, lr 3e-05 (3 seeds)" in out
    assert out.rstrip().endswith("Seeds of 2 starting policies, pooled as blocks (all runs of a seed share one start, so "
                                 "a per-seed contrast lies within one start; a mean over seeds averages over the starts): "
                                 "start 0123456789ab: seeds 0, 1; start fedcba987654: seed 2.")
    # the per-run table names each run's start once the runs hold two
    assert table_run(p.parse_args(["calib", str(tmp_path / "three.csv")])) == 0
    calib = capsys.readouterr().out.splitlines()
    assert calib[0].endswith("| start |") and calib[2].endswith("| 0123456789ab |") and calib[4].endswith("| fedcba987654 |")
    # only the tables that pool seeds as blocks take it
    with pytest.raises(TableError, match="it applies to the factorial, staleness and mismatch tables and to headline "
                                         "--paired, not to headline without --paired"):
        table_run(p.parse_args(["headline", "--starts-by-seed", str(tmp_path / "three.csv")]))


def test_starts_by_seed_refuses_a_seed_of_two_starts_and_lists_seeds_as_ranges():
    from respo.study.tables import seed_list, starts_by_seed
    rows = [_row("respo", s, 0.5, 0.5, start="aaa" if s < 3 else "bbb") for s in (0, 1, 2, 5, 3)]
    assert starts_by_seed(rows) == {"aaa": [0, 1, 2], "bbb": [3, 5]}
    assert [seed_list(x) for x in ([0, 1, 2, 5], [3, 5], [3, 4], [7], [0, 1, 2, 3, 8, 9, 10])] == \
        ["0–2, 5", "3, 5", "3, 4", "7", "0–3, 8–10"]
    rows.append(_row("vespo", 1, 0.5, 0.5, start="bbb"))
    with pytest.raises(TableError, match=r"seed 1's runs started from two policies \(respo_s1 from aaa, vespo_s1 from bbb\)"):
        starts_by_seed(rows)


def test_factorial_over_two_starts_describes_each_starts_seeds():
    from respo.study.tables import starts_by_seed
    # the arms of the factorial test below; seed 0 from start "aaa", seeds 1 and 2 from "bbb". Per seed
    # (c- = ½[(RR − RV) + (VR − VV)], c+ = ½[(RR − VR) + (RV − VV)], cx = (RR − RV) − (VR − VV)):
    #   seed 0: c- = ½[(.50 − .60) + (.40 − .62)] = −.16, c+ = ½[(.50 − .40) + (.60 − .62)] = .04, cx = −.10 + .22 = .12
    #   seed 1: c- = ½[(.60 − .68) + (.52 − .70)] = −.13, c+ = ½[(.60 − .52) + (.68 − .70)] = .03, cx = −.08 + .18 = .10
    #   seed 2: c- = ½[(.55 − .65) + (.42 − .66)] = −.17, c+ = ½[(.55 − .42) + (.65 − .66)] = .06, cx = −.10 + .24 = .14
    # start aaa (seed 0): −.160, +.040, +.120; start bbb (seeds 1, 2): −.150, +.045, +.120
    arms = {"respo": [0.50, 0.60, 0.55], "respo+/vespo-": [0.60, 0.68, 0.65],
            "vespo+/respo-": [0.40, 0.52, 0.42], "vespo": [0.62, 0.70, 0.66]}
    rows = [_row(o, s, x, x, start="aaa" if s == 0 else "bbb") for o, xs in arms.items() for s, x in enumerate(xs)]
    starts = starts_by_seed(rows)
    lines = factorial_table(rows, method="holm", metrics=("pass@1",), starts=starts)
    # the declared test pools the three seeds as before (−.153, p .006)
    assert any(ln.startswith("| 3e-05 | 8 | pass@1 | negative branch | 3 | -0.153 |") for ln in lines)
    desc = {ln.split(" | ")[3]: ln for ln in lines if ln.startswith("| 3e-05 | 8 | pass@1 | aaa") or
            ln.startswith("| 3e-05 | 8 | pass@1 | bbb")}
    cells = {k: [float(x) for x in ln.strip(" |").split(" | ")[4:]] for k, ln in desc.items()}
    assert cells["aaa"] == pytest.approx([1, -0.160, 0.040, 0.120], abs=1e-9)
    assert cells["bbb"] == pytest.approx([2, -0.150, 0.045, 0.120], abs=1e-9)
    assert "not a further test" in "\n".join(lines)
    # a start none of whose seeds holds all four arms yet gets a row without values
    rows.append(_row("respo", 3, 0.5, 0.5, start="ccc"))
    lines = factorial_table(rows, method="holm", metrics=("pass@1",), starts=starts_by_seed(rows))
    assert "| 3e-05 | 8 | pass@1 | ccc | 0 | — | — | — |" in lines
    # one start: no description table
    assert not any("aaa" in ln for ln in factorial_table(rows, starts={"aaa": [0, 1, 2]}))


def test_factorial_names_under_the_table_only_the_seeds_its_contrasts_pool(capsys):
    from respo.cli import main

    # the committed study: seed 9 ran three of the four arms from the second start, so it is in no contrast,
    # and the line naming each start's pooled seeds leaves it out
    assert main(["table", "factorial", str(REPO / "reports/real/branches/runs.csv"),
                 str(REPO / "reports/real/branches/start-1e7ffe12faa0/runs.csv"), "--model", "smollm2-135m-instruct",
                 "--metrics", "pass@1", "--adjust", "holm", "--margin", "0.05", "--starts-by-seed"]) == 0
    out = capsys.readouterr().out
    assert "start 98a881459710: seeds 0–2, 5–7; start 1e7ffe12faa0: seeds 3, 4, 8." in out
    assert "(not all four arms finished): seed 9 (no finished vespo+/respo-)." in out


def test_cli_table_bad_input_is_one_line(tmp_path):
    (tmp_path / "x.csv").write_text("a\n")
    p = subprocess.run([sys.executable, "-m", "respo", "table", "headline", str(tmp_path / "x.csv")], cwd=REPO,
                       capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "not a runs.csv" in p.stderr


def test_committed_long_report_tables_are_what_respo_table_makes(tmp_path, monkeypatch):
    # every table block of the long report and every table file make_reports.sh writes is the output of
    # its respo command on the committed runs.csv files: regenerating them changes nothing
    import contextlib
    import io
    import shutil

    from respo.cli import main

    shutil.copytree(REPO / "reports", tmp_path / "reports", ignore=shutil.ignore_patterns("*.png"))
    monkeypatch.chdir(tmp_path)
    report = tmp_path / "reports/long/report.md"
    assert fill(report) == 9
    assert report.read_text() == (REPO / "reports/long/report.md").read_text()
    # the corrections' pilot (headline table and recommendation over both runs.csv), its continuation to
    # 8 rollout steps, and the MoE cell (headline without and with routing replay, and replay's effect)
    # and the corrections in the main 128-token cell (its headline table and recommendation, with main-128's runs),
    # the MoE cell over 8 rollout steps, the corrections at lr 1e-4 from a third warm start, and the newer
    # trust regions from a fourth (paired headline, breakdown, paired recommendation)
    for name, blocks in (("corr-pilot-128/README.md", 2), ("corr-main-128/README.md", 2), ("moe-128/README.md", 3),
                         ("main-128-corrections/README.md", 2), ("moe-128-main/README.md", 3),
                         ("corr-1e-4-128/README.md", 2), ("trust-128/README.md", 3)):
        md = tmp_path / "reports/long" / name
        assert fill(md) == blocks, name
        assert md.read_text() == (REPO / "reports/long" / name).read_text(), name
    R = "reports/long"
    for argv, out in ((["calib", f"{R}/calib-128/runs.csv"], f"{R}/calib-128/table.md"),
                      (["headline", f"{R}/headline-128/runs.csv"], f"{R}/headline-128.md"),
                      (["headline", f"{R}/main-128/runs.csv"], f"{R}/main-128/table.md"),
                      (["calib", f"{R}/calib-256/runs.csv"], f"{R}/calib-256/table.md"),
                      (["headline", f"{R}/calib-256/runs.csv", "--reuse", "32", "--lrs", "1e-4"], f"{R}/calib-256/headline.md")):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main(["table", *argv]) == 0
        assert buf.getvalue() == (REPO / out).read_text(), out
    assert "respo table" in (REPO / R / "make_reports.sh").read_text()


def test_replay_table_compares_each_objective_with_and_without_replay():
    def rows(obj, late, pass1, replay):
        out = _rows(obj, late, pass1)
        for seed, r in enumerate(out):
            r.update({"seed": seed, "routing_replay": replay})
        return out
    rows_ = (rows("vespo", [0.50, 0.52], [0.40, 0.44], True) + rows("vespo", [0.40, 0.42], [0.40, 0.42], False)
             + rows("respo", [0.3, 0.3], [0.3, 0.3], False))  # respo without a replay side: no test
    out = replay_table(rows_, margin=0.03, method="holm")
    lines = [x for x in out if x.startswith("| 3e-05 |")]
    assert len(lines) == 2 and all("| vespo |" in x for x in lines)
    late = [c.strip() for c in lines[0].strip("|").split("|")]
    # replay 0.51 vs 0.41, both spreads sd = 0.01414: diff +0.100, se = sqrt(2·0.0002/2) = 0.01414, t = 7.07 on
    # df = 2, two-sided p = 0.0194; Holm over 2 tests: late p 0.0194·2 = 0.039 (pass@1's p is larger) -> "better"
    assert late[3:8] == ["late mean", "2 / 2", "0.510", "0.410", "+0.100"]
    assert late[9] == "0.019" and late[10] == "0.039" and late[12] == "better"
    with pytest.raises(TableError, match="both with and without routing replay"):
        replay_table(rows("vespo", [0.5, 0.5], [0.5, 0.5], False))


def test_tables_keep_runs_without_replay_unless_asked(tmp_path):
    rows = _rows("vespo", [0.5, 0.6], [0.5, 0.6])
    for seed, r in enumerate(rows):
        r.update({"seed": seed, "routing_replay": bool(seed), "model": "tiny-dense", "group_size": 8, "updates": 64})
    args = Namespace(kind="calib", model="tiny-dense", group_size=8, objectives=None, reuse=None, lrs=None,
                     updates=None, routing_replay=False)
    assert [r["seed"] for r in _select(rows, args)] == [0]
    args.routing_replay = True
    assert [r["seed"] for r in _select(rows, args)] == [1]
    args.kind = "replay"
    assert [r["seed"] for r in _select(rows, args)] == [0, 1]


def _staleness_run(root: Path) -> Path:
    # N = 3, 6 updates: two rollout steps at staleness 0, 1, 2. The first update of a step also pays the
    # step's sampling and old log-probs.
    d = root / "grpo_N3_s0"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"objective": "grpo", "reuse": 3, "lr": 1e-6, "seed": 0,
                                               "model": "tiny-dense", "group_size": 8, "updates": 6,
                                               "task": "addition", "prompts": 4}))
    #        stale  sample old  train  kl_k3  p10   frac   entropy
    table = [(0, 10.0, 2.0, 3.0, 0.0, 0.0, 0.0, 0.5),
             (1, None, None, 4.0, 0.1, -0.2, 0.0, 0.4),
             (2, None, None, 5.0, 0.3, -0.6, 0.5, 0.3),
             (0, 20.0, 4.0, 3.0, 0.0, 0.0, 0.0, 0.7),
             (1, None, None, 6.0, 0.2, -0.4, 0.25, 0.6),
             (2, None, None, 7.0, None, -1.0, 0.25, 0.5)]
    recs = []
    for u, (s, t_s, t_o, t_t, kl, p10, frac, ent) in enumerate(table):
        rec = {"update": u + 1, "score": 0.5, "staleness_mean": float(s), "staleness_max": s, "time/train": t_t,
               "time/update": 100.0,  # the whole update's wall time: not a phase, not summed
               "log_w/p10": p10, "frac_pos_low_w": frac, "entropy": ent}
        if t_s is not None:
            rec.update({"time/sample": t_s, "time/old_logp": t_o})
        if kl is not None:
            rec["kl_k3"] = kl
        recs.append(rec)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (d / "summary.json").write_text(json.dumps({"eval_after": {"pass@1": 0.5}}))
    return d


def test_run_row_cost_and_per_staleness_by_hand(tmp_path):
    _staleness_run(tmp_path)
    (run,) = load_runs([tmp_path])
    row = run_row(run)
    # all time/* of all 6 updates: (10 + 2 + 3) + 4 + 5 + (20 + 4 + 3) + 6 + 7 = 64 s, over 6 updates
    assert row["seconds_per_update"] == pytest.approx(64 / 6)
    # time/train only: (3 + 4 + 5 + 3 + 6 + 7) / 6 = 28 / 6
    assert row["train_seconds_per_update"] == pytest.approx(28 / 6)
    # staleness 0: updates 1 and 4; 1: updates 2 and 5; 2: updates 3 and 6 (update 6 logged no kl_k3)
    assert row["staleness:kl_k3"] == pytest.approx([0.0, 0.15, 0.3])  # (0.1 + 0.2)/2; 0.3 alone
    assert row["staleness:log_w/p10"] == pytest.approx([0.0, -0.3, -0.8])  # (-0.2 - 0.4)/2; (-0.6 - 1.0)/2
    assert row["staleness:frac_pos_low_w"] == pytest.approx([0.0, 0.125, 0.375])  # (0 + .25)/2; (.5 + .25)/2
    assert row["staleness:entropy"] == pytest.approx([0.6, 0.5, 0.4])  # (.5 + .7)/2; (.4 + .6)/2; (.3 + .5)/2


def test_per_staleness_columns_round_trip_and_a_staleness_no_update_had(tmp_path):
    _staleness_run(tmp_path / "runs")
    # drop update 3 (the only other staleness-2 update is 6, which has no kl_k3): staleness 2 has no kl_k3 at all.
    # Dropped from the records read, not from the file: load_runs refuses a log with a gap.
    (run,) = load_runs([tmp_path / "runs"])
    run.records = run.records[:2] + run.records[3:]
    run.coords["updates"] = len(run.records)  # a whole 5-update log (a finished row's log must be whole)
    write_runs_csv([run], tmp_path / "runs.csv")
    (row,), absent = read_rows([tmp_path / "runs.csv"])
    assert absent == set()
    assert row["staleness:kl_k3"][:2] == pytest.approx([0.0, 0.15]) and math.isnan(row["staleness:kl_k3"][2])
    assert row["seconds_per_update"] == pytest.approx((64 - 5) / 5)
    # written as JSON with null for the empty cell
    with (tmp_path / "runs.csv").open() as f:
        (written,) = list(csv.DictReader(f))
    assert json.loads(written["staleness:kl_k3"]) == [0.0, 0.15, None]


def test_staleness_table_means_over_seeds(tmp_path):
    from respo.study.tables import staleness_tables

    def row(seed, kl, finished=True):
        r = _rows("grpo", [0.5], [0.5], reuse=3)[0]
        r.update({"seed": seed, "model": "m", "lr": 1e-6, "finished": finished, "staleness:kl_k3": kl,
                  "staleness:log_w/p10": [0.0, -0.2, -0.4], "staleness:frac_pos_low_w": [0.0, 0.0, 0.1],
                  "staleness:entropy": []})
        return r
    rows = [row(0, [0.0, 0.1, 0.2]), row(1, [0.0, 0.3, math.nan]), row(2, [9.0, 9.0, 9.0], finished=False)]
    out = staleness_tables(rows)
    assert out[0] == "m: grpo, N = 3, lr 1e-06 (2 seeds):"
    assert out[2] == "| staleness | 0 | 1 | 2 |"
    # the running seed is left out; per staleness the mean over the seeds that logged it:
    # (0.1 + 0.3)/2 = 0.2 at 1, 0.2 alone at 2
    assert out[4] == "| k3 KL per token | 0 | 0.2 | 0.2 |"
    assert out[5] == "| log W p10 | 0 | -0.2 | -0.4 |"
    assert out[7] == "| entropy per token | — | — | — |"
    # the mass shares on the positives below -1: rows that none of the runs has are left out; with one run's
    # values, the mean over the runs that have them
    assert not any("mass share" in ln for ln in out)
    rows[0]["staleness:same_batch/respo_pos_low_w_mass_share"] = [math.nan, 0.5, 0.25]
    assert "| ReSPO φ⁺ mass share on them | — | 0.5 | 0.25 |" in staleness_tables(rows)


def test_calib_cost_columns_only_when_asked(tmp_path):
    _staleness_run(tmp_path / "runs")
    rows, absent = read_rows([tmp_path / "runs"])
    plain, cost = calib_table(rows), calib_table(rows, cost=True)
    assert plain[0].endswith("| pooled neg<-1 |") and cost[0].endswith("| s/update | train s/update |")
    assert cost[2].endswith("| 10.7 | 4.67 |")  # 64/6 and 28/6 (module: seconds with 3 significant digits)
    assert cost[2].startswith(plain[2].rstrip(" |").rstrip())


def test_cli_table_staleness_selects_the_model(tmp_path):
    _staleness_run(tmp_path / "runs")
    write_runs_csv(load_runs([tmp_path / "runs"]), tmp_path / "runs.csv")
    p = subprocess.run([sys.executable, "-m", "respo", "table", "staleness", str(tmp_path / "runs.csv"),
                        "--model", "other"], cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "no run left" in p.stderr
    p = subprocess.run([sys.executable, "-m", "respo", "table", "staleness", str(tmp_path / "runs.csv")],
                       cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 0 and "| k3 KL per token | 0 | 0.15 | 0.3 |" in p.stdout
    p = subprocess.run([sys.executable, "-m", "respo", "table", "headline", str(tmp_path / "runs.csv"), "--cost"],
                       cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 2 and "--cost adds columns to the calib table only" in p.stderr


def test_committed_real_report_tables_are_what_respo_table_makes(tmp_path, monkeypatch):
    # the real model's tables (README.md and calib/table.md) are `respo table` blocks on the committed
    # calib/runs.csv, regenerated by make_reports.sh; no ad-hoc script makes a figure there
    import shutil

    shutil.copytree(REPO / "reports", tmp_path / "reports", ignore=shutil.ignore_patterns("*.png"))
    monkeypatch.chdir(tmp_path)
    # README: the N = 8 cells, the N = 32 probe and the pilot; the 2 x 2 study's page: its runs, their regime per
    # staleness level, their mismatch, the declared factorial analysis and its secondary endpoint's
    for name, blocks in (("README.md", 6), ("calib/table.md", 2), ("branches/README.md", 5)):
        md = tmp_path / "reports/real" / name
        assert fill(md) == blocks, name
        assert md.read_text() == (REPO / "reports/real" / name).read_text(), name
    script = (REPO / "reports/real/make_reports.sh").read_text()
    assert "respo table fill $R/README.md $R/calib/table.md" in script and "respo report" in script
    assert not list((REPO / "reports/real").glob("**/*.py"))


def test_an_update_mixing_staleness_levels_is_in_no_entry(tmp_path):
    d = _staleness_run(tmp_path)
    recs = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    recs[4].update({"staleness_mean": 1.5, "staleness_max": 2})  # update 5: half its batch at 1, half at 2
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (run,) = load_runs([tmp_path])
    row = run_row(run)
    # staleness 1 is update 2 alone now; staleness 2 still updates 3 and 6; its time still counts (64/6)
    assert row["staleness:kl_k3"] == pytest.approx([0.0, 0.1, 0.3])
    assert row["staleness:entropy"] == pytest.approx([0.6, 0.4, 0.4])
    assert row["seconds_per_update"] == pytest.approx(64 / 6)


def test_the_study_floor_imports_nothing_from_the_cli():
    """No arrow from respo/study up to respo.cli: `respo table fill` parses its blocks with the study's own
    parsers."""
    import ast

    study = Path(__file__).resolve().parents[2] / "respo" / "study"
    for path in study.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or "", *(f"{node.module}.{a.name}" for a in node.names)]
                     if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "respo.cli" or n.startswith("respo.cli.") for n in names), path.name


# ---- paired tests and the 2 x 2 factorial (the numbers of tests/study/test_study_stats.py's hand-worked cases) ---
def _row(objective, seed, late, pass1, *, first=0.45, start="abc123", lr=3e-5, reuse=8):
    row = {c: ([] if c in ("step_scores",) or c.startswith("staleness:") else math.nan) for c in COLUMNS}
    row.update({"run": f"{objective}_s{seed}", "objective": objective, "seed": seed, "lr": lr, "reuse": reuse,
                "finished": True, "late_mean": late, "pass@1": pass1, "start": start, "step_scores": [first, 0.5],
                "updates": 16, "updates_logged": 16})
    return row


def test_headline_paired_pairs_each_seeds_arms():
    a, b = [0.5, 0.6, 0.7], [0.4, 0.45, 0.65]
    rows = [_row("respo", s, x, x) for s, x in enumerate(a)] + [_row("vespo", s, x, x) for s, x in enumerate(b)]
    welch_line = next(ln for ln in headline_tables(rows) if ln.startswith("| 3e-05 | 8 | respo vs vespo | late mean"))
    paired = headline_tables(rows, paired=True)
    line = next(ln for ln in paired if ln.startswith("| 3e-05 | 8 | respo vs vespo | late mean"))
    # paired: d = [.10, .15, .05], t = 3.4641 (df 2), p = .074, CI [-.024, +.224]; Welch's p = .359
    assert "| +0.100 | [-0.024, +0.224] | 3.46 (2.0) | 0.074 |" in line, line
    assert "| 0.359 |" in welch_line, welch_line
    assert any("paired two-sided t-test over the seeds both ran" in ln for ln in paired)
    # a seed whose arms did not share their first rollout step cannot be paired
    rows[1]["step_scores"] = [0.40, 0.5]
    with pytest.raises(TableError, match="seed 1's arms did not share their first rollout step"):
        headline_tables(rows, paired=True)
    rows[1]["step_scores"], rows[1]["start"] = [0.45, 0.5], "another"
    with pytest.raises(TableError, match="started from another and vespo_s1 from abc123"):
        headline_tables(rows, paired=True)


def test_factorial_table_tests_the_main_effects_and_the_interaction(tmp_path, capsys):
    from respo.cli import main

    arms = {"respo": [0.50, 0.60, 0.55], "respo+/vespo-": [0.60, 0.68, 0.65],
            "vespo+/respo-": [0.40, 0.52, 0.42], "vespo": [0.62, 0.70, 0.66]}
    rows = [_row(o, s, x, x) for o, xs in arms.items() for s, x in enumerate(xs)]
    rows.append(_row("respo", 3, 0.9, 0.9))  # a seed only one arm ran: in no contrast, and the table says so
    rows.append(_row("vespo", 4, 0.9, 0.9))
    rows.append(dict(_row("respo", 4, 0.9, 0.9), finished=False))  # a run still going counts as not finished
    lines = factorial_table(rows)
    assert ("Not in any contrast at lr 3e-05, N = 8 (not all four arms finished): seed 3 (no finished "
            "respo+/vespo-, vespo+/respo-, vespo); seed 4 (no finished respo, respo+/vespo-, vespo+/respo-).") in lines
    by = {(ln.split(" | ")[2], ln.split(" | ")[3]): ln for ln in lines if ln.startswith("| 3e-05 | 8 |")}
    # late mean and pass@1 alike: negative branch -.1533 (p .006088), positive .0433 (p .039012), interaction
    # .12 (p .009133); BH over the 6 contrasts: 6/4 · .009133 = .0137 for the four smaller, .039012 for the others
    neg, pos, inter = (by[("late mean", k)] for k in ("negative branch", "positive branch", "interaction"))
    assert "| 3 | -0.153 | [-0.205, -0.102] | -12.76 (2) | 0.006 | 0.014 |" in neg and neg.endswith("| below 0 |")
    assert "| +0.043 | [+0.005, +0.081] | 4.91 (2) | 0.039 | 0.039 |" in pos and pos.endswith("| above 0 |")
    assert "| +0.120 |" in inter and "| 0.009 | 0.014 |" in inter and inter.endswith("| above 0 |")
    assert by[("pass@1", "negative branch")].split(" | ")[4:] == neg.split(" | ")[4:]
    # SD and MDE: the negative branch's per-seed SD .020817 (tests/study/test_study_stats.py), MDE at 3 seeds
    # (4.302653 + 1.060660) * .020817/sqrt(3) = .064460; the positive branch's SD .015275, MDE .047299
    assert "| 0.021 | 0.064 | below 0 |" in neg and "| 0.015 | 0.047 | above 0 |" in pos
    # one declared endpoint, Holm over its three contrasts only: .006088 · 3 = .018, .009133 · 2 = .018,
    # .039012 · 1 = .039 (each at least the one before it)
    one = {ln.split(" | ")[3]: ln for ln in factorial_table(rows, method="holm", metrics=("pass@1",))
           if ln.startswith("| 3e-05 | 8 |")}
    assert {ln.split(" | ")[2] for ln in one.values()} == {"pass@1"}
    assert "| 0.006 | 0.018 |" in one["negative branch"] and "| 0.009 | 0.018 |" in one["interaction"]
    assert "| 0.039 | 0.039 |" in one["positive branch"]
    with pytest.raises(TableError, match="no \\(lr, N\\) with all four arms"):
        factorial_table([r for r in rows if r["objective"] != "vespo"])
    assert main(["table", "calib", "--paired", str(REPO / "reports/long/main-128/runs.csv")]) == 2
    assert "--paired applies to the headline and factorial tables" in capsys.readouterr().err
    assert main(["table", "headline", "--metrics", "pass@1", str(REPO / "reports/long/main-128/runs.csv")]) == 2
    assert "--metrics chooses the factorial table's endpoints" in capsys.readouterr().err
    assert main(["table", "factorial", "--metrics", "pass@2", str(REPO / "reports/long/main-128/runs.csv")]) == 2
    assert "--metrics must name distinct endpoints among late_mean, pass@1, greedy_acc, got 'pass@2'" in capsys.readouterr().err


def test_factorial_table_bounds_what_missing_seeds_could_change(tmp_path, capsys):
    from respo.cli import main
    from respo.study.stats import adjust, format_p, missing_seeds
    from respo.study.tables import read_rows

    arms = {"respo": [0.50, 0.60, 0.55], "respo+/vespo-": [0.60, 0.68, 0.65],
            "vespo+/respo-": [0.40, 0.52, 0.42], "vespo": [0.62, 0.70, 0.66]}
    rows = [_row(o, s, x, x) for o, xs in arms.items() for s, x in enumerate(xs)]
    lines = factorial_table(rows, method="holm", metrics=("pass@1",), margin=0.3, missing=2)
    got = {ln.split(" | ")[3]: ln for ln in lines if ln.startswith("| 3e-05 | 8 | pass@1 |") and " + 2 | " in ln}
    # the per-seed contrasts (tests/study/test_study_stats.py): negative −.16, −.13, −.17; positive .04, .03, .06;
    # interaction .12, .10, .14. Each bound is adjusted with the others, as the tests are (Holm over the three):
    # an adjusted p never falls when a raw p rises, so the bounds' adjusted values bound the adjusted p's
    b = [missing_seeds(x, 2, 0.3) for x in ([-0.16, -0.13, -0.17], [0.04, 0.03, 0.06], [0.12, 0.10, 0.14])]
    lo, hi = adjust([m.p_min for m in b], "holm"), adjust([m.p_tost_max for m in b], "holm")
    assert got["negative branch"] == (f"| 3e-05 | 8 | pass@1 | negative branch | 3 + 2 | [-0.170, -0.130] | "
                                      f"{format_p(b[0].p_min)} | {format_p(lo[0])} | {format_p(b[0].p_tost_max)} | "
                                      f"{format_p(hi[0])} | no | yes |")
    # every seed below zero, so two more within the range keep it far below: no difference is ruled out; and
    # within ±.3 it stays equivalent
    assert lo[0] < 0.001 and hi[0] <= 0.05
    # the interaction: equivalent within ±.3 now (TOST p .002); two more seeds in [.10, .14] keep it so
    assert hi[2] <= 0.05 and got["interaction"].endswith("| no | yes |")
    # a contrast not equivalent now gets — (within ±.01 none is)
    wide = factorial_table(rows, method="holm", metrics=("pass@1",), margin=0.01, missing=2)
    row = next(ln for ln in wide if ln.startswith("| 3e-05 | 8 | pass@1 | negative branch | 3 + 2 |"))
    assert row.endswith("| no | — |")
    # per-seed negative contrasts +.05, −.05, 0: two more seeds within [−.05, .05] give at most, e.g. at
    # (.05, .05): mean .02, s = .044721, se = .02, t = 1.0 on df 4: no difference possible
    flat = {"respo": [0.6, 0.4, 0.5], "respo+/vespo-": [0.5] * 3, "vespo+/respo-": [0.5] * 3, "vespo": [0.5] * 3}
    flat_rows = [_row(o, s, x, x) for o, xs in flat.items() for s, x in enumerate(xs)]
    row = next(ln for ln in factorial_table(flat_rows, method="holm", metrics=("pass@1",), margin=0.3, missing=2)
               if ln.startswith("| 3e-05 | 8 | pass@1 | negative branch | 3 + 2 | [-0.050, +0.050] |"))
    assert row.endswith("| yes | yes |") and missing_seeds([0.05, -0.05, 0.0], 2, 0.3).p_min > 0.05
    assert any(ln.startswith("Had 2 further seeds fallen within the range") for ln in lines)
    # the adjustment is Holm's own step, not a blanket factor: on the committed study's greedy accuracy the
    # interaction's largest TOST p (.039) is above .05/3, yet it is the largest of its family, whose other two stay
    # at or below .002, so Holm leaves it at .039 and the equivalence is kept
    study, _ = read_rows([REPO / "reports/real/branches/runs.csv", REPO / "reports/real/branches/start-1e7ffe12faa0/runs.csv"])
    greedy = factorial_table([r for r in study if r["model"] == "smollm2-135m-instruct"], method="holm",
                             metrics=("greedy_acc",), margin=0.05, missing=3)
    inter = next(ln for ln in greedy if ln.startswith("| 1e-06 | 8 | greedy | interaction | 9 + 3 |"))
    cells = inter.strip(" |").split(" | ")
    assert float(cells[8]) > 0.05 / 3 and cells[9] == cells[8] and cells[-2:] == ["yes", "yes"]
    # without it no such table; the option is the factorial's alone, and needs k >= 1
    assert not any(ln.startswith("Had ") for ln in factorial_table(rows, metrics=("pass@1",)))
    assert main(["table", "headline", "--missing-seeds", "3", str(REPO / "reports/long/main-128/runs.csv")]) == 2
    assert "--missing-seeds applies to the factorial table" in capsys.readouterr().err
    assert main(["table", "factorial", "--missing-seeds", "0", str(REPO / "reports/long/main-128/runs.csv")]) == 2
    assert "--missing-seeds must be an integer >= 1, got 0" in capsys.readouterr().err


def test_factorial_table_tests_greedy_accuracy_as_a_secondary_endpoint(capsys):
    from respo.cli import main

    # greedy accuracy carries the hand-worked arms of the test above, and so does pass@1
    arms = {"respo": [0.50, 0.60, 0.55], "respo+/vespo-": [0.60, 0.68, 0.65],
            "vespo+/respo-": [0.40, 0.52, 0.42], "vespo": [0.62, 0.70, 0.66]}
    rows = []
    for o, xs in arms.items():
        for s, x in enumerate(xs):
            rows.append(_row(o, s, x, x))
            rows[-1]["greedy_acc"] = x
    # a fourth seed whose runs predate greedy accuracy (empty in runs.csv): in no greedy contrast
    for o in arms:
        rows.append(_row(o, 3, 0.5, 0.5))
    by = {ln.split(" | ")[3]: ln for ln in factorial_table(rows, method="holm", metrics=("greedy_acc",))
          if ln.startswith("| 3e-05 | 8 |")}
    assert {ln.split(" | ")[2] for ln in by.values()} == {"greedy"}
    # the three contrasts by hand (tests/study/test_study_stats.py): negative -.1533 (p .006088), positive
    # +.0433 (p .039012), interaction +.12 (p .009133), over seeds 0-2 only; Holm over these three: .018, .039, .018
    assert "| 3 | -0.153 | [-0.205, -0.102] | -12.76 (2) | 0.006 | 0.018 |" in by["negative branch"]
    assert "| 3 | +0.043 | [+0.005, +0.081] | 4.91 (2) | 0.039 | 0.039 |" in by["positive branch"]
    assert "| 3 | +0.120 |" in by["interaction"] and "| 0.009 | 0.018 |" in by["interaction"]
    # pass@1 beside it counts the fourth seed (its contrasts 0): the interaction's mean is .12 · 3/4 = .09
    both = [ln for ln in factorial_table(rows, metrics=("pass@1", "greedy_acc")) if ln.startswith("| 3e-05 | 8 |")]
    assert [ln.split(" | ")[2:5] for ln in both if "interaction" in ln] == [["pass@1", "interaction", "4"],
                                                                             ["greedy", "interaction", "3"]]
    assert "| 4 | +0.090 |" in both[2]
    # the seed left out of the greedy contrasts is named under the table
    assert ("Not in the greedy contrasts at lr 3e-05, N = 8 (the endpoint was not recorded in every arm): seed 3."
            in factorial_table(rows, metrics=("pass@1", "greedy_acc")))
    assert not any(ln.startswith("Not in") for ln in factorial_table(rows, metrics=("pass@1",)))
    # the default endpoints stay late mean and pass@1
    assert {ln.split(" | ")[2] for ln in factorial_table(rows) if ln.startswith("| 3e-05 | 8 |")} == {"late mean",
                                                                                                    "pass@1"}
    assert main(["table", "factorial", "--metrics", "greedy", str(REPO / "reports/long/main-128/runs.csv")]) == 2
    assert "among late_mean, pass@1, greedy_acc, got 'greedy'" in capsys.readouterr().err


def test_tables_that_pool_seeds_refuse_two_rollout_engines(tmp_path, capsys):
    # grpo seeds 0 and 1 sampled by respo's sampler (seed 1's config from before the engine setting), seed 2 by
    # vLLM: their rollouts and evaluations come from different distributions, so no table pools them
    from respo.study.tables import add_arguments, run as table_run
    for seed, engine in ((0, "respo"), (1, None), (2, "vllm")):
        d = _run(tmp_path / "runs", "grpo", 4, seed, [0.5] * 8)
        cfg = json.loads((d / "config.json").read_text())
        cfg.pop("rollout_engine", None)
        if engine:
            cfg["rollout_engine"] = engine
        (d / "config.json").write_text(json.dumps(cfg))
    write_runs_csv(load_runs([tmp_path / "runs"]), tmp_path / "runs.csv")
    rows = list(csv.DictReader((tmp_path / "runs.csv").open()))
    assert [r["engine"] for r in rows] == ["respo", "respo", "vllm"]  # a config without the setting: respo's
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    with pytest.raises(TableError, match=r"two rollout engines in one table: grpo_N4_s0 sampled with respo and "
                                         r"grpo_N4_s2 with vllm"):
        table_run(p.parse_args(["headline", str(tmp_path / "runs.csv")]))
    assert table_run(p.parse_args(["calib", str(tmp_path / "runs.csv")])) == 0  # one row per run: nothing pooled
    # a runs.csv written before the column holds respo-sampled runs: pooled with respo's, not with vLLM's
    with (tmp_path / "runs.csv").open() as f, (tmp_path / "old.csv").open("w", newline="") as g:
        w = csv.writer(g)
        for r in csv.reader(f):
            if "grpo_N4_s2" not in r:
                w.writerow(r[:-1])
    capsys.readouterr()
    assert table_run(p.parse_args(["headline", str(tmp_path / "old.csv")])) == 0
    assert "| 3e-05 | 4 | grpo | 0.500 ± 0.000 (2) |" in capsys.readouterr().out


def test_a_table_pooled_from_inputs_that_record_no_start_is_labelled(capsys):
    from respo.cli import main

    long = REPO / "reports" / "long"
    pilot = [str(long / "corr-pilot-128/runs.csv"), str(long / "corr-pilot-128/seeds-3-4/runs.csv")]
    assert main(["table", "headline", *pilot]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith(f"Pooled from 2 inputs, and {pilot[0]}, {pilot[1]} record no starting policy (`start`) "
                                 "for their runs, so one starting policy is not shown: the table may pool warm starts "
                                 "that differ.")
    assert main(["table", "headline", pilot[0]]) == 0  # one input: no label
    assert "Pooled from" not in capsys.readouterr().out


def test_breakdown_is_both_metrics_below_half_the_starting_score():
    from respo.study.tables import breakdown_table, broke_down, start_score

    # starting score .48 (first rollout step): the bar is .24
    assert start_score(_row("m2po", 0, 0.2, 0.0, first=0.48)) == 0.48
    assert broke_down(_row("m2po", 0, 0.167, 0.0, first=0.48))  # .167 < .24 and 0 < .24
    assert not broke_down(_row("m2po", 2, 0.167, 0.562, first=0.48))  # training fell, held-out did not
    assert not broke_down(_row("tis", 0, 0.682, 0.0, first=0.48))  # held-out fell, training did not
    assert not broke_down(_row("tis", 1, 0.24, 0.1, first=0.48))  # .24 is not below .24
    no_step = _row("grpo", 0, 0.1, 0.1)
    no_step["step_scores"], no_step["first8_score"] = [], 0.3  # N = 1: the first 8 updates' mean, bar .15
    assert start_score(no_step) == 0.3 and broke_down(no_step)
    no_step["first8_score"] = math.nan  # an older runs.csv records neither
    assert broke_down(no_step) is None
    rows = [_row("m2po", 0, 0.167, 0.0, first=0.48), _row("m2po", 1, 0.178, 0.031, first=0.44),
            _row("m2po", 2, 0.25, 0.562, first=0.48), no_step]
    lines = breakdown_table(rows)
    assert "| 3e-05 | 8 | m2po | 3 | 2 of 3 | 0, 1 | 0.467 |" in lines  # (.48 + .44 + .48)/3
    assert "| 3e-05 | 8 | grpo | 1 | 0 of 0 (1 —) | — | — |" in lines


# ---- the engine-trainer mismatch next to the staleness ---------------------------------------------------------
def test_mismatch_columns_and_table_by_hand(tmp_path, capsys):
    from respo.cli import main
    from respo.study.tables import mismatch_table

    # 4 updates at N = 2 with engine log-ratios logged on every update (staleness 0 too: the mismatch does not
    # depend on it), a run of the respo engine logging none
    for seed, diffs in ((0, [0.02, 0.03, 0.01, 0.02]), (1, [0.01, 0.01, 0.03, 0.03])):
        d = _run(tmp_path / "runs", "vespo", 2, seed, [0.5] * 4)
        recs = [json.loads(ln) for ln in (d / "metrics.jsonl").read_text().splitlines()]
        for r, x in zip(recs, diffs):
            r.update({"rollout_corr/abs_diff": x, "rollout_corr/seq_log_ratio_p10": -10 * x,
                      "rollout_corr/seq_log_ratio_p90": 20 * x, "rollout_corr/seq_frac_beyond_1": 0.0 if x < 0.03 else 0.25,
                      "log_w/p10": -0.1 * r["staleness_mean"]})
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    _run(tmp_path / "runs", "respo", 2, 0, [0.5] * 4)
    runs = load_runs([tmp_path / "runs"])
    rows = {r.path.name: run_row(r) for r in runs}
    # seed 0: mean |log rho| (.02 + .03 + .01 + .02)/4 = .02, seq p10 -.2, p90 +.4, beyond +-1: .25/4 = .0625
    s0 = rows["vespo_N2_s0"]
    assert (s0["mismatch_abs_diff"], s0["mismatch_seq_p10"], s0["mismatch_seq_p90"], s0["mismatch_seq_beyond_1"]) == (
        pytest.approx(0.02), pytest.approx(-0.2), pytest.approx(0.4), pytest.approx(0.0625))
    assert math.isnan(rows["respo_N2_s0"]["mismatch_abs_diff"])  # the respo engine logs no mismatch
    write_runs_csv(runs, tmp_path / "runs.csv")
    read, _ = read_rows([tmp_path / "runs.csv"])
    lines = mismatch_table(read)
    (line,) = [ln for ln in lines if ln.startswith("| 3e-05 | 2 | vespo |")]
    # seed 1: |log rho| .02, p10 -.2, p90 +.4, beyond (.25 + .25)/4 = .125; over the two seeds: .020 ± .000,
    # beyond .094 (.0625, .125); stale updates' log W p10: -.1 in both seeds
    assert line == "| 3e-05 | 2 | vespo | 2 | 0.020 ± 0.000 | -0.20 | +0.40 | 0.094 | -0.10 |", line
    assert not any(ln.startswith("| 3e-05 | 2 | respo |") for ln in lines)  # no mismatch logged: not a row
    with pytest.raises(TableError, match="no finished run records an engine–trainer mismatch"):
        mismatch_table([r for r in read if r["objective"] == "respo"])
    assert main(["table", "mismatch", str(tmp_path / "runs.csv")]) == 0
    assert "| 3e-05 | 2 | vespo | 2 |" in capsys.readouterr().out


def test_factorial_over_two_starts_compares_them_descriptively():
    from respo.study.tables import starts_by_seed
    # R⁺V⁻ = V⁺R⁻ = V⁺V⁻ = .5 on every seed, so c- = c+ = ½(RR − .5) and cx = RR − .5. RR = .18, .22 (start aaa,
    # seeds 0, 1) and .30, .34 (bbb, seeds 2, 3): c- = −.16, −.14 against −.10, −.08. Welch: means −.15 and −.09,
    # variances .0002 each, t = −.06 / √(.0002/2 + .0002/2) = −4.243 on df = .0002² / (2 · .0001²) = 2, p = .051;
    # the same for every contrast (a contrast scaled by 2 has the same t)
    rr = [0.18, 0.22, 0.30, 0.34]
    arms = {"respo": rr, "respo+/vespo-": [0.5] * 4, "vespo+/respo-": [0.5] * 4, "vespo": [0.5] * 4}
    rows = [_row(o, s, x, x, start="aaa" if s < 2 else "bbb") for o, xs in arms.items() for s, x in enumerate(xs)]
    lines = factorial_table(rows, method="holm", metrics=("pass@1",), starts=starts_by_seed(rows))
    assert "| 3e-05 | 8 | pass@1 | between the two starts, Welch p | | 0.051 | 0.051 | 0.051 |" in lines
    assert "descriptive: not declared, not adjusted" in "\n".join(lines)


def test_runs_csv_booleans_and_row_widths_are_checked_not_guessed(tmp_path):
    # "maybe" in finished used to read as False, so the run vanished from every table; now one line names it
    header = ",".join(COLUMNS[:14])
    line = "r,tiny-dense,grpo,4,8,3e-5,0,False,16,{f},16,0.4,0.1,0.5"
    (tmp_path / "m.csv").write_text(header + "\n" + line.format(f="maybe") + "\n")
    with pytest.raises(TableError, match=r"m.csv: line 2, column finished: 'maybe' is not true or false"):
        read_rows([tmp_path / "m.csv"])
    (tmp_path / "e.csv").write_text(header + "\n" + line.format(f="") + "\n")
    with pytest.raises(TableError, match=r"e.csv: line 2, column finished: '' is not true or false"):
        read_rows([tmp_path / "e.csv"])
    (tmp_path / "w.csv").write_text(header + "\n" + line.format(f="True") + ",extra\n")
    with pytest.raises(TableError, match=r"w.csv: line 2: 1 more field\(s\) than the header"):
        read_rows([tmp_path / "w.csv"])
    (tmp_path / "s.csv").write_text(header + "\n" + line.format(f="True").rsplit(",", 1)[0] + "\n")
    with pytest.raises(TableError, match=r"s.csv: line 2: fewer fields than the header"):
        read_rows([tmp_path / "s.csv"])
    # the words a runs.csv may hold: True/False as written, and 1/0, yes/no
    for word, want in (("True", True), ("false", False), ("1", True), ("no", False)):
        (tmp_path / "ok.csv").write_text(header + "\n" + line.format(f=word) + "\n")
        assert read_rows([tmp_path / "ok.csv"])[0][0]["finished"] is want


def _gap_csv(tmp_path: Path, third: str) -> Path:
    """A runs.csv of three finished GRPO seeds at one (lr, N) whose third run's pass@1 cell is ``third``."""
    header = ",".join(COLUMNS[:14])
    rows = [f"grpo_s{s},tiny-dense,grpo,4,8,3e-5,{s},False,16,True,16,0.{4 + s},0.1,{p}"
            for s, p in ((0, "0.5"), (1, "0.7"), (2, third))]
    path = tmp_path / f"gap-{third or 'empty'}.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


@pytest.mark.parametrize("third, shown", [("", "empty or nan"), ("nan", "empty or nan"), ("inf", "inf")])
def test_a_seed_without_its_cells_endpoint_is_refused_or_left_out_by_name(tmp_path, capsys, third, shown):
    # the headline table pools pass@1 over seeds: seed 2's is missing, so its "(3)" would quietly become "(2)"
    path = _gap_csv(tmp_path, third)
    args = ["table", "headline", str(path)]
    r = subprocess.run([sys.executable, "-m", "respo", *args], capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        f"respo table: error: {path} line 4, column pass@1: run grpo_s2 finished with pass@1 {shown}, while other runs of "
        "its cell have one; rebuild its row, leave it out of the input, or pass --skip-missing to leave such runs "
        "out (the output names them)"]
    r = subprocess.run([sys.executable, "-m", "respo", *args, "--skip-missing"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # late mean over seeds 0 and 1 only: (0.4 + 0.5)/2 = 0.450, sample std 0.0707; pass@1 (0.5 + 0.7)/2 = 0.600
    assert "| 3e-05 | 4 | grpo | 0.450 ± 0.071 (2) | 0.600 ± 0.141 (2) |" in r.stdout
    assert r.stdout.rstrip().endswith(f"Left out under --skip-missing, finished without an endpoint the other runs "
                                      f"of their cell have: grpo_s2 (pass@1 {shown}).")


def test_skip_missing_applies_only_to_the_tables_that_pool_an_endpoint(tmp_path):
    r = subprocess.run([sys.executable, "-m", "respo", "table", "calib", str(_gap_csv(tmp_path, "")),
                        "--skip-missing"], capture_output=True, text=True)
    assert r.returncode == 2 and "--skip-missing applies to the tables that pool an endpoint over seeds" in r.stderr


def test_the_table_kind_of_docs_extending_md_registers_and_runs_through_respo_table(tmp_path, capsys):
    # the complete kind of docs/extending.md ("Adding a table"), registered: respo table offers it, with its flag
    import re

    from respo.cli import main
    from respo.study.tables import KINDS, register

    text = (REPO / "docs" / "extending.md").read_text(encoding="utf-8")
    example: dict = {}
    exec(compile(re.search(r"## Adding a table\n.*?```python\n(.*?)```", text, flags=re.S).group(1),
                 "docs/extending.md", "exec"), example)
    register(example["KIND"])
    try:
        # grpo: three finished seeds, late means 0.4, 0.5, 0.6 (mean 0.5, sample std 0.1); vespo: one
        header = ",".join(COLUMNS[:14])
        rows = [f"{o}_s{s},tiny-dense,{o},4,8,3e-5,{s},False,16,True,16,{late},0.1,0.5"
                for o, s, late in (("grpo", 0, 0.4), ("grpo", 1, 0.5), ("grpo", 2, 0.6), ("vespo", 0, 0.7))]
        path = tmp_path / "runs.csv"
        path.write_text("\n".join([header, *rows]) + "\n")
        with pytest.raises(SystemExit):
            main(["table", "--help"])
        shown = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
        assert "{calib,headline,regime,staleness,replay,factorial,breakdown,mismatch,fill,seeds}" in shown
        assert ("; fill: regenerate the table blocks of markdown files; seeds: the late mean over seeds per (lr, N, "
                "objective) paths") in shown
        assert "--min-seeds K seeds: only the cells with at least K finished seeds (default 1)" in shown
        assert main(["table", "seeds", str(path)]) == 0
        assert capsys.readouterr().out.splitlines() == ["| lr | N | objective | late mean |", "|---|---|---|---|",
                                                       "| 3e-05 | 4 | grpo | 0.500 ± 0.100 (3) |",
                                                       "| 3e-05 | 4 | vespo | 0.700 (1) |"]
        assert main(["table", "seeds", str(path), "--min-seeds", "2"]) == 0
        assert capsys.readouterr().out.splitlines()[2:] == ["| 3e-05 | 4 | grpo | 0.500 ± 0.100 (3) |"]
        # its flag's value is checked for it, and every other kind refuses the flag in one line
        assert main(["table", "seeds", str(path), "--min-seeds", "0"]) == 2
        assert capsys.readouterr().err == "respo table: error: --min-seeds must be an integer >= 1, got 0\n"
        assert main(["table", "calib", str(path), "--min-seeds", "2"]) == 2
        assert capsys.readouterr().err == "respo table: error: --min-seeds applies to the seeds table, not to calib\n"
    finally:
        KINDS.pop("seeds")
