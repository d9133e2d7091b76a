"""respo's decoupled PPO, its log-linear proximal policy and the M2PO mask against AReaL 1.0.4's own functions.

AReaL (``areal`` 1.0.4) pins torch < 2.11 and transformers <= 5.3, so it has its own environment,
.venv-areal (made by `make setup`: areal installed --no-deps with what its PPO actor needs to import,
and torch 2.13.0). AReaL's functions run there, in one subprocess for the whole module
(tests/integrations/hosts/areal_side.py), on the tensors of the cases below passed through a file;
respo's run here on the same tensors.

What is checked against what:
  loglinear_prox_logp     ``areal.trainer.ppo.actor.compute_prox_logp_approximations`` (method ``loglinear``),
                          staleness s = current_version − version, versions from one ahead of the
                          learner (s = −1) to 8 behind
  decoupled, mask         ``areal.utils.functional.ppo_actor_loss_fn`` with the behaviour and proximal log-probs
                          and ``RejectionSamplingConfig(level="token", action="mask", metric="ratio", upper=5)``
                          (AReaL's decoupled loss: b = π_prox/π_behave, zeroed above 5), asymmetric clip
                          (0.2, 0.28), with and without dual clip c = 3; loss, gradient, the fraction
                          rejected, and per token the kept, clipped and dual-clipped tokens
  decoupled, truncate     the same with ``action="clamp"`` (b = min(b, 2))
  decoupled, loglinear    ``areal.trainer.ppo.actor.grpo_loss_fn`` (AReaL's actor loss) with
                          ``prox_logp_method="loglinear"``, ``use_decoupled_loss=True`` and versions, against
                          ``decoupled`` with ``prox_method="loglinear"`` and the staleness; and with
                          ``prox_logp_method="recompute"`` and a given π_prox
  m2po_keep               ``areal.trainer.ppo.actor._apply_m2po_masking`` (the mask ``grpo_loss_fn`` applies for
                          ``m2_threshold``; a private function) on (log π_prox − log π_behave)², τ = 0.04: equal

Tolerances. Losses and gradients in float64: rtol 1e-6, atol 1e-9, because AReaL computes the behaviour
weight π_prox/π_behave in float32 (``.float()`` before the subtraction), so the two agree to float32
rounding (~1e-7), not to float64's; the rejected fraction to 1e-12; masks exactly. The log-linear
π_prox: in float32 the same numbers (both sides compute α and the interpolation in float32); in float64
rtol 1e-6 with atol one float32 ulp of α (2^-23) times max |log π_θ − log π_behave|, AReaL's α being
float32 (``versions.float()``). ``grpo_loss_fn`` runs in float32 (its stats tracker takes float32 tensors
only), respo too: rtol 1e-6, atol 1e-8 (float32 rounding; the two are equal to the bit here).
"""

import math

import pytest
import torch

from respo import policy_loss
from respo.core import corrections as C
from respo.core.ratios import ppo_clip

from host_support import run_host

AREAL_VERSION = "1.0.4"
f64, f32 = torch.float64, torch.float32
TOL64 = dict(rtol=1e-6, atol=1e-9)
TOL32 = dict(rtol=1e-6, atol=1e-8)
CURRENT = 8  # the learner's version in the log-linear cases


