"""Staleness corrections (TIS, MIS, IcePop, M2PO, decoupled PPO, OPSM): hand-worked values, gradient
identities, micro-batching, diagnostics and bad hyperparameters."""

import math

import pytest
import torch

import respo
from respo.core import corrections as C
from respo.core.aggregation import agg_loss

f64 = torch.float64
ln = math.log


# --------------------------------------------------------------------------------------------------
# One hand-worked batch for the weight corrections.
#
# 4 rows, T = 2, row 2 has one valid token (7 valid tokens); logp = −1 on every valid token;
# Â = [+1, −1, +2, −2]; per-token weights w = π_θ/π_old (old_logp = logp − ln w):
#   row 0: 1.5, 1.1    W0 = 1.65
#   row 1: 0.6, 0.8    W1 = 0.48
#   row 2: 4           W2 = 4
#   row 3: 1.05, 0.2   W3 = 0.21
# Token-mean loss L = Σ ℓ / 7 with ℓ_it = −c·Â_i·logp_it = c·Â_i (logp = −1), and ∂L/∂logp_it = −c·Â_i/7.
# --------------------------------------------------------------------------------------------------

W_TOK = [[1.5, 1.1], [0.6, 0.8], [4.0, 1.0], [1.05, 0.2]]
MASK = [[1, 1], [1, 1], [1, 0], [1, 1]]
ADV = [1.0, -1.0, 2.0, -2.0]


def hand_batch():
    mask = torch.tensor(MASK, dtype=f64)
    logp = torch.where(mask > 0, torch.tensor(-1.0, dtype=f64), torch.tensor(0.0, dtype=f64)).requires_grad_(True)
    old = (logp.detach() - torch.log(torch.tensor(W_TOK, dtype=f64))) * mask
    adv = torch.tensor(ADV, dtype=f64).unsqueeze(-1)  # (B, 1)
    return logp, old, adv, mask


def run(fn, **kw):
    logp, old, adv, mask = hand_batch()
    corr = fn(logp, old, adv, mask, **kw)
    loss = agg_loss(corr.values, mask, "token-mean")
    loss.backward()
    diag = C.correction_diagnostics(corr, C.token_log_weight(logp, old, mask), adv, adv[:, 0], mask)
    return loss.item(), logp.grad, corr, diag


def grad_rows(per_token):
    """(4, 2) gradient from per-token values; the masked token (2, 1) is 0."""
    return torch.tensor(per_token, dtype=f64)


def test_tis_sequence_by_hand():
    # c_i = min(W_i, 2) = [1.65, 0.48, 2, 0.21]; with logp = −1, Σ_t ℓ_it = c_i·Â_i·T_i:
    # row0 1.65·1·2 = 3.3, row1 0.48·(−1)·2 = −0.96, row2 2·2·1 = 4, row3 0.21·(−2)·2 = −0.84
    # L = (3.3 − 0.96 + 4 − 0.84)/7 = 5.5/7
    loss, grad, corr, diag = run(C.tis, level="sequence", cap=2.0)
    assert loss == pytest.approx(5.5 / 7, abs=1e-12)
    # ∂L/∂logp = −c_i Â_i / 7: row0 −1.65/7, row1 +0.48/7, row2 −4/7, row3 +0.42/7
    expected = grad_rows([[-1.65, -1.65], [0.48, 0.48], [-4.0, 0.0], [0.42, 0.42]]) / 7
    assert torch.allclose(grad, expected, atol=1e-12)
    # sequence level: one decision per row; row 2 (Â > 0) is the only truncated one
    assert diag["corr/trunc_frac"].item() == pytest.approx(1 / 4)
    assert diag["corr/trunc_frac/pos"].item() == pytest.approx(1 / 2)
    assert diag["corr/trunc_frac/neg"].item() == 0.0
    assert diag["corr/mask_frac"].item() == 0.0  # truncation never silences


def test_tis_token_by_hand():
    # c_it = min(w_it, 2): only the 4 of row 2 is cut. Σ ℓ = −Σ c Â logp = Σ c Â:
    # row0 (1.5 + 1.1)·1 = 2.6, row1 (0.6 + 0.8)·(−1) = −1.4, row2 2·2 = 4, row3 (1.05 + 0.2)·(−2) = −2.5
    # L = (2.6 − 1.4 + 4 − 2.5)/7 = 2.7/7
    loss, grad, _, diag = run(C.tis, level="token", cap=2.0)
    assert loss == pytest.approx(2.7 / 7, abs=1e-12)
    expected = grad_rows([[-1.5, -1.1], [0.6, 0.8], [-4.0, 0.0], [2.1, 0.4]]) / 7
    assert torch.allclose(grad, expected, atol=1e-12)
    # token level: 1 of 7 tokens truncated; of the 3 positive tokens 1, of the 4 negative 0
    assert diag["corr/trunc_frac"].item() == pytest.approx(1 / 7)
    assert diag["corr/trunc_frac/pos"].item() == pytest.approx(1 / 3)
    assert diag["corr/trunc_frac/neg"].item() == 0.0


