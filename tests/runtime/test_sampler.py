"""Sampler: behaviour log-probs equal the trainer's recomputation; layout, determinism, fixed rows."""

import math

import pytest
import torch

from respo.runtime.logprobs import token_logprobs
from respo.runtime.models import PRESETS, build_policy
from respo.runtime.sampler import nucleus_log_probs, sample, sample_ids, sample_tokens
from respo.runtime.tokenizer import build_char_tokenizer


PROMPTS = ["12+34=", "1+2=", "123+456+789=", "9", "55+5="]


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module", params=sorted(PRESETS))
def model(request, tok):
    # initializer_range 0.1: far enough from uniform that log-probs reach about -6, so the
    # identity below is not trivially met by a flat distribution.
    return build_policy(request.param, tok, seed=0, initializer_range=0.1)


def test_identity_behaviour_logp_equals_recomputed_logp(model, tok):
    # temperature 1, top-p 1: q = softmax(logits), so behaviour_logp must equal token_logprobs of
    # the same tokens with the same weights. Prompts of 2..13 tokens force left padding.
    g = torch.Generator().manual_seed(0)
    ro = sample(model, tok, PROMPTS * 4, max_new_tokens=40, generator=g)
    logp, _ = token_logprobs(model, ro.input_ids, ro.attention_mask, ro.response_start)
    mask = ro.response_mask
    assert mask.sum() > 100  # a real amount of sampled tokens
    assert (ro.behaviour_logp * mask).min() < -3.0  # not all near-certain tokens
    torch.testing.assert_close(logp * mask, ro.behaviour_logp, atol=1e-5, rtol=0)


def test_identity_holds_at_512_tokens(model, tok):
    # Long responses: the cache holds P + 512 positions, written in place. EOS is an ordinary
    # token here (stop_at_eos=False) so every row really decodes 512 steps.
    g = torch.Generator().manual_seed(4)
    ro = sample(model, tok, PROMPTS[:3], max_new_tokens=512, generator=g, stop_at_eos=False)
    assert ro.response_mask.shape == (3, 512) and ro.response_mask.eq(1).all()
    logp, _ = token_logprobs(model, ro.input_ids, ro.attention_mask, ro.response_start)
    assert (ro.behaviour_logp * ro.response_mask).min() < -3.0
    torch.testing.assert_close(logp * ro.response_mask, ro.behaviour_logp, atol=1e-5, rtol=0)


def test_identity_holds_for_temperature(model, tok):
    g = torch.Generator().manual_seed(1)
    ro = sample(model, tok, PROMPTS, max_new_tokens=16, temperature=0.7, generator=g)
    logp, _ = token_logprobs(model, ro.input_ids, ro.attention_mask, ro.response_start, temperature=0.7)
    torch.testing.assert_close(logp * ro.response_mask, ro.behaviour_logp, atol=1e-5, rtol=0)


def test_rollout_layout(model, tok):
    g = torch.Generator().manual_seed(2)
    ro = sample(model, tok, PROMPTS * 2, max_new_tokens=30, generator=g, version=7)
    B, L = ro.input_ids.shape
    P, T = ro.response_start, L - ro.response_start
    assert B == 10 and P == 13  # "<bos>123+456+789=" is the longest prompt
    assert ro.response_mask.shape == ro.behaviour_logp.shape == (B, T) and ro.version == 7
    assert torch.equal(ro.attention_mask[:, P:].float(), ro.response_mask)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    for b in range(B):
        n = int(ro.response_mask[b].sum())
        assert ro.response_mask[b, :n].eq(1).all() and ro.response_mask[b, n:].eq(0).all()
        resp = ro.response_ids[b]
        assert (resp[n:] == pad).all() and (ro.behaviour_logp[b, n:] == 0).all()
        assert bool(ro.finished[b]) == (n > 0 and int(resp[n - 1]) == eos)
        assert (resp[: n - 1] != eos).all()  # EOS only as the last response token
        body = resp[: n - 1] if ro.finished[b] else resp[:n]
        assert ro.responses[b] == tok.decode(body.tolist(), skip_special_tokens=True)
        assert n == T or ro.finished[b]  # unfinished rows ran all steps
    # prompt columns: left padding then the prompt's own tokens
    enc = tok(PROMPTS[1])["input_ids"]
    assert ro.input_ids[1, P - len(enc) : P].tolist() == enc
    assert ro.attention_mask[1, : P - len(enc)].eq(0).all()


