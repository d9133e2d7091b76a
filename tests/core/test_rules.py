"""The frameworks' other policy-loss rules on values worked by hand: verl 0.9.1's gpg, dro, kl_cov and clip_cov,
prime-rl's default loss, SkyRL's sequence and outlier masks and TRL's two-sided clip; their defaults and sources,
their diagnostics, micro-batching, and bad hyperparameters.

What each is checked against:
  gpg, dro, kl_cov, clip_cov   verl 0.9.1's own functions: tests/integrations/test_crosscheck_rules.py
  two_sided                    TRL 1.16's own code path (GRPOTrainer._compute_loss with ``delta``):
                               tests/integrations/test_integration_trl.py
  prime_rl                     hand-worked only: prime-rl is not installable here (no distribution on the package
                               index); the values below are worked from its published source, prime-rl 0.8.0,
                               ``src/prime_rl/trainer/rl/loss.py`` (``default_loss_fn``) with the defaults of
                               ``packages/prime-rl-configs/src/prime_rl/configs/trainer.py`` (``DefaultLossConfig``)
  geo_mask, product_mask,      hand-worked only: skyrl 0.3.0 downloads but does not import in this environment
  outlier_mask                 (its skyrl/tinker/types.py uses typing.TypedDict, which pydantic refuses before
                               Python 3.12; this environment has 3.11); the values below are worked from its source,
                               ``skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py``
                               (``compute_sequence_mask``, ``compute_outlier_token_mask``), defaults from
                               ``skyrl/train/config/config.py`` (``OffPolicyCorrectionConfig``); the two sequence
                               masks are also the rows verl's k1 rejection keeps (test_crosscheck_rules.py)
"""

import math
import re
from pathlib import Path

import pytest
import torch

import respo
from respo import build_objective, hyperparameters, policy_loss
from respo.core import rules
from respo.core.objectives import default_agg_mode, objective_source
from respo.core.registry import catalogue_table, objective_names

f64 = torch.float64
NEW = ("gpg", "dro", "clip_cov", "kl_cov", "prime_rl", "geo_mask", "product_mask", "outlier_mask", "two_sided")


def _run(name, logp, old, adv, mask, **kw):
    x = logp.clone().requires_grad_(True)
    loss, metrics = policy_loss(name, x, old, adv, mask, **kw)
    loss.backward()
    return loss.item(), x.grad, metrics


def _t(rows):
    return torch.tensor(rows, dtype=f64)


def test_defaults_are_the_sources_and_each_names_its_source():
    # verl 0.9.1 PolicyLossConfig: clip_cov_ratio 2e-4, clip_cov_lb 1, clip_cov_ub 5, kl_cov_ratio 2e-4,
    # ppo_kl_coef 0.1, dro_beta None (required, so respo sets 1); ActorConfig clip_ratio 0.2
    assert hyperparameters("gpg") == {}
    assert hyperparameters("dro") == {"beta": 1.0}
    assert hyperparameters("clip_cov") == {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_cov_ratio": 2e-4,
                                           "clip_cov_lb": 1.0, "clip_cov_ub": 5.0}  # fmt: skip
    assert hyperparameters("kl_cov") == {"kl_cov_ratio": 2e-4, "ppo_kl_coef": 0.1}
    # prime-rl 0.8.0 DefaultLossConfig: dppo_mask_low = dppo_mask_high = 0.2, adv_tau 1.0, kl_tau 1e-3
    assert hyperparameters("prime_rl") == {"delta_low": 0.2, "delta_high": 0.2, "adv_tau": 1.0, "kl_tau": 1e-3}
    # SkyRL 0.3.0 OffPolicyCorrectionConfig: geo 0.99 / 1.01, product 0.5 / 2.0, outlier off (suggested 1e-4 / 100)
    base = {"base": "grpo", "base_kwargs": None}
    assert hyperparameters("geo_mask") == {"lo": 0.99, "hi": 1.01, **base}
    assert hyperparameters("product_mask") == {"lo": 0.5, "hi": 2.0, **base}
    assert hyperparameters("outlier_mask") == {"lo": 1e-4, "hi": 100.0, **base}
    # TRL 1.16: epsilon 0.2; delta None in TRL (off), 4 in INTELLECT-2's setting
    assert hyperparameters("two_sided") == {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "delta": 4.0}
    assert all(default_agg_mode(n) == "token-mean" for n in NEW)
    for name, where in [("gpg", "verl 0.9.1"), ("dro", "verl 0.9.1"), ("clip_cov", "verl 0.9.1"), ("kl_cov", "verl 0.9.1"),
                        ("prime_rl", "prime-rl 0.8.0"), ("geo_mask", "SkyRL 0.3.0"), ("product_mask", "SkyRL 0.3.0"),
                        ("outlier_mask", "SkyRL 0.3.0"), ("two_sided", "TRL 1.16")]:  # fmt: skip
        assert where in objective_source(name), name
    assert all(objective_source(n).strip() for n in respo.OBJECTIVES)  # every objective names its source


