"""verl 0.9.1's other policy-loss modes against the core, called through verl's own registry (float64).

What is checked against what (losses and gradients within rtol 1e-6, atol 1e-9: verl adds 1e-8 to its token and
sequence counts; selections must be equal exactly), each in all five aggregation modes:
  gpg        verl ``get_policy_loss_fn("gpg")``, with and without rollout weights
  dro        verl ``get_policy_loss_fn("dro")`` (``policy_loss.dro_beta``), with and without rollout weights
  kl_cov     verl ``get_policy_loss_fn("kl_cov")`` (``kl_cov_ratio``, ``ppo_kl_coef``): the penalised tokens
             are the same set
  clip_cov   verl ``get_policy_loss_fn("clip_cov")`` (``clip_cov_ratio/lb/ub``): the detached tokens are the
             same set, both when every candidate is taken (no draw) and when verl draws k of them (the same
             permutation from the same seed of torch's global generator), and its ``pg_clipfrac``
  bypass_mode  verl's ``bypass_mode`` loss with ``loss_type="ppo_clip"`` (its default) is respo's ``grpo`` with
             old_logp = the sampler's log-probs; with ``rollout_rs`` it is ``klrs`` on ``grpo`` (token-sum). Its
             ``loss_type="reinforce"`` is ``tis``/``mis``/``icepop``/``klrs`` (tests/integrations/
             test_crosscheck_corrections.py and test_crosscheck_trust_rules.py), so respo registers nothing for it.
  geo_mask, product_mask   SkyRL's sequence masks keep exactly the rows verl's ``seq_mean_k1`` / ``seq_sum_k1``
             rejection keeps with the bounds (1/hi, 1/lo) (the same set written in k1 = −log w)

How the selections are made deterministic (the inputs are continuous random float64 values, so no two
covariances are equal):
  kl_cov     the k tokens of largest covariance; the test asserts the k-th and (k+1)-th covariances differ, so
             verl's ``topk`` and respo's stable sort (which would break a tie by position) pick the same set
  clip_cov   the band lb < cov < ub is strict in both; the test asserts no covariance lies within 1e-6 of lb or
             ub, so verl's 1e-8 in its means cannot move a token across the band's edge; the random draw is
             ``torch.randperm`` over the candidates in row-major order in both, after ``torch.manual_seed``
"""

import pytest
import torch

from respo import AGG_MODES, policy_loss
from respo.core import rules

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
rc = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper")
from test_crosscheck_verl_trl import actor_config, batch, run_verl  # noqa: E402
from verl.trainer.config.algorithm import RolloutCorrectionConfig  # noqa: E402
from verl.workers.config import PolicyLossConfig  # noqa: E402

f64 = torch.float64
TOL = dict(rtol=1e-6, atol=1e-9)


def ours(name, logp, old, adv, mask, mode, **kw):
    x = logp.clone().requires_grad_(True)
    loss, metrics = policy_loss(name, x, old, adv, mask, loss_agg_mode=mode, **kw)
    loss.backward()
    return loss.detach(), x.grad, metrics


def config(loss_mode, **policy_loss_kw):
    return actor_config(policy_loss=PolicyLossConfig(loss_mode=loss_mode, **policy_loss_kw))


def rollout_weights(shape, seed=3):
    return torch.exp(0.2 * torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=f64))


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("weighted", [False, True])
def test_gpg_is_verls_gpg(mode, weighted):
    logp, old, adv, mask = batch(20, B=16, T=10, scale=0.3)
    w = rollout_weights(logp.shape) if weighted else None
    lv, gv, _ = run_verl("gpg", logp, old, adv, mask, config("gpg"), mode, rollout_is_weights=w)
    lc, gc, _ = ours("gpg", logp, old, adv, mask, mode, rollout_log_ratio=None if w is None else torch.log(w))
    assert torch.allclose(lc, lv, **TOL) and torch.allclose(gc, gv, **TOL)


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("beta, weighted", [(0.5, False), (2.0, True)])
def test_dro_is_verls_dro(mode, beta, weighted):
    logp, old, adv, mask = batch(21, B=16, T=10, scale=0.4)
    w = rollout_weights(logp.shape) if weighted else None
    lv, gv, mv = run_verl("dro", logp, old, adv, mask, config("dro", dro_beta=beta), mode, rollout_is_weights=w)
    lc, gc, mc = ours("dro", logp, old, adv, mask, mode, beta=beta, rollout_log_ratio=None if w is None else torch.log(w))
    assert torch.allclose(lc, lv, **TOL) and torch.allclose(gc, gv, **TOL)
    if w is None:  # respo's approx_kl folds ρ into log W, verl's ppo_kl is of π_θ/π_old alone
        assert mc["approx_kl"].item() == pytest.approx(mv["actor/ppo_kl"], rel=1e-6)
    assert 0 < mc["penalty/grad_share"].item() < 1


