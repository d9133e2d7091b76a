"""respo inside verl: registered policy losses against the core, rollout-correction folding, the
launch recipe composed with verl's real Hydra config, the worker-registering entry point.

No mocks: verl 0.9.1's own registry, ``agg_loss``, ``ActorConfig`` (built by Hydra + verl's
``omega_conf_to_dataclass`` exactly as verl's workers build it) and ``validate_config``.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl")

import respo  # noqa: E402
import respo.integrations.verl as rv  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, get_policy_loss_fn  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass, validate_config  # noqa: E402

from respo.integrations.verl.main_ppo import ENV_VAR, MODULE, install_worker_registration  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "examples" / "verl" / "run_paper.sh"
PREP = ROOT / "examples" / "verl" / "prepare_data.sh"
BASE_OVERRIDES = [
    "actor_rollout_ref.model.path=/nonexistent/model",
    "data.train_files=/nonexistent/train.parquet",
    "data.val_files=/nonexistent/test.parquet",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.n=8",
]


def _verl_config_dir() -> str:
    import verl.trainer.main_ppo as verl_main_ppo

    return os.path.join(os.path.dirname(verl_main_ppo.__file__), "config")


def compose_verl(overrides: list[str]):
    """verl's ppo_trainer config with ``overrides``, resolved (as verl's TaskRunner resolves it)."""
    with initialize_config_dir(config_dir=_verl_config_dir(), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    OmegaConf.resolve(cfg)
    return cfg


def actor_config(*extra: str):
    """A real ActorConfig, built the way verl's engine workers build it."""
    return omega_conf_to_dataclass(compose_verl(BASE_OVERRIDES + list(extra)).actor_rollout_ref.actor)


def respo_actor(loss_mode: str, *fields: str):
    """An ActorConfig in ``loss_mode`` whose policy_loss is respo's RespoPolicyLossConfig (through Hydra), with
    its extra ``fields`` set (``"name=value"`` overrides, e.g. ``"m2po_tau=0.3"``)."""
    return actor_config(
        f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}",
        "actor_rollout_ref.actor.policy_loss._target_=respo.integrations.verl.RespoPolicyLossConfig",
        *(f"+actor_rollout_ref.actor.policy_loss.{f}" for f in fields),
    )


@pytest.fixture(scope="module")
def default_actor():
    return actor_config("actor_rollout_ref.actor.policy_loss.loss_mode=respo")


@pytest.fixture(scope="module")
def custom_actor():
    # respo's PolicyLossConfig subclass through Hydra, with non-default kernels.
    return respo_actor(
        "respo",
        "respo_pos=[2.0,0.25,4.0]",
        "respo_neg=[0.5,0.75,1.0]",
        "reshaped_pos='vespo(1,1)'",  # quoted: Hydra would parse a call
        "reshaped_neg='truncated(2)'",
    )


