"""The training forward computes logits only where the loss reads them and gathers log-softmax."""

import pytest
import torch

from respo.runtime.logprobs import position_ids_from_mask, token_logprobs
from respo.runtime.models import build_policy
from respo.runtime.tokenizer import build_char_tokenizer


@pytest.mark.parametrize("preset", ["tiny-dense", "tiny-moe"])
def test_output_layer_sees_only_response_columns(preset):
    # L = 20 columns, P = 8 prompt columns: the output layer runs on T + 1 = 13 columns
    # (P - 1 .. L - 1), not on all 20; the result equals the full-logits reference
    # log_softmax(logits[:, P-1 : L-1])[token] at float32 rounding.
    tok = build_char_tokenizer()
    model = build_policy(preset, tok, seed=0, initializer_range=0.1)
    g = torch.Generator().manual_seed(0)
    B, L, P = 3, 20, 8
    ids = torch.randint(4, len(tok), (B, L), generator=g)  # (B, L)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding on one row
    seen = []
    handle = model.get_output_embeddings().register_forward_pre_hook(lambda m, a: seen.append(a[0].shape[1]))
    try:
        logp, _ = token_logprobs(model, ids, mask, P)
    finally:
        handle.remove()
    assert seen == [L - P + 1]
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits  # (B, L, V)
    ref = torch.log_softmax(full[:, P - 1 : L - 1], -1).gather(-1, ids[:, P:, None]).squeeze(-1)  # (B, T)
    assert logp.shape == (B, L - P)
    torch.testing.assert_close(logp, ref, atol=1e-5, rtol=0)
