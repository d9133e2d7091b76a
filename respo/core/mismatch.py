"""The training–inference mismatch: how far an inference engine's log-probs are from the trainer's.

An engine (vLLM in bfloat16, say) reports the log-probability ``rollout_logp`` of each token it sampled; the
trainer recomputes the same tokens under the same weights as ``old_logp``. Their difference is not
staleness (the weights are the same) but numerics, and it is what the rollout corrections of verl's
``algorithm.rollout_correction`` were built for. Per token and per sequence,

    log ρ_it = old_logp_it − rollout_logp_it              (π_trainer / π_engine)
    log ρ_i  = Σ_t m_it log ρ_it

`mismatch_metrics` measures it with verl's ``rollout_corr/*`` names where verl has the metric
(``kl``, ``k3_kl``, ``log_ppl_abs_diff``, ``chi2_token``, ``chi2_seq``) and adds the per-token mean |log ρ|
and the spread of the sequence log-ratio. `rollout_correction_weights` turns log ρ into the weights of
one of verl's correction presets, which the objectives fold into their loss with
`respo.core.ratios.fold_rollout_log_ratio` (log W then stays a pure measure of staleness: ρ enters as its
own factor).

    token-tis  w_it = min(ρ_it, C)                   (verl rollout_is="token", truncated)
    seq-tis    w_i  = min(ρ_i, C) on every token     (verl rollout_is="sequence")
    token-mis  w_it = ρ_it · 1[ρ_it ≤ C]             (verl rollout_rs="token": rejection above C)
    seq-mis    w_i  = ρ_i · 1[ρ_i ≤ C]               (verl rollout_rs="sequence")

References:
    verl ``verl/trainer/ppo/rollout_corr_helper.py`` (0.9.1): ``compute_offpolicy_metrics`` and the
    ``rollout_is`` / ``rollout_rs`` modes with ``rollout_is_threshold`` (default 2.0).
"""

from __future__ import annotations

from typing import Dict, Tuple

import torch

from respo.core.ratios import LOG_W_CLAMP

__all__ = ["ROLLOUT_CORRECTIONS", "mismatch_metrics", "nonfinite_rows", "rollout_correction_weights"]

ROLLOUT_CORRECTIONS = ("off", "token-tis", "seq-tis", "token-mis", "seq-mis")


