"""Long-response tasks: the length knob gives the stated token counts, the presets have room for
them (without changing any number), and the multiplication scratchpad is correct by hand."""

import pytest
import torch

from respo.runtime.models import PRESETS, build_policy
from respo.runtime.sft import warm_start
from respo.runtime.tasks import TASK_KINDS, Example, MultiplicationTask, get_task
from respo.runtime.tasks.arithmetic import MAX_DIGITS
from respo.runtime.tasks.multiplication import MAX_FACTOR_DIGITS, multiplication_response_length
from respo.runtime.tokenizer import build_char_tokenizer

# (spec, knobs, response tokens with EOS) as stated in the task docstrings
ADDITION_LENGTHS = [({"digits": 5}, 32), ({"digits": 21}, 128), ({"digits": 42}, 254), ({"digits": 85}, 512)]
MULTIPLICATION_LENGTHS = [
    ({"digits": 3, "multiplier_digits": 2}, 31),
    ({"digits": 5, "multiplier_digits": 6}, 123),
    ({"digits": 8, "multiplier_digits": 9}, 252),
    ({"digits": 13, "multiplier_digits": 13}, 521),
]
LENGTHS = [("addition", k, n) for k, n in ADDITION_LENGTHS] + [("multiplication", k, n) for k, n in MULTIPLICATION_LENGTHS]


