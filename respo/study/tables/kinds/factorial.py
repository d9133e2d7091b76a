"""``respo table factorial``: the 2 × 2 of ReSPO's and VESPO's branches per (lr, N), main effects and
interaction over the seeds all four arms ran (`factorial_table`)."""

from __future__ import annotations

import argparse
import math

from respo.study.tables.common import MARGIN, _ci, _f, by_seed, group_rows
from respo.study.tables.pooling import seed_list
from respo.study.tables.registry import Flag, TableKind
from respo.study.tables.runs_csv import TableError


#: The 2 × 2 of positive branch × negative branch: (arm R⁺R⁻, R⁺V⁻, V⁺R⁻, V⁺V⁻) as runs.csv objectives.
FACTORIAL_ARMS = ("respo", "respo+/vespo-", "vespo+/respo-", "vespo")


FACTORIAL_METRICS = {"late_mean": "late mean", "pass@1": "pass@1", "greedy_acc": "greedy"}
#: The endpoints `respo table factorial` tests when ``--metrics`` is not given.
FACTORIAL_DEFAULT = ("late_mean", "pass@1")


def _complete_seeds(cells: dict[tuple, list[dict]]) -> dict[tuple, set[int]]:
    """Per (lr, N) where all four arms of the 2 × 2 (`FACTORIAL_ARMS`) finished some run (``cells``: `group_rows`
    by lr, reuse and objective), the seeds whose four arms all finished."""
    return {(lr, n): set.intersection(*({r["seed"] for r in cells[(lr, n, arm)]} for arm in FACTORIAL_ARMS))
            for lr, n in {(lr, n) for lr, n, _ in cells}
            if all((lr, n, arm) in cells for arm in FACTORIAL_ARMS)}


