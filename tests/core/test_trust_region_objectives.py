"""DPPO (binary TV and KL), LUSPO, KL-estimator rejection, batch-normalised IS weights and AReaL's
log-linear proximal policy: hand-worked values, extreme log W, micro-batching, bad hyperparameters.

The log-linear proximal policy and decoupled PPO with it are cross-checked against AReaL 1.0.4's own
functions in tests/integrations/test_crosscheck_areal.py (here: what respo adds, the comparison metrics
and the errors); the others against verl and TRL in tests/integrations/test_crosscheck_trust_rules.py
and tests/integrations/test_integration_trl.py."""

import math

import pytest
import torch

import respo
from respo import build_objective, hyperparameters, policy_loss
from respo.core import corrections as C

f64 = torch.float64
NEW = ("dppo_tv", "dppo_kl", "luspo", "klrs")


def _run(name, logp, old, adv, mask, **kw):
    x = logp.clone().requires_grad_(True)
    loss, metrics = policy_loss(name, x, old, adv, mask, **kw)
    loss.backward()
    return loss.item(), x.grad, metrics


def test_hyperparameters_with_their_sources_defaults():
    # verl's DPPO recipe (examples/dppo_trainer): δ = 0.15 (TV), 0.05 (KL), clip_ratio_c = 10000
    assert hyperparameters("dppo_tv") == {"delta_low": 0.15, "delta_high": 0.15, "cap": 10000.0}
    assert hyperparameters("dppo_kl") == {"delta_low": 0.05, "delta_high": 0.05, "cap": 10000.0}
    assert hyperparameters("luspo") == {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2}  # TRL's epsilon
    # verl's decoupled_k3_rs preset: seq_mean_k3 at 0.01
    assert hyperparameters("klrs") == {"estimator": "k3", "agg": "mean", "threshold": 0.01, "lower": None,
                                       "veto": None, "base": "reinforce", "base_kwargs": None}  # fmt: skip
    assert hyperparameters("tis")["batch_normalize"] is False and hyperparameters("mis")["batch_normalize"] is False
    assert hyperparameters("decoupled")["prox_method"] == "given"  # AReaL's default is a recompute
    assert build_objective("luspo").loss_agg_mode == "seq-mean-token-sum"


# --------------------------------------------------------------------------------------------------
# DPPO
# --------------------------------------------------------------------------------------------------


def _probs(p, q, mask=None):
    logp, old = torch.log(torch.tensor(p, dtype=f64)), torch.log(torch.tensor(q, dtype=f64))
    return logp, old, torch.ones_like(logp) if mask is None else torch.tensor(mask, dtype=f64)


def test_dppo_tv_by_hand():
    # row 0, Â = +1: p = (.5, .2, .9), q = (.3, .25, .6): p − q = (.2, −.05, .3); keep p − q ≤ .15 → (0, 1, 0)
    # row 1, Â = −1: p = (.1, .5, ·), q = (.3, .4, ·): p − q = (−.2, .1); keep p − q ≥ −.15 → (0, 1)
    # ℓ = −M·min(r, C)·Â·logp: row 0 token 1: −(.2/.25)·log .2 = −.8·(−1.609438) = 1.287550
    #                           row 1 token 1: (.5/.4)·log .5 = 1.25·(−0.693147) = −0.866434
    # token-mean over the 5 valid tokens: (1.287550 − 0.866434)/5 = 0.084223
    logp, old, mask = _probs([[0.5, 0.2, 0.9], [0.1, 0.5, 1.0]], [[0.3, 0.25, 0.6], [0.3, 0.4, 1.0]],
                             [[1, 1, 1], [1, 1, 0]])  # fmt: skip
    adv = torch.tensor([1.0, -1.0], dtype=f64)
    loss, grad, m = _run("dppo_tv", logp, old, adv, mask)
    assert loss == pytest.approx((1.2875503 - 0.8664340) / 5, rel=1e-6)
    # ∇ = −M·r·Â/5: row 0 (0, −.8/5, 0); row 1 (0, 1.25/5)
    assert grad.flatten().tolist() == pytest.approx([0, -0.16, 0, 0, 0.25, 0], abs=1e-12)
    assert m["corr/masked_tokens"].item() == pytest.approx(3 / 5)  # 3 of 5 tokens left the trust region
    assert m["corr/masked_seqs"].item() == 1.0 and m["clipfrac"].item() == pytest.approx(3 / 5)


