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

Any other model raises a ``ValueError`` naming the model and the supported families.

Adding a model family
---------------------
A family whose sparse MoE block has this router/experts contract needs no new code:

- built in: add a row ``(model_type, module, block class name, normalises)`` to
  ``families.BUILTIN_FAMILIES``, where ``normalises(router) -> bool`` says whether the family
  renormalises its top-k probabilities (e.g. the router's ``norm_topk_prob``), and add the
  family to the tiny-model configs of ``tests/runtime/test_moe.py``;
- at run time: ``register_moe_family(MoEFamily(model_type, BlockClass, normalises))``
  (``router_attr``/``experts_attr`` name the block's router and experts when they are not
  ``gate`` and ``experts``).

A block with another contract (a router that does not return the top-k, experts that do not
take ``top_k_index``) needs its own hooks in ``recorder.py`` and ``replay.py``.

Nothing in transformers is forked: recorder and replay install forward hooks the same way
(``hooks.LayerHooks``) and remove them when the context exits, so outside a context the model is
exactly the plain model.

Modules: ``families`` (family table, layer discovery), ``hooks`` (hook installation),
``routing`` (routing tensors), ``recorder``, ``replay``. The diagnostics, the routing dtype and
its sentinel are pure functions of tensors in the core: import them from ``respo.core`` (defined in
``respo.core.moe_diagnostics``); this package does not re-export them.

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

Diagnostics (``from respo.core import router_shift, load_balance, moe_metrics``; pure functions of
tensors, detached tensors, no ``.item()``)::

    shift = router_shift(routing_rollout, routing_train, mask)   # RouterShift
    bal = load_balance(routing_rollout, num_experts, mask)        # LoadBalance
    metrics = moe_metrics(routing_rollout, routing_train, num_experts, mask)  # dict[str, 0-d]

Integration points for the trainer
----------------------------------
The trainer does all three through ``respo.train.forward.ForwardRouting``.

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
    ``cat_routings(current_routings, length=L)`` and log
    ``moe_metrics(batch_routing, cat_routings(current_routings, L), num_experts, batch.mask)``: router shift
    overall / any layer / overlap / per layer on the response tokens (``mask`` (B, T) is
    right-aligned to the last T columns) and the rollout's expert-load balance.
"""

from .families import (
    BUILTIN_FAMILIES,
    MoEFamily,
    MoELayer,
    find_moe_layers,
    is_moe,
    register_moe_family,
    supported_families,
)
from .recorder import RoutingRecorder
from .replay import RoutingReplay, routing_replay
from .routing import cat_routings

__all__ = [
    "MoEFamily",
    "MoELayer",
    "BUILTIN_FAMILIES",
    "RoutingRecorder",
    "RoutingReplay",
    "routing_replay",
    "find_moe_layers",
    "is_moe",
    "register_moe_family",
    "supported_families",
    "cat_routings",
]