def test_method_md_has_one_catalogue_row_per_objective():
    # docs/method.md's core API table lists every objective once: | `name` | formula | defaults |
    text = (Path(__file__).parents[2] / "docs" / "method.md").read_text()
    table = text[text.index("## The core API"):]
    table = table[: table.index("\n\n", table.index("| name |"))]
    rows = re.findall(r"^\| `([a-z0-9_]+)` \|", table, flags=re.M)
    assert sorted(rows) == sorted(respo.OBJECTIVES) and len(rows) == len(set(rows))
    # and it is the registry's catalogue to the letter: summaries, defaults, aggregations, sources
    # (``python scripts/catalogue.py`` writes it; tests/core/test_catalogue.py checks every other place)
    header = table[table.index("| name |"):]
    assert header == catalogue_table(objective_names())


# --------------------------------------------------------------------------------------------------
# verl's gpg and dro
# --------------------------------------------------------------------------------------------------


def test_gpg_by_hand_multiplies_the_rollout_weight_unlike_reinforce():
    # logp = (log .5, log .25), Â = 2: ℓ = −2·logp = (1.386294, 2.772589), token-mean 2.079442; ∇ = −Â/2 = −1 each
    logp = torch.log(_t([[0.5, 0.25]]))
    mask, adv = torch.ones(1, 2, dtype=f64), _t([2.0])
    loss, grad, _ = _run("gpg", logp, logp, adv, mask)
    assert loss == pytest.approx(-(math.log(0.5) + math.log(0.25)), rel=1e-12)
    assert grad.flatten().tolist() == pytest.approx([-1.0, -1.0])
    # ρ = (2, 0.5) multiplies each token's loss (verl's rollout_is_weights): ∇ = −Â·ρ/2 = (−2, −0.5);
    # reinforce folds ρ into log W and its φ ≡ 1 ignores it
    rho = _t([[2.0, 0.5]])
    _, grad, _ = _run("gpg", logp, logp, adv, mask, rollout_log_ratio=torch.log(rho))
    assert grad.flatten().tolist() == pytest.approx([-2.0, -0.5])
    _, grad_r, _ = _run("reinforce", logp, logp, adv, mask, rollout_log_ratio=torch.log(rho))
    assert grad_r.flatten().tolist() == pytest.approx([-1.0, -1.0])


def test_dro_by_hand():
    # token 0: logp = −1, old = −1.5 (log r = .5), Â = 1, β = 2: ℓ = −(1·(−1) − ½·2·.25) = 1.25,
    #          ∂ℓ/∂logp = −(Â − β·log r) = −(1 − 1) = 0: the penalty cancels the advantage at log r = Â/β
    # token 1: logp = old = −2, Â = 1: ℓ = 2, ∂ = −1.  token-mean: (1.25 + 2)/2 = 1.625, ∇ = (0, −.5)
    logp, old = _t([[-1.0, -2.0]]), _t([[-1.5, -2.0]])
    loss, grad, m = _run("dro", logp, old, _t([1.0]), torch.ones(1, 2, dtype=f64), beta=2.0)
    assert loss == pytest.approx(1.625, rel=1e-12)
    assert grad.flatten().tolist() == pytest.approx([0.0, -0.5], abs=1e-12)
    # penalty/mean = (½·2·.25 + 0)/2 = .125; grad share = Σ|g| / (Σ|c·Â| + Σ|g|) = (1 + 0)/((1 + 1) + 1) = 1/3
    assert m["penalty/mean"].item() == pytest.approx(0.125)
    assert m["penalty/grad_share"].item() == pytest.approx(1 / 3)
    assert m["coef_mean"].item() == pytest.approx(1.0)  # c = 1: the advantage's own coefficient