def test_mis_sequence_default_band_by_hand():
    # [lo, hi] = [0, 3]: W2 = 4 is rejected, c = [1.65, 0.48, 0, 0.21]
    # L = (1.65·1·2 + 0.48·(−1)·2 + 0 + 0.21·(−2)·2)/7 = (3.3 − 0.96 − 0.84)/7 = 1.5/7
    loss, grad, _, diag = run(C.mis, level="sequence", lo=0.0, hi=3.0)
    assert loss == pytest.approx(1.5 / 7, abs=1e-12)
    expected = grad_rows([[-1.65, -1.65], [0.48, 0.48], [0.0, 0.0], [0.42, 0.42]]) / 7
    assert torch.allclose(grad, expected, atol=1e-12)
    # 1 of 4 sequences silenced, a positive one: 1/2 of the positive rows, and the positives' signal
    # Σ|Â| over silenced tokens / Σ|Â| over positive tokens = 2 / (1 + 1 + 2) = 1/2
    assert diag["corr/mask_frac"].item() == pytest.approx(1 / 4)
    assert diag["corr/mask_frac/pos"].item() == pytest.approx(1 / 2)
    assert diag["corr/mask_frac/neg"].item() == 0.0
    assert diag["corr/silenced_seqs/pos"].item() == pytest.approx(1 / 2)
    assert diag["corr/silenced_adv_share/pos"].item() == pytest.approx(1 / 2)
    assert diag["corr/silenced_adv_share/neg"].item() == 0.0


def test_mis_sequence_two_sided_band_by_hand():
    # [0.5, 2]: only W0 = 1.65 is inside → L = 1.65·2/7 = 3.3/7; every negative row is silenced
    loss, _, _, diag = run(C.mis, level="sequence", lo=0.5, hi=2.0)
    assert loss == pytest.approx(3.3 / 7, abs=1e-12)
    assert diag["corr/mask_frac"].item() == pytest.approx(3 / 4)
    assert diag["corr/mask_frac/neg"].item() == 1.0
    assert diag["corr/silenced_seqs/neg"].item() == 1.0 and diag["corr/silenced_adv_share/neg"].item() == 1.0


def test_icepop_by_hand():
    # token band [0.5, 5]: only w = 0.2 (row 3, Â = −2) is rejected; w = 4 is kept at its value.
    # Σ c Â: row0 2.6, row1 −1.4, row2 4·2 = 8, row3 1.05·(−2) = −2.1 → L = (2.6 − 1.4 + 8 − 2.1)/7 = 7.1/7
    loss, grad, _, diag = run(C.icepop)
    assert loss == pytest.approx(7.1 / 7, abs=1e-12)
    expected = grad_rows([[-1.5, -1.1], [0.6, 0.8], [-8.0, 0.0], [2.1, 0.0]]) / 7
    assert torch.allclose(grad, expected, atol=1e-12)
    # 1 of 7 tokens; 0 of 3 positive tokens, 1 of 4 negative; negative signal silenced 2/(1+1+2+2) = 1/3
    assert diag["corr/mask_frac"].item() == pytest.approx(1 / 7)
    assert diag["corr/mask_frac/pos"].item() == 0.0
    assert diag["corr/mask_frac/neg"].item() == pytest.approx(1 / 4)
    assert diag["corr/silenced_adv_share/neg"].item() == pytest.approx(1 / 3)


