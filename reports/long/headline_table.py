"""The long-response headline cell: objectives x seeds at one N, each against the best baseline.

    python reports/long/headline_table.py runs/long/calib-128/runs/*_N32_*_s? > reports/long/headline-128.md

Per (lr, objective): mean ± sample std over seeds (n) of the late mean (last eighth of the
per-update training scores) and of held-out pass@1 after the last update, and over the stale updates
(staleness_mean > 0) the means of frac_pos_low_w, the fraction of stale negatives below log W = -1
(pooled from the log W histograms), the same-batch ReSPO/VESPO positive mass shares of
those positives, log W p10, k3 KL, and the share of updates where gradient clipping fired. Then each
objective against the best baseline at that lr (GRPO or VESPO, by mean late mean): the difference of
means, Welch's t, its degrees of freedom and two-sided p, a 95 % bootstrap interval over seeds, and
the verdict (`respo.study.stats.compare`: "within noise" when p > 0.05). Last, the mean training
score of each rollout step (N updates), averaged over seeds, for the stale cells (N > 1).
"""

from __future__ import annotations

import math
import sys

from respo.study.aggregate import late_mean, load_runs, mean_std, pass_at_1, pooled_low_fraction, run_mean
from respo.study.stats import compare, format_p

BASELINES = ("grpo", "vespo")
STALE_KEYS = ("frac_pos_low_w", "same_batch/respo_pos_low_w_mass_share", "same_batch/vespo_pos_low_w_mass_share",
              "log_w/p10", "kl_k3", "grad_clipped")


def _f(x: float, digits: int = 3) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _ms(xs: list[float], digits: int = 3) -> str:
    m, s, n = mean_std(xs)
    return f"{_f(m, digits)} ± {_f(s, digits)} ({n})"


def tables(paths: list[str]) -> list[str]:
    runs = [r for r in load_runs(paths) if r.finished]
    cells: dict[tuple, list] = {}
    for r in runs:
        cells.setdefault((r.coords["lr"], r.coords["reuse"], r.coords["objective"]), []).append(r)
    out = ["| lr | N | objective | late mean | held-out pass@1 | pos log W<−1 | neg log W<−1 | ReSPO share | "
           "VESPO share | log W p10 | k3 KL | clip rate |", "|" + "---|" * 12]
    for (lr, n, obj), rs in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        stale = [[run_mean(r, k, stale_only=True) for r in rs] for k in STALE_KEYS]
        clip = [run_mean(r, "grad_clipped") for r in rs]
        neg_low = [pooled_low_fraction(r, "neg") for r in rs]
        out.append(f"| {lr:g} | {n} | {obj} | {_ms([late_mean(r.scores) for r in rs])} | {_ms([pass_at_1(r) for r in rs])} | "
                   f"{_f(sum(stale[0]) / len(rs))} | {_f(sum(neg_low) / len(rs))} | {_f(sum(stale[1]) / len(rs))} | {_f(sum(stale[2]) / len(rs))} | "
                   f"{_f(sum(stale[3]) / len(rs), 2)} | {_f(sum(stale[4]) / len(rs), 4)} | {_f(sum(clip) / len(rs), 2)} |")
    out += ["", "| lr | N | objective vs best baseline | metric | difference | Welch t (df) | p | 95 % bootstrap | verdict |",
            "|" + "---|" * 9]
    for lr, n in sorted({(k[0], k[1]) for k in cells}):
        base = [o for o in BASELINES if (lr, n, o) in cells]
        if not base:
            continue
        best = max(base, key=lambda o: mean_std([late_mean(r.scores) for r in cells[(lr, n, o)]])[0])
        for (lr2, n2, obj), rs in sorted(cells.items()):
            if (lr2, n2) != (lr, n) or obj == best:
                continue
            for metric, value in (("late mean", lambda r: late_mean(r.scores)), ("pass@1", pass_at_1)):
                c = compare([value(r) for r in rs], [value(r) for r in cells[(lr, n, best)]])
                out.append(f"| {lr:g} | {n} | {obj} vs {best} | {metric} | {c.diff:+.3f} | {_f(c.t, 2)} ({_f(c.df, 1)}) | "
                           f"{format_p(c.p)} | [{c.ci_low:+.3f}, {c.ci_high:+.3f}] | {c.verdict} |")
    out += ["", "Training score per rollout step (mean over seeds of the mean per-update score in the step; step 1 "
            "trains on the warm start's rollouts):", ""]
    n_steps = max((len(r.scores) // r.coords["reuse"] for rs in cells.values() for r in rs), default=0)
    out += ["| lr | N | objective | " + " | ".join(f"step {i + 1}" for i in range(n_steps)) + " |",
            "|" + "---|" * (3 + n_steps)]
    for (lr, n, obj), rs in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        if n == 1:
            continue
        steps = [[sum(r.scores[i * n:(i + 1) * n]) / n for r in rs if len(r.scores) >= (i + 1) * n] for i in range(n_steps)]
        out.append(f"| {lr:g} | {n} | {obj} | " + " | ".join(_f(sum(v) / len(v)) if v else "—" for v in steps) + " |")
    return out


if __name__ == "__main__":
    print("\n".join(tables(sys.argv[1:])))
