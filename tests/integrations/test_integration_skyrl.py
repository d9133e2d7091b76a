"""respo's losses inside SkyRL 0.3.0 (``skyrl``): registered, fetched back by name and called through SkyRL.

SkyRL 0.3.0 declares transformers <= 5.8 (.venv has verl's 5.10), so it has its own environment,
.venv-skyrl (made by `make setup`: skyrl installed --no-deps with what its policy-loss module imports,
and torch 2.13.0). There, in one subprocess for the whole module (tests/integrations/hosts/skyrl_side.py),
``import respo.integrations.skyrl`` registers respo's losses with SkyRL's ``PolicyLossRegistry.register``;
each case's advantages are scaled by SkyRL's ``apply_loss_reduction_to_advantages_minibatch``, the loss is
fetched with ``PolicyLossRegistry.get(name)`` and called with SkyRL's ``AlgorithmConfig``. Here respo's own
objective runs on the unscaled advantages with the aggregation that SkyRL's reduction names:

    token_mean -> token-mean, sequence_mean -> seq-mean-token-mean,
    seq_mean_token_sum_norm -> seq-mean-token-sum-norm (H = max_seq_len),
    prompt_mean -> the mean over prompts of each prompt's token-mean

What is checked (float64):
  every objective the plug-in offers (respo's but gmpo and the four whose loss does not scale with Â) under token_mean, and respo, vespo, grpo, m2po,
  opsm, tis, decoupled under sequence_mean and seq_mean_token_sum_norm, respo under prompt_mean: loss and
  gradient equal respo's objective within rtol 1e-12, atol 1e-14 (one sum order against another);
  the generator's log-probs folded as log ρ = old − rollout (``decoupled``: π_prox = old, π_behaviour = rollout);
  a variant registered with its own hyperparameters; a loss pickled as SkyRL ships it to its registry actor;
  the names (SkyRL's ``gspo``, ``cispo``, ``sapo`` stay SkyRL's, respo's are ``respo_<name>``); the refusals.
  respo's core against SkyRL's own losses: ``regular`` and ``dual_clip`` (respo's ``grpo``, c = None / 3),
  ``gspo``, ``cispo``, ``sapo``: rtol 1e-6, atol 1e-9 (SkyRL exponentiates the ratio in float32,
  ``safe_exp_delta``).
Not exercised here: SkyRL's Ray registry actor and workers (the loss is pickled and unpickled as they do).
"""

import pytest
import torch

from respo import OBJECTIVES as CORE_OBJECTIVES
from respo import build_objective, policy_loss
from respo.core.registry import get_spec

from host_support import run_host

SKYRL_VERSION = "0.3.0"
f64 = torch.float64
SAME = dict(rtol=1e-12, atol=1e-14)
NATIVE = dict(rtol=1e-6, atol=1e-9)
B, T, MAX_SEQ_LEN = 8, 12, 16
PROMPTS = [(0, 4), (4, 8)]  # two prompts of four responses (prompt_mean)
SKYRL_HAS = {"gspo", "cispo", "sapo"}  # respo objectives whose name SkyRL 0.3.0 already uses
OBJECTIVES = [n for n in CORE_OBJECTIVES if get_spec(n).scale_free and not build_objective(n).per_sequence]
NOT_SCALE_FREE = [n for n in CORE_OBJECTIVES if not get_spec(n).scale_free]  # dro, kl_cov, clip_cov, prime_rl
NAMES = {n: f"respo_{n}" if n in SKYRL_HAS else n for n in OBJECTIVES}
AGG = {"token_mean": "token-mean", "sequence_mean": "seq-mean-token-mean",
       "seq_mean_token_sum_norm": "seq-mean-token-sum-norm"}  # fmt: skip