def test_dppo_kl_masks_by_the_binary_kl_and_the_direction():
    # Â = +1 throughout. D = q·log(q/p) + (1−q)·log((1−q)/(1−p)):
    #   q = .3, p = .5:   .3·log(.6) + .7·log(1.4) = 0.082283 > .05, p > q → masked
    #   q = .25, p = .2:  p ≤ q (moved against Â's push) → kept whatever D is
    #   q = .02, p = .1:  .02·log(.2) + .98·log(.98/.9) = 0.051266 > .05 → masked (TV would keep: p − q = .08)
    #   q = .02, p = .06: .02·log(1/3) + .98·log(.98/.94) = 0.018876 ≤ .05 → kept
    logp, old, mask = _probs([[0.5, 0.2, 0.1, 0.06]], [[0.3, 0.25, 0.02, 0.02]])
    adv = torch.tensor([1.0], dtype=f64)
    keep = C.dppo_keep(logp, old, adv.view(1, 1).expand(1, 4), "kl", 0.05, 0.05)
    assert keep.tolist() == [[False, True, False, True]]
    assert C.dppo_keep(logp, old, adv.view(1, 1).expand(1, 4), "tv", 0.15, 0.15).tolist() == [[False, True, True, True]]
    # a negative advantage flips the direction: q = .3, p = .5 moved up, the way Â < 0 does not push → kept
    assert C.dppo_keep(logp, old, -adv.view(1, 1).expand(1, 4), "kl", 0.05, 0.05)[0, 0].item() is True
    loss, grad, _ = _run("dppo_kl", logp, old, adv, mask)
    # kept: −(.2/.25)·log .2 = 1.287550 and −(.06/.02)·log .06 = −3·(−2.813411) = 8.440232; /4 tokens
    assert loss == pytest.approx((1.2875503 + 8.4402323) / 4, rel=1e-6)
    assert grad.flatten().tolist() == pytest.approx([0, -0.8 / 4, 0, -3 / 4], abs=1e-12)


def test_dppo_truncates_the_ratio_at_the_cap():
    # q = .1, p = .2, Â = −1: p − q = .1 ≥ −.15 kept; r = 2 > C = 1.5 → coefficient 1.5
    logp, old, mask = _probs([[0.2]], [[0.1]])
    loss, grad, m = _run("dppo_tv", logp, old, torch.tensor([-1.0], dtype=f64), mask, cap=1.5)
    assert loss == pytest.approx(1.5 * math.log(0.2)) and grad.item() == pytest.approx(1.5)
    assert m["corr/trunc_frac"].item() == 1.0


# --------------------------------------------------------------------------------------------------
# LUSPO
# --------------------------------------------------------------------------------------------------


def test_luspo_by_hand_scales_each_sequence_by_its_length():
    # row 0 (2 tokens): log r = (.1, −.3), s = e^(−0.1) = 0.904837, Â = +1, inside [.8, 1.2]: ℓ_t = −s
    # row 1 (1 token):  log r = .5,       s = e^0.5 = 1.648721, Â = −1: max(−sÂ, −clip(s)Â) = max(1.6487, 1.2) = s
    # L = [2·(−0.904837) + 1.648721] / 2 sequences = −0.080477
    # ∇ per token = −s_i·Â_i / N_seq (no 1/T_i): row 0 −0.452419 each, row 1 +0.824361
    logp = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]], dtype=f64)
    old = logp - torch.tensor([[0.1, -0.3], [0.5, 0.0]], dtype=f64)
    mask = torch.tensor([[1, 1], [1, 0]], dtype=f64)
    loss, grad, m = _run("luspo", logp, old, torch.tensor([1.0, -1.0], dtype=f64), mask)
    s0, s1 = math.exp(-0.1), math.exp(0.5)
    assert loss == pytest.approx((-2 * s0 + s1) / 2, rel=1e-12)
    assert grad.flatten().tolist() == pytest.approx([-s0 / 2, -s0 / 2, s1 / 2, 0.0], rel=1e-12)
    # GSPO's seq-mean-token-mean divides row 0 by its length: LUSPO is that times T_i per row
    _, g_gspo, _ = _run("gspo", logp, old, torch.tensor([1.0, -1.0], dtype=f64), mask, clip_ratio_low=0.2,
                        clip_ratio_high=0.2)  # fmt: skip
    assert torch.allclose(grad, g_gspo * mask.sum(-1, keepdim=True), rtol=1e-12)


