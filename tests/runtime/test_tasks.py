"""Tasks: deterministic disjoint splits, demonstrations that score +1, verifiers that never crash."""

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from respo.runtime.tasks import (
    TASK_KINDS,
    AdditionTask,
    Example,
    OverlongPenalty,
    ProceduralTask,
    get_task,
    hash_split,
    hash_split_rows,
    read_math_rows,
    safe_eval,
    score_batch,
    stable_hash,
)


def test_addition_scratchpad_by_hand():
    # 123 + 456, columns least significant first as a_i b_i carry_in s_i:
    #   3+6+0 = 9 -> "3609"; 2+5+0 = 7 -> "2507"; 1+4+0 = 5 -> "1405"; sum zero-padded "0579"
    task = get_task("addition", digits=3)
    ex = Example("123+456=", "579", {"a": 123, "b": 456})
    assert task.demonstration(ex) == "3609;2507;1405;0579"
    # 958 + 67 at 3 digits: 8+7=15 -> "8705" carry 1; 5+6+1=12 -> "5612" carry 1;
    #   9+0+1=10 -> "9010" carry 1; sum 1025
    ex = Example("958+67=", "1025", {"a": 958, "b": 67})
    assert task.demonstration(ex) == "8705;5612;9010;1025"
    assert task.score("8705;5612;9010;1025", ex) == 1.0
    assert task.score("8705;5612;9010;1024", ex) == -1.0
    assert task.score("", ex) == -1.0 and task.score(";;;", ex) == -1.0
    assert get_task("addition", scratchpad=False).demonstration(ex) == "1025"


@pytest.mark.parametrize("digits,length", [(3, 19), (5, 31)])
def test_addition_response_length(digits, length):
    # 5 characters per column (4 + ';') plus digits+1 for the sum: 6*digits + 1 (EOS not counted)
    task = get_task("addition", digits=digits)
    for ex in task.examples("train", 20, seed=0):
        demo = task.demonstration(ex)
        assert len(demo) == length == task.response_length()
        assert task.score(demo, ex) == 1.0


@pytest.mark.parametrize(
    "spec,kwargs",
    [("addition", {"digits": 2}), ("countdown", {}), ("reasoning_gym:basic_arithmetic", {}), ("worded_addition", {})],
)
def test_splits_deterministic_and_disjoint(spec, kwargs):
    task = get_task(spec, **kwargs)
    train = task.examples("train", 200, seed=1)
    assert [e.prompt for e in train] == [e.prompt for e in task.examples("train", 200, seed=1)]
    assert [e.prompt for e in train] != [e.prompt for e in task.examples("train", 200, seed=2)]
    test = task.examples("test", 40, seed=1) + task.examples("test", 40, seed=7)
    assert len(train) == 200 and len(test) == 80
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    for ex in train[:30] + test[:10]:
        assert task.score(task.demonstration(ex), ex) == 1.0


def test_countdown_verifier():
    task = get_task("countdown")
    ex = Example("3,7,12,5>120:", "120", {"numbers": [3, 7, 12, 5], "target": 120})
    assert task.score("(3+7)*12", ex) == 1.0
    assert task.score(" 12 * (7 + 3) ", ex) == 1.0
    assert task.score("12*10", ex) == -1.0  # 10 is not given
    assert task.score("(3+7)*12+5-5", ex) == -1.0  # 5 used twice
    assert task.score("5*(12+12)", ex) == -1.0  # 12 used twice
    assert task.score("120", ex) == -1.0
    for bad in ["", "(3+7", "__import__('os').system('true')", "3**7", "-3+7", "3/0", "1.5*80", "x"]:
        assert task.score(bad, ex) == -1.0
    ex2 = Example("4,6,2,9>3:", "3", {"numbers": [4, 6, 2, 9], "target": 3})
    assert task.score("6/2", ex2) == 1.0 and task.score("9/(4-2)", ex2) == -1.0  # 4.5


def test_safe_eval_is_exact():
    value, used = safe_eval("(7-3)/(2*6)")
    assert value * 3 == 1 and used == [7, 3, 2, 6]  # 4/12 = 1/3 exactly
    with pytest.raises(ValueError, match="disallowed"):
        safe_eval("abs(3)")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_verifiers_never_crash(text):
    add, cd = get_task("addition"), get_task("countdown")
    a = add.examples("train", 1, seed=0)[0]
    c = cd.examples("train", 1, seed=0)[0]
    assert add.score(text, a) in (1.0, -1.0)
    assert cd.score(text, c) in (1.0, -1.0)


