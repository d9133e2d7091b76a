"""Objectives: hand-worked losses, gradient identities, aggregation, micro-batching, bad input."""

import math

import pytest
import torch

from respo import (
    AGG_MODES,
    OBJECTIVES,
    agg_loss,
    hyperparameters,
    policy_loss,
    respo_phi,
    sequence_log_ratio,
    vespo_phi,
)

f64 = torch.float64


def random_batch(B=6, T=7, seed=0, scale=0.3, dtype=f64):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g, dtype=dtype) * 2).requires_grad_(True)
    old = logp.detach() + scale * torch.randn(B, T, generator=g, dtype=dtype)
    mask = (torch.rand(B, T, generator=g) > 0.25).to(dtype)
    mask[:, 0] = 1  # every row has a valid token
    adv = torch.randn(B, generator=g, dtype=dtype)
    return logp, old, adv, mask


# --------------------------------------------------------------------------------------------------
# Ratios
# --------------------------------------------------------------------------------------------------


def test_sequence_log_ratio_by_hand():
    # row 0: (−1 − −1.5) + (−2 − −1) = 0.5 − 1 = −0.5; the masked third token is ignored even if NaN.
    # row 1: one token: 30 − 0 = 30, clamped to 20.
    logp = torch.tensor([[-1.0, -2.0, math.nan], [30.0, 0.0, 0.0]], dtype=f64)
    old = torch.tensor([[-1.5, -1.0, 0.0], [0.0, 0.0, 0.0]], dtype=f64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=f64)
    assert sequence_log_ratio(logp, old, mask).tolist() == [-0.5, 20.0]
    # length-normalised (GSPO): −0.5/2 = −0.25; 30/1 = 30 → 20
    assert sequence_log_ratio(logp, old, mask, length_normalize=True).tolist() == [-0.25, 20.0]
    # rollout correction in log space: + Σ m·log ρ = + (0.1 + 0.2) → −0.2
    rlr = torch.tensor([[0.1, 0.2, 5.0], [0.0, 0.0, 0.0]], dtype=f64)
    assert sequence_log_ratio(logp, old, mask, rollout_log_ratio=rlr)[0].item() == pytest.approx(-0.2)


# --------------------------------------------------------------------------------------------------
# Hand-worked losses
# --------------------------------------------------------------------------------------------------


def test_respo_loss_by_hand():
    # Two sequences, 2 and 1 valid tokens.
    # seq 0: log W = (−1 − −1) + (−2 − −2 + ln 0.5) = ln 0.5 → W = .5, Â = +1:
    #        φ⁺(.5) = (1.5/2)·e^0.5 = 0.75·1.648721 = 1.236541
    # seq 1: log W = ln 4, Â = −2: φ⁻(4) = 2·e^(2(1−2)) = 0.270671
    # token-mean loss = −[φ0·1·(−1) + φ0·1·(−2) + φ1·(−2)·(−0.5)] / 3
    #                 = −[−3·1.236541 + 0.270671] / 3 = (3.709623 − 0.270671)/3 = 1.146317
    logp = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]], dtype=f64, requires_grad=True)
    old = torch.tensor([[-1.0, -2.0 - math.log(0.5)], [-0.5 - math.log(4.0), 0.0]], dtype=f64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=f64)
    adv = torch.tensor([1.0, -2.0], dtype=f64)
    loss, m = policy_loss("respo", logp, old, adv, mask)
    assert loss.item() == pytest.approx(1.146317, abs=1e-6)
    loss.backward()
    # ∇ = −φ·Â·m / 3: [[−1.236541/3, −1.236541/3], [0.270671·2/3, 0]]
    expected = torch.tensor([[-1.236541 / 3, -1.236541 / 3], [0.541342 / 3, 0.0]], dtype=f64)
    assert torch.allclose(logp.grad, expected, atol=1e-6)
    assert m["coef_mean"].item() == pytest.approx((1.236541 + 0.270671) / 2, abs=1e-6)


