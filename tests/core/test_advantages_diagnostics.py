"""Group advantages and weight diagnostics, worked by hand."""

import math

import pytest
import torch

from respo import group_advantages, policy_loss, weight_diagnostics

f64 = torch.float64


def test_group_advantages_by_hand():
    # One group of 4: r = [1, −1, 1, 1], mean 0.5, deviations [.5, −1.5, .5, .5],
    # unbiased std = sqrt((3·0.25 + 2.25)/3) = 1.
    r = torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0], dtype=f64)
    grpo = group_advantages(r, 4, eps=0.0)
    assert grpo[:4].tolist() == pytest.approx([0.5, -1.5, 0.5, 0.5])
    # the second group is all −1: no signal, advantages exactly 0 (0 / (0 + eps))
    assert group_advantages(r, 4)[4:].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert group_advantages(r, 4, kind="drgrpo")[:4].tolist() == pytest.approx([0.5, -1.5, 0.5, 0.5])
    # RLOO: r_i − mean of the others: 1 − (−1+1+1)/3 = 2/3; −1 − 1 = −2
    assert group_advantages(r, 4, kind="rloo")[:4].tolist() == pytest.approx([2 / 3, -2.0, 2 / 3, 2 / 3])


def test_group_advantages_errors():
    with pytest.raises(ValueError, match="multiple of group_size"):
        group_advantages(torch.ones(7), 4)
    with pytest.raises(ValueError, match="group_size must be an integer >= 2"):
        group_advantages(torch.ones(4), 1)
    with pytest.raises(ValueError, match="valid kinds: grpo, drgrpo, rloo"):
        group_advantages(torch.ones(4), 2, kind="ppo")
    with pytest.raises(ValueError, match="1 non-finite"):
        group_advantages(torch.tensor([1.0, math.nan]), 2)
    # integer rewards are accepted and promoted to float
    assert group_advantages(torch.tensor([1, 0]), 2, kind="drgrpo").tolist() == [0.5, -0.5]


def test_weight_diagnostics_by_hand():
    # 5 responses (one all-masked row, ignored): log W = [−2, −0.5, 0, 1, (9)], Â = [+1, +1, −1, +1, (+1)],
    # φ = [0.9, 0.3, 0.0005, 0.2, (7)].
    log_w = torch.tensor([-2.0, -0.5, 0.0, 1.0, 9.0], dtype=f64)
    phi = torch.tensor([0.9, 0.3, 0.0005, 0.2, 7.0], dtype=f64)
    adv = torch.tensor([1.0, 1.0, -1.0, 1.0, 1.0], dtype=f64)
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1], [0, 0]], dtype=f64)
    d = weight_diagnostics(log_w, phi, adv, mask)
    # positives: rows 0, 1, 3; with log W < −1: row 0 → 1/3; its mass 0.9/(0.9+0.3+0.2) = 0.642857
    assert d["frac_pos_low_w"].item() == pytest.approx(1 / 3)
    assert d["pos_low_w_mass_share"].item() == pytest.approx(0.9 / 1.4)
    # starved (φ < 1e-3): row 2 → 1/4
    assert d["frac_starved"].item() == pytest.approx(0.25)
    assert d["coef_mean"].item() == pytest.approx((0.9 + 0.3 + 0.0005 + 0.2) / 4)
    assert d["phi/pos_max"].item() == 0.9 and d["phi/pos_min"].item() == 0.2
    assert d["phi/neg_mean"].item() == 0.0005
    assert d["n_pos"].item() == 3 and d["n_neg"].item() == 1
    # ESS of W = e^[−2, −.5, 0, 1]: (Σw)²/(4Σw²)
    w = torch.exp(log_w[:4])
    assert d["ess_w"].item() == pytest.approx(float(w.sum() ** 2 / (4 * (w**2).sum())), rel=1e-12)
    p = phi[:4]
    assert d["ess_phi"].item() == pytest.approx(float(p.sum() ** 2 / (4 * (p**2).sum())), rel=1e-12)
    # k1 KL per token: −Σ log W / tokens = −(−2 − .5 + 0 + 1)/7 = 1.5/7
    assert d["approx_kl"].item() == pytest.approx(1.5 / 7)
    assert d["log_w/p50"].item() == pytest.approx(-0.25)  # median of [−2, −.5, 0, 1]
    assert d["log_w/max"].item() == 1.0  # the masked row's 9 is ignored


