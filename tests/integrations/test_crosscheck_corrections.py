"""The staleness corrections against verl 0.9.1's and TRL 1.16's own functions (float64).

What is checked against what:
  tis (sequence, C = 2)     verl ``compute_policy_loss_bypass_mode`` with the ``bypass_pg_is`` preset
  tis (token)               verl bypass mode, REINFORCE, ``rollout_is="token"``
  mis (sequence / token)    verl bypass mode, REINFORCE, ``rollout_is_threshold="lo_hi"`` (zeroed weights);
                            the silenced set also against verl's rejection mask ``seq_sum_k1``
  icepop                    verl bypass mode with the ``bypass_pg_token_icepop`` preset
  decoupled                 verl ``compute_policy_loss_vanilla`` on π_θ/π_prox with verl's token IS weights
                            of π_prox/π_old (``compute_rollout_correction_weights``): truncated at 2
                            (``decoupled_token_is``) and zeroed above 5 (AReaL's cap, as a band)
  opsm                      TRL ``GRPOTrainer.get_off_policy_mask``; the loss against verl's PPO clip × mask
  chi2                      verl ``compute_offpolicy_metrics`` (``chi2_token``, ``chi2_seq``)
Neither verl 0.9.1 nor TRL 1.16 has m2po. AReaL 1.0.4's M2PO mask, decoupled loss and log-linear proximal
policy are checked against AReaL itself, in its own environment (tests/integrations/test_crosscheck_areal.py);
the m2po objective's values are hand-worked (tests/core/test_corrections.py), as AReaL applies the mask to
decoupled PPO. TRL's ``*_truncate``/``*_mask`` weights are computed inline in its generation step, not by a
function that can be called on tensors.
"""

from types import SimpleNamespace

import pytest
import torch

from respo import AGG_MODES
from respo.core import corrections as C
from respo.core.aggregation import agg_loss

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
rc = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper")
from test_crosscheck_verl_trl import actor_config, batch as verl_batch  # noqa: E402
from verl.trainer.config.algorithm import RolloutCorrectionConfig  # noqa: E402

f64 = torch.float64
TOL = dict(rtol=1e-6, atol=1e-9)  # verl adds 1e-8 to its token and sequence counts


def batch(seed, scale=0.5):
    """16 rows of 10 tokens, ragged mask, advantages of both signs (the verl cross-checks' batch)."""
    return verl_batch(seed, B=16, T=10, scale=scale)


def verl_bypass(rcfg, logp, old, adv, mask, mode="token-mean"):
    """verl's bypass-mode loss (old_log_prob = the behaviour policy), its gradient and metrics."""
    x = logp.clone().requires_grad_(True)
    config = SimpleNamespace(policy_loss={"rollout_correction": rcfg}, global_batch_info={})
    loss, metrics = core_algos.compute_policy_loss_bypass_mode(
        old, x, adv.unsqueeze(-1).expand_as(logp), mask, loss_agg_mode=mode, config=config
    )
    loss.backward()
    return loss.detach(), x.grad, metrics


def ours(fn, logp, old, adv, mask, mode="token-mean", **kw):
    x = logp.clone().requires_grad_(True)
    corr = fn(x, old, adv.unsqueeze(-1), mask, **kw)
    loss = agg_loss(corr.values, mask, mode)
    loss.backward()
    diag = C.correction_diagnostics(corr, C.token_log_weight(x, old, mask), adv.unsqueeze(-1), adv, mask)
    return loss.detach(), x.grad, diag, corr


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("seed", [0, 1])
def test_tis_sequence_default_is_verls_bypass_pg_is(mode, seed):
    logp, old, adv, mask = batch(seed, scale=0.3)  # sequence weights on both sides of the cap
    lv, gv, mv = verl_bypass(RolloutCorrectionConfig.bypass_pg_is(), logp, old, adv, mask, mode)
    lc, gc, dc, _ = ours(C.tis, logp, old, adv, mask, mode)  # defaults: sequence, cap 2 (= the preset's)
    assert 0 < dc["corr/trunc_frac"].item() < 1
    assert torch.allclose(lc, lv, **TOL) and torch.allclose(gc, gv, **TOL)
    assert dc["corr/trunc_frac"].item() == pytest.approx(mv["rollout_corr/rollout_is_ratio_fraction_high"], rel=1e-12)
    chi = C.chi2(C.token_log_weight(logp, old, mask), mask)
    # verl's masked_mean adds 1e-8 to the token count: E[w²] differs by ~E[w²]·1e-8/N
    assert chi["chi2_token"].item() == pytest.approx(mv["rollout_corr/chi2_token"], abs=1e-9)
    assert chi["chi2_seq"].item() == pytest.approx(mv["rollout_corr/chi2_seq"], rel=1e-9)


