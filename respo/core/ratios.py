"""Importance ratios between the current policy and the behaviour policy.

    log W_i = clamp( Σ_t m_it (logp_it − old_logp_it) [+ Σ_t m_it log ρ_it], −c, c )      (sequence)
    log s_i = clamp( (1/T_i) Σ_t m_it (logp_it − old_logp_it) [+ …], −c, c )              (GSPO)

References:
    Chen, Ban, Hsieh (2026), ReSPO, arXiv 2609.35433, sec. 2.
    Zheng et al. (2025), Group Sequence Policy Optimization, arXiv 2507.18071.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

LOG_W_CLAMP = 20.0  # |log w| bound before any exp (verl's SAFETY_BOUND)


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


ROLLOUT_LEVELS = ("auto", "token", "sequence")


def fold_rollout_log_ratio(
    weights: torch.Tensor, mask: torch.Tensor, *, level: str = "auto", name: str = "rollout weights"
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rollout-correction weights w ≥ 0 (π_old/π_rollout) as the per-token log ρ the objectives take.

        token:     log ρ_it = log w_it            Σ_t m_it log ρ_it = Σ_t log w_it
        sequence:  log ρ_it = log w_it / T_i      Σ_t m_it log ρ_it = log w_i
                   (one weight w_i broadcast to the row's T_i kept tokens is folded once, not T_i times)
        auto:      ``sequence`` for rows whose kept weights are all equal, ``token`` otherwise

    Tokens with w = 0 (rejected by the rollout correction) leave the mask, as a multiplication of
    their loss by 0 removes them; masked positions never reach log ρ.

    Args:
      weights: (B, T) non-negative weights (a sequence weight repeated on every token).
      mask: (B, T) 0/1 (bool or float) validity mask.
      level: ``auto``, ``token`` or ``sequence``.
      name: what the weights are called in error messages.

    Returns:
      (log_rho (B, T), kept mask (B, T)), both in the weights' floating dtype (float32 otherwise).
    """
    if level not in ROLLOUT_LEVELS:
        raise ValueError(f"the rollout weight level must be one of {ROLLOUT_LEVELS}, got {level!r}")
    w = weights.detach()
    if w.shape != mask.shape:
        raise ValueError(f"{name} shape {tuple(w.shape)} does not match the mask shape {tuple(mask.shape)}")
    valid = mask.bool()  # (B, T)
    bad = valid & ~(torch.isfinite(w) & (w >= 0))
    if bool(bad.any()):
        raise ValueError(f"{name} must be finite and >= 0 on valid tokens; {int(bad.any(dim=-1).sum())} row(s) are not")
    keep = valid & (w > 0)  # (B, T)
    dtype = w.dtype if w.is_floating_point() else torch.float32
    zero = torch.zeros((), dtype=dtype, device=w.device)
    log_rho = torch.where(keep, torch.log(torch.where(keep, w.to(dtype), torch.ones_like(w, dtype=dtype))), zero)  # (B, T)
    if level == "token":
        return log_rho, keep.to(dtype)
    n_tok = keep.to(dtype).sum(dim=-1, keepdim=True).clamp(min=1)  # (B, 1)
    if level == "sequence":
        return log_rho / n_tok, keep.to(dtype)
    big = torch.finfo(dtype).max
    w_max = torch.where(keep, w.to(dtype), torch.full_like(log_rho, -big)).amax(dim=-1, keepdim=True)  # (B, 1)
    w_min = torch.where(keep, w.to(dtype), torch.full_like(log_rho, big)).amin(dim=-1, keepdim=True)  # (B, 1)
    return torch.where(w_max == w_min, log_rho / n_tok, log_rho), keep.to(dtype)


@dataclass(frozen=True)
class Clip:
    """PPO's clipped per-token loss and where it cut (every (B, T) bool is detached).

    loss: ℓ with grad; high: Â > 0 and r > 1+ε_h; low: Â < 0 and r < 1−ε_l; dual: Â < 0 and r > c (the
    dual clip; all False without one); clipped: −Â·clip(r) > −Â·r (verl's ``pg_clipfrac``).
    """

    loss: torch.Tensor
    high: torch.Tensor
    low: torch.Tensor
    dual: torch.Tensor
    clipped: torch.Tensor

    @property
    def active(self) -> torch.Tensor:
        """Where the gradient −Â·∇r flows (no cut)."""
        return ~(self.high | self.low | self.dual)


def ppo_clip(adv: torch.Tensor, ratio: torch.Tensor, low: float, high: float, c: Optional[float] = None) -> Clip:
    """PPO's clip, with verl's dual clip for Â < 0 when ``c`` is set (the one implementation).

        ℓ = max(−r·Â, −clip(r, 1−ε_l, 1+ε_h)·Â);   Â < 0 and c set: ℓ = min(ℓ, −c·Â)

    Args:
      adv: (B, 1) or (B, T) advantages; ratio: (B, T) r with grad; low, high: ε_l, ε_h; c: dual clip or None.
    """
    l1 = -adv * ratio
    l2 = -adv * ratio.clamp(1 - low, 1 + high)
    loss = torch.maximum(l1, l2)
    r = ratio.detach()
    cut_high, cut_low = (adv > 0) & (r > 1 + high), (adv < 0) & (r < 1 - low)
    if c is None:
        dual = torch.zeros_like(cut_high)
    else:
        loss = torch.where(adv < 0, torch.minimum(loss, -adv * c), loss)
        dual = (adv < 0) & (r > c)
    return Clip(loss, cut_high, cut_low, dual, l2.detach() > l1.detach())