def factorial_table(rows: list[dict], *, margin: float = MARGIN, method: str = "bh",
                    metrics: tuple[str, ...] = FACTORIAL_DEFAULT,
                    starts: dict[str, list[int]] | None = None, missing: int = 0) -> list[str]:
    """The 2 × 2 of ReSPO's and VESPO's branches per (lr, N) where all four arms (`FACTORIAL_ARMS`) ran:
    the negative-branch and positive-branch main effects and their interaction
    (`respo.study.stats.factorial_2x2`) on late mean and held-out pass@1 (or greedy accuracy), each a
    one-sample t-test over the seeds all four arms ran (each seed's arms share their first rollout step: `by_seed`), with its 95 %
    interval, the p value adjusted over the table's contrasts, TOST within ±δ, the contrast's SD over seeds with
    the minimum effect those seeds detect at 80 % power (`respo.study.stats.min_detectable`, unadjusted α) and a
    verdict on the sign.
    ``metrics`` (keys of `FACTORIAL_METRICS`) are the endpoints tested: a study that declared one endpoint
    adjusts over its three contrasts only, and tests a secondary endpoint (greedy accuracy) in a table of its
    own. A seed whose runs lack the endpoint (empty: runs from before greedy accuracy was recorded) is in none
    of that endpoint's contrasts. The seeds left out, of every contrast (not all four arms finished) or of one
    endpoint's, are named under the tables.
    ``starts`` (`starts_by_seed`: each starting policy's seeds), when it holds two or more: the seeds are pooled
    as blocks, and a second table gives each start's mean contrasts over its seeds, a description beside the
    tests, not further tests.
    ``missing`` > 0 (a study stopped that many seeds short of its declared number): a further table bounds
    what those seeds could have changed, had each contrast's values fallen within the range of the measured
    seeds' (`respo.study.stats.missing_seeds`): the smallest p and the largest TOST p, each adjusted with the
    other contrasts' bounds as the tests are (adjusted p's are monotone in the raw ones, so these bound them):
    a difference is ruled out where the adjusted smallest p stays above α, an equivalence kept where the
    adjusted largest TOST p stays at or below α."""
    from respo.study.stats import ADJUST_METHODS, FACTORIAL_CONTRASTS, adjust, factorial_2x2, factorial_contrasts, welch, \
        format_p, min_detectable, missing_seeds, tost_of, verdict

    cells = group_rows(rows, ("lr", "reuse", "objective"))
    complete = _complete_seeds(cells)
    found = sorted(complete)
    if not found:
        raise TableError(f"no (lr, N) with all four arms of the 2 × 2 ({', '.join(FACTORIAL_ARMS)}) finished")
    tests = []  # (lr, N, metric, contrast, seeds, PairedTest, Tost)
    per_start = []  # (lr, N, metric, start, {contrast: PairedTest}) when the seeds come from several starts
    left_out = []  # the seeds in no contrast, and why: nothing is dropped unsaid
    bounds = {}  # index into tests -> MissingSeeds, with ``missing``
    for lr, n in found:
        rr = cells[(lr, n, FACTORIAL_ARMS[0])]
        ran = {arm: {r["seed"] for r in rows if (r["lr"], r["reuse"], r["objective"]) == (lr, n, arm)}
               for arm in FACTORIAL_ARMS}
        done = {arm: {r["seed"] for r in cells[(lr, n, arm)]} for arm in FACTORIAL_ARMS}
        common = complete[(lr, n)]
        partial = sorted(set.union(*ran.values()) - common)
        if partial:
            left_out.append(f"Not in any contrast at lr {lr:g}, N = {n} (not all four arms finished): " + "; ".join(
                f"seed {s} (no finished {', '.join(a for a in FACTORIAL_ARMS if s not in done[a])})" for s in partial)
                + ".")
        for metric, key in ((FACTORIAL_METRICS[m], m) for m in metrics):
            arms = [by_seed([r for r in rr if r["seed"] in common], cells[(lr, n, arm)], key)[1]
                    for arm in FACTORIAL_ARMS]
            unrecorded = [s for i, s in enumerate(sorted(common)) if not all(math.isfinite(a[i]) for a in arms)]
            if unrecorded:
                left_out.append(f"Not in the {metric} contrasts at lr {lr:g}, N = {n} (the endpoint was not recorded "
                                f"in every arm): seed{'s' * (len(unrecorded) > 1)} {seed_list(unrecorded)}.")
            per_seed = factorial_contrasts(*arms) if missing else {}
            for name, t in factorial_2x2(*arms).items():
                tests.append((lr, n, metric, name, t, tost_of(t, margin) if t.n >= 2 else None))
                if per_seed.get(name):
                    bounds[len(tests) - 1] = missing_seeds(per_seed[name], missing, margin)
            if starts and len(starts) > 1:
                order = sorted(common)  # by_seed aligns the arms in this order
                for start, seeds in starts.items():
                    keep = [i for i, seed in enumerate(order) if seed in seeds]
                    sub = [[a[i] for i in keep] for a in arms]
                    per_start.append((lr, n, metric, start, factorial_2x2(*sub) if keep else None,
                                      factorial_contrasts(*sub) if keep else None))
    p_adj = adjust([t.p for *_, t, _ in tests], method)
    p_tost = adjust([math.nan if eq is None else eq.p for *_, eq in tests], method)
    name = ADJUST_METHODS[method].split(" (")[0]
    out = ["The 2 × 2 of positive branch {ReSPO, VESPO} × negative branch {ReSPO, VESPO} (arms "
           f"{', '.join(FACTORIAL_ARMS)}), per seed: negative branch = ½[(R⁺R⁻ − R⁺V⁻) + (V⁺R⁻ − V⁺V⁻)], positive "
           "branch = ½[(R⁺R⁻ − V⁺R⁻) + (R⁺V⁻ − V⁺V⁻)], interaction = (R⁺R⁻ − R⁺V⁻) − (V⁺R⁻ − V⁺V⁻). p: one-sample "
           "two-sided t-test of the per-seed contrast over the seeds all four arms ran (each seed's arms share "
           f"their first rollout step); p ({name}): adjusted over the {len(tests)} contrasts of this table; TOST p: "
           f"equivalence to 0 within ±δ = {margin:g}, adjusted the same way. SD: the per-seed contrast's standard "
           "deviation; MDE: the smallest true contrast these seeds detect with 80 % power at that SD (two-sided, "
           "α = .05 unadjusted). Verdict: below 0 / above 0 when the adjusted p ≤ .05.", "",
           f"| lr | N | metric | contrast | seeds | estimate | 95 % CI | t (df) | p | p ({name}) | "
           f"TOST p (δ = {margin:g}) | SD | MDE (80 %) | verdict |", "|" + "---|" * 14]
    for (lr, n, metric, contrast, t, eq), q, qt in zip(tests, p_adj, p_tost):
        words = verdict(t, eq, p=q, p_tost=None if eq is None else qt)
        words = words.replace("worse", "below 0", 1).replace("better", "above 0", 1)
        sd = t.se * math.sqrt(t.n) if t.n >= 2 else math.nan
        out.append(f"| {lr:g} | {n} | {metric} | {contrast} | {t.n} | {t.diff:+.3f} | {_ci(t)} | {_f(t.t, 2)} "
                   f"({_f(t.df, 0)}) | {format_p(t.p)} | {format_p(q)} | {format_p(qt)} | {_f(sd, 3)} | "
                   f"{_f(min_detectable(sd, t.n), 3)} | {words} |")
    if per_start:
        out += ["", "Each starting policy's seeds alone: the mean per-seed contrast (a description beside the tests "
                "above, not a further test); where a cell's seeds come from two starts, the Welch p of the difference "
                "between the two starts' per-seed contrasts (descriptive: not declared, not adjusted).", "",
                "| lr | N | metric | start | seeds | " + " | ".join(FACTORIAL_CONTRASTS) + " |",
                "|" + "---|" * (5 + len(FACTORIAL_CONTRASTS))]
        cells: dict[tuple, list] = {}
        for lr, n, metric, start, got, values in per_start:  # got None: no seed of this start holds all four arms yet
            k = next(iter(got.values())).n if got else 0
            out.append(f"| {lr:g} | {n} | {metric} | {start} | {k} | "
                       + " | ".join(f"{got[c].diff:+.3f}" if got else "—" for c in FACTORIAL_CONTRASTS) + " |")
            cells.setdefault((lr, n, metric), []).append(values)
            both = cells[(lr, n, metric)]
            if len(both) == 2 and all(v is not None and len(v[FACTORIAL_CONTRASTS[0]]) >= 2 for v in both):
                out.append(f"| {lr:g} | {n} | {metric} | between the two starts, Welch p | | "
                           + " | ".join(format_p(welch(both[0][c], both[1][c]).p) for c in FACTORIAL_CONTRASTS) + " |")
    if missing:
        # each bound adjusted with the others, as the tests are: an adjusted p never falls when a raw p rises, so
        # adjusting the smallest p's together bounds every adjusted p from below, the largest TOST p's from above
        lows = adjust([bounds[i].p_min if i in bounds else t.p for i, (*_, t, _) in enumerate(tests)], method)
        highs = adjust([bounds[i].p_tost_max if i in bounds else (math.nan if eq is None else eq.p)
                        for i, (*_, eq) in enumerate(tests)], method)
        out += ["", f"Had {missing} further seed{'s' * (missing > 1)} fallen within the range of the seeds measured (each "
                "contrast on its own; every combination on a grid of 21 values per seed from the smallest to the largest "
                "per-seed contrast): the smallest two-sided p and the largest TOST p the test could then have given, "
                f"each also adjusted ({name}) with the other contrasts' bounds, as the tests are; an adjusted p never falls "
                "when a raw p rises, so these bound the adjusted p's. A difference is ruled out where the adjusted "
                "smallest p stays above α = .05; a contrast equivalent now stays so where the adjusted largest TOST p "
                "stays at or below α. Seeds beyond the measured range are not covered.", "",
                f"| lr | N | metric | contrast | seeds | range | smallest p | adjusted | largest TOST p (δ = {margin:g}) | "
                "adjusted | difference ruled out | equivalence kept |", "|" + "---|" * 12]
        for i, ((lr, n, metric, contrast, t, eq), qt) in enumerate(zip(tests, p_tost)):
            b = bounds.get(i)
            if b is None:
                continue
            equivalent = eq is not None and qt <= eq.alpha
            kept = "—" if not equivalent else ("yes" if highs[i] <= eq.alpha else "no")
            out.append(f"| {lr:g} | {n} | {metric} | {contrast} | {t.n} + {missing} | [{b.low:+.3f}, {b.high:+.3f}] | "
                       f"{format_p(b.p_min)} | {format_p(lows[i])} | {format_p(b.p_tost_max)} | {format_p(highs[i])} | "
                       f"{'yes' if lows[i] > t.alpha else 'no'} | {kept} |")
    return out + ([""] + left_out if left_out else [])


