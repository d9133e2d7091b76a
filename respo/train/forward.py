"""The training forward: the micro-batches a mini-batch is cut into and the forward pass that scores them.

Both sides of the loop score responses with this forward: the update (`respo.train.update`) for the
gradient and the rollout side (`respo.train.rollout`) for ``old_logp``, over the same `micro_batches`, with
the same trimming, module mode, precision and MoE routing, so the two agree bitwise before any update.
Both read the same slice of the run's config, `respo.train.config.Forward`.

Micro-batching: each mini-batch is processed in chunks of consecutive rows, ``micro_batch`` rows each
or, with ``micro_batch_tokens``, as many rows as fit a budget of padded tokens (`micro_batches`).

Device and precision: a `Batch` lives on the CPU (buffer, checkpoints, metrics); each micro-batch is
moved to the model's device for its forward, which runs in the run's ``dtype``
(`respo.runtime.precision.mixed_precision`); log-probs come back as float32.

MoE routing is decided in one place, `ForwardRouting`: sampling records the experts every token
used; the ``old_logp`` and training forwards replay them (``routing_replay``) or, for the training
forward, record what the current router picks, so the router shift since the rollout is logged.

Shared prompts (``share_prompts``, on by default): the rows of a micro-batch that share their prompt
columns (a group's G responses) run the prompt once
(`respo.runtime.logprobs.shared_prefix_token_logprobs`), both in the ``old_logp`` recompute and in the
training forward, so the two still agree bitwise; the result equals one forward per row up to float
rounding. Where no two rows of a micro-batch share a prompt, where their replayed prompt routings differ,
with ``compile`` or with a model that cannot take it, the micro-batch runs one forward per row
(`forward_path` says which a run takes; config.json records it).
"""

from __future__ import annotations

import torch

from respo.core.moe_diagnostics import missing_index
from respo.runtime import moe
from respo.runtime.moe.routing import fit_columns
from respo.runtime.logprobs import can_share_prompts, prompt_groups, shared_prefix_token_logprobs, token_logprobs
from respo.runtime.precision import mixed_precision
from respo.train.buffer import Batch
from respo.train.config import Forward, MicroBatching

__all__ = ["ForwardRouting", "replayed_routing", "micro_batches", "training_forward", "forward_path", "score",
           "forward_logprobs"]


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


def replayed_routing(batch: Batch, forward: Forward, model) -> torch.Tensor | None:
    """The routing a training-side forward over ``batch`` replays, on the model's device (None: the
    router decides)."""
    if not forward.routing_replay or batch.routing is None:
        return None
    return batch.routing.to(next(model.parameters()).device)


def micro_batches(mask: torch.Tensor, response_start: int, micro: MicroBatching) -> list[tuple[int, int]]:
    """Row ranges [i, j) covering a mini-batch in order, one per forward/backward.

    Rows mode (``micro.tokens = 0``): ``micro.rows`` rows each (0: one range of all rows).
    Tokens mode: consecutive rows are packed while the trimmed forward stays within the budget,

        cost([i, j)) = (j - i) * (response_start + max_{i <= r < j} len_r) <= micro.tokens,

    with len_r the response length of row r (a range holds at least one row). E.g. budget 40,
    response_start 6: lengths [2, 4, 4, 1] give one range [0, 4) (4 * (6 + 4) = 40 fits); lengths
    [2, 14, 4, 1] give [0, 2) (2 * 20 = 40 fits, 3 rows would cost 60) and [2, 4) (2 * 10 = 20).

    Args:
        mask: (S, T) response mask of the mini-batch.
    """
    S = mask.shape[0]
    if not micro.tokens:
        m = micro.rows or S
        return [(i, min(i + m, S)) for i in range(0, S, m)]
    lengths = mask.sum(1).long().tolist()  # (S,)
    out, i, longest = [], 0, 0
    for j, n in enumerate(lengths):
        longest_with = max(longest, n)
        if j > i and (j + 1 - i) * (response_start + max(longest_with, 1)) > micro.tokens:
            out.append((i, j))
            i, longest_with = j, n
        longest = longest_with
    out.append((i, S))
    return out