def batch(seed: int = 0, B: int = 6, T: int = 7):
    """float64 inputs: ragged mask, per-row constant advantages of both signs, spread log W."""
    g = torch.Generator().manual_seed(seed)
    old = -3 * torch.rand(B, T, generator=g, dtype=torch.float64)
    logp = (old + 0.6 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_()
    lengths = torch.tensor([T, 3, 5, 1, T, 4])[:B]
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (B, T) bool, as verl passes it
    adv_seq = torch.tensor([1.5, -0.5, 0.7, -1.2, 0.0, 2.0], dtype=torch.float64)[:B]
    adv = adv_seq[:, None].expand(B, T).clone()  # verl's (B, T) token advantages
    return logp, old, adv, adv_seq, mask


def grad_of(loss: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(loss, logp, retain_graph=True)
    return g


# ------------------------------------------------------------------------------------------------
# Registration
# ------------------------------------------------------------------------------------------------


def test_registers_objectives_verl_lacks_and_keeps_verls_own():
    assert rv.REGISTERED == {name: name for name in rv.OBJECTIVES + rv.CORRECTIONS}  # verl 0.9.1 has none of our names
    for name in rv.OBJECTIVES:
        fn = get_policy_loss_fn(name)
        assert fn.__respo_objective__ == name and fn.func is rv.reshaped_policy_loss
    assert get_policy_loss_fn("m2po").func is rv.m2po_policy_loss
    # verl's own losses are untouched.
    assert get_policy_loss_fn("vanilla") is core_algos.compute_policy_loss_vanilla
    assert get_policy_loss_fn("gspo") is core_algos.compute_policy_loss_gspo
    assert get_policy_loss_fn("cispo") is core_algos.compute_policy_loss_cispo


def test_name_collision_registers_respo_prefix_and_never_overrides():
    sentinel = core_algos.compute_policy_loss_vanilla
    saved = POLICY_LOSS_REGISTRY.pop("topr")
    POLICY_LOSS_REGISTRY["topr"] = sentinel  # pretend a future verl ships its own "topr"
    try:
        registered = rv.register()
        assert registered["topr"] == "respo_topr"
        assert POLICY_LOSS_REGISTRY["topr"] is sentinel
        assert POLICY_LOSS_REGISTRY["respo_topr"].__respo_objective__ == "topr"
        assert registered["respo"] == "respo"  # re-registering ours keeps its name (idempotent)
    finally:
        POLICY_LOSS_REGISTRY["topr"] = saved
        POLICY_LOSS_REGISTRY.pop("respo_topr", None)
        rv.register()
    assert rv.REGISTERED["topr"] == "topr"


# ------------------------------------------------------------------------------------------------
# Value and gradient against the core
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("objective", rv.OBJECTIVES)
@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-sum"]
)
def test_verl_loss_equals_core_value_and_gradient(default_actor, objective, mode):
    logp, old, adv, adv_seq, mask = batch()
    loss, metrics = get_policy_loss_fn(objective)(
        old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask, loss_agg_mode=mode, config=default_actor
    )
    core, core_metrics = respo.policy_loss(objective, logp, old, adv_seq, mask.double(), loss_agg_mode=mode)
    assert torch.allclose(loss, core, rtol=1e-12, atol=1e-12), (loss.item(), core.item())
    assert torch.allclose(grad_of(loss, logp), grad_of(core, logp), rtol=1e-12, atol=1e-12)
    for key in ("frac_pos_low_w", "coef_mean", "log_w/p10", "ess_w", "frac_starved"):
        assert metrics[f"respo/{key}"] == pytest.approx(core_metrics[key].item(), rel=1e-12, abs=1e-12)
    assert isinstance(metrics["actor/ppo_kl"], float)
    assert metrics["actor/ppo_kl"] == pytest.approx(core_metrics["approx_kl"].item(), rel=1e-12)


def test_gradient_identity_by_hand(default_actor):
    # One positive row of 2 tokens with log W = ln 2 and one negative row of 1 token with log W = ln 4.
    # φ⁺(2) = ((1+2)/2)·e^(1−2) = 1.5/e = 0.551819...; φ⁻(4) = 2·e^(2(1−2)) = 2/e² = 0.270671...
    # token-mean over N = 3 tokens: ∂L/∂logp_it = −φ_i·Â_i/3.
    ln2 = math.log(2.0)
    old = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]], dtype=torch.float64)
    logp = (old + torch.tensor([[0.5 * ln2, 0.5 * ln2], [2 * ln2, 0.0]], dtype=torch.float64)).requires_grad_()
    mask = torch.tensor([[True, True], [True, False]])
    adv = torch.tensor([[1.0, 1.0], [-2.0, -2.0]], dtype=torch.float64)
    loss, _ = get_policy_loss_fn("respo")(old, logp, adv, mask, "token-mean", default_actor, None)
    phi_pos, phi_neg = 1.5 / math.e, 2.0 / math.e**2
    expected = torch.tensor([[-phi_pos / 3, -phi_pos / 3], [2 * phi_neg / 3, 0.0]], dtype=torch.float64)
    assert torch.allclose(grad_of(loss, logp), expected, rtol=1e-12, atol=1e-15)
    assert phi_pos == pytest.approx(0.55182, abs=1e-5) and phi_neg == pytest.approx(0.27067, abs=1e-5)


def test_hyperparameters_pass_through_hydra_without_patching_verl(custom_actor):
    assert type(custom_actor.policy_loss) is rv.RespoPolicyLossConfig
    assert custom_actor.policy_loss.respo_pos == [2.0, 0.25, 4.0]
    logp, old, adv, adv_seq, mask = batch(1)
    fn = get_policy_loss_fn("respo")
    loss, _ = fn(old, logp, adv, mask, "token-mean", custom_actor, None)
    core, _ = respo.policy_loss("respo", logp, old, adv_seq, mask.double(), pos=(2.0, 0.25, 4.0), neg=(0.5, 0.75, 1.0))
    default, _ = respo.policy_loss("respo", logp, old, adv_seq, mask.double())
    assert torch.allclose(loss, core, rtol=1e-12) and not torch.allclose(loss, default, rtol=1e-3)
    loss, _ = get_policy_loss_fn("reshaped")(old, logp, adv, mask, "token-mean", custom_actor, None)
    core, _ = respo.policy_loss(
        "reshaped", logp, old, adv_seq, mask.double(), pos_kernel="vespo(1,1)", neg_kernel="truncated(2)"
    )
    assert torch.allclose(loss, core, rtol=1e-12)


def test_bad_hyperparameters_fail_at_config_time():
    with pytest.raises(ValueError, match="beta"):
        rv.RespoPolicyLossConfig(respo_pos=[2.0, 1.5, 2.0])
    with pytest.raises(ValueError, match="kernel spec"):
        rv.RespoPolicyLossConfig(reshaped_neg="gamma(1)")
    with pytest.raises(ValueError, match="rollout_is_level"):
        rv.RespoPolicyLossConfig(rollout_is_level="tokens")


