"""respo.study.stats: Student-t tails and quantiles against table values, Welch's test and interval by hand, the
bootstrap interval, equivalence (TOST) by hand, Holm and Benjamini–Hochberg by hand, and the verdict wording."""

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


# --- quantiles, the Welch interval, equivalence (TOST), multiplicity, verdicts -------------------------------------
#
# For df = 4 Student's t has a closed-form CDF, used for the hand-worked values below:
#     F_4(t) = 1/2 + (3/4) · u · (1 − u²/3),   u = t / √(4 + t²)
# e.g. t = √6: u² = 6/10, F = .5 + .75 · .774597 · .8 = .964758, so P(T_4 >= √6) = .035242.


@pytest.mark.parametrize("q, df, t", [(0.975, 4, 2.776445), (0.95, 4, 2.131847), (0.975, 1, 12.706205),
                                      (0.95, 10, 1.812461), (0.975, 2, 4.302653), (0.025, 4, -2.776445),
                                      (0.5, 3, 0.0)])
def test_student_t_quantile_matches_table_values(q, df, t):
    # printed tables of Student's t quantiles (6 decimals); the 2.5% quantile is minus the 97.5% one
    from respo.study.stats import student_t_cdf, student_t_ppf

    assert student_t_ppf(q, df) == pytest.approx(t, abs=2e-6)
    assert student_t_cdf(t, df) == pytest.approx(q, abs=1e-7)


def test_student_t_cdf_closed_form_df4_and_edges():
    from respo.study.stats import student_t_cdf, student_t_ppf

    # F_4(√6) = .964758 (closed form above); F_4(−√6) = 1 − .964758
    assert student_t_cdf(math.sqrt(6), 4) == pytest.approx(0.964758, abs=1e-6)
    assert student_t_cdf(-math.sqrt(6), 4) == pytest.approx(0.035242, abs=1e-6)
    assert student_t_cdf(math.inf, 3) == 1.0 and student_t_cdf(-math.inf, 3) == 0.0
    assert math.isnan(student_t_cdf(1.0, 0)) and math.isnan(student_t_ppf(0.9, math.nan))
    with pytest.raises(ValueError):
        student_t_ppf(1.0, 4)


# a = [.50, .52, .54], b = [.49, .51, .53]: means .52 and .51, s² = .0004 on both sides, n = 3 each.
# diff = .01, se² = .0004/3 + .0004/3 = .00026667, se = .016330, df = se⁴ / (2 · (.0004/3)² / 2) = 4.
A_EQ, B_EQ = [0.50, 0.52, 0.54], [0.49, 0.51, 0.53]


def test_welch_interval_by_hand():
    from respo.study.stats import welch

    # t = .01/.016330 = .612372 (t² = .375): u² = .375/4.375, F_4 = .5 + .75·.292770·(1 − .375/13.125) = .713304,
    # two-sided p = 2·(1 − .713304) = .573392. 95% CI: .01 ± t_.975(4)·se = .01 ± 2.776445·.016330 = .01 ± .045339
    w = welch(A_EQ, B_EQ)
    assert w.diff == pytest.approx(0.01) and w.df == pytest.approx(4.0) and w.se == pytest.approx(0.016330, abs=1e-6)
    assert w.t == pytest.approx(0.612372, abs=1e-6) and w.p == pytest.approx(0.573392, abs=1e-6)
    assert (w.ci_low, w.ci_high) == (pytest.approx(-0.035339, abs=1e-6), pytest.approx(0.055339, abs=1e-6))
    # the same test as welch_t (kept): a = [1, 2, 3], b = [4, 5, 6], p = .021312; 90% CI −3 ± 2.131847·.816497
    # = −3 ± 1.740646
    w = welch([1, 2, 3], [4, 5, 6], alpha=0.10)
    assert w.p == welch_t([1, 2, 3], [4, 5, 6]).p and w.alpha == 0.10
    assert (w.ci_low, w.ci_high) == (pytest.approx(-4.740646, abs=1e-6), pytest.approx(-1.259354, abs=1e-6))
    # one value on a side: no test, no interval
    w = welch([0.5], [0.4, 0.3])
    assert math.isnan(w.p) and math.isnan(w.ci_low) and math.isnan(w.se) and w.n_a == 1
    # zero spread on both sides: the interval is the point itself
    w = welch([1.0, 1.0], [0.0, 0.0])
    assert (w.ci_low, w.ci_high, w.p) == (1.0, 1.0, 0.0)


