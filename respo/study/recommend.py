"""Which objective to use, per (response length, N) cell, from the sweeps' ``runs.csv`` files.

    respo recommend 32=reports/staleness/runs.csv 128=reports/long/main-128/runs.csv

A cell is one response length, one starting policy, one N and one budget (policy updates per run);
runs of different budgets are never pooled. ``LENGTH:START=RUNS_CSV`` names the starting policy of a
file's runs (``128:rebuilt=runs.csv``): files of one length with different START labels are separate
cells. Runs that record their starting policy's weights (the ``start`` column) are never pooled with
runs of other weights in one cell: that is refused in one line, naming both rows, until a START label
separates them. A cell pooled from several files whose runs do not all record their weights (files
written before the column, or runs of a preset) cannot show one starting policy: it is labelled so under the
table. In a cell each objective is taken at its own best learning rate (highest
mean late mean over seeds, among learning rates with at least ``--min-seeds`` seeds), flagged
``edge`` when that rate is the lowest or highest it was run at (or the only one): its true best may
lie outside the grid. The cell's best is the objective with the highest such mean. Every other
objective is compared with it over seeds, on the late mean and on held-out pass@1 separately, by
Welch's two-sided t-test (`respo.study.stats`; it assumes normal per-seed values, and with three
seeds a side no rank test could reach p < .10 instead). Both p values are printed, raw and adjusted
for the other tests of the same cell, both metrics together (Benjamini–Hochberg by default,
``--adjust holm`` for Holm; ``--family table`` adjusts over every test of the table instead), and
the verdicts use the adjusted ones. A cell is the family by default because each cell answers its
own question (which objective at this length and N), and its verdicts should not change when
another study's runs.csv is added to the command line; a claim across cells ("in every cell")
needs ``--family table``. The verdicts:

  worse / better                the adjusted two-sided p <= .05
  equivalent within ±δ          two one-sided tests against the margin δ (``--margin``), adjusted
                                the same way, both reject: the 90 % CI lies inside ±δ
  no difference detected (95 % CI lo, hi)   neither: absence of evidence, not a tie
  no test (n = k)               a side has fewer than two seeds

Winner's curse: each objective's learning rate and the cell's best are picked on the same seeds
they are then tested on, which favours the picked ones; the output says so. ``--select-seeds``
picks them on some seeds and tests on the others (held out) instead.

The LENGTH label is checked against the runs: a file whose runs record a mean response length (runs.csv's
``response_length``, median over its runs) more than a quarter away from LENGTH is refused, naming the length
they record. A finished row whose log holds fewer update records than its updates (``updates_logged``) is
refused: its scores were computed on a damaged log.

A seed counts once: two finished rows with the same objective, learning rate and seed in one cell
(length, N, budget) are refused, naming both rows (run names are no key: a sweep's names recur in
other studies). The same runs continued to a longer budget (another cell) are not duplicates, but
the two cells share their seeds' history: they are not independent evidence.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from respo.errors import RespoError
from respo.study.aggregate import first_step_problem, nanmean
from respo.study.stats import ADJUST_METHODS, Judged, format_p, judge

__all__ = ["RecommendError", "Test", "Entry", "Cell", "load_rows", "check_length", "start_unshown", "recommend", "markdown",
           "add_arguments", "run", "DEFAULT_MARGIN", "METRICS", "LENGTH_TOLERANCE"]

_NEEDED = ("objective", "reuse", "lr", "seed", "updates", "finished", "late_mean", "pass@1")
#: The two metrics every objective is compared with the best on.
METRICS = ("late mean", "pass@1")
#: Equivalence margin δ on the 0–1 score (see ``--margin``'s help).
DEFAULT_MARGIN = 0.03
_FAMILIES = ("table", "cell")


class RecommendError(RespoError):
    """A runs.csv that cannot be read as the sweeps write it, or rows that would count a seed twice."""


#: One comparison of an objective with its cell's best on one metric (`respo.study.stats.judge`).
Test = Judged


@dataclass
class Entry:
    """One objective of a cell at its own best learning rate (values over the tested seeds)."""

    objective: str
    lr: float
    late: list[float]
    pass1: list[float]
    edge: bool
    vs_best: dict[str, Test] = field(default_factory=dict)
    rows: list[dict] = field(default_factory=list)  # the tested rows (seeds), for a paired test

    @property
    def late_mean(self) -> float:
        return nanmean(self.late)

    @property
    def worse(self) -> bool:
        return any(t.verdict.startswith("worse") for t in self.vs_best.values())

    @property
    def tested(self) -> bool:
        """Compared with the best on both metrics (two seeds or more on each side)."""
        return bool(self.vs_best) and all(t.tested for t in self.vs_best.values())


@dataclass
class Cell:
    length: int
    reuse: int
    updates: int
    entries: list[Entry]  # the best first, then by descending late mean; empty when none has enough seeds
    unranked: list[str]  # objectives with too few seeds at every learning rate
    runs: frozenset = frozenset()  # (objective, lr, seed) of every finished run in the cell
    start: str = ""  # the starting policy's label (LENGTH:START=RUNS_CSV); empty when not given
    #: the files of a cell pooled from several files whose runs do not all record their starting policy
    #: (`start_unshown`); empty when one starting policy is shown (or the cell is one file's)
    unshown: tuple = ()

    @property
    def tokens(self) -> str:
        """The response length, with the starting policy's label when there is one."""
        return f"{self.length} ({self.start})" if self.start else str(self.length)

    @property
    def best(self) -> Entry | None:
        return self.entries[0] if self.entries else None

    @property
    def use(self) -> list[Entry]:
        """The best and those tested against it and not shown worse on either metric."""
        return self.entries[:1] + [e for e in self.entries[1:] if e.tested and not e.worse]


