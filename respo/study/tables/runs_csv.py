"""``runs.csv``: one row per run (`COLUMNS`; the columns are described in `respo.study.tables`), computed
from a run directory (`run_row`), written whole (`write_runs_csv`) and read back (`read_rows`), with the checks
every table relies on: a finished row's log is whole, a finished run counts once (`_SEED_KEY`), and a finished
run that lacks an endpoint its cell's other runs have is refused or left out by name (`endpoint_rule`)."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Iterable, Sequence

from respo.errors import RespoError
from respo.fileio import write_text_atomic
from respo.study.aggregate import Run, early_max, greedy_acc, late_mean, load_runs, nanmean, pass_at_1, \
    pooled_low_fraction, run_mean
from respo.train.config import rule
from respo.train.scores import early_count, late_count

__all__ = ["COLUMNS", "CSV_METRICS", "CSV_SAME_BATCH", "CSV_MISMATCH", "STALENESS_METRICS", "STALENESS_SHARES",
           "EDGE_UPDATES", "WHERE", "TableError", "run_row", "write_runs_csv", "read_rows", "endpoint_gaps",
           "endpoint_rule"]

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
    """The runs.csv row of one run (`COLUMNS`; `respo.study.tables`), numbers as floats (NaN when absent)."""
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