# --------------------------------------------------------------------------------------------------
# KL-estimator rejection
# --------------------------------------------------------------------------------------------------


def _rs_batch():
    # log w row 0 = (.1, −.1, 0), row 1 = (.5, 0, ·) (2 valid tokens)
    log_w = torch.tensor([[0.1, -0.1, 0.0], [0.5, 0.0, 0.0]], dtype=f64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=f64)
    return log_w, mask


@pytest.mark.parametrize("kw, expected", [
    # k3 = e^l − 1 − l: row 0 (.005171, .004837, 0) mean .003336 ≤ .01 kept; row 1 (.148721, 0) mean .074361 rejected
    ({"estimator": "k3", "agg": "mean", "threshold": 0.01}, [[1, 1, 1], [0, 0, 0]]),
    # k2 = l²/2: row 0 sum .005 + .005 = .01 ≤ .011 kept; row 1 .125 rejected
    ({"estimator": "k2", "agg": "sum", "threshold": 0.011}, [[1, 1, 1], [0, 0, 0]]),
    # k3 max: row 0 .005171 kept; row 1 .148721 rejected
    ({"estimator": "k3", "agg": "max", "threshold": 0.01}, [[1, 1, 1], [0, 0, 0]]),
    # k1 = −l per token within [log(1/1.2), log 1.2] = ±0.182322: only row 1 token 0 (−.5) is outside
    ({"estimator": "k1", "agg": "token", "threshold": 1.2}, [[1, 1, 1], [0, 1, 0]]),
    # k2 per token ≤ .01 keeps |l| ≤ .141421: the same token rejected; the veto (w < .95, l < −0.051293)
    # drops row 0 whole for its token at l = −.1
    ({"estimator": "k2", "agg": "token", "threshold": 0.01, "veto": 0.95}, [[0, 0, 0], [0, 1, 0]]),
])  # fmt: skip
def test_kl_rejection_masks_by_hand(kw, expected):
    log_w, mask = _rs_batch()
    keep = C.kl_reject_keep(log_w, mask, **kw)
    assert keep.to(f64).tolist() == expected


def test_klrs_on_reinforce_by_hand():
    # Default: seq_mean_k3 at .01 keeps row 0 only. Â = (+1, −1); logp row 0 = (−1, −2, −.5).
    # token-mean over all 5 valid tokens (a rejection is a weight of 0): −(−1 −2 −.5)/5 = 0.7; ∇ row 0 = −1/5
    log_w, mask = _rs_batch()
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, 0.0]], dtype=f64)
    loss, grad, m = _run("klrs", logp, logp - log_w, torch.tensor([1.0, -1.0], dtype=f64), mask)
    assert loss == pytest.approx(0.7, rel=1e-12)
    assert grad.flatten().tolist() == pytest.approx([-0.2, -0.2, -0.2, 0.0, 0.0, 0.0], abs=1e-15)
    assert m["rs/masked_seqs"].item() == 0.5 and m["rs/masked_tokens"].item() == pytest.approx(2 / 5)
    assert m["rs/silenced_adv_share/neg"].item() == 1.0 and m["rs/silenced_adv_share/pos"].item() == 0.0


def test_klrs_composes_with_any_objective():
    # With nothing rejected (threshold huge), klrs on a base is the base; with rows rejected, it is the base on
    # the kept rows (their loss and gradient zero), under the base's default aggregation.
    g = torch.Generator().manual_seed(3)
    logp = -torch.rand(6, 5, generator=g, dtype=f64) * 2
    old = logp + 0.4 * torch.randn(6, 5, generator=g, dtype=f64)
    adv, mask = torch.randn(6, generator=g, dtype=f64), torch.ones(6, 5, dtype=f64)
    for base, kw in (("grpo", {}), ("gspo", {}), ("respo", {}), ("gmpo", {}), ("tis", {"cap": 1.5})):
        a, ga, _ = _run("klrs", logp, old, adv, mask, threshold=1e9, base=base, base_kwargs=kw)
        b, gb, _ = _run(base, logp, old, adv, mask, **kw)
        assert a == pytest.approx(b, rel=1e-12) and torch.allclose(ga, gb, rtol=1e-12), base
        assert build_objective("klrs", base=base).loss_agg_mode == build_objective(base).loss_agg_mode
    keep = C.kl_reject_keep(logp - old, mask, estimator="k3", agg="mean", threshold=0.1)
    rows = keep.any(-1)
    assert 0 < rows.sum() < 6  # some rows rejected on this batch
    a, ga, _ = _run("klrs", logp, old, adv, mask, threshold=0.1, base="grpo")
    b, gb, _ = _run("grpo", logp[rows], old[rows], adv[rows], mask[rows], global_tokens=mask.sum())
    assert a == pytest.approx(b, rel=1e-12) and torch.allclose(ga[rows], gb, rtol=1e-12)
    assert ga[~rows].abs().max().item() == 0.0
    with pytest.raises(ValueError, match=r"unknown keyword argument\(s\) \['prox_logp'\]"):
        build_objective("klrs")(logp, old, adv, mask, prox_logp=logp)  # reinforce reads no proximal policy
    built = build_objective("klrs", base="decoupled", base_kwargs={"clip_ratio_c": 3.0})
    built(logp, old, adv, mask, prox_logp=logp)  # decoupled's input passes through