def test_m2po_by_hand():
    # v = (ln w)²: ln1.5² = .164402, ln1.1² = .009084, ln.6² = .260943, ln.8² = .049793,
    #              ln4² = 1.921812, ln1.05² = .002380, ln.2² = 2.590290
    # sorted: 2.590290, 1.921812, .260943, .164402, .049793, .009084, .002380 (sum 4.998704)
    # mean of the n − k smallest: A0 = .714101, A1 = .401402, A2 = .097320, A3 = .056415, A4 = .020419 < .04
    # → drop the 4 largest: (3,1) w=.2, (2,0) w=4, (1,0) w=.6, (0,0) w=1.5. Kept: (0,1) r=1.1 Â=+1,
    # (1,1) r=.8 Â=−1, (3,0) r=1.05 Â=−2. ℓ = −M·r·Â: −1.1, +0.8, +2.1 → L = 1.8/7
    loss, grad, corr, diag = run(C.m2po, tau=0.04)
    assert loss == pytest.approx(1.8 / 7, abs=1e-12)
    # ∂ℓ/∂logp = −M·r·Â (r = e^(logp − old)): −1.1/7, +0.8/7, +2.1/7 on the kept tokens, 0 elsewhere
    expected = grad_rows([[0.0, -1.1], [0.0, 0.8], [0.0, 0.0], [2.1, 0.0]]) / 7
    assert torch.allclose(grad, expected, atol=1e-12)
    kept = [[False, True], [False, True], [False, False], [True, False]]
    assert corr.silenced.tolist() == [[True, False], [True, False], [True, False], [False, True]]
    assert (~corr.silenced & (torch.tensor(MASK) > 0)).tolist() == kept
    # 4 of 7 tokens; positives 2 of 3 tokens, negatives 2 of 4; row 2 (positive) is silenced whole;
    # positives' signal silenced (1 + 2)/(1 + 1 + 2) = 3/4, negatives' (1 + 2)/(1 + 1 + 2 + 2) = 1/2
    assert diag["corr/mask_frac"].item() == pytest.approx(4 / 7)
    assert diag["corr/mask_frac/pos"].item() == pytest.approx(2 / 3)
    assert diag["corr/mask_frac/neg"].item() == pytest.approx(1 / 2)
    assert diag["corr/silenced_seqs/pos"].item() == pytest.approx(1 / 2)
    assert diag["corr/silenced_seqs/neg"].item() == 0.0
    assert diag["corr/silenced_adv_share/pos"].item() == pytest.approx(3 / 4)
    assert diag["corr/silenced_adv_share/neg"].item() == pytest.approx(1 / 2)


def test_chi2_by_hand():
    # chi2_token = mean w² − 1 = (2.25 + 1.21 + .36 + .64 + 16 + 1.1025 + .04)/7 − 1 = 21.6025/7 − 1
    # chi2_seq   = mean W² − 1 = (1.65² + .48² + 4² + .21²)/4 − 1 = (2.7225 + .2304 + 16 + .0441)/4 − 1 = 3.74925
    logp, old, _, mask = hand_batch()
    chi = C.chi2(C.token_log_weight(logp, old, mask), mask)
    assert chi["chi2_token"].item() == pytest.approx(21.6025 / 7 - 1, rel=1e-12)
    assert chi["chi2_seq"].item() == pytest.approx(3.74925, rel=1e-12)


# --------------------------------------------------------------------------------------------------
# OPSM and decoupled PPO, each on its own small batch
# --------------------------------------------------------------------------------------------------


def test_opsm_by_hand():
    # 3 rows, T = 2, logp = −1, Â = [−1, −1, +1], per-token r = π_θ/π_old:
    #   row 0: .5, .5   KL = −mean ln r = ln 2 = .6931 > δ = .5 and Â < 0 → dropped
    #   row 1: .9, 1.0  KL = −ln(.9)/2 = .0527 ≤ .5 → kept
    #   row 2: .5, .5   Â ≥ 0 → kept whatever its KL
    # PPO (ε = .2, no dual clip): row1 ℓ = max(−rÂ, −clip(r)Â) = r: .9, 1.0 (unclipped);
    # row2 ℓ = max(−.5, −.8) = −.5 each (unclipped). L = (.9 + 1.0 − .5 − .5)/6 = .9/6 = .15
    r = torch.tensor([[0.5, 0.5], [0.9, 1.0], [0.5, 0.5]], dtype=f64)
    logp = torch.full((3, 2), -1.0, dtype=f64, requires_grad=True)
    old = logp.detach() - torch.log(r)
    mask = torch.ones(3, 2, dtype=f64)
    adv = torch.tensor([-1.0, -1.0, 1.0], dtype=f64).unsqueeze(-1)
    corr = C.opsm(logp, old, adv, adv[:, 0], mask, delta=0.5)
    loss = agg_loss(corr.values, mask, "token-mean")
    assert loss.item() == pytest.approx(0.15, abs=1e-12)
    loss.backward()
    # ∂ℓ/∂logp = −Â·r where unclipped: row1 .9, 1.0; row2 −.5, −.5; /6
    assert torch.allclose(logp.grad, torch.tensor([[0, 0], [0.9, 1.0], [-0.5, -0.5]], dtype=f64) / 6, atol=1e-12)
    diag = C.correction_diagnostics(corr, C.token_log_weight(logp, old, mask), adv, adv[:, 0], mask)
    assert diag["corr/mask_frac"].item() == pytest.approx(1 / 3)  # one of three sequences
    assert diag["corr/mask_frac/neg"].item() == pytest.approx(1 / 2) and diag["corr/mask_frac/pos"].item() == 0.0
    assert diag["corr/silenced_adv_share/neg"].item() == pytest.approx(1 / 2)
    # δ large enough keeps row 0: its ℓ = max(.5, .8) = .8 twice (clipped) → L = (1.6 + .9)/6
    wide = C.opsm(logp.detach(), old, adv, adv[:, 0], mask, delta=1.0)
    assert agg_loss(wide.values, mask, "token-mean").item() == pytest.approx(2.5 / 6, abs=1e-12)


