"""The long-response calibration table: one row per run of a ``long-calibrate`` sweep.

    python reports/long/calib_table.py runs/long/calib-128 > reports/long/calib-128.md

Per run (objective, N, lr, seed): late mean (last eighth of the per-update scores) and early max (first quarter), the
score of the first and of the last 8 updates (on-policy stability at N = 1), held-out pass@1, and
over the stale updates (staleness_mean > 0; the first mini-batch of a rollout step has log W = 0)
the means of: frac_pos_low_w (positives with log W < -1), the same-batch shares of the positives'
coefficient mass those positives would get under ReSPO's and VESPO's published phi+, log W p10,
k3 KL per token and frac_starved; and from the log W histograms pooled over the stale updates, the
fraction of all stale positives (and of all stale negatives) with log W < -1. `respo report` gives the figures and runs.csv; this adds the
same-batch columns it does not tabulate.
"""

from __future__ import annotations

import math
import sys

from respo.study.aggregate import early_max, late_mean, load_runs, nanmean, pooled_low_fraction, run_mean

#: Updates at each end of a run whose scores are compared for on-policy stability.
EDGE_UPDATES = 8

STALE_KEYS = ("frac_pos_low_w", "same_batch/respo_pos_low_w_mass_share", "same_batch/vespo_pos_low_w_mass_share",
              "log_w/p10", "kl_k3", "frac_starved")
HEAD = ("objective", "N", "lr", "seed", "updates", "first 8", "last 8", "late mean", "early max", "pass@1",
        "pos logW<-1", "ReSPO share", "VESPO share", "logW p10", "kl_k3", "starved", "pooled pos<-1", "pooled neg<-1")


def _f(x: float, digits: int = 3) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def rows(sweep_dirs: list[str]) -> list[str]:
    runs = sorted(load_runs(sweep_dirs), key=lambda r: (r.coords["lr"], r.coords["objective"], r.coords["reuse"],
                                                        r.coords["seed"]))
    out = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    for r in runs:
        s = r.scores
        ev = (r.summary or {}).get("eval_after") or {}
        stale = [run_mean(r, k, stale_only=True) for k in STALE_KEYS]
        cells = [r.coords["objective"], str(r.coords["reuse"]), f"{r.coords['lr']:g}", str(r.coords["seed"]),
                 f"{len(r.records)}/{r.coords['updates']}" + ("" if r.finished else " (running)"),
                 _f(nanmean(s[:EDGE_UPDATES])), _f(nanmean(s[-EDGE_UPDATES:])),
                 _f(late_mean(s)) if s else "—", _f(early_max(s)) if s else "—", _f(ev.get("pass@1", math.nan)),
                 _f(stale[0]), _f(stale[1]), _f(stale[2]), _f(stale[3], 2), _f(stale[4], 4), _f(stale[5]),
                 _f(pooled_low_fraction(r, "pos")), _f(pooled_low_fraction(r, "neg"))]
        out.append("| " + " | ".join(cells) + " |")
    return out


if __name__ == "__main__":
    print("\n".join(rows(sys.argv[1:])))