def training_forward(model, forward: Forward):
    """What the old-logp and training forwards call: ``model``, or with ``forward.compile`` its compiled
    wrapper (``torch.compile(model, dynamic=True)``, built once per model, sharing its parameters)."""
    if not forward.compile:
        return model
    compiled = model.__dict__.get("_respo_compiled")  # a plain attribute: not a submodule, not in state_dict
    if compiled is None:
        compiled = torch.compile(model, dynamic=True)
        model.__dict__["_respo_compiled"] = compiled
    return compiled


def forward_path(model, forward: Forward) -> str:
    """How the run's forwards treat rows that share a prompt: ``"shared prompts"`` or
    ``"one forward per row (<why>)"``."""
    if not forward.share_prompts:
        why = "share_prompts is off"
    elif forward.compile:
        why = "compile is on"
    elif forward.group_size < 2:
        why = "group_size 1: no two rows share a prompt"
    else:
        why = can_share_prompts(model)
    return "shared prompts" if why is None else f"one forward per row ({why})"


def _shared_rows(model, mb: Batch, forward: Forward, replay: torch.Tensor | None):
    """``(first, group)`` of the micro-batch's rows that share a prompt (`prompt_groups`), or None where the
    run or the micro-batch takes one forward per row."""
    if not forward_path(model, forward).startswith("shared"):
        return None
    share = prompt_groups(mb.input_ids, mb.attention_mask, mb.response_start)
    if share is None:
        return None
    first, group = share
    P = mb.response_start
    if replay is not None and not torch.equal(replay[:, :P], replay[first.to(replay.device)][group.to(replay.device), :P]):
        return None  # the rows' recorded prompt experts differ: each row replays its own
    return share


def score(model, mb: Batch, forward: Forward, *, with_entropy: bool = False, record: bool = False):
    """One micro-batch's forward: ``(logp, entropy, routing)``.

    ``token_logprobs`` of the micro-batch on the model's device in ``forward.dtype`` (float32 (m, t) results),
    its prompts shared where the rows share them (see the module docstring), under the run's MoE routing
    (`replayed_routing`). With ``record`` (an MoE policy) ``routing`` is what the current router picks,
    ``(m, L, n_layers, k)``; otherwise None.
    """
    device = next(model.parameters()).device
    replay = replayed_routing(mb, forward, model)
    ids, attn, P = mb.input_ids.to(device), mb.attention_mask.to(device), mb.response_start
    share = _shared_rows(model, mb, forward, replay)
    with mixed_precision(model, forward.dtype):
        if share is None:
            with ForwardRouting(model, replay=replay, record=record) as routing:
                logp, ent = token_logprobs(training_forward(model, forward), ids, attn, P,
                                           temperature=forward.temperature, with_entropy=with_entropy)
            return logp, ent, routing.current(length=ids.shape[1]) if record else None
        first, group = (x.to(device) for x in share)
        on_prompt = ForwardRouting(model, replay=None if replay is None else replay[first, :P], record=record)
        pieces: list[tuple[torch.Tensor, ForwardRouting]] = []  # (rows, routing) of each response pass

        def on_response(rows: torch.Tensor) -> ForwardRouting:
            pieces.append((rows, ForwardRouting(model, replay=None if replay is None else replay[rows, P:],
                                                record=record)))
            return pieces[-1][1]

        logp, ent = shared_prefix_token_logprobs(model, ids, attn, P, first, group, temperature=forward.temperature,
                                                 with_entropy=with_entropy, prompt_context=lambda: on_prompt,
                                                 response_context=on_response)
    if not record:
        return logp, ent, None
    T = ids.shape[1] - P
    prompt_now = on_prompt.current(length=P)
    parts = [(rows, r.current(length=T)) for rows, r in pieces]
    if prompt_now is None or any(now is None for _, now in parts):
        return logp, ent, None
    response_now = prompt_now.new_full((ids.shape[0], T, *prompt_now.shape[2:]), missing_index(prompt_now.dtype))
    for rows, now in parts:  # each piece's columns; beyond its trim, missing (as right padding is)
        response_now[rows.to(now.device)] = fit_columns(now, T, missing_index(now.dtype))
    return logp, ent, torch.cat([prompt_now[group.to(prompt_now.device)], response_now], dim=1)  # (m, L, n_layers, k)


def forward_logprobs(model, mb: Batch, forward: Forward, *, with_entropy: bool = False):
    """`score` without routing: float32 (m, t) ``logp`` and ``entropy`` (or None)."""
    logp, ent, _ = score(model, mb, forward, with_entropy=with_entropy)
    return logp, ent
