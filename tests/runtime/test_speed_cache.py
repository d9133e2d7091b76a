"""The sampler's preallocated KV cache gives a DynamicCache's numbers without growing per step."""

import pytest
import torch
from transformers import DynamicCache

from respo.runtime.logprobs import position_ids_from_mask
from respo.runtime.models import build_policy
from respo.runtime.sampler import PreallocatedLayer, left_pad, preallocated_cache
from respo.runtime.tokenizer import build_char_tokenizer


def _decode_logits(model, cache, ids, mask, steps):
    """Prefill then ``steps`` greedy (B, 1) steps; the logits of every step, (B, steps + 1, V)."""
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                past_key_values=cache, use_cache=True, logits_to_keep=1)
    logits, pos = [out.logits[:, -1]], mask.sum(-1, keepdim=True)
    for _ in range(steps):
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        out = model(input_ids=logits[-1].argmax(-1, keepdim=True), attention_mask=mask, position_ids=pos,
                    past_key_values=cache, use_cache=True)
        logits.append(out.logits[:, -1])
        pos = pos + 1
    return torch.stack(logits, dim=1)


@pytest.mark.parametrize("preset", ["tiny-dense", "tiny-moe"])
def test_preallocated_cache_matches_dynamic_cache(preset):
    tok = build_char_tokenizer()
    model = build_policy(preset, tok, seed=0, initializer_range=0.1)
    ids, mask = left_pad(tok(["12+34=", "1=", "999+1="])["input_ids"], tok.pad_token_id)  # (3, P)
    steps = 20
    with torch.no_grad():
        ref = _decode_logits(model, DynamicCache(config=model.config), ids, mask, steps)
        cache = preallocated_cache(model.config, ids.shape[1] + steps)
        got = _decode_logits(model, cache, ids, mask, steps)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    assert cache.get_seq_length() == ids.shape[1] + steps  # every position written, capacity exactly used
    layer = cache.layers[0]
    assert layer.keys.data_ptr() == layer._key_buffer.data_ptr()  # a view of the one buffer, no copy


def test_capacity_is_enforced():
    layer = PreallocatedLayer(capacity=4)
    k = torch.zeros(2, 1, 3, 8)  # (B, H, S, D)
    layer.update(k, k)
    with pytest.raises(ValueError, match="capacity 4 exceeded"):
        layer.update(k, k)


def test_sliding_window_models_are_refused():
    tok = build_char_tokenizer()
    model = build_policy("tiny-dense", tok, seed=0, use_sliding_window=True, sliding_window=4, max_window_layers=0)
    with pytest.raises(ValueError, match="full attention only"):
        preallocated_cache(model.config, 16)