@pytest.mark.parametrize("kw, message", [
    ({"estimator": "k4"}, r"klrs: estimator must be one of \('k1', 'k2', 'k3'\), got 'k4'"),
    ({"agg": "median"}, r"klrs: agg must be one of \('token', 'mean', 'sum', 'max'\)"),
    ({"estimator": "k1", "agg": "max"}, "klrs: agg='max' is for k2 and k3"),
    ({"threshold": 0}, "klrs: threshold must be > 0"),
    ({"threshold": math.inf}, "klrs: threshold must be finite"),
    ({"lower": 0.5}, "klrs: lower is a ratio bound of k1"),
    ({"estimator": "k1", "threshold": 2.0, "lower": 3.0}, "klrs: lower is a ratio bound of k1, <= threshold"),
    ({"veto": -1}, "klrs: veto must be > 0"),
    ({"base": "klrs"}, "klrs: base must be the name of another objective"),
    ({"base": "grpoo"}, "unknown objective 'grpoo'"),
    ({"base": "grpo", "base_kwargs": {"clip_ratio_low": 1.5}}, r"grpo: clip_ratio_low must be in \[0, 1\)"),
    ({"base_kwargs": [1]}, "klrs: base_kwargs must be a mapping"),
])  # fmt: skip
def test_klrs_bad_hyperparameters_are_one_line_errors(kw, message):
    with pytest.raises(ValueError, match=message) as err:
        build_objective("klrs", **kw)
    assert "\n" not in str(err.value)


# --------------------------------------------------------------------------------------------------
# Batch-normalised IS weights (TIS, MIS)
# --------------------------------------------------------------------------------------------------


def test_batch_normalised_tis_by_hand():
    # sequence level, one token per row: W = (.5, 1, 4) → min(W, 2) = (.5, 1, 2), batch mean 3.5/3 = 1.166667
    # → (0.428571, 0.857143, 1.714286), mean 1. Â = 1, logp = −1: token-mean = Σ c / 3 = 1.0
    logp = torch.full((3, 1), -1.0, dtype=f64)
    old = logp - torch.log(torch.tensor([[0.5], [1.0], [4.0]], dtype=f64))
    loss, grad, m = _run("tis", logp, old, torch.ones(3, dtype=f64), torch.ones(3, 1, dtype=f64), batch_normalize=True)
    assert loss == pytest.approx(1.0, rel=1e-12)
    assert (-3 * grad).flatten().tolist() == pytest.approx([0.5 / 3.5 * 3, 1 / 3.5 * 3, 2 / 3.5 * 3], rel=1e-12)
    assert m["corr/batch_norm_factor"].item() == pytest.approx(3.5 / 3)
    # within micro-batches (row_groups (0, 0, 1)): means .75 and 2 → (0.666667, 1.333333, 1)
    _, grad_g, _ = _run("tis", logp, old, torch.ones(3, dtype=f64), torch.ones(3, 1, dtype=f64), batch_normalize=True,
                        row_groups=torch.tensor([0, 0, 1]))  # fmt: skip
    assert (-3 * grad_g).flatten().tolist() == pytest.approx([2 / 3, 4 / 3, 1.0], rel=1e-12)


