"""Batched autoregressive sampling with a KV cache that records behaviour log-probs.

A hand-written decode loop over any Hugging Face causal LM (no ``generate()``): one prefill
forward over the left-padded prompts (logits at the last column only), then one (B, 1) forward
per step. Keys and values go into a cache allocated once for prompt + ``max_new_tokens``
positions and written in place (``PreallocatedLayer``), so a step costs what its new position
costs plus attention over the cache, never a copy of the cache.

By default rows never leave the batch: a row that has emitted EOS keeps being fed the pad token
(masked out of attention and of the response mask), so forward hooks on MoE blocks see all B
rows at every step (``respo.runtime.moe.RoutingRecorder`` relies on it). ``drop_finished=True``
instead takes finished rows out of the batch and the cache (not with a routing recorder).

Positions are ``cumsum(attention_mask) - 1`` as in ``respo.runtime.logprobs.token_logprobs``,
so with temperature 1 and top-p 1 the behaviour log-probs equal the trainer's recomputed
log-probs of the same tokens with the same weights (the identity test checks 1e-5 in float32).

The behaviour log-prob of a sampled token is its log-probability under the distribution it
was actually drawn from:

    q = softmax(logits / temperature), restricted to the top-p nucleus and renormalised
    behaviour_logp[b, t] = log q(y_bt)      (0 where the response mask is 0)

``temperature=0`` means greedy decoding; its behaviour log-probs are 0 (a point mass).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import Cache, DynamicLayer

from respo.errors import NonFiniteLogitsError

from .logprobs import position_ids_from_mask


class PreallocatedLayer(DynamicLayer):
    """One layer's KV cache in buffers allocated once for the whole rollout, written in place.

    ``DynamicLayer`` concatenates every step, copying the whole cache (cost O(n) per step, O(T²)
    per rollout). Here keys/values live in (B, H, capacity, D) buffers; a step of S new
    positions writes ``buffer[:, :, n : n + S]`` and attention reads the view
    ``buffer[:, :, : n + S]`` (no copy), so a step costs what its new positions cost. Lengths
    and masks are those of ``DynamicLayer``: the numbers equal a ``DynamicCache``'s.
    """

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        B, H, _, _ = key_states.shape
        self._key_buffer = key_states.new_empty(B, H, self.capacity, key_states.shape[-1])  # (B, H, C, Dk)
        self._value_buffer = value_states.new_empty(B, H, self.capacity, value_states.shape[-1])  # (B, H, C, Dv)
        self.keys = self._key_buffer[:, :, :0]
        self.values = self._value_buffer[:, :, :0]
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, S = self.length, key_states.shape[-2]
        if n + S > self.capacity:
            raise ValueError(f"KV cache capacity {self.capacity} exceeded ({n} cached + {S} new positions)")
        self._key_buffer[:, :, n : n + S].copy_(key_states)
        self._value_buffer[:, :, n : n + S].copy_(value_states)
        self.length = n + S
        self.keys = self._key_buffer[:, :, : self.length]  # (B, H, n + S, Dk) view
        self.values = self._value_buffer[:, :, : self.length]  # (B, H, n + S, Dv) view
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, max_length: int) -> None:
        raise NotImplementedError("PreallocatedLayer does not crop")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("PreallocatedLayer does not repeat rows")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows ``indices`` (A,): new (A, H, capacity, D) buffers, the cached part copied once."""
        if not self.is_initialized:
            return
        n = self.length
        for name in ("_key_buffer", "_value_buffer"):
            old = getattr(self, name)  # (B, H, C, D)
            new = old.new_empty(len(indices), *old.shape[1:])  # (A, H, C, D)
            new[:, :, :n] = old[indices, :, :n]
            setattr(self, name, new)
        self.keys = self._key_buffer[:, :, :n]
        self.values = self._value_buffer[:, :, :n]


def preallocated_cache(config, capacity: int) -> Cache:
    """A ``Cache`` of one ``PreallocatedLayer`` per decoder layer, each holding ``capacity`` positions.

    Only full-attention decoders (no sliding window or linear-attention layers) are supported.
    """
    text_config = config.get_text_config(decoder=True)
    layer_types = getattr(text_config, "layer_types", None) or ["full_attention"] * text_config.num_hidden_layers
    other = sorted(set(layer_types) - {"full_attention"})
    if other:
        raise ValueError(f"the preallocated KV cache supports full attention only, the model has {other} layers")
    return Cache(layers=[PreallocatedLayer(capacity) for _ in layer_types])


