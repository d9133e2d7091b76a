"""The trainer's recomputation of response log-probs (one full forward, no KV cache).

Layout shared with the sampler: prompts are LEFT-padded to a common length ``response_start``
(= P), responses follow from column P, right padding after each response's EOS:

    input_ids (B, L) = [pad .. pad, prompt | response tokens, pad .. pad]
                        <------ P ------->  <--------- T = L - P -------->

Positions are ``position_ids = cumsum(attention_mask) - 1`` (clamped at 0 on the pads), so a
row's positions do not depend on how much left padding its batch needed, exactly as in the
sampler. For response token t (column P + t) the log-prob comes from the logits at column
P + t - 1:

    logp[b, t] = log_softmax(logits[b, P + t - 1] / temperature)[input_ids[b, P + t]]

Large vocabularies: the float32 logits of a whole batch (B × T × V; 64 × 192 × 49,152 is 2.4 GB,
and autograd keeps them for the backward) are never materialised when they would exceed
``LOGITS_BUDGET`` elements. The decoder runs once; the output layer, log-softmax, gather and entropy
then run over chunks of at most ``LOGITS_BUDGET // V`` response positions, each under activation
checkpointing (its logits are recomputed in the backward instead of kept), so peak logits memory is
one chunk. Below the budget the output layer runs once, its logits kept for the backward (a micro-batch
of 8 responses of 120 tokens of a 49,152-token vocabulary is 190 MB). The entropy is a diagnostic: it is
computed without a graph, so it keeps no vocabulary-wide tensor alive.

Shared prompts (`shared_prefix_token_logprobs`): the G responses of a group share their prompt columns.
The decoder then runs the prompt once per group (with its key/value states kept, and differentiable)
and the responses on top of those states expanded over the group, so the prompt's work is done once
instead of G times, and its gradient is the sum of what every response sends back through it: the same
function of the weights as the unshared forward, equal up to float rounding.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache

#: Most logits (elements) materialised at once; above it the output layer runs in chunks under activation
#: checkpointing (its projection computed twice). 2**26 float32 elements is 256 MiB: a micro-batch of 8
#: responses of up to 170 tokens of a 49,152-token vocabulary keeps its logits.
LOGITS_BUDGET = 1 << 26


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only: cumsum(mask) - 1, clamped at 0.

    Args:
        attention_mask: (B, L) 0/1.

    Returns:
        (B, L) long; the first real token of every row is at position 0.
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)  # (B, L)


def logprobs_from_logits(
    logits: torch.Tensor, tokens: torch.Tensor, *, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(logits)[tokens] and optionally the entropy, in float32.

    Args:
        logits: (..., V) already divided by the temperature.
        tokens: (...) long indices into V.

    Returns:
        logp (...) and entropy (...) = -Σ_v p_v log p_v (or None), the entropy detached.
    """
    logits = logits.float()
    log_z = torch.logsumexp(logits, dim=-1)  # (...)
    logp = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - log_z  # (...)
    entropy = None
    if with_entropy:  # a diagnostic: no graph, so no (..., V) tensor is kept for the backward
        with torch.no_grad():
            log_p = logits - log_z.unsqueeze(-1)  # (..., V)
            entropy = -(log_p.exp() * log_p).sum(-1)  # (...)
    return logp, entropy


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_start: int,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of the response tokens ``input_ids[:, response_start:]`` under ``model``.

    Gradients flow when called outside ``torch.no_grad``. Masked (padding) response positions
    get a finite but meaningless value: multiply by the response mask.

    Args:
        model: a Hugging Face causal LM.
        input_ids: (B, L) long, prompts left-padded to ``response_start`` columns.
        attention_mask: (B, L) 0/1.
        response_start: P, the column where every response starts (1 <= P < L).
        temperature: logits are divided by it (must be > 0; match the sampler's).
        with_entropy: also return the per-token entropy of the tempered distribution.

    Returns:
        logp (B, T) float32 and entropy (B, T) float32 or None, with T = L - P.
    """
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"input_ids and attention_mask must be (B, L) of the same shape, got "
            f"{tuple(input_ids.shape)} and {tuple(attention_mask.shape)}"
        )
    L = input_ids.shape[1]
    if not 1 <= response_start < L:
        raise ValueError(f"response_start must be in [1, {L - 1}] for L = {L}, got {response_start}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    T = L - response_start
    V = model.get_output_embeddings().weight.shape[0]
    if input_ids.shape[0] * (T + 1) * V > LOGITS_BUDGET and _chunkable(model):
        return _chunked_token_logprobs(model, input_ids, attention_mask, response_start, temperature, with_entropy)
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
        logits_to_keep=T + 1,  # columns P-1 .. L-1; the last one predicts nothing we score
    )
    logits = out.logits[:, :-1]  # (B, T, V): column P+t-1 predicts token P+t
    if temperature != 1.0:
        logits = logits / temperature
    return logprobs_from_logits(logits, input_ids[:, response_start:], with_entropy=with_entropy)


def _chunkable(model: torch.nn.Module) -> bool:
    """The model splits into a decoder (``base_model_prefix``) and an output layer with nothing in between."""
    config = getattr(model, "config", None)
    prefix = getattr(model, "base_model_prefix", "")
    return (config is not None and bool(prefix) and hasattr(model, prefix)
            and not getattr(config, "final_logit_softcapping", None))


def _head_logprobs(head: torch.nn.Module, h: torch.Tensor, tokens: torch.Tensor, temperature: float,
                   with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """logp and entropy of one chunk: h (n, D) hidden states, tokens (n,) long.

    Under autocast (``respo.runtime.precision.mixed_precision``) the output layer runs in float32 with
    autocast off, here explicitly: the checkpoint's recomputation in the backward runs outside the
    context whose hooks do that in the forward, and must give the same float32 logits.
    """
    if torch.is_autocast_enabled(h.device.type):
        with torch.autocast(h.device.type, enabled=False):
            logits = head(h.float())  # (n, V) float32
    else:
        logits = head(h)  # (n, V)
    if temperature != 1.0:
        logits = logits / temperature
    logp, entropy = logprobs_from_logits(logits, tokens, with_entropy=with_entropy)
    return logp, entropy if entropy is not None else torch.zeros_like(logp)


def _chunked_token_logprobs(model, input_ids, attention_mask, response_start, temperature, with_entropy):
    """``token_logprobs`` with the output layer over chunks of positions, each checkpointed."""
    hidden = getattr(model, model.base_model_prefix)(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    ).last_hidden_state  # (B, L, D)
    h = hidden[:, response_start - 1 : -1]  # (B, T, D): column P+t-1 predicts token P+t
    return _output_layer_logprobs(model, h, input_ids[:, response_start:], temperature, with_entropy)


def _output_layer_logprobs(model, h: torch.Tensor, tokens: torch.Tensor, temperature: float,
                           with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logp (and entropy) of ``tokens`` (B, T) from the final hidden states ``h`` (B, T, D) that predict them:
    the output layer at once within ``LOGITS_BUDGET``, else over checkpointed chunks of positions."""
    B, T, D = h.shape
    head = model.get_output_embeddings()
    h, tokens = h.reshape(-1, D), tokens.reshape(-1)  # (B*T, D), (B*T,)
    step = max(1, LOGITS_BUDGET // head.weight.shape[0])
    if h.shape[0] <= step:  # the logits fit: one pass of the output layer, its logits kept for the backward
        logp, ent = _head_logprobs(head, h, tokens, temperature, with_entropy)
        return logp.view(B, T), ent.view(B, T) if with_entropy else None
    logps, entropies = [], []
    for i in range(0, h.shape[0], step):
        args = (head, h[i : i + step], tokens[i : i + step], temperature, with_entropy)
        if torch.is_grad_enabled():
            lp, ent = checkpoint(_head_logprobs, *args, use_reentrant=False)
        else:
            lp, ent = _head_logprobs(*args)
        logps.append(lp)
        entropies.append(ent)
    logp = torch.cat(logps).view(B, T)  # (B, T)
    return logp, torch.cat(entropies).view(B, T) if with_entropy else None


def prompt_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  response_start: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The rows that share their prompt: ``(first, group)`` or None when no two rows do.

    Two rows share a prompt when their first ``response_start`` columns of ``input_ids`` and
    ``attention_mask`` are equal. ``first`` (n,) holds the first row of each of the n distinct prompts, in
    row order; ``group`` (B,) the index into ``first`` of every row's prompt. E.g. rows with prompts
    [a, a, b, a] give first = [0, 2], group = [0, 0, 1, 0].
    """
    P = response_start
    keys: dict[bytes, int] = {}
    first, group = [], []
    cols = torch.cat([input_ids[:, :P], attention_mask[:, :P].to(input_ids.dtype)], dim=1).cpu()  # (B, 2P)
    for r, row in enumerate(cols):
        k = row.numpy().tobytes()
        if k not in keys:
            keys[k] = len(first)
            first.append(r)
        group.append(keys[k])
    if len(first) == len(group):
        return None
    device = input_ids.device
    return torch.tensor(first, device=device), torch.tensor(group, device=device)


def can_share_prompts(model: torch.nn.Module) -> str | None:
    """Why ``model`` cannot take `shared_prefix_token_logprobs`, or None when it can (a decoder under
    ``base_model_prefix`` that returns a `DynamicCache`-style key/value cache, then the output layer)."""
    if not _chunkable(model):
        return "the model does not split into a decoder and an output layer (or soft-caps its logits)"
    config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "the model attends through a sliding window"
    if getattr(config, "is_encoder_decoder", False):
        return "the model is an encoder-decoder"
    return None


ContextFactory = Callable[..., AbstractContextManager]


def shared_prefix_token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_start: int,
    first: torch.Tensor,
    group: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    prompt_context: ContextFactory = nullcontext,
    response_context: ContextFactory = lambda rows: nullcontext(),
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`token_logprobs` with each distinct prompt run once (see the module docstring).

    The decoder runs the n prompts ``input_ids[first, :P]`` and keeps their key/value states (with their
    graph); the states are expanded to the rows by ``group`` and the responses ``input_ids[:, P:]`` run on
    them, at the positions the unshared forward gives them, in `response_pieces` (rows of similar length,
    each piece trimmed to its own longest response, so less padding is computed). Response token 0 is predicted by the
    prompt's last hidden state, token t > 0 by the response's column t - 1, so

        logp[b, t] = token_logprobs(...)[b, t]        up to float rounding,

    and the gradient reaching the shared prompt states is the sum over the group's rows.

    Args:
        first, group: `prompt_groups` of these rows (rows of one group must share their prompt columns).
        prompt_context, response_context: context factories entered around the decoder's prompt pass and
            around each response pass, ``response_context(rows)`` with the rows (B',) that pass runs (e.g. MoE
            routing replay of each part's recorded experts).

    Returns:
        logp (B, T) float32 and entropy (B, T) float32 (detached) or None, with T = L - P.
    """
    P, L = response_start, input_ids.shape[1]
    if not 1 <= P < L:
        raise ValueError(f"response_start must be in [1, {L - 1}] for L = {L}, got {response_start}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    decoder = getattr(model, model.base_model_prefix)
    p_mask = attention_mask[first, :P]  # (n, P)
    with prompt_context():
        prompt = decoder(input_ids=input_ids[first, :P], attention_mask=p_mask,
                         position_ids=position_ids_from_mask(p_mask), use_cache=True)
    states = [(layer.keys, layer.values) for layer in prompt.past_key_values.layers]  # (n, H, P, d) each, with grad
    positions = position_ids_from_mask(attention_mask)  # (B, L)
    B, T = input_ids.shape[0], L - P
    logp = torch.zeros(B, T, device=input_ids.device)
    ent = torch.zeros(B, T, device=input_ids.device) if with_entropy else None
    last = prompt.last_hidden_state[:, -1:]  # (n, 1, D): predicts response token 0
    for rows, t in response_pieces(attention_mask[:, P:].sum(1)):  # rows of similar length, each trimmed to t
        g = group[rows]
        cache = DynamicCache([(k[g], v[g]) for k, v in states])  # each row on its prompt's states
        with response_context(rows):
            hidden = decoder(input_ids=input_ids[rows, P:P + t], attention_mask=attention_mask[rows, :P + t],
                             position_ids=positions[rows, P:P + t], past_key_values=cache,
                             use_cache=True).last_hidden_state  # (r, t, D)
        h = torch.cat([last[g], hidden[:, :-1]], dim=1)  # (r, t, D): column t' predicts response token t'
        lp, e = _output_layer_logprobs(model, h, input_ids[rows, P:P + t], temperature, with_entropy)
        logp = logp.index_put((rows.unsqueeze(1), torch.arange(t, device=logp.device)), lp)
        if with_entropy:
            ent = ent.index_put((rows.unsqueeze(1), torch.arange(t, device=ent.device)), e)
    return logp, ent


#: A micro-batch's responses are split into two length-sorted pieces when that saves at least this share of its
#: padded response columns (each piece is trimmed to its own longest response).
PIECE_MIN_SAVING = 0.1


def response_pieces(lengths: torch.Tensor) -> list[tuple[torch.Tensor, int]]:
    """Rows of a shared-prompt micro-batch grouped for the response pass: ``[(rows, columns), ...]``.

    One piece of every row at the longest length, or, when that saves at least `PIECE_MIN_SAVING` of the padded
    columns, two pieces of the rows sorted by length (the longer half, then the shorter half, each trimmed to
    its own longest). E.g. lengths [10, 2, 9, 3]: one piece costs 4 x 10 = 40 columns, two cost 2 x 10 + 2 x 3
    = 26, a saving of 35 %: pieces ([0, 2], 10) and ([3, 1], 3).

    Args:
        lengths: (B,) response tokens of each row (>= 0).
    """
    B = lengths.shape[0]
    longest = max(int(lengths.max()), 1) if B else 1
    order = torch.argsort(lengths, descending=True, stable=True)
    one = [(torch.arange(B, device=lengths.device), longest)]
    if B < 2:
        return one
    half = (B + 1) // 2
    short = max(int(lengths[order[half:]].max()), 1)
    if (half * longest + (B - half) * short) > (1 - PIECE_MIN_SAVING) * B * longest:
        return one
    return [(order[:half], longest), (order[half:], short)]