# --------------------------------------------------------------------------------------------------
# KL-Cov and Clip-Cov
# --------------------------------------------------------------------------------------------------


def _cov_batch(scale_adv=1.0):
    # logp = [[−1, −3], [−.5, −3.5]]: l̄ = −2; Â = (+s, −s): Ā = 0
    # cov = (Â − Ā)(logp − l̄): row 0 (s·1, s·(−1)) = (s, −s); row 1 (−s·1.5, −s·(−1.5)) = (−1.5s, 1.5s)
    return _t([[-1.0, -3.0], [-0.5, -3.5]]), _t([scale_adv, -scale_adv]), torch.ones(2, 2, dtype=f64)


def test_covariance_by_hand():
    logp, adv, mask = _cov_batch()
    assert rules.covariance(logp, adv.unsqueeze(-1), mask).tolist() == [[1.0, -1.0], [-1.5, 1.5]]
    assert rules.select_count(2e-4, 4) == 1 and rules.select_count(0.5, 4) == 2 and rules.select_count(0.3, 10) == 3


def test_kl_cov_by_hand():
    # k = max(⌊.25·4⌋, 1) = 1: the largest covariance, 1.5 at (1, 1), gets the penalty κ|log r|
    # log r = 0 everywhere but (1, 1), where log r = .2 (r = 1.221403), Â = −1, κ = .5:
    #   ℓ = −Â·r + κ·|log r| = 1.221403 + .1 = 1.321403; the others −Â: (−1, −1, 1)
    #   token-mean: (−1 − 1 + 1 + 1.321403)/4 = 0.080351
    #   ∂ℓ/∂logp = −Â·r + κ·sgn(log r): (−1, −1, 1, 1.721403)/4
    logp, adv, mask = _cov_batch()
    old = logp - _t([[0.0, 0.0], [0.0, 0.2]])
    loss, grad, m = _run("kl_cov", logp, old, adv, mask, kl_cov_ratio=0.25, ppo_kl_coef=0.5)
    r = math.exp(0.2)
    assert loss == pytest.approx((-1 - 1 + 1 + r + 0.1) / 4, rel=1e-12)
    assert grad.flatten().tolist() == pytest.approx([-0.25, -0.25, 0.25, (r + 0.5) / 4], rel=1e-12)
    assert m["penalty/token_frac"].item() == pytest.approx(0.25)
    assert m["penalty/mean"].item() == pytest.approx(0.1 / 4)
    assert m["penalty/grad_share"].item() == pytest.approx(0.5 / (3 + r + 0.5))  # Σ|g| = .5, Σ|c·Â| = 3 + r


def test_kl_cov_breaks_a_tie_by_position():
    # logp = [[−1, −3], [−1, −3]], Â = (1, −1): cov = (1, −1, −1, 1), a tie for the largest at (0, 0) and (1, 1):
    # the stable sort keeps the earlier token (verl's topk leaves a tie unspecified; its cross-checks have none)
    logp, adv, mask = _t([[-1.0, -3.0], [-1.0, -3.0]]), _t([1.0, -1.0]), torch.ones(2, 2, dtype=f64)
    sel = rules.kl_cov_select(logp, adv.unsqueeze(-1), mask, ratio=0.25)
    assert sel.tolist() == [[True, False], [False, False]]


