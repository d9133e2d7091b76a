"""Seed-level significance for the study's comparisons (pure Python; no scipy).

Two objectives are compared on one number per seed (e.g. late mean). With samples a (n_a values)
and b (n_b values), sample means m and sample variances s² (ddof = 1):

    difference    d  = m_a − m_b,   se = √(s_a²/n_a + s_b²/n_b)
    Welch's t     t  = d / se
    df (Welch–Satterthwaite)
                  ν  = se⁴ / ((s_a²/n_a)²/(n_a − 1) + (s_b²/n_b)²/(n_b − 1))
    two-sided p   p  = P(|T_ν| ≥ |t|) = I_{ν/(ν+t²)}(ν/2, 1/2)
    (1 − α) CI    d ± t_{1−α/2, ν} · se

with I_x(a, b) the regularized incomplete beta function (continued fraction, modified Lentz) and
t_{q, ν} the Student-t quantile (`student_t_ppf`, bisection on the CDF).

Equivalence within a margin δ > 0 (`tost`, two one-sided tests, Schuirmann 1987):

    lower  H0: d ≤ −δ    t_l = (d + δ)/se,   p_l = P(T_ν ≥ t_l)
    upper  H0: d ≥ +δ    t_u = (d − δ)/se,   p_u = P(T_ν ≤ t_u)
    TOST p = max(p_l, p_u);  equivalent within ±δ at level α  ⇔  p ≤ α
             ⇔  the (1 − 2α) interval d ± t_{1−α, ν} · se lies inside (−δ, δ)   (a 90 % CI for α = .05)

Paired samples (`paired`: a_i and b_i measured on the same seed i, e.g. two arms that share their first
rollout step within a seed), n pairs with finite values, differences d_i = a_i − b_i:

    difference    d̄ = mean(d_i),   se = s_d/√n   (s_d the sample standard deviation of the d_i)
    t             t = d̄ / se,      df = n − 1
    two-sided p, CI and TOST as above with this se and df

The one-sample test of per-seed values x_i against 0 (`one_sample`) is the same test with d_i = x_i.
A 2 × 2 factorial over seeds (`factorial_2x2`: positive branch {R, V} × negative branch {R, V}, the four
arms R⁺R⁻, R⁺V⁻, V⁺R⁻, V⁺V⁻ of each seed) is tested through three per-seed contrasts, each with
`one_sample`:

    negative-branch main effect   c⁻ = ½[(R⁺R⁻ − R⁺V⁻) + (V⁺R⁻ − V⁺V⁻)]   (R⁻ minus V⁻, averaged over the positive branch)
    positive-branch main effect   c⁺ = ½[(R⁺R⁻ − V⁺R⁻) + (R⁺V⁻ − V⁺V⁻)]   (R⁺ minus V⁺, averaged over the negative branch)
    interaction                   c× = (R⁺R⁻ − R⁺V⁻) − (V⁺R⁻ − V⁺V⁻)      (how much the negative branch's effect
                                                                          changes with the positive branch)

Power (`min_detectable`, `seeds_needed`): a one-sample t-test over n seeds of per-seed values with
standard deviation σ, at level α, detects a true mean Δ with probability about 1 − β when

    Δ ≥ (t_{1−α/2, n−1} + t_{1−β, n−1}) · σ/√n        (the minimum detectable effect, MDE)

(the usual approximation of the noncentral t by a shifted t; it ignores the far tail of the other
sign). With σ measured on the same seeds it is a description of the study's resolution, not a test.

A study stopped short of its declared seeds (`missing_seeds`): had the k missing seeds' per-seed values
fallen anywhere within [min x_i, max x_i] of the measured ones, the smallest two-sided p and the largest
TOST p the completed test could have given, found by enumerating every combination of k values on an
even grid over that range. A bound on what those seeds could change, not a test; seeds beyond the
measured range are not covered.

Multiplicity (`adjust`) over a family of m p values sorted p_(1) ≤ … ≤ p_(m):

    Holm (family-wise error, step-down)   p̃_(i) = max_{j ≤ i} min(1, (m − j + 1) · p_(j))
    Benjamini–Hochberg (false discovery rate, step-up)
                                          p̃_(i) = min_{j ≥ i} min(1, m/j · p_(j))

`verdict` turns the tests into the words every table uses: "worse"/"better" only when the
(adjusted) two-sided test rejects, "equivalent within ±δ" only when the (adjusted) TOST rejects,
otherwise "no difference detected (95 % CI lo, hi)", and "no test (n = k)" when a side has fewer
than two values. A failure to find a difference is never called a tie.

Assumptions and limits. The t tests assume each side's per-seed values are normal (independent
seeds, unequal variances allowed); with three seeds per side normality cannot be checked, and no
rank test can replace it: the exact two-sided Mann–Whitney test of 3 against 3 has 20 equally likely
splits, so its smallest p is 2/20 = .10, i.e. no rank test reaches p < .10 at n = 3 per side.

`bootstrap_diff_ci` is the percentile bootstrap interval of m_a − m_b: resample each group with
replacement, ``n_resamples`` times, from a seeded generator, and take the α/2 and 1 − α/2 quantiles.
`compare` bundles Welch's test and the bootstrap interval with a verdict ("a < b", "a > b", or
"within noise" when p > α); it is kept for existing callers, new tables use `welch`, `tost`,
`adjust` and `verdict`.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Sequence

__all__ = ["Welch", "Comparison", "welch_t", "student_t_sf2", "betainc", "bootstrap_diff_ci", "compare",
           "ALPHA", "N_RESAMPLES", "WITHIN_NOISE", "format_p",
           "WelchTest", "Tost", "welch", "tost", "adjust", "verdict", "student_t_cdf", "student_t_ppf",
           "ADJUST_METHODS", "NO_DIFFERENCE", "Judged", "judge", "PairedTest", "one_sample", "paired", "paired_tost", "tost_of",
           "FACTORIAL_CONTRASTS", "factorial_2x2", "factorial_contrasts", "min_detectable", "seeds_needed",
           "MissingSeeds", "missing_seeds"]

#: Significance level of `compare`'s verdict and the bootstrap interval (a 95% interval).
ALPHA = 0.05
#: Bootstrap resamples by default.
N_RESAMPLES = 10_000
#: `compare`'s verdict when p > ALPHA (or p is undefined: fewer than two values on a side).
WITHIN_NOISE = "within noise"
#: `adjust`'s methods and what each controls.
ADJUST_METHODS = {"holm": "Holm (family-wise error rate)", "bh": "Benjamini–Hochberg (false discovery rate)"}
#: `verdict`'s words when neither the two-sided test nor the equivalence test rejects.
NO_DIFFERENCE = "no difference detected"

_CF_MAX_ITER = 100_000  # the continued fraction needs O(√max(a, b)) terms near x ≈ a/(a+b)
_CF_EPS = 1e-15
_TINY = 1e-300


def _betacf(x: float, a: float, b: float) -> float:
    """Continued fraction of I_x(a, b) (Numerical Recipes' betacf, modified Lentz)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _CF_MAX_ITER + 1):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))  # even step
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))  # odd step
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _CF_EPS:
            return h
    raise ArithmeticError(f"incomplete beta continued fraction did not converge (x={x}, a={a}, b={b})")


