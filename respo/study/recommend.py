"""Which objective to use, per (response length, N) cell, from the sweeps' ``runs.csv`` files.

    respo recommend 32=reports/staleness/runs.csv 128=reports/long/main-128/runs.csv

A cell is one response length, one N and one budget (policy updates per run); runs of different
budgets are never pooled. In a cell each objective is taken at its own best learning rate (highest
mean late mean over seeds, among learning rates with at least ``min_seeds`` seeds), flagged ``edge``
when that rate is the lowest or highest it was run at (or the only one): its true best may lie
outside the grid. The cell's best is the objective with the highest such mean. Every other objective
is compared with it over seeds on the late mean and on held-out pass@1 (`respo.study.stats.compare`,
Welch's t); it is **worse** when either comparison has p <= 0.05 with a lower mean, and otherwise
**within noise** of the best. "Use" lists the best and those within noise of it.

Picking the best of several noisy means favours the luckiest (winner's curse), so a "best" that is
within noise of the runner-up is a tie, not a ranking; the table says which.
"""

from __future__ import annotations

import argparse
import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from respo.errors import RespoError
from respo.study.aggregate import nanmean
from respo.study.stats import Comparison, compare, format_p

__all__ = ["RecommendError", "Entry", "Cell", "load_rows", "recommend", "markdown", "add_arguments", "run"]

_NEEDED = ("objective", "reuse", "lr", "seed", "updates", "finished", "late_mean", "pass@1")


class RecommendError(RespoError):
    """A runs.csv that cannot be read as the sweeps write it."""


@dataclass
class Entry:
    """One objective of a cell at its own best learning rate."""

    objective: str
    lr: float
    late: list[float]
    pass1: list[float]
    edge: bool
    vs_best: dict[str, Comparison] = field(default_factory=dict)

    @property
    def late_mean(self) -> float:
        return nanmean(self.late)

    @property
    def worse(self) -> bool:
        return any(c.verdict == "a < b" for c in self.vs_best.values())


@dataclass
class Cell:
    length: int
    reuse: int
    updates: int
    entries: list[Entry]  # the best first, then by descending late mean
    unranked: list[str]  # objectives with too few seeds at every learning rate

    @property
    def best(self) -> Entry:
        return self.entries[0]

    @property
    def use(self) -> list[Entry]:
        return [e for e in self.entries if not e.worse]


def _truthy(v: str) -> bool:
    return str(v).strip().lower() in ("true", "1", "yes")


def load_rows(path: str | Path, *, length: int, model: str | None = None, group_size: int | None = None) -> list[dict]:
    """The finished runs of one ``runs.csv`` as rows for `recommend`; ``length`` labels them (response
    tokens). Runs with routing replay, or of another ``model`` / ``group_size`` when given, are left
    out; an aggregation override is part of the objective's name (``gspo@token-mean``)."""
    path = Path(path)
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            table, header = list(reader), reader.fieldnames or []
    except OSError as e:
        raise RecommendError(f"cannot read {path}: {e.strerror}") from None
    missing = [c for c in _NEEDED if c not in header]
    if missing:
        raise RecommendError(f"{path}: missing column(s) {', '.join(missing)}")
    rows = []
    for r in table:
        if not _truthy(r["finished"]) or _truthy(r.get("routing_replay", "")):
            continue
        if model is not None and r.get("model") != model:
            continue
        if group_size is not None and int(r.get("group_size") or 0) != group_size:
            continue
        agg = (r.get("loss_agg_mode") or "").strip()
        rows.append({"objective": r["objective"] + (f"@{agg}" if agg else ""), "lr": float(r["lr"]),
                     "seed": int(r["seed"]), "late_mean": float(r["late_mean"]), "pass@1": float(r["pass@1"]),
                     "reuse": int(r["reuse"]), "length": length, "updates": int(r["updates"])})
    return rows