def decoupled_batch():
    # 2 rows, T = 2, logp = −1, Â = [+1, −1]; r = π_θ/π_prox and b = π_prox/π_old per token:
    #   row 0: r = 1.1, 1.3   b = 2, 6
    #   row 1: r = 0.7, 1.0   b = 0.5, 1.5
    r = torch.tensor([[1.1, 1.3], [0.7, 1.0]], dtype=f64)
    b = torch.tensor([[2.0, 6.0], [0.5, 1.5]], dtype=f64)
    logp = torch.full((2, 2), -1.0, dtype=f64, requires_grad=True)
    prox = logp.detach() - torch.log(r)
    old = prox - torch.log(b)
    return logp, old, prox, torch.tensor([1.0, -1.0], dtype=f64).unsqueeze(-1), torch.ones(2, 2, dtype=f64)


def test_decoupled_mask_by_hand():
    # cap 5, mask: b = [[2, 0], [.5, 1.5]]. PPO (ε = .2): (0,0) −1.1 unclipped; (0,1) max(−1.3, −1.2) = −1.2
    # clipped; (1,0) max(.7, .8) = .8 clipped; (1,1) 1.0 unclipped.
    # ℓ = b·PPO: −2.2, 0, .4, 1.5 → L = −.3/4 = −.075
    logp, old, prox, adv, mask = decoupled_batch()
    corr = C.decoupled(logp, old, adv, mask, prox_logp=prox, cap=5.0, cap_mode="mask")
    loss = agg_loss(corr.values, mask, "token-mean")
    assert loss.item() == pytest.approx(-0.075, abs=1e-12)
    loss.backward()
    # ∂ℓ/∂logp = −b·Â·r where unclipped: (0,0) −2·1.1 = −2.2, (1,1) +1.5·1.0 = 1.5; /4
    assert torch.allclose(logp.grad, torch.tensor([[-2.2, 0.0], [0.0, 1.5]], dtype=f64) / 4, atol=1e-12)
    assert corr.silenced.tolist() == [[False, True], [False, False]]
    assert torch.allclose(corr.coef, torch.tensor([[2.2, 0.0], [0.0, 1.5]], dtype=f64), atol=1e-12)


def test_decoupled_truncate_by_hand():
    # cap 5, truncate: b = [[2, 5], [.5, 1.5]] → (0,1) contributes 5·(−1.2) = −6: L = (−2.2 − 6 + .4 + 1.5)/4
    logp, old, prox, adv, mask = decoupled_batch()
    corr = C.decoupled(logp, old, adv, mask, prox_logp=prox, cap=5.0, cap_mode="truncate")
    assert agg_loss(corr.values, mask, "token-mean").item() == pytest.approx(-6.3 / 4, abs=1e-12)
    diag = C.correction_diagnostics(corr, C.token_log_weight(logp, old, mask), adv, adv[:, 0], mask)
    assert diag["corr/trunc_frac"].item() == pytest.approx(1 / 4) and diag["corr/trunc_frac/pos"].item() == 0.5
    assert diag["corr/mask_frac"].item() == 0.0


def test_decoupled_with_one_step_per_batch_is_token_tis_or_mis():
    # π_prox = the policy being differentiated (respo's reuse-N: one optimizer step per mini-batch), so
    # r = 1 is inside every clip and ∇L = −agg[b·Â·∇logp] with b = π_θ/π_old: token TIS (truncate)
    # or token MIS on [0, C] (mask).
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(8, 6, generator=g, dtype=f64) * 2
    old = logp + 0.8 * torch.randn(8, 6, generator=g, dtype=f64)
    mask = (torch.rand(8, 6, generator=g) > 0.2).to(f64)
    adv = torch.randn(8, 1, generator=g, dtype=f64)
    for mode, ref, kw in (("truncate", C.tis, {"level": "token", "cap": 2.0}), ("mask", C.mis, {"level": "token", "lo": 0.0, "hi": 2.0})):
        x = logp.clone().requires_grad_(True)
        agg_loss(C.decoupled(x, old, adv, mask, cap=2.0, cap_mode=mode).values, mask, "token-mean").backward()
        y = logp.clone().requires_grad_(True)
        agg_loss(ref(y, old, adv, mask, **kw).values, mask, "token-mean").backward()
        assert torch.allclose(x.grad, y.grad, rtol=1e-12, atol=1e-15), mode


# --------------------------------------------------------------------------------------------------
# Properties on random batches
# --------------------------------------------------------------------------------------------------


