"""MoE model families and layer discovery: which block is routed, where its router and experts are.

A built-in family is one row of ``BUILTIN_FAMILIES``; a family is only offered when its block
class can be imported from the installed transformers. ``register_moe_family`` adds one at run
time.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

__all__ = [
    "MoEFamily",
    "MoELayer",
    "BUILTIN_FAMILIES",
    "register_moe_family",
    "supported_families",
    "find_moe_layers",
    "is_moe",
]


@dataclass(frozen=True)
class MoEFamily:
    """How to find and drive the routed MoE block of one model family.

    Args:
        name: the config's ``model_type`` (e.g. ``"qwen3_moe"``).
        block_cls: the sparse MoE block class; its ``forward`` gets ``hidden (B, S, H)``.
        router_attr: attribute of the block holding the top-k router, whose ``forward`` returns
            ``(router_logits (N, E), top_k_weights (N, k), top_k_index (N, k))``, ``N = B*S``.
        experts_attr: attribute of the block holding the experts, called as
            ``experts(hidden (N, H), top_k_index (N, k), top_k_weights (N, k))``.
        normalises: router -> whether the family renormalises the top-k probabilities to sum
            to one.
    """

    name: str
    block_cls: type
    normalises: Callable[[nn.Module], bool]
    router_attr: str = "gate"
    experts_attr: str = "experts"


@dataclass(frozen=True)
class MoELayer:
    """One routed MoE block of a model, in module order."""

    name: str
    block: nn.Module
    router: nn.Module
    experts: nn.Module
    family: MoEFamily
    num_experts: int
    top_k: int
    normalise: bool


def _norm_topk_prob(router: nn.Module) -> bool:
    """The router's own ``norm_topk_prob`` flag (Qwen-MoE style)."""
    return bool(router.norm_topk_prob)


def _always(router: nn.Module) -> bool:
    """The family always renormalises the top-k probabilities (Mixtral)."""
    return True


# (model_type, module of the block class, block class name, renormalises top-k?)
BUILTIN_FAMILIES: tuple[tuple[str, str, str, Callable[[nn.Module], bool]], ...] = (
    ("qwen3_moe", "transformers.models.qwen3_moe.modeling_qwen3_moe", "Qwen3MoeSparseMoeBlock", _norm_topk_prob),
    ("qwen2_moe", "transformers.models.qwen2_moe.modeling_qwen2_moe", "Qwen2MoeSparseMoeBlock", _norm_topk_prob),
    ("mixtral", "transformers.models.mixtral.modeling_mixtral", "MixtralSparseMoeBlock", _always),
)

_EXTRA_FAMILIES: list[MoEFamily] = []


def register_moe_family(family: MoEFamily) -> None:
    """Add a family whose block follows the router/experts contract of ``MoEFamily``.

    For example OLMoE's block has exactly the Qwen3-MoE contract::

        from transformers.models.olmoe.modeling_olmoe import OlmoeSparseMoeBlock
        register_moe_family(MoEFamily("olmoe", OlmoeSparseMoeBlock, lambda r: r.norm_topk_prob))

    Registering a block class again replaces the earlier entry.
    """
    _EXTRA_FAMILIES[:] = [f for f in _EXTRA_FAMILIES if f.block_cls is not family.block_cls]
    _EXTRA_FAMILIES.append(family)


def _builtin_families() -> list[MoEFamily]:
    """The rows of ``BUILTIN_FAMILIES`` whose block class the installed transformers has."""
    families = []
    for name, module_name, class_name, normalises in BUILTIN_FAMILIES:
        try:
            block_cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError):
            continue
        families.append(MoEFamily(name, block_cls, normalises))
    return families


def _all_families() -> list[MoEFamily]:
    return _builtin_families() + _EXTRA_FAMILIES


def supported_families() -> list[str]:
    """Names of the families that can be recorded and replayed."""
    return [f.name for f in _all_families()]


def _unsupported(model: nn.Module, why: str) -> ValueError:
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    return ValueError(
        f"{type(model).__name__} (model_type={model_type!r}) is not a supported MoE model: {why}. "
        f"Routing recording/replay supports the transformers 5.x families {supported_families()} "
        "(register another with respo.runtime.moe.register_moe_family)."
    )


def find_moe_layers(model: nn.Module) -> list[MoELayer]:
    """The routed MoE blocks of ``model`` in module (= layer) order.

    Raises:
        ValueError: if the model has no block of a supported family, or mixes block types /
            expert counts / top-k across layers.
    """
    families = _all_families()
    layers = []
    for name, module in model.named_modules():
        family = next((f for f in families if type(module) is f.block_cls), None)
        if family is None:
            continue
        router = getattr(module, family.router_attr, None)
        experts = getattr(module, family.experts_attr, None)
        if router is None or experts is None or not hasattr(router, "top_k"):
            raise _unsupported(
                model,
                f"block {name!r} has no top-k router {family.router_attr!r} with experts "
                f"{family.experts_attr!r} (an older transformers layout?)",
            )
        layers.append(
            MoELayer(
                name=name,
                block=module,
                router=router,
                experts=experts,
                family=family,
                num_experts=int(router.num_experts),
                top_k=int(router.top_k),
                normalise=family.normalises(router),
            )
        )
    if not layers:
        raise _unsupported(model, "no routed MoE block found")
    shapes = {(layer.num_experts, layer.top_k) for layer in layers}
    if len(shapes) != 1:
        raise _unsupported(model, f"layers disagree on (num_experts, top_k): {sorted(shapes)}")
    return layers


def is_moe(model: nn.Module) -> bool:
    """Whether ``model`` has routed MoE blocks of a supported family."""
    try:
        find_moe_layers(model)
    except ValueError:
        return False
    return True
