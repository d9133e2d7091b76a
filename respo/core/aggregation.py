"""Loss aggregation over a (B, T) matrix of per-token losses, with verl's mode names.

    token-mean               Σ_it m·ℓ / N_tok
    token-sum                Σ_it m·ℓ
    seq-mean-token-mean      Σ_i [Σ_t m·ℓ / T_i] / N_seq
    seq-mean-token-sum       Σ_i [Σ_t m·ℓ] / N_seq
    seq-mean-token-sum-norm  Σ_i [Σ_t m·ℓ] / N_seq / H

N_tok and N_seq default to this batch's valid-token count and non-empty-row count. Passing the
*global* batch's counts (``global_tokens``, ``global_seqs``) makes the loss of every micro-batch a
share of the full-batch loss, so summing micro-batch losses (gradient accumulation) gives exactly the
full-batch loss. H (``loss_scale_factor``) defaults to T; keep it constant across micro-batches.

References:
    verl ``core_algos.agg_loss`` (the same names and semantics, without data-parallel scaling).
"""

from __future__ import annotations

from typing import Optional, Union

import torch

AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")

Count = Optional[Union[int, float, torch.Tensor]]


def check_agg_mode(mode: str) -> str:
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; valid modes: {', '.join(AGG_MODES)}")
    return mode


def _positive(name: str, given, like: torch.Tensor) -> torch.Tensor:
    """``given`` as a 0-d tensor like ``like``; a non-number, NaN, ±inf or a value ≤ 0 is a one-line error naming it."""
    try:
        n = torch.as_tensor(given, dtype=like.dtype, device=like.device)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"{name} must be a positive number, got {given!r}") from None
    if n.dim() != 0 or not bool(torch.isfinite(n) & (n > 0)):
        raise ValueError(f"{name} must be a positive finite number, got {given!r}")
    return n


def _count(given: Count, local: torch.Tensor, name: str) -> torch.Tensor:
    return local.clamp(min=1) if given is None else _positive(name, given, local)


def agg_loss(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    *,
    global_tokens: Count = None,
    global_seqs: Count = None,
    loss_scale_factor: Optional[float] = None,
) -> torch.Tensor:
    """Aggregate per-token losses into a scalar (see module docstring).

    Args:
      values: (B, T) per-token losses ℓ (values at masked positions are ignored, even NaN).
      mask: (B, T) 0/1 validity mask.
      mode: one of ``AGG_MODES``.
      global_tokens: valid-token count of the global batch (token-mean).
      global_seqs: non-empty-row count of the global batch (seq-mean-*).
      loss_scale_factor: H for ``seq-mean-token-sum-norm`` (default T).

    Returns:
      0-d tensor.
    """
    check_agg_mode(mode)
    if loss_scale_factor is not None:
        loss_scale_factor = _positive("loss_scale_factor", loss_scale_factor, values)
    m = mask.to(values.dtype)
    masked = torch.where(m > 0, values, torch.zeros((), dtype=values.dtype, device=values.device))  # (B, T)
    if mode == "token-mean":
        return masked.sum() / _count(global_tokens, m.sum(), "global_tokens")
    if mode == "token-sum":
        return masked.sum()
    n_tok = m.sum(dim=-1)  # (B,)
    n_seq = _count(global_seqs, (n_tok > 0).to(values.dtype).sum(), "global_seqs")
    seq_sum = masked.sum(dim=-1)  # (B,)
    if mode == "seq-mean-token-mean":
        return (seq_sum / n_tok.clamp(min=1)).sum() / n_seq
    loss = seq_sum.sum() / n_seq
    if mode == "seq-mean-token-sum-norm":
        loss = loss / (values.shape[-1] if loss_scale_factor is None else loss_scale_factor)
    return loss


def agg_seq(values: torch.Tensor, n_tok: torch.Tensor, *, global_seqs: Count = None) -> torch.Tensor:
    """Mean of per-sequence losses (B,) over non-empty rows (sequence-level objectives such as GMPO)."""
    keep = n_tok > 0
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    return torch.where(keep, values, zero).sum() / _count(global_seqs, keep.to(values.dtype).sum(), "global_seqs")