def random_batch(B=10, T=7, seed=0, scale=0.6):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=f64) * 2
    old = logp + scale * torch.randn(B, T, generator=g, dtype=f64)
    mask = (torch.rand(B, T, generator=g) > 0.25).to(f64)
    mask[:, 0] = 1
    adv = torch.randn(B, 1, generator=g, dtype=f64)
    prox = logp + 0.3 * torch.randn(B, T, generator=g, dtype=f64)
    return logp, old, adv, mask, prox


CASES = {
    "tis-seq": lambda lp, o, a, m, p: C.tis(lp, o, a, m, level="sequence", cap=2.0),
    "tis-tok": lambda lp, o, a, m, p: C.tis(lp, o, a, m, level="token", cap=2.0),
    "mis-seq": lambda lp, o, a, m, p: C.mis(lp, o, a, m, level="sequence", lo=0.0, hi=3.0),
    "mis-tok": lambda lp, o, a, m, p: C.mis(lp, o, a, m, level="token", lo=0.5, hi=2.0),
    "icepop": lambda lp, o, a, m, p: C.icepop(lp, o, a, m),
    "m2po": lambda lp, o, a, m, p: C.m2po(lp, o, a, m, tau=0.04),
    "decoupled": lambda lp, o, a, m, p: C.decoupled(lp, o, a, m, prox_logp=p, clip_ratio_c=3.0),
    "opsm": lambda lp, o, a, m, p: C.opsm(lp, o, a, a[:, 0], m, delta=0.1),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_is_minus_coef_times_adv(name):
    # ∇L = −agg[c·Â·∇logp] with the correction's detached coefficient c, token-mean.
    logp, old, adv, mask, prox = random_batch(seed=1)
    x = logp.clone().requires_grad_(True)
    corr = CASES[name](x, old, adv, mask, prox)
    agg_loss(corr.values, mask, "token-mean").backward()
    assert not corr.coef.requires_grad
    assert torch.allclose(x.grad, -corr.coef * adv * mask / mask.sum(), rtol=1e-12, atol=1e-15)
    assert ((corr.coef == 0) | ~corr.silenced).all()  # silenced tokens carry no gradient


@pytest.mark.parametrize("name", sorted(CASES))
def test_on_policy_every_correction_is_reinforce(name):
    # logp == old_logp (and π_prox = π_θ): every weight is 1, inside every cap, band and clip; M2 = 0 < τ;
    # KL = 0 ≤ δ. So each gradient equals REINFORCE's −Â·∇logp/N.
    logp, _, adv, mask, _ = random_batch(seed=2)
    x = logp.clone().requires_grad_(True)
    corr = CASES[name](x, logp, adv, mask, logp)
    agg_loss(corr.values, mask, "token-mean").backward()
    assert torch.allclose(x.grad, -adv * mask / mask.sum(), rtol=1e-12, atol=1e-15)
    assert not corr.silenced.any() and not corr.truncated.any()


@pytest.mark.parametrize("name", sorted(set(CASES) - {"m2po"}))
def test_micro_batch_invariance(name):
    # Every correction but M2PO decides per token or per sequence, so micro-batch losses with the global
    # token count sum to the full-batch loss and gradient.
    logp, old, adv, mask, prox = random_batch(seed=3)
    n = mask.sum()
    x = logp.clone().requires_grad_(True)
    full = agg_loss(CASES[name](x, old, adv, mask, prox).values, mask, "token-mean")
    full.backward()
    y = logp.clone().requires_grad_(True)
    total = 0.0
    for rows in (slice(0, 3), slice(3, 4), slice(4, 10)):
        part = agg_loss(CASES[name](y[rows], old[rows], adv[rows], mask[rows], prox[rows]).values, mask[rows],
                        "token-mean", global_tokens=n)  # fmt: skip
        part.backward()
        total += part.item()
    assert total == pytest.approx(full.item(), rel=1e-12)
    assert torch.allclose(y.grad, x.grad, rtol=1e-12, atol=1e-15)


def test_m2po_is_not_micro_batch_invariant_but_additive_given_the_mask():
    # Row 0 carries one huge (ln w)² = 4, row 1 only small ones (.01). Over the whole batch the mean M2
    # is (4 + .01·3)/4 > .04, so the huge token is dropped; row 1 alone has M2 = .01 < .04 and keeps all.
    # Alone, row 0 must keep one token, so its single token is kept: the masks differ with the split.
    logp = torch.full((2, 3), -1.0, dtype=f64)
    old = logp - torch.tensor([[2.0, 0.0, 0.0], [0.1, -0.1, 0.1]], dtype=f64)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]], dtype=f64)
    full = C.m2po_keep(C.token_log_weight(logp, old, mask), mask, 0.04)
    assert full.tolist() == [[False, False, False], [True, True, True]]
    alone = C.m2po_keep(C.token_log_weight(logp[:1], old[:1], mask[:1]), mask[:1], 0.04)
    assert alone.tolist() == [[True, False, False]]  # keeps at least one token: differs from the full batch
    # What holds: with the mask chosen once on the whole batch, the loss is a sum over rows, so accumulating
    # micro-batches with the global token count reproduces it.
    logp, old, adv, mask, _ = random_batch(seed=4)
    keep = C.m2po_keep(C.token_log_weight(logp, old, mask), mask, 0.04).to(f64)
    assert 0 < keep.sum() < mask.sum()  # the example selects something
    ratio = torch.exp(logp - old)
    full = agg_loss(-(keep * adv) * ratio, mask, "token-mean")
    parts = sum(agg_loss((-(keep * adv) * ratio)[r], mask[r], "token-mean", global_tokens=mask.sum()) for r in (slice(0, 4), slice(4, 10)))
    assert parts.item() == pytest.approx(full.item(), rel=1e-12)


