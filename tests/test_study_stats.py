"""respo.study.stats: Student-t tails against table values, Welch's test by hand, the bootstrap interval."""

from __future__ import annotations

import math

import pytest

from respo.study.stats import WITHIN_NOISE, betainc, bootstrap_diff_ci, compare, student_t_sf2, welch_t


@pytest.mark.parametrize("t, df", [(2.776, 4), (4.303, 2), (12.706, 1), (2.228, 10), (1.96, 1e6)])
def test_student_t_two_sided_tail_matches_table_critical_values(t, df):
    # two-sided 5% critical values of Student's t (printed tables, 3 decimals): t(4) = 2.776,
    # t(2) = 4.303, t(1) = 12.706, t(10) = 2.228, and the normal's 1.96 at df -> infinity
    assert student_t_sf2(t, df) == pytest.approx(0.05, abs=2e-4)


def test_student_t_tail_edges_and_betainc_closed_forms():
    assert student_t_sf2(0.0, 5) == pytest.approx(1.0)
    assert student_t_sf2(-2.776, 4) == student_t_sf2(2.776, 4)  # symmetric
    assert student_t_sf2(math.inf, 3) == 0.0 and math.isnan(student_t_sf2(math.nan, 3))
    # df = 1 is the Cauchy: P(|T| >= 1) = 1 − 2·atan(1)/π = 0.5
    assert student_t_sf2(1.0, 1) == pytest.approx(0.5, abs=1e-12)
    # I_x(1, 1) = x; I_x(a, 1) = x^a; I_0.5(a, a) = 0.5
    assert betainc(0.3, 1, 1) == pytest.approx(0.3) and betainc(0.4, 3, 1) == pytest.approx(0.064)
    assert betainc(0.5, 7.5, 7.5) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        betainc(1.5, 1, 1)


def test_welch_by_hand():
    # a = [1, 2, 3], b = [4, 5, 6]: means 2 and 5, variances 1 and 1.
    # t = −3 / √(1/3 + 1/3) = −3.674235; df = (2/3)² / ((1/3)²/2 + (1/3)²/2) = 4;
    # p = P(|T_4| >= 3.674) = 0.021312 (Simpson integration of the t density gives the same 6 digits)
    w = welch_t([1, 2, 3], [4, 5, 6])
    assert (w.diff, w.n_a, w.n_b) == (-3.0, 3, 3)
    assert w.t == pytest.approx(-3.674235, abs=1e-6) and w.df == pytest.approx(4.0)
    assert w.p == pytest.approx(0.021312, abs=1e-6)
    # unequal sizes and variances: a = [1, 2, 3, 4] (mean 2.5, s² = 5/3), b = [2, 4] (mean 3, s² = 2):
    # se² = 5/12 + 2/2 = 17/12, t = −0.5/√(17/12) = −0.420084,
    # df = (17/12)² / ((5/12)²/3 + 1²/1) = 2.006944 / 1.057870 = 1.897155; p = 0.717192
    w = welch_t([1, 2, 3, 4], [2, 4])
    assert w.t == pytest.approx(-0.420084, abs=1e-6) and w.df == pytest.approx(1.897155, abs=1e-6)
    assert w.p == pytest.approx(0.717192, abs=1e-6)


def test_welch_degenerate_cases():
    w = welch_t([0.5], [0.1, 0.2])  # one seed on a side: no variance, no test
    assert w.diff == pytest.approx(0.35) and math.isnan(w.t) and math.isnan(w.p)
    w = welch_t([1.0, 1.0], [0.0, 0.0, math.nan])  # zero spread, different means (NaN dropped)
    assert w.t == math.inf and w.p == 0.0 and w.n_b == 2
    assert welch_t([1.0, 1.0], [1.0, 1.0]).p == 1.0


def test_bootstrap_interval():
    # constant groups: every resample gives 1 − 0 exactly
    assert bootstrap_diff_ci([1, 1, 1], [0, 0], n_resamples=200) == (1.0, 1.0)
    # a = [0, 1] resamples to mean 0, 0.5 or 1 (probabilities 1/4, 1/2, 1/4), b = [0]: the 2.5% and
    # 97.5% quantiles of 4000 resampled differences are 0 and 1
    assert bootstrap_diff_ci([0, 1], [0], n_resamples=4000) == (0.0, 1.0)
    a, b = [0.50, 0.55, 0.61], [0.40, 0.47, 0.42]
    lo, hi = bootstrap_diff_ci(a, b, n_resamples=2000, seed=3)
    assert (lo, hi) == bootstrap_diff_ci(a, b, n_resamples=2000, seed=3)  # seeded: reproducible
    # the resampled difference lies between min(a) − max(b) = 0.03 and max(a) − min(b) = 0.21
    assert 0.03 <= lo < sum(a) / 3 - sum(b) / 3 < hi <= 0.21
    assert all(math.isnan(x) for x in bootstrap_diff_ci([], [1.0]))


def test_compare_verdicts():
    c = compare([1, 2, 3], [4, 5, 6], n_resamples=500)  # p = 0.0213 (above)
    assert c.verdict == "a < b" and c.diff == -3.0 and (c.n_a, c.n_b) == (3, 3) and c.ci_low <= -3 <= c.ci_high
    assert compare([4, 5, 6], [1, 2, 3], n_resamples=10).verdict == "a > b"
    c = compare([1, 2, 3, 4], [2, 4], n_resamples=10)  # p = 0.717
    assert c.verdict == WITHIN_NOISE and c.p == pytest.approx(0.717192, abs=1e-6)
    assert compare([0.5], [0.4, 0.3], n_resamples=10).verdict == WITHIN_NOISE  # one seed: undefined p


def test_format_p_for_tables():
    from respo.study.stats import format_p

    assert format_p(0.0005) == "<0.001" and format_p(0.001) == "0.001" and format_p(0.0123) == "0.012"
    assert format_p(float("nan")) == "—"