@dataclass
class Rollout:
    """One sampled batch, laid out like ``token_logprobs`` expects.

    Attributes:
        input_ids: (B, L) long: left-padded prompt, response, right pad (L = P + T).
        attention_mask: (B, L) long: 1 on prompt tokens and on response tokens up to EOS.
        response_start: P, the column where every response starts.
        response_mask: (B, T) float: 1 for generated tokens up to and including EOS.
        behaviour_logp: (B, T) float32: log q of each sampled token, 0 where masked.
        version: the policy version that sampled the batch.
        responses: B decoded responses (EOS and padding removed).
        prompts: the B prompts, as given.
        finished: (B,) bool: the row emitted EOS (False: cut at ``max_new_tokens``).
        routing: (B, L, n_layers, k) experts every token used (an MoE policy sampled by the respo
            engine), else None.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_start: int
    response_mask: torch.Tensor
    behaviour_logp: torch.Tensor
    version: int
    responses: list[str]
    prompts: list[str] = field(default_factory=list)
    finished: torch.Tensor | None = None
    routing: torch.Tensor | None = None

    @property
    def response_ids(self) -> torch.Tensor:
        """(B, T) long: the sampled tokens (pad where masked)."""
        return self.input_ids[:, self.response_start :]

    @property
    def response_lengths(self) -> torch.Tensor:
        """(B,) long: response tokens per row, EOS included."""
        return self.response_mask.sum(-1).long()


def nucleus_log_probs(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Log-probs of the top-p nucleus distribution (tokens outside it get -inf).

    The nucleus is the smallest set of most likely tokens whose mass reaches ``top_p`` (the
    most likely token is always kept), renormalised:

        q_v = p_v / Σ_{u ∈ nucleus} p_u   for v in the nucleus, else 0.

    Args:
        logits: (B, V) float, already divided by the temperature.
        top_p: in (0, 1]; 1 returns ``log_softmax(logits)``.

    Returns:
        (B, V) float log q.
    """
    logp = torch.log_softmax(logits, dim=-1)  # (B, V)
    if top_p >= 1.0:
        return logp
    sorted_logp, order = logp.sort(dim=-1, descending=True)  # (B, V)
    mass_before = sorted_logp.exp().cumsum(-1) - sorted_logp.exp()  # (B, V) mass of better tokens
    drop_sorted = mass_before >= top_p  # the first token has mass_before 0 < top_p: always kept
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # (B, V)
    return torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)


