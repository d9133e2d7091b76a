"""DPPO, KL-estimator rejection and batch-normalised IS weights against verl 0.9.1's own functions (float64).

What is checked against what (tolerance rtol 1e-6, atol 1e-9 on losses and gradients: verl adds 1e-8 to
its token and sequence counts; masks must be equal exactly):
  dppo_tv, dppo_kl   verl ``compute_policy_loss_dppo_tv`` / ``_dppo_kl`` (``clip_ratio_low/high`` = δ,
                     ``clip_ratio_c`` = C), in all five aggregation modes, with and without rollout weights
  klrs (the mask)    verl ``compute_rollout_rejection_mask`` in all eleven ``rollout_rs`` modes, and its
                     masked fractions (token and sequence)
  klrs (the loss)    verl's bypass mode, REINFORCE with ``rollout_rs`` (``token-sum``: verl drops rejected
                     tokens from the normaliser, respo keeps them at weight 0, so token-mean differs by
                     exactly the ratio of the two token counts, which is checked too)
  tis/mis batch_normalize   verl's bypass mode, REINFORCE, ``rollout_is_batch_normalize=True``
LUSPO is TRL's and is checked inside TRL's trainer (tests/integrations/test_integration_trl.py). AReaL's log-linear
proximal policy is checked against AReaL 1.0.4's own function (tests/integrations/test_crosscheck_areal.py).
"""

import pytest
import torch

from respo import AGG_MODES, policy_loss
from respo.core import corrections as C

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
rc = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper")
from test_crosscheck_corrections import verl_bypass  # noqa: E402
from test_crosscheck_verl_trl import actor_config, batch, run_verl  # noqa: E402
from verl.trainer.config.algorithm import RolloutCorrectionConfig  # noqa: E402

f64 = torch.float64
TOL = dict(rtol=1e-6, atol=1e-9)


def ours(name, logp, old, adv, mask, mode="token-mean", **kw):
    x = logp.clone().requires_grad_(True)
    loss, metrics = policy_loss(name, x, old, adv, mask, loss_agg_mode=mode, **kw)
    loss.backward()
    return loss.detach(), x.grad, metrics


@pytest.mark.parametrize("name, delta", [("dppo_tv", 0.15), ("dppo_kl", 0.05), ("dppo_tv", 0.02), ("dppo_kl", 0.01)])
@pytest.mark.parametrize("mode", AGG_MODES)
def test_dppo_matches_verl(name, delta, mode):
    # probabilities that move: logp in (−3, 0), old = logp + N(0, .5²)
    logp, old, adv, mask = batch(11, B=16, T=10, scale=0.5)
    cap = 1.8  # low enough that the truncation acts on this batch
    config = actor_config(clip_ratio_low=delta, clip_ratio_high=delta, clip_ratio_c=cap)
    lv, gv, mv = run_verl(name, logp, old, adv, mask, config, mode)
    lc, gc, mc = ours(name, logp, old, adv, mask, mode, delta_low=delta, delta_high=delta, cap=cap)
    assert 0 < mc["corr/masked_tokens"].item() < 1 and mc["corr/trunc_frac"].item() > 0
    assert torch.allclose(lc, lv, **TOL) and torch.allclose(gc, gv, **TOL)
    assert mc["clipfrac"].item() == pytest.approx(mv["actor/pg_clipfrac"], rel=1e-6)  # verl: the share masked


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
def test_dppo_with_rollout_weights_matches_verl(name):
    logp, old, adv, mask = batch(12, B=16, T=10, scale=0.5)
    w = torch.exp(0.3 * torch.randn(*mask.shape, generator=torch.Generator().manual_seed(2), dtype=f64))
    config = actor_config(clip_ratio_low=0.1, clip_ratio_high=0.1, clip_ratio_c=20.0)
    lv, gv, _ = run_verl(name, logp, old, adv, mask, config, "token-mean", rollout_is_weights=w)
    lc, gc, _ = ours(name, logp, old, adv, mask, delta_low=0.1, delta_high=0.1, cap=20.0, rollout_log_ratio=torch.log(w))
    assert torch.allclose(lc, lv, **TOL) and torch.allclose(gc, gv, **TOL)


RS_MODES = [("token", "k1", 1.3), ("token", "k2", 0.05), ("token", "k3", 0.05), ("sum", "k1", 2.0), ("sum", "k2", 0.3),
            ("sum", "k3", 0.3), ("mean", "k1", 1.1), ("mean", "k2", 0.04), ("mean", "k3", 0.04), ("max", "k2", 0.2),
            ("max", "k3", 0.2)]  # fmt: skip
VERL_AGG = {"token": "token", "sum": "seq_sum", "mean": "seq_mean", "max": "seq_max"}


