"""Same-batch kernel comparison and the log W histogram of ``weight_diagnostics``, worked by hand."""

import math

import pytest
import torch

from respo import policy_loss, weight_diagnostics
from respo.core.diagnostics import LOG_W_BIN_EDGES, LOG_W_BIN_NAMES, log_w_bin_names, log_w_histogram

f64 = torch.float64
SAME = ("same_batch/frac_pos_low_w", "same_batch/respo_pos_low_w_mass_share", "same_batch/vespo_pos_low_w_mass_share")


def test_same_batch_shares_by_hand():
    # Rows: two positives with log W = −2 and 0, a negative at −3 (not a positive: ignored), an
    # all-masked positive at −5 (empty row: ignored). φ is the objective's (here all 1): irrelevant.
    # ReSPO φ⁺(W) = ((1+W)/2)·e^(1−W):  W = e^−2 = 0.135335 → (1.135335/2)·e^0.864665 = 0.567668·2.374187
    #   = 1.347762; W = 1 → 1. Share of the low positive: 1.347762 / 2.347762 = 0.574062.
    # VESPO φ⁺(W) = W²·e^(3(1−W)): W = e^−2 → e^−4·e^2.593994 = 0.0183156·13.38296 = 0.245120; W = 1 → 1.
    #   Share: 0.245120 / 1.245120 = 0.196865.
    log_w = torch.tensor([-2.0, 0.0, -3.0, -5.0], dtype=f64)
    adv = torch.tensor([1.0, 1.0, -1.0, 1.0], dtype=f64)
    mask = torch.tensor([[1, 1], [1, 1], [1, 1], [0, 0]], dtype=f64)
    d = weight_diagnostics(log_w, torch.ones(4, dtype=f64), adv, mask)
    assert d["same_batch/frac_pos_low_w"].item() == 0.5
    assert d["same_batch/respo_pos_low_w_mass_share"].item() == pytest.approx(0.574062, abs=1e-6)
    assert d["same_batch/vespo_pos_low_w_mass_share"].item() == pytest.approx(0.196865, abs=1e-6)
    # the objective's own share (φ ≡ 1 here) is the plain count share, 1/2
    assert d["pos_low_w_mass_share"].item() == 0.5


def test_same_batch_shares_do_not_depend_on_the_training_objective():
    # One stale batch: rows 0-1 under-generated (log W = −3 per row: three tokens at −1), rows 2-3 on
    # policy, row 4 over-generated; Â = [+, +, +, −, +]. Every objective sees the same log W, so the
    # same_batch keys agree bitwise, and each reshaping objective's own share equals its same-batch key.
    logp = torch.zeros(5, 3, dtype=f64)
    old = torch.tensor([[1.0] * 3, [1.0] * 3, [0.0] * 3, [0.0] * 3, [-0.2] * 3], dtype=f64)
    adv = torch.tensor([1.0, 0.5, 1.0, -1.0, 2.0], dtype=f64)
    mask = torch.ones(5, 3, dtype=f64)
    metrics = {name: policy_loss(name, logp, old, adv, mask)[1] for name in ("respo", "vespo", "grpo", "gspo", "reinforce")}
    for key in SAME:
        values = {name: m[key].item() for name, m in metrics.items()}
        assert len(set(values.values())) == 1, (key, values)
    same = metrics["grpo"]
    assert metrics["respo"]["pos_low_w_mass_share"].item() == pytest.approx(same["same_batch/respo_pos_low_w_mass_share"].item(), rel=1e-12)
    assert metrics["vespo"]["pos_low_w_mass_share"].item() == pytest.approx(same["same_batch/vespo_pos_low_w_mass_share"].item(), rel=1e-12)
    # positives: rows 0, 1, 2, 4; low (log W = −3 < −1): rows 0, 1 → 2/4
    assert metrics["grpo"]["same_batch/frac_pos_low_w"].item() == 0.5
    # ReSPO keeps the under-generated positives' mass, VESPO starves them (φ⁺(e^−3): 1.355 vs 0.043)
    assert metrics["grpo"]["same_batch/respo_pos_low_w_mass_share"] > metrics["grpo"]["same_batch/vespo_pos_low_w_mass_share"]


def test_same_batch_shares_are_nan_without_positives():
    d = weight_diagnostics(torch.tensor([-2.0, 0.0]), torch.ones(2), torch.tensor([-1.0, 0.0]), torch.ones(2, 3))
    for key in SAME:
        assert math.isnan(d[key].item()), key