def test_m2po_row_groups_select_within_each_micro_batch():
    # The example above: row 0 has one valid token with (ln w)² = 4, row 1 three with (ln w)² = .01.
    # One group (the whole batch): drop the 4 (A0 = 4.03/4 > .04, A1 = .01 < .04); kept 3 of 4 tokens.
    # row_groups = [0, 1], two micro-batches: row 0 alone keeps its one token (at least one is kept), row 1
    # alone has A0 = .01 < .04 and keeps all three: nothing is silenced, the concatenation of the two
    # separate selections.
    logp = torch.full((2, 3), -1.0, dtype=f64)
    old = logp - torch.tensor([[2.0, 0.0, 0.0], [0.1, -0.1, 0.1]], dtype=f64)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]], dtype=f64)
    log_w = C.token_log_weight(logp, old, mask)
    assert C.m2po_keep(log_w, mask, 0.04, groups=torch.tensor([0, 1])).tolist() == [[True, False, False], [True, True, True]]
    assert C.m2po_keep(log_w, mask, 0.04, groups=torch.tensor([3, 3])).tolist() == [[False, False, False], [True, True, True]]
    # Through the objective (Â = +1 for row 0, −1 for row 1): silenced 1 of 4 tokens without groups, 0 with;
    # the kept ratios: e² (row 0) and e^.1, e^−.1, e^.1 (row 1), so the loss −Σ M·r·Â/4 with groups is
    # (−e² + e^.1 + e^−.1 + e^.1)/4 and without (e^.1 + e^−.1 + e^.1)/4.
    adv = torch.tensor([1.0, -1.0], dtype=f64)
    e = math.exp
    loss_g, diag_g = respo.policy_loss("m2po", logp, old, adv, mask, row_groups=torch.tensor([0, 1]))
    loss_1, diag_1 = respo.policy_loss("m2po", logp, old, adv, mask)
    assert loss_g.item() == pytest.approx((-e(2) + 2 * e(0.1) + e(-0.1)) / 4, rel=1e-12)
    assert loss_1.item() == pytest.approx((2 * e(0.1) + e(-0.1)) / 4, rel=1e-12)
    assert diag_g["corr/mask_frac"].item() == 0.0 and diag_1["corr/mask_frac"].item() == pytest.approx(1 / 4)
    # objectives whose decisions are per token or per sequence ignore the grouping
    for name in ("tis", "mis", "icepop", "grpo"):
        a, _ = respo.policy_loss(name, logp, old, adv, mask, row_groups=torch.tensor([0, 1]))
        b, _ = respo.policy_loss(name, logp, old, adv, mask)
        assert a.item() == b.item()


@pytest.mark.parametrize("groups, match", [
    (torch.tensor([0, 1, 2]), r"row_groups must be a \(B,\) = \(2,\) integer tensor"),
    (torch.tensor([0.0, 1.0]), r"row_groups must be a \(B,\) = \(2,\) integer tensor"),
    ([0, 1], r"row_groups must be a \(B,\) = \(2,\) integer tensor"),
])
def test_row_groups_bad_input_is_named(groups, match):
    logp = torch.zeros(2, 3, dtype=f64)
    with pytest.raises(ValueError, match=match):
        respo.policy_loss("m2po", logp, logp, torch.ones(2, dtype=f64), torch.ones(2, 3), row_groups=groups)