def test_overlong_penalty_and_batch_scoring():
    # max_len 20, buffer 4: free up to 16; 18 -> (16 - 18)/4 = -0.5; beyond 20 -> -1
    pen = OverlongPenalty(20, 4)
    assert [pen(10), pen(16), pen(18), pen(20), pen(25)] == [0.0, 0.0, -0.5, -1.0, -1.0]
    task = get_task("addition", digits=3, overlong=(20, 4))
    ex = Example("123+456=", "579", {"a": 123, "b": 456})
    demo = "3609;2507;1405;0579"  # 19 characters -> -0.75
    assert task.score(demo, ex) == pytest.approx(1.0 - 0.75)
    assert task.score(demo, ex, length=10) == 1.0
    plain = get_task("addition", digits=3)
    assert score_batch(plain, [demo, demo], [ex, ex], finished=[True, False]) == [1.0, -1.0]
    with pytest.raises(ValueError, match="2 completions but 1"):
        score_batch(plain, [demo, demo], [ex])
    with pytest.raises(ValueError, match="buffer"):
        OverlongPenalty(4, 8)


def test_bad_specs_and_arguments():
    with pytest.raises(ValueError, match="unknown task spec"):
        get_task("subtraction")
    with pytest.raises(ValueError, match="unknown task spec"):
        get_task("math")
    with pytest.raises(ValueError, match="digits"):
        get_task("addition", digits=0)
    with pytest.raises(ValueError, match="split"):
        get_task("addition").examples("valid", 3, seed=0)
    with pytest.raises(ValueError, match="could not be created"):
        get_task("reasoning_gym:no_such_dataset_xyz")
    tiny = AdditionTask(digits=1)  # 81 problems, drawn with replacement: 500 is fine
    assert len(tiny.examples("test", 500, seed=0)) == 500
    tiny.test_fraction = 0.0  # an empty test split cannot be filled
    with pytest.raises(RuntimeError, match="found only 0 of 5 test examples"):
        tiny.examples("test", 5, seed=0)


def _verl_row(problem, gt):
    return {
        "data_source": "math_dapo",
        "prompt": [{"role": "user", "content": problem}],
        "ability": "MATH",
        "reward_model": {"style": "rule", "ground_truth": gt},
        "extra_info": {"index": 0},
    }


def test_math_task_jsonl_and_parquet(tmp_path):
    import pandas as pd

    rows = [_verl_row(f"What is {i} + {i}?", str(2 * i)) for i in range(30)]
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    pq = tmp_path / "data.parquet"
    pd.DataFrame(rows).to_parquet(pq)
    for path in (jsonl, pq):
        task = get_task(f"math:{path}")
        assert len(task) == 30
        train, test = task.examples("train", 27, seed=0), task.examples("test", 3, seed=0)
        assert len({e.prompt for e in train}) == 27 and len(test) == 3
        assert not {e.prompt for e in train} & {e.prompt for e in test}
        ex = train[0]
        assert task.score(f"So the answer is $\\boxed{{{ex.answer}}}$.", ex) == 1.0
        assert task.score(f"The answer is {int(ex.answer) + 1}", ex) == -1.0
        for junk in ["", "\\boxed{", "no idea", "}}}{{{", "\\frac{1}{0}"]:
            assert task.score(junk, ex) == -1.0
    # scoring works off the main thread too (math-verify's signal timeouts do not)
    import threading

    out = []
    worker = threading.Thread(target=lambda: out.append(task.score(f"\\boxed{{{ex.answer}}}", ex)))
    worker.start()
    worker.join()
    assert out == [1.0]
    # plain keys (problem / answer) work too, and a directory with train/test files
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "train.jsonl").write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    (tmp_path / "d" / "test.jsonl").write_text(json.dumps({"question": "2+2?", "ground_truth": "4"}) + "\n")
    task = get_task(f"math:{tmp_path / 'd'}")
    assert [e.prompt for e in task.examples("test", 2, seed=0)] == ["2+2?", "2+2?"]
    assert task.score("4", task.examples("test", 1, seed=0)[0]) == 1.0