def test_grpo_loss_by_hand():
    # One sequence per case, one token each, ε = 0.2, c = 3, token-mean over 4 tokens.
    # r = 1.5, Â = +1: max(−1.5, −1.2) = −1.2 (clipped: no gradient)
    # r = 0.5, Â = −1: max(0.5, 0.8) = 0.8 (clipped at 1−ε), dual min(0.8, 3) = 0.8 (no gradient)
    # r = 4.0, Â = −1: max(4, 1.2) = 4, dual min(4, 3) = 3 (dual-clipped: no gradient)
    # r = 1.1, Â = +2: max(−2.2, −2.2) = −2.2 (unclipped: gradient −Â·r = −2.2)
    r = torch.tensor([1.5, 0.5, 4.0, 1.1], dtype=f64)
    logp = torch.log(r).unsqueeze(-1).clone().requires_grad_(True)
    old = torch.zeros(4, 1, dtype=f64)
    adv = torch.tensor([1.0, -1.0, -1.0, 2.0], dtype=f64)
    loss, m = policy_loss("grpo", logp, old, adv, torch.ones(4, 1, dtype=f64))
    assert loss.item() == pytest.approx((-1.2 + 0.8 + 3.0 - 2.2) / 4)
    loss.backward()
    # d(−Â·r)/d logp = −Â·r: only the last token: −2·1.1/4 = −0.55
    assert logp.grad.squeeze(-1).tolist() == pytest.approx([0.0, 0.0, 0.0, -0.55])
    assert m["clipfrac_high"].item() == 0.25 and m["clipfrac_low"].item() == 0.25
    assert m["clipfrac_dual"].item() == 0.25


# --------------------------------------------------------------------------------------------------
# Gradient identities: ∇L = −agg[c·Â·∇logp] with the objective's coefficient c
# --------------------------------------------------------------------------------------------------


def _grad(name, logp, old, adv, mask, **kw):
    logp = logp.detach().clone().requires_grad_(True)
    loss, metrics = policy_loss(name, logp, old, adv, mask, **kw)
    loss.backward()
    return logp.grad, metrics


def test_respo_gradient_identity_exact():
    logp, old, adv, mask = random_batch(B=16, T=9, scale=1.0)
    grad, _ = _grad("respo", logp, old, adv, mask)
    phi = respo_phi(sequence_log_ratio(logp.detach(), old, mask), adv)
    expected = -(phi * adv).unsqueeze(-1) * mask / mask.sum()
    assert torch.allclose(grad, expected, rtol=1e-12, atol=1e-15)


def test_vespo_gradient_identity_exact():
    logp, old, adv, mask = random_batch(B=16, T=9, scale=1.0, seed=3)
    grad, _ = _grad("vespo", logp, old, adv, mask)
    phi = vespo_phi(sequence_log_ratio(logp.detach(), old, mask), adv)
    assert torch.allclose(grad, -(phi * adv).unsqueeze(-1) * mask / mask.sum(), rtol=1e-12, atol=1e-15)


def test_token_objective_gradient_identities():
    logp, old, adv, mask = random_batch(B=32, T=8, scale=0.4, seed=1)
    A = adv.unsqueeze(-1).expand_as(logp)
    r = torch.exp(logp.detach() - old)
    n = mask.sum()
    # grpo: c = r unless clipped (Â>0, r>1.2), (Â<0, r<0.8), dual (Â<0, r>3)
    active = ~(((A > 0) & (r > 1.2)) | ((A < 0) & (r < 0.8)) | ((A < 0) & (r > 3.0)))
    grad, _ = _grad("grpo", logp, old, adv, mask)
    assert torch.allclose(grad, -(r * active) * A * mask / n, rtol=1e-12, atol=1e-15)
    # cispo: c = clip(r, 0.8, 1.2) everywhere
    grad, _ = _grad("cispo", logp, old, adv, mask)
    assert torch.allclose(grad, -r.clamp(0.8, 1.2) * A * mask / n, rtol=1e-12, atol=1e-15)
    # sapo (seq-mean-token-mean): c = 4σ(1−σ)·r with σ = σ(τ(r−1)), τ = 1 for Â > 0 and 1.05 otherwise
    tau = torch.where(A > 0, torch.tensor(1.0, dtype=f64), torch.tensor(1.05, dtype=f64))
    sig = torch.sigmoid(tau * (r - 1))
    n_i = mask.sum(-1, keepdim=True)
    grad, _ = _grad("sapo", logp, old, adv, mask)
    assert torch.allclose(grad, -(4 * sig * (1 - sig) * r) * A * mask / n_i / logp.shape[0], rtol=1e-12, atol=1e-15)


