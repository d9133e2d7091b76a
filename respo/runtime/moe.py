"""Mixture-of-experts under staleness: router recording, routing replay, router-shift diagnostics.

In an MoE policy the expert choice of every token moves between the rollout (policy version v,
often another engine) and the training forward pass (version v + k). That adds to the
off-policy mismatch the importance weight W has to absorb. This module lets a user *see* it
(router shift, expert-load balance) and *remove* it (routing replay: the training pass is
forced to use the experts chosen at rollout time).

Supported families (transformers 5.x layout: a ``*SparseMoeBlock`` with a ``gate`` top-k router
returning ``(router_logits, top_k_weights, top_k_index)`` and an ``experts`` module called as
``experts(hidden (N, H), top_k_index (N, k), top_k_weights (N, k))``):

==============  ===========================  =====================================
family          block                        top-k weights
==============  ===========================  =====================================
``qwen3_moe``   ``Qwen3MoeSparseMoeBlock``   softmax, top-k, renormalised if ``norm_topk_prob``
``qwen2_moe``   ``Qwen2MoeSparseMoeBlock``   same (the shared expert is not routed)
``mixtral``     ``MixtralSparseMoeBlock``    softmax, top-k, always renormalised
==============  ===========================  =====================================

Any other model raises a ``ValueError`` naming the model and the supported families;
``register_moe_family`` adds a family with the same router contract.

Nothing in transformers is forked: everything is done with forward hooks that are removed when
the context exits, so outside a context the model is exactly the plain model.

Routing tensors
---------------
A *routing* is an integer tensor ``(B, L, n_layers, k)`` of expert indices, position-aligned
with the model's input ids ``(B, L)`` (left-padded prompt + response + right pad): entry
``[b, p, l]`` holds the top-k experts that MoE layer ``l`` (in module order) chose for the token
at column ``p`` when it was fed to the model. The dtype is compact (``torch.uint8`` when the
model has at most 255 experts, ``torch.int16`` otherwise). Positions that were never fed to the
model (the last sampled token, right padding) hold the sentinel ``missing_index(dtype)``
(255 for uint8, -1 for int16): replay lets the current router choose there, and the diagnostics
leave them out.

Recording (rollout time or any forward)::

    with RoutingRecorder(model) as rec:
        rollout = sample(model, tok, prompts, max_new_tokens=..)  # prefill (B, P), then (B, 1)
    routing = rec.routing(length=rollout.input_ids.shape[1])   # (B, L, n_layers, k)

The recorder keeps per layer the ``top_k_index`` the experts module actually received, so
inside a replay it records the replayed experts.

Replay (training time)::

    with routing_replay(model, routing) as rp:       # or routing[rows] for a micro-batch
        logp, _ = token_logprobs(model, input_ids, attention_mask, response_start)
    natural = rp.router_routing()                     # what the current router would pick

The replayed top-k weights are ``softmax(current logits)`` gathered at the recorded indices and
renormalised exactly as the family does, so they stay differentiable in the router; with
``replay_weights=True`` the recorded weights (``RoutingRecorder(record_weights=True)``) are
replayed too. With unchanged weights replay reproduces the plain forward bitwise.

A forward under replay must see the same rows ``B`` as the routing (slice ``routing[rows]`` for
micro-batches); its ``S`` columns are matched to the routing's first ``S`` columns, and columns
beyond the routing's ``L`` count as missing (so a recording that lacks the last sampled token,
or trimmed right padding, both work).

Diagnostics (pure functions of tensors; detached tensors, no ``.item()``)::

    shift = router_shift(routing_rollout, routing_train, mask)   # RouterShift
    bal = load_balance(routing_rollout, num_experts, mask)        # LoadBalance
    metrics = moe_metrics(routing_rollout, routing_train, num_experts, mask)  # dict[str, 0-d]

Integration points for the trainer
----------------------------------
(a) Sampling: for an MoE policy (``is_moe(model)``), record the rollout::

        rec = RoutingRecorder(model)
        ro = sample(..., router_recorder=rec)          # or: with rec: ro = sample(...)
        routing = rec.routing(length=ro.input_ids.shape[1])   # kept with the rollout's rows

(b) Training: with ``routing_replay=True``, wrap the old-logp recomputation and every training
    forward in ``routing_replay(model, routing[rows])`` (rows of the micro-batch; trimming right
    columns is fine). Without replay, wrap the training forward in a ``RoutingRecorder`` to see
    where the current router sends the tokens.
(c) Logging, per update: the router's current choice is ``rp.router_routing()`` under replay
    (free) or ``rec.routing()`` of (b)'s recorder; gather the micro-batches with
    ``cat_routings(nows, length=L)`` and log
    ``moe_metrics(batch_routing, cat_routings(nows, L), num_experts, batch.mask)``: router shift
    overall / any layer / overlap / per layer on the response tokens (``mask`` (B, T) is
    right-aligned to the last T columns) and the rollout's expert-load balance.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = [
    "MoEFamily",
    "MoELayer",
    "RoutingRecorder",
    "RoutingReplay",
    "routing_replay",
    "RouterShift",
    "LoadBalance",
    "find_moe_layers",
    "is_moe",
    "register_moe_family",
    "supported_families",
    "routing_dtype",
    "missing_index",
    "cat_routings",
    "router_shift",
    "expert_load",
    "load_balance",
    "moe_metrics",
]


# --------------------------------------------------------------------------------------------
# Families and layer discovery
# --------------------------------------------------------------------------------------------


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
    families = []
    with contextlib.suppress(ImportError):
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

        families.append(
            MoEFamily("qwen3_moe", Qwen3MoeSparseMoeBlock, lambda r: bool(r.norm_topk_prob))
        )
    with contextlib.suppress(ImportError):
        from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock

        families.append(
            MoEFamily("qwen2_moe", Qwen2MoeSparseMoeBlock, lambda r: bool(r.norm_topk_prob))
        )
    with contextlib.suppress(ImportError):
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

        families.append(MoEFamily("mixtral", MixtralSparseMoeBlock, lambda r: True))
    return families


def supported_families() -> list[str]:
    """Names of the families this module can record and replay."""
    return [f.name for f in _builtin_families() + _EXTRA_FAMILIES]


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
    families = _builtin_families() + _EXTRA_FAMILIES
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
    """Whether ``model`` has routed MoE blocks this module supports."""
    try:
        find_moe_layers(model)
    except ValueError:
        return False
    return True


def routing_dtype(num_experts: int) -> torch.dtype:
    """Compact index dtype: uint8 up to 255 experts (255 is the sentinel), else int16."""
    if num_experts <= 255:
        return torch.uint8
    if num_experts <= 32767:
        return torch.int16
    raise ValueError(f"num_experts={num_experts} does not fit an int16 routing tensor")


def missing_index(dtype: torch.dtype) -> int:
    """Sentinel for positions that were never routed: 255 for uint8, -1 for signed dtypes."""
    return 255 if dtype == torch.uint8 else -1


def _block_shape_hook(shapes: dict[int, tuple[int, int]], i: int):
    """Forward pre-hook on a sparse MoE block: remember (B, S) of its (B, S, H) input."""

    def hook(module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        if hidden.dim() != 3:
            raise ValueError(
                f"MoE block {i} got hidden states of shape {tuple(hidden.shape)}; expected (B, S, H)"
            )
        shapes[i] = (hidden.shape[0], hidden.shape[1])

    return hook


# --------------------------------------------------------------------------------------------
# Recording
# --------------------------------------------------------------------------------------------


class RoutingRecorder:
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
        self.model = model
        self.layers = find_moe_layers(model)
        self.num_experts = self.layers[0].num_experts
        self.top_k = self.layers[0].top_k
        self.n_layers = len(self.layers)
        self.dtype = routing_dtype(self.num_experts)
        self.record_weights = record_weights
        self._handles: list[Any] = []
        self._depth = 0
        self._shapes: dict[int, tuple[int, int]] = {}
        self.clear()

    def clear(self) -> None:
        """Forget everything recorded so far (the hooks stay installed)."""
        self._index: list[list[torch.Tensor]] = [[] for _ in self.layers]
        self._weight: list[list[torch.Tensor]] = [[] for _ in self.layers]

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
        if self._depth > 1:  # nested use of the same recorder (e.g. trainer and sampler): one set of hooks
            return self
        for i, layer in enumerate(self.layers):
            self._handles.append(
                layer.block.register_forward_pre_hook(
                    _block_shape_hook(self._shapes, i), with_kwargs=True
                )
            )
            self._handles.append(
                layer.experts.register_forward_pre_hook(self._experts_hook(i), with_kwargs=True)
            )
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth > 0:
            return
        for handle in self._handles:
            handle.remove()
        self._handles = []

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
        if length is None or length == P:
            return out
        if length < P:
            raise ValueError(f"recorded {P} positions, more than the requested length {length}")
        pad = out.new_full((out.shape[0], length - P, *out.shape[2:]), fill)
        return torch.cat([out, pad], dim=1)  # (B, length, n_layers, k)

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


# --------------------------------------------------------------------------------------------
# Replay
# --------------------------------------------------------------------------------------------


def _check_routing(routing: torch.Tensor, layers: list[MoELayer]) -> None:
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
    return torch.cat([_fit_columns(r, length, sentinel) for r in routings], dim=0)


def _fit_columns(x: torch.Tensor, S: int, fill) -> torch.Tensor:
    """First S columns of x (B, L, ...); columns beyond L are filled with ``fill`` (missing)."""
    if S <= x.shape[1]:
        return x[:, :S]
    pad = x.new_full((x.shape[0], S - x.shape[1], *x.shape[2:]), fill)
    return torch.cat([x, pad], dim=1)


class RoutingReplay:
    """Context manager forcing each MoE layer to use recorded experts (see ``routing_replay``)."""

    def __init__(
        self,
        model: nn.Module,
        routing: torch.Tensor,
        *,
        weights: torch.Tensor | None = None,
        replay_weights: bool = False,
    ):
        self.model = model
        self.layers = find_moe_layers(model)
        _check_routing(routing, self.layers)
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
        self._shapes: dict[int, tuple[int, int]] = {}
        self._natural: dict[int, torch.Tensor] = {}
        self._handles: list[Any] = []

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
            rec = _fit_columns(self._on(self.routing, top_k_index.device)[:, :, i], S, self._sentinel)
            rec = rec.long().reshape(B * S, -1)  # (N, k)
            missing = (rec == self._sentinel).any(-1, keepdim=True)  # (N, 1)
            index = torch.where(missing, top_k_index, rec)  # (N, k)
            if self.replay_weights:
                w_rec = self._on(self.weights, top_k_weights.device)[:, :, i]
                w_rec = _fit_columns(w_rec, S, float("nan")).reshape(B * S, -1)  # (N, k)
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
        self._device_cache: dict[tuple[int, torch.device], torch.Tensor] = {}
        if self._handles:
            raise RuntimeError("RoutingReplay is already active")
        for i, layer in enumerate(self.layers):
            self._handles.append(
                layer.block.register_forward_pre_hook(
                    _block_shape_hook(self._shapes, i), with_kwargs=True
                )
            )
            self._handles.append(layer.router.register_forward_hook(self._router_hook(i, layer)))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
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


# --------------------------------------------------------------------------------------------
# Diagnostics
# --------------------------------------------------------------------------------------------


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


def _valid(routing: torch.Tensor) -> torch.Tensor:
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
    valid = m[:, :Lc, None] & _valid(a) & _valid(b)  # (B, Lc, n_layers)
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
    m = _position_mask(mask, B, L, routing.device)[:, :, None] & _valid(routing)  # (B, L, nl)
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
    plogp = torch.where(load > 0, load * load.clamp(min=1e-30).log(), torch.zeros_like(load))
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
