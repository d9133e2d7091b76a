"""Evaluation maths: unbiased pass@k, mean@k and standard errors, worked by hand."""

import math

import pytest
import torch

from respo.train.evaluate import paired_difference, pass_at_k, summarize_correct


def test_pass_at_k_hand_values():
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)  # 1 - C(2,2)/C(4,2)
    assert pass_at_k(4, 1, 4) == 1.0 and pass_at_k(4, 1, 1) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_pass_at_k_is_unbiased_by_enumeration():
    # E over all size-k subsets of the n samples of 1[any correct] equals the estimator exactly.
    from itertools import combinations

    n, c, k = 6, 2, 3
    samples = [1] * c + [0] * (n - c)
    subsets = list(combinations(samples, k))
    assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))


def test_summary_of_a_correctness_table():
    correct = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.float)  # (P=3, k=4)
    out = summarize_correct(correct)
    # per-prompt means 0.5, 0, 1 -> mean 0.5, sample std 0.5, SE 0.5/sqrt(3)
    assert out["mean@4"] == pytest.approx(0.5) and out["mean@4_se"] == pytest.approx(0.5 / math.sqrt(3))
    assert out["pass@4"] == pytest.approx(2 / 3)
    # pass@2 per prompt: 1 - C(2,2)/C(4,2) = 5/6, 0, 1
    assert out["pass@2"] == pytest.approx((5 / 6 + 0 + 1) / 3)
    assert out["per_prompt_mean"] == [0.5, 0.0, 1.0]


def test_paired_difference():
    d, se = paired_difference([0.5, 0.0, 1.0], [0.75, 0.25, 1.0])  # diffs .25 .25 0
    assert d == pytest.approx(1 / 6) and se == pytest.approx(math.sqrt(1 / 48) / math.sqrt(3))