def betainc(x: float, a: float, b: float) -> float:
    """Regularized incomplete beta I_x(a, b) = B(x; a, b) / B(a, b) for 0 ≤ x ≤ 1, a, b > 0."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"betainc needs 0 <= x <= 1, got {x}")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):  # the fraction converges fast here; else use I_x(a,b) = 1 − I_{1−x}(b,a)
        return math.exp(log_front) * _betacf(x, a, b) / a
    return 1.0 - math.exp(log_front) * _betacf(1.0 - x, b, a) / b


def student_t_sf2(t: float, df: float) -> float:
    """Two-sided tail P(|T_df| ≥ |t|) = I_{df/(df+t²)}(df/2, 1/2)."""
    if math.isnan(t) or math.isnan(df) or df <= 0:
        return math.nan
    if math.isinf(t):
        return 0.0
    return betainc(df / (df + t * t), df / 2.0, 0.5)


def student_t_cdf(t: float, df: float) -> float:
    """P(T_df ≤ t) = 1 − ½·P(|T| ≥ t) for t ≥ 0, ½·P(|T| ≥ |t|) for t < 0 (NaN for df ≤ 0 or NaN input)."""
    if math.isnan(t) or math.isnan(df) or df <= 0:
        return math.nan
    half_tail = 0.5 * student_t_sf2(t, df)
    return 1.0 - half_tail if t >= 0 else half_tail


def student_t_ppf(q: float, df: float) -> float:
    """The Student-t quantile t_{q, df}: the t with P(T_df ≤ t) = q, for 0 < q < 1 (bisection on the CDF)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"student_t_ppf needs 0 < q < 1, got {q}")
    if math.isnan(df) or df <= 0:
        return math.nan
    if q == 0.5:
        return 0.0
    if q < 0.5:  # symmetric: t_{q} = −t_{1−q}
        return -student_t_ppf(1.0 - q, df)
    lo, hi = 0.0, 1.0
    while student_t_cdf(hi, df) < q:  # bracket: the CDF is increasing in t
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if student_t_cdf(mid, df) < q else (lo, mid)
    return 0.5 * (lo + hi)