def test_tost_equivalent_within_a_wide_margin_by_hand():
    from respo.study.stats import tost

    # δ = .05: lower test H0 diff <= −δ: t_l = (.01 + .05)/.016330 = 3.674235, p_l = P(T_4 >= 3.674) = .021312/2
    # = .010656; upper test H0 diff >= δ: t_u = (.01 − .05)/.016330 = −√6, p_u = P(T_4 <= −√6) = .035242.
    # TOST p = max = .035242 <= .05: equivalent. Its 90% CI .01 ± 2.131847·.016330 = (−.024813, .044813) lies in ±.05.
    r = tost(A_EQ, B_EQ, 0.05)
    assert r.margin == 0.05 and r.df == pytest.approx(4.0) and r.diff == pytest.approx(0.01)
    assert r.t_lower == pytest.approx(3.674235, abs=1e-6) and r.t_upper == pytest.approx(-math.sqrt(6), abs=1e-6)
    assert r.p_lower == pytest.approx(0.010656, abs=1e-6) and r.p_upper == pytest.approx(0.035242, abs=1e-6)
    assert r.p == r.p_upper and r.equivalent
    assert (r.ci90_low, r.ci90_high) == (pytest.approx(-0.024813, abs=1e-6), pytest.approx(0.044813, abs=1e-6))
    assert (r.ci95_low, r.ci95_high) == (pytest.approx(-0.035339, abs=1e-6), pytest.approx(0.055339, abs=1e-6))


def test_tost_not_equivalent_within_a_narrow_margin_by_hand():
    from respo.study.stats import tost

    # δ = .03: t_l = .04/.016330 = √6, p_l = .035242; t_u = −.02/.016330 = −1.224745 (t² = 1.5):
    # F_4(1.224745) = .5 + .75·√(1.5/5.5)·(1 − 1.5/16.5) = .856068, p_u = .143932. TOST p = .143932 > .05:
    # not shown equivalent (the 90% CI's upper end .044813 passes +.03), and not different either (p = .573).
    r = tost(A_EQ, B_EQ, 0.03)
    assert r.p_lower == pytest.approx(0.035242, abs=1e-6) and r.p_upper == pytest.approx(0.143932, abs=1e-6)
    assert r.p == pytest.approx(0.143932, abs=1e-6) and not r.equivalent
    # the test is symmetric: swapping the sides swaps the two one-sided tests
    s = tost(B_EQ, A_EQ, 0.03)
    assert s.p_lower == pytest.approx(r.p_upper) and s.p_upper == pytest.approx(r.p_lower) and s.p == pytest.approx(r.p)


def test_tost_unequal_variances_and_degenerate_cases():
    from respo.study.stats import student_t_cdf, tost

    # a = [1, 2, 3, 4], b = [2, 4] (test_welch_by_hand): diff −.5, se = √(17/12) = 1.190238, df = 1.897155.
    # δ = 3: t_l = 2.5/1.190238 = 2.100420, t_u = −3.5/1.190238 = −2.940588, one-sided tails at df 1.897155
    r = tost([1, 2, 3, 4], [2, 4], 3.0)
    assert r.df == pytest.approx(1.897155, abs=1e-6)
    assert r.t_lower == pytest.approx(2.100420, abs=1e-6) and r.t_upper == pytest.approx(-2.940588, abs=1e-6)
    assert r.p_lower == pytest.approx(1 - student_t_cdf(2.100420, 1.897155), abs=1e-6)
    assert r.p_upper == pytest.approx(student_t_cdf(-2.940588, 1.897155), abs=1e-6)
    assert r.p == max(r.p_lower, r.p_upper) and r.equivalent == (r.p <= 0.05)
    with pytest.raises(ValueError):
        tost([1, 2], [1, 2], 0.0)  # a margin must be positive
    one = tost([0.5], [0.4, 0.3], 0.1)  # one seed: no test
    assert math.isnan(one.p) and not one.equivalent
    flat = tost([1.0, 1.0], [1.02, 1.02], 0.03)  # zero spread, |diff| = .02 < δ: exactly equivalent
    assert flat.p == 0.0 and flat.equivalent
    assert tost([1.0, 1.0], [1.05, 1.05], 0.03).p == 1.0  # zero spread, |diff| = .05 > δ