def test_m2po_mask_properties():
    # The kept tokens' mean (ln w)² is below τ; putting back the smallest dropped token would not be;
    # every kept token has a smaller (ln w)² than every dropped one; tokens off the mask are never kept.
    for seed in range(5):
        logp, old, adv, mask, _ = random_batch(B=16, T=9, seed=seed, scale=0.4)
        log_w = C.token_log_weight(logp, old, mask)
        keep = C.m2po_keep(log_w, mask, 0.04)
        v = log_w.square()
        valid = mask > 0
        dropped = valid & ~keep
        assert not (keep & ~valid).any() and keep.any()
        assert v[keep].mean() < 0.04
        assert dropped.any()  # scale 0.4 puts the batch above τ
        assert v[keep].max() <= v[dropped].min()
        back = torch.cat([v[keep], v[dropped].min().reshape(1)])
        assert back.mean() >= 0.04


def test_m2po_keeps_one_token_when_nothing_is_below_tau():
    # every (ln w)² = 1 ≥ τ: AReaL keeps the last token of the sorted order rather than none
    logp = torch.zeros(1, 3, dtype=f64)
    old = -torch.ones(1, 3, dtype=f64)
    keep = C.m2po_keep(C.token_log_weight(logp, old, torch.ones(1, 3)), torch.ones(1, 3), 0.04)
    assert keep.sum().item() == 1


def test_rollout_log_ratio_folds_into_the_weight():
    # log ρ = π_old/π_rollout folds into log w, so tis/mis with log ρ equal tis/mis against old − log ρ.
    logp, old, adv, mask, _ = random_batch(seed=6)
    log_rho = 0.2 * torch.randn(logp.shape, dtype=f64, generator=torch.Generator().manual_seed(2))
    for fn, kw in ((C.tis, {}), (C.mis, {"level": "token"}), (C.icepop, {}), (C.m2po, {})):
        a = fn(logp, old, adv, mask, log_rho=log_rho, **kw).coef
        b = fn(logp, old - log_rho, adv, mask, **kw).coef
        assert torch.allclose(a, b, rtol=1e-12), fn.__name__


def test_diagnostics_are_detached_and_nan_for_an_empty_sign():
    logp, old, adv, mask, _ = random_batch(seed=7)
    adv = adv.abs()  # no negative row
    x = logp.clone().requires_grad_(True)
    corr = C.mis(x, old, adv, mask, level="token", lo=0.5, hi=2.0)
    diag = C.correction_diagnostics(corr, C.token_log_weight(x, old, mask), adv, adv[:, 0], mask)
    assert all(v.dim() == 0 and not v.requires_grad for v in diag.values())
    assert math.isnan(diag["corr/mask_frac/neg"].item()) and math.isnan(diag["corr/silenced_adv_share/neg"].item())
    assert math.isfinite(diag["corr/mask_frac/pos"].item())


# --------------------------------------------------------------------------------------------------
# Bad hyperparameters: one-line errors naming the value
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: C.check_level("row", what="tis"), r"tis: level must be one of \('token', 'sequence'\), got 'row'"),
        (lambda: C.check_cap(0, what="tis"), "tis: cap must be > 0, got 0.0"),
        (lambda: C.check_cap("two", what="tis"), "tis: cap must be a number, got 'two'"),
        (lambda: C.check_cap(math.inf, what="tis"), "tis: cap must be finite"),
        (lambda: C.check_band(2.0, 1.0, what="mis"), "mis: need 0 <= lo < hi, got lo=2.0, hi=1.0"),
        (lambda: C.check_band(-0.1, 1.0, what="mis"), "mis: need 0 <= lo < hi"),
        (lambda: C.check_positive("tau", 0, what="m2po"), "m2po: tau must be > 0, got 0.0"),
        (lambda: C.check_positive("delta", -1, what="opsm", allow_zero=True), "opsm: delta must be >= 0, got -1.0"),
        (lambda: C.check_clip(1.0, 0.2, None, what="opsm"), r"opsm: clip_ratio_low must be in \[0, 1\), got 1.0"),
        (lambda: C.check_clip(0.2, 0.2, 1.0, what="decoupled"), "decoupled: clip_ratio_c must be > 1"),
        (lambda: C.check_cap_mode("clip", what="decoupled"), r"decoupled: cap_mode must be one of \('mask', 'truncate'\)"),
        (lambda: C.check_cap(True, what="tis"), "tis: cap must be a number, got True"),
    ],
)
def test_bad_hyperparameters_raise_one_line_errors(call, message):
    with pytest.raises(ValueError, match=message) as err:
        call()
    assert "\n" not in str(err.value)


# --------------------------------------------------------------------------------------------------
# The corrections as objectives of the one pipeline
# --------------------------------------------------------------------------------------------------

NAMES = ("tis", "mis", "icepop", "m2po", "decoupled", "opsm")