def test_math_task_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        get_task(f"math:{tmp_path / 'missing.jsonl'}")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(_verl_row("1+1?", "2")) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl: row 2 is not valid JSON"):
        read_math_rows(bad)
    nogt = tmp_path / "nogt.jsonl"
    nogt.write_text(json.dumps(_verl_row("1+1?", "2")) + "\n" + json.dumps({"prompt": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"nogt.jsonl: row 2: no ground truth"):
        read_math_rows(nogt)
    noprompt = tmp_path / "noprompt.jsonl"
    noprompt.write_text(json.dumps({"answer": "3"}) + "\n")
    with pytest.raises(ValueError, match=r"noprompt.jsonl: row 1: no prompt"):
        read_math_rows(noprompt)
    badchat = tmp_path / "badchat.jsonl"
    badchat.write_text(json.dumps({"prompt": [{"role": "user"}], "answer": "3"}) + "\n")
    with pytest.raises(ValueError, match=r"badchat.jsonl: row 1: 'prompt'"):
        read_math_rows(badchat)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="empty.jsonl: no rows"):
        read_math_rows(empty)
    txt = tmp_path / "data.csv"
    txt.write_text("a,b\n")
    with pytest.raises(ValueError, match="unsupported extension"):
        read_math_rows(txt)
    notpq = tmp_path / "fake.parquet"
    notpq.write_text("hello")
    with pytest.raises(ValueError, match="fake.parquet: not a readable parquet"):
        read_math_rows(notpq)
    (tmp_path / "nodir").mkdir()
    with pytest.raises(FileNotFoundError, match="no train.parquet"):
        get_task(f"math:{tmp_path / 'nodir'}")


def test_unfinished_rows_score_through_task_score():
    # Task.score is the one place the overlong penalty is added; an unfinished row is incorrect.
    # max_len 20, buffer 4: length 18 -> (16 - 18)/4 = -0.5, so finished/correct 0.5, unfinished -1.5
    task = get_task("addition", digits=3, overlong=(20, 4))
    ex = Example("123+456=", "579", {"a": 123, "b": 456})
    demo = "3609;2507;1405;0579"
    assert task.score(demo, ex, length=18) == 0.5
    assert task.score(demo, ex, length=18, finished=False) == -1.5
    assert score_batch(task, [demo, demo], [ex, ex], finished=[True, False], lengths=[18, 18]) == [0.5, -1.5]
    # without lengths the character count is used: 19 -> (16 - 19)/4 = -0.75
    assert score_batch(task, [demo], [ex], finished=[False]) == [-1.75]


def test_hash_split_rows_by_hand():
    # 10 rows, test fraction 0.25 -> round(2.5) = 2 test rows: the two smallest prompt hashes
    rows = [Example(f"p{i}", str(i)) for i in range(10)]
    splits = hash_split_rows(rows, 0.25)
    smallest = sorted(rows, key=lambda r: stable_hash(r.prompt))[:2]
    assert {r.prompt for r in splits["test"]} == {r.prompt for r in smallest}
    assert [r.prompt for r in splits["train"]] == [r.prompt for r in rows if r not in smallest]  # file order
    # at least one test row, at most all but one
    assert len(hash_split_rows(rows, 0.0)["test"]) == 1 and len(hash_split_rows(rows, 1.0)["train"]) == 1


def test_hash_split_is_a_threshold_on_the_hash():
    for i in range(200):
        prompt = f"q{i}"
        expected = "test" if stable_hash(prompt) % 10_000 < 1_000 else "train"
        assert hash_split(prompt, 0.1) == expected == AdditionTask().split_of(prompt)


class _EchoTask(ProceduralTask):
    """The documented way to add a task: draw a problem, verify a completion."""

    name = "echo"
    alphabet = "0123456789"

    def draw(self, rng):
        x = str(rng.randint(0, 10**6))
        return Example(prompt=x, answer=x)

    def is_correct(self, completion, example):
        return completion == example.answer

    def demonstration(self, example):
        return example.answer


def test_a_registered_task_is_built_by_get_task(monkeypatch):
    monkeypatch.setitem(TASK_KINDS, "echo", (_EchoTask, None))
    task = get_task("echo", overlong=(8, 2))
    train, test = task.examples("train", 30, seed=0), task.examples("test", 30, seed=0)
    assert task.examples("train", 30, seed=0) == train
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    assert all(task.split_of(e.prompt) == "test" for e in test)
    assert all(task.score(task.demonstration(e), e, length=1) == 1.0 for e in train)
    with pytest.raises(ValueError, match="'echo'"):  # the error lists the registered kinds
        get_task("echo:arg")


def test_load_task_turns_every_user_mistake_into_one_task_error(tmp_path):
    from respo.errors import RespoError
    from respo.runtime.tasks import TaskError, load_task

    assert issubclass(TaskError, RespoError) and issubclass(TaskError, ValueError)
    (tmp_path / "bad.jsonl").write_text('{"prompt": "1+1?", "answer": "2"}\n{"prompt": "x"}\n')
    cases = [("nosuch", None, "unknown task spec 'nosuch'"),
             (f"math:{tmp_path / 'missing.jsonl'}", None, "math task file not found"),
             (f"math:{tmp_path / 'bad.jsonl'}", None, "bad.jsonl: row 2: no ground truth"),
             ("addition", {"digitz": 3}, "does not accept settings {'digitz': 3}")]
    for spec, kwargs, msg in cases:
        with pytest.raises(TaskError, match=re.escape(msg)) as err:
            load_task(spec, kwargs)
        assert "\n" not in str(err.value)
    assert load_task("addition", {"digits": 2}).name.startswith("addition")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_long_task_verifiers_never_crash(text):
    # the long settings: 85-digit addition and 13 × 13-digit multiplication
    for task in (get_task("addition", digits=85), get_task("multiplication", digits=13)):
        ex = task.examples("train", 1, seed=0)[0]
        assert task.score(text, ex) in (1.0, -1.0)
        assert task.score(text + ";" + ex.answer, ex) == 1.0  # a final group with the answer is correct


def test_multiplication_splits_deterministic_and_disjoint():
    task = get_task("multiplication", digits=2, multiplier_digits=2)
    train = task.examples("train", 200, seed=1)
    assert [e.prompt for e in train] == [e.prompt for e in task.examples("train", 200, seed=1)]
    test = task.examples("test", 40, seed=1) + task.examples("test", 40, seed=7)
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    for ex in train[:30] + test[:10]:
        assert task.score(task.demonstration(ex), ex) == 1.0
