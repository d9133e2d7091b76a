"""Chat rendering, final-answer extraction, and the worded-addition task (no pretrained model needed)."""

import random

import pytest

from respo.runtime.answers import answers_match, as_integer, extract_answer
from respo.runtime.chat import DEFAULT_INSTRUCTION, ChatTask, prompt_rendering, render_for, render_prompt
from respo.runtime.tasks import Example, TaskError, get_task
from respo.runtime.tokenizer import TEXT_ALPHABET, build_char_tokenizer

# A ChatML-like template (what SmolLM2-Instruct ships, without its default system turn).
CHATML = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
          "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


@pytest.mark.parametrize("text,expected", [
    ("Ones: 7 + 6 = 13.\nAnswer: 933", "933"),
    ("**Answer:** 1,234.", "1,234."),
    ("Answer: 12\nwait, no.\nFinal answer: 13", "13"),  # the last marked answer wins
    ("so the sum is \\boxed{42}", "42"),
    ("answer: $\\boxed{\\frac{1}{2}}$", "\\frac{1}{2}"),  # braces balanced inside the box
    ("The sum is 933.", None),  # a bare number is not a marked answer
    ("Answer:", None),
    ("", None),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_answers_match_integers_exactly_and_other_forms_by_math_verify():
    assert as_integer("1,234.") == 1234 and as_integer("$-7$") == -7 and as_integer("12a") is None
    assert answers_match("933", "933") and answers_match("1,234.", "1234")
    assert not answers_match("934", "933") and not answers_match(None, "933") and not answers_match("93 3", "933")
    assert answers_match("\\frac{1}{2}", "1/2") and answers_match("0.5", "1/2")
    assert not answers_match("\\frac{1}{3}", "1/2")


@pytest.fixture
def chat_tok():
    tok = build_char_tokenizer(TEXT_ALPHABET + "<>|")
    tok.chat_template = CHATML
    return tok


def test_char_tokenizer_prompts_stay_raw_and_untouched():
    tok = build_char_tokenizer()
    task = get_task("addition", digits=2)
    pool, held = task.examples("train", 5, 0), task.examples("test", 3, 0)
    assert prompt_rendering(tok, "auto") == "raw"
    out_task, out_pool, out_held = render_for(tok, "auto", task, pool, held)
    assert out_task is task and out_pool is pool and out_held is held  # the very same objects
    with pytest.raises(TaskError, match="chat template"):
        prompt_rendering(tok, "chat")
    with pytest.raises(TaskError, match="unknown"):
        prompt_rendering(tok, "chatml")


def test_chat_rendering_wraps_prompt_with_instruction_and_grades_extracted_answer(chat_tok):
    task = get_task("addition", digits=3)
    rendered, pool = render_for(chat_tok, "auto", task, task.examples("train", 4, 0))
    assert isinstance(rendered, ChatTask) and rendered.rendering == "chat"
    ex, raw = pool[0], task.examples("train", 4, 0)[0]
    assert ex.prompt == f"<|user|>\n{raw.prompt}\n\n{DEFAULT_INSTRUCTION}\n<|assistant|>\n"
    assert ex.prompt == render_prompt(chat_tok, raw.prompt)
    assert ex.answer == raw.answer and ex.meta["question"] == raw.prompt
    assert rendered.score(f"Adding column by column.\nAnswer: {raw.answer}", ex) == 1.0
    assert rendered.score(f"Answer: {int(raw.answer) + 1}", ex) == -1.0
    assert rendered.score(raw.answer, ex) == -1.0  # no marked answer
    assert rendered.score(f"Answer: {raw.answer}", ex, finished=False) == -1.0  # cut before EOS
    assert rendered.demonstration(ex) == task.demonstration(raw)


def test_reasoning_gym_through_chat_uses_the_dataset_verifier(chat_tok):
    task = get_task("reasoning_gym:basic_arithmetic")
    rendered, (ex,) = render_for(chat_tok, "chat", task, task.examples("test", 1, 0))
    assert rendered.score(f"Let me compute.\nAnswer: {ex.answer}", ex) == 1.0
    assert rendered.score("Answer: not a number", ex) == -1.0


def test_worded_addition_demonstrations_vary_in_wording_and_are_correct():
    task = get_task("worded_addition", digits=3)
    exs = task.examples("train", 60, seed=0)
    demos = [task.demonstration(ex) for ex in exs]
    assert all(task.score(d, ex) == 1.0 for d, ex in zip(demos, exs))
    assert demos == [task.demonstration(ex) for ex in exs]  # fixed per example
    openings = {d.splitlines()[0].split(" ")[0] for d in demos}
    questions = {ex.prompt.split(" ")[0] for ex in exs}
    assert len(openings) >= 3 and len(questions) >= 4  # several phrasings, not one template
    ex = Example("What is 347 + 586?", "933", {"a": 347, "b": 586})
    demo = task.demonstration(ex)
    # opening, 3 columns (hundreds 3 + 5 + 1 = 9 leaves no final carry), closing, answer: 6 lines
    assert demo.endswith("Answer: 933") and demo.count("\n") == 5
    assert task.score("Answer: 933", ex) == 1.0 and task.score("the sum is 933", ex) == -1.0


def test_worded_addition_split_follows_the_numbers_not_the_phrasing():
    task = get_task("worded_addition", digits=2)
    rng = random.Random(0)
    for _ in range(200):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        assert task.split_of(f"What is {a} + {b}?") == task.split_of(f"Add {b} and {a}.")
    with pytest.raises(ValueError, match="digits"):
        get_task("worded_addition", digits=0)