# Holm (step-down) and Benjamini–Hochberg (step-up) by hand, p = [.01, .04, .03, .20], m = 4.
# Sorted: .01 (#0), .03 (#2), .04 (#1), .20 (#3).
#   Holm: 4·.01 = .04; 3·.03 = .09; 2·.04 = .08 -> running max .09; 1·.20 = .20       -> [.04, .09, .09, .20]
#   BH, from the largest: .20·4/4 = .20; .04·4/3 = .05333; .03·4/2 = .06 -> running min .05333;
#       .01·4/1 = .04                                                                  -> [.04, .05333, .05333, .20]
@pytest.mark.parametrize("method, expected", [("holm", [0.04, 0.09, 0.09, 0.20]),
                                              ("bh", [0.04, 0.16 / 3, 0.16 / 3, 0.20])])
def test_adjust_by_hand(method, expected):
    from respo.study.stats import adjust

    assert adjust([0.01, 0.04, 0.03, 0.20], method) == pytest.approx(expected, abs=1e-12)


def test_adjust_ties_cap_nan_and_bad_input():
    from respo.study.stats import adjust

    # ties: [.02, .02, .5]. Holm: 3·.02 = .06, 2·.02 = .04 -> .06, .5 -> [.06, .06, .5];
    # BH: .5; .02·3/2 = .03; .02·3/1 = .06 -> min .03 -> [.03, .03, .5]. Tied p's get one adjusted value.
    assert adjust([0.02, 0.02, 0.5], "holm") == pytest.approx([0.06, 0.06, 0.5])
    assert adjust([0.02, 0.02, 0.5], "bh") == pytest.approx([0.03, 0.03, 0.5])
    # the cap at 1: Holm [.6, .7]: 2·.6 = 1.2 -> 1, then max(1, .7) = 1; BH: .7, min(2·.6, .7) = .7
    assert adjust([0.6, 0.7], "holm") == [1.0, 1.0] and adjust([0.6, 0.7], "bh") == pytest.approx([0.7, 0.7])
    assert adjust([1.0, 1.0, 1.0], "holm") == [1.0, 1.0, 1.0] and adjust([1.0, 1.0], "bh") == [1.0, 1.0]
    # an undefined p (no test) is not a member of the family: m counts the defined ones, NaN stays NaN.
    # Holm over [.01, .04] (m = 2): [.02, .04]
    out = adjust([0.01, math.nan, 0.04], "holm")
    assert out[0] == pytest.approx(0.02) and math.isnan(out[1]) and out[2] == pytest.approx(0.04)
    assert adjust([], "bh") == [] and adjust([0.3], "holm") == [0.3]
    # adjusted p's are never below the raw ones and keep their order
    ps = [0.001, 0.2, 0.049, 0.3, 0.011, 0.04]
    for m in ("holm", "bh"):
        adj = adjust(ps, m)
        assert all(q >= p for p, q in zip(ps, adj))
        assert [i for i, _ in sorted(enumerate(ps), key=lambda x: x[1])] == \
            [i for i, _ in sorted(enumerate(adj), key=lambda x: (x[1], ps[x[0]]))]
    # Holm (FWER) is never less strict than BH (FDR): its i-th multiplier (m − i + 1) >= m/i, as (i − 1)(m − i) >= 0
    assert all(h >= q for h, q in zip(adjust(ps, "holm"), adjust(ps, "bh")))
    with pytest.raises(ValueError, match="method"):
        adjust([0.1], "bonferroni-ish")
    with pytest.raises(ValueError, match="p value"):
        adjust([0.1, 1.5], "holm")