def sample_tokens(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row and return its log-prob under the distribution drawn from.

    Args:
        logits: (B, V) raw next-token logits.
        temperature: > 0 samples from softmax(logits / temperature); 0 is greedy.
        top_p: nucleus mass in (0, 1].
        generator: torch.Generator for reproducible draws.

    Returns:
        tokens (B,) long and behaviour log-probs (B,) float32.
    """
    logits = logits.float()
    if not bool(torch.isfinite(logits).all()):
        raise NonFiniteLogitsError("the policy's logits are not finite: its weights overflowed or are NaN")
    if temperature == 0:
        return logits.argmax(-1), torch.zeros(logits.shape[0], device=logits.device)
    if temperature != 1.0:
        logits = logits / temperature
    logq = nucleus_log_probs(logits, top_p)  # (B, V)
    q = logq.exp()  # (B, V)
    if generator is not None and generator.device != q.device:  # e.g. a CPU generator, CUDA model
        tokens = torch.multinomial(q.to(generator.device), 1, generator=generator).to(q.device).squeeze(-1)
    else:
        tokens = torch.multinomial(q, 1, generator=generator).squeeze(-1)  # (B,)
    return tokens, logq.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def pad_token_id(tokenizer) -> int | None:
    """The id rows are padded with: the tokenizer's pad token, else its EOS (None if it has neither)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def left_pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists to a common length P (works for tokenizers without a pad token).

    Returns:
        input_ids (B, P) long and attention_mask (B, P) long.
    """
    empty = [i for i, r in enumerate(rows) if not r]
    if empty:
        raise ValueError(f"{len(empty)} prompts encode to zero tokens (first: row {empty[0]})")
    P = max(len(r) for r in rows)
    ids = torch.full((len(rows), P), pad, dtype=torch.long)  # (B, P)
    mask = torch.zeros(len(rows), P, dtype=torch.long)  # (B, P)
    for b, r in enumerate(rows):
        ids[b, P - len(r) :] = torch.tensor(r, dtype=torch.long)
        mask[b, P - len(r) :] = 1
    return ids, mask


def _check_prompts(prompts) -> None:
    if isinstance(prompts, str) or not len(prompts):
        raise ValueError("prompts must be a non-empty list of strings")
    bad = [i for i, p in enumerate(prompts) if not isinstance(p, str)]
    if bad:
        raise ValueError(f"prompts must be strings; {len(bad)} rows are not (first: row {bad[0]})")


def _check_options(max_new_tokens, temperature, top_p) -> None:
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


@torch.no_grad()
def sample(model: torch.nn.Module, tokenizer, prompts: list[str], *, max_new_tokens: int, **options) -> Rollout:
    """Sample one response per prompt with a KV cache; record behaviour log-probs.

    The prompts are encoded with the tokenizer's special tokens and decoded from by `sample_ids`, which
    stores them in the rollout.

    Args:
        model: a Hugging Face causal LM (its mode is left as it is; the presets have no dropout).
        tokenizer: its tokenizer; prompts are encoded with its special tokens, left-padded.
        prompts: B prompt strings (repeat a prompt G times for a group).
        max_new_tokens, **options: the keyword arguments of `sample_ids` (all but ``prompts``).

    Returns:
        A ``Rollout``, as `sample_ids` returns it, with ``prompts`` stored in it.
    """
    _check_prompts(prompts)
    return sample_ids(model, tokenizer, tokenizer(list(prompts))["input_ids"], max_new_tokens=max_new_tokens,
                      **options, prompts=list(prompts))


@torch.no_grad()
def sample_ids(
    model: torch.nn.Module,
    tokenizer,
    rows: list[list[int]],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    version: int = 0,
    router_recorder=None,
    stop_at_eos: bool = True,
    drop_finished: bool = False,
    prompts: list[str] | None = None,
) -> Rollout:
    """Sample one response per row of token ids with a KV cache; record behaviour log-probs.

    Each of the B ``rows`` is a prompt already tokenized, or a prompt followed by the response generated so
    far (a partial rollout continued with other weights: the continuation's positions are those the tokens
    would have had in one pass, and the whole row is run again by ``model``, so every new token is drawn
    from ``model``'s distribution given all that precedes it). The Rollout's response holds the new tokens
    only.

    Args:
        model: a Hugging Face causal LM (its mode is left as it is; the presets have no dropout).
        tokenizer: its tokenizer (its EOS and pad ids; responses are decoded with it).
        rows: B token-id lists, left-padded here.
        max_new_tokens: the most response tokens per row (EOS included).
        temperature: sampling temperature (0 = greedy).
        top_p: nucleus sampling mass.
        generator: torch.Generator; the same seed gives the same rollout.
        version: the policy version stored in the rollout.
        router_recorder: optional context manager (e.g. ``respo.runtime.moe.RoutingRecorder``)
            entered around the prefill and every decode step.
        stop_at_eos: False keeps every row decoding for ``max_new_tokens`` steps (EOS is then
            an ordinary token; used by the benchmark to fix the work done).
        drop_finished: True takes rows that have emitted EOS out of the batch: whenever at most
            half of the rows in the cache are alive, the cache keeps only the live ones (one
            copy of the cached part; halving bounds the copies by about twice the cache), so
            finished rows stop costing decode work. The draws then come from a smaller batch:
            a seed gives other tokens than with False. Refused with ``router_recorder``
            (routing records need every row at every step).
        prompts: the prompt strings stored in the rollout as given (default: none).

    Returns:
        A ``Rollout``; T is the number of decode steps taken (<= max_new_tokens): decoding
        stops early once every row has emitted EOS.
    """
    if not isinstance(rows, (list, tuple)) or not rows:
        raise ValueError("rows must be a non-empty list of token-id lists")
    _check_options(max_new_tokens, temperature, top_p)
    if drop_finished and router_recorder is not None:
        raise ValueError("drop_finished=True would drop rows from the routing records; use one or the other")
    device = next(model.parameters()).device
    eos = tokenizer.eos_token_id
    pad = pad_token_id(tokenizer)
    if eos is None:
        raise ValueError("tokenizer has no eos_token_id: the sampler needs one to stop rows")
    prompt_ids, prompt_mask = left_pad([list(r) for r in rows], pad)  # (B, P)
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    B, P = prompt_ids.shape

    attn = torch.zeros(B, P + max_new_tokens, dtype=prompt_mask.dtype, device=device)  # (B, L_max)
    attn[:, :P] = prompt_mask
    tokens = torch.full((B, max_new_tokens), pad, dtype=torch.long, device=device)  # (B, T_max)
    logq = torch.zeros(B, max_new_tokens, dtype=torch.float32, device=device)  # (B, T_max)
    alive = torch.ones(B, dtype=torch.bool, device=device)  # (B,)
    next_pos = prompt_mask.sum(-1, keepdim=True)  # (B, 1) position of the next token
    cache = preallocated_cache(model.config, P + max_new_tokens)

    rows = None  # None: every row is in the batch; else (A,) long, the rows still decoding
    steps = 0
    with router_recorder if router_recorder is not None else nullcontext():
        out = model(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            position_ids=position_ids_from_mask(prompt_mask),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        for t in range(max_new_tokens):
            tok, lq = sample_tokens(out.logits[:, -1], temperature=temperature, top_p=top_p, generator=generator)
            if rows is None:  # every row is in the batch
                tokens[:, t] = torch.where(alive, tok, pad)
                logq[:, t] = torch.where(alive, lq, 0.0)
                attn[:, P + t] = alive
                if stop_at_eos:
                    alive = alive & (tok != eos)
            else:  # the batch holds rows `rows` (A,) of the rollout
                live = alive[rows]  # (A,)
                tokens[rows, t] = torch.where(live, tok, pad)
                logq[rows, t] = torch.where(live, lq, 0.0)
                attn[rows, P + t] = live.to(attn.dtype)
                if stop_at_eos:  # (rows only leave the batch when stop_at_eos is set)
                    alive[rows] = live & (tok != eos)
            steps = t + 1
            if steps == max_new_tokens or not bool(alive.any()):
                break  # the last sampled token is never fed back
            if drop_finished:
                live = alive if rows is None else alive[rows]  # (A,)
                if 2 * int(live.sum()) <= live.shape[0]:
                    keep = live.nonzero().squeeze(-1)  # (A',) positions in the current batch
                    rows = keep if rows is None else rows[keep]
                    cache.batch_select_indices(keep)
                    next_pos = next_pos[keep]
            out = model(
                input_ids=tokens[:, t : t + 1] if rows is None else tokens[rows, t : t + 1],
                attention_mask=attn[:, : P + t + 1] if rows is None else attn[rows, : P + t + 1],
                position_ids=next_pos,
                past_key_values=cache,
                use_cache=True,
            )
            next_pos = next_pos + 1

    tokens, logq = tokens[:, :steps], logq[:, :steps]  # (B, T)
    response_mask = attn[:, P : P + steps].float()  # (B, T)
    finished = ((tokens == eos) & (response_mask > 0)).any(-1)  # (B,)
    if not stop_at_eos:
        finished = torch.ones_like(finished)
    texts = []
    for row, n in zip(tokens.tolist(), response_mask.sum(-1).long().tolist()):
        row = row[:n]
        if stop_at_eos and row and row[-1] == eos:
            row = row[:-1]
        texts.append(tokenizer.decode(row, skip_special_tokens=True))
    return Rollout(
        input_ids=torch.cat([prompt_ids, tokens], dim=1),
        attention_mask=attn[:, : P + steps].clone(),
        response_start=P,
        response_mask=response_mask,
        behaviour_logp=logq.clone(),
        version=version,
        responses=texts,
        prompts=list(prompts or []),
        finished=finished,
    )