def test_gspo_gradient_identity():
    logp, old, adv, mask = random_batch(B=32, T=8, scale=1e-3, seed=2)  # small drift: some sequences clipped, some not
    A = adv.unsqueeze(-1).expand_as(logp)
    s = torch.exp(sequence_log_ratio(logp.detach(), old, mask, length_normalize=True)).unsqueeze(-1).expand_as(logp)
    active = ~(((A > 0) & (s > 1 + 4e-4)) | ((A < 0) & (s < 1 - 3e-4)))
    assert active.any() and (~active).any()
    n_i = mask.sum(-1, keepdim=True)
    grad, _ = _grad("gspo", logp, old, adv, mask)
    assert torch.allclose(grad, -(s * active) * A * mask / n_i / logp.shape[0], rtol=1e-10, atol=1e-15)


@pytest.mark.parametrize("name", sorted(set(OBJECTIVES) - {"clip_cov"}))
def test_on_policy_every_objective_is_reinforce(name):
    # At logp == old_logp every ratio is 1: φ(1) = 1 for the kernels, r = 1 is inside every clip,
    # the SAPO gate slope 4σ(0)(1−σ(0)) = 1, GMPO's ratio is 1. So each gradient equals REINFORCE's
    # under the same aggregation. (clip_cov detaches the tokens it selects by covariance whatever the
    # ratio: tests/core/test_rules.py checks it on-policy.)
    logp, _, adv, mask = random_batch(B=8, T=6, seed=4)
    old = logp.detach().clone()
    mode = "seq-mean-token-mean"
    g_obj, m = _grad(name, logp, old, adv, mask, loss_agg_mode=mode)
    g_ref, _ = _grad("reinforce", logp, old, adv, mask, loss_agg_mode=mode)
    assert torch.allclose(g_obj, g_ref, rtol=1e-12, atol=1e-15)
    assert m["log_w/max"].item() == 0.0 and m["log_w/min"].item() == 0.0
    assert m["coef_mean"].item() == pytest.approx(1.0, abs=1e-12)


# --------------------------------------------------------------------------------------------------
# Aggregation and micro-batch invariance
# --------------------------------------------------------------------------------------------------


def test_agg_modes_by_hand():
    # values [[1, 2, 3], [4, 0, 0]], mask [[1, 1, 0], [1, 0, 0]]: valid tokens 1, 2 | 4
    v = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]], dtype=f64)
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=f64)
    assert agg_loss(v, m, "token-mean").item() == pytest.approx(7 / 3)  # (1+2+4)/3
    assert agg_loss(v, m, "token-sum").item() == pytest.approx(7)
    assert agg_loss(v, m, "seq-mean-token-mean").item() == pytest.approx((1.5 + 4) / 2)
    assert agg_loss(v, m, "seq-mean-token-sum").item() == pytest.approx((3 + 4) / 2)
    assert agg_loss(v, m, "seq-mean-token-sum-norm").item() == pytest.approx((3 + 4) / 2 / 3)  # H = T = 3
    assert agg_loss(v, m, "seq-mean-token-sum-norm", loss_scale_factor=7).item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="valid modes"):
        agg_loss(v, m, "mean")


def test_agg_ignores_nan_at_masked_positions():
    v = torch.tensor([[1.0, math.nan]], dtype=f64)
    m = torch.tensor([[1.0, 0.0]], dtype=f64)
    for mode in AGG_MODES:
        assert math.isfinite(agg_loss(v, m, mode).item())


def _valid_modes(name):
    return ["seq-mean-token-mean"] if name == "gmpo" else list(AGG_MODES)