def _tokens(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("spec,kwargs,length", LENGTHS)
def test_length_knob_gives_the_stated_response_tokens(spec, kwargs, length):
    # Measured with the char tokenizer: demonstration tokens + 1 EOS; every character is in the
    # alphabet (no <unk>), and prompt (+ BOS) + response fit the presets' positions.
    task = get_task(spec, **kwargs)
    tok = build_char_tokenizer(task.alphabet)
    for ex in task.examples("train", 8, seed=0) + task.examples("test", 4, seed=0):
        demo = task.demonstration(ex)
        ids = _tokens(tok, demo)
        assert tok.unk_token_id not in ids and tok.unk_token_id not in _tokens(tok, ex.prompt)
        assert len(ids) + 1 == length == task.response_length() + 1
        assert task.score(demo, ex) == 1.0
        prompt_tokens = len(tok(ex.prompt)["input_ids"])  # BOS included
        for preset in PRESETS.values():
            assert prompt_tokens + length <= preset["max_position_embeddings"]


def test_addition_digit_cap_is_lifted():
    assert MAX_DIGITS >= 85
    get_task("addition", digits=MAX_DIGITS)
    with pytest.raises(ValueError, match="digits"):
        get_task("addition", digits=MAX_DIGITS + 1)
    # the longest operands still fit the presets: prompt 2d + 2 (+ BOS), response 6d + 1 (+ EOS)
    assert (2 * MAX_DIGITS + 3) + (6 * MAX_DIGITS + 2) <= PRESETS["tiny-dense"]["max_position_embeddings"]


def test_multiplication_scratchpad_by_hand():
    # 123 · 45, multiplier digits least significant first:
    #   b_0 = 5: P = 615 → "0615" reversed "5160"; S_0 = 615 → "0615" → "5160"
    #   b_1 = 4: P = 492 → "0492" → "2940"; S_1 = 615 + 4920 = 5535 → 5 digits "05535" → "53550"
    #   product zero-padded to 3 + 2 digits: "05535"
    task = get_task("multiplication", digits=3, multiplier_digits=2)
    ex = Example("123*45=", "5535", {"a": 123, "b": 45})
    demo = task.demonstration(ex)
    assert demo == "5:5160,5160;4:2940,53550;05535"
    assert len(demo) == multiplication_response_length(3, 2) == 2 * (2 * 3 + 6) + 1 + 5  # groups 12 + 13, product 5
    assert task.score(demo, ex) == 1.0
    assert task.score("5:5160,5160;4:2940,53550;5535", ex) == 1.0  # leading zeros are optional
    assert task.score("5:5160,5160;4:2940,53550;05536", ex) == -1.0  # wrong product
    assert task.score("0:0000,0000;0:0000,00000;05535", ex) == 1.0  # only the product is checked
    assert task.score("5:5160,5160;4:2940,53550;", ex) == -1.0 and task.score("", ex) == -1.0
    # 99 · 99 = 9801: b_0 = 9: P = 891 → "198", S_0 = 891 → "198"; b_1 = 9: S_1 = 891 + 8910 = 9801
    #   → "09801" → "10890"; product "9801"
    ex = Example("99*99=", "9801", {"a": 99, "b": 99})
    assert get_task("multiplication", digits=2).demonstration(ex) == "9:198,198;9:198,1089;9801"


def test_multiplication_splits_deterministic_disjoint_and_corruptions_fail():
    task = get_task("multiplication", digits=4, multiplier_digits=3)
    train = task.examples("train", 200, seed=1)
    assert train == task.examples("train", 200, seed=1)
    assert [e.prompt for e in train] != [e.prompt for e in task.examples("train", 200, seed=2)]
    test = task.examples("test", 40, seed=1) + task.examples("test", 40, seed=9)
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    assert all(task.split_of(e.prompt) == "test" for e in test)
    for ex in train[:50] + test[:20]:
        a, b = ex.meta["a"], ex.meta["b"]
        assert ex.prompt == f"{a}*{b}=" and 1000 <= a <= 9999 and 100 <= b <= 999 and int(ex.answer) == a * b
        demo = task.demonstration(ex)
        assert task.score(demo, ex) == 1.0
        head, product = demo.rsplit(";", 1)
        wrong = str((int(product) + 1) % 10 ** len(product)).zfill(len(product))
        assert task.score(f"{head};{wrong}", ex) == -1.0  # the product off by one
        assert task.score(demo[:-1], ex) == -1.0  # the last digit dropped


def test_multiplication_registered_and_knobs_checked():
    assert TASK_KINDS["multiplication"][0] is MultiplicationTask
    task = get_task("multiplication")
    assert (task.digits, task.multiplier_digits) == (3, 3)
    assert task.name == "multiplication(digits=3,multiplier_digits=3)"
    assert get_task("multiplication", digits=5, multiplier_digits=2).name == "multiplication(digits=5,multiplier_digits=2)"
    for bad in (0, MAX_FACTOR_DIGITS + 1, 2.0, True):
        with pytest.raises(ValueError, match="digits"):
            get_task("multiplication", digits=bad)
        with pytest.raises(ValueError, match="multiplier_digits"):
            get_task("multiplication", multiplier_digits=bad)
    # the smallest problem space, 1 × 1 digits (81 problems), still fills a split
    tiny = get_task("multiplication", digits=1)
    assert len(tiny.examples("train", 100, seed=0)) == 100


def test_more_positions_change_no_number():
    # Qwen3's default RoPE reads no position limit: a 1024-position preset has the weights and the
    # logits of a 512-position one, bit for bit, even past position 512.
    tok = build_char_tokenizer()
    ids = torch.randint(4, len(tok), (1, 600), generator=torch.Generator().manual_seed(0))
    for preset in PRESETS:
        assert PRESETS[preset]["max_position_embeddings"] == 1024
        new = build_policy(preset, tok, seed=3)
        old = build_policy(preset, tok, seed=3, max_position_embeddings=512)
        for (name, p), (_, q) in zip(new.state_dict().items(), old.state_dict().items()):
            assert torch.equal(p, q), name
        with torch.no_grad():
            assert torch.equal(new(ids).logits, old(ids).logits)


def test_warm_start_runs_on_multiplication(tmp_path):
    # `respo sft` needs demonstrations: two SFT steps on 2 × 2-digit multiplication run and cache.
    with pytest.warns(UserWarning, match="outside"):  # 2 steps leave the pass rate below the band
        ws = warm_start(
            "multiplication", "tiny-dense", tmp_path, seed=0, task_kwargs={"digits": 2},
            model_overrides={"num_hidden_layers": 1, "hidden_size": 32, "head_dim": 8, "intermediate_size": 64},
            batch_size=4, max_steps=2, eval_every=100, eval_prompts=4, eval_n=4,
        )  # fmt: skip
    assert ws.steps == 2 and ws.stopped_by == "max_steps" and 0.0 <= ws.pass_rate <= 1.0
    assert ws.config["task"] == "multiplication"