def test_global_batch_info_micro_batches_sum_to_full_batch(default_actor):
    # verl sets global_batch_info per micro-batch; token-mean divides by the GLOBAL token count
    # and multiplies by dp_size (DDP averages gradients over ranks), so micro-batch losses add up.
    logp, old, adv, adv_seq, mask = batch(2)
    n_tok, n_seq = int(mask.sum()), mask.shape[0]
    fn = get_policy_loss_fn("respo")
    full, _ = respo.policy_loss("respo", logp, old, adv_seq, mask.double())
    try:
        for dp_size in (1, 2):
            default_actor.global_batch_info.clear()
            default_actor.global_batch_info.update(
                dp_size=dp_size, batch_num_tokens=n_tok, global_batch_size=n_seq, loss_scale_factor=None
            )
            parts = [
                fn(old[s], logp[s], adv[s], mask[s], "token-mean", default_actor, None)[0]
                for s in (slice(0, 2), slice(2, 6))
            ]
            assert torch.allclose(sum(parts) / dp_size, full, rtol=1e-12)
            assert torch.allclose(grad_of(sum(parts) / dp_size, logp), grad_of(full, logp), rtol=1e-12)
    finally:
        default_actor.global_batch_info.clear()


def test_metrics_have_verl_keys_and_respo_prefix(default_actor):
    logp, old, adv, _, mask = batch(3)
    _, metrics = get_policy_loss_fn("respo")(old, logp, adv, mask, "token-mean", default_actor, None)
    assert {"actor/ppo_kl", "actor/pg_clipfrac", "actor/pg_clipfrac_lower"} <= set(metrics)
    assert {"respo/pos_low_w_mass_share", "respo/frac_pos_low_w", "respo/frac_starved", "respo/ess_phi"} <= set(metrics)
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())
    # A micro-batch without positives leaves the undefined positive statistics out (no NaN in verl's means).
    neg_only = -adv.abs() - 0.1
    _, metrics = get_policy_loss_fn("respo")(old, logp, neg_only, mask, "token-mean", default_actor, None)
    assert "respo/phi/pos_mean" not in metrics and metrics["respo/n_pos"] == 0.0


# ------------------------------------------------------------------------------------------------
# rollout_is_weights folded in log space
# ------------------------------------------------------------------------------------------------


def test_token_rollout_is_weights_fold_into_log_w(default_actor):
    # log W_i = Σ_t m (logp − old_logp) + Σ_t m log ρ_it with ρ = rollout_is_weights (token level).
    logp, old, adv, adv_seq, mask = batch(4)
    g = torch.Generator().manual_seed(5)
    w = torch.exp(0.3 * torch.randn(mask.shape, generator=g, dtype=torch.float64)) * mask  # verl zeroes padding
    level_token = rv.RespoPolicyLossConfig(rollout_is_level="token")
    config = type("Cfg", (), {"policy_loss": level_token, "global_batch_info": {}})()
    loss, _ = get_policy_loss_fn("respo")(old, logp, adv, mask, "token-mean", config, w)
    log_rho = torch.where(mask, torch.log(w.clamp(min=1e-300)), torch.zeros_like(w))
    core, _ = respo.policy_loss("respo", logp, old, adv_seq, mask.double(), rollout_log_ratio=log_rho)
    assert torch.allclose(loss, core, rtol=1e-12)
    assert torch.allclose(grad_of(loss, logp), grad_of(core, logp), rtol=1e-12)
    # "auto" reads these (unequal within rows) as token weights too.
    auto, _ = get_policy_loss_fn("respo")(old, logp, adv, mask, "token-mean", default_actor, w)
    assert torch.allclose(auto, core, rtol=1e-12)
    # Folding is not verl's multiplication of the per-token loss by ρ.
    plain, _ = respo.policy_loss("respo", logp, old, adv_seq, mask.double())
    multiplied = -(respo.respo_phi(respo.sequence_log_ratio(logp, old, mask.double()), adv_seq)[:, None] * adv * logp * w)
    assert not torch.allclose(loss, (multiplied * mask).sum() / mask.sum(), rtol=1e-3)
    assert not torch.allclose(loss, plain, rtol=1e-3)


