"""Input validation for the core: clear errors that name the problem and count the rows.

Every objective validates its tensors once, up front. Two policies for bad rows:

- ``nan_policy="raise"`` (default): a non-finite ``logp``/``old_logp``/``advantages`` value on a
  valid token, or a row with no valid token, raises ``ValueError`` naming the tensor and the number
  of rows affected.
- ``nan_policy="mask"``: such rows are removed from the loss (their mask is zeroed, their values
  replaced by 0 so no NaN reaches the gradient) and counted in the metrics as
  ``bad_rows/nonfinite`` and ``bad_rows/empty``. Nothing is dropped silently.

Values at masked-out positions are never inspected and never reach the loss (they are replaced, not
multiplied by zero: ``NaN * 0`` is ``NaN``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

NAN_POLICIES = ("raise", "mask")


@dataclass
class Batch:
    """Validated, sanitised inputs of one objective call."""

    logp: torch.Tensor  # (B, T), keeps the autograd graph
    old_logp: torch.Tensor  # (B, T), detached
    adv: torch.Tensor  # (B, T), detached, broadcast from (B,) when needed
    seq_adv: torch.Tensor  # (B,), the sequence advantage (masked token mean) used for branching
    mask: torch.Tensor  # (B, T), float 0/1 in logp's dtype
    rollout_log_ratio: Optional[torch.Tensor]  # (B, T) or None, detached
    n_nonfinite: torch.Tensor  # 0-d, rows dropped for NaN/inf (always 0 under "raise")
    n_empty: torch.Tensor  # 0-d, rows with no valid token


def _check_float(name: str, x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")


def _as_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype == torch.bool:
        return mask.to(dtype)
    if mask.is_complex():
        raise TypeError(f"mask must be bool, integer or float with values in {{0, 1}}, got dtype {mask.dtype}")
    bad = ~((mask == 0) | (mask == 1))
    if bool(bad.any()):
        rows = int(bad.any(dim=-1).sum())
        raise ValueError(f"mask must contain only 0 and 1; {rows} row(s) hold other values")
    return mask.to(dtype)


def validate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    rollout_log_ratio: Optional[torch.Tensor] = None,
    nan_policy: str = "raise",
) -> Batch:
    """Check shapes, dtypes and values; return sanitised tensors (see module docstring)."""
    if nan_policy not in NAN_POLICIES:
        raise ValueError(f"nan_policy must be one of {NAN_POLICIES}, got {nan_policy!r}")
    _check_float("logp", logp)
    _check_float("old_logp", old_logp)
    _check_float("advantages", advantages)
    if logp.dim() != 2:
        raise ValueError(f"logp must have shape (B, T), got {tuple(logp.shape)}")
    if old_logp.shape != logp.shape:
        raise ValueError(f"old_logp shape {tuple(old_logp.shape)} does not match logp shape {tuple(logp.shape)}")
    if mask.shape != logp.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not match logp shape {tuple(logp.shape)}")
    B, T = logp.shape
    if B == 0 or T == 0:
        raise ValueError(f"logp must have at least one row and one token, got shape {tuple(logp.shape)}")
    seq_level_adv = advantages.dim() == 1 or advantages.shape == (B, 1)
    if advantages.shape == (B,):
        adv = advantages.unsqueeze(-1).expand_as(logp)
    elif advantages.shape == logp.shape:
        adv = advantages
    elif advantages.shape == (B, 1):
        adv = advantages.expand_as(logp)
    else:
        raise ValueError(
            f"advantages must have shape (B,) = ({B},) or (B, T) = {tuple(logp.shape)}, got {tuple(advantages.shape)}"
        )
    if rollout_log_ratio is not None:
        _check_float("rollout_log_ratio", rollout_log_ratio)
        if rollout_log_ratio.shape != logp.shape:
            raise ValueError(
                f"rollout_log_ratio shape {tuple(rollout_log_ratio.shape)} does not match logp shape {tuple(logp.shape)}"
            )
    dtype = logp.dtype
    m = _as_mask(mask, dtype)
    valid = m > 0  # (B, T)
    old_logp = old_logp.detach().to(dtype)
    adv = adv.detach().to(dtype)
    rlr = None if rollout_log_ratio is None else rollout_log_ratio.detach().to(dtype)

    # One fused pass over the valid tokens: which rows hold a non-finite value, and in which tensor.
    fin_logp = torch.isfinite(logp.detach())
    fin_old = torch.isfinite(old_logp)
    fin_adv = torch.isfinite(adv)
    ok = fin_logp & fin_old & fin_adv
    if rlr is not None:
        ok = ok & torch.isfinite(rlr)
    bad_row = (valid & ~ok).any(dim=-1)  # (B,)
    empty_row = ~valid.any(dim=-1)  # (B,)
    n_bad = bad_row.sum()
    n_empty = empty_row.sum()
    if nan_policy == "raise":
        if bool(n_bad):
            parts = []
            for name, fin in (("logp", fin_logp), ("old_logp", fin_old), ("advantages", fin_adv)):
                k = int((valid & ~fin).any(dim=-1).sum())
                if k:
                    parts.append(f"{name}: {k} row(s)")
            if rlr is not None:
                k = int((valid & ~torch.isfinite(rlr)).any(dim=-1).sum())
                if k:
                    parts.append(f"rollout_log_ratio: {k} row(s)")
            raise ValueError(
                f"non-finite (NaN or inf) values on valid tokens in {int(n_bad)} of {B} row(s) ({', '.join(parts)}); "
                "pass nan_policy='mask' to drop such rows and count them in the metrics"
            )
        if bool(n_empty):
            raise ValueError(
                f"{int(n_empty)} of {B} row(s) have no valid token in mask; pass nan_policy='mask' to let "
                "all-masked rows contribute nothing (they are counted in the metrics)"
            )
    keep = valid & ~bad_row.unsqueeze(-1)  # (B, T)
    m = keep.to(dtype)
    zero = torch.zeros((), dtype=dtype, device=logp.device)
    logp = torch.where(keep, logp, zero)
    old_logp = torch.where(keep, old_logp, zero)
    adv = torch.where(keep, adv, zero)
    if rlr is not None:
        rlr = torch.where(keep, rlr, zero)
    if seq_level_adv:
        seq_adv = torch.where(keep.any(dim=-1), adv[:, 0], zero)  # (B,), exactly the given values
    else:
        seq_adv = adv.sum(dim=-1) / m.sum(dim=-1).clamp(min=1)  # (B,), masked token mean
    return Batch(logp, old_logp, adv, seq_adv, m, rlr, n_bad.to(dtype), n_empty.to(dtype))