def _metrics(args: argparse.Namespace) -> tuple[str, ...]:
    """The factorial table's endpoints named by ``--metrics`` (unknown or repeated names raise `TableError`)."""
    names = tuple(m.strip() for m in args.metrics.split(","))
    unknown = [m for m in names if m not in FACTORIAL_METRICS]
    if unknown or not names or len(set(names)) != len(names):
        raise TableError(f"--metrics must name distinct endpoints among {', '.join(FACTORIAL_METRICS)}, "
                         f"got {args.metrics!r}")
    return names


def _pooled_seeds(rows: list[dict]) -> set[int]:
    """The seeds the contrasts pool: those whose four arms all finished (`factorial_table` names the others)."""
    return set().union(*_complete_seeds(group_rows(rows, ("lr", "reuse", "objective"))).values())


def _check_missing(k: int) -> None:
    if k < 1:
        raise TableError(f"--missing-seeds must be an integer >= 1, got {k}")


KIND = TableKind(
    "factorial", "the 2 x 2 of ReSPO's and VESPO's branches, main effects and interaction over seeds",
    build=lambda t: factorial_table(t.rows, margin=t.args.margin, method=t.args.adjust, metrics=_metrics(t.args),
                                    starts=t.starts, missing=t.args.missing_seeds or 0),
    flags=(Flag("--missing-seeds", "for a study stopped K seeds short of its declared number, bound what those seeds "
                "could have changed had they fallen within the range of the measured ones",
                {"type": int, "default": None, "metavar": "K"}, check=_check_missing),
           Flag("--metrics", f"the endpoints tested, any of {', '.join(FACTORIAL_METRICS)} (default "
                f"{','.join(FACTORIAL_DEFAULT)}; the adjustment is over their contrasts only)",
                {"default": ",".join(FACTORIAL_DEFAULT)},
                refusal="--metrics chooses the factorial table's endpoints, not the {kind} table's")),
    endpoints=_metrics, paired=True, starts_by_seed=True, pooled_seeds=_pooled_seeds)