def test_log_w_bin_names():
    assert LOG_W_BIN_NAMES == log_w_bin_names(LOG_W_BIN_EDGES)
    assert len(LOG_W_BIN_NAMES) == len(LOG_W_BIN_EDGES) + 1 == 12
    assert LOG_W_BIN_NAMES[0] == "[-inf,-8)" and LOG_W_BIN_NAMES[-1] == "[2,+inf)"
    assert "[-1,-0.5)" in LOG_W_BIN_NAMES and "[-0.25,0)" in LOG_W_BIN_NAMES and "[0,0.25)" in LOG_W_BIN_NAMES
    assert log_w_bin_names((0.0,)) == ("[-inf,0)", "[0,+inf)")


def test_log_w_histogram_by_hand():
    # Bins are left-closed: −1 falls in [−1, −0.5), 0 in [0, 0.25), 2 in [2, +inf); −inf in the first
    # bin, +inf in the last; NaN and unselected rows in none.
    log_w = torch.tensor([-1.0, -1.0000001, 0.0, -0.1, 2.0, -math.inf, math.inf, math.nan, -9.0, 5.0], dtype=f64)
    sel = torch.tensor([True] * 9 + [False])
    counts = dict(zip(LOG_W_BIN_NAMES, log_w_histogram(log_w, sel).tolist()))
    both = log_w_histogram(log_w, torch.stack((sel, ~sel)))  # (2, 12): two selections at once
    assert both[0].tolist() == list(counts.values()) and both[1].sum().item() == 1.0  # the 5 in [2, +inf)
    assert counts == {
        "[-inf,-8)": 2.0,  # −inf, −9
        "[-8,-4)": 0.0,
        "[-4,-2)": 0.0,
        "[-2,-1)": 1.0,  # −1.0000001
        "[-1,-0.5)": 1.0,  # −1
        "[-0.5,-0.25)": 0.0,
        "[-0.25,0)": 1.0,  # −0.1
        "[0,0.25)": 1.0,  # 0
        "[0.25,0.5)": 0.0,
        "[0.5,1)": 0.0,
        "[1,2)": 0.0,
        "[2,+inf)": 2.0,  # 2, +inf (5 is not selected)
    }


def test_histogram_keys_in_weight_diagnostics():
    # Â = [+, +, +, −, −, 0] with log W = [−3, −1.5, 0.3, −0.6, 1.5, −3]; the zero-advantage row and the
    # masked row (log W 7) are in no histogram. The four bins below −1 hold exactly the low positives.
    log_w = torch.tensor([-3.0, -1.5, 0.3, -0.6, 1.5, -3.0, 7.0])
    adv = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0, 0.0, 1.0])
    mask = torch.ones(7, 2)
    mask[6] = 0
    d = weight_diagnostics(log_w, torch.ones(7), adv, mask)
    pos = {name: d[f"log_w_hist/pos/{name}"].item() for name in LOG_W_BIN_NAMES}
    neg = {name: d[f"log_w_hist/neg/{name}"].item() for name in LOG_W_BIN_NAMES}
    assert {k: v for k, v in pos.items() if v} == {"[-4,-2)": 1.0, "[-2,-1)": 1.0, "[0.25,0.5)": 1.0}
    assert {k: v for k, v in neg.items() if v} == {"[-1,-0.5)": 1.0, "[1,2)": 1.0}
    assert sum(pos.values()) == d["n_pos"].item() and sum(neg.values()) == d["n_neg"].item()
    below = sum(pos[name] for name in LOG_W_BIN_NAMES[:4])  # [−inf,−8) … [−2,−1)
    assert below / d["n_pos"].item() == pytest.approx(d["frac_pos_low_w"].item())


def test_new_diagnostics_are_detached_0d_tensors():
    logp = torch.zeros(4, 3, requires_grad=True)
    old = torch.tensor([[1.0] * 3, [0.0] * 3, [0.0] * 3, [0.5] * 3])
    _, m = policy_loss("respo", logp, old, torch.tensor([1.0, 1.0, -1.0, -1.0]), torch.ones(4, 3))
    new = [k for k in m if k.startswith(("same_batch/", "log_w_hist/"))]
    assert len(new) == 3 + 2 * len(LOG_W_BIN_NAMES)
    for k in new:
        assert isinstance(m[k], torch.Tensor) and m[k].dim() == 0 and not m[k].requires_grad, k
