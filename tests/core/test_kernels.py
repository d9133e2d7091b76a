"""ReSPO and VESPO kernels: hand-worked values, the general family, and properties."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from respo import respo_kernel, respo_phi, two_branch, vespo_phi
from respo.core.kernels import kernel_from_spec

E = math.e
f64 = torch.float64

PHI_POS = respo_kernel(2.0, 0.5, 2.0)  # φ⁺(W) = ((1+W)/2)·e^(1−W)
PHI_NEG = respo_kernel(1.0, 0.5, 2.0)  # φ⁻(W) = √W·e^(2(1−√W))


def at(kernel, w):
    return float(kernel(torch.log(torch.tensor(w, dtype=f64))))


def dphi_dw(kernel, w):
    """dφ/dW by autograd through the undetached kernel: φ is a function of log W, so W = exp(log W)."""
    w_t = torch.tensor(w, dtype=f64, requires_grad=True)
    kernel(torch.log(w_t)).backward()
    return float(w_t.grad)


def test_phi_is_one_at_w_one_on_both_branches():
    # φ₀(1) = [(1−β) + β·1]^(1/p) = 1, and 1·e^(λ(1−1)) = 1, for any (α, β, λ).
    assert at(PHI_POS, 1.0) == pytest.approx(1.0, abs=1e-15)
    assert at(PHI_NEG, 1.0) == pytest.approx(1.0, abs=1e-15)
    lw = torch.zeros(2, dtype=f64)
    assert torch.equal(respo_phi(lw, torch.tensor([1.0, -1.0], dtype=f64)), torch.ones(2, dtype=f64))


def test_positive_branch_at_zero():
    # φ⁺(0) = ((1+0)/2)·e^(1−0) = e/2 ≈ 1.35914; log W = −inf is clamped to −20 (W = 2.06e-9):
    # φ⁺(2.06e-9) = e/2 − O(W²), equal to e/2 to 1e-12.
    assert float(PHI_POS(torch.tensor(-math.inf, dtype=f64))) == pytest.approx(E / 2, abs=1e-12)
    # φ⁺'(W) = e^(1−W)/2 − ((1+W)/2)·e^(1−W) = −W·e^(1−W)/2, so φ⁺'(0) = 0 and φ⁺'(W) → 0 linearly:
    # at W = 1e-6 (log W = −13.8, inside the clamp) it is −1e-6·e^(1−1e-6)/2 = −1.35914e-6.
    assert dphi_dw(PHI_POS, 1e-6) == pytest.approx(-1e-6 * math.exp(1 - 1e-6) / 2, rel=1e-6)
    assert abs(dphi_dw(PHI_POS, 1e-8)) < 1e-7


def test_negative_branch_peak_and_limits():
    # φ⁻(W) = √W·e^(2(1−√W)); at W = 1/4: √W = 1/2, φ = (1/2)·e^1 = e/2, the maximum.
    assert at(PHI_NEG, 0.25) == pytest.approx(E / 2, rel=1e-12)
    assert dphi_dw(PHI_NEG, 0.25) == pytest.approx(0.0, abs=1e-12)
    # φ⁻(0) = φ⁻(∞) = 0: at the clamp, W = e^−20 gives √W·e^2 = e^−10·e^2 ≈ 3.4e-4 and W = e^20 gives
    # e^10·e^(2(1−e^10)) = 0 in float64.
    assert float(PHI_NEG(torch.tensor(-math.inf, dtype=f64))) == pytest.approx(math.exp(-10) * math.exp(2 * (1 - math.exp(-10))), rel=1e-12)
    assert float(PHI_NEG(torch.tensor(math.inf, dtype=f64))) == 0.0


def test_slopes_at_one_are_minus_half():
    # φ⁺'(1) = −1·e^0/2 = −1/2. φ⁻ with u = √W: dφ/du = e^(2(1−u))(1 − 2u), du/dW = 1/(2u): at 1, (−1)(1/2) = −1/2.
    assert dphi_dw(PHI_POS, 1.0) == pytest.approx(-0.5, abs=1e-12)
    assert dphi_dw(PHI_NEG, 1.0) == pytest.approx(-0.5, abs=1e-12)


@pytest.mark.parametrize(
    "kernel, w, expected",
    [
        (PHI_POS, 0.01, 1.35907),  # (1.01/2)·e^0.99 = 0.505·2.69123 = 1.35907
        (PHI_POS, 2.0, 0.55182),  # (3/2)·e^−1 = 1.5·0.367879 = 0.55182
        (PHI_NEG, 0.01, 0.604965),  # 0.1·e^(2·0.9) = 0.1·6.049647 = 0.6049647
        (PHI_NEG, 4.0, 0.27067),  # 2·e^(2·(1−2)) = 2·e^−2 = 0.27067
    ],
)
def test_design_sample_values(kernel, w, expected):
    assert at(kernel, w) == pytest.approx(expected, abs=5e-6)


def test_closed_forms_over_a_grid():
    w = torch.logspace(-6, 3, 200, dtype=f64)
    lw = torch.log(w)
    assert torch.allclose(PHI_POS(lw), ((1 + w) / 2) * torch.exp(1 - w), rtol=1e-12, atol=1e-300)
    assert torch.allclose(PHI_NEG(lw), torch.sqrt(w) * torch.exp(2 * (1 - torch.sqrt(w))), rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("beta, lam", [(0.5, 2.0), (0.2, 0.0), (0.9, 1.3), (1.0, 0.5)])
def test_alpha_two_is_the_arithmetic_mean(beta, lam):
    # α = 2: p = 1, φ₀ = (1−β) + β·W exactly.
    w = torch.logspace(-5, 1.2, 101, dtype=f64)
    phi0 = (1 - beta) + beta * w
    expected = phi0 * torch.exp(lam * (1 - phi0))
    assert torch.allclose(respo_kernel(2.0, beta, lam)(torch.log(w)), expected, rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("beta, lam", [(0.5, 2.0), (0.3, 1.0), (1.0, 0.0)])
@pytest.mark.parametrize("dtype", [torch.float32, f64])
def test_alpha_one_is_the_continuous_limit(beta, lam, dtype):
    # With p = α − 1: log φ₀ = (1/p)·log((1−β) + β·e^(pL)) = β·L + p·β(1−β)·L²/2 + O(p²), L = log W.
    # The first-order term is real: for (β, λ) = (.5, 2) at L ≈ −6, φ ≈ 0.33 moves by
    # 0.33·(1 − λφ₀)·p·0.25·36/2 ≈ 1.4e-4 at p = 1e-4. So φ(α = 1 ± 1e-4) matches φ(α = 1) to 2e-4
    # (a 1e-4 tolerance would be slightly too tight), and the gap shrinks linearly with p.
    lw = torch.linspace(-20, 20, 401, dtype=dtype)
    ref = respo_kernel(1.0, beta, lam)(lw)
    scale = ref.abs().clamp(min=1.0)  # relative where φ is large (λ = 0 lets φ = W reach e^20)
    for p in (1e-4, -1e-4):
        got = respo_kernel(1.0 + p, beta, lam)(lw)
        assert torch.isfinite(got).all()
        gap = ((got - ref).abs() / scale).max()
        assert gap < 2e-4, (p, float(gap))
    if dtype == f64:
        gap_small = ((respo_kernel(1.0 + 1e-7, beta, lam)(lw) - ref).abs() / scale).max()
        assert gap_small < 2e-7, float(gap_small)


def test_branch_selection_by_advantage_sign():
    lw = torch.log(torch.tensor([0.01, 0.01, 4.0, 4.0], dtype=f64))
    adv = torch.tensor([0.0, -0.1, 2.0, -3.0], dtype=f64)  # Â = 0 takes the positive branch
    phi = respo_phi(lw, adv)
    assert phi.tolist() == pytest.approx([1.35907, 0.604965, 2.5 * math.exp(-3), 0.27067], abs=5e-6)
    assert not phi.requires_grad


def test_respo_phi_is_detached():
    lw = torch.zeros(3, requires_grad=True)
    phi = respo_phi(lw, torch.ones(3))
    assert phi.grad_fn is None and not phi.requires_grad


@settings(max_examples=300, deadline=None)
@given(
    log_w=st.one_of(st.floats(-1e4, 1e4), st.sampled_from([math.inf, -math.inf])),
    alpha=st.floats(0.01, 8.0),
    beta=st.floats(1e-3, 1.0),
    lam=st.floats(0.0, 6.0),
    dtype=st.sampled_from([torch.float32, f64]),
)
def test_property_finite_nonnegative_bounded(log_w, alpha, beta, lam, dtype):
    phi = float(respo_kernel(alpha, beta, lam)(torch.tensor(log_w, dtype=dtype)))
    assert math.isfinite(phi) and phi >= 0
    if lam > 0:
        # max over φ₀ of φ₀·e^(λ(1−φ₀)) is at φ₀ = 1/λ: (1/λ)·e^(λ−1).
        assert phi <= (1 / lam) * math.exp(lam - 1) * (1 + 1e-5)


@settings(max_examples=100, deadline=None)
@given(log_w=st.lists(st.floats(-1e4, 1e4), min_size=1, max_size=16), sign=st.booleans())
def test_property_respo_phi_bounded_by_e_over_two(log_w, sign):
    lw = torch.tensor(log_w, dtype=f64)
    adv = torch.full_like(lw, 1.0 if sign else -1.0)
    phi = respo_phi(lw, adv)
    assert torch.isfinite(phi).all() and (phi >= 0).all() and (phi <= E / 2 + 1e-12).all()


@pytest.mark.parametrize("bad", [(0.0, 0.5, 2.0), (-1.0, 0.5, 2.0), (2.0, 0.0, 2.0), (2.0, 1.5, 2.0), (2.0, 0.5, -1.0), (math.nan, 0.5, 1.0)])
def test_invalid_respo_parameters_raise(bad):
    with pytest.raises(ValueError, match="alpha|beta|lambda"):
        respo_kernel(*bad)


def test_vespo_values():
    # φ(W) = W^k·e^(λ(1−W)); (k, λ) = (2, 3) for Â ≥ 0 and (3, 2) for Â < 0.
    # W = 2: pos 4·e^−3 = 0.199148; neg 8·e^−2 = 1.082682. W = 0.5: pos 0.25·e^1.5 = 1.120422; neg 0.125·e = 0.339785.
    lw = torch.log(torch.tensor([2.0, 2.0, 0.5, 0.5, 1.0], dtype=f64))
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0], dtype=f64)
    assert vespo_phi(lw, adv).tolist() == pytest.approx([0.199148, 1.082682, 1.120422, 0.339785, 1.0], abs=1e-6)


def test_vespo_is_finite_at_the_extremes():
    lw = torch.tensor([-math.inf, math.inf, -1e4, 1e4])
    phi = vespo_phi(lw, torch.tensor([1.0, 1.0, -1.0, -1.0]))
    assert torch.isfinite(phi).all() and (phi >= 0).all()


def test_kernel_specs_compose_branches():
    lw = torch.log(torch.tensor([0.01, 0.01], dtype=f64))
    adv = torch.tensor([1.0, -1.0], dtype=f64)
    phi = two_branch(lw, adv, kernel_from_spec("respo(2,0.5,2)"), kernel_from_spec("vespo(3, 2)"))
    # positive: ReSPO φ⁺(0.01) = 1.35907; negative: VESPO 0.01³·e^(2·0.99) = 1e-6·7.24274 = 7.24274e-6
    assert phi.tolist() == pytest.approx([1.35907, 7.24274e-6], rel=1e-5)
    assert float(kernel_from_spec("truncated(1)")(torch.tensor(3.0))) == 1.0
    assert float(kernel_from_spec("unit")(torch.tensor(-7.0))) == 1.0
    for bad in ("respo(2,0.5,2,1)", "gamma(1)", "respo(a,b,c)", 3):
        with pytest.raises((ValueError, TypeError)):
            kernel_from_spec(bad)
