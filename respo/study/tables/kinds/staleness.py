"""``respo table staleness``: per (model, objective, N, lr) of finished runs, one table of the per-staleness
metrics (rows) at staleness 0 .. N−1 (columns), each the mean over the seeds that logged it."""

from __future__ import annotations

from respo.study.aggregate import nanmean
from respo.study.tables.common import _absent_note, _g3
from respo.study.tables.registry import TableKind
from respo.study.tables.runs_csv import STALENESS_SHARES, TableError


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


KIND = TableKind("staleness", "per-staleness diagnostics per (model, objective, N, lr)",
                 build=lambda t: staleness_tables(t.rows, t.absent), starts_by_seed=True)
