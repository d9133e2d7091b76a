"""``respo table calib``: one row per run (a calibration sweep), with the greedy accuracy where the runs.csv has
that column; ``--cost`` appends seconds per update and training seconds per update."""

from __future__ import annotations

from respo.study.tables.common import _absent_note, _f, _g3
from respo.study.tables.registry import Flag, TableKind


CALIB_HEAD = ("objective", "N", "lr", "seed", "updates", "first 8", "last 8", "late mean", "early max", "pass@1", "greedy",
              "pos logW<-1", "ReSPO share", "VESPO share", "logW p10", "kl_k3", "entropy early", "entropy late",
              "starved", "pooled pos<-1", "pooled neg<-1")
_CALIB_COLS = ("first8_score", "last8_score", "late_mean", "early_max", "pass@1", "greedy_acc", "stale_mean:frac_pos_low_w",
               "same_batch_respo_mass_share", "same_batch_vespo_mass_share", "stale_mean:log_w/p10",
               "stale_mean:kl_k3", "entropy_early", "entropy_late", "stale_mean:frac_starved", "pooled_pos_low_w",
               "pooled_neg_low_w")

#: Calib columns shown only when the given runs.csv files have them.
_CALIB_OPTIONAL = {"greedy_acc"}

_COST_HEAD = ("s/update", "train s/update")
_COST_COLS = ("seconds_per_update", "train_seconds_per_update")


def calib_table(rows: list[dict], absent: set[str] = frozenset(), *, cost: bool = False) -> list[str]:
    """One line per run, sorted by (lr, objective, N, seed): scores, held-out pass@1, per-token
    entropy and the stale-update diagnostics (`respo.study.tables`); with ``cost``, then seconds per update
    and training seconds per update (3 significant digits). Where the runs recorded more than one starting
    policy, a last column names each run's (``start``)."""
    # a column added later than the given runs.csv files (the greedy accuracy) is left out, not shown empty
    keep = [i for i, c in enumerate(_CALIB_COLS) if not (c in _CALIB_OPTIONAL and c in absent)]
    cols = [_CALIB_COLS[i] for i in keep]
    several = len({r["start"] for r in rows}) > 1
    head = (*CALIB_HEAD[:5], *(CALIB_HEAD[5 + i] for i in keep)) + (_COST_HEAD if cost else ()) + \
        (("start",) if several else ())
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in sorted(rows, key=lambda r: (r["lr"], r["objective"], r["reuse"], r["seed"])):
        digits = {"stale_mean:log_w/p10": 2, "stale_mean:kl_k3": 4, "entropy_early": 3, "entropy_late": 3}
        cells = [r["objective"], str(r["reuse"]), f"{r['lr']:g}", str(r["seed"]),
                 f"{r['updates_logged']}/{r['updates']}" + ("" if r["finished"] else " (running)")]
        cells += [_f(r[c], digits.get(c, 3)) for c in cols]
        cells += [_g3(r[c]) for c in _COST_COLS] if cost else []
        cells += [r["start"] or "—"] if several else []
        out.append("| " + " | ".join(cells) + " |")
    return out + _absent_note(absent, (*cols, *(_COST_COLS if cost else ())))


KIND = TableKind("calib", "one row per run", build=lambda t: calib_table(t.rows, t.absent, cost=t.args.cost),
                 flags=(Flag("--cost", "also seconds per update and training seconds per update",
                             {"action": "store_true"}, refusal="--cost adds columns to the calib table only, not to {kind}"),),
                 pools=False)
