"""The ReSPO reference recipe's fold of rejected tokens against respo's, on the same inputs, worked by hand.

The reference recipe (ReSPO-code, ``recipe/respo/core_algos.py``) folds verl's ``rollout_is_weights`` into
the sequence log W as Σ_t log(max(w_t, 1e-8)). With a rejection rule on (IcePop, ``rollout_rs``, MIS) a
rejected token has w = 0, so it adds log(1e-8) = −18.42 to log W and the sequence's W becomes ~1e-8.
respo's fold (`respo.core.ratios.fold_rollout_log_ratio`) removes a rejected token from log W and from the
loss instead. The reference formula is computed here by hand, not with respo's kernels.
"""

import math

import pytest
import torch

from respo.integrations.verl import reshaped_policy_loss


def _reference_phi(log_w: float, positive: bool) -> float:
    # ReSPO's published kernels, by hand: phi = u * exp(lam * (1 - u)), lam = 2, with
    #   positive (alpha 2, beta .5): u = (1 - beta) + beta * W        (the power mean at p = alpha - 1 = 1)
    #   negative (alpha 1, beta .5): u = W ** beta                    (its alpha = 1 limit)
    w = math.exp(max(-20.0, min(20.0, log_w)))
    u = 0.5 + 0.5 * w if positive else w ** 0.5
    return u * math.exp(2.0 * (1.0 - u))


def test_a_rejected_token_starves_nothing_in_respo_and_maxes_the_positive_branch_in_the_reference():
    # two on-policy rows of 4 tokens (logp = old_logp, so staleness gives log W = 0), a positive and a negative
    # one, each with one token rejected by the rollout correction (w = 0)
    old = torch.full((2, 4), -1.0, dtype=torch.float64)
    logp = old.clone().requires_grad_(True)
    adv = torch.tensor([[1.0] * 4, [-1.0] * 4], dtype=torch.float64)
    mask = torch.ones(2, 4, dtype=torch.float64)
    w = torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 0.0, 1.0, 1.0]], dtype=torch.float64)

    # the reference: log W = sum_t log(max(w_t, 1e-8)) = log 1e-8 = -18.4207 for both rows;
    # phi+ = (0.5 + 0.5e-8) * exp(2 * (0.5 - 0.5e-8)) = 0.5 e = 1.35914, the positive branch's largest value
    # (u e^{2(1-u)} falls for u > 1/2); phi- = 1e-4 * exp(2 * (1 - 1e-4)) = 7.3876e-4, next to nothing.
    # Its loss keeps the rejected token: -phi * A * logp over all 8 tokens, token-mean, so every token's
    # gradient is -phi * A / 8.
    log_w_ref = sum(math.log(max(x, 1e-8)) for x in (1.0, 1.0, 0.0, 1.0))
    assert log_w_ref == pytest.approx(-18.420681, abs=1e-6)
    phi_pos, phi_neg = _reference_phi(log_w_ref, True), _reference_phi(log_w_ref, False)
    assert phi_pos == pytest.approx(0.5 * math.e, rel=1e-7) and phi_neg == pytest.approx(7.3876e-4, rel=1e-4)
    ref_grad = torch.tensor([[-phi_pos / 8] * 4, [phi_neg / 8] * 4], dtype=torch.float64)

    # respo: the rejected token leaves log W (log W = 0, phi = 1 on both branches) and the loss (gradient 0);
    # the normaliser keeps it as verl's does, so a kept token's gradient is -1 * A / 8
    loss, metrics = reshaped_policy_loss(old, logp, adv, mask, "token-mean", rollout_is_weights=w, objective="respo")
    loss.backward()
    want = torch.tensor([[-1 / 8, -1 / 8, 0.0, -1 / 8], [1 / 8, 0.0, 1 / 8, 1 / 8]], dtype=torch.float64)
    torch.testing.assert_close(logp.grad, want, rtol=1e-12, atol=1e-12)
    # the two semantics differ on every kept token (the reference gives the positive row 1.36x its on-policy
    # coefficient and the negative row almost none), and the reference still trains the rejected tokens
    kept = w > 0
    assert (logp.grad - ref_grad)[kept].abs().min() > 0.04  # row 0: 0.1699 - 0.125; row 1: 0.125 - 0.0001
    assert ref_grad[0, 2] != 0 and ref_grad[1, 1] != 0 and logp.grad[0, 2] == 0 and logp.grad[1, 1] == 0
