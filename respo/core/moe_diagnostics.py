"""Mixture-of-experts routing diagnostics: router shift and expert-load balance.

Pure functions of routing tensors (torch only); results are detached tensors, the caller
converts them.

A *routing* is an integer tensor ``(B, L, n_layers, k)`` of expert indices, position-aligned with
the model's input ids ``(B, L)``: entry ``[b, p, l]`` holds the top-k experts that MoE layer ``l``
chose for the token at column ``p``. The dtype is compact (``routing_dtype``): ``torch.uint8``
when the model has at most ``UINT8_MAX_EXPERTS`` experts, ``torch.int16`` otherwise. Positions
that were never routed hold the sentinel ``missing_index(dtype)`` and are left out of every
statistic.

    shift = router_shift(routing_rollout, routing_train, mask)   # RouterShift
    bal = load_balance(routing_rollout, num_experts, mask)        # LoadBalance
    metrics = moe_metrics(routing_rollout, routing_train, num_experts, mask)  # dict[str, 0-d]

A ``mask`` is a ``(B, L)`` position mask, or a response mask ``(B, T)`` with ``T < L``
right-aligned to the last ``T`` columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "UINT8_MAX_EXPERTS",
    "INT16_MAX_EXPERTS",
    "routing_dtype",
    "missing_index",
    "RouterShift",
    "LoadBalance",
    "router_shift",
    "expert_load",
    "load_balance",
    "moe_metrics",
]

UINT8_MAX_EXPERTS = 255  # uint8 indices 0..254; 255 is the missing sentinel
INT16_MAX_EXPERTS = 32767  # int16 indices 0..32766; -1 is the missing sentinel
_LOG_FLOOR = 1e-30  # keeps log(0) finite where the load is 0 (those terms are zeroed anyway)


def routing_dtype(num_experts: int) -> torch.dtype:
    """Compact index dtype: uint8 up to 255 experts (255 is the sentinel), else int16."""
    if num_experts <= UINT8_MAX_EXPERTS:
        return torch.uint8
    if num_experts <= INT16_MAX_EXPERTS:
        return torch.int16
    raise ValueError(f"num_experts={num_experts} does not fit an int16 routing tensor")


def missing_index(dtype: torch.dtype) -> int:
    """Sentinel for positions that were never routed: 255 for uint8, -1 for signed dtypes."""
    return UINT8_MAX_EXPERTS if dtype == torch.uint8 else -1


@dataclass(frozen=True)
class RouterShift:
    """Router shift between two routings (detached tensors).

    Attributes:
        overall: () mean over layers and valid tokens of 1[top-k set changed].
        per_layer: (n_layers,) fraction of valid tokens whose top-k set changed in that layer.
        any_layer: () fraction of valid tokens whose set changed in at least one layer.
        overlap: () mean |A ∩ B| / k over layers and valid tokens (1 = nothing moved).
        tokens: () number of valid tokens compared.
    """

    overall: torch.Tensor
    per_layer: torch.Tensor
    any_layer: torch.Tensor
    overlap: torch.Tensor
    tokens: torch.Tensor


@dataclass(frozen=True)
class LoadBalance:
    """Expert-load balance per layer from routing indices (detached tensors).

    Attributes:
        load: (n_layers, E) share of the token-slots sent to each expert (rows sum to 1).
        entropy: (n_layers,) H(load) / log E; 1 = perfectly balanced, 0 = one expert.
        max_load: (n_layers,) E * max_e load_e; 1 = balanced, E = one expert takes all.
        cv: (n_layers,) std_e(load) / mean_e(load) (population std); 0 = balanced.
    """

    load: torch.Tensor
    entropy: torch.Tensor
    max_load: torch.Tensor
    cv: torch.Tensor


def _position_mask(mask: torch.Tensor | None, B: int, L: int, device) -> torch.Tensor:
    """(B, L) bool mask; a (B, T) mask with T < L covers the last T columns (the response)."""
    if mask is None:
        return torch.ones(B, L, dtype=torch.bool, device=device)
    if mask.dim() != 2 or mask.shape[0] != B or mask.shape[1] > L:
        raise ValueError(
            f"mask must be (B={B}, L={L}) or a response mask (B, T<=L); got {tuple(mask.shape)}"
        )
    mask = mask.to(device) > 0  # (B, T)
    if mask.shape[1] < L:
        mask = torch.cat([mask.new_zeros(B, L - mask.shape[1]), mask], dim=1)  # (B, L)
    return mask


def _routed(routing: torch.Tensor) -> torch.Tensor:
    """(B, L, n_layers) True where the position was routed (not the missing sentinel)."""
    return (routing.long() != missing_index(routing.dtype)).all(-1)


@torch.no_grad()
def router_shift(
    routing_a: torch.Tensor, routing_b: torch.Tensor, mask: torch.Tensor | None = None
) -> RouterShift:
    """Fraction of tokens whose top-k expert set differs between two routings.

        changed_{b,p,l} = 1[ set(a_{b,p,l,:}) != set(b_{b,p,l,:}) ]
        per_layer_l     = sum_{b,p} m_{b,p,l} changed_{b,p,l} / sum_{b,p} m_{b,p,l}

    where m is the mask restricted to positions routed in both (missing ones are left out).
    Order within the top-k does not matter.

    Args:
        routing_a: (B, L, n_layers, k) e.g. the rollout's recording.
        routing_b: (B, L', n_layers, k), e.g. the training pass's. Only the first min(L, L')
            columns are compared; columns present in one routing only count as missing.
        mask: (B, max(L, L')) position mask, or a response mask (B, T) right-aligned to the
            last T columns; None = all positions.

    Returns:
        ``RouterShift``; fractions are 0 when no token is valid.
    """
    if routing_a.shape[0] != routing_b.shape[0] or routing_a.shape[2:] != routing_b.shape[2:]:
        raise ValueError(
            f"routings disagree on (B, ., n_layers, k): {tuple(routing_a.shape)} vs "
            f"{tuple(routing_b.shape)}"
        )
    B, L = routing_a.shape[0], max(routing_a.shape[1], routing_b.shape[1])
    m = _position_mask(mask, B, L, routing_a.device)
    Lc = min(routing_a.shape[1], routing_b.shape[1])  # columns beyond count as missing
    a, b = routing_a[:, :Lc], routing_b[:, :Lc].to(routing_a.device)
    valid = m[:, :Lc, None] & _routed(a) & _routed(b)  # (B, Lc, n_layers)
    a, b = a.long(), b.long()
    # shared_{b,p,l} = |A ∩ B| (top-k indices are distinct within a position)
    shared = (a[..., :, None] == b[..., None, :]).any(-1).sum(-1)  # (B, Lc, n_layers)
    k = a.shape[-1]
    changed = (shared < k) & valid  # (B, Lc, n_layers)
    validf = valid.float()
    n_per_layer = validf.sum((0, 1))  # (n_layers,)
    per_layer = changed.float().sum((0, 1)) / n_per_layer.clamp(min=1)  # (n_layers,)
    n = n_per_layer.sum()
    overall = changed.float().sum() / n.clamp(min=1)
    overlap = (shared.float() / k * validf).sum() / n.clamp(min=1)
    overlap = torch.where(n > 0, overlap, torch.ones_like(overlap))
    tok_valid = valid.any(-1)  # (B, Lc)
    any_layer = changed.any(-1).float().sum() / tok_valid.float().sum().clamp(min=1)
    return RouterShift(overall, per_layer, any_layer, overlap, tok_valid.float().sum())


@torch.no_grad()
def expert_load(
    routing: torch.Tensor, num_experts: int, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Share of routed token-slots per expert and layer.

        load_{l,e} = sum_{b,p,j} m_{b,p} 1[routing_{b,p,l,j} = e] / (k * sum_{b,p} m_{b,p})

    Args:
        routing: (B, L, n_layers, k).
        num_experts: E.
        mask: (B, L) or right-aligned (B, T) response mask; None = all positions.

    Returns:
        (n_layers, E) float, rows sum to 1 (all zeros for a layer with no valid token).
    """
    B, L, n_layers, k = routing.shape
    m = _position_mask(mask, B, L, routing.device)[:, :, None] & _routed(routing)  # (B, L, nl)
    idx = routing.long().clamp(0, num_experts - 1)  # sentinel rows are masked out below
    offset = torch.arange(n_layers, device=routing.device)[None, None, :, None] * num_experts
    flat = (idx + offset).reshape(-1)  # (B*L*nl*k,)
    w = m[..., None].expand_as(idx).reshape(-1).float()
    counts = torch.bincount(flat, weights=w, minlength=n_layers * num_experts)
    counts = counts.reshape(n_layers, num_experts)  # (nl, E)
    return counts / counts.sum(-1, keepdim=True).clamp(min=1)


@torch.no_grad()
def load_balance(
    routing: torch.Tensor, num_experts: int, mask: torch.Tensor | None = None
) -> LoadBalance:
    """Per-layer expert-load balance: normalised entropy, max-load factor, coefficient of variation.

        p_l = expert_load(routing)_l                 (E,)
        entropy_l  = -sum_e p_le log p_le / log E
        max_load_l = E * max_e p_le
        cv_l       = std_e(p_le) / mean_e(p_le)      (mean = 1/E)

    Args:
        routing: (B, L, n_layers, k).
        num_experts: E (>= 2).
        mask: (B, L) or right-aligned (B, T); None = all positions.
    """
    if num_experts < 2:
        raise ValueError(f"num_experts must be >= 2; got {num_experts}")
    load = expert_load(routing, num_experts, mask)  # (nl, E)
    plogp = torch.where(load > 0, load * load.clamp(min=_LOG_FLOOR).log(), torch.zeros_like(load))
    entropy = -plogp.sum(-1) / torch.log(torch.tensor(float(num_experts)))  # (nl,)
    max_load = num_experts * load.max(-1).values  # (nl,)
    cv = load.std(-1, unbiased=False) * num_experts  # (nl,) std / (1/E)
    return LoadBalance(load, entropy, max_load, cv)


@torch.no_grad()
def moe_metrics(
    routing_rollout: torch.Tensor,
    routing_train: torch.Tensor | None,
    num_experts: int,
    mask: torch.Tensor | None = None,
    *,
    prefix: str = "moe/",
) -> dict[str, torch.Tensor]:
    """Flat ``dict[str, 0-d tensor]`` of router shift and load balance, for a metrics logger.

    Keys: ``router_shift``, ``router_shift/any_layer``, ``router_shift/overlap``,
    ``router_shift/layer_{l}``, and from the rollout routing ``load_entropy``,
    ``load_max``, ``load_cv`` (means over layers) and ``load_entropy/layer_{l}``; all under
    ``prefix``. Router-shift keys are absent when ``routing_train`` is None.
    """
    out: dict[str, torch.Tensor] = {}
    if routing_train is not None:
        shift = router_shift(routing_rollout, routing_train, mask)
        out[f"{prefix}router_shift"] = shift.overall
        out[f"{prefix}router_shift/any_layer"] = shift.any_layer
        out[f"{prefix}router_shift/overlap"] = shift.overlap
        for layer, value in enumerate(shift.per_layer):
            out[f"{prefix}router_shift/layer_{layer}"] = value
    bal = load_balance(routing_rollout, num_experts, mask)
    out[f"{prefix}load_entropy"] = bal.entropy.mean()
    out[f"{prefix}load_max"] = bal.max_load.mean()
    out[f"{prefix}load_cv"] = bal.cv.mean()
    for layer, value in enumerate(bal.entropy):
        out[f"{prefix}load_entropy/layer_{layer}"] = value
    return out