_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no", "")


def _flag(r: dict, col: str, where: str) -> bool:
    """A true/false column (absent or empty: false); anything else is a one-line error naming the row."""
    raw = (r.get(col) or "").strip()
    if raw.lower() not in _TRUE + _FALSE:
        raise RecommendError(f"{where}: {col} {raw!r} is not true or false")
    return raw.lower() in _TRUE


def _number(r: dict, col: str, where: str, kind: type = float) -> float | int:
    """``r[col]`` as a finite number (``kind`` int or float), or a one-line error naming the row."""
    raw = (r.get(col) or "").strip()
    try:
        x = float(raw)
    except ValueError:
        raise RecommendError(f"{where}: {col} {raw!r} is not a number") from None
    if not math.isfinite(x):
        raise RecommendError(f"{where}: {col} {raw!r} is not a finite number")
    if kind is int:
        if x != int(x):
            raise RecommendError(f"{where}: {col} {raw!r} is not a whole number")
        return int(x)
    return x


def _score_list(raw: str, where: str) -> list[float]:
    """A JSON list of numbers (runs.csv's ``step_scores``), null entries read as NaN."""
    try:
        return [math.nan if x is None else float(x) for x in json.loads(raw)]
    except (ValueError, TypeError):
        raise RecommendError(f"{where}: step_scores {raw[:40]!r} is not a list of numbers") from None


#: How far a file's recorded response length (the median over its runs of each run's mean response length,
#: runs.csv's ``response_length``) may lie from its LENGTH label, as a share of the label: the committed
#: 128-token cells record 118.7 to 128.2 tokens (7 % below), a 32-token label on them would be 300 % off.
LENGTH_TOLERANCE = 0.25


