"""The training forward: the micro-batches a mini-batch is cut into and the forward pass that scores them.

Both sides of the loop score responses with this forward: the update (`respo.train.update`) for the
gradient and the rollout side (`respo.train.rollout`) for ``old_logp``, over the same `micro_batches`, with
the same trimming, module mode, precision and MoE routing, so the two agree bitwise before any update.

Micro-batching: each mini-batch is processed in chunks of consecutive rows, ``micro_batch`` rows each
or, with ``micro_batch_tokens``, as many rows as fit a budget of padded tokens (`micro_batches`).

Device and precision: a `Batch` lives on the CPU (buffer, checkpoints, metrics); each micro-batch is
moved to the model's device for its forward, which runs in ``cfg.dtype``
(`respo.runtime.precision.mixed_precision`); log-probs come back as float32.

MoE routing is decided in one place, `ForwardRouting`: sampling records the experts every token
used; the ``old_logp`` and training forwards replay them (``routing_replay``) or, for the training
forward, record what the current router picks, so the router shift since the rollout is logged.
"""

from __future__ import annotations

import torch

from respo.runtime import moe
from respo.runtime.logprobs import token_logprobs
from respo.runtime.precision import mixed_precision
from respo.train.buffer import Batch
from respo.train.config import TrainConfig

__all__ = ["ForwardRouting", "replayed_routing", "micro_batches", "training_forward", "forward_logprobs"]


class ForwardRouting:
    """Context for one forward pass of an MoE policy (a no-op for dense ones).

    Args:
        model: the policy.
        replay: ``(S, L, n_layers, k)`` recorded experts to force on the forward, or None.
        record: record the experts the router picks (when nothing is replayed and the model is MoE).

    Inside (or after) the context, `current(length)` is the routing the current router picks,
    ``(S, length, n_layers, k)``: its natural choice under replay, what it did when recording,
    None otherwise.
    """

    def __init__(self, model, *, replay: torch.Tensor | None = None, record: bool = False):
        self._replay = moe.routing_replay(model, replay) if replay is not None else None
        self._recorder = moe.RoutingRecorder(model) if replay is None and record and moe.is_moe(model) else None

    def __enter__(self) -> "ForwardRouting":
        for ctx in (self._replay, self._recorder):
            if ctx is not None:
                ctx.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for ctx in (self._replay, self._recorder):
            if ctx is not None:
                ctx.__exit__(*exc)

    def current(self, length: int) -> torch.Tensor | None:
        if self._replay is not None:
            return self._replay.router_routing()
        if self._recorder is not None:
            return self._recorder.routing(length=length)
        return None


def replayed_routing(batch: Batch, cfg: TrainConfig, model) -> torch.Tensor | None:
    """The routing a training-side forward over ``batch`` replays, on the model's device (None: the
    router decides)."""
    if not cfg.routing_replay or batch.routing is None:
        return None
    return batch.routing.to(next(model.parameters()).device)


def micro_batches(mask: torch.Tensor, response_start: int, cfg: TrainConfig) -> list[tuple[int, int]]:
    """Row ranges [i, j) covering a mini-batch in order, one per forward/backward.

    Rows mode (``micro_batch_tokens = 0``): ``micro_batch`` rows each (0: one range of all rows).
    Tokens mode: consecutive rows are packed while the trimmed forward stays within the budget,

        cost([i, j)) = (j - i) * (response_start + max_{i <= r < j} len_r) <= micro_batch_tokens,

    with len_r the response length of row r (a range holds at least one row). E.g. budget 40,
    response_start 6: lengths [2, 4, 4, 1] give one range [0, 4) (4 * (6 + 4) = 40 fits); lengths
    [2, 14, 4, 1] give [0, 2) (2 * 20 = 40 fits, 3 rows would cost 60) and [2, 4) (2 * 10 = 20).

    Args:
        mask: (S, T) response mask of the mini-batch.
    """
    S = mask.shape[0]
    if not cfg.micro_batch_tokens:
        m = cfg.micro_batch or S
        return [(i, min(i + m, S)) for i in range(0, S, m)]
    lengths = mask.sum(1).long().tolist()  # (S,)
    out, i, longest = [], 0, 0
    for j, n in enumerate(lengths):
        longest_with = max(longest, n)
        if j > i and (j + 1 - i) * (response_start + max(longest_with, 1)) > cfg.micro_batch_tokens:
            out.append((i, j))
            i, longest_with = j, n
        longest = longest_with
    out.append((i, S))
    return out


def training_forward(model, cfg: TrainConfig):
    """What the old-logp and training forwards call: ``model``, or with ``cfg.compile`` its compiled
    wrapper (``torch.compile(model, dynamic=True)``, built once per model, sharing its parameters)."""
    if not cfg.compile:
        return model
    compiled = model.__dict__.get("_respo_compiled")  # a plain attribute: not a submodule, not in state_dict
    if compiled is None:
        compiled = torch.compile(model, dynamic=True)
        model.__dict__["_respo_compiled"] = compiled
    return compiled


def forward_logprobs(model, mb: Batch, cfg: TrainConfig, *, with_entropy: bool = False):
    """``token_logprobs`` of a micro-batch on the model's device in ``cfg.dtype``; float32 (m, t) results."""
    device = next(model.parameters()).device
    with mixed_precision(model, cfg.dtype):
        return token_logprobs(training_forward(model, cfg), mb.input_ids.to(device), mb.attention_mask.to(device),
                              mb.response_start, temperature=cfg.temperature, with_entropy=with_entropy)