def test_batch_normalised_token_mis_by_hand():
    # token level: w = (.5, 4, 2, 2.5), band [0, 3]: (.5, 0, 2, 2.5), mean over the 4 tokens 1.25 → (.4, 0, 1.6, 2)
    w = torch.tensor([[0.5, 4.0, 2.0, 2.5]], dtype=f64)
    logp = torch.full((1, 4), -1.0, dtype=f64)
    _, grad, m = _run("mis", logp, logp - torch.log(w), torch.ones(1, dtype=f64), torch.ones(1, 4, dtype=f64),
                      level="token", batch_normalize=True)  # fmt: skip
    assert (-4 * grad).flatten().tolist() == pytest.approx([0.4, 0.0, 1.6, 2.0], rel=1e-12)
    assert m["corr/batch_norm_factor"].item() == pytest.approx(1.25)
    with pytest.raises(ValueError, match="tis: batch_normalize must be true or false, got 'yes'"):
        build_objective("tis", batch_normalize="yes")


def test_batch_normalised_weights_are_additive_over_micro_batches_given_their_groups():
    # The batch mean spans the call, so like M2PO this is not micro-batch invariant; with row_groups the
    # full-batch call normalises each micro-batch as that micro-batch's own call does.
    g = torch.Generator().manual_seed(4)
    logp = -torch.rand(8, 4, generator=g, dtype=f64)
    old = logp + 0.5 * torch.randn(8, 4, generator=g, dtype=f64)
    adv, mask = torch.randn(8, generator=g, dtype=f64), torch.ones(8, 4, dtype=f64)
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 1, 1])
    for name, kw in (("tis", {"level": "token"}), ("tis", {}), ("mis", {"hi": 1.5})):
        full, g_full, _ = _run(name, logp, old, adv, mask, batch_normalize=True, row_groups=groups, **kw)
        x = logp.clone().requires_grad_(True)
        total = 0.0
        for rows in (slice(0, 3), slice(3, 8)):
            part, _ = policy_loss(name, x[rows], old[rows], adv[rows], mask[rows], batch_normalize=True,
                                  global_tokens=mask.sum(), **kw)  # fmt: skip
            part.backward()
            total += part.item()
        assert total == pytest.approx(full, rel=1e-12) and torch.allclose(x.grad, g_full, rtol=1e-12), (name, kw)
        whole, _, _ = _run(name, logp, old, adv, mask, batch_normalize=True, **kw)
        assert whole != pytest.approx(full, rel=1e-9)  # one mean over the batch is another loss


# --------------------------------------------------------------------------------------------------
# AReaL's log-linear proximal policy: respo's comparison metrics and errors (its values: AReaL's own
# functions, tests/integrations/test_crosscheck_areal.py)
# --------------------------------------------------------------------------------------------------


def test_decoupled_with_the_loglinear_proximal_policy_metrics_and_errors():
    # π_old = .2, π_θ = .4, s = 4: the approximation π_prox = .2·2^.75 = 0.336359 (α = 3/4)
    old = torch.full((1, 1), math.log(0.2), dtype=f64)
    logp = torch.full((1, 1), math.log(0.4), dtype=f64)
    s = torch.full((1, 1), 4.0, dtype=f64)
    # with the true π_prox given as well, the approximation is only compared: π_prox = .3 → |log .3 − log .336359|
    _, _, m = _run("decoupled", logp, old, torch.ones(1, dtype=f64), torch.ones(1, 1, dtype=f64),
                   prox_method="loglinear", staleness=s, prox_logp=torch.full((1, 1), math.log(0.3), dtype=f64))
    assert m["prox/abs_error"].item() == pytest.approx(abs(math.log(0.3) - math.log(0.2 * 2**0.75)), rel=1e-9)
    assert m["prox/weight_error"].item() == pytest.approx(2**0.75 - 1.5, rel=1e-9)  # |b_approx − .3/.2|
    with pytest.raises(ValueError, match="decoupled: prox_method='loglinear' needs the per-token input staleness"):
        policy_loss("decoupled", logp, old, torch.ones(1, dtype=f64), torch.ones(1, 1, dtype=f64), prox_method="loglinear")
    with pytest.raises(ValueError, match=r"decoupled: prox_method must be one of \('given', 'loglinear'\)"):
        build_objective("decoupled", prox_method="linear")


# --------------------------------------------------------------------------------------------------
# Extreme log W, all tokens masked, one token; micro-batch invariance
# --------------------------------------------------------------------------------------------------