@pytest.mark.parametrize("seed", [0, 1])
def test_tis_token_matches_verl(seed):
    logp, old, adv, mask = batch(seed, scale=0.8)
    rcfg = RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold=1.5, bypass_mode=True, loss_type="reinforce")
    lv, gv, mv = verl_bypass(rcfg, logp, old, adv, mask)
    lc, gc, dc, _ = ours(C.tis, logp, old, adv, mask, level="token", cap=1.5)
    assert torch.allclose(lc, lv, **TOL) and torch.allclose(gc, gv, **TOL)
    # of tokens; verl's masked_mean adds 1e-8 to the count
    assert dc["corr/trunc_frac"].item() == pytest.approx(mv["rollout_corr/rollout_is_ratio_fraction_high"], rel=1e-6)


@pytest.mark.parametrize("level, lo, hi, scale", [("sequence", 0.5, 2.0, 0.3), ("sequence", 1e-30, 3.0, 0.3), ("token", 0.8, 1.5, 0.4)])
def test_mis_matches_verls_zeroed_weights(level, lo, hi, scale):
    # verl's "lo_hi" threshold zeroes weights outside [lo, hi] and keeps the rest at their value. Its
    # lower bound must be > 0, so TRL's default band [0, 3] is checked as [1e-30, 3] (weights are ≥ e^−20).
    logp, old, adv, mask = batch(2, scale=scale)
    rcfg = RolloutCorrectionConfig(rollout_is=level, rollout_is_threshold=f"{lo}_{hi}", bypass_mode=True, loss_type="reinforce")
    lv, gv, _ = verl_bypass(rcfg, logp, old, adv, mask)
    lc, gc, dc, _ = ours(C.mis, logp, old, adv, mask, level=level, lo=lo, hi=hi)
    assert 0 < dc["corr/mask_frac"].item() < 1
    assert torch.allclose(lc, lv, **TOL) and torch.allclose(gc, gv, **TOL)


def test_mis_silences_the_sequences_verls_rejection_sampling_rejects():
    # verl's seq_sum_k1 rejection with "0.5_2.0" (its Seq-MIS preset) keeps −Σ log w ∈ [ln .5, ln 2],
    # i.e. W ∈ [0.5, 2]: the same rows our sequence MIS on [0.5, 2] keeps. (verl then drops the rejected
    # tokens from the normaliser; respo keeps them at weight 0, as TRL's masks and verl's IS bands do.)
    logp, old, adv, mask = batch(3, scale=0.15)
    kept, _ = rc.compute_rollout_rejection_mask(logp - old, mask, rollout_rs="seq_sum_k1", rollout_rs_threshold="0.5_2.0")
    _, _, _, corr = ours(C.mis, logp, old, adv, mask, level="sequence", lo=0.5, hi=2.0)
    assert corr.silenced.any()
    assert torch.equal((mask > 0) & ~corr.silenced, kept > 0)


def test_icepop_default_is_verls_bypass_pg_token_icepop():
    logp, old, adv, mask = batch(4, scale=0.9)
    lv, gv, mv = verl_bypass(RolloutCorrectionConfig.bypass_pg_token_icepop(), logp, old, adv, mask)
    lc, gc, dc, _ = ours(C.icepop, logp, old, adv, mask)
    assert 0 < dc["corr/mask_frac"].item() < 1
    assert torch.allclose(lc, lv, **TOL) and torch.allclose(gc, gv, **TOL)
    assert dc["corr/mask_frac"].item() == pytest.approx(mv["rollout_corr/rollout_is_oob_ratio"], rel=1e-6)