def test_adjust_matches_scipy_and_statsmodels():
    # Cross-check against the libraries where they are installed (neither is a dependency of respo).
    from respo.study.stats import adjust

    stats = pytest.importorskip("scipy.stats") if _has("scipy") else None
    multitest = pytest.importorskip("statsmodels.stats.multitest") if _has("statsmodels") else None
    if stats is None and multitest is None:
        pytest.skip("neither scipy nor statsmodels is installed")
    families = [[0.01, 0.04, 0.03, 0.20], [0.02, 0.02, 0.5], [0.6, 0.7], [0.001, 0.2, 0.049, 0.3, 0.011, 0.04],
                [0.008, 0.0001, 0.012, 0.004, 0.045, 0.041, 0.054, 0.059, 0.14, 0.9, 1.0]]
    for ps in families:
        if stats is not None:
            assert adjust(ps, "bh") == pytest.approx(list(stats.false_discovery_control(ps, method="bh")), abs=1e-12)
        if multitest is not None:
            for ours, theirs in (("holm", "holm"), ("bh", "fdr_bh")):
                assert adjust(ps, ours) == pytest.approx(list(multitest.multipletests(ps, method=theirs)[1]),
                                                         abs=1e-12)


def test_welch_interval_and_tost_match_scipy_and_statsmodels():
    # scipy's Welch test and interval, statsmodels' TOST with unequal variances (where installed)
    from respo.study.stats import tost, welch

    samples = [(A_EQ, B_EQ), ([1, 2, 3, 4], [2, 4]), ([0.332, 0.30, 0.36], [0.62, 0.64, 0.60, 0.63]),
               ([0.5, 0.55, 0.61, 0.58, 0.49], [0.52, 0.5])]
    if _has("scipy"):
        from scipy import stats

        for a, b in samples:
            w, ref = welch(a, b), stats.ttest_ind(a, b, equal_var=False)
            ci = ref.confidence_interval(0.95)
            assert (w.p, w.ci_low, w.ci_high) == pytest.approx((ref.pvalue, ci.low, ci.high), abs=1e-10)
    if _has("statsmodels"):
        from statsmodels.stats.weightstats import ttost_ind

        for a, b in samples:
            for margin in (0.03, 0.1, 3.0):
                r, (p, lower, upper) = tost(a, b, margin), ttost_ind(a, b, -margin, margin, usevar="unequal")
                assert (r.p, r.p_lower, r.p_upper) == pytest.approx((p, lower[1], upper[1]), abs=1e-10)
    if not (_has("scipy") or _has("statsmodels")):
        pytest.skip("neither scipy nor statsmodels is installed")


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.mark.parametrize("kwargs, expected", [
    # two-sided test rejects (p = .0213 <= .05): a is worse / better
    (dict(a=[1, 2, 3], b=[4, 5, 6]), "worse"),
    (dict(a=[4, 5, 6], b=[1, 2, 3]), "better"),
    # ... but not after adjustment (adjusted p .09 > .05): the raw interval is given and the adjustment named
    (dict(a=[1, 2, 3], b=[4, 5, 6], p=0.09), "no difference detected after adjustment (95 % CI -5.267, -0.733)"),
    # TOST rejects at δ = .05 (p = .0352) and the two-sided test does not (p = .573)
    (dict(a=A_EQ, b=B_EQ, margin=0.05), "equivalent within ±0.05"),
    # TOST p .0352 adjusted to .07: not shown equivalent any more
    (dict(a=A_EQ, b=B_EQ, margin=0.05, p_tost=0.07), "no difference detected (95 % CI -0.035, +0.055)"),
    (dict(a=A_EQ, b=B_EQ, margin=0.03), "no difference detected (95 % CI -0.035, +0.055)"),
    (dict(a=A_EQ, b=B_EQ), "no difference detected (95 % CI -0.035, +0.055)"),
    # one value on a side: no test, no verdict
    (dict(a=[0.5], b=[0.4, 0.3], margin=0.05), "no test (n = 1)"),
    (dict(a=[], b=[0.4, 0.3]), "no test (n = 0)"),
])
def test_verdict_wording(kwargs, expected):
    from respo.study.stats import tost, verdict, welch

    a, b, margin = kwargs.pop("a"), kwargs.pop("b"), kwargs.pop("margin", None)
    # 95% CI of [1,2,3] − [4,5,6]: −3 ± 2.776445·.816497 = (−5.266958, −.733042)
    assert verdict(welch(a, b), tost(a, b, margin) if margin else None, **kwargs) == expected


