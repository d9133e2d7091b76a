"""Routing tensors ``(B, L, n_layers, k)``: column alignment, stacking micro-batches, validation."""

from __future__ import annotations

import torch

from respo.core.moe_diagnostics import missing_index

from .families import MoELayer

__all__ = ["fit_columns", "cat_routings", "check_routing"]


def fit_columns(x: torch.Tensor, S: int, fill) -> torch.Tensor:
    """First S columns of x (B, L, ...); columns beyond L are filled with ``fill`` (missing)."""
    if S <= x.shape[1]:
        return x[:, :S]
    pad = x.new_full((x.shape[0], S - x.shape[1], *x.shape[2:]), fill)
    return torch.cat([x, pad], dim=1)


def cat_routings(routings: list[torch.Tensor], length: int | None = None) -> torch.Tensor:
    """Stack routings of row blocks (e.g. micro-batches trimmed to different lengths) into one.

    Args:
        routings: tensors (B_i, L_i, n_layers, k) of one dtype.
        length: columns of the result (default max L_i); shorter blocks are padded on the right
            with ``missing_index(dtype)``, so right-trimmed padding stays out of the diagnostics.

    Returns:
        (sum B_i, length, n_layers, k).
    """
    if not routings:
        raise ValueError("cat_routings needs at least one routing")
    length = max(r.shape[1] for r in routings) if length is None else length
    if any(r.shape[1] > length for r in routings):
        raise ValueError(f"a routing has more than length={length} columns: {[r.shape[1] for r in routings]}")
    sentinel = missing_index(routings[0].dtype)
    return torch.cat([fit_columns(r, length, sentinel) for r in routings], dim=0)


def check_routing(routing: torch.Tensor, layers: list[MoELayer]) -> None:
    """Raise ``ValueError`` unless ``routing`` is an integer (B, L, n_layers, k) tensor of valid
    expert indices, each position either fully routed or fully missing."""
    n_layers, top_k, num_experts = len(layers), layers[0].top_k, layers[0].num_experts
    if routing.dim() != 4 or routing.shape[2:] != (n_layers, top_k):
        raise ValueError(
            f"routing must be (B, L, n_layers={n_layers}, k={top_k}); got {tuple(routing.shape)}"
        )
    if routing.is_floating_point():
        raise ValueError(f"routing must be an integer tensor; got {routing.dtype}")
    idx = routing.long()
    missing = idx == missing_index(routing.dtype)
    bad = (~missing & ((idx < 0) | (idx >= num_experts))).flatten(1).any(1)  # (B,)
    if bad.any():
        raise ValueError(
            f"routing has expert indices outside [0, {num_experts}) in {int(bad.sum())} of "
            f"{routing.shape[0]} rows"
        )
    partial = (missing.any(-1) & ~missing.all(-1)).flatten(1).any(1)  # (B,)
    if partial.any():
        raise ValueError(
            f"routing has positions with only some of the k experts missing in "
            f"{int(partial.sum())} of {routing.shape[0]} rows"
        )
