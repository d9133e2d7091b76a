"""What the table builders share: the default equivalence margin, the endpoints pooled over seeds, number
formatting, rows grouped into cells, and two arms' values paired by seed."""

from __future__ import annotations

import math
from typing import Iterable, Sequence

from respo.study.aggregate import first_step_problem, mean_std
from respo.study.tables.runs_csv import TableError

#: Equivalence margin δ of ``respo table headline`` unless ``--margin`` says otherwise: 0.03 of the
#: normalised score (3 points of training score or of held-out pass@1, about one seed-to-seed
#: standard deviation of a run in the committed studies; the same default as ``respo recommend``).
MARGIN = 0.03
#: The endpoints a table over seeds pools when it names no others: late mean and held-out pass@1.
SEED_ENDPOINTS = ("late_mean", "pass@1")


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


def _g3(x: float) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3g}"


def _ms(xs: list[float], digits: int = 3) -> str:
    m, s, n = mean_std(xs)
    return f"{_f(m, digits)} ({n})" if n < 2 else f"{_f(m, digits)} ± {_f(s, digits)} ({n})"


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


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


def group_rows(rows: Iterable[dict], keys: Sequence[str]) -> dict[tuple, list[dict]]:
    """Finished rows grouped by the given columns (e.g. ("objective", "reuse"))."""
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["finished"]:
            out.setdefault(tuple(r[k] for k in keys), []).append(r)
    return out