def test_sequence_rollout_is_weight_folds_once_per_sequence(default_actor):
    # A positive 3-token row with logp = old_logp (log W = 0) and verl's sequence weight w = 2
    # broadcast to its 3 tokens: log W = ln 2 (not 3·ln 2), so φ⁺ = φ⁺(2) = 1.5/e.
    # token-mean, Â = 1, N = 3: ∂L/∂logp_t = −φ⁺(2)/3.
    old = torch.tensor([[-1.0, -0.5, -2.0]], dtype=torch.float64)
    logp = old.clone().requires_grad_()
    mask = torch.ones(1, 3, dtype=torch.bool)
    adv = torch.ones(1, 3, dtype=torch.float64)
    w = torch.full((1, 3), 2.0, dtype=torch.float64)
    for config in (default_actor, type("Cfg", (), {"policy_loss": rv.RespoPolicyLossConfig(rollout_is_level="sequence"), "global_batch_info": {}})()):
        loss, metrics = get_policy_loss_fn("respo")(old, logp, adv, mask, "token-mean", config, w)
        assert torch.allclose(grad_of(loss, logp), torch.full((1, 3), -1.5 / math.e / 3, dtype=torch.float64))
        assert metrics["respo/log_w/mean"] == pytest.approx(math.log(2.0), rel=1e-12)
    # Read as token weights the same tensor means W = 2³ = 8: φ⁺(8) = 4.5·e^(−7).
    token = type("Cfg", (), {"policy_loss": rv.RespoPolicyLossConfig(rollout_is_level="token"), "global_batch_info": {}})()
    loss, _ = get_policy_loss_fn("respo")(old, logp, adv, mask, "token-mean", token, w)
    assert torch.allclose(grad_of(loss, logp), torch.full((1, 3), -4.5 * math.exp(-7) / 3, dtype=torch.float64))


def test_zero_rollout_is_weights_drop_their_tokens(default_actor):
    # IcePop zeroes weights outside its band; verl's losses multiply those tokens' loss by 0.
    logp, old, adv, adv_seq, mask = batch(6)
    w = mask.double().clone()
    w[0, 2] = 0.0
    w[2, :] = 0.0  # a whole row rejected
    loss, _ = get_policy_loss_fn("respo")(old, logp, adv, mask, "token-mean", default_actor, w)
    kept = mask & (w > 0)
    # verl multiplies rejected tokens' loss by 0 and still divides by all valid tokens.
    core, _ = respo.policy_loss(
        "respo", logp, old, adv_seq, kept.double(), nan_policy="mask", global_tokens=int(mask.sum())
    )
    assert torch.allclose(loss, core, rtol=1e-12)
    assert torch.all(grad_of(loss, logp)[~kept] == 0)


def test_invalid_rollout_is_weights_are_named():
    mask = torch.ones(3, 2, dtype=torch.bool)
    w = torch.tensor([[1.0, -1.0], [1.0, 1.0], [float("nan"), 1.0]])
    with pytest.raises(ValueError, match="2 row"):
        rv.fold_rollout_is_weights(w, mask)