@pytest.mark.parametrize("cap_mode, cap, threshold", [("truncate", 2.0, 2.0), ("mask", 5.0, "1e-30_5.0")])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_decoupled_matches_verls_ppo_clip_with_token_is_weights(cap_mode, cap, threshold, mode):
    # verl's decoupled mode: PPO clip (dual clip c = 3) of π_θ/π_old' where old' = π_prox, times the
    # token IS weight π_prox/π_behaviour from compute_rollout_correction_weights.
    logp, old, adv, mask = batch(5, scale=0.9)
    prox = logp + 0.2 * torch.randn(logp.shape, dtype=f64, generator=torch.Generator().manual_seed(7))
    weights, _ = rc.compute_rollout_correction_weights(prox - old, mask, rollout_is="token", rollout_is_threshold=threshold)
    x = logp.clone().requires_grad_(True)
    config = actor_config(clip_ratio_c=3.0)
    lv, mv = core_algos.compute_policy_loss_vanilla(prox, x, adv.unsqueeze(-1).expand_as(logp), mask, loss_agg_mode=mode,
                                                    config=config, rollout_is_weights=weights)  # fmt: skip
    lv.backward()
    lc, gc, dc, _ = ours(C.decoupled, logp, old, adv, mask, mode, prox_logp=prox, cap=cap, cap_mode=cap_mode, clip_ratio_c=3.0)
    assert 0 < dc[f"corr/{'trunc' if cap_mode == 'truncate' else 'mask'}_frac"].item() < 1
    assert torch.allclose(lc, lv.detach(), **TOL) and torch.allclose(gc, x.grad, **TOL)
    assert dc["clipfrac"].item() == pytest.approx(mv["actor/pg_clipfrac"], rel=1e-6)  # verl adds 1e-8 to the count


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_opsm_mask_is_trls_get_off_policy_mask(seed):
    grpo_trainer = pytest.importorskip("trl.trainer.grpo_trainer")
    logp, old, adv, mask = batch(seed, scale=0.6)
    delta = 0.15
    theirs = grpo_trainer.GRPOTrainer.get_off_policy_mask(adv.unsqueeze(-1), logp, old, mask, delta).squeeze(-1)
    keep = C.opsm_keep(C.token_log_weight(logp, old, mask), adv, mask, delta)
    assert (~keep).any() and keep.any()
    assert torch.equal(keep.to(f64), theirs)


@pytest.mark.parametrize("c", [3.0, None])
def test_opsm_loss_is_the_ppo_clip_times_the_mask(c):
    # verl's PPO clip with the OPSM keep mask as per-token weights; c = None (TRL's default loss, no dual
    # clip) is verl's clip with a dual-clip bound no ratio reaches (1e9 > e^20).
    grpo_trainer = pytest.importorskip("trl.trainer.grpo_trainer")
    logp, old, adv, mask = batch(8, scale=0.6)
    keep = grpo_trainer.GRPOTrainer.get_off_policy_mask(adv.unsqueeze(-1), logp, old, mask, 0.15)  # (B, 1)
    x = logp.clone().requires_grad_(True)
    config = actor_config(clip_ratio_c=3.0 if c else 1e9)
    lv, _ = core_algos.compute_policy_loss_vanilla(old, x, adv.unsqueeze(-1).expand_as(logp), mask, loss_agg_mode="token-mean",
                                                   config=config, rollout_is_weights=keep.expand_as(logp))  # fmt: skip
    lv.backward()
    y = logp.clone().requires_grad_(True)
    lc = agg_loss(C.opsm(y, old, adv.unsqueeze(-1), adv, mask, delta=0.15, clip_ratio_c=c).values, mask, "token-mean")
    lc.backward()
    assert torch.allclose(lc, lv.detach(), **TOL) and torch.allclose(y.grad, x.grad, **TOL)


def test_chi2_matches_verls_offpolicy_metrics():
    logp, old, _, mask = batch(9, scale=0.3)
    theirs = rc.compute_offpolicy_metrics(old_log_prob=logp, rollout_log_prob=old, response_mask=mask)
    mine = C.chi2(C.token_log_weight(logp, old, mask), mask)
    assert mine["chi2_token"].item() == pytest.approx(theirs["chi2_token"], abs=1e-9)  # verl: count + 1e-8
    assert mine["chi2_seq"].item() == pytest.approx(theirs["chi2_seq"], rel=1e-9)
