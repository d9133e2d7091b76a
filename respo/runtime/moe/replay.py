"""Routing replay: the training forward is forced to use the experts chosen at rollout time."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from respo.core.moe_diagnostics import missing_index

from .families import MoELayer
from .hooks import LayerHooks
from .routing import check_routing, fit_columns

__all__ = ["RoutingReplay", "routing_replay"]


class RoutingReplay(LayerHooks):
    """Context manager forcing each MoE layer to use recorded experts (see ``routing_replay``)."""

    def __init__(
        self,
        model: nn.Module,
        routing: torch.Tensor,
        *,
        weights: torch.Tensor | None = None,
        replay_weights: bool = False,
    ):
        super().__init__(model)
        check_routing(routing, self.layers)
        if replay_weights and weights is None:
            raise ValueError(
                "replay_weights=True needs the recorded weights: pass weights=rec.weights(L) "
                "from RoutingRecorder(model, record_weights=True)"
            )
        if replay_weights and weights.shape != routing.shape:
            raise ValueError(
                f"weights {tuple(weights.shape)} must have the routing's shape {tuple(routing.shape)}"
            )
        self.routing = routing
        self.weights = weights if replay_weights else None
        self.replay_weights = replay_weights
        self._sentinel = missing_index(routing.dtype)
        self._natural: dict[int, torch.Tensor] = {}  # layer -> the router's own top-k (B, S, k)
        self._device_cache: dict[tuple[int, torch.device], torch.Tensor] = {}

    def _register_layer_hook(self, i: int, layer: MoELayer) -> RemovableHandle:
        return layer.router.register_forward_hook(self._router_hook(i, layer))

    def _router_hook(self, i: int, layer: MoELayer):
        def hook(module, args, output):
            router_logits, top_k_weights, top_k_index = output  # (N, E), (N, k), (N, k)
            B, S = self._shapes[i]
            if B != self.routing.shape[0]:
                raise ValueError(
                    f"routing_replay: a forward with B={B} rows does not fit the routing's "
                    f"{self.routing.shape[0]} rows: rows must match (slice routing[rows] for "
                    "micro-batches)"
                )
            self._natural[i] = top_k_index.detach().reshape(B, S, -1)
            rec = fit_columns(self._on(self.routing, top_k_index.device)[:, :, i], S, self._sentinel)
            rec = rec.long().reshape(B * S, -1)  # (N, k)
            missing = (rec == self._sentinel).any(-1, keepdim=True)  # (N, 1)
            index = torch.where(missing, top_k_index, rec)  # (N, k)
            if self.replay_weights:
                w_rec = self._on(self.weights, top_k_weights.device)[:, :, i]
                w_rec = fit_columns(w_rec, S, float("nan")).reshape(B * S, -1)  # (N, k)
                weight = torch.where(missing, top_k_weights, w_rec.to(top_k_weights.dtype))
                return router_logits, weight, index
            probs = torch.softmax(router_logits.float(), dim=-1)  # (N, E)
            weight = probs.gather(-1, index)  # (N, k)
            if layer.normalise:
                weight = weight / weight.sum(dim=-1, keepdim=True)
            return router_logits, weight.to(top_k_weights.dtype), index

        return hook

    def _on(self, x: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``x`` on ``device``, copied once per context (not once per layer and forward)."""
        key = (id(x), device)
        if key not in self._device_cache:
            self._device_cache[key] = x.to(device, non_blocking=True)
        return self._device_cache[key]

    def __enter__(self) -> RoutingReplay:
        if self._handles:
            raise RuntimeError("RoutingReplay is already active")
        self._device_cache = {}
        self._install_hooks()
        return self

    def __exit__(self, *exc) -> None:
        self._remove_hooks()
        self._device_cache = {}

    def router_routing(self) -> torch.Tensor:
        """The current router's own top-k of the last forward, ``(B, S, n_layers, k)``.

        Compare it with the replayed routing (``router_shift``) to see how far routing would
        have moved without replay; costs nothing extra.
        """
        if len(self._natural) != len(self.layers):
            raise ValueError("routing_replay saw no forward yet")
        natural = torch.stack([self._natural[i] for i in range(len(self.layers))], dim=2)
        return natural.to(self.routing.dtype)


def routing_replay(
    model: nn.Module,
    routing: torch.Tensor,
    *,
    weights: torch.Tensor | None = None,
    replay_weights: bool = False,
) -> RoutingReplay:
    """Force the forward passes in the context to route every token to the recorded experts.

    For a layer with recorded experts e_1..e_k at a position, the gating weights are

        g_j = softmax(z)_{e_j}                       (z: the CURRENT router logits, (E,))
        g_j <- g_j / sum_j g_j                       (if the family renormalises)

    differentiable in the router weights. With ``replay_weights=True`` the recorded g_j are
    used instead (constants). Positions marked missing use the current router's own choice.

    Args:
        model: a Hugging Face MoE causal LM of a supported family.
        routing: ``(B, L, n_layers, k)`` recorded expert indices (``RoutingRecorder.routing``).
        weights: ``(B, L, n_layers, k)`` recorded weights, only with ``replay_weights=True``.
        replay_weights: replay the recorded gating weights as well.

    Returns:
        A ``RoutingReplay`` context manager; outside it the model is unchanged.
    """
    return RoutingReplay(model, routing, weights=weights, replay_weights=replay_weights)