@pytest.mark.parametrize("agg, estimator, threshold", RS_MODES)
def test_kl_rejection_mask_is_verls_rollout_rs(agg, estimator, threshold):
    logp, old, adv, mask = batch(13, B=24, T=10, scale=0.3)
    option = f"{VERL_AGG[agg]}_{estimator}"
    kept, mv = rc.compute_rollout_rejection_mask(logp - old, mask, rollout_rs=option, rollout_rs_threshold=threshold)
    keep = C.kl_reject_keep(logp - old, mask, estimator=estimator, agg=agg, threshold=threshold)
    assert 0 < keep.sum() < mask.sum(), option  # the threshold cuts this batch
    assert torch.equal(keep, kept > 0), option
    _, _, m = ours("klrs", logp, old, adv, mask, estimator=estimator, agg=agg, threshold=threshold)
    assert m["rs/masked_tokens"].item() == pytest.approx(mv["rollout_rs_masked_fraction"], rel=1e-6)
    assert m["rs/masked_seqs"].item() == pytest.approx(mv["rollout_rs_seq_masked_fraction"], rel=1e-6)  # verl: float32


def test_kl_rejection_k1_with_two_bounds_is_verls_lower_upper():
    logp, old, adv, mask = batch(14, B=24, T=10, scale=0.2)
    kept, _ = rc.compute_rollout_rejection_mask(logp - old, mask, rollout_rs="seq_mean_k1", rollout_rs_threshold="0.95_1.2")
    keep = C.kl_reject_keep(logp - old, mask, estimator="k1", agg="mean", threshold=1.2, lower=0.95)
    assert 0 < keep.sum() < mask.sum() and torch.equal(keep, kept > 0)


@pytest.mark.parametrize("agg, estimator, threshold", [("mean", "k3", 0.04), ("token", "k2", 0.05), ("max", "k3", 0.2)])
def test_klrs_on_reinforce_is_verls_bypass_reinforce_with_rollout_rs(agg, estimator, threshold):
    logp, old, adv, mask = batch(15, B=16, T=10, scale=0.3)
    option = f"{VERL_AGG[agg]}_{estimator}"
    rcfg = RolloutCorrectionConfig(rollout_is=None, rollout_rs=option, rollout_rs_threshold=threshold, bypass_mode=True,
                                   loss_type="reinforce")  # fmt: skip
    kw = dict(estimator=estimator, agg=agg, threshold=threshold)
    lv, gv, _ = verl_bypass(rcfg, logp, old, adv, mask, "token-sum")
    lc, gc, _ = ours("klrs", logp, old, adv, mask, "token-sum", **kw)
    assert torch.allclose(lc, lv, **TOL) and torch.allclose(gc, gv, **TOL)
    # token-mean: verl divides by the kept tokens, respo by all valid tokens (a rejection weighs 0)
    lv, _, _ = verl_bypass(rcfg, logp, old, adv, mask, "token-mean")
    lc, _, _ = ours("klrs", logp, old, adv, mask, "token-mean", **kw)
    n_kept = C.kl_reject_keep(logp - old, mask, **kw).sum()
    assert torch.allclose(lc * mask.sum(), lv * n_kept, **TOL)


@pytest.mark.parametrize("level, threshold, name, kw", [
    ("sequence", 2.0, "tis", {"level": "sequence", "cap": 2.0}),
    ("token", 1.5, "tis", {"level": "token", "cap": 1.5}),
    ("sequence", "0.5_2.0", "mis", {"level": "sequence", "lo": 0.5, "hi": 2.0}),
    ("token", "0.8_1.5", "mis", {"level": "token", "lo": 0.8, "hi": 1.5}),
])  # fmt: skip
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum"])
def test_batch_normalised_weights_are_verls_rollout_is_batch_normalize(level, threshold, name, kw, mode):
    logp, old, adv, mask = batch(16, B=16, T=10, scale=0.3)
    rcfg = RolloutCorrectionConfig(rollout_is=level, rollout_is_threshold=threshold, rollout_is_batch_normalize=True,
                                   bypass_mode=True, loss_type="reinforce")  # fmt: skip
    lv, gv, mv = verl_bypass(rcfg, logp, old, adv, mask, mode)
    lc, gc, mc = ours(name, logp, old, adv, mask, mode, batch_normalize=True, **kw)
    assert torch.allclose(lc, lv, **TOL) and torch.allclose(gc, gv, **TOL)
    assert mc["corr/batch_norm_factor"].item() == pytest.approx(mv["rollout_corr/rollout_is_batch_norm_factor"], rel=1e-6)
    plain, _, _ = ours(name, logp, old, adv, mask, mode, **kw)
    assert not torch.allclose(plain, lc, rtol=1e-3)  # the normalisation changed the loss on this batch