def test_clip_cov_by_hand_takes_every_candidate_when_k_allows():
    # Â = (2, −2): cov = (2, −2, −3, 3). Band (1, 5): (0, 0) at 2 and (1, 1) at 3.
    # (1, 1) has r = .7 with Â = −2: r < .8, the clip is active (max(1.4, 1.6) = 1.6), so it is no candidate.
    # k = max(⌊.5·4⌋, 1) = 2 ≥ 1 candidate: (0, 0) is detached.
    # ℓ: (0, 0) 0 (detached); (0, 1) −Â·r = −2; (1, 0) +2; (1, 1) 1.6 (clipped). token-mean (0 − 2 + 2 + 1.6)/4 = .4
    # ∇: (0, −2, 2, 0)/4
    logp, adv, mask = _cov_batch(2.0)
    old = logp - torch.log(_t([[1.0, 1.0], [1.0, 0.7]]))
    loss, grad, m = _run("clip_cov", logp, old, adv, mask, clip_cov_ratio=0.5)
    assert loss == pytest.approx(0.4, rel=1e-12)
    assert grad.flatten().tolist() == pytest.approx([0.0, -0.5, 0.5, 0.0], abs=1e-12)
    assert m["clipfrac"].item() == pytest.approx(0.25)  # verl's pg_clipfrac: the share detached
    assert m["clipfrac_low"].item() == pytest.approx(0.25)  # the PPO clip's own cut at (1, 1)
    # the starvation question: half of the positive row's advantage mass was detached (|2| of |2| + |2|)
    assert m["corr/silenced_adv_share/pos"].item() == pytest.approx(0.5)
    assert m["corr/silenced_adv_share/neg"].item() == 0.0


def test_clip_cov_draws_k_of_the_candidates_with_torchs_generator():
    # Â = (2, −2), r = 1 everywhere: candidates (0, 0) cov 2 and (1, 1) cov 3 (row-major order); k = 1 of 2.
    # The draw is torch.randperm(2) from the global generator: the candidate at perm[0] is detached.
    logp, adv, mask = _cov_batch(2.0)
    for seed in range(4):
        torch.manual_seed(seed)
        expected = [(0, 0), (1, 1)][torch.randperm(2)[0].item()]
        torch.manual_seed(seed)
        keep = rules.clip_cov_keep(logp, adv.unsqueeze(-1), mask, torch.zeros(2, 2, dtype=torch.bool), ratio=2e-4,
                                   lb=1.0, ub=5.0)  # fmt: skip
        assert (~keep).nonzero().tolist() == [list(expected)], seed


@pytest.mark.parametrize("name, kw", [("kl_cov", {"kl_cov_ratio": 0.1, "ppo_kl_coef": 1.0}),
                                      ("clip_cov", {"clip_cov_ratio": 0.5, "clip_cov_lb": 0.3})])  # fmt: skip
def test_covariance_rules_select_within_each_micro_batch(name, kw):
    # With row_groups the selection (and the batch means of the covariance) is made within each micro-batch:
    # the loss of the whole batch is then the token-weighted sum of the halves' losses.
    g = torch.Generator().manual_seed(4)
    logp = -3 * torch.rand(8, 6, generator=g, dtype=f64)
    old = logp + 0.2 * torch.randn(8, 6, generator=g, dtype=f64)
    adv, mask = 2 * torch.randn(8, generator=g, dtype=f64), torch.ones(8, 6, dtype=f64)
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    whole, _, _ = _run(name, logp, old, adv, mask, row_groups=groups, **kw)
    halves = [_run(name, logp[s], old[s], adv[s], mask[s], **kw)[0] for s in (slice(0, 4), slice(4, 8))]
    assert whole == pytest.approx(sum(halves) / 2, rel=1e-12)
    together, _, _ = _run(name, logp, old, adv, mask, **kw)
    assert together != pytest.approx(whole, rel=1e-9)  # one selection over the batch differs: not invariant


# --------------------------------------------------------------------------------------------------
# prime-rl's default loss (hand-worked from prime-rl 0.8.0's default_loss_fn)
# --------------------------------------------------------------------------------------------------


