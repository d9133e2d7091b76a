"""``respo table headline``: per (lr, N, objective) mean ± sample std over seeds, then each objective against
the best baseline of its (lr, N) on late mean and held-out pass@1, tested and adjusted within the table, and
the mean score of each rollout step (`headline_tables`)."""

from __future__ import annotations

from respo.study.aggregate import mean_std
from respo.study.tables.common import MARGIN, SEED_ENDPOINTS, _absent_note, _ci, _f, _mean, _ms, by_seed
from respo.study.tables.registry import TableKind
from respo.study.tables.runs_csv import TableError

BASELINES = ("grpo", "vespo")

_HEAD_COLS = ("stale_mean:frac_pos_low_w", "pooled_neg_low_w", "same_batch_respo_mass_share",
              "same_batch_vespo_mass_share", "stale_mean:log_w/p10", "stale_mean:kl_k3", "entropy_early",
              "entropy_late", "grad_clip_rate")


def headline_tables(rows: list[dict], absent: set[str] = frozenset(), *, margin: float = MARGIN,
                    method: str = "bh", paired: bool = False) -> list[str]:
    """The headline cell's three tables (module docstring) from finished runs' rows; ``paired`` tests each
    objective against the best baseline with the paired t-test over the seeds both ran (`by_seed`) instead
    of Welch's."""
    from respo.study.stats import ADJUST_METHODS, format_p, judge

    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["finished"]:
            cells.setdefault((r["lr"], r["reuse"], r["objective"]), []).append(r)
    if not cells:
        raise TableError("no finished runs to tabulate")
    out = ["| lr | N | objective | late mean | held-out pass@1 | pos log W<−1 | neg log W<−1 | ReSPO share | "
           "VESPO share | log W p10 | k3 KL | entropy early | entropy late | clip rate |", "|" + "---|" * 14]
    digits = {"stale_mean:log_w/p10": 2, "stale_mean:kl_k3": 4, "grad_clip_rate": 2}
    for (lr, n, obj), rs in sorted(cells.items()):
        vals = [_f(_mean([r[c] for r in rs]), digits.get(c, 3)) for c in _HEAD_COLS]
        out.append(f"| {lr:g} | {n} | {obj} | {_ms([r['late_mean'] for r in rs])} | {_ms([r['pass@1'] for r in rs])} | "
                   + " | ".join(vals) + " |")
    out += _absent_note(absent, _HEAD_COLS)

    tests = []  # (lr, n, obj, best, metric, a, b)
    for lr, n in sorted({(k[0], k[1]) for k in cells}):
        base = [o for o in BASELINES if (lr, n, o) in cells]
        if not base:
            continue
        best = max(base, key=lambda o: mean_std([r["late_mean"] for r in cells[(lr, n, o)]])[0])
        for (lr2, n2, obj), rs in sorted(cells.items()):
            if (lr2, n2) != (lr, n) or obj == best:
                continue
            for metric, key in (("late mean", "late_mean"), ("pass@1", "pass@1")):
                a, b = (by_seed(rs, cells[(lr, n, best)], key) if paired else
                        ([r[key] for r in rs], [r[key] for r in cells[(lr, n, best)]]))
                tests.append((lr, n, obj, best, metric, a, b))
    judged = judge([t[5:] for t in tests], margin=margin, method=method, paired_by_seed=paired)
    name = ADJUST_METHODS[method].split(" (")[0]
    test = ("the paired two-sided t-test over the seeds both ran (each seed's arms share their first rollout "
            "step)" if paired else "Welch's two-sided t-test")
    out += ["", f"Each objective against the best baseline of its (lr, N). p: {test}; p ({name}): "
            f"adjusted over the {len(tests)} tests of this table; TOST p: two one-sided tests of equivalence within "
            f"±δ = {margin:g}, adjusted the same way. Verdicts from the adjusted p values.", "",
            f"| lr | N | objective vs best baseline | metric | difference | 95 % CI | {'paired' if paired else 'Welch'} "
            f"t (df) | p | p ({name}) | TOST p (δ = {margin:g}) | verdict |", "|" + "---|" * 11]
    for (lr, n, obj, best, metric, _, _), j in zip(tests, judged):
        w = j.welch
        out.append(f"| {lr:g} | {n} | {obj} vs {best} | {metric} | {w.diff:+.3f} | {_ci(w)} | "
                   f"{_f(w.t, 2)} ({_f(w.df, 1)}) | {format_p(w.p)} | {format_p(j.p_adj)} | {format_p(j.p_tost_adj)} | "
                   f"{j.verdict} |")

    stale = {k: rs for k, rs in cells.items() if k[1] != 1}
    n_steps = max((len(r["step_scores"]) for rs in stale.values() for r in rs), default=0)
    out += ["", "Training score per rollout step (mean over seeds of the mean per-update score in the step; step 1 "
            "trains on the warm start's rollouts):", ""]
    if stale and n_steps == 0:
        return out + ["Not in the given runs.csv: it was written before the `step_scores` column existed."]
    out += ["| lr | N | objective | " + " | ".join(f"step {i + 1}" for i in range(n_steps)) + " |",
            "|" + "---|" * (3 + n_steps)]
    for (lr, n, obj), rs in sorted(stale.items()):
        steps = [[r["step_scores"][i] for r in rs if len(r["step_scores"]) > i] for i in range(n_steps)]
        out.append(f"| {lr:g} | {n} | {obj} | " + " | ".join(_f(_mean(v)) if v else "—" for v in steps) + " |")
    return out


KIND = TableKind("headline", "objectives over seeds",
                 build=lambda t: headline_tables(t.rows, t.absent, margin=t.args.margin, method=t.args.adjust,
                                                 paired=t.args.paired),
                 endpoints=SEED_ENDPOINTS, paired=True, starts_by_seed="paired")
