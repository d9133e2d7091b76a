"""``runs.csv`` (one row per run) and every study table built from it: ``respo table KIND`` and the
tables of ``respo report`` (which lays them out with its figures and prose; it computes no number itself).

A row holds a run's coordinates and the numbers every table aggregates (`COLUMNS`). It is computed
from a run directory (`run_row`) or read back from a ``runs.csv`` that `respo report` wrote
(`read_rows`), so every table can be regenerated from the committed ``runs.csv`` files alone. A
column that an older ``runs.csv`` does not have is printed as ``—`` and named under the table. A
finished run given twice (the same coordinates and seed in two files or directories, or one file
passed twice) is refused in one line naming both places: it would count as two seeds. The tables
that pool runs over seeds (all but ``calib``) refuse runs of two starting policies (``start``) or two rollout
engines (``engine``), and are
labelled under the table when pooled from several inputs whose runs do not all record one.

Per run, over the updates with staleness > 0 (``stale_mean:*``; the first mini-batch of a rollout
step has log W = 0 exactly), and over all updates otherwise:

    late_mean / early_max      mean of the last eighth / best of the first quarter of the scores
    first8_score, last8_score  mean score of the first / last 8 updates (on-policy stability)
    entropy_early, entropy_late  mean per-token policy entropy over the first quarter / the last
                               eighth of the updates (the same windows as early max / late mean)
    pooled_pos_low_w, pooled_neg_low_w  fraction of all stale positives / negatives with log W < −1,
                               pooled from the log W histograms (count-weighted over stale updates)
    step_scores                JSON list: mean score of each complete rollout step (N updates; empty at N = 1)
    seconds_per_update         Σ of every ``time/*`` phase of every logged update / updates logged: all phases, a
                               rollout step's sampling and old log-probs shared out over its N updates
    train_seconds_per_update   mean ``time/train`` (the training forward/backward of one update)
    staleness:<metric>         JSON list, entry s = 0 .. N−1: mean of ``<metric>`` (`STALENESS_METRICS`) over the
                               updates whose mini-batch had staleness s (``staleness_mean`` = s; an update mixing
                               staleness levels, which only asynchronous runs have, is in no entry); null where no
                               such update logged it
    greedy_acc                 held-out greedy accuracy after the last update (one decode per prompt, no
                               sampling noise on the same prompts; NaN when not evaluated)
    start                      the starting policy: 12 hex digits of its weights' sha256 for a loaded policy
                               (warm start, model directory), empty for a preset from scratch or an older run
    engine                     the rollout engine that sampled the run (``rollout_engine``; a runs.csv written
                               before the column held only runs of respo's own sampler)
    mismatch_*                 the engine–trainer mismatch, log ρ = the trainer's log-prob before the update minus
                               the engine's (`CSV_MISMATCH`: mean abs log ρ per token, the sequence log ρ's p10 and
                               p90, the fraction of sequences beyond ±1), over every update; empty for the respo engine

``calib``: one row per run (a calibration sweep), with the greedy accuracy where the runs.csv has that column;
``--cost`` appends seconds per update and training seconds per update. ``staleness``: per (model, objective, N, lr) of finished runs, one table of the
per-staleness metrics (rows) at staleness 0 .. N−1 (columns), each the mean over the seeds that
logged it. ``headline``: per (lr, N, objective) mean ± sample
std over seeds, then each objective against the best baseline of its (lr, N) (GRPO or VESPO, by mean
late mean) on late mean and held-out pass@1 with Welch's t-test, its 95 % interval, the p value
adjusted within the table (Benjamini–Hochberg by default, ``--adjust holm``), the two one-sided
tests of equivalence within ±δ (``--margin``), and the verdict of `respo.study.stats.verdict` from the adjusted p values; last, the
mean score of each rollout step. The tests assume normal per-seed values; with three seeds that
cannot be checked, and no rank test can reach p < .10 at three seeds per side.

``regime``: per response length (``LENGTH=runs.csv`` arguments) and learning rate, the on-policy
control (GRPO at N = 1: late mean, held-out pass@1) next to GRPO's stale-update diagnostics at the
largest N (fraction of stale positives and of stale negatives with log W < −1, log W p10, k3 KL per
token, per-token entropy late in the run, and the same-batch ReSPO / VESPO mass shares), each a mean
over the seeds run (n).

``mismatch``: per (lr, N, objective) of finished runs that logged it, the engine–trainer mismatch (means over
seeds) next to the log W p10 of the stale updates: how large the uncorrected mismatch is against the staleness.

``replay``: per (lr, N, objective) run both ways, MoE routing replay's effect: the mean over seeds
with replay minus without, on late mean and held-out pass@1, tested like ``headline``. Every other
kind keeps the runs without replay unless ``--routing-replay`` asks for those with it.

``fill FILE.md``: regenerate, in place, every block of a markdown file that starts with a line
``<!-- respo table ARGS -->`` (or ``<!-- respo recommend ARGS -->``) and ends with ``<!-- /respo -->``:
the lines between become that command's output (paths relative to the current directory).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
from pathlib import Path
from typing import Iterable, Sequence

from respo.errors import RespoError
from respo.fileio import write_text_atomic
from respo.study.aggregate import Run, best_per_column, early_max, first_step_problem, fmt_cell, greedy_acc, \
    late_mean, load_runs, mean_std, nanmean, pass_at_1, pooled_low_fraction, run_mean
from respo.train.config import rule
from respo.train.scores import early_count, late_count

__all__ = ["COLUMNS", "CSV_METRICS", "CSV_SAME_BATCH", "CSV_MISMATCH", "EDGE_UPDATES", "TableError", "run_row",
           "write_runs_csv", "seed_list", "starts_by_seed", "read_rows", "calib_table", "headline_tables",
           "staleness_tables", "STALENESS_METRICS", "regime_table", "replay_table", "mismatch_table", "fill",
           "add_arguments", "run"]

#: runs.csv's ``stale_mean:<metric>`` columns: per-update metrics averaged over stale updates.
CSV_METRICS = ("frac_pos_low_w", "pos_low_w_mass_share", "frac_starved", "kl_k3", "approx_kl", "coef_mean",
               "phi/pos_mean", "phi/neg_mean", "log_w/p10", "log_w/p50", "router_shift")
#: runs.csv's same-batch columns: column -> per-update metric, averaged over stale updates.
CSV_SAME_BATCH = {"same_batch_frac_pos_low_w": "same_batch/frac_pos_low_w",
                  "same_batch_respo_mass_share": "same_batch/respo_pos_low_w_mass_share",
                  "same_batch_vespo_mass_share": "same_batch/vespo_pos_low_w_mass_share"}
#: runs.csv's engine–trainer mismatch columns: column -> per-update metric of log ρ = the trainer's old log-prob
#: minus the engine's, averaged over every update (the mismatch does not depend on staleness); empty for runs of
#: the respo engine, whose log-probs are the trainer's.
CSV_MISMATCH = {"mismatch_abs_diff": "rollout_corr/abs_diff", "mismatch_seq_p10": "rollout_corr/seq_log_ratio_p10",
                "mismatch_seq_p90": "rollout_corr/seq_log_ratio_p90",
                "mismatch_seq_beyond_1": "rollout_corr/seq_frac_beyond_1"}
#: runs.csv's ``staleness:<metric>`` columns: per-update metrics averaged per staleness level 0 .. N−1.
STALENESS_METRICS = ("kl_k3", "log_w/p10", "frac_pos_low_w", "entropy")
#: runs.csv's later ``staleness:<metric>`` columns (appended after the first ones, which older files end with): on the
#: stale positives below log W = −1, the share of the coefficient mass ReSPO's and VESPO's φ⁺ would give them.
STALENESS_SHARES = ("same_batch/respo_pos_low_w_mass_share", "same_batch/vespo_pos_low_w_mass_share")
#: Updates at each end of a run whose scores are compared for on-policy stability.
EDGE_UPDATES = 8
#: Every column of runs.csv, in order (new columns are appended, so older files are a prefix).
COLUMNS = ("run", "model", "objective", "reuse", "group_size", "lr", "seed", "routing_replay", "updates", "finished",
           "updates_logged", "late_mean", "early_max", "pass@1", *(f"stale_mean:{k}" for k in CSV_METRICS),
           "task", "task_kwargs", "response_length", "kernels", "loss_agg_mode", "B", *CSV_SAME_BATCH,
           "grad_clip_rate", "first8_score", "last8_score", "entropy_early", "entropy_late", "pooled_pos_low_w",
           "pooled_neg_low_w", "step_scores", "seconds_per_update", "train_seconds_per_update",
           *(f"staleness:{k}" for k in STALENESS_METRICS), "greedy_acc", "start", "engine", *CSV_MISMATCH,
           "stalest_half_pos_low_w", "stalest_half_neg_low_w", *(f"staleness:{k}" for k in STALENESS_SHARES))
#: Columns holding a JSON list of numbers (null for an empty entry).
_LIST = {"step_scores", *(f"staleness:{k}" for k in (*STALENESS_METRICS, *STALENESS_SHARES))}
_TEXT = {"run", "model", "objective", "task", "task_kwargs", "kernels", "loss_agg_mode", "start", "engine"}
_INT = {"reuse", "group_size", "seed", "updates", "updates_logged", "B"}
_BOOL = {"routing_replay", "finished"}
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")
BASELINES = ("grpo", "vespo")
#: Equivalence margin δ of ``respo table headline`` unless ``--margin`` says otherwise: 0.03 of the
#: normalised score (3 points of training score or of held-out pass@1, about one seed-to-seed
#: standard deviation of a run in the committed studies; the same default as ``respo recommend``).
MARGIN = 0.03


class TableError(RespoError):
    """A runs.csv or run directory a table cannot be built from."""


def _steps(run: Run) -> list[float]:
    """Mean score of each complete rollout step (N updates); empty at N = 1 (the per-update curve)."""
    n, s = run.coords["reuse"] or 1, run.scores
    if n == 1:
        return []
    return [sum(s[i * n:(i + 1) * n]) / n for i in range(len(s) // n)]


def _by_staleness(run: Run, key: str) -> list[float]:
    """Entry s = 0 .. N−1: mean of ``key`` over the updates with ``staleness_mean`` = s (NaN where none logged it)."""
    n = run.coords["reuse"] or 1
    return [nanmean(r.get(key) for r in run.records if r.get("staleness_mean") == s) for s in range(n)]


def _seconds_per_update(run: Run) -> float:
    """Σ over the logged updates of all their ``time/*`` phases / the number of updates logged (``time/update``,
    an update's whole wall time, is not a phase)."""
    if not run.records:
        return math.nan
    total = sum(v for r in run.records for k, v in r.items()
                if k.startswith("time/") and k != "time/update" and v is not None)
    return total / len(run.records)


def _g6(x: float) -> float:
    return float(f"{x:.6g}") if math.isfinite(x) else math.nan


def run_row(run: Run) -> dict:
    """The runs.csv row of one run (`COLUMNS`; module docstring), numbers as floats (NaN when absent)."""
    c, s = run.coords, run.scores
    ent = [r.get("entropy") for r in run.records]
    row = {"run": run.path.name, "model": c["model"], "objective": c["objective"], "reuse": c["reuse"],
           "group_size": c["group_size"], "lr": c["lr"], "seed": c["seed"], "routing_replay": c["routing_replay"],
           "updates": c["updates"], "finished": run.finished, "updates_logged": len(run.records),
           "late_mean": late_mean(s), "early_max": early_max(s), "pass@1": pass_at_1(run)}
    row.update({f"stale_mean:{k}": run_mean(run, k, stale_only=True) for k in CSV_METRICS})
    row.update({"task": c["task"], "task_kwargs": c["task_kwargs"], "response_length": run_mean(run, "response_length"),
                "kernels": c["kernels"], "loss_agg_mode": c["loss_agg_mode"], "B": c["prompts"]})
    row.update({col: run_mean(run, k, stale_only=True) for col, k in CSV_SAME_BATCH.items()})
    row.update({"grad_clip_rate": run_mean(run, "grad_clipped"),
                "first8_score": nanmean(s[:EDGE_UPDATES]), "last8_score": nanmean(s[-EDGE_UPDATES:]),
                "entropy_early": nanmean(ent[:early_count(len(ent))]) if ent else math.nan,
                "entropy_late": nanmean(ent[-late_count(len(ent)):]) if ent else math.nan,
                "pooled_pos_low_w": pooled_low_fraction(run, "pos"), "pooled_neg_low_w": pooled_low_fraction(run, "neg"),
                "step_scores": [round(x, 6) for x in _steps(run)]})
    row.update({"seconds_per_update": _seconds_per_update(run),
                "train_seconds_per_update": run_mean(run, "time/train")})
    row.update({f"staleness:{k}": [_g6(x) for x in _by_staleness(run, k)] for k in STALENESS_METRICS})
    row["greedy_acc"] = greedy_acc(run)
    row["start"] = c["start"]
    row["engine"] = c["engine"]
    row.update({col: run_mean(run, k) for col, k in CSV_MISMATCH.items()})
    stalest = (c["reuse"] + 1) // 2  # the stalest half of a rollout step's updates: staleness ceil(N/2) .. N−1
    row["stalest_half_pos_low_w"] = pooled_low_fraction(run, "pos", min_staleness=stalest)
    row["stalest_half_neg_low_w"] = pooled_low_fraction(run, "neg", min_staleness=stalest)
    row.update({f"staleness:{k}": [_g6(x) for x in _by_staleness(run, k)] for k in STALENESS_SHARES})
    return row


def write_runs_csv(runs: Iterable[Run], path: Path, *, keep: bool = False) -> list[str]:
    """One `run_row` per run, sorted by run name; NaN written as an empty cell, floats with 6 digits.
    The file is replaced whole (`write_text_atomic`), never left half-written. With ``keep``, the rows of
    the runs.csv already at ``path`` whose runs are not among ``runs`` (runs whose directories are gone) are
    kept as they were written, column by column under this version's header (columns they lack left empty, as
    ``respo table`` reads them); returns their run names. A file there that is no runs.csv, or that has a
    column this version does not write (it would be lost), raises `TableError`."""
    runs = list(runs)
    lines: dict[str, list[str]] = {}
    if keep and path.is_file():
        _read_csv(path)  # a runs.csv whose every row parses, or TableError
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            unknown = [c for c in reader.fieldnames or () if c not in COLUMNS]
            if unknown:
                raise TableError(f"{path}: column {unknown[0]!r} is not one a runs.csv of this version holds, so its "
                                 "rows cannot be kept without losing it")
            given = {r.path.name for r in runs}
            lines = {row["run"]: [row.get(c) or "" for c in COLUMNS] for row in reader if row["run"] not in given}
    for r in runs:
        row = run_row(r)
        lines[r.path.name] = ["" if isinstance(v, float) and not math.isfinite(v) else
                              json.dumps([None if isinstance(x, float) and not math.isfinite(x) else x for x in v])
                              if isinstance(v, list) else f"{v:.6g}" if isinstance(v, float) else v
                              for v in (row[k] for k in COLUMNS)]
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(COLUMNS)
    w.writerows(lines[name] for name in sorted(lines))
    write_text_atomic(path, buf.getvalue(), newline="")
    return sorted(set(lines) - {r.path.name for r in runs})


def _parse(path: Path, line: int, col: str, text: str):
    if col in _TEXT:
        return text
    if col in _BOOL:
        word = text.strip().lower()
        if word in _TRUE or word in _FALSE or (word == "" and col != "finished"):  # kept rows leave later ones empty
            return word in _TRUE
        raise TableError(f"{path}: line {line}, column {col}: {text!r} is not true or false")
    if text.strip() == "":
        return [] if col in _LIST else math.nan
    try:
        if col in _LIST:
            return [math.nan if x is None else float(x) for x in json.loads(text)]
        return int(text) if col in _INT else float(text)
    except (ValueError, TypeError, json.JSONDecodeError):
        raise TableError(f"{path}: line {line}, column {col}: not a number: {text!r}") from None


def _read_csv(path: Path) -> tuple[list[dict], set[str]]:
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            table, header = list(reader), list(reader.fieldnames or [])
    except OSError as e:
        raise TableError(f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise TableError(f"{path}: not a UTF-8 text file") from None
    need = [c for c in COLUMNS[:14] if c not in header]
    if need:
        raise TableError(f"{path}: not a runs.csv (missing column(s) {', '.join(need)})")
    rows = []
    for i, r in enumerate(table, start=2):
        if None in r:  # csv.DictReader's key for fields beyond the header
            raise TableError(f"{path}: line {i}: {len(r[None])} more field(s) than the header")
        if any(v is None for v in r.values()):
            raise TableError(f"{path}: line {i}: fewer fields than the header")
        row = {c: (_parse(path, i, c, r[c]) if c in header else ([] if c in _LIST else
                                                                  "" if c in _TEXT else math.nan)) for c in COLUMNS}
        row[WHERE] = f"{path} line {i}"
        if row["finished"] and row["updates_logged"] != row["updates"]:
            raise TableError(f"{path}: line {i}: run {row['run']} finished at update {row['updates']} but its log "
                             f"holds {row['updates_logged']} update record(s): its windows were computed on a "
                             f"damaged log; leave it out or rebuild the row from a whole log")
        rows.append(row)
    return rows, {c for c in COLUMNS if c not in header}


#: What makes two finished rows the same seed of the same run (counted twice, it would be pooled as two seeds):
#: the runs.csv columns named by ``"seed_key"`` in the `TrainConfig` fields' metadata.
_SEED_KEY = tuple(dict.fromkeys(rule("seed_key").values()))


def _check_duplicates(rows: Sequence[dict], where: Sequence[str]) -> None:
    """Refuse a finished run given twice (the same `_SEED_KEY`, e.g. one runs.csv passed twice, or a re-run
    of a committed run next to it), naming both places; a table would count its seed twice."""
    seen: dict[tuple, int] = {}
    for i, r in enumerate(rows):
        if not r["finished"]:
            continue
        key = tuple(str(r[c]) for c in _SEED_KEY)
        j = seen.setdefault(key, i)
        if j != i:
            raise TableError(f"duplicate run: {r['objective']} lr {r['lr']:g} N {r['reuse']} seed {r['seed']} "
                             f"({r['updates']} updates) is in {where[j]} and in {where[i]}; each seed may count once")


def _start_note(args: argparse.Namespace) -> list[str]:
    """The label of a table pooled from several inputs (runs.csv files, run or sweep directories) whose runs
    cannot show one starting policy: some input's selected finished runs record none (``start`` empty or
    absent). Two recorded starting policies are refused instead (`_check_one_start`)."""
    if len(args.paths) < 2:
        return []
    unshown, used = [], 0
    for p in args.paths:
        try:
            got = [r for r in _select(read_rows([p])[0], args) if r["finished"]]
        except TableError:  # nothing of this input is selected
            continue
        used += 1
        if any(not r["start"] for r in got):
            unshown.append(str(p))
    if used < 2 or not unshown:
        return []
    return ["", f"Pooled from {used} inputs, and {', '.join(unshown)} record{'s' * (len(unshown) == 1)} no starting "
            f"policy (`start`) for {'its' if len(unshown) == 1 else 'their'} runs, so one starting policy is not shown: the table may pool warm starts "
            "that differ."]


def _engine(row: dict) -> str:
    return row.get("engine") or "respo"  # a row recorded before the column: respo's sampler, the only engine then


def _check_one_engine(rows: Sequence[dict]) -> None:
    """Refuse rows of two rollout engines (``engine``: their samples and evaluations come from different
    distributions) in a table that pools runs over seeds."""
    finished = [r for r in rows if r["finished"]]
    engines = sorted({_engine(r) for r in finished})
    if len(engines) > 1:
        a = next(r for r in finished if _engine(r) == engines[0])
        b = next(r for r in finished if _engine(r) == engines[1])
        raise TableError(f"two rollout engines in one table: {a['run']} sampled with {engines[0]} and {b['run']} "
                         f"with {engines[1]}; make one table per engine")


def _check_one_start(rows: Sequence[dict]) -> None:
    """Refuse rows of two starting policies (different recorded weights, the ``start`` column) or of two
    rollout engines (`_check_one_engine`) in a table that pools runs over seeds; rows recorded before the
    start column (empty ``start``) cannot be told apart."""
    _check_one_engine(rows)
    first: dict | None = None
    for r in rows:
        if r["finished"] and r["start"]:
            first = first or r
            if r["start"] != first["start"]:
                raise TableError(f"two starting policies in one table: {first['run']} started from {first['start']} "
                                 f"and {r['run']} from {r['start']}; make one table per starting policy, or pool "
                                 "seeds as blocks with --starts-by-seed where each seed's runs share one start")


def starts_by_seed(rows: Sequence[dict]) -> dict[str, list[int]]:
    """The seeds of each starting policy among the finished ``rows``, for a table that pools seeds as blocks
    of one start each (``--starts-by-seed``): every finished run records its start and all runs of one seed
    share it, else `TableError` naming the runs. Starts are ordered by their first seed."""
    finished = [r for r in rows if r["finished"]]
    _check_one_engine(finished)
    unrecorded = [r["run"] for r in finished if not r["start"]]
    if unrecorded:
        raise TableError(f"--starts-by-seed needs every run's starting policy, and {unrecorded[0]} records none "
                         f"({len(unrecorded)} run{'s' * (len(unrecorded) != 1)} without one)")
    seen: dict[int, dict] = {}
    for r in finished:
        other = seen.setdefault(r["seed"], r)
        if other["start"] != r["start"]:
            raise TableError(f"--starts-by-seed: seed {r['seed']}'s runs started from two policies ({other['run']} from "
                             f"{other['start']}, {r['run']} from {r['start']}); each seed's runs must share one start")
    by_start: dict[str, list[int]] = {}
    for seed in sorted(seen):
        by_start.setdefault(seen[seed]["start"], []).append(seed)
    return by_start


def seed_list(seeds: Sequence[int]) -> str:
    """0, 1, 2, 5 -> '0–2, 5': runs of consecutive seeds as ranges."""
    parts, i = [], 0
    while i < len(seeds):
        j = i
        while j + 1 < len(seeds) and seeds[j + 1] == seeds[j] + 1:
            j += 1
        parts.append(str(seeds[i]) if j == i else f"{seeds[i]}{', ' if j == i + 1 else '–'}{seeds[j]}")
        i = j + 1
    return ", ".join(parts)


def _starts_note(by_start: dict[str, list[int]]) -> list[str]:
    """The label of a table that pools seeds of several starting policies as blocks (empty for one start)."""
    if len(by_start) < 2:
        return []
    return ["", f"Seeds of {len(by_start)} starting policies, pooled as blocks (all runs of a seed share one start, so "
            "a per-seed contrast lies within one start; a mean over seeds averages over the starts): "
            + "; ".join(f"start {start}: seed{'s' * (len(seeds) != 1)} {seed_list(seeds)}"
                        for start, seeds in by_start.items()) + "."]


def read_rows(paths: Sequence[str | Path]) -> tuple[list[dict], set[str]]:
    """Rows of every run under ``paths``: a ``*.csv`` file is read as a runs.csv, anything else as
    sweep or run directories. Returns the rows and the columns some given runs.csv lacks. A finished
    run found twice (same coordinates and seed) raises `TableError` naming both places."""
    rows, where, absent, dirs = [], [], set(), []
    for p in map(Path, paths):
        if p.suffix == ".csv":
            got, miss = _read_csv(p)
            rows += got
            where += [f"{p} line {i}" for i in range(2, 2 + len(got))]
            absent |= miss
        else:
            dirs.append(p)
    if dirs:
        runs = load_runs(dirs)
        if not runs:
            raise TableError(f"no runs found under {', '.join(map(str, dirs))} (a run directory has a config.json)")
        rows += [{**run_row(r), WHERE: str(r.path)} for r in runs]
        where += [str(r.path) for r in runs]
    if not rows:
        raise TableError(f"no runs in {', '.join(map(str, paths))}")
    _check_duplicates(rows, where)
    return rows, absent


#: The key of a row's place (``FILE line K`` of a runs.csv, or a run directory): not a column.
WHERE = "_where"
#: The endpoints each kind of table pools over seeds (the factorial's are its ``--metrics``).
ENDPOINTS = {"headline": ("late_mean", "pass@1"), "replay": ("late_mean", "pass@1"),
             "breakdown": ("late_mean", "pass@1"), "regime": ("late_mean", "pass@1")}
#: The runs a seed-pooling table compares: one model, G, lr, N and budget.
_ENDPOINT_CELL = ("model", "group_size", "lr", "reuse", "updates")


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def endpoint_gaps(rows: Sequence[dict], cols: Sequence[str]) -> list[tuple[dict, str]]:
    """(row, column) of every finished row whose ``column`` is not a finite number (empty, nan or inf) while
    another finished row of its cell (`_ENDPOINT_CELL`) has one there: a table pooling the cell over seeds
    would drop its seed. An endpoint no run of a cell measured (e.g. no held-out evaluation) is no gap."""
    fin = [r for r in rows if r["finished"]]
    have = {(tuple(r[k] for k in _ENDPOINT_CELL), c) for r in fin for c in cols if _finite(r[c])}
    return [(r, c) for r in fin for c in cols
            if not _finite(r[c]) and (tuple(r[k] for k in _ENDPOINT_CELL), c) in have]


def _value(x) -> str:
    return "empty or nan" if isinstance(x, float) and math.isnan(x) else repr(x)


def endpoint_rule(rows: list[dict], cols: Sequence[str], *, skip: bool) -> tuple[list[dict], list[str]]:
    """The one rule of the study tools for a finished run that lacks an endpoint its cell's other runs have
    (`endpoint_gaps`): `TableError` in one line naming its file and line (or run directory), the run and the
    column; or, with ``skip`` (``--skip-missing``), the rows without such runs and a note that names each one
    left out, for the output."""
    gaps = endpoint_gaps(rows, cols)
    if not gaps:
        return rows, []
    if not skip:
        r, c = gaps[0]
        more = f" ({len(gaps)} such values in all)" if len(gaps) > 1 else ""
        raise TableError(f"{r.get(WHERE, r['run'])}, column {c}: run {r['run']} finished with {c} {_value(r[c])}, "
                         f"while other runs of its cell have one{more}; rebuild its row, leave it out of the input, or "
                         "pass --skip-missing to leave such runs out (the output names them)")
    left = {id(r) for r, _ in gaps}
    named = "; ".join(f"{r['run']} ({c} {_value(r[c])})" for r, c in gaps)
    return [r for r in rows if id(r) not in left], ["", f"Left out under --skip-missing, finished without an endpoint "
                                                        f"the other runs of their cell have: {named}."]


def _ci(w) -> str:
    """"[lo, hi]" of a Welch interval, "—" where no interval exists (n = 1 on a side)."""
    return "—" if math.isnan(w.ci_low) else f"[{w.ci_low:+.3f}, {w.ci_high:+.3f}]"


def _f(x: float, digits: int = 3, *, blank: str = "—") -> str:
    """``x`` with ``digits`` decimals; ``blank`` for a missing or non-finite value."""
    return blank if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def _absent_note(absent: set[str], used: Iterable[str]) -> list[str]:
    miss = [c for c in used if c in absent]
    if not miss:
        return []
    return ["", f"— in {', '.join(f'`{c}`' for c in miss)}: not in the given runs.csv (it was written before the "
            "column existed)."]


CALIB_HEAD = ("objective", "N", "lr", "seed", "updates", "first 8", "last 8", "late mean", "early max", "pass@1", "greedy",
              "pos logW<-1", "ReSPO share", "VESPO share", "logW p10", "kl_k3", "entropy early", "entropy late",
              "starved", "pooled pos<-1", "pooled neg<-1")
_CALIB_COLS = ("first8_score", "last8_score", "late_mean", "early_max", "pass@1", "greedy_acc", "stale_mean:frac_pos_low_w",
               "same_batch_respo_mass_share", "same_batch_vespo_mass_share", "stale_mean:log_w/p10",
               "stale_mean:kl_k3", "entropy_early", "entropy_late", "stale_mean:frac_starved", "pooled_pos_low_w",
               "pooled_neg_low_w")

#: Calib columns shown only when the given runs.csv files have them.
_CALIB_OPTIONAL = {"greedy_acc"}

_COST_HEAD = ("s/update", "train s/update")
_COST_COLS = ("seconds_per_update", "train_seconds_per_update")


def _g3(x: float) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3g}"


def calib_table(rows: list[dict], absent: set[str] = frozenset(), *, cost: bool = False) -> list[str]:
    """One line per run, sorted by (lr, objective, N, seed): scores, held-out pass@1, per-token
    entropy and the stale-update diagnostics (module docstring); with ``cost``, then seconds per update
    and training seconds per update (3 significant digits). Where the runs recorded more than one starting
    policy, a last column names each run's (``start``)."""
    # a column added later than the given runs.csv files (the greedy accuracy) is left out, not shown empty
    keep = [i for i, c in enumerate(_CALIB_COLS) if not (c in _CALIB_OPTIONAL and c in absent)]
    cols = [_CALIB_COLS[i] for i in keep]
    several = len({r["start"] for r in rows}) > 1
    head = (*CALIB_HEAD[:5], *(CALIB_HEAD[5 + i] for i in keep)) + (_COST_HEAD if cost else ()) + \
        (("start",) if several else ())
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in sorted(rows, key=lambda r: (r["lr"], r["objective"], r["reuse"], r["seed"])):
        digits = {"stale_mean:log_w/p10": 2, "stale_mean:kl_k3": 4, "entropy_early": 3, "entropy_late": 3}
        cells = [r["objective"], str(r["reuse"]), f"{r['lr']:g}", str(r["seed"]),
                 f"{r['updates_logged']}/{r['updates']}" + ("" if r["finished"] else " (running)")]
        cells += [_f(r[c], digits.get(c, 3)) for c in cols]
        cells += [_g3(r[c]) for c in _COST_COLS] if cost else []
        cells += [r["start"] or "—"] if several else []
        out.append("| " + " | ".join(cells) + " |")
    return out + _absent_note(absent, (*cols, *(_COST_COLS if cost else ())))


#: ``respo table staleness``'s rows: runs.csv column -> label.
STALENESS_ROWS = {"staleness:kl_k3": "k3 KL per token", "staleness:log_w/p10": "log W p10",
                  "staleness:frac_pos_low_w": "positives with log W < −1",
                  "staleness:same_batch/respo_pos_low_w_mass_share": "ReSPO φ⁺ mass share on them",
                  "staleness:same_batch/vespo_pos_low_w_mass_share": "VESPO φ⁺ mass share on them",
                  "staleness:entropy": "entropy per token"}


def staleness_tables(rows: list[dict], absent: set[str] = frozenset()) -> list[str]:
    """Per (model, objective, N, lr) of finished runs: one table, a row per `STALENESS_ROWS` metric, a column per
    staleness s = 0 .. N−1; a cell is the mean over the seeds that logged the metric at s (3 significant
    digits; — where none did)."""
    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["finished"]:
            cells.setdefault((r["model"], r["lr"], r["objective"], r["reuse"]), []).append(r)
    if not cells:
        raise TableError("no finished runs to tabulate")
    out: list[str] = []
    for (model, lr, obj, n), rs in sorted(cells.items()):
        if out:
            out.append("")
        out += [f"{model}: {obj}, N = {n}, lr {lr:g} ({len(rs)} seed{'s' if len(rs) != 1 else ''}):", "",
                "| staleness | " + " | ".join(str(s) for s in range(n)) + " |", "|" + "---|" * (n + 1)]
        for col, label in STALENESS_ROWS.items():
            have = [r for r in rs if isinstance(r.get(col), list) and r[col]]
            if not have and col.removeprefix("staleness:") in STALENESS_SHARES:
                continue  # runs.csv files older than the mass-share columns: the rows are left out, not shown as —
            vals = [_g3(nanmean(r[col][s] for r in have if len(r[col]) > s)) for s in range(n)]
            out.append(f"| {label} | " + " | ".join(vals) + " |")
    return out + _absent_note(set(absent) - {f"staleness:{k}" for k in STALENESS_SHARES}, STALENESS_ROWS)


def _ms(xs: list[float], digits: int = 3) -> str:
    m, s, n = mean_std(xs)
    return f"{_f(m, digits)} ({n})" if n < 2 else f"{_f(m, digits)} ± {_f(s, digits)} ({n})"


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


_HEAD_COLS = ("stale_mean:frac_pos_low_w", "pooled_neg_low_w", "same_batch_respo_mass_share",
              "same_batch_vespo_mass_share", "stale_mean:log_w/p10", "stale_mean:kl_k3", "entropy_early",
              "entropy_late", "grad_clip_rate")


def by_seed(a_rows: Sequence[dict], b_rows: Sequence[dict], key: str) -> tuple[list[float], list[float]]:
    """Two arms' values of column ``key`` on the seeds both ran, aligned by seed (for a paired test).

    Raises:
        TableError: a seed's two rows did not share their first rollout step (`respo.study.aggregate.first_step_problem`).
    """
    a_by, b_by = {r["seed"]: r for r in a_rows}, {r["seed"]: r for r in b_rows}
    seeds = sorted(set(a_by) & set(b_by))
    for seed in seeds:
        problem = first_step_problem(a_by[seed], b_by[seed])
        if problem:
            raise TableError(f"--paired: seed {seed}'s arms did not share their first rollout step ({problem}); "
                             "test them unpaired")
    return [a_by[s][key] for s in seeds], [b_by[s][key] for s in seeds]


def headline_tables(rows: list[dict], absent: set[str] = frozenset(), *, margin: float = MARGIN,
                    method: str = "bh", paired: bool = False) -> list[str]:
    """The headline cell's three tables (module docstring) from finished runs' rows; ``paired`` tests each
    objective against the best baseline with the paired t-test over the seeds both ran (`by_seed`) instead
    of Welch's."""
    from respo.study.stats import ADJUST_METHODS, format_p, judge

    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["finished"]:
            cells.setdefault((r["lr"], r["reuse"], r["objective"]), []).append(r)
    if not cells:
        raise TableError("no finished runs to tabulate")
    out = ["| lr | N | objective | late mean | held-out pass@1 | pos log W<−1 | neg log W<−1 | ReSPO share | "
           "VESPO share | log W p10 | k3 KL | entropy early | entropy late | clip rate |", "|" + "---|" * 14]
    digits = {"stale_mean:log_w/p10": 2, "stale_mean:kl_k3": 4, "grad_clip_rate": 2}
    for (lr, n, obj), rs in sorted(cells.items()):
        vals = [_f(_mean([r[c] for r in rs]), digits.get(c, 3)) for c in _HEAD_COLS]
        out.append(f"| {lr:g} | {n} | {obj} | {_ms([r['late_mean'] for r in rs])} | {_ms([r['pass@1'] for r in rs])} | "
                   + " | ".join(vals) + " |")
    out += _absent_note(absent, _HEAD_COLS)

    tests = []  # (lr, n, obj, best, metric, a, b)
    for lr, n in sorted({(k[0], k[1]) for k in cells}):
        base = [o for o in BASELINES if (lr, n, o) in cells]
        if not base:
            continue
        best = max(base, key=lambda o: mean_std([r["late_mean"] for r in cells[(lr, n, o)]])[0])
        for (lr2, n2, obj), rs in sorted(cells.items()):
            if (lr2, n2) != (lr, n) or obj == best:
                continue
            for metric, key in (("late mean", "late_mean"), ("pass@1", "pass@1")):
                a, b = (by_seed(rs, cells[(lr, n, best)], key) if paired else
                        ([r[key] for r in rs], [r[key] for r in cells[(lr, n, best)]]))
                tests.append((lr, n, obj, best, metric, a, b))
    judged = judge([t[5:] for t in tests], margin=margin, method=method, paired_by_seed=paired)
    name = ADJUST_METHODS[method].split(" (")[0]
    test = ("the paired two-sided t-test over the seeds both ran (each seed's arms share their first rollout "
            "step)" if paired else "Welch's two-sided t-test")
    out += ["", f"Each objective against the best baseline of its (lr, N). p: {test}; p ({name}): "
            f"adjusted over the {len(tests)} tests of this table; TOST p: two one-sided tests of equivalence within "
            f"±δ = {margin:g}, adjusted the same way. Verdicts from the adjusted p values.", "",
            f"| lr | N | objective vs best baseline | metric | difference | 95 % CI | {'paired' if paired else 'Welch'} "
            f"t (df) | p | p ({name}) | TOST p (δ = {margin:g}) | verdict |", "|" + "---|" * 11]
    for (lr, n, obj, best, metric, _, _), j in zip(tests, judged):
        w = j.welch
        out.append(f"| {lr:g} | {n} | {obj} vs {best} | {metric} | {w.diff:+.3f} | {_ci(w)} | "
                   f"{_f(w.t, 2)} ({_f(w.df, 1)}) | {format_p(w.p)} | {format_p(j.p_adj)} | {format_p(j.p_tost_adj)} | "
                   f"{j.verdict} |")

    stale = {k: rs for k, rs in cells.items() if k[1] != 1}
    n_steps = max((len(r["step_scores"]) for rs in stale.values() for r in rs), default=0)
    out += ["", "Training score per rollout step (mean over seeds of the mean per-update score in the step; step 1 "
            "trains on the warm start's rollouts):", ""]
    if stale and n_steps == 0:
        return out + ["Not in the given runs.csv: it was written before the `step_scores` column existed."]
    out += ["| lr | N | objective | " + " | ".join(f"step {i + 1}" for i in range(n_steps)) + " |",
            "|" + "---|" * (3 + n_steps)]
    for (lr, n, obj), rs in sorted(stale.items()):
        steps = [[r["step_scores"][i] for r in rs if len(r["step_scores"]) > i] for i in range(n_steps)]
        out.append(f"| {lr:g} | {n} | {obj} | " + " | ".join(_f(_mean(v)) if v else "—" for v in steps) + " |")
    return out


#: A run broke down when its late mean and its held-out pass@1 both fell below this share of its starting
#: score (`start_score`); docs/method.md ("Breakdown") defines it, and `respo table breakdown` counts it.
BREAKDOWN_SHARE = 0.5


def start_score(row: dict) -> float:
    """The starting policy's training score as the run recorded it: the mean score of its first rollout step
    (``step_scores``, N > 1: the starting policy's own samples, the same for every arm of a seed), else the
    mean score of its first 8 updates (``first8_score``; at N = 1 the policy moves a little within them);
    NaN when the row records neither."""
    steps = row.get("step_scores") or []
    return float(steps[0]) if steps and math.isfinite(steps[0]) else float(row.get("first8_score", math.nan))


def broke_down(row: dict) -> bool | None:
    """The run broke down: late mean < `BREAKDOWN_SHARE` · `start_score` and held-out pass@1 <
    `BREAKDOWN_SHARE` · `start_score` (a run that still passes held-out prompts, or still scores in training,
    did not); None when the row does not record all three numbers."""
    start, late, pass1 = start_score(row), row["late_mean"], row["pass@1"]
    if not all(math.isfinite(x) for x in (start, late, pass1)):
        return None
    bar = BREAKDOWN_SHARE * start
    return late < bar and pass1 < bar


def breakdown_table(rows: list[dict]) -> list[str]:
    """Per (lr, N, objective) of finished runs: how many seeds broke down (`broke_down`), which, and the
    starting scores the bar was taken from."""
    cells = group_rows(rows, ("lr", "reuse", "objective"))
    if not cells:
        raise TableError("no finished runs to tabulate")
    out = [f"A run broke down when its late mean and its held-out pass@1 both fell below {BREAKDOWN_SHARE:g} × its "
           "starting score (the mean training score of its first rollout step, or of its first 8 updates at N = 1); "
           "— where a run does not record all three numbers (docs/method.md, \"Breakdown\").", "",
           "| lr | N | objective | seeds | broke down | seeds that broke down | starting score (mean) |",
           "|---|---|---|---|---|---|---|"]
    for (lr, n, obj), rs in sorted(cells.items()):
        verdicts = [(r["seed"], broke_down(r)) for r in sorted(rs, key=lambda r: r["seed"])]
        known = [b for _, b in verdicts if b is not None]
        count = f"{sum(known)} of {len(known)}" + (f" ({len(verdicts) - len(known)} —)" if len(known) < len(verdicts)
                                                   else "")
        which = ", ".join(str(seed) for seed, b in verdicts if b) or "—"
        out.append(f"| {lr:g} | {n} | {obj} | {len(rs)} | {count} | {which} | "
                   f"{_f(nanmean(start_score(r) for r in rs))} |")
    return out


def mismatch_table(rows: list[dict]) -> list[str]:
    """Per (lr, N, objective) of finished runs that logged it: the engine–trainer mismatch (`CSV_MISMATCH`, over
    every update) next to the staleness it sits beside (log W p10 over the stale updates), means over seeds."""
    cells = group_rows([r for r in rows if math.isfinite(r["mismatch_abs_diff"])], ("lr", "reuse", "objective"))
    if not cells:
        raise TableError("no finished run records an engine–trainer mismatch (runs of the respo engine have none, "
                         "and runs.csv files written before its columns existed hold none)")
    out = ["The engine–trainer mismatch per token and per sequence, log ρ = the trainer's log-prob of a sampled "
           "token before the update minus the engine's, averaged over every update of a run and then over seeds, "
           "next to the staleness the objective sees: log W = log π_θ − log π_old per sequence, its p10 over the "
           "stale updates. The trainer recomputes π_old, so log W holds staleness alone and ρ is not corrected "
           "unless rollout_correction says so.", "",
           "| lr | N | objective | seeds | mean abs log ρ per token | sequence log ρ p10 | sequence log ρ p90 | "
           "sequences beyond ±1 | log W p10 (stale updates) |", "|" + "---|" * 9]
    for (lr, n, obj), rs in sorted(cells.items()):
        m = {c: _mean([r[c] for r in rs]) for c in (*CSV_MISMATCH, "stale_mean:log_w/p10")}
        mean_abs, sd_abs, k = mean_std([r["mismatch_abs_diff"] for r in rs])
        abs_cell = _f(mean_abs) if k < 2 else f"{_f(mean_abs)} ± {_f(sd_abs)}"
        p10, p90 = (_f(m[c], 2) if not m[c] > 0 else f"+{m[c]:.2f}" for c in ("mismatch_seq_p10", "mismatch_seq_p90"))
        out.append(f"| {lr:g} | {n} | {obj} | {len(rs)} | {abs_cell} | {p10} | {p90} | "
                   f"{_f(m['mismatch_seq_beyond_1'])} | {_f(m['stale_mean:log_w/p10'], 2)} |")
    return out


#: The 2 × 2 of positive branch × negative branch: (arm R⁺R⁻, R⁺V⁻, V⁺R⁻, V⁺V⁻) as runs.csv objectives.
FACTORIAL_ARMS = ("respo", "respo+/vespo-", "vespo+/respo-", "vespo")


FACTORIAL_METRICS = {"late_mean": "late mean", "pass@1": "pass@1", "greedy_acc": "greedy"}
#: The endpoints `respo table factorial` tests when ``--metrics`` is not given.
FACTORIAL_DEFAULT = ("late_mean", "pass@1")


def _complete_seeds(cells: dict[tuple, list[dict]]) -> dict[tuple, set[int]]:
    """Per (lr, N) where all four arms of the 2 × 2 (`FACTORIAL_ARMS`) finished some run (``cells``: `group_rows`
    by lr, reuse and objective), the seeds whose four arms all finished."""
    return {(lr, n): set.intersection(*({r["seed"] for r in cells[(lr, n, arm)]} for arm in FACTORIAL_ARMS))
            for lr, n in {(lr, n) for lr, n, _ in cells}
            if all((lr, n, arm) in cells for arm in FACTORIAL_ARMS)}


def factorial_table(rows: list[dict], *, margin: float = MARGIN, method: str = "bh",
                    metrics: tuple[str, ...] = FACTORIAL_DEFAULT,
                    starts: dict[str, list[int]] | None = None, missing: int = 0) -> list[str]:
    """The 2 × 2 of ReSPO's and VESPO's branches per (lr, N) where all four arms (`FACTORIAL_ARMS`) ran:
    the negative-branch and positive-branch main effects and their interaction
    (`respo.study.stats.factorial_2x2`) on late mean and held-out pass@1 (or greedy accuracy), each a
    one-sample t-test over the seeds all four arms ran (each seed's arms share their first rollout step: `by_seed`), with its 95 %
    interval, the p value adjusted over the table's contrasts, TOST within ±δ, the contrast's SD over seeds with
    the minimum effect those seeds detect at 80 % power (`respo.study.stats.min_detectable`, unadjusted α) and a
    verdict on the sign.
    ``metrics`` (keys of `FACTORIAL_METRICS`) are the endpoints tested: a study that declared one endpoint
    adjusts over its three contrasts only, and tests a secondary endpoint (greedy accuracy) in a table of its
    own. A seed whose runs lack the endpoint (empty: runs from before greedy accuracy was recorded) is in none
    of that endpoint's contrasts. The seeds left out, of every contrast (not all four arms finished) or of one
    endpoint's, are named under the tables.
    ``starts`` (`starts_by_seed`: each starting policy's seeds), when it holds two or more: the seeds are pooled
    as blocks, and a second table gives each start's mean contrasts over its seeds, a description beside the
    tests, not further tests.
    ``missing`` > 0 (a study stopped that many seeds short of its declared number): a further table bounds
    what those seeds could have changed, had each contrast's values fallen within the range of the measured
    seeds' (`respo.study.stats.missing_seeds`): the smallest p and the largest TOST p, each adjusted with the
    other contrasts' bounds as the tests are (adjusted p's are monotone in the raw ones, so these bound them):
    a difference is ruled out where the adjusted smallest p stays above α, an equivalence kept where the
    adjusted largest TOST p stays at or below α."""
    from respo.study.stats import ADJUST_METHODS, FACTORIAL_CONTRASTS, adjust, factorial_2x2, factorial_contrasts, welch, \
        format_p, min_detectable, missing_seeds, tost_of, verdict

    cells = group_rows(rows, ("lr", "reuse", "objective"))
    complete = _complete_seeds(cells)
    found = sorted(complete)
    if not found:
        raise TableError(f"no (lr, N) with all four arms of the 2 × 2 ({', '.join(FACTORIAL_ARMS)}) finished")
    tests = []  # (lr, N, metric, contrast, seeds, PairedTest, Tost)
    per_start = []  # (lr, N, metric, start, {contrast: PairedTest}) when the seeds come from several starts
    left_out = []  # the seeds in no contrast, and why: nothing is dropped unsaid
    bounds = {}  # index into tests -> MissingSeeds, with ``missing``
    for lr, n in found:
        rr = cells[(lr, n, FACTORIAL_ARMS[0])]
        ran = {arm: {r["seed"] for r in rows if (r["lr"], r["reuse"], r["objective"]) == (lr, n, arm)}
               for arm in FACTORIAL_ARMS}
        done = {arm: {r["seed"] for r in cells[(lr, n, arm)]} for arm in FACTORIAL_ARMS}
        common = complete[(lr, n)]
        partial = sorted(set.union(*ran.values()) - common)
        if partial:
            left_out.append(f"Not in any contrast at lr {lr:g}, N = {n} (not all four arms finished): " + "; ".join(
                f"seed {s} (no finished {', '.join(a for a in FACTORIAL_ARMS if s not in done[a])})" for s in partial)
                + ".")
        for metric, key in ((FACTORIAL_METRICS[m], m) for m in metrics):
            arms = [by_seed([r for r in rr if r["seed"] in common], cells[(lr, n, arm)], key)[1]
                    for arm in FACTORIAL_ARMS]
            unrecorded = [s for i, s in enumerate(sorted(common)) if not all(math.isfinite(a[i]) for a in arms)]
            if unrecorded:
                left_out.append(f"Not in the {metric} contrasts at lr {lr:g}, N = {n} (the endpoint was not recorded "
                                f"in every arm): seed{'s' * (len(unrecorded) > 1)} {seed_list(unrecorded)}.")
            per_seed = factorial_contrasts(*arms) if missing else {}
            for name, t in factorial_2x2(*arms).items():
                tests.append((lr, n, metric, name, t, tost_of(t, margin) if t.n >= 2 else None))
                if per_seed.get(name):
                    bounds[len(tests) - 1] = missing_seeds(per_seed[name], missing, margin)
            if starts and len(starts) > 1:
                order = sorted(common)  # by_seed aligns the arms in this order
                for start, seeds in starts.items():
                    keep = [i for i, seed in enumerate(order) if seed in seeds]
                    sub = [[a[i] for i in keep] for a in arms]
                    per_start.append((lr, n, metric, start, factorial_2x2(*sub) if keep else None,
                                      factorial_contrasts(*sub) if keep else None))
    p_adj = adjust([t.p for *_, t, _ in tests], method)
    p_tost = adjust([math.nan if eq is None else eq.p for *_, eq in tests], method)
    name = ADJUST_METHODS[method].split(" (")[0]
    out = ["The 2 × 2 of positive branch {ReSPO, VESPO} × negative branch {ReSPO, VESPO} (arms "
           f"{', '.join(FACTORIAL_ARMS)}), per seed: negative branch = ½[(R⁺R⁻ − R⁺V⁻) + (V⁺R⁻ − V⁺V⁻)], positive "
           "branch = ½[(R⁺R⁻ − V⁺R⁻) + (R⁺V⁻ − V⁺V⁻)], interaction = (R⁺R⁻ − R⁺V⁻) − (V⁺R⁻ − V⁺V⁻). p: one-sample "
           "two-sided t-test of the per-seed contrast over the seeds all four arms ran (each seed's arms share "
           f"their first rollout step); p ({name}): adjusted over the {len(tests)} contrasts of this table; TOST p: "
           f"equivalence to 0 within ±δ = {margin:g}, adjusted the same way. SD: the per-seed contrast's standard "
           "deviation; MDE: the smallest true contrast these seeds detect with 80 % power at that SD (two-sided, "
           "α = .05 unadjusted). Verdict: below 0 / above 0 when the adjusted p ≤ .05.", "",
           f"| lr | N | metric | contrast | seeds | estimate | 95 % CI | t (df) | p | p ({name}) | "
           f"TOST p (δ = {margin:g}) | SD | MDE (80 %) | verdict |", "|" + "---|" * 14]
    for (lr, n, metric, contrast, t, eq), q, qt in zip(tests, p_adj, p_tost):
        words = verdict(t, eq, p=q, p_tost=None if eq is None else qt)
        words = words.replace("worse", "below 0", 1).replace("better", "above 0", 1)
        sd = t.se * math.sqrt(t.n) if t.n >= 2 else math.nan
        out.append(f"| {lr:g} | {n} | {metric} | {contrast} | {t.n} | {t.diff:+.3f} | {_ci(t)} | {_f(t.t, 2)} "
                   f"({_f(t.df, 0)}) | {format_p(t.p)} | {format_p(q)} | {format_p(qt)} | {_f(sd, 3)} | "
                   f"{_f(min_detectable(sd, t.n), 3)} | {words} |")
    if per_start:
        out += ["", "Each starting policy's seeds alone: the mean per-seed contrast (a description beside the tests "
                "above, not a further test); where a cell's seeds come from two starts, the Welch p of the difference "
                "between the two starts' per-seed contrasts (descriptive: not declared, not adjusted).", "",
                "| lr | N | metric | start | seeds | " + " | ".join(FACTORIAL_CONTRASTS) + " |",
                "|" + "---|" * (5 + len(FACTORIAL_CONTRASTS))]
        cells: dict[tuple, list] = {}
        for lr, n, metric, start, got, values in per_start:  # got None: no seed of this start holds all four arms yet
            k = next(iter(got.values())).n if got else 0
            out.append(f"| {lr:g} | {n} | {metric} | {start} | {k} | "
                       + " | ".join(f"{got[c].diff:+.3f}" if got else "—" for c in FACTORIAL_CONTRASTS) + " |")
            cells.setdefault((lr, n, metric), []).append(values)
            both = cells[(lr, n, metric)]
            if len(both) == 2 and all(v is not None and len(v[FACTORIAL_CONTRASTS[0]]) >= 2 for v in both):
                out.append(f"| {lr:g} | {n} | {metric} | between the two starts, Welch p | | "
                           + " | ".join(format_p(welch(both[0][c], both[1][c]).p) for c in FACTORIAL_CONTRASTS) + " |")
    if missing:
        # each bound adjusted with the others, as the tests are: an adjusted p never falls when a raw p rises, so
        # adjusting the smallest p's together bounds every adjusted p from below, the largest TOST p's from above
        lows = adjust([bounds[i].p_min if i in bounds else t.p for i, (*_, t, _) in enumerate(tests)], method)
        highs = adjust([bounds[i].p_tost_max if i in bounds else (math.nan if eq is None else eq.p)
                        for i, (*_, eq) in enumerate(tests)], method)
        out += ["", f"Had {missing} further seed{'s' * (missing > 1)} fallen within the range of the seeds measured (each "
                "contrast on its own; every combination on a grid of 21 values per seed from the smallest to the largest "
                "per-seed contrast): the smallest two-sided p and the largest TOST p the test could then have given, "
                f"each also adjusted ({name}) with the other contrasts' bounds, as the tests are; an adjusted p never falls "
                "when a raw p rises, so these bound the adjusted p's. A difference is ruled out where the adjusted "
                "smallest p stays above α = .05; a contrast equivalent now stays so where the adjusted largest TOST p "
                "stays at or below α. Seeds beyond the measured range are not covered.", "",
                f"| lr | N | metric | contrast | seeds | range | smallest p | adjusted | largest TOST p (δ = {margin:g}) | "
                "adjusted | difference ruled out | equivalence kept |", "|" + "---|" * 12]
        for i, ((lr, n, metric, contrast, t, eq), qt) in enumerate(zip(tests, p_tost)):
            b = bounds.get(i)
            if b is None:
                continue
            equivalent = eq is not None and qt <= eq.alpha
            kept = "—" if not equivalent else ("yes" if highs[i] <= eq.alpha else "no")
            out.append(f"| {lr:g} | {n} | {metric} | {contrast} | {t.n} + {missing} | [{b.low:+.3f}, {b.high:+.3f}] | "
                       f"{format_p(b.p_min)} | {format_p(lows[i])} | {format_p(b.p_tost_max)} | {format_p(highs[i])} | "
                       f"{'yes' if lows[i] > t.alpha else 'no'} | {kept} |")
    return out + ([""] + left_out if left_out else [])


def replay_table(rows: list[dict], *, margin: float = MARGIN, method: str = "bh") -> list[str]:
    """Routing replay's effect per (lr, N, objective): the mean over seeds with replay minus without,
    on late mean and held-out pass@1, with Welch's test, its 95 % interval, the p value adjusted over
    the table's tests, TOST within ±δ (adjusted the same way) and the verdict, from finished runs."""
    from respo.study.stats import ADJUST_METHODS, format_p, judge

    cells: dict[tuple, dict[bool, list[dict]]] = {}
    for r in rows:
        if r["finished"]:
            by = cells.setdefault((r["lr"], r["reuse"], r["objective"]), {})
            by.setdefault(bool(r["routing_replay"]), []).append(r)
    tests = []
    for (lr, n, obj), by in sorted(cells.items()):
        if True in by and False in by:
            for metric, key in (("late mean", "late_mean"), ("pass@1", "pass@1")):
                tests.append((lr, n, obj, metric, [r[key] for r in by[True]], [r[key] for r in by[False]]))
    if not tests:
        raise TableError("no objective was run both with and without routing replay")
    judged = judge([t[4:] for t in tests], margin=margin, method=method)
    name = ADJUST_METHODS[method].split(" (")[0]
    out = [f"Routing replay's effect: with replay minus without, per objective. p: Welch's two-sided t-test; "
           f"p ({name}): adjusted over the {len(tests)} tests of this table; TOST p: two one-sided tests of "
           f"equivalence within ±δ = {margin:g}, adjusted the same way. Verdicts from the adjusted p values.", "",
           f"| lr | N | objective | metric | seeds (replay / none) | with replay | without | difference | 95 % CI | "
           f"p | p ({name}) | TOST p (δ = {margin:g}) | verdict |", "|" + "---|" * 13]
    for (lr, n, obj, metric, a, b), j in zip(tests, judged):
        out.append(f"| {lr:g} | {n} | {obj} | {metric} | {len(a)} / {len(b)} | {_mean(a):.3f} | {_mean(b):.3f} | "
                   f"{j.welch.diff:+.3f} | {_ci(j.welch)} | {format_p(j.welch.p)} | {format_p(j.p_adj)} | "
                   f"{format_p(j.p_tost_adj)} | {j.verdict} |")
    return out


def regime_table(inputs: Sequence[tuple[int, list[dict], set[str]]]) -> list[str]:
    """Per (response length, lr): GRPO at N = 1 and GRPO's stale diagnostics at the largest N
    (module docstring), at the budget most of those runs have. ``inputs``: (length, rows, absent
    columns) per runs.csv."""
    cols = ("stale_mean:frac_pos_low_w", "pooled_neg_low_w", "stale_mean:log_w/p10", "stale_mean:kl_k3",
            "entropy_late", "same_batch_respo_mass_share", "same_batch_vespo_mass_share")
    digits = {"stale_mean:frac_pos_low_w": 4, "pooled_neg_low_w": 4, "stale_mean:log_w/p10": 2,
              "stale_mean:kl_k3": 4, "same_batch_respo_mass_share": 4, "same_batch_vespo_mass_share": 4}
    out = []
    absent_all: set[str] = set()
    for length, rows, absent in inputs:
        fin = [r for r in rows if r["finished"] and r["objective"] == "grpo" and not r["routing_replay"]]
        nmax = max((r["reuse"] for r in fin), default=None)
        if nmax is None or nmax == 1:
            continue
        budgets = [r["updates"] for r in fin if r["reuse"] == nmax]
        fin = [r for r in fin if r["updates"] == max(set(budgets), key=budgets.count)]  # one budget: the most run
        if not out:
            out = [f"| response tokens | lr | GRPO N = 1: late mean | N = 1: pass@1 | GRPO N = {nmax}: seeds | "
                   "stale positives log W<−1 | stale negatives log W<−1 | log W p10 | k3 KL per token | "
                   "entropy (late) | ReSPO / VESPO share (same batch) |", "|" + "---|" * 11]
        absent_all |= absent
        for lr in sorted({r["lr"] for r in fin if r["reuse"] == nmax}):
            on = [r for r in fin if r["reuse"] == 1 and r["lr"] == lr]
            st = [r for r in fin if r["reuse"] == nmax and r["lr"] == lr]
            v = {c: _f(_mean([r[c] for r in st]), digits.get(c, 3)) for c in cols}
            on_cells = (f"{_ms([r['late_mean'] for r in on])} | {_ms([r['pass@1'] for r in on])}" if on else "— | —")
            out.append(f"| {length} | {lr:g} | {on_cells} | {len(st)} | {v[cols[0]]} | {v[cols[1]]} | {v[cols[2]]} | "
                       f"{v[cols[3]]} | {v[cols[4]]} | {v[cols[5]]} / {v[cols[6]]} |")
    if not out:
        raise TableError("no GRPO runs at N > 1 in the given runs.csv files")
    return out + _absent_note(absent_all, cols)


# ---- the study report's tables: `respo report` lays them out with its figures and prose ----------

def group_rows(rows: Iterable[dict], keys: Sequence[str]) -> dict[tuple, list[dict]]:
    """Finished rows grouped by the given columns (e.g. ("objective", "reuse"))."""
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["finished"]:
            out.setdefault(tuple(r[k] for k in keys), []).append(r)
    return out


def column_cells(groups: dict[tuple, list[dict]], col: str) -> dict[tuple, list[float]]:
    """``{key: [row[col] for each row of the group]}``: one value per seed, for `cell_table`."""
    return {k: [r[col] for r in rs] for k, rs in groups.items()}


def cell_table(labels: Sequence, cols: Sequence, cells: dict[tuple, list[float]], *, col_name=str,
               row_head: str = "objective", digits: int = 3, higher: bool = True,
               suffix: dict | None = None) -> list[str]:
    """Markdown table of mean ± std (n) over the values of each (label, col) cell, the best mean per
    column in bold (`respo.study.aggregate.fmt_cell`); ``suffix`` appends text to a cell."""
    stats = {k: mean_std(v) for k, v in cells.items()}
    best = best_per_column({k: st[0] for k, st in stats.items()}, higher=higher)
    out = ["| " + row_head + " | " + " | ".join(col_name(c) for c in cols) + " |", "|---|" + "---|" * len(cols)]
    for label in labels:
        line = []
        for c in cols:
            m, sd, n = stats.get((label, c), (math.nan, math.nan, 0))
            line.append(fmt_cell(m, sd, n, digits=digits, bold=(label, c) in best) + (suffix or {}).get((label, c), ""))
        out.append(f"| {label} | " + " | ".join(line) + " |")
    return out


def means_row(head: Sequence, rows: Sequence[dict], cols: Sequence[str], digits: Sequence[int]) -> str:
    """One markdown line: the ``head`` cells, then per column the mean over ``rows`` of the finite values
    (``–`` where none), with ``digits`` decimals per column."""
    return ("| " + " | ".join(map(str, head)) + " | "
            + " | ".join(_f(nanmean(r[c] for r in rows), d, blank="–") for c, d in zip(cols, digits)) + " |")


def best_lr_cells(groups: dict[tuple, list[dict]], objs: Sequence[str], ns: Sequence[int],
                  lrs: Sequence[float]) -> tuple[dict[tuple, list[float]], dict[tuple, float]]:
    """Per (objective, N) the late means of the seeds at the learning rate with the highest mean late
    mean (``groups`` keyed by (objective, N, lr)), and that learning rate."""
    cells, best = {}, {}
    for o in objs:
        for n in ns:
            cands = [(mean_std([r["late_mean"] for r in groups[(o, n, x)]])[0], x) for x in lrs if (o, n, x) in groups]
            cands = [(v, x) for v, x in cands if math.isfinite(v)]
            if cands:
                _, x = max(cands)
                cells[(o, n)] = [r["late_mean"] for r in groups[(o, n, x)]]
                best[(o, n)] = x
    return cells, best


def runs_table(rows: Sequence[dict]) -> list[str]:
    """One line per run (any runs, not only a study grid): coordinates, updates logged, late mean, early
    max and held-out pass@1."""
    out = ["| run | objective | N | lr | seed | updates | late mean | early max | held-out pass@1 |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| `{r['run']}` | {r['objective']} | {r['reuse']} | {r['lr']} | {r['seed']} | "
                   f"{r['updates_logged']}{'' if r['finished'] else ' (unfinished)'} | {_f(r['late_mean'], blank='–')} | "
                   f"{_f(r['early_max'], blank='–')} | {_f(r['pass@1'], blank='–')} |")
    return out


#: The commands a ``fill`` block may run: their output is a markdown table.
FILL_COMMANDS = ("table", "recommend")


def _fill_parser() -> argparse.ArgumentParser:
    """The command lines a ``fill`` block may run (`FILL_COMMANDS`), parsed as ``respo table`` and ``respo
    recommend`` parse them."""
    from respo.study import recommend

    parser = argparse.ArgumentParser(prog="respo")
    sub = parser.add_subparsers(dest="command", required=True)
    add_arguments(sub.add_parser("table"))
    sub.choices["table"].set_defaults(func=run)
    recommend.add_arguments(sub.add_parser("recommend"))
    sub.choices["recommend"].set_defaults(func=recommend.run)
    return parser


def fill(path: Path) -> int:
    """Regenerate every ``<!-- respo CMD ARGS -->`` ... ``<!-- /respo -->`` block of ``path`` in place,
    CMD one of `FILL_COMMANDS` (module docstring); returns how many blocks were filled."""
    import contextlib
    import shlex

    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise TableError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    out, i, n = [], 0, 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        head = line.strip()
        if not (head.startswith("<!-- respo ") and head.endswith("-->")):
            continue
        end = next((j for j in range(i, len(lines)) if lines[j].strip() == "<!-- /respo -->"), None)
        if end is None:
            raise TableError(f"{path}: line {i}: no closing <!-- /respo --> for {head}")
        argv = shlex.split(head[len("<!-- respo "):-len("-->")])
        if not argv or argv[0] not in FILL_COMMANDS or argv[:2] == ["table", "fill"]:
            raise TableError(f"{path}: line {i}: a block runs respo {' or respo '.join(FILL_COMMANDS)} (not fill), "
                             f"got: {' '.join(argv)}")
        buf, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
                args = _fill_parser().parse_args(argv)
                args.func(args)
        except SystemExit:
            raise TableError(f"{path}: line {i}: bad arguments: respo {' '.join(argv)}") from None
        except RespoError as e:
            raise TableError(f"{path}: line {i}: respo {argv[0]}: {e}") from None
        out += buf.getvalue().rstrip("\n").split("\n")
        out.append(lines[end])
        i, n = end + 1, n + 1
    write_text_atomic(path, "\n".join(out))
    return n


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", choices=("calib", "headline", "regime", "staleness", "replay", "factorial", "breakdown",
                                    "mismatch", "fill"),
                   help="calib: one row per run; staleness: per-staleness diagnostics per (model, objective, N, lr); "
                        "headline: objectives over seeds; regime: GRPO's log W spread per response length and lr "
                        "(LENGTH=runs.csv arguments); replay: each objective with MoE routing replay against without; "
                        "factorial: the 2 x 2 of ReSPO's and VESPO's branches, main effects and interaction over seeds; "
                        "breakdown: the seeds that broke down (docs/method.md) per (lr, N, objective); "
                        "mismatch: the engine–trainer mismatch next to the staleness per (lr, N, objective); "
                        "fill: regenerate the table blocks of "
                        "markdown files")
    p.add_argument("paths", nargs="+", help="runs.csv files and/or sweep or run directories (regime: LENGTH=runs.csv; "
                                            "fill: markdown files)")
    p.add_argument("--margin", type=float, default=MARGIN, help=f"equivalence margin δ of the headline table "
                   f"(default {MARGIN:g})")
    p.add_argument("--adjust", choices=("holm", "bh"), default="bh",
                   help="multiplicity adjustment within the headline table (default bh: Benjamini–Hochberg)")
    p.add_argument("--paired", action="store_true",
                   help="headline, factorial: pair each seed's arms (they share their first rollout step: the same seed "
                        "and starting policy, and where recorded the same first-step score, else refused) and use the "
                        "paired t-test over the seeds both ran instead of Welch's (the factorial kind always pairs)")
    p.add_argument("--starts-by-seed", action="store_true",
                   help="factorial, staleness, mismatch, headline --paired: pool seeds that started from different "
                        "policies as blocks, where all runs of each seed share one start (else refused); the table "
                        "names each start's seeds, and the factorial adds each start's mean contrasts as a description")
    p.add_argument("--missing-seeds", type=int, default=None, metavar="K",
                   help="factorial: for a study stopped K seeds short of its declared number, bound what those seeds "
                        "could have changed had they fallen within the range of the measured ones")
    p.add_argument("--cost", action="store_true", help="calib: also seconds per update and training seconds per update")
    p.add_argument("--metrics", default=",".join(FACTORIAL_DEFAULT),
                   help=f"factorial: the endpoints tested, any of {', '.join(FACTORIAL_METRICS)} (default "
                        f"{','.join(FACTORIAL_DEFAULT)}; the adjustment is over their contrasts only)")
    p.add_argument("--model", default="tiny-dense", help="only runs of this model (default tiny-dense)")
    p.add_argument("--group-size", type=int, default=8, help="only runs with this G (default 8)")
    p.add_argument("--objectives", default=None, help="comma-separated objectives to keep (default: all)")
    p.add_argument("--reuse", type=int, default=None, help="keep runs with this N only")
    p.add_argument("--lrs", default=None, help="comma-separated learning rates to keep (default: all)")
    p.add_argument("--updates", type=int, default=None, help="keep runs with this budget only")
    p.add_argument("--routing-replay", action="store_true",
                   help="keep the runs with MoE routing replay (default: the runs without; the replay kind takes both)")
    p.add_argument("--skip-missing", action="store_true",
                   help="leave out a finished run that lacks an endpoint (empty, nan or inf) the other runs of its cell "
                        "have, naming it under the table (default: refused, naming its file, line and column)")


def _select(rows: list[dict], args: argparse.Namespace) -> list[dict]:
    keep = [r for r in rows if r["model"] == args.model and r["group_size"] == args.group_size]
    if args.objectives:
        objs = set(args.objectives.split(","))
        keep = [r for r in keep if r["objective"] in objs]
    if args.reuse is not None:
        keep = [r for r in keep if r["reuse"] == args.reuse]
    if args.lrs:
        try:
            lrs = {float(x) for x in args.lrs.split(",")}
        except ValueError:
            raise TableError(f"--lrs: not a list of numbers: {args.lrs!r}") from None
        keep = [r for r in keep if r["lr"] in lrs]
    if args.updates is not None:
        keep = [r for r in keep if r["updates"] == args.updates]
    if args.kind != "replay":
        keep = [r for r in keep if bool(r["routing_replay"]) == args.routing_replay]
    if not keep:
        raise TableError("no run left after the --model/--group-size/--objectives/--reuse/--lrs/--updates/--routing-replay "
                         "selection")
    return keep


def _metrics(args: argparse.Namespace) -> tuple[str, ...]:
    """The factorial table's endpoints named by ``--metrics`` (unknown or repeated names raise `TableError`)."""
    names = tuple(m.strip() for m in args.metrics.split(","))
    unknown = [m for m in names if m not in FACTORIAL_METRICS]
    if unknown or not names or len(set(names)) != len(names):
        raise TableError(f"--metrics must name distinct endpoints among {', '.join(FACTORIAL_METRICS)}, "
                         f"got {args.metrics!r}")
    return names


def run(args: argparse.Namespace) -> int:
    """Print the table ``args.kind`` of the runs under ``args.paths``; bad input raises `TableError`."""
    if not args.margin > 0 or math.isinf(args.margin):
        raise TableError(f"--margin must be a positive number, got {args.margin}")
    if args.paired and args.kind not in ("headline", "factorial"):
        raise TableError(f"--paired applies to the headline and factorial tables, not to {args.kind}")
    if args.missing_seeds is not None:
        if args.kind != "factorial":
            raise TableError(f"--missing-seeds applies to the factorial table, not to {args.kind}")
        if args.missing_seeds < 1:
            raise TableError(f"--missing-seeds must be an integer >= 1, got {args.missing_seeds}")
    if args.cost and args.kind != "calib":
        raise TableError(f"--cost adds columns to the calib table only, not to {args.kind}")
    if args.metrics != ",".join(FACTORIAL_DEFAULT) and args.kind != "factorial":
        raise TableError(f"--metrics chooses the factorial table's endpoints, not the {args.kind} table's")
    if args.skip_missing and args.kind not in (*ENDPOINTS, "factorial"):
        raise TableError(f"--skip-missing applies to the tables that pool an endpoint over seeds "
                         f"({', '.join((*ENDPOINTS, 'factorial'))}), not to {args.kind}")
    if args.kind == "fill":
        for f in args.paths:
            print(f"{f}: {fill(Path(f))} table block(s) regenerated")
        return 0
    if args.kind == "regime":
        inputs, notes = [], []
        for spec in args.paths:
            length, sep, path = spec.partition("=")
            if not sep or not length.isdigit():
                raise TableError(f"expected LENGTH=RUNS_CSV (e.g. 128=runs.csv), got {spec!r}")
            rows, absent = read_rows([path])
            rows, left = endpoint_rule(_select(rows, args), ENDPOINTS["regime"], skip=args.skip_missing)
            inputs.append((int(length), rows, absent))
            notes += left
        print("\n".join(regime_table(inputs) + notes))
        return 0
    rows, absent = read_rows(args.paths)
    rows = _select(rows, args)
    endpoints = _metrics(args) if args.kind == "factorial" else ENDPOINTS.get(args.kind, ())
    rows, left = endpoint_rule(rows, endpoints, skip=args.skip_missing)
    note: list[str] = []
    by_start: dict[str, list[int]] = {}
    if args.starts_by_seed:
        if args.kind not in ("factorial", "staleness", "mismatch") and not (args.kind == "headline" and args.paired):
            raise TableError(f"--starts-by-seed pools seeds as blocks: it applies to the factorial, staleness and mismatch "
                             f"tables and to headline --paired, not to {args.kind}{' without --paired' * (args.kind == 'headline')}")
        by_start = starts_by_seed(rows)
        if args.kind == "factorial":  # name only the seeds its contrasts pool (factorial_table names the others)
            pooled = set().union(*_complete_seeds(group_rows(rows, ("lr", "reuse", "objective"))).values())
            note = _starts_note({start: kept for start, seeds in by_start.items()
                                 if (kept := [s for s in seeds if s in pooled])})
        else:
            note = _starts_note(by_start)
    elif args.kind != "calib":  # the other kinds pool runs over seeds
        _check_one_start(rows)
        note = _start_note(args)
    if args.kind == "replay":
        lines = replay_table(rows, margin=args.margin, method=args.adjust)
    elif args.kind == "factorial":
        lines = factorial_table(rows, margin=args.margin, method=args.adjust, metrics=_metrics(args),
                                starts=by_start, missing=args.missing_seeds or 0)
    elif args.kind == "breakdown":
        lines = breakdown_table(rows)
    elif args.kind == "mismatch":
        lines = mismatch_table(rows)
    elif args.kind == "calib":
        lines = calib_table(rows, absent, cost=args.cost)
    elif args.kind == "staleness":
        lines = staleness_tables(rows, absent)
    else:
        lines = headline_tables(rows, absent, margin=args.margin, method=args.adjust, paired=args.paired)
    print("\n".join(lines + note + left))
    return 0
