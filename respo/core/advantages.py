"""Group-relative advantages: G responses per prompt, contiguous in the batch.

    grpo    Â_i = (r_i − mean_G r) / (std_G r + ε)       (unbiased std, as GRPO/verl)
    drgrpo  Â_i =  r_i − mean_G r                         (Dr. GRPO: no std division)
    rloo    Â_i =  r_i − (Σ_{j≠i} r_j)/(G − 1)            (leave-one-out baseline)

References:
    Shao et al. (2024), DeepSeekMath (GRPO); Liu et al. (2025), Understanding R1-Zero-Like Training
    (Dr. GRPO); Ahmadian et al. (2024), Back to Basics (RLOO).
"""

from __future__ import annotations

import torch

ADVANTAGE_KINDS = ("grpo", "drgrpo", "rloo")


def group_advantages(rewards: torch.Tensor, group_size: int, *, kind: str = "grpo", eps: float = 1e-6) -> torch.Tensor:
    """Advantages for rewards laid out as consecutive groups of ``group_size`` responses.

    Args:
      rewards: (N·G,) scalar rewards, groups contiguous.
      group_size: G ≥ 2.
      kind: ``grpo`` | ``drgrpo`` | ``rloo``.
      eps: added to the group std (``grpo`` only).

    Returns:
      (N·G,) advantages, detached, in rewards' floating dtype (float32 for integer rewards).
    """
    if kind not in ADVANTAGE_KINDS:
        raise ValueError(f"unknown advantage kind {kind!r}; valid kinds: {', '.join(ADVANTAGE_KINDS)}")
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 2:
        raise ValueError(f"group_size must be an integer >= 2 (group advantages need a baseline), got {group_size!r}")
    if not isinstance(rewards, torch.Tensor) or rewards.dim() != 1:
        shape = tuple(rewards.shape) if isinstance(rewards, torch.Tensor) else type(rewards).__name__
        raise ValueError(f"rewards must be a 1-D tensor of N*G values, got {shape}")
    if rewards.numel() % group_size:
        raise ValueError(f"rewards has {rewards.numel()} values, not a multiple of group_size={group_size}")
    r = rewards.detach()
    if not r.is_floating_point():
        r = r.float()
    bad = ~torch.isfinite(r)
    if bool(bad.any()):
        raise ValueError(f"rewards hold {int(bad.sum())} non-finite value(s)")
    g = r.view(-1, group_size)  # (N, G)
    mean = g.mean(dim=-1, keepdim=True)  # (N, 1)
    if kind == "grpo":
        adv = (g - mean) / (g.std(dim=-1, keepdim=True) + eps)
    elif kind == "drgrpo":
        adv = g - mean
    else:  # rloo: r_i − (G·mean − r_i)/(G−1) = G/(G−1)·(r_i − mean)
        adv = (g - mean) * (group_size / (group_size - 1))
    return adv.reshape(-1)