def test_deterministic_under_seed(model, tok):
    runs = [sample(model, tok, PROMPTS, max_new_tokens=20, generator=torch.Generator().manual_seed(s))
            for s in (5, 5, 6)]
    assert torch.equal(runs[0].input_ids, runs[1].input_ids)
    assert torch.equal(runs[0].behaviour_logp, runs[1].behaviour_logp)
    assert not torch.equal(runs[0].input_ids, runs[2].input_ids)


def test_stops_when_every_row_has_finished(tok):
    # Zeroed (tied) embeddings give all-zero logits: uniform over V tokens, so EOS comes with
    # probability 1/V per step and every behaviour log-prob is -log V. Decoding must stop once
    # the last row has emitted EOS: T = the longest response, far below max_new_tokens
    # (a row survives 400 steps with probability (1 - 1/26)^400 ~ 1.5e-7).
    model = build_policy("tiny-dense", tok, seed=0)
    with torch.no_grad():
        model.lm_head.weight.zero_()
    ro = sample(model, tok, PROMPTS, max_new_tokens=400, generator=torch.Generator().manual_seed(0))
    V = len(tok)
    valid = ro.response_mask.bool()
    torch.testing.assert_close(ro.behaviour_logp[valid], torch.full((int(valid.sum()),), -math.log(V)))
    assert ro.finished.all()
    assert ro.response_mask.shape[1] == int(ro.response_mask.sum(-1).max()) < 400


def test_rows_stay_in_the_batch_every_step(model, tok):
    # Forward hooks on the first decoder layer see all B rows at the prefill and at every step.
    seen = []
    handle = model.model.layers[0].mlp.register_forward_pre_hook(lambda m, a: seen.append(tuple(a[0].shape[:2])))
    try:
        ro = sample(model, tok, PROMPTS, max_new_tokens=25, generator=torch.Generator().manual_seed(3))
    finally:
        handle.remove()
    B, P, T = 5, ro.response_start, ro.response_mask.shape[1]
    assert seen[0] == (B, P) and all(s == (B, 1) for s in seen[1:])
    assert len(seen) == T  # prefill + T-1 decode steps; the last sampled token is never fed back


def test_drop_finished_rows_leave_the_batch_and_keep_the_identity(tok):
    # Zeroed lm_head: uniform over V tokens, EOS with probability 1/V per step, so rows finish at
    # spread-out steps. With drop_finished the batch shrinks (halving: at most half of the rows in
    # it alive -> only the live ones stay); the rollout keeps its layout and behaviour_logp still
    # equals the trainer's recomputation (-log V on every response token, 0 elsewhere).
    model = build_policy("tiny-dense", tok, seed=0, initializer_range=0.1)
    with torch.no_grad():
        model.lm_head.weight.zero_()
    seen = []
    handle = model.model.layers[0].mlp.register_forward_pre_hook(lambda m, a: seen.append(a[0].shape[0]))
    try:
        ro = sample(model, tok, PROMPTS * 8, max_new_tokens=120, generator=torch.Generator().manual_seed(0),
                    drop_finished=True)
    finally:
        handle.remove()
    B, T = 40, ro.response_mask.shape[1]
    assert seen[0] == B and min(seen) < B // 2  # rows left the batch
    assert all(a >= b for a, b in zip(seen, seen[1:]))  # never grows back
    lengths = ro.response_lengths
    assert ro.finished.sum() > B // 2 and (lengths[~ro.finished] == T).all()
    for b in range(B):  # EOS only as the last token of a finished row, pad after it
        n = int(lengths[b])
        assert ro.response_mask[b, :n].eq(1).all() and ro.response_mask[b, n:].eq(0).all()
        assert (ro.response_ids[b, n:] == tok.pad_token_id).all()
        assert (ro.response_ids[b, : n - 1] != tok.eos_token_id).all()
    logp, _ = token_logprobs(model, ro.input_ids, ro.attention_mask, ro.response_start)
    torch.testing.assert_close(logp * ro.response_mask, ro.behaviour_logp, atol=1e-5, rtol=0)
    V = len(tok)
    valid = ro.response_mask.bool()
    torch.testing.assert_close(ro.behaviour_logp[valid], torch.full((int(valid.sum()),), -math.log(V)))


