"""Which rows a table pools, and the checks on pooling them over seeds: the selection flags (`_select`), one
starting policy and one rollout engine per table (`_check_one_start`), or seeds of several starting policies
pooled as blocks (``--starts-by-seed``, `starts_by_seed`), and the notes saying so under a table."""

from __future__ import annotations

import argparse
from typing import Sequence

from respo.study.tables.registry import KINDS, TableKind
from respo.study.tables.runs_csv import TableError, read_rows

__all__ = ["seed_list", "starts_by_seed", "pool"]

#: ``--starts-by-seed`` given to a kind that does not pool seeds as blocks (`TableKind.starts_by_seed`).
_BLOCKS_REFUSAL = ("--starts-by-seed pools seeds as blocks: it applies to the factorial, staleness and mismatch tables "
                   "and to headline --paired, not to {kind}")


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
    if not KINDS[args.kind].replay_both:
        keep = [r for r in keep if bool(r["routing_replay"]) == args.routing_replay]
    if not keep:
        raise TableError("no run left after the --model/--group-size/--objectives/--reuse/--lrs/--updates/--routing-replay "
                         "selection")
    return keep


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


def pool(kind: TableKind, rows: list[dict], args: argparse.Namespace) -> tuple[dict[str, list[int]], list[str]]:
    """The checks on pooling a kind's selected ``rows`` over seeds, and the note for under its table. With
    ``--starts-by-seed``: each starting policy's seeds (`starts_by_seed`; a kind that does not pool seeds as
    blocks refuses it). Otherwise, for a kind that pools: one starting policy and one engine (`_check_one_start`)
    and the label of a table pooled from inputs that do not all record a start (`_start_note`)."""
    if args.starts_by_seed:
        if kind.starts_by_seed is not True and not (kind.starts_by_seed == "paired" and args.paired):
            raise TableError(_BLOCKS_REFUSAL.format(kind=kind.name) + " without --paired" * (kind.starts_by_seed == "paired"))
        by_start = starts_by_seed(rows)
        if kind.pooled_seeds is None:
            return by_start, _starts_note(by_start)
        pooled = kind.pooled_seeds(rows)  # name only the seeds the table pools (it names the others)
        return by_start, _starts_note({start: kept for start, seeds in by_start.items()
                                       if (kept := [s for s in seeds if s in pooled])})
    if not kind.pools:
        return {}, []
    _check_one_start(rows)
    return {}, _start_note(args)
