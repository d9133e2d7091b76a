"""Importance ratios between the current policy and the behaviour policy.

    log W_i = clamp( Σ_t m_it (logp_it − old_logp_it) [+ Σ_t m_it log ρ_it], −c, c )      (sequence)
    log s_i = clamp( (1/T_i) Σ_t m_it (logp_it − old_logp_it) [+ …], −c, c )              (GSPO)

References:
    Chen, Ban, Hsieh (2026), ReSPO, arXiv 2609.35433, sec. 2.
    Zheng et al. (2025), Group Sequence Policy Optimization, arXiv 2507.18071.
"""

from __future__ import annotations

from typing import Optional

import torch

LOG_W_CLAMP = 20.0


def sequence_log_ratio(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    rollout_log_ratio: Optional[torch.Tensor] = None,
    length_normalize: bool = False,
    clamp: float = LOG_W_CLAMP,
) -> torch.Tensor:
    """Sequence-level log importance weight log W (or GSPO's length-normalised log s).

    Args:
      logp: (B, T) log π_θ of the response tokens (may carry grad).
      old_logp: (B, T) log π_old of the same tokens.
      mask: (B, T) 1 for valid response tokens, 0 elsewhere (bool or float).
      rollout_log_ratio: optional (B, T) per-token log ρ (rollout correction), added in log space.
      length_normalize: divide by the number of valid tokens T_i (GSPO's s_i); an all-masked row gives 0.
      clamp: log W is clamped to [−clamp, clamp] before any kernel.

    Returns:
      (B,) log W, differentiable w.r.t. ``logp`` inside the clamp range.
    """
    if logp.shape != old_logp.shape or logp.shape != mask.shape:
        raise ValueError(
            f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)} and mask {tuple(mask.shape)} must share one shape"
        )
    m = mask.to(logp.dtype)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    keep = m > 0
    log_r = torch.where(keep, logp - old_logp, zero)  # (B, T)
    if rollout_log_ratio is not None:
        if rollout_log_ratio.shape != logp.shape:
            raise ValueError(
                f"rollout_log_ratio shape {tuple(rollout_log_ratio.shape)} does not match logp shape {tuple(logp.shape)}"
            )
        log_r = log_r + torch.where(keep, rollout_log_ratio.to(logp.dtype), zero)
    log_w = log_r.sum(dim=-1)  # (B,)
    if length_normalize:
        log_w = log_w / m.sum(dim=-1).clamp(min=1)
    return log_w.clamp(-clamp, clamp)


def token_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, clamp: float = LOG_W_CLAMP) -> torch.Tensor:
    """Per-token log r_it = clamp(logp − old_logp, −clamp, clamp), shape (B, T) (PPO/GRPO's ratio)."""
    return (logp - old_logp).clamp(-clamp, clamp)