def _batch(seed, scale=0.4, token_adv=False):
    """B rows of up to T tokens (none empty), GRPO-like advantages (one per row, both signs) or per token."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=f64) * 2
    logp = old + scale * torch.randn(B, T, generator=g, dtype=f64) / T**0.5
    rollout = old + 0.05 * torch.randn(B, T, generator=g, dtype=f64)
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).to(f64)
    adv = torch.randn(B, T if token_adv else 1, generator=g, dtype=f64).expand(B, T) * mask
    return {"log_probs": logp, "old_log_probs": old, "advantages": adv.contiguous(), "loss_mask": mask,
            "rollout_logprobs": rollout}  # fmt: skip


def _case(name, reduction, seed, rollout=False, token_adv=False, config=None, scale=0.4, **kw):
    case = {"name": name, **_batch(seed, scale=scale, token_adv=token_adv), "config": {"loss_reduction": reduction,
            "max_seq_len": MAX_SEQ_LEN, **(config or {})}, **kw}  # fmt: skip
    if not rollout:
        case.pop("rollout_logprobs")
    if reduction == "prompt_mean":
        case["prompt_boundaries"] = PROMPTS
    return case


CASES = {
    **{f"{o}/token_mean": _case(NAMES[o], "token_mean" if o != "luspo" else "seq_mean_token_sum_norm", i)
       for i, o in enumerate(OBJECTIVES)},
    **{f"{o}/{r}": _case(NAMES[o], r, 40 + i, token_adv=(o == "respo"))
       for i, o in enumerate(["respo", "vespo", "grpo", "m2po", "opsm", "tis", "decoupled"])
       for r in ("sequence_mean", "seq_mean_token_sum_norm")},
    "respo/prompt_mean": _case("respo", "prompt_mean", 60),
    "respo/rollout": _case("respo", "token_mean", 61, rollout=True),
    "grpo/rollout": _case("grpo", "token_mean", 62, rollout=True),
    "decoupled/rollout": _case("decoupled", "token_mean", 63, rollout=True),
    "respo_sharp": _case("respo_sharp", "token_mean", 64),
    "respo/pickled": _case("respo", "sequence_mean", 65, rollout=True, roundtrip=True),
    "respo_sharp/pickled": _case("respo_sharp", "token_mean", 64, roundtrip=True),
    # SkyRL's own losses, on ratios spread wide enough (log r ~ N(0, 0.87²)) to clip and to pass the dual clip
    "skyrl/regular": _case("regular", "token_mean", 70, config={"policy_loss_type": "regular"}, scale=3.0),
    "skyrl/dual_clip": _case("dual_clip", "token_mean", 71, config={"policy_loss_type": "dual_clip", "clip_ratio_c": 3.0},
                             scale=3.0),  # fmt: skip
    "skyrl/gspo": _case("gspo", "sequence_mean", 72, config={"policy_loss_type": "gspo", "eps_clip_low": 3e-4,
                                                               "eps_clip_high": 4e-4}),  # fmt: skip
    "skyrl/cispo": _case("cispo", "token_mean", 73, config={"policy_loss_type": "cispo"}, scale=3.0),
    "skyrl/sapo": _case("sapo", "sequence_mean", 74, config={"policy_loss_type": "sapo"}, scale=3.0),
    "error/off_policy_correction": _case("respo", "token_mean", 80, rollout=True, expect_error=True,
                                         config={"off_policy_correction": {"tis_ratio_type": "token"}}),  # fmt: skip
    "error/luspo_token_mean": _case("luspo", "token_mean", 81, expect_error=True),
}
PAYLOAD = {
    "cases": CASES,
    "register": [{"objective": "respo", "name": "respo_sharp", "hparams": {"pos": (3.0, 0.5, 2.0)}}],
    "refuse": {"builtin_name": {"objective": "respo", "name": "regular"},
               "gmpo": {"objective": "gmpo", "name": "respo_gmpo"},
               "taken_by_another_variant": {"objective": "vespo", "name": "respo_sharp"},
               **{f"not_scale_free/{n}": {"objective": n, "name": f"respo_{n}"} for n in NOT_SCALE_FREE}},  # fmt: skip
    "builtins": ["regular", "dual_clip", "gspo", "cispo", "sapo", "dppo"],
}
HPARAMS = {"respo_sharp": {"pos": (3.0, 0.5, 2.0)}}


@pytest.fixture(scope="module")
def skyrl():
    return run_host("skyrl", "skyrl_side.py", PAYLOAD)


def _respo(objective, case, mode, *, metrics=False, **kw):
    """respo's own objective on the unscaled advantages: (loss, gradient wrt logp[, metrics])."""
    x = case["log_probs"].clone().requires_grad_(True)
    extra = {"loss_scale_factor": MAX_SEQ_LEN} if mode == "seq-mean-token-sum-norm" else {}
    loss, m = policy_loss(objective, x, case["old_log_probs"], case["advantages"], case["loss_mask"],
                          loss_agg_mode=mode, **extra, **kw)  # fmt: skip
    loss.backward()
    return (loss.detach(), x.grad, m) if metrics else (loss.detach(), x.grad)