def test_prime_rl_by_hand():
    # p = π_θ, q = the sampler's probability, δ = .2, τ_A = 1, τ_KL = 1e-3 (prime-rl's defaults):
    #   row 0, Â = +1: (p, q) = (.5, .25): p − q = .25 > .2, masked;  (.2, .25): −.05, kept, w = .8
    #   row 1, Â = −1: (.1, .4): p − q = −.3 < −.2, masked;           (.5, .4): .1, kept, w = 1.25
    # ℓ = −M·Â·w + 1e-3·(log w)² on every token: (log w)² = (.480453, .049793, 1.921812, .049793)
    #   Σℓ = −.8 + 1.25 + 1e-3·2.501851 = .452502; token-mean /4 = .113125
    # ∂ℓ/∂logp = −M·Â·w + 2e-3·log w: (1.386294e-3, −.800446, −2.772589e-3, 1.250446)/4
    logp, q = torch.log(_t([[0.5, 0.2], [0.1, 0.5]])), torch.log(_t([[0.25, 0.25], [0.4, 0.4]]))
    adv, mask = _t([1.0, -1.0]), torch.ones(2, 2, dtype=f64)
    loss, grad, m = _run("prime_rl", logp, q, adv, mask)
    sq = [math.log(2) ** 2, math.log(0.8) ** 2, math.log(0.25) ** 2, math.log(1.25) ** 2]
    assert loss == pytest.approx((-0.8 + 1.25 + 1e-3 * sum(sq)) / 4, rel=1e-12)
    expected = [2e-3 * math.log(2), -0.8 + 2e-3 * math.log(0.8), 2e-3 * math.log(0.25), 1.25 + 2e-3 * math.log(1.25)]
    assert grad.flatten().tolist() == pytest.approx([e / 4 for e in expected], rel=1e-12)
    assert m["corr/masked_tokens"].item() == 0.5 and m["clipfrac"].item() == 0.5  # prime-rl's is_masked
    assert m["corr/silenced_adv_share/pos"].item() == 0.5 and m["corr/silenced_adv_share/neg"].item() == 0.5
    # adv_tau scales the advantage term only: τ_A = 2 doubles −Â·w, not the (log w)² term
    loss2, _, _ = _run("prime_rl", logp, q, adv, mask, adv_tau=2.0)
    assert loss2 == pytest.approx((2 * (-0.8 + 1.25) + 1e-3 * sum(sq)) / 4, rel=1e-12)


def test_prime_rl_sees_the_sampler_through_the_rollout_weight():
    # prime-rl's ratio is against the inference log-probs: with old_logp = log q + log ρ and the rollout weight
    # ρ = π_old/π_sampler passed as rollout_log_ratio, w = π_θ/π_sampler and q are unchanged, so is everything
    logp, q = torch.log(_t([[0.5, 0.2], [0.1, 0.5]])), torch.log(_t([[0.25, 0.25], [0.4, 0.4]]))
    adv, mask = _t([1.0, -1.0]), torch.ones(2, 2, dtype=f64)
    log_rho = _t([[0.3, -0.2], [0.1, 0.4]])
    a = _run("prime_rl", logp, q, adv, mask)
    b = _run("prime_rl", logp, q + log_rho, adv, mask, rollout_log_ratio=log_rho)
    assert b[0] == pytest.approx(a[0], rel=1e-12) and torch.allclose(b[1], a[1], rtol=1e-12)


# --------------------------------------------------------------------------------------------------
# SkyRL's masks (hand-worked from skyrl 0.3.0's off_policy_correction_utils)
# --------------------------------------------------------------------------------------------------