def test_drop_finished_identity_on_trained_like_weights(model, tok):
    # The preset weights (not uniform): the identity holds for rows compacted mid-decode.
    g = torch.Generator().manual_seed(0)
    ro = sample(model, tok, PROMPTS * 4, max_new_tokens=40, generator=g, drop_finished=True)
    logp, _ = token_logprobs(model, ro.input_ids, ro.attention_mask, ro.response_start)
    torch.testing.assert_close(logp * ro.response_mask, ro.behaviour_logp, atol=1e-5, rtol=0)


def test_router_recorder_integration(tok):
    from respo.core import missing_index
    from respo.runtime.moe import RoutingRecorder

    model = build_policy("tiny-moe", tok, seed=0, initializer_range=0.1)
    rec = RoutingRecorder(model)
    ro = sample(model, tok, PROMPTS, max_new_tokens=12, generator=torch.Generator().manual_seed(0),
                router_recorder=rec)
    L = ro.input_ids.shape[1]
    routing = rec.routing(length=L)  # (B, L, n_layers, k)
    cfg = PRESETS["tiny-moe"]
    assert routing.shape == (5, L, cfg["num_hidden_layers"], cfg["num_experts_per_tok"])
    assert (routing[:, -1] == missing_index(routing.dtype)).all()  # last sampled token not fed
    assert (routing[:, :-1] < cfg["num_experts"]).all()


def test_greedy_does_not_depend_on_left_padding(model, tok):
    alone = sample(model, tok, ["12+34="], max_new_tokens=15, temperature=0)
    padded = sample(model, tok, ["12+34=", "123456789+987654321="], max_new_tokens=15, temperature=0)
    assert padded.responses[0] == alone.responses[0]
    assert (alone.behaviour_logp == 0).all()


def test_nucleus_by_hand():
    # p = [0.5, 0.3, 0.2], top_p = 0.7: mass before each token [0, 0.5, 0.8] -> keep the first
    # two, renormalised: q = [0.5/0.8, 0.3/0.8, 0] = [0.625, 0.375, 0]
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    q = nucleus_log_probs(logits, 0.7).exp()
    torch.testing.assert_close(q, torch.tensor([[0.625, 0.375, 0.0]]))
    # top_p below the top token's mass keeps just that token
    assert nucleus_log_probs(logits, 0.1).exp().tolist() == [[1.0, 0.0, 0.0]]
    torch.testing.assert_close(nucleus_log_probs(logits, 1.0), torch.log_softmax(logits, -1))
    g = torch.Generator().manual_seed(0)
    toks, lq = sample_tokens(logits.expand(4000, 3), top_p=0.7, generator=g)
    assert (toks != 2).all()  # never outside the nucleus
    frac = (toks == 0).float().mean().item()
    assert abs(frac - 0.625) < 0.03  # 4000 draws: std ~ 0.008
    assert set(lq.tolist()) <= {math.log(0.625), math.log(0.375)} or torch.allclose(
        lq.exp(), torch.where(toks == 0, 0.625, 0.375))


def test_bad_arguments(tok):
    model = build_policy("tiny-dense", tok, seed=0)
    for kwargs, match in [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": 4, "temperature": -1.0}, "temperature"),
        ({"max_new_tokens": 4, "top_p": 0.0}, "top_p"),
    ]:
        with pytest.raises(ValueError, match=match):
            sample(model, tok, PROMPTS, **kwargs)
    with pytest.raises(ValueError, match="non-empty list"):
        sample(model, tok, [], max_new_tokens=4)
    from respo.runtime.moe import RoutingRecorder

    moe = build_policy("tiny-moe", tok, seed=0)
    with pytest.raises(ValueError, match="drop_finished"):
        sample(moe, tok, PROMPTS, max_new_tokens=4, router_recorder=RoutingRecorder(moe), drop_finished=True)
    with pytest.raises(ValueError, match="1 rows are not"):
        sample(model, tok, ["1+1=", 3], max_new_tokens=4)