def _kth_gap(logp, adv, mask, k):
    cov = rules.covariance(logp, adv.unsqueeze(-1), mask)[mask > 0].sort(descending=True).values
    return (cov[k - 1] - cov[k]).item()


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("ratio, coef", [(2e-4, 0.1), (0.05, 1.0)])  # verl's defaults (k = 1) and k = 5
def test_kl_cov_is_verls_kl_cov(mode, ratio, coef):
    logp, old, adv, mask = batch(22, B=16, T=10, scale=0.3)
    n = int(mask.sum().item())
    k = rules.select_count(ratio, n)
    assert _kth_gap(logp, adv, mask, k) > 1e-9  # no tie at the k-th covariance: the top-k set is unique
    cfg = config("kl_cov", kl_cov_ratio=ratio, ppo_kl_coef=coef)
    lv, gv, _ = run_verl("kl_cov", logp, old, adv, mask, cfg, mode)
    lc, gc, mc = ours("kl_cov", logp, old, adv, mask, mode, kl_cov_ratio=ratio, ppo_kl_coef=coef)
    assert torch.allclose(lc, lv, **TOL) and torch.allclose(gc, gv, **TOL)
    assert mc["penalty/token_frac"].item() == pytest.approx(k / n)
    # the same set: verl's gradient differs from the unpenalised −Â·r·∇logp exactly on the k tokens respo selects
    _, g0, _ = ours("kl_cov", logp, old, adv, mask, mode, kl_cov_ratio=ratio, ppo_kl_coef=0.0)
    moved = (gv - g0).abs() > 1e-7  # the penalty moves a token's gradient by κ/(its count), not verl's 1e-8 offsets
    assert int(moved.sum()) == k and torch.equal(moved, rules.kl_cov_select(logp, adv.unsqueeze(-1), mask, ratio=ratio))


def test_kl_cov_with_rollout_weights_is_verls():
    logp, old, adv, mask = batch(23, B=16, T=10, scale=0.3)
    w = rollout_weights(logp.shape, seed=4)
    lv, gv, _ = run_verl("kl_cov", logp, old, adv, mask, config("kl_cov", kl_cov_ratio=0.05, ppo_kl_coef=0.5),
                         "token-mean", rollout_is_weights=w)  # fmt: skip
    lc, gc, _ = ours("kl_cov", logp, old, adv, mask, "token-mean", kl_cov_ratio=0.05, ppo_kl_coef=0.5,
                     rollout_log_ratio=torch.log(w))  # fmt: skip
    assert torch.allclose(lc, lv, **TOL) and torch.allclose(gc, gv, **TOL)


def _clip_cov_batch(seed):
    # advantages of scale 2 so that some covariances reach the band (1, 5)
    logp, old, adv, mask = batch(seed, B=16, T=10, scale=0.3)
    return logp, old, 2 * adv, mask


def _candidates(logp, old, adv, mask, lb, ub):
    cov = rules.covariance(logp, adv.unsqueeze(-1), mask)
    r = torch.exp(logp - old)
    a = adv.unsqueeze(-1)
    clipped = (-a * r.clamp(0.8, 1.2)) > (-a * r)
    valid = mask > 0
    edge = torch.minimum((cov - lb).abs(), (cov - ub).abs())[valid].min().item()
    return valid & ~clipped & (cov > lb) & (cov < ub), edge


@pytest.mark.parametrize("mode", AGG_MODES)
def test_clip_cov_takes_every_candidate_like_verl(mode):
    # clip_cov_ratio 0.5: k exceeds the candidates, so both detach every candidate (no random draw matters)
    logp, old, adv, mask = _clip_cov_batch(24)
    cand, edge = _candidates(logp, old, adv, mask, 1.0, 5.0)
    assert edge > 1e-6 and 0 < int(cand.sum()) < rules.select_count(0.5, int(mask.sum().item()))
    cfg = config("clip_cov", clip_cov_ratio=0.5)
    lv, gv, mv = run_verl("clip_cov", logp, old, adv, mask, cfg, mode)
    lc, gc, mc = ours("clip_cov", logp, old, adv, mask, mode, clip_cov_ratio=0.5)
    assert torch.allclose(lc, lv, **TOL) and torch.allclose(gc, gv, **TOL)
    assert mc["clipfrac"].item() == pytest.approx(mv["actor/pg_clipfrac"], rel=1e-6)
    assert mc["corr/masked_tokens"].item() == pytest.approx(cand.sum().item() / mask.sum().item())
    assert gc[cand].abs().max().item() == 0.0 and gv[cand].abs().max().item() == 0.0  # detached in both


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("seed", [0, 1])
def test_clip_cov_draws_the_same_tokens_as_verl_from_the_same_seed(mode, seed):
    logp, old, adv, mask = _clip_cov_batch(25)
    cand, edge = _candidates(logp, old, adv, mask, 1.0, 5.0)
    ratio = 0.03
    k = rules.select_count(ratio, int(mask.sum().item()))
    assert edge > 1e-6 and int(cand.sum()) > k >= 2  # a real draw of k among more candidates
    cfg = config("clip_cov", clip_cov_ratio=ratio)
    torch.manual_seed(seed)
    lv, gv, _ = run_verl("clip_cov", logp, old, adv, mask, cfg, mode)
    torch.manual_seed(seed)
    lc, gc, mc = ours("clip_cov", logp, old, adv, mask, mode, clip_cov_ratio=ratio)
    assert torch.allclose(lc, lv, **TOL) and torch.allclose(gc, gv, **TOL)
    assert mc["corr/masked_tokens"].item() == pytest.approx(k / mask.sum().item())
    torch.manual_seed(seed + 100)
    other, _, _ = ours("clip_cov", logp, old, adv, mask, mode, clip_cov_ratio=ratio)
    assert not torch.allclose(other, lc, rtol=1e-9)  # another seed draws other tokens: the draw matters here