def check_length(rows: Sequence[dict], length: int, spec: str) -> None:
    """Refuse a LENGTH label that the rows' recorded response lengths contradict: their median differs from
    ``length`` by more than `LENGTH_TOLERANCE` of it. Rows that record no length (runs.csv files written
    before the column) cannot be checked and pass."""
    lengths = sorted(r["response_length"] for r in rows if math.isfinite(r.get("response_length", math.nan)))
    if not lengths:
        return
    n = len(lengths)
    median = lengths[n // 2] if n % 2 else (lengths[n // 2 - 1] + lengths[n // 2]) / 2
    if abs(median - length) > LENGTH_TOLERANCE * length:
        path = spec.partition("=")[2]
        raise RecommendError(f"{spec}: labelled {length} response tokens, but its runs record a mean response length "
                             f"of {median:.1f} tokens (median over {n} run{'s' * (n != 1)}); label it with its own "
                             f"length (e.g. {round(median)}={path})")


def load_rows(path: str | Path, *, length: int, model: str | None = None, group_size: int | None = None,
              routing_replay: bool = False, start: str = "") -> list[dict]:
    """The finished runs of one ``runs.csv`` as rows for `recommend`; ``length`` labels them (response
    tokens), ``start`` their starting policy (a label; the file's ``start`` column, where it has one,
    is kept as each row's ``weights``). Runs with routing replay (without it when ``routing_replay``), or of another ``model`` /
    ``group_size`` when given, are left out; an aggregation override is part of the objective's name (``gspo@token-mean``). Each row
    keeps its ``run`` name and ``where`` (file and line), which `recommend`'s duplicate check names. A file
    that is not UTF-8 CSV, is empty, lacks a column or has a non-numeric value raises `RecommendError`
    in one line naming the file (and the line)."""
    path = Path(path)
    rows = []
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:  # a leading BOM is not part of the header
            reader = csv.DictReader(f)
            header = reader.fieldnames
            if header is None:
                raise RecommendError(f"{path}: empty file (no header row, no runs)")
            missing = [c for c in _NEEDED if c not in header]
            if missing:
                raise RecommendError(f"{path}: missing column(s) {', '.join(missing)}")
            for col, want in (("model", model), ("group_size", group_size)):
                if want is not None and col not in header:
                    raise RecommendError(f"{path}: no {col} column to select {col} = {want} by")
            for r in reader:
                where = f"{path} line {reader.line_num}"
                if None in r:  # DictReader's key for fields beyond the header
                    raise RecommendError(f"{where}: {len(r[None])} more fields than the header")
                short = sum(v is None for v in r.values())
                if short:
                    raise RecommendError(f"{where}: {short} field{'s' * (short != 1)} fewer than the header")
                if not _flag(r, "finished", where) or _flag(r, "routing_replay", where) != routing_replay:
                    continue
                if model is not None and r.get("model") != model:
                    continue
                if group_size is not None and _number(r, "group_size", where, int) != group_size:
                    continue
                if "updates_logged" in header and _number(r, "updates_logged", where, int) != _number(
                        r, "updates", where, int):
                    raise RecommendError(f"{where}: run {r.get('run') or '?'} finished at update {r['updates']} but "
                                         f"its log holds {r['updates_logged']} update record(s): its windows were "
                                         "computed on a damaged log")
                agg = (r.get("loss_agg_mode") or "").strip()
                rows.append({"objective": r["objective"] + (f"@{agg}" if agg else ""),
                             "lr": _number(r, "lr", where), "seed": _number(r, "seed", where, int),
                             "late_mean": _number(r, "late_mean", where), "pass@1": _number(r, "pass@1", where),
                             "reuse": _number(r, "reuse", where, int), "length": length, "start": start,
                             "weights": (r.get("start") or "").strip(),
                             "engine": (r.get("engine") or "").strip() or "respo",  # before the column: respo's
                             "updates": _number(r, "updates", where, int), "run": r.get("run") or "",
                             "where": where})
                if (r.get("response_length") or "").strip():  # recorded since runs.csv has the column
                    rows[-1]["response_length"] = _number(r, "response_length", where)
                if (r.get("step_scores") or "").strip() not in ("", "[]"):  # N > 1, since runs.csv has the column
                    rows[-1]["step_scores"] = _score_list(r["step_scores"], where)
    except OSError as e:
        raise RecommendError(f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise RecommendError(f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})") from None
    except csv.Error as e:
        raise RecommendError(f"{path}: not a CSV file ({e})") from None
    return rows


def _cell_key(r: dict) -> tuple:
    return int(r["length"]), r.get("start", ""), int(r["reuse"]), int(r["updates"])


def _where_cell(r: dict) -> str:
    start = f", start {r['start']}" if r.get("start") else ""
    return f"{r['length']} tokens{start}, N = {r['reuse']}, {r['updates']} updates"


def _check_starts(rows: Sequence[dict]) -> None:
    """Refuse to pool two starting policies in one cell: rows whose recorded weights (``start`` column)
    differ, unless their files carry different START labels (which makes them different cells); and rows
    of two rollout engines (``engine`` column) likewise."""
    engines: dict[tuple, dict] = {}
    for r in rows:  # two rollout engines: different sampling and evaluation distributions, never one cell
        e = engines.setdefault(_cell_key(r), r)
        if e.get("engine", "respo") != r.get("engine", "respo"):
            raise RecommendError(f"two rollout engines in one cell ({_where_cell(r)}): {e.get('engine', 'respo')} in "
                                 f"{e.get('where', 'a row')} and {r.get('engine', 'respo')} in {r.get('where', 'another row')}; "
                                 "give each file its own label (LENGTH:START=RUNS_CSV) so they are compared separately")
    first: dict[tuple, dict] = {}
    for r in rows:
        if not r.get("weights"):
            continue
        a = first.setdefault(_cell_key(r), r)
        if a["weights"] != r["weights"]:
            raise RecommendError(f"two starting policies in one cell ({_where_cell(r)}): weights {a['weights']} in "
                                 f"{a.get('where', 'a row')} and {r['weights']} in {r.get('where', 'another row')}; "
                                 f"give each file its own label (LENGTH:START=RUNS_CSV, e.g. {r['length']}:rebuilt=...) "
                                 "so they are compared separately")


def _file(r: dict) -> str:
    return str(r.get("where", "")).rsplit(" line ", 1)[0]


def start_unshown(rows: Sequence[dict]) -> tuple[str, ...]:
    """The files of rows pooled from several files whose runs cannot show one starting policy: the files
    whose rows do not all record their weights (an empty or absent ``start`` column), when the rows come
    from more than one file. Such a cell is labelled (two recorded starts are refused instead)."""
    files = sorted({_file(r) for r in rows})
    if len(files) < 2:
        return ()
    return tuple(f for f in files if any(not r.get("weights") for r in rows if _file(r) == f))


def _check_duplicates(rows: Sequence[dict]) -> None:
    """Refuse a seed counted twice: the same objective, learning rate and seed twice in one cell
    (response length, starting policy, N, budget). Run names are not the key: they are unique only within one sweep
    (two studies at different lengths reuse them), and a copy under other names is the same seed."""
    seen: dict[tuple, dict] = {}
    for r in rows:
        key = (*_cell_key(r), r["objective"], float(r["lr"]), int(r["seed"]))
        first = seen.setdefault(key, r)
        if first is not r:
            a, b = first.get("where", "a row"), r.get("where", "another row")
            raise RecommendError(f"duplicate run: {r['objective']} lr {float(r['lr']):g} seed {r['seed']} "
                                 f"({_where_cell(r)}) is in {a} and in "
                                 f"{b} (was a runs.csv given twice?); each seed may count once")


def _pick(by_lr: dict[float, list[dict]], min_seeds: int, select: set[int] | None):
    """An objective's best learning rate as (lr, the rows tested there, the mean late mean it was
    picked by, edge), and None; or None and why no learning rate qualifies."""
    def split(rs):  # (rows the pick is made on, rows tested)
        if select is None:
            return rs, rs
        return [r for r in rs if r["seed"] in select], [r for r in rs if r["seed"] not in select]

    parts = {lr: split(rs) for lr, rs in by_lr.items()}
    ok = {lr: (on, tested) for lr, (on, tested) in parts.items() if on and len(tested) >= min_seeds}
    if not ok:
        return None, [f"lr {lr:g}: {len(t)} seed{'s' * (len(t) != 1)}" for lr, (_, t) in sorted(parts.items())]
    score = {lr: nanmean(r["late_mean"] for r in on) for lr, (on, _) in ok.items()}
    lr = max(ok, key=lambda k: (score[k], -k))
    return (lr, ok[lr][1], score[lr], len(ok) == 1 or lr in (min(ok), max(ok))), None


def _by_seed(e: Entry, best: Entry, key: str) -> tuple[list[float], list[float]]:
    """An entry's and its cell's best's values of ``key`` on the seeds both were tested on, aligned by seed;
    each seed's two runs must have shared their first rollout step (`respo.study.aggregate.first_step_problem`,
    on the recorded weights and first-step score)."""
    def as_row(r):
        return {"seed": r["seed"], "start": r.get("weights", ""), "step_scores": r.get("step_scores", []),
                "run": r.get("run") or r.get("where", "a row")}

    a_by, b_by = {r["seed"]: r for r in e.rows}, {r["seed"]: r for r in best.rows}
    seeds = sorted(set(a_by) & set(b_by))
    for seed in seeds:
        problem = first_step_problem(as_row(a_by[seed]), as_row(b_by[seed]))
        if problem:
            raise RecommendError(f"--paired: seed {seed} of {e.objective} and {best.objective} did not share their "
                                 f"first rollout step ({problem}); compare them unpaired")
    return [a_by[s][key] for s in seeds], [b_by[s][key] for s in seeds]


def recommend(rows: Sequence[dict], *, min_seeds: int = 3, margin: float | None = DEFAULT_MARGIN,
              method: str = "bh", family: str = "cell", select_seeds: Sequence[int] | None = None,
              paired: bool = False) -> list[Cell]:
    """Group ``rows`` (keys of `load_rows`) into cells, rank them, test every objective against its
    cell's best on both metrics and adjust the p values (module docstring). ``margin`` None skips
    the equivalence tests; ``select_seeds`` picks learning rates and the best on those seeds and
    tests on the others; ``paired`` tests with the paired t-test over the seeds both ran (each seed's
    runs share their first rollout step) instead of Welch's. Raises `RecommendError` when a seed would
    count twice or, with ``paired``, when a seed's two runs did not share their first rollout step."""
    if min_seeds < 1:
        raise RecommendError(f"--min-seeds must be at least 1, got {min_seeds}")
    if margin is not None and not (margin > 0 and math.isfinite(margin)):
        raise RecommendError(f"--margin must be a positive number, got {margin}")
    if method not in ADJUST_METHODS:
        raise RecommendError(f"--adjust must be one of {', '.join(ADJUST_METHODS)}, got {method!r}")
    if family not in _FAMILIES:
        raise RecommendError(f"--family must be one of {', '.join(_FAMILIES)}, got {family!r}")
    _check_duplicates(rows)
    _check_starts(rows)
    select = None if select_seeds is None else {int(s) for s in select_seeds}
    groups: dict[tuple, dict[str, dict[float, list[dict]]]] = {}
    for r in rows:
        groups.setdefault(_cell_key(r), {}).setdefault(r["objective"], {}).setdefault(float(r["lr"]), []).append(r)
    cells = []
    for (length, start, reuse, updates), by_obj in sorted(groups.items()):
        ranked, unranked = [], []
        for obj, by_lr in sorted(by_obj.items()):
            pick, why = _pick(by_lr, min_seeds, select)
            if pick is None:
                unranked.append(f"{obj} ({'; '.join(why)})")
                continue
            lr, rs, select_mean, edge = pick
            ranked.append((select_mean, Entry(obj, lr, [r["late_mean"] for r in rs], [r["pass@1"] for r in rs], edge,
                                              rows=list(rs))))
        ranked.sort(key=lambda x: (-x[0], x[1].objective))
        entries = [e for _, e in ranked]
        runs = frozenset((obj, lr, r["seed"]) for obj, by_lr in by_obj.items() for lr, rs in by_lr.items() for r in rs)
        cell_rows = [r for by_lr in by_obj.values() for rs in by_lr.values() for r in rs]
        cells.append(Cell(length, reuse, updates, entries, unranked, runs, start, start_unshown(cell_rows)))
    for fam in [cells] if family == "table" else [[c] for c in cells]:  # each family: both metrics together
        slots = [(e, m, *(_by_seed(e, c.best, key) if paired else (e.late, c.best.late) if key == "late_mean" else
                          (e.pass1, c.best.pass1)))
                 for c in fam for e in c.entries[1:] for m, key in (("late mean", "late_mean"), ("pass@1", "pass@1"))]
        for (e, m, _, _), j in zip(slots, judge([(a, b) for _, _, a, b in slots], margin=margin, method=method,
                                                 paired_by_seed=paired)):
            e.vs_best[m] = j
    return cells


def _label(e: Entry) -> str:
    return f"{e.objective} ({e.lr:g}{', edge' if e.edge else ''})"


def _n_tests(cells: Sequence[Cell]) -> int:
    return sum(not math.isnan(t.p) for c in cells for e in c.entries for t in e.vs_best.values())


def _steps(c: Cell) -> str:
    return f"{c.updates / c.reuse:g}"


def markdown(cells: Sequence[Cell], *, margin: float | None = DEFAULT_MARGIN, method: str = "bh",
             family: str = "cell", min_seeds: int = 3, select_seeds: Sequence[int] | None = None,
             paired: bool = False) -> str:
    """What ``respo recommend`` prints: how the p values and verdicts are made, then one row per
    objective and cell (late mean and pass@1: mean over tested seeds, difference from the best, raw
    and adjusted p, verdict), a summary per cell, and why a cell has no verdict. The keywords must
    be the ones `recommend` was called with."""
    per_cell = [_n_tests([c]) for c in cells if _n_tests([c])]
    fam = (f"all the two-sided tests of this table ({_n_tests(cells)} with a p" if family == "table" else
           f"the two-sided tests of each cell ({min(per_cell, default=0)}–{max(per_cell, default=0)} with a p")
    test = ("the paired two-sided t-test over the seeds both ran (each seed's runs share their first rollout step; "
            "Δ is the mean of the per-seed differences) of each objective against its cell's best, late mean and "
            "held-out pass@1 separately (assumes normal differences)" if paired else
            "Welch's two-sided t-test over seeds of each objective against its cell's best, late mean and held-out "
            "pass@1 separately (assumes normal per-seed values)")
    out = [f"p: {test}; adj. p: {ADJUST_METHODS[method]} adjustment over "
           f"{fam}, both metrics together); "
           "verdicts use the adjusted p.",
           f"Equivalence margin δ = ±{margin:g}: \"equivalent\" only where two one-sided tests against ±δ (TOST, "
           "adjusted the same way) both reject; otherwise \"no difference detected\" with the unadjusted 95 % CI of "
           "the difference, which is not a tie." if margin is not None else
           "No equivalence margin (--margin 0): nothing is called equivalent; \"no difference detected\" is not a tie.",
           ("Winner's curse: each objective's learning rate and the cell's best are picked on the same seeds they are "
            "then tested on, which favours the picked ones; a p near .05 is weaker than it looks (--select-seeds "
            "holds seeds out)." if select_seeds is None else
            f"Held-out seeds: learning rates and the best picked on seed{'s' * (len(set(select_seeds)) != 1)} "
            f"{', '.join(map(str, sorted(set(select_seeds))))}, "
            "tested (and averaged) on the other seeds."), ""]
    head = ["response tokens", "N", "rollout steps", "objective (lr)", "seeds"]
    for m in METRICS:
        head += [m, f"Δ {m}", f"p ({m})", "adj. p", f"{m} vs best" + (f" (δ = ±{margin:g})" if margin else "")]
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cells:
        for i, e in enumerate(c.entries):
            row = [c.tokens, str(c.reuse), _steps(c), _label(e) + (" **best**" if i == 0 else ""), str(len(e.late))]
            for m, vals in zip(METRICS, (e.late, e.pass1)):
                t = e.vs_best.get(m)
                if t is None:
                    row += [f"{nanmean(vals):.3f}", "—", "—", "—", "best"]
                else:
                    row += [f"{nanmean(vals):.3f}", f"{t.diff:+.3f}", format_p(t.p), format_p(t.p_adj), t.verdict]
            out.append("| " + " | ".join(row) + " |")
    out += ["", "| response tokens | N | rollout steps | best: late mean / pass@1 | not shown worse on either metric | "
            "worse on either metric (adj. p late mean / pass@1) | no test (n < 2) |", "|" + "---|" * 7]
    notes = []
    for c in cells:
        where = f"{c.tokens} tokens, N = {c.reuse}, {_steps(c)} rollout steps"
        if not c.entries:
            notes.append(f"- {where}: no objective has {min_seeds} seed{'s' * (min_seeds != 1)} at one learning rate, "
                         f"so nothing is ranked or tested: {'; '.join(c.unranked)}.")
            continue
        b, rest = c.best, c.entries[1:]
        worse = [f"{_label(e)} ({format_p(e.vs_best['late mean'].p_adj)} / {format_p(e.vs_best['pass@1'].p_adj)})"
                 for e in rest if e.worse]
        cols = [", ".join(_label(e) for e in rest if e.tested and not e.worse), "; ".join(worse),
                ", ".join(_label(e) for e in rest if not e.tested and not e.worse)]
        out.append(f"| {c.tokens} | {c.reuse} | {_steps(c)} | {_label(b)}: {b.late_mean:.3f} / {nanmean(b.pass1):.3f} "
                   f"| " + " | ".join(x or "—" for x in cols) + " |")
        if len(c.entries) == 1:
            notes.append(f"- {where}: only {b.objective} has {min_seeds} seed{'s' * (min_seeds != 1)} at one learning "
                         "rate, so there is nothing to compare it with.")
        if c.unranked:
            notes.append(f"- {where}: not ranked, fewer than {min_seeds} seed{'s' * (min_seeds != 1)} at every learning "
                         f"rate: {'; '.join(c.unranked)}.")
    if not any(c.entries for c in cells):
        notes.insert(0, f"- No cell has an objective with {min_seeds} seeds at one learning rate: the table is empty "
                        "(--min-seeds lowers the bar; a test needs 2 seeds a side).")
    for i, c in enumerate(cells):
        for d in cells[i + 1:]:
            shared = len(c.runs & d.runs) if (c.length, c.start, c.reuse) == (d.length, d.start, d.reuse) else 0
            if shared:
                notes.append(f"- {c.tokens} tokens, N = {c.reuse}: the {_steps(c)}- and {_steps(d)}-rollout-step cells "
                             f"share {shared} objective/lr/seed combination{'s' * (shared != 1)}; if the longer runs "
                             "continue the shorter ones, the two cells are not independent evidence.")
    for c in cells:
        if c.unshown:
            notes.append(f"- {c.tokens} tokens, N = {c.reuse}, {_steps(c)} rollout steps: pooled from several runs.csv "
                         f"files, and {', '.join(c.unshown)} record{'s' * (len(c.unshown) == 1)} no starting policy "
                         f"(`start`) for {'its' if len(c.unshown) == 1 else 'their'} runs, so one starting policy is not shown: the cell may pool warm "
                         "starts that differ.")
    if any(min(len(e.late) for e in c.entries) < 2 for c in cells if c.entries):
        notes.append("- no test (n = 1): with one seed on a side there is no variance and no test, so no verdict.")
    return "\n".join(out + ([""] + notes if notes else []))


def _seeds(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated seeds like 0,1, got {text!r}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", metavar="LENGTH[:START]=RUNS_CSV",
                   help="response length (tokens) and a runs.csv written by respo report, e.g. 128=runs.csv; "
                        "START labels the runs' starting policy (128:rebuilt=runs.csv): files of one length with "
                        "different labels are separate cells")
    p.add_argument("--model", default="tiny-dense", help="only runs of this model (default tiny-dense)")
    p.add_argument("--group-size", type=int, default=8, help="only runs with this G (default 8)")
    p.add_argument("--routing-replay", action="store_true",
                   help="rank the runs with MoE routing replay (default: the runs without it)")
    p.add_argument("--min-seeds", type=int, default=3,
                   help="seeds an objective needs at a learning rate to be ranked (default 3; a test needs 2)")
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                   help=f"equivalence margin δ on the 0-1 score, for late mean and pass@1 alike (default "
                        f"{DEFAULT_MARGIN:g}, 3 points: about one seed-to-seed standard deviation of a single run in "
                        "the committed studies, .016-.033 late mean, a difference too small to change the choice of "
                        "objective). With 3 seeds a side TOST can show ±0.03 only when the seeds' standard deviation "
                        "is below about .017 (the 90 %% CI half-width is 2.13·SD·√(2/3) at equal spreads), so expect "
                        "'no difference detected' rather than 'equivalent'. 0 turns equivalence tests off")
    p.add_argument("--adjust", choices=sorted(ADJUST_METHODS), default="bh",
                   help="multiplicity adjustment: bh = Benjamini-Hochberg (false discovery rate, default), "
                        "holm = Holm (family-wise error rate)")
    p.add_argument("--family", choices=_FAMILIES, default="cell",
                   help="the p values adjusted together: each cell's tests (default: a cell answers its own question, "
                        "and its verdicts do not change when other studies are added) or every test of the table "
                        "(for claims across cells)")
    p.add_argument("--paired", action="store_true",
                   help="pair each seed's runs (they share their first rollout step: the same seed and recorded "
                        "weights, and the same first-step score where recorded, else refused) and use the paired "
                        "t-test over the seeds both ran instead of Welch's")
    p.add_argument("--select-seeds", type=_seeds, default=None, metavar="S,S",
                   help="pick learning rates and the best on these seeds and test on the others (held out), "
                        "instead of testing on the seeds the picks were made on (winner's curse)")


