"""The loss API at its edges: one clip check for every clipped objective, half-precision inputs,
kernel tuples of the wrong length, and bad counts and types named in one line.

Each case here failed before the core was fixed (a value accepted and misread, NaN returned
silently, or an error that did not name the parameter)."""

import math

import pytest
import torch

import respo
from respo import build_objective, policy_loss

f64 = torch.float64
CLIPPED = ("grpo", "gspo", "cispo", "decoupled", "opsm")


def batch(B=4, T=5, seed=0, dtype=f64):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g, dtype=torch.float32)).to(dtype).requires_grad_(True)
    old = (logp.detach().float() + 0.3 * torch.randn(B, T, generator=g)).to(dtype)
    adv = torch.randn(B, generator=g).to(dtype)
    return logp, old, adv, torch.ones(B, T)


def one_line(err) -> str:
    assert "\n" not in str(err.value)
    return str(err.value)


# --------------------------------------------------------------------------------------------------
# One clip check for every clipped objective
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CLIPPED)
def test_a_lower_clip_of_one_or_more_is_refused_by_every_clipped_objective(name):
    # ε_l = 1.5 makes the clip's lower bound 1 − 1.5 = −0.5: grpo, gspo and cispo took it, decoupled and
    # opsm refused it. Now all refuse it with the same words.
    with pytest.raises(ValueError) as err:
        build_objective(name, clip_ratio_low=1.5)
    assert one_line(err).startswith(f"{name}: clip_ratio_low must be in [0, 1), got 1.5")
    build_objective(name, clip_ratio_low=0.99)  # a lower bound of 0.01 is a bound


def test_gmpo_clips_in_log_space_so_any_nonnegative_lower_epsilon_is_a_bound():
    # GMPO clips log r to [−ε_l, ε_h]: ε_l = 1.5 is the ratio bound e^−1.5 = 0.223 > 0.
    build_objective("gmpo", clip_ratio_low=1.5)
    with pytest.raises(ValueError, match="gmpo: clip_ratio_low must be >= 0, got -0.5"):
        build_objective("gmpo", clip_ratio_low=-0.5)


@pytest.mark.parametrize("name", CLIPPED + ("gmpo",))
@pytest.mark.parametrize("key", ["clip_ratio_low", "clip_ratio_high"])
def test_an_infinite_clip_bound_is_refused(name, key):
    with pytest.raises(ValueError) as err:
        build_objective(name, **{key: math.inf})
    assert f"{name}: {key} must be finite, got inf" in one_line(err)


@pytest.mark.parametrize("key", ["tau_pos", "tau_neg"])
def test_sapo_refuses_an_infinite_temperature(key):
    # τ = inf gave the gate (4/τ)·σ(τ(r − 1)) = 0·σ = 0 with a NaN gradient (0·inf in σ's slope);
    # refused as NaN and −1 already were.
    with pytest.raises(ValueError) as err:
        build_objective("sapo", **{key: math.inf})
    assert one_line(err) == f"sapo: {key} must be finite, got inf"
    for bad in (math.nan, -1.0):
        with pytest.raises(ValueError, match=f"sapo: {key} must be"):
            build_objective("sapo", **{key: bad})


@pytest.mark.parametrize("name", CLIPPED + ("gmpo",))
def test_a_string_clip_bound_is_named_as_not_a_number(name):
    # Before: "'>=' not supported between instances of 'str' and 'int'" (grpo) or silently float("0.2").
    with pytest.raises(ValueError) as err:
        build_objective(name, clip_ratio_low="0.2")
    assert one_line(err) == f"{name}: clip_ratio_low must be a number, got '0.2'"


def test_grpo_and_decoupled_name_a_bad_dual_clip_alike():
    for name in ("grpo", "decoupled", "opsm"):
        with pytest.raises(ValueError, match=rf"{name}: clip_ratio_c must be > 1 \(dual clip\) or None, got 1.0"):
            build_objective(name, clip_ratio_c=1.0)


# --------------------------------------------------------------------------------------------------
# float16 / bfloat16 inputs: the diagnostics in float32
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(respo.OBJECTIVES))
def test_half_precision_inputs_get_float32_diagnostics(name, dtype):
    # Before: "quantile() input tensor must be either float or double dtype" from every objective.
    # One row of 257 tokens: bfloat16 cannot hold 257 (it rounds to 256), float32 can.
    logp, old, adv, mask = batch(B=2, T=257, dtype=dtype)
    extra = {"prox_logp": logp.detach()} if name == "decoupled" else {}
    loss, metrics = policy_loss(name, logp, old, adv, mask, **extra)
    loss.backward()
    assert loss.dtype == dtype and torch.isfinite(loss) and torch.isfinite(logp.grad.float()).all()
    assert metrics["n_tokens"].item() == 514.0  # 2 × 257, exact
    assert all(v.dtype == torch.float32 for k, v in metrics.items() if k != "loss"), name
    for key in ("log_w/p50", "chi2_token", "coef_mean"):
        assert math.isfinite(metrics[key].item()), key
    # the quantile of log W is that of the half-precision log W read in float32
    log_w = ((logp.detach() - old).float() * mask).sum(-1).clamp(-20, 20)
    if name in ("respo", "vespo", "reinforce", "topr", "reshaped"):
        assert metrics["log_w/p50"].item() == pytest.approx(torch.quantile(log_w, 0.5).item(), rel=2e-2, abs=2e-2)


