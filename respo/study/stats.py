"""Seed-level significance for the study's comparisons (pure Python; no scipy).

Two objectives are compared on one number per seed (e.g. late mean). With samples a (n_a values)
and b (n_b values), sample means m and sample variances s² (ddof = 1):

    Welch's t     t  = (m_a − m_b) / √(s_a²/n_a + s_b²/n_b)
    df (Welch–Satterthwaite)
                  ν  = (s_a²/n_a + s_b²/n_b)² / ((s_a²/n_a)²/(n_a − 1) + (s_b²/n_b)²/(n_b − 1))
    two-sided p   p  = P(|T_ν| ≥ |t|) = I_{ν/(ν+t²)}(ν/2, 1/2)

with I_x(a, b) the regularized incomplete beta function (continued fraction, modified Lentz).
`bootstrap_diff_ci` is the percentile bootstrap interval of m_a − m_b: resample each group with
replacement, ``n_resamples`` times, from a seeded generator, and take the α/2 and 1 − α/2 quantiles.
`compare` bundles both with a verdict; with three seeds per side p > 0.05 is common, and then the
difference is reported as "within noise".
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Sequence

__all__ = ["Welch", "Comparison", "welch_t", "student_t_sf2", "betainc", "bootstrap_diff_ci", "compare",
           "ALPHA", "N_RESAMPLES", "WITHIN_NOISE"]

#: Significance level of `compare`'s verdict and the bootstrap interval (a 95% interval).
ALPHA = 0.05
#: Bootstrap resamples by default.
N_RESAMPLES = 10_000
#: `compare`'s verdict when p > ALPHA (or p is undefined: fewer than two values on a side).
WITHIN_NOISE = "within noise"

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