def recommend(rows: Sequence[dict], *, min_seeds: int = 3) -> list[Cell]:
    """Group ``rows`` (keys of `load_rows`) into cells and rank them (module docstring)."""
    groups: dict[tuple, dict[str, dict[float, list[dict]]]] = {}
    for r in rows:
        key = (int(r["length"]), int(r["reuse"]), int(r["updates"]))
        groups.setdefault(key, {}).setdefault(r["objective"], {}).setdefault(float(r["lr"]), []).append(r)
    cells = []
    for (length, reuse, updates), by_obj in sorted(groups.items()):
        entries, unranked = [], []
        for obj, by_lr in sorted(by_obj.items()):
            ok = {lr: rs for lr, rs in by_lr.items() if len(rs) >= min_seeds}
            if not ok:
                unranked += [f"{obj} (lr {lr:g}, {len(rs)} seed{'s' * (len(rs) != 1)})" for lr, rs in sorted(by_lr.items())]
                continue
            lr = max(ok, key=lambda k: (nanmean(r["late_mean"] for r in ok[k]), -k))
            rs = ok[lr]
            entries.append(Entry(obj, lr, [r["late_mean"] for r in rs], [r["pass@1"] for r in rs],
                                 edge=len(ok) == 1 or lr in (min(ok), max(ok))))
        if not entries:
            continue
        entries.sort(key=lambda e: (-e.late_mean, e.objective))
        best = entries[0]
        for e in entries[1:]:
            e.vs_best = {"late mean": compare(e.late, best.late), "pass@1": compare(e.pass1, best.pass1)}
        cells.append(Cell(length, reuse, updates, entries, unranked))
    return cells


def _label(e: Entry) -> str:
    return f"{e.objective} ({e.lr:g}{', edge' if e.edge else ''})"


def markdown(cells: Sequence[Cell]) -> str:
    """The recommendation table: per cell the best (its own lr; ``edge`` flagged), its late mean and
    pass@1 (mean over seeds), the objectives within noise of it, and those significantly worse with
    the difference of late means and the smaller p of the two tests."""
    out = ["| response tokens | N | rollout steps | best | late mean / pass@1 | within noise of the best | "
           "significantly worse (late mean difference, p) |", "|" + "---|" * 7]
    for c in cells:
        b = c.best
        ties = ", ".join(_label(e) for e in c.entries[1:] if not e.worse) or "—"
        losses = []
        for e in c.entries[1:]:
            if e.worse:
                p = min(cmp.p for cmp in e.vs_best.values() if cmp.verdict == "a < b")
                losses.append(f"{_label(e)}: late mean {e.vs_best['late mean'].diff:+.3f}, p = {format_p(p)}")
        extra = f" (too few seeds: {', '.join(c.unranked)})" if c.unranked else ""
        steps = c.updates / c.reuse
        out.append(f"| {c.length} | {c.reuse} | {steps:g} | {_label(b)} | {b.late_mean:.3f} / {nanmean(b.pass1):.3f} | "
                   f"{ties} | {'; '.join(losses) or '—'}{extra} |")
    return "\n".join(out)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", metavar="LENGTH=RUNS_CSV",
                   help="response length (tokens) and a runs.csv written by respo report, e.g. 128=runs.csv")
    p.add_argument("--model", default="tiny-dense", help="only runs of this model (default tiny-dense)")
    p.add_argument("--group-size", type=int, default=8, help="only runs with this G (default 8)")
    p.add_argument("--min-seeds", type=int, default=3, help="seeds an objective needs at a learning rate (default 3)")


def run(args: argparse.Namespace) -> int:
    """Print the recommendation table of ``args.inputs``; bad input raises `RecommendError`."""
    rows = []
    for spec in args.inputs:
        length, sep, path = spec.partition("=")
        if not sep or not length.isdigit():
            raise RecommendError(f"expected LENGTH=RUNS_CSV (e.g. 128=runs.csv), got {spec!r}")
        rows += load_rows(path, length=int(length), model=args.model, group_size=args.group_size)
    if not rows:
        raise RecommendError(f"no finished {args.model} runs with G = {args.group_size} in {', '.join(args.inputs)}")
    print(markdown(recommend(rows, min_seeds=args.min_seeds)))
    return 0
