"""Cross-checks of the core against the installed verl 0.9.1 and TRL functions (float64, 1e-6).

verl's and TRL's own functions are called on the same random inputs; values and gradients must agree.
"""

import pytest
import torch

from respo import AGG_MODES, agg_loss, policy_loss, sequence_log_ratio, vespo_phi

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
from verl.workers.config import FSDPActorConfig  # noqa: E402

f64 = torch.float64
TOL = dict(rtol=1e-6, atol=1e-9)


def actor_config(**kw):
    return FSDPActorConfig(
        strategy="fsdp", rollout_n=4, ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2, use_dynamic_bsz=False, **kw
    )


def batch(seed, B=24, T=12, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=f64) * 3
    old = logp + scale * torch.randn(B, T, generator=g, dtype=f64)
    mask = (torch.rand(B, T, generator=g) > 0.3).to(f64)
    mask[:, 0] = 1
    adv = torch.randn(B, generator=g, dtype=f64)
    return logp, old, adv, mask


def run_verl(name, logp, old, adv, mask, config, mode, rollout_is_weights=None):
    x = logp.clone().requires_grad_(True)
    fn = core_algos.get_policy_loss_fn(name)
    adv_tok = adv.unsqueeze(-1).expand_as(logp)
    loss, metrics = fn(old, x, adv_tok, mask, loss_agg_mode=mode, config=config, rollout_is_weights=rollout_is_weights)
    loss.backward()
    return loss.detach(), x.grad, metrics


def run_core(name, logp, old, adv, mask, mode, **kw):
    x = logp.clone().requires_grad_(True)
    loss, metrics = policy_loss(name, x, old, adv, mask, loss_agg_mode=mode, **kw)
    loss.backward()
    return loss.detach(), x.grad, metrics


CASES = [
    # (verl name, respo name, verl config overrides, respo hparams, aggregation modes, drift)
    ("vanilla", "grpo", {}, {}, AGG_MODES, 0.3),
    ("gspo", "gspo", dict(clip_ratio_low=3e-4, clip_ratio_high=4e-4), {}, AGG_MODES, 3e-3),
    ("cispo", "cispo", {}, {}, AGG_MODES, 0.3),
    ("sapo", "sapo", {}, {}, ["seq-mean-token-mean"], 0.3),  # verl's SAPO always uses seq-mean-token-mean
    ("geo_mean", "gmpo", dict(clip_ratio=0.4, clip_ratio_low=0.4, clip_ratio_high=0.4), {}, ["seq-mean-token-mean"], 0.3),
]


@pytest.mark.parametrize("verl_name, name, cfg, hp, modes, drift", CASES, ids=[c[1] for c in CASES])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_verl(verl_name, name, cfg, hp, modes, drift, seed):
    logp, old, adv, mask = batch(seed, scale=drift)
    config = actor_config(**cfg)
    for mode in modes:
        lv, gv, mv = run_verl(verl_name, logp, old, adv, mask, config, mode)
        lc, gc, mc = run_core(name, logp, old, adv, mask, mode, **hp)
        assert torch.allclose(lc, lv, **TOL), (mode, lc.item(), lv.item())
        assert torch.allclose(gc, gv, **TOL), mode
        # the k1 KL verl reports is the masked token mean of −(logp − old_logp)
        assert mc["approx_kl"].item() == pytest.approx(mv["actor/ppo_kl"], rel=1e-6, abs=1e-9)
        if verl_name in ("vanilla", "gspo"):
            assert mc["clipfrac"].item() == pytest.approx(mv["actor/pg_clipfrac"], rel=1e-6)  # verl adds 1e-8 to the count


@pytest.mark.parametrize("verl_name, name, cfg", [("vanilla", "grpo", {}), ("cispo", "cispo", {}), ("gspo", "gspo", dict(clip_ratio_low=3e-4, clip_ratio_high=4e-4))])
def test_rollout_weights_match_verl(verl_name, name, cfg):
    logp, old, adv, mask = batch(7, scale=0.2 if name != "gspo" else 3e-3)
    rho = torch.exp(0.1 * torch.randn(logp.shape, dtype=f64, generator=torch.Generator().manual_seed(3)))
    lv, gv, _ = run_verl(verl_name, logp, old, adv, mask, actor_config(**cfg), "token-mean", rollout_is_weights=rho)
    lc, gc, _ = run_core(name, logp, old, adv, mask, "token-mean", rollout_log_ratio=torch.log(rho))
    assert torch.allclose(lc, lv, **TOL) and torch.allclose(gc, gv, **TOL)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_agg_loss_matches_verl(mode):
    logp, _, _, mask = batch(3)
    v = torch.randn_like(logp)
    ours = agg_loss(v, mask, mode)
    theirs = core_algos.agg_loss(v, mask, mode)
    assert torch.allclose(ours, theirs, rtol=1e-6, atol=1e-12)


def test_vespo_weights_match_trl():
    grpo_trainer = pytest.importorskip("trl.trainer.grpo_trainer")
    logp, old, adv, mask = batch(5, scale=0.5)
    log_ratio = logp - old
    theirs = grpo_trainer.GRPOTrainer.get_gamma_weights(
        advantages=adv.unsqueeze(-1), log_ratio_per_token=log_ratio, mask=mask, importance_sampling_ratio=None
    ).squeeze(-1)
    log_w = sequence_log_ratio(logp, old, mask)
    assert log_w.min() > -18.4  # TRL clamps log W below at log(1e-8); stay inside both clamps
    ours = vespo_phi(log_w, adv)
    assert torch.allclose(ours, theirs, rtol=1e-6, atol=1e-12)
    # and with TRL's token-level vLLM importance-sampling ratio, folded in log space like our rollout_log_ratio
    is_ratio = torch.exp(0.05 * torch.randn(logp.shape, dtype=f64, generator=torch.Generator().manual_seed(9))) * mask + (1 - mask)
    theirs = grpo_trainer.GRPOTrainer.get_gamma_weights(
        advantages=adv.unsqueeze(-1), log_ratio_per_token=log_ratio, mask=mask, importance_sampling_ratio=is_ratio
    ).squeeze(-1)
    ours = vespo_phi(sequence_log_ratio(logp, old, mask, rollout_log_ratio=torch.log(is_ratio)), adv)
    assert torch.allclose(ours, theirs, rtol=1e-6, atol=1e-12)


def test_vespo_loss_matches_trl_form():
    # TRL: per_token_loss = −φ·Â·logp, summed over valid tokens / num_items_in_batch (the token count).
    logp, old, adv, mask = batch(6, scale=0.5)
    phi = vespo_phi(sequence_log_ratio(logp, old, mask), adv)
    trl_loss = (-(phi * adv).unsqueeze(-1) * logp * mask).sum() / mask.sum()
    ours, _ = policy_loss("vespo", logp, old, adv, mask)
    assert torch.allclose(ours, trl_loss, rtol=1e-12)
