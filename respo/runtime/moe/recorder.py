"""Recording the experts every token was sent to (rollout time or any forward)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from respo.core.moe_diagnostics import missing_index, routing_dtype

from .families import MoELayer
from .hooks import LayerHooks
from .routing import fit_columns

__all__ = ["RoutingRecorder"]


class RoutingRecorder(LayerHooks):
    """Context manager recording the experts every token was sent to, per MoE layer.

    Every forward inside the context appends its positions: a single full-sequence forward
    (B, L), or a KV-cached decode, prefill (B, P) then one (B, 1) forward per step, all B rows
    every step. ``routing()`` concatenates them along the positions.

    What is recorded is the ``top_k_index`` the experts module received (so a recording inside
    ``routing_replay`` shows the replayed experts), and with ``record_weights=True`` the
    ``top_k_weights`` too.

    Do not record a forward that uses gradient checkpointing: the recomputation in backward
    would be recorded a second time.

    Args:
        model: a Hugging Face MoE causal LM of a supported family.
        record_weights: also keep the top-k gating weights (float32), for
            ``routing_replay(..., replay_weights=True)``.
    """

    def __init__(self, model: nn.Module, *, record_weights: bool = False):
        super().__init__(model)
        self.num_experts = self.layers[0].num_experts
        self.top_k = self.layers[0].top_k
        self.n_layers = len(self.layers)
        self.dtype = routing_dtype(self.num_experts)
        self.record_weights = record_weights
        self._depth = 0
        self.clear()

    def clear(self) -> None:
        """Forget everything recorded so far (the hooks stay installed)."""
        self._index: list[list[torch.Tensor]] = [[] for _ in self.layers]
        self._weight: list[list[torch.Tensor]] = [[] for _ in self.layers]

    def _register_layer_hook(self, i: int, layer: MoELayer) -> RemovableHandle:
        return layer.experts.register_forward_pre_hook(self._experts_hook(i), with_kwargs=True)

    def _experts_hook(self, i: int):
        def hook(module, args, kwargs):
            top_k_index = args[1] if len(args) > 1 else kwargs["top_k_index"]  # (N, k)
            B, S = self._shapes[i]
            if self._index[i] and self._index[i][0].shape[0] != B:
                raise ValueError(
                    f"RoutingRecorder: a forward with {B} rows followed one with "
                    f"{self._index[i][0].shape[0]}; every forward in one recording must keep all "
                    "rows (call rec.clear() between batches)"
                )
            self._index[i].append(top_k_index.detach().reshape(B, S, -1).to(self.dtype))
            if self.record_weights:
                top_k_weights = args[2] if len(args) > 2 else kwargs["top_k_weights"]
                self._weight[i].append(top_k_weights.detach().reshape(B, S, -1).float())

        return hook

    def __enter__(self) -> RoutingRecorder:
        self._depth += 1
        if self._depth == 1:  # nested use of the same recorder (e.g. trainer and sampler): one set of hooks
            self._install_hooks()
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._remove_hooks()

    @property
    def num_positions(self) -> int:
        """Positions recorded so far (prefill + decode steps)."""
        return sum(t.shape[1] for t in self._index[0])

    def _stack(self, chunks: list[list[torch.Tensor]], length: int | None, fill) -> torch.Tensor:
        if not chunks[0]:
            raise ValueError("RoutingRecorder recorded nothing: run a forward inside the context")
        per_layer = [torch.cat(c, dim=1) for c in chunks]  # n_layers x (B, P, k)
        out = torch.stack(per_layer, dim=2)  # (B, P, n_layers, k)
        P = out.shape[1]
        if length is None:
            return out
        if length < P:
            raise ValueError(f"recorded {P} positions, more than the requested length {length}")
        return fit_columns(out, length, fill)  # (B, length, n_layers, k)

    def routing(self, length: int | None = None) -> torch.Tensor:
        """Recorded expert indices ``(B, L, n_layers, k)`` in ``self.dtype``.

        Args:
            length: pad the positions with ``missing_index(dtype)`` up to this length (e.g. the
                rollout's ``input_ids.shape[1]``: the last sampled token is never fed back).
        """
        return self._stack(self._index, length, missing_index(self.dtype))

    def weights(self, length: int | None = None) -> torch.Tensor:
        """Recorded top-k gating weights ``(B, L, n_layers, k)`` float32 (NaN where missing)."""
        if not self.record_weights:
            raise ValueError("weights were not recorded: use RoutingRecorder(record_weights=True)")
        return self._stack(self._weight, length, float("nan"))
