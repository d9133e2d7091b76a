"""The engine–trainer mismatch metrics and the rollout-correction weights, by hand."""

import math

import pytest
import torch

from respo.core import fold_rollout_log_ratio
from respo.core.mismatch import mismatch_metrics, rollout_correction_weights


def _two_rows():
    # row 0: log ρ = old − rollout = (0.5, −0.5), both valid; row 1: log ρ = (1.5, ·), one valid token
    old = torch.tensor([[-1.0, -2.0], [-0.5, -9.0]])
    rollout = torch.tensor([[-1.5, -1.5], [-2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    return old, rollout, mask


def test_mismatch_metrics_by_hand():
    m = mismatch_metrics(*_two_rows())
    # tokens: log ρ = 0.5, −0.5, 1.5 (3 valid)
    assert float(m["rollout_corr/abs_diff"]) == pytest.approx((0.5 + 0.5 + 1.5) / 3)
    assert float(m["rollout_corr/kl"]) == pytest.approx(-(0.5 - 0.5 + 1.5) / 3)  # mean(rollout − old)
    k3 = sum(math.exp(x) - x - 1 for x in (0.5, -0.5, 1.5)) / 3  # (0.14872 + 0.10653 + 2.98169) / 3
    assert float(m["rollout_corr/k3_kl"]) == pytest.approx(k3, rel=1e-6)
    # per-sequence log ρ_i: row 0 sums to 0, row 1 is 1.5; mean |per-token mean| = (0 + 1.5) / 2
    assert float(m["rollout_corr/log_ppl_abs_diff"]) == pytest.approx(0.75)
    chi2_token = (math.exp(1) + math.exp(-1) + math.exp(3)) / 3 - 1
    assert float(m["rollout_corr/chi2_token"]) == pytest.approx(chi2_token, rel=1e-6)
    assert float(m["rollout_corr/chi2_seq"]) == pytest.approx((1 + math.exp(3)) / 2 - 1, rel=1e-6)
    # quantiles of (0, 1.5) with linear interpolation: p10 = 0.15, p90 = 1.35; one of two rows beyond ±1
    assert float(m["rollout_corr/seq_log_ratio_p10"]) == pytest.approx(0.15)
    assert float(m["rollout_corr/seq_log_ratio_p90"]) == pytest.approx(1.35)
    assert float(m["rollout_corr/seq_frac_beyond_1"]) == pytest.approx(0.5)


def test_mismatch_metrics_take_half_precision_and_are_zero_without_mismatch():
    old = torch.randn(3, 5).to(torch.bfloat16)
    m = mismatch_metrics(old, old.clone(), torch.ones(3, 5, dtype=torch.bfloat16))
    assert all(float(v) == 0 for k, v in m.items() if not k.endswith(("chi2_token", "chi2_seq")))
    assert float(m["rollout_corr/chi2_token"]) == pytest.approx(0, abs=1e-6)


def test_token_and_sequence_truncation_by_hand():
    old, rollout, mask = _two_rows()
    w, level = rollout_correction_weights(old, rollout, mask, "token-tis", 2.0)
    # ρ = e^.5 = 1.6487, e^−.5 = .6065, e^1.5 = 4.4817 → capped at 2; the masked token is 0
    assert level == "token"
    assert torch.allclose(w, torch.tensor([[math.exp(0.5), math.exp(-0.5)], [2.0, 0.0]]))
    w, level = rollout_correction_weights(old, rollout, mask, "seq-tis", 2.0)
    # ρ_0 = e^0 = 1 on both tokens, ρ_1 = e^1.5 capped at 2
    assert level == "sequence" and torch.allclose(w, torch.tensor([[1.0, 1.0], [2.0, 0.0]]))


def test_rejection_by_hand_and_the_fold():
    old, rollout, mask = _two_rows()
    w, level = rollout_correction_weights(old, rollout, mask, "seq-mis", 2.0)
    assert torch.allclose(w, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))  # row 1's ρ = 4.48 > 2: rejected
    log_rho, kept = fold_rollout_log_ratio(w, mask, level=level)
    assert torch.equal(kept, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))  # the rejected row leaves the mask
    assert torch.allclose(log_rho, torch.zeros(2, 2))  # log 1 = 0 for row 0
    w, _ = rollout_correction_weights(old, rollout, mask, "token-mis", 2.0)
    assert torch.allclose(w, torch.tensor([[math.exp(0.5), math.exp(-0.5)], [0.0, 0.0]]))


@pytest.mark.parametrize("mode, threshold", [("off", 2.0), ("seq", 2.0), ("seq-tis", 0.0), ("seq-tis", float("inf"))])
def test_bad_correction_settings_are_refused(mode, threshold):
    with pytest.raises(ValueError, match="rollout correction"):
        rollout_correction_weights(*_two_rows(), mode, threshold)