def _clip_share(m):
    """The share of clipped tokens in respo's metrics (cispo: of ratios out of range), None for an unclipped one."""
    if "clipfrac" in m:
        return m["clipfrac"].item()
    return (m["clipfrac_high"] + m["clipfrac_low"]).item() if "clipfrac_high" in m else None


def _rollout_kw(objective, case):
    if "rollout_logprobs" not in case:
        return {}
    if objective == "decoupled":
        return {}
    return {"rollout_log_ratio": case["old_log_probs"] - case["rollout_logprobs"]}


def _assert_same(theirs, loss, grad, tol):
    torch.testing.assert_close(theirs["loss"], loss, **tol)
    torch.testing.assert_close(theirs["grad"], grad, **tol)


def test_the_installed_skyrl_is_the_version_named_here(skyrl):
    assert skyrl["skyrl"] == SKYRL_VERSION and skyrl["torch"].startswith("2.13.0")


def test_respos_losses_are_in_skyrls_registry_under_their_names(skyrl):
    assert {o: skyrl["registered"][o] for o in OBJECTIVES} == NAMES
    assert skyrl["registered"]["respo_sharp"] == "respo_sharp"
    assert skyrl["registered_again"] == skyrl["registered"]  # registering again is a no-op
    for name in [*NAMES.values(), "respo_sharp"]:
        assert name in skyrl["available"] and skyrl["types"][name] == "RespoPolicyLoss"
    # SkyRL's own losses keep their names
    assert set(skyrl["builtin_modules"].values()) == {"skyrl.backends.skyrl_train.utils.ppo_utils"}
    assert "gmpo" not in skyrl["available"]
    assert not {n for n in NOT_SCALE_FREE} & set(skyrl["registered"])  # not offered (the refusal below)


def test_registration_refuses_a_taken_name_and_gmpo(skyrl):
    assert "SkyRL already has a policy loss named 'regular'" in skyrl["refused"]["builtin_name"]
    assert "SkyRL already has a policy loss named 'respo_sharp'" in skyrl["refused"]["taken_by_another_variant"]
    assert "unknown respo objective for SkyRL 'gmpo'" in skyrl["refused"]["gmpo"]
    assert sorted(NOT_SCALE_FREE) == ["clip_cov", "dro", "kl_cov", "prime_rl"]
    for n in NOT_SCALE_FREE:  # SkyRL hands a loss its pre-scaled advantages only
        assert f"respo objective {n!r} cannot run in SkyRL: its loss does not scale with the advantages" in \
            skyrl["refused"][f"not_scale_free/{n}"]  # fmt: skip


@pytest.mark.parametrize("key", [k for k in CASES if "/" in k and k.split("/")[0] in OBJECTIVES
                                 and k.split("/")[1] in (*AGG, "rollout")])  # fmt: skip
def test_a_registered_loss_is_respos_objective(skyrl, key):
    case = CASES[key]
    objective = key.split("/")[0]
    mode = AGG[case["config"]["loss_reduction"]]
    if objective == "decoupled":
        behaviour = case.get("rollout_logprobs", case["old_log_probs"])
        x = case["log_probs"].clone().requires_grad_(True)
        extra = {"loss_scale_factor": MAX_SEQ_LEN} if mode == "seq-mean-token-sum-norm" else {}
        loss, m = policy_loss("decoupled", x, behaviour, case["advantages"], case["loss_mask"], loss_agg_mode=mode,
                              prox_logp=case["old_log_probs"], **extra)  # fmt: skip
        loss.backward()
        loss, grad = loss.detach(), x.grad
    else:
        loss, grad, m = _respo(objective, case, mode, metrics=True, **_rollout_kw(objective, case))
    theirs = skyrl["cases"][key]
    _assert_same(theirs, loss, grad, SAME)
    assert loss.abs().item() > 0 and grad.abs().sum().item() > 0
    # the metrics: respo's under respo/ (those that do not weigh by |Â|), and the clip share as SkyRL's clip_ratio
    assert theirs["metrics"]["respo/n_tokens"] == m["n_tokens"].item()
    assert theirs["metrics"]["clip_ratio"] == pytest.approx(_clip_share(m) or 0.0, abs=1e-12)