def test_objectives_defaults_and_fold_come_from_the_core():
    # verl gets the core's two-kernel objectives, their published defaults, and the core's fold.
    assert sorted(rv.OBJECTIVES) == sorted(n for n in respo.OBJECTIVES if respo.build_objective(n).kernels is not None)
    cfg = rv.RespoPolicyLossConfig()
    assert (cfg.reshaped_pos, cfg.reshaped_neg) == tuple(respo.hyperparameters("reshaped").values())
    lw = torch.log(torch.tensor([0.25, 1.0, 3.0], dtype=torch.float64))
    for objective in rv.OBJECTIVES:
        ours = rv.kernels_for(objective)
        core = respo.sequence_kernels(objective)
        assert all(torch.equal(a(lw), b(lw)) for a, b in zip(ours, core)), objective
    w = torch.tensor([[2.0, 2.0, 0.0], [0.5, 4.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    for level in rv.ROLLOUT_IS_LEVELS:
        a = rv.fold_rollout_is_weights(w, mask, level)
        b = respo.fold_rollout_log_ratio(w, mask, level=level)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), level


# ------------------------------------------------------------------------------------------------
# M2PO, which verl lacks
# ------------------------------------------------------------------------------------------------


def test_m2po_by_hand_inside_verl(default_actor):
    # 2 rows, T = 2, log w = logp − old = [[0.5, 0.1], [−0.1, 0.0]], Â = [+1, −1] per row, all valid.
    # (log w)² = .25, .01, .01, 0: mean .0675 ≥ .04; drop .25 → mean of .01, .01, 0 = .00667 < .04.
    # Kept: r = e^0.1, e^−0.1, 1. ℓ = −M·r·Â → L = (−e^0.1 + e^−0.1 + 1)/4; ∂/∂logp = −M·r·Â/4.
    old = torch.zeros(2, 2, dtype=torch.float64)
    logp = torch.tensor([[0.5, 0.1], [-0.1, 0.0]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    loss, metrics = get_policy_loss_fn("m2po")(old, logp, adv, mask, "token-mean", default_actor, None)
    e = math.exp(0.1)
    assert loss.item() == pytest.approx((-e + 1 / e + 1) / 4, rel=1e-12)
    expected = torch.tensor([[0.0, -e / 4], [1 / e / 4, 1 / 4]], dtype=torch.float64)
    assert torch.allclose(grad_of(loss, logp), expected, rtol=1e-12, atol=1e-15)
    assert metrics["respo/corr/mask_frac"] == pytest.approx(1 / 4)  # one of four tokens
    assert metrics["respo/corr/mask_frac/pos"] == pytest.approx(1 / 2) and metrics["respo/corr/mask_frac/neg"] == 0.0
    assert metrics["actor/ppo_kl"] == pytest.approx(-0.5 / 4)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_m2po_equals_the_core_and_tau_passes_through_hydra(default_actor, mode):
    from respo.core import corrections

    logp, old, adv, adv_seq, mask = batch(4)
    m = mask.double()
    custom = respo_actor("m2po", "m2po_tau=0.3")
    assert custom.policy_loss.m2po_tau == 0.3
    for config, tau in ((default_actor, 0.04), (custom, 0.3)):
        loss, metrics = get_policy_loss_fn("m2po")(old, logp, adv, mask, mode, config, None)
        corr = corrections.m2po(logp, old, adv_seq.unsqueeze(-1), m, tau=tau)
        core = respo.agg_loss(corr.values, m, mode)
        assert 0 < corr.silenced.sum() < m.sum()  # the batch selects something at both τ
        assert torch.allclose(loss, core, rtol=1e-12, atol=1e-15)
        assert torch.allclose(grad_of(loss, logp), grad_of(core, logp), rtol=1e-12, atol=1e-15)
        assert metrics["respo/corr/mask_frac"] == pytest.approx(corr.silenced.sum().item() / m.sum().item())
    with pytest.raises(ValueError, match="m2po: m2po_tau must be > 0"):
        rv.RespoPolicyLossConfig(m2po_tau=0.0)


def test_m2po_folds_rollout_is_weights(default_actor):
    # token rollout weights ρ fold into log w: the same as lowering old_logp by log ρ.
    logp, old, adv, _, mask = batch(5)
    rho = torch.exp(0.2 * torch.randn(old.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1)))
    fn = get_policy_loss_fn("m2po")
    a, _ = fn(old, logp, adv, mask, "token-mean", default_actor, rho * mask)
    b, _ = fn(old - torch.log(rho), logp, adv, mask, "token-mean", default_actor, None)
    assert torch.allclose(a, b, rtol=1e-12)


# ------------------------------------------------------------------------------------------------
# OPSM, which verl lacks (its rollout_rs rejects by KL whatever the advantage sign)
# ------------------------------------------------------------------------------------------------


def test_opsm_by_hand_inside_verl(default_actor):
    # 2 rows, T = 2, old = 0. Row 0: logp = −1, −1, Â = −1: KL_0 = mean(old − logp) = 1 > δ = .5 and Â < 0,
    # so K_0 = 0. Row 1: logp = .1, .1, Â = +1: kept whatever its KL. verl's clip: r = e^.1 = 1.105 inside
    # [.8, 1.2], ℓ = −Â·r = −e^.1 per token. token-mean over all 4 tokens (the masked row still counts):
    # L = −2e^.1/4; ∂L/∂logp = −e^.1/4 on row 1, 0 on row 0.
    # With δ = 2 row 0 is kept: r = e^−1 = .368, −Â·r = .368 < −Â·clip(r) = .8, dual clip min(3, .8) = .8 per
    # token: L = (1.6 − 2e^.1)/4.
    old = torch.zeros(2, 2, dtype=torch.float64)
    logp = torch.tensor([[-1.0, -1.0], [0.1, 0.1]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[-1.0, -1.0], [1.0, 1.0]], dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    e = math.exp(0.1)
    loss, metrics = get_policy_loss_fn("opsm")(old, logp, adv, mask, "token-mean", default_actor, None)
    assert loss.item() == pytest.approx(-2 * e / 4, rel=1e-12)
    expected = torch.tensor([[0.0, 0.0], [-e / 4, -e / 4]], dtype=torch.float64)
    assert torch.allclose(grad_of(loss, logp), expected, rtol=1e-12, atol=1e-15)
    assert metrics["respo/corr/mask_frac"] == pytest.approx(1 / 2)  # one of two rows
    assert metrics["respo/corr/mask_frac/neg"] == 1.0 and metrics["respo/corr/mask_frac/pos"] == 0.0
    assert metrics["respo/corr/silenced_adv_share/neg"] == 1.0
    assert metrics["actor/ppo_kl"] == pytest.approx((1 + 1 - 0.1 - 0.1) / 4)
    loose = respo_actor("opsm", "opsm_delta=2.0")
    assert loose.policy_loss.opsm_delta == 2.0
    loss, metrics = get_policy_loss_fn("opsm")(old, logp, adv, mask, "token-mean", loose, None)
    assert loss.item() == pytest.approx((1.6 - 2 * e) / 4, rel=1e-12)
    assert metrics["respo/corr/mask_frac"] == 0.0
    with pytest.raises(ValueError, match="opsm: opsm_delta must be >= 0"):
        rv.RespoPolicyLossConfig(opsm_delta=-1.0)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_opsm_is_verls_ppo_loss_times_trls_mask(default_actor, mode):
    # the loss and gradient of verl's vanilla PPO loss with TRL's off-policy mask as row weights
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

    grpo_trainer = pytest.importorskip("trl.trainer.grpo_trainer")
    logp, old, adv, adv_seq, mask = batch(6)
    m = mask.double()
    config = respo_actor("opsm", "opsm_delta=0.1")
    keep = grpo_trainer.GRPOTrainer.get_off_policy_mask(adv_seq.unsqueeze(-1), logp.detach(), old, m, 0.1)  # (B, 1)
    assert 0 < keep.sum() < (m.sum(-1) > 0).sum()  # the example masks a row and keeps others
    loss, metrics = get_policy_loss_fn("opsm")(old, logp, adv, mask, mode, config, None)
    theirs, _ = compute_policy_loss_vanilla(old, logp, adv, mask, mode, config, keep.expand_as(m))
    assert torch.allclose(loss, theirs, rtol=1e-12, atol=1e-15)
    assert torch.allclose(grad_of(loss, logp), grad_of(theirs, logp), rtol=1e-12, atol=1e-15)
    rows = m.sum(-1) > 0
    assert metrics["respo/corr/mask_frac"] == pytest.approx(((keep.squeeze(-1) == 0) & rows).sum().item() / rows.sum().item())


def test_opsm_folds_rollout_is_weights_into_the_kl_and_weighs_like_verl(default_actor):
    # token weights ρ: the KL is that of the rollout policy (old − log ρ), and verl multiplies the loss by ρ
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

    logp, old, adv, adv_seq, mask = batch(11)
    m = mask.double()
    rho = torch.exp(0.5 * torch.randn(old.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))) * m
    from respo.core import corrections

    keep = corrections.opsm_keep(corrections.token_log_weight(logp, old - torch.log(rho.clamp(min=1e-30)), m), adv_seq, m, 0.5)
    assert not torch.equal(keep, corrections.opsm_keep(corrections.token_log_weight(logp, old, m), adv_seq, m, 0.5))
    loss, _ = get_policy_loss_fn("opsm")(old, logp, adv, mask, "token-mean", default_actor, rho)
    theirs, _ = compute_policy_loss_vanilla(old, logp, adv, mask, "token-mean", default_actor, keep.double().unsqueeze(-1) * rho)
    assert torch.allclose(loss, theirs, rtol=1e-12, atol=1e-15)


# ------------------------------------------------------------------------------------------------
# Launch recipe: bash -n and a dry composition with verl's config (no GPU)
# ------------------------------------------------------------------------------------------------


def recipe_overrides(*args: str) -> list[str]:
    out = subprocess.run(
        ["bash", str(RECIPE), "--model", "/models/qwen3", "--data", "/data/dapo", "--print-overrides", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line for line in out.splitlines() if line]


def test_scripts_parse():
    for script in (RECIPE, PREP):
        subprocess.run(["bash", "-n", str(script)], check=True)
    bad = subprocess.run(["bash", str(RECIPE), "--model", "m", "--data", "d", "--reuse", "7"], capture_output=True)
    assert bad.returncode == 2 and b"must divide" in bad.stderr


@pytest.mark.filterwarnings("ignore:Disabled critic")  # verl's note that GRPO needs no critic
@pytest.mark.parametrize(
    "objective,reuse,loss_mode",
    [
        ("respo", 8, "respo"),
        ("respo", 16, "respo"),
        ("respo", 32, "respo"),
        ("vespo", 32, "vespo"),
        ("topr", 8, "topr"),
        ("grpo", 8, "vanilla"),
        ("gspo", 16, "gspo"),
        ("cispo", 8, "cispo"),
        ("sapo", 8, "sapo"),
        ("gmpo", 8, "geo_mean"),
        ("m2po", 8, "m2po"),
        ("opsm", 32, "opsm"),
    ],
)
def test_recipe_composes_and_validates_with_verl(objective, reuse, loss_mode):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy

    overrides = recipe_overrides("--objective", objective, "--reuse", str(reuse), "--rollout-is", "token")
    with initialize_config_dir(config_dir=_verl_config_dir(), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    OmegaConf.resolve(cfg)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    actor.validate(n_gpus=8, train_batch_size=cfg.data.train_batch_size)
    # The paper's setting.
    assert cfg.data.train_batch_size == reuse * 32 and actor.ppo_mini_batch_size == 32
    assert cfg.trainer.total_training_steps * reuse == 1024  # 1,024 policy updates
    assert cfg.actor_rollout_ref.rollout.n == 8 and cfg.actor_rollout_ref.rollout.temperature == 1.0
    assert actor.optim.lr == 1e-6 and actor.optim.lr_warmup_steps_ratio == 0.05 and actor.optim.weight_decay == 0.1
    assert actor.grad_clip == 1.0 and actor.optim.clip_grad == 1.0 and actor.ppo_epochs == 1
    assert not actor.use_kl_loss and actor.entropy_coeff == 0 and not cfg.algorithm.use_kl_in_reward
    assert actor.policy_loss.loss_mode == loss_mode
    assert get_policy_loss_fn(loss_mode) is not None
    if objective in rv.OBJECTIVES + rv.CORRECTIONS:
        assert type(actor.policy_loss) is rv.RespoPolicyLossConfig
        assert actor.policy_loss.rollout_is_level == "token"  # follows algorithm.rollout_correction.rollout_is
        assert actor.loss_agg_mode == "token-mean"
    if objective == "gspo":
        assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.loss_agg_mode) == (3e-4, 4e-4, "seq-mean-token-mean")


def test_recipe_runs_verls_gspo_with_the_papers_aggregation():
    # verl 0.9.1's gspo aggregates by actor.loss_agg_mode (0.8 and 0.9.0 forced seq-mean-token-mean, which the GSPO
    # paper and the ReSPO paper's GSPO baseline use). The recipe's gspo overrides, composed with verl's own config
    # into verl's ActorConfig, run verl's registered gspo loss as the core's gspo at its default aggregation.
    with initialize_config_dir(config_dir=_verl_config_dir(), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=recipe_overrides("--objective", "gspo", "--reuse", "8"))
    OmegaConf.resolve(cfg)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert actor.policy_loss.loss_mode == "gspo" and actor.loss_agg_mode == respo.build_objective("gspo").loss_agg_mode
    logp, _, adv, adv_seq, mask = batch(seed=3)
    g = torch.Generator().manual_seed(4)
    old = logp.detach() + 2e-3 * torch.randn(logp.shape, generator=g, dtype=torch.float64)  # inside and outside 3e-4/4e-4
    fn = get_policy_loss_fn(actor.policy_loss.loss_mode)
    loss, _ = fn(old, logp, adv, mask, loss_agg_mode=actor.loss_agg_mode, config=actor)
    core, metrics = respo.policy_loss("gspo", logp, old, adv_seq, mask.to(torch.float64))
    assert 0 < metrics["clipfrac"].item() < 1
    assert torch.allclose(loss, core, rtol=1e-6, atol=1e-9)
    assert torch.allclose(grad_of(loss, logp), grad_of(core, logp), rtol=1e-6, atol=1e-9)
    token_mean, _ = fn(old, logp, adv, mask, loss_agg_mode="token-mean", config=actor)
    assert not torch.allclose(token_mean, loss, rtol=1e-3)  # on verl 0.9.1 the aggregation changes GSPO's loss


def test_recipe_refuses_another_aggregation_for_gspo():
    args = ["bash", str(RECIPE), "--model", "m", "--data", "d", "--print-overrides", "--objective"]
    bad = subprocess.run([*args, "gspo", "--", "actor_rollout_ref.actor.loss_agg_mode=token-mean"], capture_output=True,
                         text=True)  # fmt: skip
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().count("\n") == 0 and "loss_agg_mode=seq-mean-token-mean" in bad.stderr
    same = recipe_overrides("--objective", "gspo", "--", "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean")
    assert same[-1] == "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"
    other = recipe_overrides("--objective", "grpo", "--", "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean")
    assert other[-1] == "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"  # only gspo is pinned


def test_entry_point_composes_verls_config():
    # The real entry point, through Hydra with verl's config dir; --cfg job prints and exits.
    out = subprocess.run(
        [sys.executable, "-m", "respo.integrations.verl.main_ppo", *recipe_overrides(), "--cfg", "job"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "loss_mode: respo" in out.stdout and "RespoPolicyLossConfig" in out.stdout


def test_install_worker_registration_sets_ray_runtime_env(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "other.plugin")
    cfg = compose_verl(BASE_OVERRIDES)
    install_worker_registration(cfg)
    assert os.environ[ENV_VAR] == f"other.plugin,{MODULE}"
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars[ENV_VAR] == f"other.plugin,{MODULE}"
    install_worker_registration(cfg)  # idempotent
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars[ENV_VAR] == f"other.plugin,{MODULE}"


# ------------------------------------------------------------------------------------------------
# Data preparation
# ------------------------------------------------------------------------------------------------


def test_prepare_data_writes_rows_verls_scorer_reads(tmp_path):
    import pandas as pd
    from verl.utils.reward_score import default_compute_score

    out = subprocess.run(
        ["bash", str(PREP), str(tmp_path), "--arithmetic", "40", "--test-size", "8"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
        cwd=ROOT,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    train, test = pd.read_parquet(tmp_path / "train.parquet"), pd.read_parquet(tmp_path / "test.parquet")
    assert (len(train), len(test)) == (32, 8)
    assert set(train.prompt.map(lambda p: p[0]["content"])).isdisjoint(test.prompt.map(lambda p: p[0]["content"]))
    row = train.iloc[0]
    assert row.data_source == "math_dapo" and row.prompt[0]["role"] == "user"
    a, b = map(int, row.prompt[0]["content"].split("What is ")[1].split("?")[0].split(" + "))
    assert row.reward_model["ground_truth"] == str(a + b)
    # verl's own reward function scores the DAPO format +1 / -1.
    right = default_compute_score(row.data_source, f"{a}+{b}\nAnswer: {a + b}", row.reward_model["ground_truth"])
    wrong = default_compute_score(row.data_source, f"Answer: {a + b + 1}", row.reward_model["ground_truth"])
    assert (right["score"], wrong["score"]) == (1.0, -1.0)


def test_prepare_data_jsonl_names_bad_lines(tmp_path):
    from respo.integrations.verl.prepare_data import read_jsonl

    path = tmp_path / "d.jsonl"
    path.write_text('{"problem": "1+1?", "answer": "2"}\n{"question": "x"}\n{"problem": "2+2?", "answer": 4}\n')
    with pytest.raises(ValueError, match="1 line.*line 2"):
        read_jsonl(path)
    path.write_text('{"q": "1+1?", "a": "2"}\n\n{"q": "2+2?", "a": 4}\n')
    assert read_jsonl(path, "q", "a") == [("1+1?", "2"), ("2+2?", "4")]


def test_recipe_extra_overrides_carry_kernel_hyperparameters():
    # The README's branch ablation: quoted kernel specs after `--` reach RespoPolicyLossConfig.
    overrides = recipe_overrides(
        "--objective", "reshaped", "--",
        "+actor_rollout_ref.actor.policy_loss.reshaped_pos='respo(2,0.5,2)'",
        "+actor_rollout_ref.actor.policy_loss.reshaped_neg='vespo(3,2)'",
        "+actor_rollout_ref.actor.policy_loss.respo_pos=[2.0,0.25,2.0]",
    )  # fmt: skip
    actor = omega_conf_to_dataclass(compose_verl(overrides).actor_rollout_ref.actor)
    pl = actor.policy_loss
    assert (pl.loss_mode, pl.reshaped_pos, pl.reshaped_neg) == ("reshaped", "respo(2,0.5,2)", "vespo(3,2)")
    assert pl.respo_pos == [2.0, 0.25, 2.0] and pl.rollout_is_level is None  # rollout correction off: auto
    logp, old, adv, adv_seq, mask = batch(7)
    loss, _ = get_policy_loss_fn("reshaped")(old, logp, adv, mask, "token-mean", actor, None)
    core, _ = respo.policy_loss(
        "reshaped", logp, old, adv_seq, mask.double(), pos_kernel="respo(2,0.5,2)", neg_kernel="vespo(3,2)"
    )
    assert torch.allclose(loss, core, rtol=1e-12)


# ------------------------------------------------------------------------------------------------
# LUSPO (TRL's; verl 0.9.1 lacks it): registered as loss_mode=luspo
# ------------------------------------------------------------------------------------------------


def test_luspo_is_registered_and_equals_the_core(default_actor):
    assert get_policy_loss_fn("luspo").func is rv.luspo_policy_loss and rv.REGISTERED["luspo"] == "luspo"
    logp, old, adv, adv_seq, mask = batch(6)
    m = mask.double()
    mode = "seq-mean-token-sum"
    loss, metrics = get_policy_loss_fn("luspo")(old, logp, adv, mask, mode, default_actor, None)
    # verl's actor defaults clip_ratio_low = clip_ratio_high = 0.2, TRL's epsilon and the core's defaults
    core, core_metrics = respo.policy_loss("luspo", logp, old, adv_seq, m)
    assert torch.allclose(loss, core, rtol=1e-12, atol=1e-15)
    assert torch.allclose(grad_of(loss, logp), grad_of(core, logp), rtol=1e-12, atol=1e-15)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(core_metrics["clipfrac"].item())
    assert 0 < metrics["actor/pg_clipfrac"] < 1  # the clip acts on this batch
    # rollout weights multiply the per-token loss, as verl's own losses do and TRL's luspo does
    w = torch.exp(0.2 * torch.randn(*m.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64))
    weighted, _ = get_policy_loss_fn("luspo")(old, logp, adv, mask, mode, default_actor, w)
    core_w, _ = respo.policy_loss("luspo", logp, old, adv_seq, m, rollout_log_ratio=torch.log(w))
    assert torch.allclose(weighted, core_w, rtol=1e-12, atol=1e-15)


def test_luspo_refuses_an_aggregation_that_is_not_luspo(default_actor):
    logp, old, adv, _, mask = batch(6)
    with pytest.raises(ValueError, match="loss_mode=luspo aggregates 'seq-mean-token-sum'.*got 'token-mean'"):
        get_policy_loss_fn("luspo")(old, logp, adv, mask, "token-mean", default_actor, None)