CASES = {
    "dppo_tv": {}, "dppo_kl": {}, "luspo": {}, "klrs": {"threshold": 0.5, "agg": "token"},
    "klrs-grpo": {"base": "grpo", "estimator": "k2", "agg": "max", "threshold": 0.2},
    "tis-norm": {"batch_normalize": True}, "mis-norm": {"batch_normalize": True, "level": "token"},
    "decoupled-loglinear": {"prox_method": "loglinear"},
}  # fmt: skip


def _case(key, logp):
    name = key.split("-")[0]
    extra = {"staleness": torch.full_like(logp.detach(), 3.0)} if key == "decoupled-loglinear" else {}
    return name, {**CASES[key], **extra}


@pytest.mark.parametrize("key", sorted(CASES))
@pytest.mark.parametrize("shift", [20.0, -20.0, 35.0, -35.0])
def test_finite_loss_and_gradient_at_extreme_log_w(key, shift):
    # log w = ±20 on every token (beyond the clamp at ±35), probabilities at the edges: logp ∈ {0, −40}
    logp = torch.tensor([[0.0, -1.0, -40.0], [-0.5, 0.0, -3.0]], dtype=f64)
    name, kw = _case(key, logp)
    for adv in (torch.tensor([1.0, -1.0], dtype=f64), torch.tensor([-2.0, 3.0], dtype=f64)):
        loss, grad, m = _run(name, logp, logp - shift, adv, torch.ones(2, 3, dtype=f64), **kw)
        assert math.isfinite(loss) and torch.isfinite(grad).all(), (key, shift)


@pytest.mark.parametrize("key", sorted(CASES))
def test_all_tokens_masked_and_one_token(key):
    logp = torch.tensor([[-1.0, -2.0]], dtype=f64)
    name, kw = _case(key, logp)
    loss, grad, m = _run(name, logp, logp + 0.3, torch.ones(1, dtype=f64), torch.zeros(1, 2, dtype=f64),
                         nan_policy="mask", **kw)  # fmt: skip
    assert loss == 0.0 and grad.abs().max().item() == 0.0 and m["bad_rows/empty"].item() == 1
    one = torch.tensor([[-0.7]], dtype=f64)
    name, kw = _case(key, one)
    loss, grad, _ = _run(name, one, one + 0.05, torch.tensor([1.5], dtype=f64), torch.ones(1, 1, dtype=f64), **kw)
    assert math.isfinite(loss) and torch.isfinite(grad).all() and grad.abs().item() > 0


@pytest.mark.parametrize("key", sorted(k for k in CASES if "norm" not in k))  # a batch mean spans the call
def test_micro_batch_invariance(key):
    g = torch.Generator().manual_seed(8)
    logp = -torch.rand(10, 6, generator=g, dtype=f64) * 2
    old = logp + 0.4 * torch.randn(10, 6, generator=g, dtype=f64)
    mask = (torch.rand(10, 6, generator=g) > 0.25).to(f64)
    mask[:, 0] = 1
    adv = torch.randn(10, generator=g, dtype=f64)
    name, kw = _case(key, logp)
    n_tok, n_seq = mask.sum(), (mask.sum(-1) > 0).sum()
    for mode in respo.AGG_MODES:
        full, g_full, _ = _run(name, logp, old, adv, mask, loss_agg_mode=mode, **kw)
        x = logp.clone().requires_grad_(True)
        total = 0.0
        for rows in (slice(0, 3), slice(3, 4), slice(4, 10)):
            part_kw = {k: (v[rows] if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
            part, _ = policy_loss(name, x[rows], old[rows], adv[rows], mask[rows], loss_agg_mode=mode,
                                  global_tokens=n_tok, global_seqs=n_seq, **part_kw)  # fmt: skip
            part.backward()
            total += part.item()
        assert total == pytest.approx(full, rel=1e-12, abs=1e-14), (key, mode)
        assert torch.allclose(x.grad, g_full, rtol=1e-12, atol=1e-15), (key, mode)


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
@pytest.mark.parametrize("kw, message", [
    ({"delta_low": -0.1}, "delta_low must be >= 0"), ({"delta_high": math.inf}, "delta_high must be finite"),
    ({"cap": 0}, "cap must be > 0"), ({"delta_high": "0.1"}, "delta_high must be a number"),
])  # fmt: skip
def test_dppo_bad_hyperparameters(name, kw, message):
    with pytest.raises(ValueError, match=f"{name}: {message}"):
        build_objective(name, **kw)