def test_tokenizer_without_pad_token_and_empty_prompt(tok):
    # A tokenizer without a pad token (common for base LMs) still samples: EOS pads the rows.
    from transformers import PreTrainedTokenizerFast

    nopad = PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer, bos_token="<bos>", eos_token="<eos>")
    assert nopad.pad_token_id is None
    model = build_policy("tiny-dense", tok, seed=0)
    ro = sample(model, nopad, ["1+2=", "12+34="], max_new_tokens=5, generator=torch.Generator().manual_seed(0))
    assert ro.input_ids[0, 0].item() == tok.eos_token_id and ro.attention_mask[0, 0] == 0
    empty = PreTrainedTokenizerFast(tokenizer_object=build_char_tokenizer().backend_tokenizer, eos_token="<eos>")
    empty.backend_tokenizer.post_processor = None  # no <bos>: "" encodes to nothing
    with pytest.raises(ValueError, match="1 prompts encode to zero tokens"):
        sample(model, empty, ["1=", ""], max_new_tokens=3)


def test_sampling_from_token_ids_is_sampling_from_the_prompts(model, tok):
    # sample() tokenizes and hands the rows to sample_ids(): the same rows and seed give the same rollout
    rows = tok(PROMPTS)["input_ids"]
    a = sample(model, tok, PROMPTS, max_new_tokens=10, generator=torch.Generator().manual_seed(3))
    b = sample_ids(model, tok, rows, max_new_tokens=10, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.behaviour_logp, b.behaviour_logp)
    assert a.prompts == PROMPTS and b.prompts == []
    with pytest.raises(ValueError, match="rows must be a non-empty list"):
        sample_ids(model, tok, [], max_new_tokens=4)


def test_a_response_continued_from_its_tokens_keeps_its_positions(model, tok):
    # A partial rollout's second segment: the prompt and the first 6 response tokens go back in as one row,
    # are run again, and 6 more tokens are drawn. Each row's tokens keep the positions they have in one
    # pass, so the continued tokens' behaviour log-probs are the trainer's log-probs of the whole response
    # (prompts of different lengths: the rows are left-padded differently in the two calls).
    g = torch.Generator().manual_seed(5)
    first = sample(model, tok, PROMPTS, max_new_tokens=6, generator=g, stop_at_eos=False)
    rows = [p + r.tolist() for p, r in zip(tok(PROMPTS)["input_ids"], first.response_ids)]
    second = sample_ids(model, tok, rows, max_new_tokens=6, generator=g, stop_at_eos=False)
    ids = torch.cat([first.input_ids, second.response_ids], dim=1)  # (B, P + 12)
    attn = torch.cat([first.attention_mask, second.attention_mask[:, second.response_start:]], dim=1)
    logp, _ = token_logprobs(model, ids, attn, first.response_start)  # (B, 12)
    torch.testing.assert_close(logp[:, 6:], second.behaviour_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(logp[:, :6], first.behaviour_logp, atol=1e-5, rtol=0)
    # greedy: continuing the first half gives the greedy response of one pass
    whole = sample(model, tok, PROMPTS, max_new_tokens=12, temperature=0.0, stop_at_eos=False)
    half = sample(model, tok, PROMPTS, max_new_tokens=6, temperature=0.0, stop_at_eos=False)
    rest = sample_ids(model, tok, [p + r.tolist() for p, r in zip(tok(PROMPTS)["input_ids"], half.response_ids)],
                      max_new_tokens=6, temperature=0.0, stop_at_eos=False)
    assert torch.equal(torch.cat([half.response_ids, rest.response_ids], 1), whole.response_ids)
