"""Input validation for the core: clear errors that name the problem and count the rows.

The objective pipeline checks its tensors once, up front (``check_inputs``). Two policies for bad rows:

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

import math
import numbers
from dataclasses import dataclass, field
from typing import Mapping, Optional, Tuple

import torch

NAN_POLICIES = ("raise", "mask")
LEVELS = ("token", "sequence")


@dataclass(frozen=True)
class LossInputs:
    """Checked, sanitised inputs of one objective call."""

    logp: torch.Tensor  # (B, T), keeps the autograd graph
    old_logp: torch.Tensor  # (B, T), detached
    adv: torch.Tensor  # (B, 1) for sequence advantages (broadcasts) or (B, T), detached
    seq_adv: torch.Tensor  # (B,), the sequence advantage (masked token mean) used for branching
    mask: torch.Tensor  # (B, T), float 0/1 in logp's dtype
    rollout_log_ratio: Optional[torch.Tensor]  # (B, T) or None, detached
    n_nonfinite: torch.Tensor  # 0-d, rows dropped for NaN/inf (always 0 under "raise")
    n_empty: torch.Tensor  # 0-d, rows with no valid token
    extra: Mapping[str, torch.Tensor] = field(default_factory=dict)  # name -> (B, T) extra per-token input, detached
    row_groups: Optional[torch.Tensor] = None  # (B,) integer micro-batch of each row, or None (one batch)


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
    bad = (mask != 0) & (mask != 1)
    if bool(bad.any()):
        rows = int(bad.any(dim=-1).sum())
        raise ValueError(f"mask must contain only 0 and 1; {rows} row(s) hold other values")
    return mask.to(dtype)


def check_row_groups(row_groups, batch_size: int) -> Optional[torch.Tensor]:
    """``row_groups`` as given when it is a (B,) integer tensor (or None); else a ValueError naming it."""
    if row_groups is None:
        return None
    ok = isinstance(row_groups, torch.Tensor) and row_groups.shape == (batch_size,) and not (
        row_groups.is_floating_point() or row_groups.is_complex() or row_groups.dtype == torch.bool)
    if not ok:
        got = (f"{row_groups.dtype} tensor of shape {tuple(row_groups.shape)}" if isinstance(row_groups, torch.Tensor)
               else type(row_groups).__name__)
        raise ValueError(f"row_groups must be a (B,) = ({batch_size},) integer tensor (the micro-batch of each row), got {got}")
    return row_groups


def check_inputs(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    rollout_log_ratio: Optional[torch.Tensor] = None,
    nan_policy: str = "raise",
    extra: Optional[Mapping[str, torch.Tensor]] = None,
) -> LossInputs:
    """Check shapes, dtypes and values; return sanitised tensors (see module docstring).

    ``extra``: further per-token inputs an objective reads (name -> (B, T)), checked, detached and
    sanitised like ``rollout_log_ratio``; they come back in ``LossInputs.extra``.
    """
    if nan_policy not in NAN_POLICIES:
        raise ValueError(f"nan_policy must be one of {NAN_POLICIES}, got {nan_policy!r}")
    _check_float("logp", logp)
    _check_float("old_logp", old_logp)
    _check_float("advantages", advantages)
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor (B, T), got {type(mask).__name__}")
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
    if advantages.shape not in ((B,), (B, 1), tuple(logp.shape)):
        raise ValueError(
            f"advantages must have shape (B,) = ({B},) or (B, T) = {tuple(logp.shape)}, got {tuple(advantages.shape)}"
        )
    per_token = {"rollout_log_ratio": rollout_log_ratio, **(extra or {})}
    for name, x in per_token.items():
        if x is None:
            continue
        _check_float(name, x)
        if x.shape != logp.shape:
            raise ValueError(f"{name} shape {tuple(x.shape)} does not match logp shape {tuple(logp.shape)}")
    dtype = logp.dtype
    m = _as_mask(mask, dtype)
    old_logp = old_logp.detach().to(dtype)
    # Sequence advantages stay (B, 1) and broadcast; token advantages are (B, T).
    adv = (advantages.detach().reshape(B, 1) if seq_level_adv else advantages.detach()).to(dtype)
    rlr = None if rollout_log_ratio is None else rollout_log_ratio.detach().to(dtype)
    more = {name: x.detach().to(dtype) for name, x in (extra or {}).items()}  # name -> (B, T)
    n_tok = m.sum(dim=-1)  # (B,)

    # Fast path, reductions only: NaN/inf anywhere in an input makes its sum non-finite (a finite sum
    # that overflows only sends us to the exact slow path below, never past a bad value).
    probe = logp.detach().sum() + old_logp.sum() + adv.sum()
    if rlr is not None:
        probe = probe + rlr.sum()
    for x in more.values():
        probe = probe + x.sum()
    if bool(torch.isfinite(probe) & (n_tok > 0).all()):
        seq_adv = adv[:, 0] if seq_level_adv else (adv * m).sum(dim=-1) / n_tok
        nil = torch.zeros((), dtype=dtype, device=logp.device)
        return LossInputs(logp, old_logp, adv, seq_adv, m, rlr, nil, nil.clone(), more)

    # Slow path: find the rows with a non-finite value on a valid token, and in which tensor.
    valid = m > 0  # (B, T)
    fins = {"logp": torch.isfinite(logp.detach()), "old_logp": torch.isfinite(old_logp), "advantages": torch.isfinite(adv)}
    if rlr is not None:
        fins["rollout_log_ratio"] = torch.isfinite(rlr)
    fins.update({name: torch.isfinite(x) for name, x in more.items()})
    bad_by = {k: (valid & ~v).any(dim=-1) for k, v in fins.items()}  # name -> (B,)
    bad_row = torch.stack(list(bad_by.values())).any(dim=0)  # (B,)
    empty_row = n_tok == 0  # (B,)
    n_bad = bad_row.sum()
    n_empty = empty_row.sum()
    if nan_policy == "raise":
        if bool(n_bad):
            parts = [f"{k}: {int(v.sum())} row(s)" for k, v in bad_by.items() if bool(v.any())]
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
    keep_row = keep.any(dim=-1, keepdim=True)  # (B, 1)
    m = keep.to(dtype)
    zero = torch.zeros((), dtype=dtype, device=logp.device)
    logp = torch.where(keep, logp, zero)
    old_logp = torch.where(keep, old_logp, zero)
    adv = torch.where(keep_row if seq_level_adv else keep, adv, zero)
    if rlr is not None:
        rlr = torch.where(keep, rlr, zero)
    more = {name: torch.where(keep, x, zero) for name, x in more.items()}
    if seq_level_adv:
        seq_adv = adv[:, 0]  # (B,), exactly the given values (0 for dropped rows)
    else:
        seq_adv = adv.sum(dim=-1) / m.sum(dim=-1).clamp(min=1)  # (B,), masked token mean
    return LossInputs(logp, old_logp, adv, seq_adv, m, rlr, n_bad.to(dtype), n_empty.to(dtype), more)


# --------------------------------------------------------------------------------------------------
# Hyperparameters: one checker per kind of value, one-line errors that name the parameter
# --------------------------------------------------------------------------------------------------


def check_number(name: str, value, *, what: str) -> float:
    """``value`` as a finite float; a string, a bool, NaN or ±inf is refused naming ``what: name``."""
    x = _real(name, value, what=what)
    if not math.isfinite(x):
        raise ValueError(f"{what}: {name} must be finite, got {value!r}")
    return x


def _real(name: str, value, *, what: str) -> float:
    """``value`` as a float (NaN and ±inf kept); anything but an int, a float or a 0-d real tensor is refused."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and not (value.is_complex() or value.dtype == torch.bool):
        return float(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{what}: {name} must be a number, got {value!r}")
    return float(value)


def check_level(level: str, *, what: str) -> str:
    if level not in LEVELS:
        raise ValueError(f"{what}: level must be one of {LEVELS}, got {level!r}")
    return level


def check_cap(cap, *, what: str, name: str = "cap") -> float:
    cap = check_number(name, cap, what=what)
    if not cap > 0:
        raise ValueError(f"{what}: {name} must be > 0, got {cap}")
    return cap


def check_band(lo, hi, *, what: str) -> Tuple[float, float]:
    lo, hi = check_number("lo", lo, what=what), check_number("hi", hi, what=what)
    if not (0 <= lo < hi):
        raise ValueError(f"{what}: need 0 <= lo < hi, got lo={lo}, hi={hi}")
    return lo, hi


def check_positive(name: str, value, *, what: str, allow_zero: bool = False) -> float:
    x = check_number(name, value, what=what)
    if x < 0 or (x == 0 and not allow_zero):
        raise ValueError(f"{what}: {name} must be {'>=' if allow_zero else '>'} 0, got {x}")
    return x


def check_bool(name: str, value, *, what: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{what}: {name} must be true or false, got {value!r}")
    return value


def check_fraction(name: str, value, *, what: str) -> float:
    """A share of the tokens, in (0, 1]."""
    x = check_positive(name, value, what=what)
    if x > 1:
        raise ValueError(f"{what}: {name} is a fraction of the tokens, in (0, 1], got {x}")
    return x


def check_choice(name: str, value, choices: Tuple[str, ...], *, what: str) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{what}: {name} must be one of {choices}, got {value!r}")
    return value


def check_clip(low, high, c=None, *, what: str, log_space: bool = False) -> Tuple[float, float, Optional[float]]:
    """The clip range of every clipped objective: ε_l in [0, 1), ε_h ≥ 0, both finite; the dual clip
    c > 1 or None.

    1 − ε_l is the lower bound of the clipped ratio: ε_l ≥ 1 makes it 0 or negative (no lower clip at
    all), a negative ε turns the interval inside out, and an infinite one removes the clip. With
    ``log_space`` (GMPO clips log r to [−ε_l, ε_h]) the lower bound e^(−ε_l) is positive for any ε_l ≥ 0.
    """
    low, high = _real("clip_ratio_low", low, what=what), _real("clip_ratio_high", high, what=what)
    for name, x in (("clip_ratio_low", low), ("clip_ratio_high", high)):
        if not x >= 0:  # NaN too
            raise ValueError(f"{what}: {name} must be >= 0, got {x}")
        if not math.isfinite(x):
            raise ValueError(f"{what}: {name} must be finite, got {x}")
    if not (log_space or low < 1):
        raise ValueError(f"{what}: clip_ratio_low must be in [0, 1), got {low} (the lower bound 1 - clip_ratio_low "
                         "would not be positive)")  # fmt: skip
    if c is not None:
        c = check_number("clip_ratio_c", c, what=what)
        if not c > 1:
            raise ValueError(f"{what}: clip_ratio_c must be > 1 (dual clip) or None, got {c}")
    return low, high, c