def test_weight_diagnostics_empty_sets_are_nan_not_zero():
    d = weight_diagnostics(torch.zeros(2), torch.ones(2), torch.tensor([-1.0, -1.0]), torch.ones(2, 3))
    assert math.isnan(d["phi/pos_mean"].item()) and math.isnan(d["frac_pos_low_w"].item())
    assert d["n_pos"].item() == 0


def test_ess_does_not_overflow():
    # W up to e^20 and down to e^−20: log-space ESS is finite; one dominant weight gives ≈ 1/n.
    log_w = torch.tensor([20.0, -20.0, -20.0, -20.0])
    d = weight_diagnostics(log_w, torch.ones(4), torch.ones(4), torch.ones(4, 2))
    assert d["ess_w"].item() == pytest.approx(0.25, rel=1e-6)


def test_staleness_shows_starvation_in_vespo_not_respo():
    # Under-generated positives (log W = −3): VESPO's φ⁺ = e^−6·e^(3(1−e^−3)) = 0.0025·17.1 ≈ 0.0428,
    # ReSPO's φ⁺ = ((1+e^−3)/2)·e^(1−e^−3) ≈ 0.525·2.58 ≈ 1.355. Mass share of those two among positives
    # with two more at log W = 0 (φ = 1): VESPO 0.0856/2.0856 ≈ 0.041, ReSPO 2.71/4.71 ≈ 0.575.
    logp = torch.zeros(4, 3, dtype=f64)
    old = torch.tensor([[1.0] * 3, [1.0] * 3, [0.0] * 3, [0.0] * 3], dtype=f64)
    adv = torch.ones(4, dtype=f64)
    mask = torch.ones(4, 3, dtype=f64)
    _, mr = policy_loss("respo", logp, old, adv, mask)
    _, mv = policy_loss("vespo", logp, old, adv, mask)
    assert mr["frac_pos_low_w"].item() == mv["frac_pos_low_w"].item() == 0.5
    assert mv["pos_low_w_mass_share"].item() == pytest.approx(0.041, abs=2e-3)
    assert mr["pos_low_w_mass_share"].item() == pytest.approx(0.575, abs=2e-3)


def test_weight_diagnostics_keys():
    # The earlier keys stay; the same-batch comparison and the per-sign log W histogram are added.
    from respo.core.diagnostics import LOG_W_BIN_NAMES

    d = weight_diagnostics(torch.zeros(3), torch.ones(3), torch.tensor([1.0, -1.0, 0.0]), torch.ones(3, 2),
                           token_log_ratio=torch.zeros(3, 2))  # fmt: skip
    earlier = {f"log_w/{q}" for q in ("p01", "p10", "p50", "p90", "p99", "mean", "min", "max")} | {
        "ess_w", "ess_phi", "coef_mean", "n_pos", "n_neg", "n_zero_adv", "frac_pos_low_w", "pos_low_w_mass_share",
        "frac_starved", "approx_kl", "kl_k3",
    } | {f"phi/{s}_{k}" for s in ("pos", "neg") for k in ("mean", "min", "max")}
    added = {"same_batch/frac_pos_low_w", "same_batch/respo_pos_low_w_mass_share",
             "same_batch/vespo_pos_low_w_mass_share"} | {
        f"log_w_hist/{s}/{b}" for s in ("pos", "neg") for b in LOG_W_BIN_NAMES
    }  # fmt: skip
    assert set(d) == earlier | added
    # all rows at log W = 0: one positive and one negative in [0, 0.25), the zero-advantage row in none
    assert d["log_w_hist/pos/[0,0.25)"].item() == 1.0 and d["log_w_hist/neg/[0,0.25)"].item() == 1.0
    assert sum(d[f"log_w_hist/pos/{b}"].item() + d[f"log_w_hist/neg/{b}"].item() for b in LOG_W_BIN_NAMES) == 2.0