def test_verdict_different_and_equivalent_says_both():
    from respo.study.stats import tost, verdict, welch

    # a tiny but clear difference inside a wide margin: a = [1.00, 1.01, 1.02] vs b = [1.05, 1.06, 1.07]
    # (diff −.05, se = .008165, t = −6.124, p ≈ .0036) with δ = .2: both tests reject
    a, b = [1.00, 1.01, 1.02], [1.05, 1.06, 1.07]
    assert verdict(welch(a, b), tost(a, b, 0.2)) == "worse (by less than 0.2: equivalent within ±0.2)"


def test_n3_rank_test_floor_is_stated():
    # with 3 seeds a side the exact two-sided Mann–Whitney p is at least 2/C(6,3) = 2/20 = .10 (the most
    # extreme of the 20 equally likely splits, on either side): the docstring must say so
    import respo.study.stats as s

    assert math.comb(6, 3) == 20 and "p < .10" in s.__doc__ and "normal" in s.__doc__


def test_judge_tests_a_family_adjusts_it_and_words_each_verdict():
    # three pairs as one family: [1,2,3] vs [4,5,6] (p = .021312), A_EQ vs B_EQ (p = .573392, TOST p at ±.05
    # = .035242), a one-seed pair (no test, not a member of the family). BH over the two defined p's:
    # .573392 stays; .021312·2/1 = .042624 -> still worse. TOST p's: diff −3 at δ = .05 gives
    # p_l = P(T_4 >= −2.95/.816497 = −3.613) = .989, so [.989, .035242]; BH: .035242·2/1 = .070484 -> not shown
    # equivalent after adjustment
    from respo.study.stats import judge

    out = judge([([1, 2, 3], [4, 5, 6]), (A_EQ, B_EQ), ([0.5], [0.4, 0.3])], margin=0.05, method="bh")
    assert [j.p_adj for j in out[:2]] == [pytest.approx(0.042624, abs=1e-6), pytest.approx(0.573392, abs=1e-6)]
    assert math.isnan(out[2].p_adj) and out[2].verdict == "no test (n = 1)"
    assert out[0].verdict == "worse" and out[0].method == "bh"
    assert out[1].tost.p == pytest.approx(0.035242, abs=1e-6) and out[1].p_tost_adj == pytest.approx(0.070484, abs=1e-6)
    assert out[1].verdict == "no difference detected (95 % CI -0.035, +0.055)"
    # alone, the equivalence holds; Holm over the same family doubles the smallest p (.042624 -> worse)
    assert judge([(A_EQ, B_EQ)], margin=0.05)[0].verdict == "equivalent within ±0.05"
    assert judge([([1, 2, 3], [4, 5, 6]), (A_EQ, B_EQ)], method="holm")[0].p_adj == pytest.approx(0.042624, abs=1e-6)
    assert judge([], margin=0.03) == []