def test_geometric_sequence_mask_by_hand():
    # W̄ = exp(mean_t log w), kept in [.99, 1.01]:
    #   (.01, .01) → e^.01 = 1.010050 > 1.01 masked;  (.005, .005) → 1.005013 kept
    #   (−.03, .01) → e^−.01 = .990050 kept;           (−.03, 0) → e^−.015 = .985112 masked
    #   (−.02, .01, ·) with the third token off the mask → e^−.005 = .995012 kept (the mean is over valid tokens)
    log_w = _t([[0.01, 0.01, 0], [0.005, 0.005, 0], [-0.03, 0.01, 0], [-0.03, 0.0, 0], [-0.02, 0.01, 5.0]])
    mask = _t([[1, 1, 0], [1, 1, 0], [1, 1, 0], [1, 1, 0], [1, 1, 0]])
    keep = rules.sequence_ratio_keep(log_w * mask, mask, metric="geometric", lo=0.99, hi=1.01)
    assert keep[:, 0].tolist() == [False, True, True, False, True] and not keep[:, 2].any()


def test_product_sequence_mask_by_hand():
    # W = exp(Σ_t log w), kept in [.5, 2]: (.5, .3) → 2.225541 masked; (.5, .1) → 1.822119 kept;
    # (−.4, −.4) → .449329 masked
    log_w, mask = _t([[0.5, 0.3], [0.5, 0.1], [-0.4, -0.4]]), torch.ones(3, 2, dtype=f64)
    keep = rules.sequence_ratio_keep(log_w, mask, metric="product", lo=0.5, hi=2.0)
    assert keep[:, 0].tolist() == [False, True, False]


def test_outlier_token_mask_by_hand():
    # a row leaves when any valid token's w is above 100 or below 1e-4:
    #   w = (150, 1) masked; (5e-5, 1) masked; (50, 1e-3) kept; (1, 1) with 150 off the mask kept
    log_w = torch.log(_t([[150.0, 1.0], [5e-5, 1.0], [50.0, 1e-3], [1.0, 150.0]]))
    mask = _t([[1, 1], [1, 1], [1, 1], [1, 0]])
    keep = rules.outlier_token_keep(log_w, mask, lo=1e-4, hi=100.0)
    assert keep[:, 0].tolist() == [False, False, True, True]
    # one side off: without a lower bound only the 150 row leaves
    assert rules.outlier_token_keep(log_w, mask, lo=None, hi=100.0)[:, 0].tolist() == [False, True, True, True]


def test_skyrl_masks_on_skyrls_regular_ppo_loss():
    # SkyRL's ppo_policy_loss ("regular"): ℓ = −min(r·Â, clip(r, .8, 1.2)·Â) per token, then loss_mask ·= the
    # sequence mask, summed with the advantages pre-divided by the batch's token count (token_mean): the rejected
    # rows weigh 0 and still count in the normaliser. respo: product_mask with base grpo without its dual clip.
    # Row 0: log w = (.5, .3), Σ .8 → masked. Row 1: log w = (.2, −.1), Σ .1 → kept, Â = 1:
    #   r = (1.221403, .904837): ℓ = (−1.2, −.904837) (the first clipped at 1.2); Σ over 4 tokens /4 = −.526209
    logp = _t([[-1.0, -1.0], [-1.0, -1.0]])
    old = logp - _t([[0.5, 0.3], [0.2, -0.1]])
    adv, mask = _t([1.0, 1.0]), torch.ones(2, 2, dtype=f64)
    loss, grad, m = _run("product_mask", logp, old, adv, mask, base_kwargs={"clip_ratio_c": None})
    assert loss == pytest.approx((-1.2 - math.exp(-0.1)) / 4, rel=1e-12)
    assert grad.flatten().tolist() == pytest.approx([0, 0, 0, -math.exp(-0.1) / 4], abs=1e-12)
    assert m["rs/masked_seqs"].item() == 0.5 and m["rs/silenced_adv_share/pos"].item() == 0.5


def test_skyrl_masks_compose_with_any_base_and_see_the_rollout_weight():
    # the mask reads log w = logp − old_logp + log ρ: ρ alone (the training/inference mismatch, SkyRL's own ratio
    # π_old/π_rollout at its first step) can reject a row the staleness alone keeps
    logp = _t([[-1.0, -1.0]])
    mask, adv = torch.ones(1, 2, dtype=f64), _t([1.0])
    _, _, plain = _run("geo_mask", logp, logp, adv, mask, base="reinforce")
    _, grad, rejected = _run("geo_mask", logp, logp, adv, mask, base="reinforce", rollout_log_ratio=_t([[0.05, 0.05]]))
    assert plain["rs/masked_seqs"].item() == 0.0 and rejected["rs/masked_seqs"].item() == 1.0
    assert grad.abs().max().item() == 0.0