def test_clip_cov_with_rollout_weights_is_verls():
    logp, old, adv, mask = _clip_cov_batch(26)
    w = rollout_weights(logp.shape, seed=5)
    torch.manual_seed(7)
    lv, gv, _ = run_verl("clip_cov", logp, old, adv, mask, config("clip_cov", clip_cov_ratio=0.03), "token-mean",
                         rollout_is_weights=w)  # fmt: skip
    torch.manual_seed(7)
    lc, gc, _ = ours("clip_cov", logp, old, adv, mask, "token-mean", clip_cov_ratio=0.03, rollout_log_ratio=torch.log(w))
    assert torch.allclose(lc, lv, **TOL) and torch.allclose(gc, gv, **TOL)


def verl_bypass_ppo_clip(rcfg, logp, sampler, adv, mask, mode):
    """verl's registered ``bypass_mode`` loss (old_log_prob = the sampler's log-probs) with a real ActorConfig."""
    cfg = config("bypass_mode", rollout_correction=rcfg)
    return run_verl("bypass_mode", logp, sampler, adv, mask, cfg, mode)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_verls_bypass_ppo_clip_is_grpo_on_the_samplers_log_probs(mode):
    # bypass mode: old_log_prob is the sampler's; loss_type="ppo_clip" (the default) is verl's vanilla PPO on it
    logp, sampler, adv, mask = batch(27, B=16, T=10, scale=0.3)
    rcfg = RolloutCorrectionConfig(rollout_is=None, rollout_rs=None, bypass_mode=True, loss_type="ppo_clip")
    lv, gv, _ = verl_bypass_ppo_clip(rcfg, logp, sampler, adv, mask, mode)
    lc, gc, mc = ours("grpo", logp, sampler, adv, mask, mode)
    assert mc["clipfrac"].item() > 0  # the clip acts on this batch
    assert torch.allclose(lc, lv, **TOL) and torch.allclose(gc, gv, **TOL)


def test_verls_bypass_ppo_clip_with_rejection_is_klrs_on_grpo():
    logp, sampler, adv, mask = batch(28, B=16, T=10, scale=0.3)
    rcfg = RolloutCorrectionConfig(rollout_is=None, rollout_rs="seq_mean_k3", rollout_rs_threshold=0.04,
                                   bypass_mode=True, loss_type="ppo_clip")  # fmt: skip
    lv, gv, _ = verl_bypass_ppo_clip(rcfg, logp, sampler, adv, mask, "token-sum")
    lc, gc, mc = ours("klrs", logp, sampler, adv, mask, "token-sum", estimator="k3", agg="mean", threshold=0.04,
                      base="grpo")  # fmt: skip
    assert 0 < mc["rs/masked_seqs"].item() < 1
    assert torch.allclose(lc, lv, **TOL) and torch.allclose(gc, gv, **TOL)


@pytest.mark.parametrize("name, metric, option, lo, hi, scale", [
    ("geo_mask", "geometric", "seq_mean_k1", 0.9, 1.05, 0.3),
    ("product_mask", "product", "seq_sum_k1", 0.5, 2.0, 0.15),
])  # fmt: skip
def test_skyrl_sequence_masks_keep_the_rows_verls_k1_rejection_keeps(name, metric, option, lo, hi, scale):
    # SkyRL keeps lo <= W <= hi; verl's k1 keeps log(lower) <= −log W <= log(upper): lower = 1/hi, upper = 1/lo
    logp, old, adv, mask = batch(29, B=32, T=10, scale=scale)
    log_w = (logp - old) * mask
    kept_v, _ = rc.compute_rollout_rejection_mask(logp - old, mask, rollout_rs=option,
                                                  rollout_rs_threshold=f"{1 / hi}_{1 / lo}")  # fmt: skip
    keep = rules.sequence_ratio_keep(log_w, mask, metric=metric, lo=lo, hi=hi)
    assert 0 < keep.sum() < mask.sum()
    assert torch.equal(keep, kept_v > 0)
    _, _, m = ours(name, logp, old, adv, mask, "token-mean", lo=lo, hi=hi)
    assert m["rs/masked_tokens"].item() == pytest.approx(1 - keep.sum().item() / mask.sum().item())