# M2PO, KL-Cov and Clip-Cov select their tokens over the whole batch they are given, so they are not micro-batch
# invariant (by design; tests/core/test_corrections.py and tests/core/test_rules.py show the selections differ
# with the split and what still holds).
@pytest.mark.parametrize("name", sorted(set(OBJECTIVES) - {"m2po", "kl_cov", "clip_cov"}))
def test_micro_batch_invariance(name):
    logp, old, adv, mask = random_batch(B=10, T=6, seed=5, scale=0.5)
    n_tok, n_seq = mask.sum(), (mask.sum(-1) > 0).sum()
    for mode in _valid_modes(name):
        full_grad, _ = _grad(name, logp, old, adv, mask, loss_agg_mode=mode)
        full_loss, _ = policy_loss(name, logp.detach(), old, adv, mask, loss_agg_mode=mode)
        x = logp.detach().clone().requires_grad_(True)
        total = 0.0
        for rows in (slice(0, 3), slice(3, 4), slice(4, 10)):
            part, _ = policy_loss(
                name, x[rows], old[rows], adv[rows], mask[rows],
                loss_agg_mode=mode, global_tokens=n_tok, global_seqs=n_seq,
            )  # fmt: skip
            part.backward()
            total = total + part.item()
        assert total == pytest.approx(full_loss.item(), rel=1e-12, abs=1e-14), mode
        assert torch.allclose(x.grad, full_grad, rtol=1e-12, atol=1e-15), mode


# --------------------------------------------------------------------------------------------------
# Composition, rollout correction, API errors
# --------------------------------------------------------------------------------------------------


def test_branch_ablation_composes_without_new_code():
    logp, old, adv, mask = random_batch(B=12, T=5, seed=6, scale=1.0)
    loss, _ = policy_loss("reshaped", logp, old, adv, mask, pos_kernel="respo(2,0.5,2)", neg_kernel="vespo(3,2)")
    log_w = sequence_log_ratio(logp.detach(), old, mask)
    phi = torch.where(adv >= 0, respo_phi(log_w, adv), vespo_phi(log_w, adv))
    expected = -((phi * adv).unsqueeze(-1) * logp.detach() * mask).sum() / mask.sum()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    # the defaults of "reshaped" are ReSPO's
    a, _ = policy_loss("reshaped", logp, old, adv, mask)
    b, _ = policy_loss("respo", logp, old, adv, mask)
    assert a.item() == b.item()


def test_rollout_log_ratio_folds_into_log_w():
    # log W = Σ(logp − old) + Σ log ρ, so adding log ρ equals lowering old_logp by log ρ.
    logp, old, adv, mask = random_batch(B=8, T=5, seed=7)
    rlr = 0.2 * torch.randn(8, 5, dtype=f64, generator=torch.Generator().manual_seed(1))
    for name in ("respo", "vespo", "topr"):
        a, ma = policy_loss(name, logp, old, adv, mask, rollout_log_ratio=rlr)
        b, mb = policy_loss(name, logp, old - rlr, adv, mask)
        assert a.item() == pytest.approx(b.item(), rel=1e-12)
        assert ma["log_w/p50"].item() == pytest.approx(mb["log_w/p50"].item(), rel=1e-12)


def test_token_objectives_multiply_by_rho():
    # Like verl: the per-token loss is multiplied by ρ = exp(log ρ) → with log ρ = ln 2 everywhere the loss doubles.
    logp, old, adv, mask = random_batch(B=8, T=5, seed=8)
    rlr = torch.full((8, 5), math.log(2.0), dtype=f64)
    for name in ("grpo", "gspo", "cispo", "sapo"):
        a, _ = policy_loss(name, logp, old, adv, mask, rollout_log_ratio=rlr)
        b, _ = policy_loss(name, logp, old, adv, mask)
        assert a.item() == pytest.approx(2 * b.item(), rel=1e-12), name


def test_unknown_objective_and_hyperparameter():
    logp, old, adv, mask = random_batch()
    with pytest.raises(ValueError, match="valid objectives: .*respo"):
        policy_loss("ppo2", logp, old, adv, mask)
    with pytest.raises(ValueError, match=r"unknown hyperparameter\(s\) \['clip_ratio'\].*pos=\(2.0, 0.5, 2.0\)"):
        policy_loss("respo", logp, old, adv, mask, clip_ratio=0.2)
    assert hyperparameters("grpo") == {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0}
    assert hyperparameters("gspo") == {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4}
    assert hyperparameters("vespo") == {"pos": (2.0, 3.0), "neg": (3.0, 2.0)}
    assert hyperparameters("sapo") == {"tau_pos": 1.0, "tau_neg": 1.05}
    assert hyperparameters("gmpo") == {"clip_ratio_low": 0.4, "clip_ratio_high": 0.4}