def test_hyperparameters_know_every_correction_with_its_published_default():
    from respo import hyperparameters

    # verl rollout_correction defaults (rollout_is_batch_normalize off)
    assert hyperparameters("tis") == {"level": "sequence", "cap": 2.0, "batch_normalize": False}
    # TRL sequence_mask, clip_max 3
    assert hyperparameters("mis") == {"level": "sequence", "lo": 0.0, "hi": 3.0, "batch_normalize": False}
    assert hyperparameters("icepop") == {"lo": 0.5, "hi": 5.0}
    assert hyperparameters("m2po") == {"tau": 0.04}  # AReaL m2_threshold
    assert hyperparameters("decoupled") == {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": None,
                                            "cap": 5.0, "cap_mode": "mask", "prox_method": "given"}  # AReaL  # fmt: skip
    assert hyperparameters("opsm") == {"delta": 0.5, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": None}


@pytest.mark.parametrize(
    "name, hp, message",
    [
        ("tis", {"level": "row"}, "tis: level must be one of"),
        ("tis", {"cap": -2}, "tis: cap must be > 0"),
        ("mis", {"lo": 2.0, "hi": 1.0}, "mis: need 0 <= lo < hi"),
        ("icepop", {"hi": "five"}, "icepop: hi must be a number"),
        ("m2po", {"tau": 0}, "m2po: tau must be > 0"),
        ("decoupled", {"cap_mode": "clip"}, "decoupled: cap_mode must be one of"),
        ("decoupled", {"clip_ratio_c": 1.0}, "decoupled: clip_ratio_c must be > 1"),
        ("opsm", {"delta": -0.1}, "opsm: delta must be >= 0"),
        ("opsm", {"clip_ratio_low": 1.5}, r"opsm: clip_ratio_low must be in \[0, 1\)"),
    ],
)
def test_build_objective_rejects_bad_values_in_one_line(name, hp, message):
    from respo import build_objective

    with pytest.raises(ValueError, match=message) as err:
        build_objective(name, **hp)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", NAMES)
def test_policy_loss_runs_the_correction_and_reports_its_diagnostics(name):
    from respo import policy_loss

    logp, old, adv, mask, prox = random_batch(seed=11)
    fn = {"tis": C.tis, "mis": C.mis, "icepop": C.icepop, "m2po": C.m2po,
          "decoupled": lambda *a: C.decoupled(*a, prox_logp=prox),
          "opsm": lambda lp, o, a, m: C.opsm(lp, o, a, a[:, 0], m)}[name]  # fmt: skip
    x = logp.clone().requires_grad_(True)
    extra = {"prox_logp": prox} if name == "decoupled" else {}
    loss, metrics = policy_loss(name, x, old, adv[:, 0], mask, **extra)
    loss.backward()
    y = logp.clone().requires_grad_(True)
    ref = agg_loss(fn(y, old, adv, mask).values, mask, "token-mean")
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-12)
    assert torch.allclose(x.grad, y.grad, rtol=1e-12, atol=1e-15)
    for key in ("corr/mask_frac/pos", "corr/trunc_frac/neg", "corr/silenced_adv_share/pos", "chi2_token", "chi2_seq"):
        assert key in metrics and metrics[key].dim() == 0 and not metrics[key].requires_grad, key


def test_every_objective_reports_chi2_of_w():
    from respo import OBJECTIVES, policy_loss

    logp, old, adv, mask, _ = random_batch(seed=12)
    expected = C.chi2(C.token_log_weight(logp, old, mask), mask)
    for name in OBJECTIVES:
        _, metrics = policy_loss(name, logp, old, adv[:, 0], mask, **({"prox_logp": logp} if name == "decoupled" else {}))
        assert metrics["chi2_token"].item() == pytest.approx(expected["chi2_token"].item(), rel=1e-12), name
        assert metrics["chi2_seq"].item() == pytest.approx(expected["chi2_seq"].item(), rel=1e-12), name


def test_decoupled_prox_logp_is_optional_and_checked():
    from respo import build_objective

    logp, old, adv, mask, prox = random_batch(seed=13)
    objective = build_objective("decoupled", clip_ratio_c=3.0)
    without, _ = objective(logp, old, adv[:, 0], mask)
    with_current, _ = objective(logp, old, adv[:, 0], mask, prox_logp=logp)  # π_prox = π_θ: the same
    with_prox, _ = objective(logp, old, adv[:, 0], mask, prox_logp=prox)
    assert without.item() == with_current.item() and with_prox.item() != without.item()
    bad = prox.clone()
    bad[2, 0] = math.nan
    with pytest.raises(ValueError, match=r"prox_logp: 1 row"):
        objective(logp, old, adv[:, 0], mask, prox_logp=bad)
    with pytest.raises(ValueError, match=r"unknown keyword argument\(s\) \['prox_logp'\]"):
        build_objective("tis")(logp, old, adv[:, 0], mask, prox_logp=prox)
