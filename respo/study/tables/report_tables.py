"""The study report's tables: `respo report` lays them out with its figures and prose (it computes no number
itself)."""

from __future__ import annotations

import math
from typing import Sequence

from respo.study.aggregate import best_per_column, fmt_cell, mean_std, nanmean
from respo.study.tables.common import _f


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