def test_custom_hyperparameters_change_the_kernel():
    logp, old, adv, mask = random_batch(seed=9, scale=1.0)
    a, _ = policy_loss("respo", logp, old, adv, mask, pos=(3.0, 0.3, 1.0))
    b, _ = policy_loss("reshaped", logp, old, adv, mask, pos_kernel="respo(3,0.3,1)")
    assert a.item() == pytest.approx(b.item(), rel=1e-12)


# --------------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------------


def test_shape_and_dtype_errors():
    logp, old, adv, mask = random_batch(B=4, T=3)
    with pytest.raises(ValueError, match="old_logp shape"):
        policy_loss("respo", logp, old[:, :2], adv, mask)
    with pytest.raises(ValueError, match="mask shape"):
        policy_loss("respo", logp, old, adv, mask[:3])
    with pytest.raises(ValueError, match="advantages must have shape"):
        policy_loss("respo", logp, old, adv[:3], mask)
    with pytest.raises(TypeError, match="logp must be a floating-point"):
        policy_loss("respo", logp.detach().long(), old, adv, mask)
    with pytest.raises(ValueError, match="only 0 and 1; 1 row"):
        bad = mask.clone()
        bad[2, 1] = 0.5
        policy_loss("respo", logp, old, adv, bad)
    with pytest.raises(ValueError, match="nan_policy"):
        policy_loss("respo", logp, old, adv, mask, nan_policy="ignore")


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_nonfinite_rows_raise_with_count(name):
    logp, old, adv, mask = random_batch(B=6, T=4)
    old = old.clone()
    old[1, 0] = math.nan
    old[4, 0] = math.inf
    with pytest.raises(ValueError, match=r"2 of 6 row\(s\) \(old_logp: 2 row\(s\)\)"):
        policy_loss(name, logp, old, adv, mask)
    adv = adv.clone()
    adv[0] = math.nan
    with pytest.raises(ValueError, match=r"3 of 6 row\(s\).*advantages: 1 row"):
        policy_loss(name, logp, old, adv, mask)


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_nan_policy_mask_drops_and_counts(name):
    logp, old, adv, mask = random_batch(B=6, T=4, seed=10)
    bad_old = old.clone()
    bad_old[1, 0] = math.nan
    mask2 = mask.clone()
    mask2[3] = 0  # an all-masked row
    x = logp.detach().clone().requires_grad_(True)
    loss, m = policy_loss(name, x, bad_old, adv, mask2, nan_policy="mask")
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(x.grad).all()
    assert m["bad_rows/nonfinite"].item() == 1 and m["bad_rows/empty"].item() == 1
    assert (x.grad[1] == 0).all() and (x.grad[3] == 0).all()
    # equals the loss over the remaining rows alone
    keep = [0, 2, 4, 5]
    ref, _ = policy_loss(name, logp.detach()[keep], old[keep], adv[keep], mask[keep])
    assert loss.item() == pytest.approx(ref.item(), rel=1e-12)


def test_empty_row_raises_by_default():
    logp, old, adv, mask = random_batch(B=5, T=4)
    mask = mask.clone()
    mask[0] = 0
    mask[2] = 0
    with pytest.raises(ValueError, match=r"2 of 5 row\(s\) have no valid token"):
        policy_loss("respo", logp, old, adv, mask)


def test_token_level_advantages():
    # (B, T) advantages: the loss uses Â_it per token, the branch uses the sequence's masked mean.
    logp, old, adv, mask = random_batch(B=4, T=5, seed=11)
    adv_tok = adv.unsqueeze(-1).expand(4, 5).clone()
    a, _ = policy_loss("respo", logp, old, adv, mask)
    b, _ = policy_loss("respo", logp, old, adv_tok, mask)
    assert a.item() == pytest.approx(b.item(), rel=1e-12)


def test_float32_matches_float64():
    logp, old, adv, mask = random_batch(B=64, T=16, seed=12, scale=0.5)
    for name in OBJECTIVES:
        torch.manual_seed(0)  # clip_cov draws its tokens from torch's generator: the same draw in both precisions
        a, _ = policy_loss(name, logp.detach(), old, adv, mask)
        torch.manual_seed(0)
        b, _ = policy_loss(name, logp.detach().float(), old.float(), adv.float(), mask.float())
        assert b.dtype == torch.float32
        assert b.item() == pytest.approx(a.item(), rel=1e-4, abs=1e-6), name