def _masked_log_rho(old_logp: torch.Tensor, rollout_logp: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """(B, T) log ρ = old_logp − rollout_logp on valid tokens, 0 elsewhere (selected, not multiplied: NaN · 0 is NaN)."""
    diff = old_logp.float() - rollout_logp.float()
    return torch.where(m > 0, diff, torch.zeros_like(diff))


def nonfinite_rows(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) bool: the rows with a non-finite trainer or engine log-prob on a valid token (padding is not read)."""
    valid = mask.float() > 0
    return (valid & ~(torch.isfinite(old_logp.float()) & torch.isfinite(rollout_logp.float()))).any(-1)


def mismatch_metrics(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor,
                     prefix: str = "rollout_corr/") -> Dict[str, torch.Tensor]:
    """Mismatch between the trainer's and the engine's log-probs of the same tokens (detached 0-d tensors).

        abs_diff          Σ m |log ρ| / Σ m                         per-token mean |Δ logp|
        kl                Σ m (rollout_logp − old_logp) / Σ m        k1 estimate of KL(π_engine ‖ π_trainer)
        k3_kl             Σ m (ρ − log ρ − 1) / Σ m                  k3 estimate (≥ 0)
        log_ppl_abs_diff  mean_i |mean_t log ρ_it|                   per-sequence log-perplexity gap
        chi2_token        Σ m ρ² / Σ m − 1
        chi2_seq          mean_i exp(2 log ρ_i) − 1                  (log ρ_i clamped to ±20)
        seq_log_ratio_p10, seq_log_ratio_p90   quantiles of log ρ_i over the rows with a token
        seq_frac_beyond_1                      fraction of those rows with |log ρ_i| > 1

    Computed in float32 whatever the inputs' dtype. Rows without a valid token are left out, and so are rows
    with a non-finite log-prob on a valid token, counted as ``nonfinite_rows``; values at padded positions are
    never read (a NaN there changes nothing).

    Args:
        old_logp: (B, T) the trainer's log-probs.
        rollout_logp: (B, T) the engine's log-probs of the same tokens.
        mask: (B, T) 0/1 valid tokens.
    """
    with torch.no_grad():
        bad = nonfinite_rows(old_logp, rollout_logp, mask)  # (B,) left out, counted
        m = ((mask.float() > 0) & ~bad.unsqueeze(-1)).float()  # (B, T) the valid tokens of the other rows
        log_rho = _masked_log_rho(old_logp, rollout_logp, m)  # (B, T)
        n_tok = m.sum().clamp(min=1)
        per_row = m.sum(-1)  # (B,)
        rows = per_row > 0  # (B,)
        seq = log_rho.sum(-1)[rows]  # (R,)
        rho = torch.exp(log_rho.clamp(-LOG_W_CLAMP, LOG_W_CLAMP))  # (B, T)
        out = {
            "abs_diff": log_rho.abs().sum() / n_tok,
            "kl": -log_rho.sum() / n_tok,
            "k3_kl": ((rho - log_rho - 1) * m).sum() / n_tok,
            "log_ppl_abs_diff": (log_rho.sum(-1)[rows] / per_row[rows]).abs().mean(),
            "chi2_token": (rho.square() * m).sum() / n_tok - 1,
            "chi2_seq": torch.exp(2 * seq.clamp(-LOG_W_CLAMP, LOG_W_CLAMP)).mean() - 1,
            "seq_log_ratio_p10": torch.quantile(seq, 0.1) if seq.numel() else seq.new_tensor(float("nan")),
            "seq_log_ratio_p90": torch.quantile(seq, 0.9) if seq.numel() else seq.new_tensor(float("nan")),
            "seq_frac_beyond_1": (seq.abs() > 1).float().mean(),
            "nonfinite_rows": bad.sum().float(),
        }
    return {prefix + k: v.detach() for k, v in out.items()}


def rollout_correction_weights(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, mode: str,
                               threshold: float = 2.0) -> Tuple[torch.Tensor, str]:
    """The correction weights of ``mode`` (see the module docstring) and their level for the fold.

    Args:
        old_logp, rollout_logp: (B, T) the trainer's and the engine's log-probs of the same tokens.
        mask: (B, T) 0/1 valid tokens.
        mode: one of ``ROLLOUT_CORRECTIONS`` other than ``off``.
        threshold: C > 0, the truncation cap (tis) or the rejection bound (mis).

    Returns:
        (weights (B, T) float32, detached, a sequence weight repeated on its row's tokens; ``"token"`` or
        ``"sequence"``), ready for ``fold_rollout_log_ratio(weights, mask, level=level)``.
    """
    if mode not in ROLLOUT_CORRECTIONS or mode == "off":
        raise ValueError(f"rollout correction mode must be one of {', '.join(ROLLOUT_CORRECTIONS[1:])}, got {mode!r}")
    if not threshold > 0 or threshold == float("inf"):
        raise ValueError(f"rollout correction threshold must be a finite number > 0, got {threshold}")
    with torch.no_grad():
        m = mask.float()  # (B, T)
        log_rho = _masked_log_rho(old_logp, rollout_logp, m)  # (B, T); NaN stays NaN on valid tokens only
        level = "token" if mode.startswith("token") else "sequence"
        if level == "sequence":
            log_rho = log_rho.sum(-1, keepdim=True).expand_as(m)  # (B, T) log ρ_i on every token
        rho = torch.exp(log_rho.clamp(-LOG_W_CLAMP, LOG_W_CLAMP))  # (B, T)
        if mode.endswith("tis"):
            w = rho.clamp(max=threshold)
        else:
            w = torch.where(rho <= threshold, rho, torch.zeros_like(rho))
    return (w * m).detach(), level