def test_decoupled_without_rollout_log_probs_is_ppo(skyrl):
    case = CASES["decoupled/token_mean"]  # π_behaviour = π_prox = old: b = 1, the PPO clip of π_θ/π_old
    loss, grad = _respo("grpo", case, "token-mean", clip_ratio_c=None)
    _assert_same(skyrl["cases"]["decoupled/token_mean"], loss, grad, SAME)


def test_prompt_mean_is_the_mean_of_each_prompts_token_mean(skyrl):
    case = CASES["respo/prompt_mean"]
    parts = [_respo("respo", {k: v[a:b] if torch.is_tensor(v) else v for k, v in case.items()}, "token-mean")
             for a, b in PROMPTS]  # fmt: skip
    loss = sum(p[0] for p in parts) / len(PROMPTS)
    grad = torch.cat([p[1] for p in parts]) / len(PROMPTS)
    _assert_same(skyrl["cases"]["respo/prompt_mean"], loss, grad, SAME)


@pytest.mark.parametrize("key", ["respo_sharp", "respo_sharp/pickled", "respo/pickled"])
def test_a_variant_and_a_pickled_loss(skyrl, key):
    case = CASES[key]
    name = case["name"]
    objective = "respo"
    mode = AGG[case["config"]["loss_reduction"]]
    loss, grad = _respo(objective, case, mode, **HPARAMS.get(name, {}), **_rollout_kw(objective, case))
    _assert_same(skyrl["cases"][key], loss, grad, SAME)
    if name == "respo_sharp":  # its own hyperparameters, not the defaults
        default, _ = _respo("respo", case, mode)
        assert abs(default.item() - loss.item()) > 1e-6


@pytest.mark.parametrize("key, objective, kw", [
    ("skyrl/regular", "grpo", {"clip_ratio_c": None}),
    ("skyrl/dual_clip", "grpo", {"clip_ratio_c": 3.0}),
    ("skyrl/gspo", "gspo", {}),  # respo's defaults are GSPO's 3e-4 / 4e-4
    ("skyrl/cispo", "cispo", {"clip_ratio_low": 0.0, "clip_ratio_high": 5.0}),  # SkyRL's cispo defaults
    ("skyrl/sapo", "sapo", {}),  # τ⁺ = 1, τ⁻ = 1.05 on both sides
])  # fmt: skip
def test_respos_core_is_skyrls_own_loss(skyrl, key, objective, kw):
    case = CASES[key]
    mode = AGG[case["config"]["loss_reduction"]]
    loss, grad = _respo(objective, case, mode, **kw)
    _assert_same(skyrl["cases"][key], loss, grad, NATIVE)
    assert grad.abs().sum().item() > 0
    _, m = policy_loss(objective, case["log_probs"], case["old_log_probs"], case["advantages"], case["loss_mask"],
                       loss_agg_mode=mode, **kw)  # fmt: skip
    if objective != "sapo":  # the clip acts on some tokens, the share SkyRL reports (its clip_ratio, in float32)
        share = m["clipfrac"] if "clipfrac" in m else m["clipfrac_high"] + m["clipfrac_low"]  # cispo: r out of range
        assert 0 < share.item() < 1
        assert share.item() == pytest.approx(skyrl["cases"][key]["metrics"]["clip_ratio"], abs=1e-6)
    if kw.get("clip_ratio_c"):  # and the dual clip acts
        assert m["clipfrac_dual"].item() > 0


def test_the_refusals_name_what_to_change(skyrl):
    assert "turn off_policy_correction off" in skyrl["cases"]["error/off_policy_correction"]["error"]
    assert "luspo needs trainer.algorithm.loss_reduction=seq_mean_token_sum_norm" in \
        skyrl["cases"]["error/luspo_token_mean"]["error"]  # fmt: skip