def test_sequence_kernels_is_the_one_mapping():
    from respo import sequence_kernels

    lw = torch.log(torch.tensor([0.01, 4.0], dtype=f64))
    pk, nk = sequence_kernels("respo")
    assert pk(lw).tolist() == pytest.approx([1.35907, 2.5 * math.exp(-3)], abs=5e-6)  # φ⁺(.01), φ⁺(4) = 2.5/e³
    assert nk(lw).tolist() == pytest.approx([0.604965, 0.27067], abs=5e-6)  # φ⁻(.01), φ⁻(4)
    pk, nk = sequence_kernels("topr")
    assert pk(lw).tolist() == [1.0, 1.0] and nk(lw).tolist() == pytest.approx([0.01, 1.0])  # min(W, 1)
    with pytest.raises(ValueError, match="not a sequence-weight objective"):
        sequence_kernels("grpo")


# --------------------------------------------------------------------------------------------------
# Objectives built once: hyperparameters, default aggregation, the one pipeline
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_every_objective_lists_its_valid_hyperparameters(name):
    # Calling <name>_loss directly with an unknown hyperparameter names the valid ones (or "none").
    logp, old, adv, mask = random_batch()
    listed = ", ".join(f"{k}={v!r}" for k, v in hyperparameters(name).items()) or "none"
    with pytest.raises(ValueError, match=r"unknown hyperparameter\(s\) \['bogus'\]") as err:
        OBJECTIVES[name](logp, old, adv, mask, bogus=1)
    assert str(err.value).endswith(f"valid: {listed}")


def test_respo_loss_with_an_unknown_hyperparameter_lists_the_valid_ones():
    from respo import respo_loss

    logp, old, adv, mask = random_batch()
    with pytest.raises(ValueError, match=r"\['tau'\] for objective 'respo'; valid: pos=\(2.0, 0.5, 2.0\), neg=\(1.0, 0.5, 2.0\)"):
        respo_loss(logp, old, adv, mask, tau=1)


def test_build_objective_checks_hyperparameters_once_and_gives_its_defaults():
    from respo import build_objective

    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        build_objective("grpo", clip_ratio_c=0.5)  # no tensors needed to reject it
    with pytest.raises(ValueError, match="beta"):
        build_objective("respo", pos=(2.0, 1.5, 2.0))
    with pytest.raises(ValueError, match="kernel spec"):
        build_objective("reshaped", neg_kernel="respo(1")
    with pytest.raises(ValueError, match="valid objectives: .*reinforce"):
        build_objective("ppo2")
    assert {n: build_objective(n).default_agg for n in ("respo", "grpo", "cispo", "gspo", "sapo", "gmpo")} == {
        "respo": "token-mean", "grpo": "token-mean", "cispo": "token-mean",
        "gspo": "seq-mean-token-mean", "sapo": "seq-mean-token-mean", "gmpo": "seq-mean-token-mean",
    }  # fmt: skip
    gmpo = build_objective("gmpo")
    assert gmpo.agg_mode(None) == "seq-mean-token-mean"
    with pytest.raises(ValueError, match="gmpo aggregates per sequence"):
        gmpo.agg_mode("token-mean")
    assert build_objective("sapo", tau_neg=2.0).hyperparameters == {"tau_pos": 1.0, "tau_neg": 1.05}  # the defaults
    assert build_objective("grpo").kernels is None
    pos_kernel, neg_kernel = build_objective("topr").kernels
    lw = torch.log(torch.tensor([0.5, 4.0], dtype=f64))
    assert pos_kernel(lw).tolist() == [1.0, 1.0] and neg_kernel(lw).tolist() == pytest.approx([0.5, 1.0])  # min(W, 1)


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_an_objective_is_policy_loss_without_the_name(name):
    from respo import build_objective

    logp, old, adv, mask = random_batch(seed=13, scale=0.6)
    rlr = 0.2 * torch.randn(*mask.shape, generator=torch.Generator().manual_seed(1), dtype=f64)
    a, ma = build_objective(name)(logp, old, adv, mask, rollout_log_ratio=rlr)
    b, mb = policy_loss(name, logp, old, adv, mask, rollout_log_ratio=rlr)
    assert a.item() == b.item() and list(ma) == list(mb)
    assert all(torch.equal(ma[k], mb[k]) or (ma[k].isnan() and mb[k].isnan()) for k in ma)
    with pytest.raises(ValueError, match=r"\['tau'\].*set by build_objective"):
        build_objective(name)(logp, old, adv, mask, tau=1.0)  # hyperparameters belong to the build