# ---- paired tests over seeds and the 2 x 2 factorial (df = 2 has closed forms) -------------------------
# For df = 2: P(|T| >= t) = 1 - t/sqrt(t^2 + 2), the one-sided tail is half that, t_{.975, 2} = 4.302653.
def test_paired_t_by_hand_and_what_pairing_gains_over_welch():
    from respo.study.stats import paired, welch

    a, b = [0.5, 0.6, 0.7], [0.4, 0.45, 0.65]
    # d = [.10, .15, .05]: mean .10, s_d = sqrt((0 + .05^2 + .05^2)/2) = .05, se = .05/sqrt(3) = .028868,
    # t = 3.4641, df = 2, p = 1 - 3.4641/sqrt(12 + 2) = 1 - .92582 = .07418,
    # CI .10 ± 4.302653 * .028868 = .10 ± .12421 = [-.02421, .22421]
    t = paired(a, b)
    assert (t.diff, t.se, t.t, t.df, t.n) == (pytest.approx(0.1), pytest.approx(0.028868, abs=1e-6),
                                               pytest.approx(3.4641, abs=1e-4), 2.0, 3)
    assert t.p == pytest.approx(0.07418, abs=1e-5)
    assert (t.ci_low, t.ci_high) == (pytest.approx(-0.02421, abs=1e-5), pytest.approx(0.22421, abs=1e-5))
    # unpaired, the seed-to-seed spread stays in the error: Welch's se = sqrt(.01/3 + .0175/3) = .095743,
    # t = 1.0445, p = .359
    assert welch(a, b).p == pytest.approx(0.3593, abs=1e-4)


def test_paired_drops_a_pair_with_a_missing_value_and_needs_aligned_samples():
    from respo.study.stats import paired

    t = paired([0.5, math.nan, 0.6, 0.7], [0.4, 0.9, 0.45, 0.65])  # the second seed has no value in a
    assert t.n == 3 and t.diff == pytest.approx(0.1)
    assert math.isnan(paired([0.5], [0.4]).p)  # one pair: no test
    with pytest.raises(ValueError, match="one value of each per pair"):
        paired([0.5, 0.6], [0.4])


def test_paired_tost_by_hand():
    from respo.study.stats import paired_tost

    # d = [.02, -.01, .01]: mean .006667, s_d = .015275, se = .0088192, df = 2
    # lower: t = (.006667 + .05)/.0088192 = 6.4254, p = (1 - 6.4254/sqrt(41.286 + 2))/2 = .011693
    # upper: t = (.006667 - .05)/.0088192 = -4.9135, p = (1 - 4.9135/sqrt(24.143 + 2))/2 = .019506
    eq = paired_tost([0.5, 0.6, 0.7], [0.48, 0.61, 0.69], 0.05)
    assert eq.p_lower == pytest.approx(0.011693, abs=1e-5) and eq.p_upper == pytest.approx(0.019506, abs=1e-5)
    assert eq.p == eq.p_upper and eq.equivalent


def test_factorial_2x2_contrasts_by_hand():
    from respo.study.stats import FACTORIAL_CONTRASTS, factorial_2x2

    rr, rv = [0.50, 0.60, 0.55], [0.60, 0.68, 0.65]  # R+R-, R+V-
    vr, vv = [0.40, 0.52, 0.42], [0.62, 0.70, 0.66]  # V+R-, V+V-
    # per seed: R+R- - R+V- = -.10, -.08, -.10;  V+R- - V+V- = -.22, -.18, -.24
    #           R+R- - V+R- =  .10,  .08,  .13;  R+V- - V+V- = -.02, -.02, -.01
    # negative branch c- = ½[(-.10 - .22), (-.08 - .18), (-.10 - .24)] = -.16, -.13, -.17: mean -.153333,
    #   s = sqrt((.006667^2 + .023333^2 + .016667^2)/2) = .020817, se = .012019, t = -12.758,
    #   p = 1 - 12.758/sqrt(162.77 + 2) = .006088
    # positive branch c+ = ½[(.10 - .02), (.08 - .02), (.13 - .01)] = .04, .03, .06: mean .043333, s = .015275,
    #   se = .0088192, t = 4.9135, p = 1 - 4.9135/sqrt(24.143 + 2) = .039012, CI .043333 ± 4.302653 * .0088192
    #   = [.005388, .081279]
    # interaction c× = (-.10 + .22), (-.08 + .18), (-.10 + .24) = .12, .10, .14: mean .12, s = .02,
    #   se = .011547, t = 10.392, p = 1 - 10.392/sqrt(108 + 2) = .009133
    c = factorial_2x2(rr, rv, vr, vv)
    assert tuple(c) == FACTORIAL_CONTRASTS == ("negative branch", "positive branch", "interaction")
    neg, pos, inter = (c[k] for k in FACTORIAL_CONTRASTS)
    assert neg.diff == pytest.approx(-0.153333, abs=1e-6) and neg.t == pytest.approx(-12.758, abs=1e-3)
    assert neg.p == pytest.approx(0.006088, abs=1e-6)
    assert pos.diff == pytest.approx(0.043333, abs=1e-6) and pos.p == pytest.approx(0.039012, abs=1e-6)
    assert (pos.ci_low, pos.ci_high) == (pytest.approx(0.005388, abs=1e-6), pytest.approx(0.081279, abs=1e-6))
    assert inter.diff == pytest.approx(0.12) and inter.p == pytest.approx(0.009133, abs=1e-6)
    # a seed missing in one arm leaves every contrast
    c = factorial_2x2(rr + [0.5], rv + [math.nan], vr + [0.4], vv + [0.6])
    assert all(t.n == 3 for t in c.values()) and c["interaction"].diff == pytest.approx(0.12)