def _batch(seed, B=16, T=10, scale=0.9, dtype=f64, jump=0.0):
    """A ragged batch: behaviour, proximal and current log-probs, (B, T) advantages of both signs, versions.

    ``jump`` is added to log π_θ on every 7th token, so that π_θ/π_prox passes a dual clip there."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=f64) * 3  # log π_behave
    prox = old + scale * torch.randn(B, T, generator=g, dtype=f64)  # log π_prox
    logp = prox + 0.15 * torch.randn(B, T, generator=g, dtype=f64)  # log π_θ
    logp = logp + jump * (torch.arange(B * T).view(B, T) % 7 == 0).to(f64)
    adv = torch.randn(B, T, generator=g, dtype=f64)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)  # (B, T) bool
    versions = torch.randint(0, CURRENT + 2, (B, T), generator=g)  # 0 .. CURRENT + 1 (one ahead)
    cast = lambda x: x.to(dtype)  # noqa: E731
    return dict(old_logp=cast(old), prox_logp=cast(prox), logprobs=cast(logp), advantages=cast(adv), loss_mask=mask,
                versions=versions)  # fmt: skip


def _mask_rs(cap):
    return {"level": "token", "action": "mask", "metric": "ratio", "upper": cap}


def _clamp_rs(cap):
    return {"level": "token", "action": "clamp", "metric": "ratio", "upper": cap}


def _ppo_case(seed, c_clip, rejection, eps_clip_higher=0.28, scale=1.1):
    jump = 0.0 if c_clip is None else 1.5  # π_θ/π_prox = e^1.5 ≈ 4.5 > c = 3 on every 7th token
    return {"kind": "ppo", **_batch(seed, scale=scale, jump=jump), "eps_clip": 0.2, "eps_clip_higher": eps_clip_higher,
            "c_clip": c_clip, "rejection": rejection}  # fmt: skip


CASES = {
    **{f"loglinear-{s}": {"kind": "loglinear", **_batch(s), "current_version": CURRENT} for s in (0, 1)},
    "loglinear-f32": {"kind": "loglinear", **_batch(12, dtype=f32), "current_version": CURRENT},
    "ppo-mask": _ppo_case(2, None, _mask_rs(5.0)),
    "ppo-mask-dual": _ppo_case(3, 3.0, _mask_rs(5.0)),
    "ppo-mask-symmetric": _ppo_case(4, None, _mask_rs(5.0), eps_clip_higher=None),
    "ppo-truncate": _ppo_case(5, None, _clamp_rs(2.0)),
    "ppo-truncate-dual": _ppo_case(6, 3.0, _clamp_rs(2.0)),
    "grpo-loglinear": {"kind": "grpo", **_batch(7, dtype=f32), "prox_logp": None, "prox_logp_method": "loglinear",
                       "current_version": CURRENT, "eps_clip": 0.2, "eps_clip_higher": 0.28, "c_clip": None,
                       "rejection": _mask_rs(5.0)},  # fmt: skip
    "grpo-recompute": {"kind": "grpo", **_batch(8, dtype=f32, jump=1.5), "prox_logp_method": "recompute",
                       "current_version": CURRENT, "eps_clip": 0.2, "eps_clip_higher": 0.28, "c_clip": 3.0,
                       "rejection": _mask_rs(5.0)},  # fmt: skip
    **{f"m2po-{s}": {"kind": "m2po_mask", **_batch(s, scale=s * 0.1 + 0.2), "m2_threshold": 0.04} for s in (9, 10, 11)},
}


@pytest.fixture(scope="module")
def areal():
    return run_host("areal", "areal_side.py", CASES)


def _ours_decoupled(case, **kw):
    x = case["logprobs"].clone().requires_grad_(True)
    loss, metrics = policy_loss("decoupled", x, case["old_logp"], case["advantages"], case["loss_mask"].to(x.dtype),
                                clip_ratio_low=case["eps_clip"], clip_ratio_high=case["eps_clip_higher"] or case["eps_clip"],
                                clip_ratio_c=case["c_clip"], cap=case["rejection"]["upper"],
                                cap_mode="mask" if case["rejection"]["action"] == "mask" else "truncate", **kw)  # fmt: skip
    loss.backward()
    return loss.detach(), x.grad, metrics


def test_the_installed_areal_is_the_version_named_here(areal):
    assert areal["areal"] == AREAL_VERSION
    assert areal["torch"].startswith("2.13.0")


@pytest.mark.parametrize("name", [k for k in CASES if k.startswith("loglinear")])
def test_loglinear_prox_logp_is_areals(areal, name):
    case = CASES[name]
    logp, old = case["logprobs"], case["old_logp"]
    staleness = (CURRENT - case["versions"]).to(logp.dtype)
    assert {-1.0, 0.0, 1.0, 8.0} <= set(staleness.unique().tolist())  # ahead, current, one behind, eight behind
    ours = C.loglinear_prox_logp(logp, old, staleness)
    theirs = areal["cases"][name]["prox_logp"]
    if logp.dtype == f32:  # α = (s − 1)/s and old + α·(logp − old) in float32 on both sides: the same numbers
        assert torch.equal(ours, theirs)
    else:  # AReaL's α is float32 (versions.float()): off by at most one float32 ulp of α ≤ 1, times |logp − old|
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=2.0**-23 * (logp - old).abs().max().item())


@pytest.mark.parametrize("name", [k for k in CASES if k.startswith("ppo")])
def test_decoupled_is_areals_ppo_actor_loss(areal, name):
    case, theirs = CASES[name], areal["cases"][name]
    loss, grad, m = _ours_decoupled(case, prox_logp=case["prox_logp"])
    torch.testing.assert_close(loss, theirs["loss"], **TOL64)
    torch.testing.assert_close(grad, theirs["grad"], **TOL64)
    mask_mode = case["rejection"]["action"] == "mask"
    hit = m["corr/mask_frac"] if mask_mode else m["corr/trunc_frac"]
    assert 0 < hit.item() < 1  # the cap acts on some tokens, not all
    assert hit.item() == pytest.approx(theirs["filtered_fraction"].item(), abs=1e-12)
    # per token: the tokens the cap keeps (AReaL's behave_mask), and among them the clipped and dual-clipped
    # ones (AReaL counts its clip masks on the tokens it keeps; respo's clipfrac on all valid tokens)
    corr = C.decoupled(case["logprobs"], case["old_logp"], case["advantages"], case["loss_mask"].to(f64),
                       prox_logp=case["prox_logp"], clip_ratio_low=case["eps_clip"], clip_ratio_c=case["c_clip"],
                       clip_ratio_high=case["eps_clip_higher"] or case["eps_clip"], cap=case["rejection"]["upper"],
                       cap_mode="mask" if mask_mode else "truncate")  # fmt: skip
    kept = case["loss_mask"] & ~corr.silenced
    assert torch.equal(kept, theirs["behave_mask"])
    low, high = case["eps_clip"], case["eps_clip_higher"] or case["eps_clip"]
    clip = ppo_clip(case["advantages"], torch.exp(case["logprobs"] - case["prox_logp"]), low, high, case["c_clip"])
    assert torch.equal(clip.clipped & kept, theirs["clip_mask"]) and theirs["clip_mask"].any()
    assert torch.equal(clip.dual & kept, theirs["dual_clip_mask"])
    assert theirs["dual_clip_mask"].any() == (case["c_clip"] is not None)  # the dual clip acts where it is set


@pytest.mark.parametrize("name", ["grpo-loglinear", "grpo-recompute"])
def test_decoupled_is_areals_actor_loss(areal, name):
    # AReaL's actor loss: π_prox resolved (the log-linear approximation from the versions, or the given one), then
    # ppo_actor_loss_fn; respo's decoupled with prox_method="loglinear" and the staleness, or with prox_logp.
    case, theirs = CASES[name], areal["cases"][name]
    if case["prox_logp_method"] == "loglinear":
        kw = {"prox_method": "loglinear", "staleness": (CURRENT - case["versions"]).to(f32)}
    else:
        kw = {"prox_logp": case["prox_logp"]}
    loss, grad, m = _ours_decoupled(case, **kw)
    assert loss.dtype == f32 and 0 < m["corr/mask_frac"].item() < 1
    torch.testing.assert_close(loss, theirs["loss"], **TOL32)
    torch.testing.assert_close(grad, theirs["grad"], **TOL32)


@pytest.mark.parametrize("name", [k for k in CASES if k.startswith("m2po")])
def test_m2po_mask_is_areals(areal, name):
    case = CASES[name]
    keep = C.m2po_keep(case["prox_logp"] - case["old_logp"], case["loss_mask"].to(f64), 0.04)
    theirs = areal["cases"][name]["keep"]
    valid = case["loss_mask"]
    assert (valid & ~keep).any() and keep.any()
    assert torch.equal(keep, theirs)
    kept = (case["prox_logp"] - case["old_logp"]).square()[keep]
    assert kept.mean().item() < 0.04 and not math.isnan(kept.mean().item())