def test_loss_functions_show_their_hyperparameters():
    import inspect

    from respo import grpo_loss, respo_loss

    params = inspect.signature(respo_loss).parameters
    assert list(params)[:6] == ["logp", "old_logp", "advantages", "mask", "pos", "neg"]
    assert params["pos"].default == (2.0, 0.5, 2.0) and "nan_policy" in params
    assert "clip_ratio_c" in inspect.signature(grpo_loss).parameters
    assert respo_loss.__name__ == "respo_loss" and "ReSPO" in respo_loss.__doc__


def test_fold_rollout_log_ratio_by_hand():
    from respo import fold_rollout_log_ratio

    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=f64)
    w = torch.tensor([[2.0, 2.0, 2.0, 7.0], [0.5, 4.0, 9.0, 9.0]], dtype=f64)
    # token: log ρ_it = log w_it on kept tokens, 0 elsewhere.
    log_rho, kept = fold_rollout_log_ratio(w, mask, level="token")
    assert log_rho.flatten().tolist() == pytest.approx([math.log(2)] * 3 + [0.0, math.log(0.5), math.log(4), 0, 0])
    assert kept.tolist() == mask.tolist()
    # sequence: row 0 carries one w = 2 on its 3 tokens: log 2 / 3 each, summing to log 2 once.
    log_rho, _ = fold_rollout_log_ratio(w, mask, level="sequence")
    assert log_rho[0].sum().item() == pytest.approx(math.log(2))
    # auto: row 0 (all equal) is a sequence weight, row 1 (0.5 ≠ 4) token weights.
    log_rho, _ = fold_rollout_log_ratio(w, mask)
    assert log_rho[0, 0].item() == pytest.approx(math.log(2) / 3) and log_rho[1, 1].item() == pytest.approx(math.log(4))
    # a zero weight leaves the mask; a negative weight on a valid token is an error naming the rows.
    log_rho, kept = fold_rollout_log_ratio(torch.tensor([[1.0, 0.0]]), torch.ones(1, 2), level="token")
    assert kept.tolist() == [[1.0, 0.0]] and log_rho.tolist() == [[0.0, 0.0]]
    with pytest.raises(ValueError, match="my weights must be finite and >= 0 on valid tokens; 1 row"):
        fold_rollout_log_ratio(torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), name="my weights")
    with pytest.raises(ValueError, match="level must be one of"):
        fold_rollout_log_ratio(w, mask, level="row")


# --------------------------------------------------------------------------------------------------
# The objective is the pipeline: clip ranges checked at build, the mode settled at build, extra inputs
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["grpo", "gspo", "cispo", "gmpo"])
@pytest.mark.parametrize("key", ["clip_ratio_low", "clip_ratio_high"])
def test_negative_clip_ranges_are_refused_when_the_objective_is_built(name, key):
    from respo import build_objective

    # A negative ε turns the clip interval inside out (1 − ε_l > 1 + ε_h is possible): refused in one line.
    with pytest.raises(ValueError, match=rf"{name}: {key} must be >= 0, got -0.1") as err:
        build_objective(name, **{key: -0.1})
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=rf"{key} must be >= 0, got nan"):
        build_objective(name, **{key: float("nan")})
    build_objective(name, **{key: 0.0})  # zero is a valid (degenerate) range