def test_missing_seeds_bounds_what_further_seeds_within_the_range_could_do():
    from respo.study.stats import factorial_contrasts, missing_seeds

    # xs = [-1, 1], one more seed on the grid -1, 0, 1 (grid = 3):
    #   v = 0: [-1, 1, 0], mean 0, s = 1, se = 1/sqrt(3) = .57735: p = 1; TOST (δ = 2) t = 2/.57735 = 3.4641 on
    #     df 2, one-sided p = 1/2 - 3.4641/(2 sqrt(3.4641^2 + 2)) = .5 - 3.4641/7.4833 = .037100
    #   v = 1: [-1, 1, 1], mean 1/3, s = sqrt(((4/3)^2 + 2 (2/3)^2)/2) = 1.154701, se = .666667, t = .5:
    #     P(T_2 <= .5) = 1/2 + .5/(2 sqrt(2.25)) = .666667, p = .666667; TOST upper t = (1/3 - 2)/.666667 = -2.5,
    #     p = 1/2 - 2.5/(2 sqrt(8.25)) = .064805 (v = -1 alike, by symmetry)
    m = missing_seeds([-1.0, 1.0], 1, 2.0, grid=3)
    assert (m.k, m.low, m.high, m.n) == (1, -1.0, 1.0, 3)
    assert m.p_min == pytest.approx(2 / 3, abs=1e-6) and m.p_tost_max == pytest.approx(0.064805, abs=1e-6)
    # two more seeds: the most extreme is v = (1, 1): [-1, 1, 1, 1], mean .5, s = 1, se = .5, t = 1 on df 3:
    #   P(T_3 <= 1) = 1/2 + [ (1/sqrt 3)/(1 + 1/3) + atan(1/sqrt 3) ]/π = .5 + (.433013 + .523599)/π = .804499,
    #   p = 2 (1 - .804499) = .391002
    assert missing_seeds([-1.0, 1.0], 2, 2.0, grid=3).p_min == pytest.approx(0.391002, abs=1e-6)
    # a finer grid can only find a more extreme combination
    assert missing_seeds([-1.0, 1.0], 2, 2.0, grid=21).p_min <= missing_seeds([-1.0, 1.0], 2, 2.0, grid=3).p_min
    with pytest.raises(ValueError, match="k must be an integer >= 1, got 0"):
        missing_seeds([0.1, 0.2], 0, 0.05)
    with pytest.raises(ValueError, match="needs at least one finite value"):
        missing_seeds([math.nan], 2, 0.05)
    with pytest.raises(ValueError, match="combinations"):
        missing_seeds([0.1, 0.2], 12, 0.05, grid=101)
    # the per-seed contrasts factorial_2x2 tests (the hand-worked arms of the test above)
    c = factorial_contrasts([0.50, 0.60, 0.55], [0.60, 0.68, 0.65], [0.40, 0.52, 0.42], [0.62, 0.70, 0.66])
    assert c["negative branch"] == pytest.approx([-0.16, -0.13, -0.17])
    assert c["interaction"] == pytest.approx([0.12, 0.10, 0.14])