# --------------------------------------------------------------------------------------------------
# TRL's two-sided clip
# --------------------------------------------------------------------------------------------------


def test_two_sided_clip_by_hand():
    # ε = .2, δ = 4; ℓ = −min(min(r, δ)·Â, clip(r, .8, 1.2)·Â):
    #   Â = −1, r = 5: −min(−4, −1.2) = 4, no gradient (min(r, δ) is flat above δ)
    #   Â = −1, r = 2: −min(−2, −1.2) = 2, ∂ℓ/∂logp = −Â·r = 2
    #   Â = +1, r = 2: −min(2, 1.2) = −1.2, no gradient
    #   Â = +1, r = .5: −min(.5, .8) = −.5, ∂ = −.5
    # rows: (Â = −1: r = 5, 2), (Â = +1: r = 2, .5); token-mean over 4
    logp = _t([[-1.0, -1.0], [-1.0, -1.0]])
    old = logp - torch.log(_t([[5.0, 2.0], [2.0, 0.5]]))
    loss, grad, m = _run("two_sided", logp, old, _t([-1.0, 1.0]), torch.ones(2, 2, dtype=f64))
    assert loss == pytest.approx((4 + 2 - 1.2 - 0.5) / 4, rel=1e-12)
    assert grad.flatten().tolist() == pytest.approx([0, 0.5, 0, -0.125], abs=1e-12)
    assert m["clipfrac_dual"].item() == 0.25 and m["clipfrac_high"].item() == 0.25


def test_two_sided_below_one_plus_epsilon_by_hand():
    # δ = 1.1 < 1 + ε = 1.2, r = 1.15: Â = −1: −min(−1.1, −1.15) = 1.15 through clip(r) = r (inside), ∂ = 1.15;
    # Â = +1: −min(1.1, 1.15) = −1.1, flat (min(r, δ) = δ), ∂ = 0
    logp = _t([[-1.0], [-1.0]])
    old = logp - math.log(1.15)
    loss, grad, _ = _run("two_sided", logp, old, _t([-1.0, 1.0]), torch.ones(2, 1, dtype=f64), delta=1.1)
    assert loss == pytest.approx((1.15 - 1.1) / 2, rel=1e-12)
    assert grad.flatten().tolist() == pytest.approx([1.15 / 2, 0.0], abs=1e-12)


def test_two_sided_is_ppos_dual_clip_at_delta_when_delta_exceeds_one_plus_epsilon():
    # for δ ≥ 1 + ε_h: Â > 0 min(r, δ, clip r) = min(r, clip r); Â < 0 max(min(r, δ), clip r) = min(max(r, clip r), δ)
    g = torch.Generator().manual_seed(6)
    logp = -3 * torch.rand(16, 8, generator=g, dtype=f64)
    old = logp + 0.8 * torch.randn(16, 8, generator=g, dtype=f64)
    adv, mask = torch.randn(16, generator=g, dtype=f64), torch.ones(16, 8, dtype=f64)
    a = _run("two_sided", logp, old, adv, mask, delta=2.5)
    b = _run("grpo", logp, old, adv, mask, clip_ratio_c=2.5)
    assert a[2]["clipfrac_dual"].item() > 0  # the bound acts on this batch
    assert a[0] == pytest.approx(b[0], rel=1e-12) and torch.allclose(a[1], b[1], rtol=1e-12, atol=1e-15)


