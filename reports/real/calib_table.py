"""The real-model regime table: one row per run of a calibration sweep (configs/real/calib.toml).

    python reports/real/calib_table.py runs/real/calib > reports/real/calib/table.md

Per run (objective, N, lr): updates logged, the mean score of its updates, and over its stale updates
(staleness_mean > 0; the first mini-batch of a rollout step has log W = 0) the means of: per-token k3
KL, per-token entropy, frac_pos_low_w (positives with log W < -1), the same-batch shares of the
positives' coefficient mass those positives get under ReSPO's and VESPO's published phi+, log W p10;
from the log W histograms pooled over the stale updates, the fraction of all stale positives and of
all stale negatives with log W < -1; and the cost: seconds per update (all phases, the rollout
step's sampling and old_logp shared out over its N updates) and of its training forward/backward.
"""

from __future__ import annotations

import math
import sys

from respo.study.aggregate import load_runs, nanmean, pooled_low_fraction, run_mean

STALE_KEYS = ("kl_k3", "entropy", "frac_pos_low_w", "same_batch/respo_pos_low_w_mass_share",
              "same_batch/vespo_pos_low_w_mass_share", "log_w/p10")
HEAD = ("objective", "N", "lr", "updates", "score", "k3 KL/token", "entropy/token", "pos logW<-1",
        "ReSPO share", "VESPO share", "logW p10", "pooled pos<-1", "pooled neg<-1", "s/update", "train s/update")


def _f(x: float, digits: int = 3) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}g}"


def rows(dirs: list[str]) -> list[str]:
    runs = sorted(load_runs(dirs), key=lambda r: (r.coords["reuse"], r.coords["lr"], r.coords["objective"]))
    out = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    for r in runs:
        recs = r.records
        total = sum(sum(v for k, v in rec.items() if k.startswith("time/") and v is not None) for rec in recs)
        stale = [run_mean(r, k, stale_only=True) for k in STALE_KEYS]
        cells = [r.coords["objective"], str(r.coords["reuse"]), f"{r.coords['lr']:g}",
                 f"{len(recs)}/{r.coords['updates']}", _f(nanmean(rec.get("score") for rec in recs)),
                 *[_f(x) for x in stale], _f(pooled_low_fraction(r, "pos")), _f(pooled_low_fraction(r, "neg")),
                 _f(total / max(len(recs), 1), 3), _f(run_mean(r, "time/train"), 3)]
        out.append("| " + " | ".join(cells) + " |")
    return out


if __name__ == "__main__":
    print("\n".join(rows(sys.argv[1:])))
