"""``respo table breakdown``: per (lr, N, objective), the seeds that broke down (docs/method.md, "Breakdown")."""

from __future__ import annotations

import math

from respo.study.aggregate import nanmean
from respo.study.tables.common import SEED_ENDPOINTS, _f, group_rows
from respo.study.tables.registry import TableKind
from respo.study.tables.runs_csv import TableError


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


KIND = TableKind("breakdown", "the seeds that broke down (docs/method.md) per (lr, N, objective)",
                 build=lambda t: breakdown_table(t.rows), endpoints=SEED_ENDPOINTS)
