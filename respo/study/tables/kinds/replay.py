"""``respo table replay``: per (lr, N, objective) run both ways, MoE routing replay's effect: the mean over seeds
with replay minus without, on late mean and held-out pass@1, tested like ``headline``."""

from __future__ import annotations

from respo.study.tables.common import MARGIN, SEED_ENDPOINTS, _ci, _mean
from respo.study.tables.registry import TableKind
from respo.study.tables.runs_csv import TableError


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


KIND = TableKind("replay", "each objective with MoE routing replay against without",
                 build=lambda t: replay_table(t.rows, margin=t.args.margin, method=t.args.adjust),
                 endpoints=SEED_ENDPOINTS, replay_both=True)
