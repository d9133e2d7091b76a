"""The one way recorder and replay attach to a model: forward hooks on every MoE layer.

``LayerHooks`` installs, per layer in module order, a pre-hook on the sparse MoE block that
remembers the ``(B, S)`` of its input, then the subclass's own hook on the router or the experts;
``_remove_hooks`` takes them all off, so outside a context the model is exactly the plain model.
"""

from __future__ import annotations

from torch import nn
from torch.utils.hooks import RemovableHandle

from .families import MoELayer, find_moe_layers

__all__ = ["LayerHooks"]


class LayerHooks:
    """Base of the MoE context managers: the model's layers, their input shapes, and hook handles.

    Subclasses implement ``_register_layer_hook(i, layer)`` (register one hook on layer ``i``
    and return its handle) and call ``_install_hooks`` / ``_remove_hooks`` from
    ``__enter__`` / ``__exit__``.
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.layers: list[MoELayer] = find_moe_layers(model)
        self._shapes: dict[int, tuple[int, int]] = {}  # layer -> (B, S) of its last forward
        self._handles: list[RemovableHandle] = []

    def _register_layer_hook(self, i: int, layer: MoELayer) -> RemovableHandle:
        raise NotImplementedError

    def _block_shape_hook(self, i: int):
        """Forward pre-hook on a sparse MoE block: remember (B, S) of its (B, S, H) input."""

        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            if hidden.dim() != 3:
                raise ValueError(
                    f"MoE block {i} got hidden states of shape {tuple(hidden.shape)}; expected (B, S, H)"
                )
            self._shapes[i] = (hidden.shape[0], hidden.shape[1])

        return hook

    def _install_hooks(self) -> None:
        for i, layer in enumerate(self.layers):
            self._handles.append(
                layer.block.register_forward_pre_hook(self._block_shape_hook(i), with_kwargs=True)
            )
            self._handles.append(self._register_layer_hook(i, layer))

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