def run(args: argparse.Namespace) -> int:
    """Print the recommendation of ``args.inputs``; bad input raises `RecommendError`."""
    rows = []
    for spec in args.inputs:
        head, sep, path = spec.partition("=")
        length, colon, start = head.partition(":")
        if not sep or not length.isdigit() or (colon and not start.strip()):
            raise RecommendError(f"expected LENGTH=RUNS_CSV or LENGTH:START=RUNS_CSV (e.g. 128=runs.csv, "
                                 f"128:rebuilt=runs.csv), got {spec!r}")
        got = load_rows(path, length=int(length), model=args.model, group_size=args.group_size,
                        routing_replay=args.routing_replay, start=start.strip())
        check_length(got, int(length), spec)
        rows += got
    if not rows:
        raise RecommendError(f"no finished {args.model} runs with G = {args.group_size}"
                             f"{' and routing replay' if args.routing_replay else ''} in {', '.join(args.inputs)}")
    if args.margin < 0 or not math.isfinite(args.margin):
        raise RecommendError(f"--margin must be a positive number or 0 (off), got {args.margin}")
    kw = dict(margin=args.margin or None, method=args.adjust, family=args.family, select_seeds=args.select_seeds,
              paired=args.paired)
    cells = recommend(rows, min_seeds=args.min_seeds, **kw)
    print(markdown(cells, min_seeds=args.min_seeds, **kw))
    return 0
