"""``respo table mismatch``: per (lr, N, objective) of finished runs that logged it, the engine–trainer mismatch
(means over seeds) next to the log W p10 of the stale updates: how large the uncorrected mismatch is against the
staleness."""

from __future__ import annotations

import math

from respo.study.aggregate import mean_std
from respo.study.tables.common import _f, _mean, group_rows
from respo.study.tables.registry import TableKind
from respo.study.tables.runs_csv import CSV_MISMATCH, TableError


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


KIND = TableKind("mismatch", "the engine–trainer mismatch next to the staleness per (lr, N, objective)",
                 build=lambda t: mismatch_table(t.rows), starts_by_seed=True)