# --------------------------------------------------------------------------------------------------
# Kernel tuples: exactly (alpha, beta, lambda) or (k, lambda), by position or by name
# --------------------------------------------------------------------------------------------------


def test_a_respo_branch_with_four_values_is_refused_naming_it():
    # Before: the fourth value became the log W clamp (φ⁺ mean 0.35 → 1.29 on a stale batch).
    with pytest.raises(ValueError) as err:
        build_objective("respo", pos=(2, 0.5, 2, -1))
    assert one_line(err) == "respo: pos must be (alpha, beta, lambda): 3 numbers, got 4: (2, 0.5, 2, -1)"


def test_a_respo_branch_with_two_values_is_refused_instead_of_taking_a_default_lambda():
    # Before: (2, 0.5) silently took λ = 2 while config.json recorded two values.
    with pytest.raises(ValueError, match=r"respo: neg must be \(alpha, beta, lambda\): 3 numbers, got 2"):
        build_objective("respo", neg=[2, 0.5])


def test_kernel_branches_by_name_equal_by_position():
    logp, old, adv, mask = batch(B=6, T=4, seed=3)
    a, _ = policy_loss("respo", logp, old, adv, mask, pos={"alpha": 2, "beta": 0.25, "lambda": 4}, neg=[1, 0.5, 2])
    b, _ = policy_loss("respo", logp, old, adv, mask, pos=(2, 0.25, 4), neg={"alpha": 1, "beta": 0.5, "lam": 2})
    c, _ = policy_loss("vespo", logp, old, adv, mask, pos={"k": 2, "lambda": 3}, neg={"lambda": 2, "k": 3})
    d, _ = policy_loss("vespo", logp, old, adv, mask)
    assert a.item() == b.item() and c.item() == d.item()
    with pytest.raises(ValueError, match=r"vespo: pos must be \(k, lambda\): 2 numbers, got 3"):
        build_objective("vespo", pos=(2, 3, 4))
    with pytest.raises(ValueError, match=r"vespo: neg by name needs exactly the keys \(k, lambda\), got \['beta', 'k'\]"):
        build_objective("vespo", neg={"k": 3, "beta": 2})
    with pytest.raises(ValueError, match=r"respo: pos must be \(alpha, beta, lambda\) by position or by name, got 2.0"):
        build_objective("respo", pos=2.0)
    with pytest.raises(ValueError, match="respo: pos.beta must be a number, got 'x'"):
        build_objective("respo", pos=(2, "x", 2))


def test_the_kernel_clamp_is_keyword_only():
    from respo import respo_kernel, vespo_kernel

    with pytest.raises(TypeError):
        respo_kernel(2, 0.5, 2, -1)  # a fourth positional value is not the clamp
    with pytest.raises(TypeError):
        vespo_kernel(2, 3, 5)
    assert respo_kernel(2, 0.5, 2, clamp=1.0)(torch.tensor([5.0])).item() == respo_kernel(2, 0.5, 2)(torch.tensor([1.0])).item()


# --------------------------------------------------------------------------------------------------
# Counts and types named in one line
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key, value, mode", [
    ("global_seqs", math.nan, "seq-mean-token-mean"),  # returned NaN before
    ("global_seqs", math.inf, "seq-mean-token-sum"),
    ("global_tokens", math.nan, "token-mean"),
    ("global_tokens", 0, "token-mean"),
    ("loss_scale_factor", 0, "seq-mean-token-sum-norm"),  # returned -inf before
    ("loss_scale_factor", -3.0, "seq-mean-token-sum-norm"),
    ("loss_scale_factor", "64", "seq-mean-token-sum-norm"),
])  # fmt: skip
def test_bad_counts_are_refused_naming_them(key, value, mode):
    logp, old, adv, mask = batch()
    with pytest.raises(ValueError) as err:
        policy_loss("grpo", logp, old, adv, mask, loss_agg_mode=mode, **{key: value})
    assert one_line(err).startswith(f"{key} must be a positive")


def test_a_list_mask_is_refused_naming_mask():
    logp, old, adv, mask = batch()
    with pytest.raises(TypeError) as err:
        policy_loss("respo", logp, old, adv, mask.tolist())  # AttributeError ('list' has no 'shape') before
    assert one_line(err) == "mask must be a torch.Tensor (B, T), got list"