# --------------------------------------------------------------------------------------------------
# Every new rule: the on-policy floor, bad hyperparameters
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [n for n in NEW if n != "clip_cov"])
def test_on_policy_gradient_is_reinforces(name):
    # at logp = old_logp (r = w = 1, log r = 0) the penalties' gradients vanish, the masks keep every token and
    # every clip is inactive: the gradient is REINFORCE's −Â/N (clip_cov detaches tokens whatever r is)
    g = torch.Generator().manual_seed(7)
    logp = -3 * torch.rand(6, 5, generator=g, dtype=f64)
    adv, mask = torch.randn(6, generator=g, dtype=f64), torch.ones(6, 5, dtype=f64)
    _, grad, m = _run(name, logp, logp, adv, mask)
    _, ref, _ = _run("reinforce", logp, logp, adv, mask)
    assert torch.allclose(grad, ref, rtol=1e-12, atol=1e-15), name
    assert m["frac_starved"].item() == 0.0


def test_clip_cov_on_policy_is_reinforce_but_on_the_tokens_it_detaches():
    # r = 1 is inside the clip, but the covariance selection does not look at r: k = max(⌊.1·30⌋, 1) = 3 tokens of
    # the band lose their gradient, every other token has REINFORCE's
    g = torch.Generator().manual_seed(8)
    logp = -3 * torch.rand(6, 5, generator=g, dtype=f64)
    adv, mask = 2 * torch.randn(6, generator=g, dtype=f64), torch.ones(6, 5, dtype=f64)
    _, grad, m = _run("clip_cov", logp, logp, adv, mask, clip_cov_ratio=0.1, clip_cov_lb=0.1)
    _, ref, _ = _run("reinforce", logp, logp, adv, mask)
    differs = (grad - ref).abs() > 0
    assert int(differs.sum()) == 3 and grad[differs].abs().max().item() == 0.0
    assert m["corr/masked_tokens"].item() == pytest.approx(3 / 30)


@pytest.mark.parametrize("name, kw, message", [
    ("dro", {"beta": 0.0}, "dro: beta must be > 0, got 0.0"),
    ("kl_cov", {"kl_cov_ratio": 0.0}, "kl_cov: kl_cov_ratio must be > 0, got 0.0"),
    ("kl_cov", {"kl_cov_ratio": 2.0}, "kl_cov: kl_cov_ratio is a fraction of the tokens, in (0, 1], got 2.0"),
    ("kl_cov", {"ppo_kl_coef": -1.0}, "kl_cov: ppo_kl_coef must be >= 0, got -1.0"),
    ("clip_cov", {"clip_cov_lb": 5.0}, "clip_cov: need clip_cov_lb < clip_cov_ub, got 5.0 and 5.0"),
    ("clip_cov", {"clip_cov_ratio": 1.5}, "clip_cov: clip_cov_ratio is a fraction of the tokens, in (0, 1], got 1.5"),
    ("prime_rl", {"kl_tau": -1e-3}, "prime_rl: kl_tau must be >= 0, got -0.001"),
    ("prime_rl", {"delta_high": float("nan")}, "prime_rl: delta_high must be finite, got nan"),
    ("geo_mask", {"lo": 1.01, "hi": 0.99}, "geo_mask: need 0 <= lo < hi, got lo=1.01, hi=0.99"),
    ("geo_mask", {"base": "geo_mask"}, "geo_mask: base must be the name of another objective, got 'geo_mask'"),
    ("product_mask", {"base": "nope"}, "unknown objective 'nope'"),
    ("outlier_mask", {"lo": None, "hi": None}, "outlier_mask: lo and hi are both None; set at least one bound"),
    ("outlier_mask", {"lo": 2.0, "hi": 1.0}, "outlier_mask: need lo < hi, got lo=2.0, hi=1.0"),
    ("two_sided", {"delta": 0.0}, "two_sided: delta must be > 0, got 0.0"),
    ("two_sided", {"clip_ratio_low": 1.0}, "two_sided: clip_ratio_low"),
])  # fmt: skip
def test_bad_hyperparameters_are_named_in_one_line(name, kw, message):
    with pytest.raises(ValueError) as err:
        build_objective(name, **kw)
    text = str(err.value)
    assert "\n" not in text and message in text, text
