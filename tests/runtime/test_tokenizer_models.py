"""Char tokenizer, tiny policy presets and the trainer's log-prob recomputation."""

import math

import pytest
import torch
from transformers import AutoTokenizer

from respo.runtime.logprobs import position_ids_from_mask, token_logprobs
from respo.runtime.models import PRESETS, build_policy
from respo.runtime.tokenizer import ARITHMETIC_ALPHABET, TEXT_ALPHABET, build_char_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def test_char_tokenizer_layout_and_roundtrip(tok, tmp_path):
    # ids: <pad>=0 <bos>=1 <eos>=2 <unk>=3, then "0".."9" = 4..13, "+" = 14, ..., "=" = 18
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert len(tok) == 4 + len(ARITHMETIC_ALPHABET)
    assert tok("12+3=")["input_ids"] == [1, 5, 6, 14, 7, 18]
    assert tok.decode([1, 5, 6, 14, 7, 18, 2], skip_special_tokens=True) == "12+3="
    assert tok("1x")["input_ids"] == [1, 5, 3]  # unknown char -> <unk>
    # left padding: the shorter prompt gets pads in front
    batch = tok(["12+3=", "1="], padding=True)
    assert batch["input_ids"][1] == [0, 0, 0, 1, 5, 18]
    assert batch["attention_mask"][1] == [0, 0, 0, 1, 1, 1]
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again("12+3=")["input_ids"] == [1, 5, 6, 14, 7, 18]
    assert again.padding_side == "left" and again.eos_token_id == 2 and len(again) == len(tok)


def test_text_alphabet_keeps_whitespace():
    tok = build_char_tokenizer(TEXT_ALPHABET)
    text = "Sum: 3 + 4\n= 7"
    assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True) == text
    assert len(tok(text, add_special_tokens=False)["input_ids"]) == len(text)
    with pytest.raises(ValueError, match="alphabet"):
        build_char_tokenizer("")


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_build_deterministically_with_tokenizer_vocab(tok, preset):
    a = build_policy(preset, tok, seed=3)
    b = build_policy(preset, tok, seed=3)
    c = build_policy(preset, tok, seed=4)
    assert a.config.vocab_size == len(tok) and a.config.eos_token_id == tok.eos_token_id
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))
    assert next(a.parameters()).dtype == torch.float32


def test_moe_preset_exposes_router_logits(tok):
    model = build_policy("tiny-moe", tok, seed=0)
    batch = tok(["12+34=", "5="], padding=True, return_tensors="pt")
    out = model(**batch, output_router_logits=True)
    cfg = PRESETS["tiny-moe"]
    assert len(out.router_logits) == cfg["num_hidden_layers"]
    B, L = batch["input_ids"].shape
    assert out.router_logits[0].shape == (B * L, cfg["num_experts"])


def test_build_policy_from_directory_and_errors(tok, tmp_path):
    model = build_policy("tiny-dense", tok, seed=0)
    model.save_pretrained(tmp_path / "m")
    loaded = build_policy(tmp_path / "m", tok)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), loaded.parameters()))
    with pytest.raises(ValueError, match="neither a preset"):
        build_policy("no-such-preset", tok)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        build_policy(tmp_path / "empty", tok)
    # pickled weights (pytorch_model.bin) are refused in one line before anything is unpickled
    (tmp_path / "pickled").mkdir()
    (tmp_path / "pickled" / "config.json").write_text((tmp_path / "m" / "config.json").read_text())
    torch.save(model.state_dict(), tmp_path / "pickled" / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"its weights are pickled \(pytorch_model.bin\)") as err:
        build_policy(tmp_path / "pickled", tok)
    assert "\n" not in str(err.value)


def test_position_ids_count_real_tokens_only():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 3]]


def test_token_logprobs_match_a_manual_forward(tok):
    # Unpadded single row: logp[t] = log_softmax(logits[P+t-1])[ids[P+t]], checked by hand-rolled
    # forward; the entropy of a distribution is within [0, log V].
    model = build_policy("tiny-dense", tok, seed=0)
    ids = torch.tensor([tok("12+34=46")["input_ids"]])  # (1, 9)
    mask = torch.ones_like(ids)
    P = 7  # response "46"
    logp, ent = token_logprobs(model, ids, mask, P, with_entropy=True, temperature=0.7)
    with torch.no_grad():
        logits = model(ids).logits[0] / 0.7  # (9, V)
    manual = torch.log_softmax(logits, -1)[[6, 7], ids[0, 7:]]
    torch.testing.assert_close(logp[0], manual, atol=1e-5, rtol=0)
    assert logp.shape == (1, 2) and ent.shape == (1, 2)
    assert (ent >= 0).all() and (ent <= math.log(len(tok)) + 1e-5).all()
    assert logp.requires_grad  # the trainer differentiates through it


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_token_logprobs_do_not_depend_on_left_padding(tok, preset):
    # The same prompt+response scored alone and in a batch where it needs 8 pads in front.
    # initializer_range 0.5 makes the random model far from uniform (max prob ~0.99), so a
    # padding bug would show: attending to the pads moves the log-probs by far more than 1e-5.
    model = build_policy(preset, tok, seed=1, initializer_range=0.5)
    alone = tok(["12+34=46"], return_tensors="pt")  # bos + 8 chars, response "46" from col 7
    both = tok(["12+34=46", "123+456+789=1368"], padding=True, return_tensors="pt")
    pad = both["input_ids"].shape[1] - alone["input_ids"].shape[1]
    assert pad == 8
    la, _ = token_logprobs(model, alone["input_ids"], alone["attention_mask"], 7)
    lb, _ = token_logprobs(model, both["input_ids"], both["attention_mask"], 7 + pad)
    # log-probs here reach about -18, where float32 rounding alone is ~1e-5: allow 2e-6 relative
    torch.testing.assert_close(lb[0], la[0], atol=1e-5, rtol=2e-6)
    attend_pads = torch.ones_like(both["attention_mask"])
    lbad, _ = token_logprobs(model, both["input_ids"], attend_pads, 7 + pad)
    assert (lbad[0] - la[0]).abs().max() > 1e-3


def test_token_logprobs_bad_input(tok):
    model = build_policy("tiny-dense", tok, seed=0)
    ids = torch.ones(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="response_start"):
        token_logprobs(model, ids, torch.ones_like(ids), 5)
    with pytest.raises(ValueError, match="same shape"):
        token_logprobs(model, ids, torch.ones(2, 4), 2)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(model, ids, torch.ones_like(ids), 2, temperature=0.0)
