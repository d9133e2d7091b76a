"""The output layer over chunks of positions gives the one-forward log-probs, entropies and gradients."""

import pytest
import torch

from respo.runtime import logprobs
from respo.runtime.logprobs import token_logprobs
from respo.runtime.models import build_policy
from respo.runtime.precision import mixed_precision
from respo.runtime.sampler import left_pad
from respo.runtime.tokenizer import build_char_tokenizer


@pytest.fixture
def batch():
    tok = build_char_tokenizer()
    model = build_policy("tiny-dense", tok, seed=3)
    rows = [tok(t)["input_ids"] for t in ["12+34=4601;", "5+6=11;", "123+4=0127;12"]]
    ids, mask = left_pad(rows, tok.pad_token_id)  # (3, 14)
    return model, ids, mask


def _forward(model, ids, mask, budget, monkeypatch, temperature=1.0):
    monkeypatch.setattr(logprobs, "LOGITS_BUDGET", budget)
    model.zero_grad(set_to_none=True)
    logp, ent = token_logprobs(model, ids, mask, 5, temperature=temperature, with_entropy=True)
    (logp.sum() + 0.5 * ent.sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return logp.detach(), ent.detach(), grads


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_equals_one_forward(batch, monkeypatch, temperature):
    model, ids, mask = batch
    V = model.get_output_embeddings().weight.shape[0]  # 26
    full = _forward(model, ids, mask, 1 << 30, monkeypatch, temperature)  # one forward: 3 * 10 * 26 < budget
    # budget of 4 positions' logits: the 3 * 9 = 27 response positions go through the head in 7 chunks
    chunked = _forward(model, ids, mask, 4 * V, monkeypatch, temperature)
    assert full[0].shape == chunked[0].shape == (3, 9)
    torch.testing.assert_close(chunked[0], full[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(chunked[1], full[1], rtol=0, atol=1e-5)
    for name, g in full[2].items():
        torch.testing.assert_close(chunked[2][name], g, rtol=1e-4, atol=2e-5)  # float rounding: sums in another order


def test_chunked_without_grad_matches_too(batch, monkeypatch):
    model, ids, mask = batch
    with torch.no_grad():
        monkeypatch.setattr(logprobs, "LOGITS_BUDGET", 1 << 30)
        ref, _ = token_logprobs(model, ids, mask, 5)
        monkeypatch.setattr(logprobs, "LOGITS_BUDGET", 1)  # one position per chunk
        out, ent = token_logprobs(model, ids, mask, 5)
    assert ent is None
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)


def test_chunked_under_bfloat16_autocast_with_backward_outside_the_context(batch, monkeypatch):
    """As the trainer does: forward in ``mixed_precision("bfloat16")``, backward after leaving it. The checkpointed
    chunks are recomputed outside the context and must give the forward's float32 logits."""
    model, ids, mask = batch
    V = model.get_output_embeddings().weight.shape[0]
    out = {}
    for name, budget in (("whole", 1 << 30), ("chunked", 4 * V)):
        monkeypatch.setattr(logprobs, "LOGITS_BUDGET", budget)
        model.zero_grad(set_to_none=True)
        with mixed_precision(model, "bfloat16"):
            logp, _ = token_logprobs(model, ids, mask, 5)
        assert logp.dtype == torch.float32
        logp.sum().backward()
        out[name] = (logp.detach(), model.get_output_embeddings().weight.grad.clone())
    torch.testing.assert_close(out["chunked"][0], out["whole"][0], rtol=0, atol=1e-4)
    torch.testing.assert_close(out["chunked"][1], out["whole"][1], rtol=1e-3, atol=1e-3)