def test_the_aggregation_mode_is_settled_when_the_objective_is_built():
    from respo import build_objective

    logp, old, adv, mask = random_batch(seed=5)
    built = build_objective("grpo", loss_agg_mode="seq-mean-token-sum")
    assert built.loss_agg_mode == "seq-mean-token-sum" and build_objective("gspo").loss_agg_mode == "seq-mean-token-mean"
    a, _ = built(logp, old, adv, mask)
    b, _ = policy_loss("grpo", logp, old, adv, mask, loss_agg_mode="seq-mean-token-sum")
    c, _ = policy_loss("grpo", logp, old, adv, mask)  # token-mean: a different number
    assert a.item() == b.item() and a.item() != c.item()
    with pytest.raises(ValueError, match="gmpo aggregates per sequence"):
        build_objective("gmpo", loss_agg_mode="token-mean")  # refused before any tensor exists
    with pytest.raises(ValueError, match="unknown loss_agg_mode 'mean'"):
        build_objective("respo", loss_agg_mode="mean")


def test_unknown_names_raise_errors_that_carry_what_is_valid():
    from respo.core.objectives import UnknownHyperparameterError, UnknownObjectiveError, build_objective

    with pytest.raises(UnknownObjectiveError) as err:
        build_objective("ppo2")
    assert err.value.name == "ppo2" and "respo" in err.value.valid and isinstance(err.value, ValueError)
    with pytest.raises(UnknownHyperparameterError) as err:
        build_objective("respo", tau=1.0, pos=(2.0, 0.5, 2.0))
    assert err.value.unknown == ["tau"] and list(err.value.valid) == ["pos", "neg"]


def _echo_prox_term(inputs, log_ratio, rho):
    """A term that reads an extra per-token input: ℓ_it = −(prox_logp_it)·logp_it (a test double)."""
    from respo.core.objectives import Term

    prox = inputs.extra["prox_logp"]  # (B, T), detached
    return Term(-prox * inputs.logp, prox)


def test_an_objective_can_read_an_extra_per_token_input(monkeypatch):
    from respo.core import objectives as O

    def factory():
        return _echo_prox_term

    from respo.core import registry

    spec = registry.ObjectiveSpec("echo", factory, "−prox_logp·logp", "a test double", inputs=("prox_logp",))
    monkeypatch.setitem(registry._REGISTRY, "echo", spec)
    # mask [[1, 1], [1, 0]], logp all −1, prox [[2, 3], [4, NaN]]: token-mean of −prox·logp over the 3
    # valid tokens = (2 + 3 + 4) / 3 = 3; the NaN is off the mask and never read.
    logp = torch.full((2, 2), -1.0, dtype=f64, requires_grad=True)
    mask = torch.tensor([[1, 1], [1, 0]], dtype=f64)
    prox = torch.tensor([[2.0, 3.0], [4.0, math.nan]], dtype=f64)
    loss, _ = O.build_objective("echo")(logp, logp.detach(), torch.ones(2, dtype=f64), mask, prox_logp=prox)
    assert loss.item() == pytest.approx(3.0)
    loss2, _ = O.policy_loss("echo", logp, logp.detach(), torch.ones(2, dtype=f64), mask, prox_logp=prox)
    assert loss2.item() == loss.item()
    with pytest.raises(ValueError, match=r"objective 'echo' needs the per-token input\(s\) \['prox_logp'\]"):
        O.build_objective("echo")(logp, logp.detach(), torch.ones(2, dtype=f64), mask)
    with pytest.raises(ValueError, match=r"prox_logp shape \(2, 1\) does not match logp shape \(2, 2\)"):
        O.build_objective("echo")(logp, logp.detach(), torch.ones(2, dtype=f64), mask, prox_logp=prox[:, :1])
    bad = prox.clone()
    bad[0, 0] = math.inf  # on a valid token: named like any other input, or the row is dropped under "mask"
    with pytest.raises(ValueError, match=r"prox_logp: 1 row\(s\)"):
        O.build_objective("echo")(logp, logp.detach(), torch.ones(2, dtype=f64), mask, prox_logp=bad)
    loss3, metrics = O.build_objective("echo")(logp, logp.detach(), torch.ones(2, dtype=f64), mask, prox_logp=bad,
                                               nan_policy="mask")
    assert metrics["bad_rows/nonfinite"].item() == 1 and loss3.item() == pytest.approx(4.0)  # row 1 only
    with pytest.raises(ValueError, match=r"\['prox_logp'\].*set by build_objective"):
        O.build_objective("respo")(logp, logp.detach(), torch.ones(2, dtype=f64), mask, prox_logp=prox)