def test_adjusted_p_values_never_fall_when_a_raw_p_rises():
    # what `respo table factorial --missing-seeds` relies on to bound adjusted p's by adjusting bounds
    import random

    from respo.study.stats import adjust

    rng = random.Random(0)
    for _ in range(3000):
        m = rng.randint(2, 5)
        p = [rng.random() ** rng.choice((1, 3)) for _ in range(m)]
        q = list(p)
        k = rng.randrange(m)
        q[k] = min(1.0, p[k] + 0.3 * rng.random())
        for method in ("holm", "bh"):
            assert all(b >= a - 1e-12 for a, b in zip(adjust(p, method), adjust(q, method))), (p, q, method)


def test_minimum_detectable_effect_by_hand():
    from respo.study.stats import min_detectable, seeds_needed

    # df = 2: P(T <= t) = 1/2 + t/(2 sqrt(t^2 + 2)); at .80, t/sqrt(t^2 + 2) = .6, .64 t^2 = .72, t_{.80, 2} =
    # sqrt(1.125) = 1.060660; t_{.975, 2} = 4.302653. n = 3, sd .06: (4.302653 + 1.060660) * .06/sqrt(3)
    # = 5.363313 * .034641 = .185791
    assert min_detectable(0.06, 3) == pytest.approx(0.185791, abs=1e-6)
    # halving sd halves it; power .5 drops the second quantile (t_{.5} = 0): 4.302653 * .034641 = .149048
    assert min_detectable(0.03, 3) == pytest.approx(0.185791 / 2, abs=1e-6)
    assert min_detectable(0.06, 3, power=0.5) == pytest.approx(0.149048, abs=1e-6)
    # n = 12, sd .06 (df 11: t_{.975} = 2.200985, t_{.80} = 0.875530): 3.076515 * .017321 = .053287
    assert min_detectable(0.06, 12) == pytest.approx(0.053287, abs=1e-5)
    # at Holm's smallest threshold over three contrasts, alpha = .05/3 (t_{1 - .05/6, 11} = 2.820034: wider)
    assert min_detectable(0.06, 12, alpha=0.05 / 3) > min_detectable(0.06, 12)
    # seeds for .05 at sd .06: n = 13 gives (2.178813 + 0.872609) * .06/sqrt(13) = .050779 > .05;
    # n = 14 gives (2.160369 + 0.870152) * .06/sqrt(14) = .048596 <= .05
    assert seeds_needed(0.05, 0.06) == 14
    assert seeds_needed(1.0, 0.06) == 2  # the smallest n with a test
    assert math.isnan(min_detectable(0.06, 1)) and math.isnan(min_detectable(math.nan, 5))
    with pytest.raises(ValueError, match="power must lie in \\(0, 1\\), got 1.2"):
        min_detectable(0.06, 3, power=1.2)
    with pytest.raises(ValueError, match="effect must be a finite number > 0, got 0"):
        seeds_needed(0, 0.06)


def test_judge_pairs_by_seed_when_asked():
    from respo.study.stats import judge

    a, b = [0.5, 0.6, 0.7], [0.4, 0.45, 0.65]
    (unpaired,), (by_seed,) = judge([(a, b)]), judge([(a, b)], paired_by_seed=True)
    assert unpaired.p == pytest.approx(0.3593, abs=1e-4) and by_seed.p == pytest.approx(0.07418, abs=1e-5)
    # one test in the family: the adjusted p is the p; the verdict quotes the paired interval
    assert by_seed.p_adj == by_seed.p and by_seed.verdict == "no difference detected (95 % CI -0.024, +0.224)"