def _mean_var(xs: Sequence[float]) -> tuple[float, float, int]:
    vals = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
    n = len(vals)
    m = sum(vals) / n if n else math.nan
    var = sum((v - m) ** 2 for v in vals) / (n - 1) if n > 1 else math.nan
    return m, var, n


@dataclass(frozen=True)
class Welch:
    """Welch's unequal-variance t-test of mean(a) − mean(b)."""

    diff: float
    t: float
    df: float
    p: float
    n_a: int
    n_b: int


def welch_t(a: Sequence[float], b: Sequence[float]) -> Welch:
    """Welch's t, Welch–Satterthwaite df and two-sided p (module docstring). Non-finite values are
    dropped; with fewer than two values on a side t, df and p are NaN. Zero variance on both sides
    gives t = ±inf, p = 0 for different means and t = 0, p = 1 for equal ones."""
    ma, va, na = _mean_var(a)
    mb, vb, nb = _mean_var(b)
    diff = ma - mb
    if na < 2 or nb < 2:
        return Welch(diff, math.nan, math.nan, math.nan, na, nb)
    ua, ub = va / na, vb / nb  # squared standard errors of the two means
    se2 = ua + ub
    if se2 == 0.0:
        t = 0.0 if diff == 0.0 else math.copysign(math.inf, diff)
        return Welch(diff, t, float(na + nb - 2), 1.0 if diff == 0.0 else 0.0, na, nb)
    t = diff / math.sqrt(se2)
    df = se2 * se2 / (ua * ua / (na - 1) + ub * ub / (nb - 1))
    return Welch(diff, t, df, student_t_sf2(t, df), na, nb)


def _quantile(sorted_xs: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile of sorted values (numpy's default, "linear")."""
    pos = q * (len(sorted_xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (pos - lo) * (sorted_xs[hi] - sorted_xs[lo])


def bootstrap_diff_ci(a: Sequence[float], b: Sequence[float], *, n_resamples: int = N_RESAMPLES,
                      alpha: float = ALPHA, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval (1 − alpha) of mean(a) − mean(b).

    Each resample draws len(a) values of a and len(b) values of b with replacement (one
    ``random.Random(seed)`` for all draws, so the interval is reproducible). NaN when a side is empty.
    """
    xa = [float(x) for x in a if x is not None and math.isfinite(float(x))]
    xb = [float(x) for x in b if x is not None and math.isfinite(float(x))]
    if not xa or not xb or n_resamples < 1:
        return math.nan, math.nan
    rng = random.Random(seed)
    diffs = sorted(sum(rng.choices(xa, k=len(xa))) / len(xa) - sum(rng.choices(xb, k=len(xb))) / len(xb)
                   for _ in range(n_resamples))
    return _quantile(diffs, alpha / 2.0), _quantile(diffs, 1.0 - alpha / 2.0)


@dataclass(frozen=True)
class Comparison(Welch):
    """`compare`'s result: Welch's test (its fields), the bootstrap interval of the difference, and a verdict."""

    ci_low: float
    ci_high: float
    verdict: str


def format_p(p: float) -> str:
    """A p value for a table: three decimals, ``<0.001`` below that, ``—`` when undefined."""
    return "—" if math.isnan(p) else ("<0.001" if p < 0.001 else f"{p:.3f}")


def compare(a: Sequence[float], b: Sequence[float], *, alpha: float = ALPHA, n_resamples: int = N_RESAMPLES,
            seed: int = 0) -> Comparison:
    """mean(a) − mean(b) over seeds with Welch's t-test and a percentile bootstrap interval.

    ``verdict`` is "a > b" or "a < b" when p ≤ alpha, else "within noise" (also when p is undefined).
    """
    w = welch_t(a, b)
    lo, hi = bootstrap_diff_ci(a, b, n_resamples=n_resamples, alpha=alpha, seed=seed)
    if math.isnan(w.p) or w.p > alpha:
        verdict = WITHIN_NOISE
    else:
        verdict = "a > b" if w.diff > 0 else "a < b"
    return Comparison(w.diff, w.t, w.df, w.p, w.n_a, w.n_b, lo, hi, verdict)


@dataclass(frozen=True)
class WelchTest(Welch):
    """`welch`'s result: Welch's test (its fields), the standard error ``se`` of the difference and the
    two-sided (1 − ``alpha``) interval ``diff ± t_{1−alpha/2, df}·se`` (NaN where there is no test)."""

    se: float
    ci_low: float
    ci_high: float
    alpha: float


def welch(a: Sequence[float], b: Sequence[float], *, alpha: float = ALPHA) -> WelchTest:
    """Welch's two-sided t-test of mean(a) − mean(b) with its (1 − alpha) confidence interval (module
    docstring; assumes normal per-seed values). Same t, df and p as `welch_t`; with zero spread on
    both sides the interval is the difference itself."""
    w = welch_t(a, b)
    if math.isnan(w.p):
        return WelchTest(*_fields(w), math.nan, math.nan, math.nan, alpha)
    se = _se(a, b)
    half = 0.0 if se == 0.0 else student_t_ppf(1.0 - alpha / 2.0, w.df) * se
    return WelchTest(*_fields(w), se, w.diff - half, w.diff + half, alpha)


@dataclass(frozen=True)
class Tost:
    """`tost`'s result: the two one-sided Welch tests against ±``margin`` (module docstring)."""

    diff: float
    se: float
    df: float
    margin: float
    n_a: int
    n_b: int
    t_lower: float  # (diff + margin) / se, tests H0: diff <= −margin
    t_upper: float  # (diff − margin) / se, tests H0: diff >= +margin
    p_lower: float
    p_upper: float
    p: float  # max(p_lower, p_upper)
    ci90_low: float  # the (1 − 2·alpha) interval TOST uses (90 % for alpha = .05)
    ci90_high: float
    ci95_low: float  # the two-sided (1 − alpha) interval (95 % for alpha = .05)
    ci95_high: float
    alpha: float

    @property
    def equivalent(self) -> bool:
        """Equivalent within ±margin at level alpha: both one-sided tests reject (p ≤ alpha)."""
        return not math.isnan(self.p) and self.p <= self.alpha


def tost(a: Sequence[float], b: Sequence[float], margin: float, *, alpha: float = ALPHA) -> Tost:
    """Two one-sided Welch tests of |mean(a) − mean(b)| < margin (module docstring; assumes normal
    per-seed values). NaN p (never equivalent) with fewer than two values on a side. With zero
    spread on both sides the difference is known exactly: p = 0 when |diff| < margin, else 1."""
    _check_margin(margin)
    w = welch_t(a, b)
    se = math.nan if math.isnan(w.p) else _se(a, b)
    return _tost(w.diff, se, w.df, margin, w.n_a, w.n_b, alpha)


def _check_margin(margin: float) -> None:
    if not margin > 0 or math.isinf(margin):
        raise ValueError(f"an equivalence margin must be a positive number, got {margin}")


def _tost(d: float, se: float, df: float, margin: float, n_a: int, n_b: int, alpha: float) -> Tost:
    """TOST of a difference ``d`` with standard error ``se`` and ``df`` degrees of freedom (NaN se: no test)."""
    nan = math.nan
    if math.isnan(se):
        return Tost(d, nan, nan, margin, n_a, n_b, nan, nan, nan, nan, nan, nan, nan, nan, nan, alpha)
    if se == 0.0:
        p = 0.0 if abs(d) < margin else 1.0
        inf = math.inf
        return Tost(d, 0.0, df, margin, n_a, n_b, inf if d > -margin else -inf, -inf if d < margin else inf,
                    p if d > -margin else 1.0, p if d < margin else 1.0, p, d, d, d, d, alpha)
    t_l, t_u = (d + margin) / se, (d - margin) / se
    p_l, p_u = 1.0 - student_t_cdf(t_l, df), student_t_cdf(t_u, df)
    h90 = student_t_ppf(1.0 - alpha, df) * se
    h95 = student_t_ppf(1.0 - alpha / 2.0, df) * se
    return Tost(d, se, df, margin, n_a, n_b, t_l, t_u, p_l, p_u, max(p_l, p_u), d - h90, d + h90,
                d - h95, d + h95, alpha)


@dataclass(frozen=True)
class PairedTest(WelchTest):
    """`one_sample`'s and `paired`'s result (module docstring), with a `WelchTest`'s fields so `verdict` and
    `Judged` read it alike: the mean difference ``diff`` over ``n`` pairs, its ``se``, t, df = n − 1, two-sided
    p and (1 − ``alpha``) interval; ``n_a`` = ``n_b`` = n."""

    @property
    def n(self) -> int:
        return self.n_a


def _finite(x) -> bool:
    return x is not None and math.isfinite(float(x))


def one_sample(xs: Sequence[float], *, alpha: float = ALPHA) -> PairedTest:
    """The two-sided one-sample t-test of mean(xs) against 0 with its (1 − alpha) interval (module
    docstring). Non-finite values are dropped; with fewer than two left t, df, p and the interval are NaN;
    with zero spread t = ±inf, p = 0 (or t = 0, p = 1 at a zero mean) and the interval is the mean itself."""
    m, var, n = _mean_var(xs)
    nan = math.nan
    if n < 2:
        return PairedTest(m, nan, nan, nan, n, n, nan, nan, nan, alpha)
    se, df = math.sqrt(var / n), float(n - 1)
    if se == 0.0:
        t = 0.0 if m == 0.0 else math.copysign(math.inf, m)
        return PairedTest(m, t, df, 1.0 if m == 0.0 else 0.0, n, n, 0.0, m, m, alpha)
    t = m / se
    half = student_t_ppf(1.0 - alpha / 2.0, df) * se
    return PairedTest(m, t, df, student_t_sf2(t, df), n, n, se, m - half, m + half, alpha)


def _differences(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """a_i − b_i over the pairs where both are finite."""
    if len(a) != len(b):
        raise ValueError(f"paired samples need one value of each per pair, got {len(a)} and {len(b)}")
    return [float(x) - float(y) for x, y in zip(a, b) if _finite(x) and _finite(y)]


def paired(a: Sequence[float], b: Sequence[float], *, alpha: float = ALPHA) -> PairedTest:
    """The two-sided paired t-test of mean(a_i − b_i) (``a`` and ``b`` aligned: a_i and b_i share seed i)
    with its (1 − alpha) interval (module docstring; assumes normal differences). A pair with a non-finite
    value on either side is left out."""
    return one_sample(_differences(a, b), alpha=alpha)


def paired_tost(a: Sequence[float], b: Sequence[float], margin: float, *, alpha: float = ALPHA) -> Tost:
    """Two one-sided paired t-tests of |mean(a_i − b_i)| < margin (the paired counterpart of `tost`)."""
    return tost_of(paired(a, b, alpha=alpha), margin)


def tost_of(test: PairedTest, margin: float) -> Tost:
    """Two one-sided tests of |mean| < margin from a `one_sample` or `paired` test (its mean, se and df)."""
    _check_margin(margin)
    return _tost(test.diff, test.se, test.df, margin, test.n_a, test.n_b, test.alpha)


def min_detectable(sd: float, n: int, *, alpha: float = ALPHA, power: float = 0.8) -> float:
    """The smallest true mean a two-sided one-sample (or paired) t-test over ``n`` seeds at level ``alpha``
    detects with probability ``power``, for per-seed values of standard deviation ``sd`` (module docstring):
    (t_{1−α/2, n−1} + t_{power, n−1}) · sd/√n. NaN when n < 2 or sd is not finite."""
    if not 0.0 < power < 1.0:
        raise ValueError(f"power must lie in (0, 1), got {power}")
    if n < 2 or not _finite(sd):
        return math.nan
    df = float(n - 1)
    return (student_t_ppf(1.0 - alpha / 2.0, df) + student_t_ppf(power, df)) * float(sd) / math.sqrt(n)


def seeds_needed(effect: float, sd: float, *, alpha: float = ALPHA, power: float = 0.8, most: int = 10_000) -> int:
    """The fewest seeds (at least 2) whose `min_detectable` at ``sd`` is at most ``effect``."""
    if not (_finite(effect) and effect > 0):
        raise ValueError(f"effect must be a finite number > 0, got {effect}")
    if not (_finite(sd) and sd >= 0):
        raise ValueError(f"sd must be a finite number >= 0, got {sd}")
    for n in range(2, most + 1):
        if min_detectable(sd, n, alpha=alpha, power=power) <= effect:
            return n
    raise ValueError(f"more than {most} seeds are needed to detect {effect} at sd {sd}")


#: `factorial_2x2`'s contrasts, in its order (module docstring).
FACTORIAL_CONTRASTS = ("negative branch", "positive branch", "interaction")


def factorial_2x2(rr: Sequence[float], rv: Sequence[float], vr: Sequence[float], vv: Sequence[float], *,
                  alpha: float = ALPHA) -> dict[str, PairedTest]:
    """The 2 × 2 factorial's contrasts over seeds, each tested with `one_sample` on its per-seed values:
    ``rr``, ``rv``, ``vr``, ``vv`` are the arms R⁺R⁻, R⁺V⁻, V⁺R⁻, V⁺V⁻, aligned by seed (module docstring
    gives c⁻, c⁺ and c×). A seed missing (non-finite) in any arm is left out of every contrast."""
    per_seed = factorial_contrasts(rr, rv, vr, vv)
    return {name: one_sample(per_seed[name], alpha=alpha) for name in FACTORIAL_CONTRASTS}


def factorial_contrasts(rr: Sequence[float], rv: Sequence[float], vr: Sequence[float],
                        vv: Sequence[float]) -> dict[str, list[float]]:
    """The per-seed values of `factorial_2x2`'s three contrasts, over the seeds finite in all four arms."""
    if not len(rr) == len(rv) == len(vr) == len(vv):
        raise ValueError(f"the four arms need one value per seed each, got {len(rr)}, {len(rv)}, {len(vr)}, {len(vv)}")
    seeds = [(a, b, c, d) for a, b, c, d in zip(rr, rv, vr, vv) if all(map(_finite, (a, b, c, d)))]
    return {
        "negative branch": [0.5 * ((a - b) + (c - d)) for a, b, c, d in seeds],
        "positive branch": [0.5 * ((a - c) + (b - d)) for a, b, c, d in seeds],
        "interaction": [(a - b) - (c - d) for a, b, c, d in seeds],
    }


@dataclass(frozen=True)
class MissingSeeds:
    """`missing_seeds`' bounds: over every combination of ``k`` further values on ``n`` grid points from
    ``low`` to ``high``, the smallest two-sided p and the largest TOST p (within ±``margin``) of the test."""

    k: int
    low: float
    high: float
    n: int
    margin: float
    p_min: float
    p_tost_max: float


#: `missing_seeds` refuses to enumerate more combinations than this.
MISSING_SEEDS_MAX_COMBINATIONS = 2_000_000


def missing_seeds(xs: Sequence[float], k: int, margin: float, *, grid: int = 21, alpha: float = ALPHA) -> MissingSeeds:
    """What ``k`` further seeds could have done to the one-sample test of ``xs`` (`one_sample`, `tost_of`), had
    each fallen within the range the measured seeds span: the smallest two-sided p and the largest TOST p over
    every combination (with repetition, order being irrelevant) of ``k`` values on ``grid`` evenly spaced points
    from min(xs) to max(xs). A grid search, so a bound up to the grid's resolution; it says nothing of seeds
    beyond the measured range. For a study stopped short of its declared seeds: a contrast whose ``p_min``
    stays above α could not have become a difference under any adjustment, and one whose ``p_tost_max`` times
    its family's size (Holm's largest factor) stays below α would have stayed equivalent."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    if isinstance(grid, bool) or not isinstance(grid, int) or grid < 2:
        raise ValueError(f"grid must be an integer >= 2, got {grid!r}")
    _check_margin(margin)
    vals = [float(x) for x in xs if _finite(x)]
    if not vals:
        raise ValueError("missing_seeds needs at least one finite value to take the range from")
    count = math.comb(grid + k - 1, k)
    if count > MISSING_SEEDS_MAX_COMBINATIONS:
        raise ValueError(f"{k} seeds on a grid of {grid} points are {count} combinations, more than "
                         f"{MISSING_SEEDS_MAX_COMBINATIONS}; use a coarser grid")
    lo, hi = min(vals), max(vals)
    points = [lo + (hi - lo) * i / (grid - 1) for i in range(grid)]
    p_min, p_tost_max = 1.0, 0.0
    for extra in itertools.combinations_with_replacement(points, k):
        t = one_sample(vals + list(extra), alpha=alpha)
        p_min = min(p_min, t.p)
        p_tost_max = max(p_tost_max, tost_of(t, margin).p)
    return MissingSeeds(k, lo, hi, grid, float(margin), p_min, p_tost_max)


def adjust(pvals: Sequence[float], method: str = "holm") -> list[float]:
    """Multiplicity-adjusted p values of one family, in the input order (module docstring).

    ``method`` is ``"holm"`` (family-wise error) or ``"bh"`` (Benjamini–Hochberg, false discovery
    rate). Ties get one adjusted value; adjusted values are capped at 1. A NaN p (no test was
    possible) is not a member of the family: it stays NaN and m counts the defined p values only.
    """
    if method not in ADJUST_METHODS:
        raise ValueError(f"unknown adjustment method {method!r}; expected one of {', '.join(ADJUST_METHODS)}")
    ps = [float(p) for p in pvals]
    bad = [p for p in ps if not math.isnan(p) and not 0.0 <= p <= 1.0]
    if bad:
        raise ValueError(f"a p value must lie in [0, 1], got {bad[0]}")
    idx = sorted((i for i, p in enumerate(ps) if not math.isnan(p)), key=lambda i: ps[i])  # p_(1) ≤ … ≤ p_(m)
    m = len(idx)
    out = list(ps)
    if method == "holm":
        running = 0.0
        for rank, i in enumerate(idx, start=1):
            running = max(running, min(1.0, (m - rank + 1) * ps[i]))
            out[i] = running
    else:
        running = 1.0
        for rank in range(m, 0, -1):
            i = idx[rank - 1]
            running = min(running, min(1.0, m / rank * ps[i]))
            out[i] = running
    return out


def verdict(w: WelchTest, eq: Tost | None = None, *, p: float | None = None, p_tost: float | None = None) -> str:
    """The words a table prints for a − b (module docstring).

    ``w`` is `welch`'s result and ``eq`` `tost`'s, or None when no margin is stated; ``p`` and
    ``p_tost`` replace their p values by the family's adjusted ones (`adjust`). Each test rejects at
    its own ``alpha``. Returns "no test (n = k)" with k the smaller side when either has fewer than
    two values; "worse" or "better" when the two-sided p ≤ alpha (adding "(by less than δ:
    equivalent within ±δ)" when the equivalence test rejects too); "equivalent within ±δ" when only
    the equivalence test rejects; otherwise "no difference detected (95 % CI lo, hi)" with Welch's
    (1 − alpha) interval, "after adjustment" added when the raw p rejects and the adjusted one does not.
    """
    n = min(w.n_a, w.n_b)
    if n < 2 or math.isnan(w.p):
        return f"no test (n = {n})"
    p_two = w.p if p is None else p
    equivalent = eq is not None and not math.isnan(eq.p) and (eq.p if p_tost is None else p_tost) <= eq.alpha
    band = f"±{eq.margin:g}" if eq is not None else ""
    if p_two <= w.alpha:
        word = "worse" if w.diff < 0 else "better"
        return f"{word} (by less than {eq.margin:g}: equivalent within {band})" if equivalent else word
    if equivalent:
        return f"equivalent within {band}"
    after = " after adjustment" if w.p <= w.alpha else ""
    return f"{NO_DIFFERENCE}{after} ({100 * (1 - w.alpha):g} % CI {w.ci_low:+.3f}, {w.ci_high:+.3f})"


@dataclass
class Judged:
    """One comparison of a family (`judge`): the tests, their p values adjusted within the family,
    and `verdict`'s words from the adjusted ones."""

    welch: WelchTest  # the two-sided test: Welch's, or the paired t-test (a `PairedTest`)
    tost: Tost | None
    p_adj: float  # the two-sided p adjusted within the family (NaN: no test)
    p_tost_adj: float  # the TOST p adjusted within the family (NaN: no test or no margin)
    method: str  # `adjust`'s method

    @property
    def diff(self) -> float:
        return self.welch.diff

    @property
    def t(self) -> float:
        return self.welch.t

    @property
    def df(self) -> float:
        return self.welch.df

    @property
    def p(self) -> float:
        return self.welch.p

    @property
    def tested(self) -> bool:
        return not math.isnan(self.welch.p)

    @property
    def verdict(self) -> str:
        return verdict(self.welch, self.tost, p=self.p_adj,
                       p_tost=None if self.tost is None else self.p_tost_adj)


def judge(pairs: Sequence[tuple[Sequence[float], Sequence[float]]], *, margin: float | None = None,
          method: str = "bh", alpha: float = ALPHA, paired_by_seed: bool = False) -> list[Judged]:
    """Compare each (a, b) of one family: `welch` (and `tost` against ±margin when given), or with
    ``paired_by_seed`` `paired` and `paired_tost` (a and b aligned by seed), the two-sided p values adjusted
    together and the TOST p values adjusted together (`adjust`), and each pair's `verdict` from the adjusted
    ones. Pairs without a test are not members of the family."""
    two, eq = (paired, paired_tost) if paired_by_seed else (welch, tost)
    tests = [(two(a, b, alpha=alpha), eq(a, b, margin, alpha=alpha) if margin is not None else None)
             for a, b in pairs]
    p_adj = adjust([w.p for w, _ in tests], method)
    p_tost = adjust([eq.p for _, eq in tests], method) if margin is not None else [math.nan] * len(tests)
    return [Judged(w, eq, q, qt, method) for (w, eq), q, qt in zip(tests, p_adj, p_tost)]


def _fields(w: Welch) -> tuple:
    return (w.diff, w.t, w.df, w.p, w.n_a, w.n_b)


def _se(a: Sequence[float], b: Sequence[float]) -> float:
    _, va, na = _mean_var(a)
    _, vb, nb = _mean_var(b)
    return math.sqrt(va / na + vb / nb)
