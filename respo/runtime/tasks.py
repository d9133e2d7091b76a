"""Tasks with verifiable rewards: prompts with answers, train/test splits, and a scorer.

Rewards follow the paper's DAPO setup: ``score`` returns +1.0 for a correct completion and
-1.0 otherwise (unparseable or malformed completions are simply incorrect, never an error),
plus an optional linear overlong penalty (DAPO's "soft overlong punishment"):

    penalty(ℓ) = 0                              if ℓ <= L_max - L_buf
               = ((L_max - L_buf) - ℓ) / L_buf   if L_max - L_buf < ℓ <= L_max
               = -1                             if ℓ > L_max

with ℓ the response length in tokens (characters for the char tokenizer).

Specs accepted by ``get_task``:

- ``addition`` (kwargs ``digits=3``, ``scratchpad=True``): "123+456=" -> "3690;2570;1450;0579".
  One column per group, least significant first: a_i b_i c_i s_i, where c_i is the carry
  *into* the column and s_i = (a_i + b_i + c_i) mod 10, then the sum zero-padded to
  ``digits + 1`` characters. Response length = 5·digits + digits + 1 (+ EOS): 20 tokens at
  3 digits, 32 at 5 digits. Without scratchpad the response is the plain sum "579".
- ``countdown`` (kwargs ``n_numbers=4``, ``max_number=20``, ``max_target=200``):
  "3,7,12,5>120:" -> an expression over the given numbers, each used at most once, with
  + - * / and parentheses, that evaluates exactly to the target ("(3+7)*12").
- ``reasoning_gym:<name>`` (kwargs passed to ``reasoning_gym.create_dataset``): the package's
  procedural datasets, scored by the dataset's own ``score_answer`` (a score >= ``threshold``,
  default 1.0, is correct). An ``<answer>...</answer>`` span is extracted when present.
- ``math:<path>``: verl/DAPO-format rows in a local JSONL or parquet file (or a directory
  with ``train.*`` and ``test.*``), scored with ``math-verify`` against the ground truth.

Splits are deterministic and disjoint. Procedural tasks put a problem in the test split when
a stable hash of its prompt falls in the test fraction, so the two splits can never share a
prompt whatever the seeds; ``examples(split, n, seed)`` draws n problems of that split from a
generator seeded by (task, split, seed).
"""

from __future__ import annotations

import ast
import hashlib
import json
import random
import re
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Sequence

from .tokenizer import ARITHMETIC_ALPHABET, TEXT_ALPHABET

SPLITS = ("train", "test")


@dataclass(frozen=True)
class Example:
    """One problem. ``answer`` is the reference answer as text; ``meta`` is task specific."""

    prompt: str
    answer: str
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class OverlongPenalty:
    """DAPO's linear overlong penalty: 0 up to ``max_len - buffer``, then down to -1 at ``max_len``."""

    max_len: int
    buffer: int

    def __post_init__(self):
        if not (0 < self.buffer <= self.max_len):
            raise ValueError(
                f"overlong penalty needs 0 < buffer <= max_len, got buffer={self.buffer}, "
                f"max_len={self.max_len}"
            )

    def __call__(self, length: int) -> float:
        free = self.max_len - self.buffer
        if length <= free:
            return 0.0
        if length <= self.max_len:
            return (free - length) / self.buffer
        return -1.0


def stable_hash(text: str) -> int:
    """A process-independent 64-bit hash (Python's ``hash`` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def _check_n(n: int) -> None:
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")


class Task(ABC):
    """A stream of prompts with answers and a +1/-1 reward.

    Attributes:
        name: the spec this task was built from.
        alphabet: the characters a char tokenizer needs for prompts and responses.
        overlong: optional ``OverlongPenalty`` added by ``score``.
    """

    name: str = "task"
    alphabet: str = TEXT_ALPHABET
    overlong: OverlongPenalty | None = None

    @abstractmethod
    def examples(self, split: str, n: int, seed: int) -> list[Example]:
        """``n`` examples of ``split`` ("train" or "test"), a deterministic function of ``seed``."""

    @abstractmethod
    def is_correct(self, completion: str, example: Example) -> bool:
        """Whether the completion solves the example. Must not raise on any string."""

    def score(self, completion: str, example: Example, *, length: int | None = None) -> float:
        """+1.0 if correct else -1.0, plus the overlong penalty of ``length`` (default: len(completion))."""
        try:
            ok = bool(self.is_correct(completion, example))
        except Exception:  # a verifier bug or odd input must not crash a training run
            ok = False
        reward = 1.0 if ok else -1.0
        if self.overlong is not None:
            reward += self.overlong(len(completion) if length is None else int(length))
        return reward

    def demonstration(self, example: Example) -> str:
        """A correct completion (for SFT). Tasks without one raise ``NotImplementedError``."""
        raise NotImplementedError(f"task {self.name!r} has no demonstrations")


def score_batch(
    task: Task,
    completions: Sequence[str],
    examples: Sequence[Example],
    *,
    finished: Sequence[bool] | None = None,
    lengths: Sequence[int] | None = None,
) -> list[float]:
    """Score a batch; a row with ``finished[i] == False`` (no EOS: truncated) scores -1 (+ penalty).

    Args:
        completions: N decoded responses. examples: N examples (same order).
        finished: optional N flags (the sampler's ``Rollout.finished``).
        lengths: optional N response lengths in tokens for the overlong penalty.
    """
    if len(completions) != len(examples):
        raise ValueError(f"{len(completions)} completions but {len(examples)} examples")
    out = []
    for i, (text, ex) in enumerate(zip(completions, examples)):
        length = None if lengths is None else lengths[i]
        r = task.score(text, ex, length=length)
        if finished is not None and not finished[i]:
            r = -1.0 + (task.overlong(len(text) if length is None else length) if task.overlong else 0.0)
        out.append(r)
    return out


def score_rollout(task: Task, rollout, examples: Sequence[Example]) -> list[float]:
    """+1/-1 (plus any overlong penalty) per row of a sampler ``Rollout``; a response cut at
    ``max_new_tokens`` (no EOS) scores -1 (see `score_batch`)."""
    return score_batch(task, rollout.responses, examples, finished=None if rollout.finished is None else rollout.finished.tolist(),
                       lengths=rollout.response_mask.sum(1).long().tolist())


class ProceduralTask(Task):
    """A task generated from a seeded RNG; the split of a problem is decided by its prompt hash."""

    test_fraction: float = 0.1

    def split_of(self, prompt: str) -> str:
        """"test" for a ``test_fraction`` share of the prompt hash space, else "train"."""
        return "test" if stable_hash(prompt) % 10_000 < self.test_fraction * 10_000 else "train"

    @abstractmethod
    def draw(self, rng: random.Random) -> Example:
        """One random problem (either split)."""

    def examples(self, split: str, n: int, seed: int) -> list[Example]:
        _check_split(split)
        _check_n(n)
        rng = random.Random(f"{self.name}|{split}|{seed}")
        out: list[Example] = []
        tries, limit = 0, 1000 * max(n, 1) + 10_000
        while len(out) < n:
            ex = self.draw(rng)
            if self.split_of(ex.prompt) == split:
                out.append(ex)
            tries += 1
            if tries > limit:
                raise RuntimeError(
                    f"task {self.name!r}: found only {len(out)} of {n} {split} examples in "
                    f"{limit} draws; the problem space is too small for this split"
                )
        return out


# --------------------------------------------------------------------------------- addition


class AdditionTask(ProceduralTask):
    """a + b with ``digits``-digit operands, optionally with a column-by-column scratchpad."""

    alphabet = ARITHMETIC_ALPHABET

    def __init__(self, digits: int = 3, scratchpad: bool = True):
        if not isinstance(digits, int) or not 1 <= digits <= 18:
            raise ValueError(f"addition: digits must be an int in [1, 18], got {digits!r}")
        self.digits, self.scratchpad = digits, bool(scratchpad)
        self.name = f"addition(digits={digits},scratchpad={self.scratchpad})"

    def draw(self, rng: random.Random) -> Example:
        lo, hi = 10 ** (self.digits - 1), 10**self.digits - 1
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        return Example(prompt=f"{a}+{b}=", answer=str(a + b), meta={"a": a, "b": b})

    def response_length(self) -> int:
        """Response tokens without EOS: 5 per column + the zero-padded sum (or the bare sum)."""
        return 6 * self.digits + 1 if self.scratchpad else self.digits + 1

    def demonstration(self, example: Example) -> str:
        a, b = example.meta["a"], example.meta["b"]
        if not self.scratchpad:
            return str(a + b)
        da = str(a).zfill(self.digits)[::-1]
        db = str(b).zfill(self.digits)[::-1]
        carry, cols = 0, []
        for x, y in zip(da, db):
            s = int(x) + int(y) + carry
            cols.append(f"{x}{y}{carry}{s % 10}")
            carry = s // 10
        return ";".join(cols) + ";" + str(a + b).zfill(self.digits + 1)

    def is_correct(self, completion: str, example: Example) -> bool:
        final = completion.strip().rsplit(";", 1)[-1].strip()
        return final.isdigit() and int(final) == int(example.answer)


# -------------------------------------------------------------------------------- countdown

_OPS: dict[type, Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: lambda x, y: x + y,
    ast.Sub: lambda x, y: x - y,
    ast.Mult: lambda x, y: x * y,
    ast.Div: lambda x, y: x / y,
}


def safe_eval(expression: str, max_len: int = 200) -> tuple[Fraction, list[int]]:
    """Evaluate an arithmetic expression of non-negative integers with + - * / and parentheses.

    Nothing is executed: the expression is parsed with ``ast`` and only integer literals and
    the four binary operators are accepted; arithmetic is exact (``Fraction``).

    Returns:
        (value, the integer literals used in order).

    Raises:
        ValueError: anything else (names, calls, powers, unary minus, floats, division by
            zero, too long).
    """
    if len(expression) > max_len:
        raise ValueError(f"expression longer than {max_len} characters")
    tree = ast.parse(expression.strip(), mode="eval")
    used: list[int] = []

    def ev(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise ValueError("division by zero")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 0:
            used.append(node.value)
            return Fraction(node.value)
        raise ValueError(f"disallowed syntax: {type(node).__name__}")

    return ev(tree.body), used


class CountdownTask(ProceduralTask):
    """Reach the target with some of the given numbers (each at most once) and + - * /."""

    alphabet = ARITHMETIC_ALPHABET

    def __init__(self, n_numbers: int = 4, max_number: int = 20, max_target: int = 200):
        if not isinstance(n_numbers, int) or not 2 <= n_numbers <= 8:
            raise ValueError(f"countdown: n_numbers must be an int in [2, 8], got {n_numbers!r}")
        if max_number < 2 or max_target < 1:
            raise ValueError(
                f"countdown: need max_number >= 2 and max_target >= 1, got {max_number}, {max_target}"
            )
        self.n_numbers, self.max_number, self.max_target = n_numbers, max_number, max_target
        self.name = f"countdown(n_numbers={n_numbers},max_number={max_number},max_target={max_target})"

    def draw(self, rng: random.Random) -> Example:
        while True:
            numbers = [rng.randint(1, self.max_number) for _ in range(self.n_numbers)]
            k = rng.randint(2, self.n_numbers)
            items = [(Fraction(x), str(x)) for x in rng.sample(numbers, k)]
            while len(items) > 1:  # combine two random items until one expression is left
                i, j = rng.sample(range(len(items)), 2)
                (x, ex), (y, ey) = items[i], items[j]
                op = rng.choice("+-*/")
                if op == "-" and x < y:
                    (x, ex), (y, ey) = (y, ey), (x, ex)
                if op == "/" and (y == 0 or (x / y).denominator != 1):
                    op = "+"
                value = {"+": x + y, "-": x - y, "*": x * y, "/": x / y if y else x}[op]
                items = [it for t, it in enumerate(items) if t not in (i, j)]
                items.append((value, f"({ex}{op}{ey})"))
            value, expr = items[0]
            if value.denominator == 1 and 1 <= value <= self.max_target:
                break
        expr = expr[1:-1] if expr.startswith("(") else expr
        target = int(value)
        prompt = ",".join(map(str, numbers)) + f">{target}:"
        return Example(
            prompt=prompt, answer=str(target),
            meta={"numbers": numbers, "target": target, "solution": expr},
        )

    def demonstration(self, example: Example) -> str:
        return example.meta["solution"]

    def is_correct(self, completion: str, example: Example) -> bool:
        try:
            value, used = safe_eval(completion)
        except (ValueError, SyntaxError, RecursionError, MemoryError):
            return False
        pool = list(example.meta["numbers"])
        for x in used:  # each given number at most once (multiset inclusion)
            if x not in pool:
                return False
            pool.remove(x)
        return value == example.meta["target"]


# --------------------------------------------------------------------------- reasoning-gym

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


class ReasoningGymTask(ProceduralTask):
    """A ``reasoning_gym`` procedural dataset, scored with the dataset's own verifier."""

    alphabet = TEXT_ALPHABET

    def __init__(self, dataset: str, *, threshold: float = 1.0, chunk: int = 256, **config: Any):
        import reasoning_gym

        self.dataset, self.config, self.threshold, self.chunk = dataset, config, threshold, chunk
        self.name = f"reasoning_gym:{dataset}"
        try:
            self._probe = reasoning_gym.create_dataset(dataset, size=1, seed=0, **config)
        except Exception as err:
            raise ValueError(f"reasoning_gym dataset {dataset!r} could not be created: {err}") from err

    def draw(self, rng: random.Random) -> Example:  # pragma: no cover - examples() is overridden
        raise NotImplementedError

    def examples(self, split: str, n: int, seed: int) -> list[Example]:
        import reasoning_gym

        _check_split(split)
        _check_n(n)
        out: list[Example] = []
        for c in range(10_000):
            if len(out) >= n:
                break
            sub_seed = stable_hash(f"{self.name}|{split}|{seed}|{c}") % (2**31)
            ds = reasoning_gym.create_dataset(self.dataset, size=self.chunk, seed=sub_seed, **self.config)
            for entry in ds:
                if self.split_of(entry["question"]) == split:
                    out.append(
                        Example(prompt=entry["question"], answer=str(entry["answer"]), meta={"entry": entry})
                    )
                    if len(out) >= n:
                        break
        return out

    def demonstration(self, example: Example) -> str:
        return example.answer

    def is_correct(self, completion: str, example: Example) -> bool:
        m = _ANSWER_TAG.search(completion)
        answer = (m.group(1) if m else completion).strip()
        return float(self._probe.score_answer(answer, example.meta["entry"])) >= self.threshold


# ------------------------------------------------------------------------------------- math


def _row_prompt(row: dict, where: str) -> str:
    for key in ("prompt", "problem", "question"):
        if key in row and row[key] is not None:
            value = row[key]
            if isinstance(value, str):
                return value
            try:  # verl chat format: [{"role": "user", "content": "..."}]
                contents = [m["content"] for m in value]
            except (TypeError, KeyError, IndexError) as err:
                raise ValueError(f"{where}: '{key}' is neither a string nor a list of chat messages") from err
            if not contents or not all(isinstance(c, str) for c in contents):
                raise ValueError(f"{where}: '{key}' chat messages must have string contents")
            return "\n".join(contents)
    raise ValueError(f"{where}: no prompt (expected a 'prompt', 'problem' or 'question' field)")


def _row_ground_truth(row: dict, where: str) -> str:
    rm = row.get("reward_model")
    if isinstance(rm, str):
        try:
            rm = json.loads(rm)
        except json.JSONDecodeError:
            rm = None
    if isinstance(rm, dict) and rm.get("ground_truth") is not None:
        return str(rm["ground_truth"])
    for key in ("ground_truth", "answer"):
        if row.get(key) is not None:
            return str(row[key])
    raise ValueError(
        f"{where}: no ground truth (expected reward_model.ground_truth, 'ground_truth' or 'answer')"
    )


def read_math_rows(path: str | Path) -> list[Example]:
    """Read verl/DAPO-format rows from a ``.jsonl``/``.json`` or ``.parquet`` file.

    A row needs a prompt (``prompt`` as text or chat messages, or ``problem``/``question``) and
    a ground truth (``reward_model.ground_truth``, or ``ground_truth``/``answer``).

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: unknown extension, empty file, bad JSON, or a row missing a field; the
            message names the file and the (1-based) row.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"math task file not found: {path}")
    rows: list[tuple[int, Any]] = []
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        with path.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rows.append((lineno, json.loads(line)))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}: row {lineno} is not valid JSON ({err.msg})") from err
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as err:
            raise ValueError(f"{path}: not a readable parquet file ({err})") from err
        rows = list(enumerate(table.to_pylist(), 1))
    else:
        raise ValueError(f"{path}: unsupported extension {suffix!r} (use .jsonl, .json or .parquet)")
    if not rows:
        raise ValueError(f"{path}: no rows")
    out = []
    for lineno, row in rows:
        where = f"{path}: row {lineno}"
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected an object, got {type(row).__name__}")
        out.append(
            Example(
                prompt=_row_prompt(row, where),
                answer=_row_ground_truth(row, where),
                meta={"row": lineno, "file": str(path), "data_source": row.get("data_source")},
            )
        )
    return out


class MathTask(Task):
    """Math problems from local verl/DAPO-format files, scored with ``math-verify``.

    ``path`` is a file (split deterministically by prompt hash: the ``test_fraction`` of
    prompts with the smallest hashes, at least one, is the test split) or a directory with
    ``train.{jsonl,parquet}`` and ``test.{jsonl,parquet}``.
    """

    alphabet = TEXT_ALPHABET

    def __init__(self, path: str | Path, *, test_fraction: float = 0.1):
        path = Path(path)
        self.name = f"math:{path}"
        if path.is_dir():
            self._splits = {s: read_math_rows(self._find(path, s)) for s in SPLITS}
        else:
            rows = read_math_rows(path)
            if len(rows) < 2:
                raise ValueError(f"{path}: need at least 2 rows to make a train and a test split")
            order = sorted(range(len(rows)), key=lambda i: (stable_hash(rows[i].prompt), i))
            n_test = min(len(rows) - 1, max(1, round(test_fraction * len(rows))))
            test_prompts = {rows[i].prompt for i in order[:n_test]}
            test = [r for r in rows if r.prompt in test_prompts]
            train = [r for r in rows if r.prompt not in test_prompts]
            if not train:
                raise ValueError(f"{path}: every row has the same prompt; cannot split")
            self._splits = {"train": train, "test": test}

    @staticmethod
    def _find(directory: Path, split: str) -> Path:
        for ext in (".parquet", ".jsonl", ".json"):
            candidate = directory / f"{split}{ext}"
            if candidate.is_file():
                return candidate
        raise FileNotFoundError(f"{directory}: no {split}.parquet, {split}.jsonl or {split}.json")

    def __len__(self) -> int:
        return sum(len(v) for v in self._splits.values())

    def examples(self, split: str, n: int, seed: int) -> list[Example]:
        """n rows of the split: a seeded permutation, repeated with fresh permutations if n > rows."""
        _check_split(split)
        _check_n(n)
        rows = self._splits[split]
        rng = random.Random(f"{self.name}|{split}|{seed}")
        out: list[Example] = []
        while len(out) < n:
            order = list(range(len(rows)))
            rng.shuffle(order)
            out.extend(rows[i] for i in order[: n - len(out)])
        return out

    def is_correct(self, completion: str, example: Example) -> bool:
        from math_verify import parse, verify

        # math-verify's timeouts use signal.alarm, which only works in the main thread (the
        # trainer's async rollout worker is another thread): elsewhere run without timeouts.
        main = threading.current_thread() is threading.main_thread()
        parse_timeout, verify_timeout = (5, 5) if main else (None, None)
        gold_text = example.answer if "\\boxed" in example.answer else f"\\boxed{{{example.answer}}}"
        gold = parse(gold_text, parsing_timeout=parse_timeout)
        pred = parse(completion, parsing_timeout=parse_timeout)
        if not gold or not pred:
            return False
        return bool(verify(gold, pred, timeout_seconds=verify_timeout))


# ---------------------------------------------------------------------------------- factory


def get_task(spec: str, *, overlong: tuple[int, int] | OverlongPenalty | None = None, **kwargs: Any) -> Task:
    """Build a task from a spec string.

    Args:
        spec: ``addition``, ``countdown``, ``reasoning_gym:<name>`` or ``math:<path>``.
        overlong: optional ``(max_len, buffer)`` for the linear overlong penalty.
        **kwargs: the task's knobs (e.g. ``digits=5`` for addition).
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"task spec must be a non-empty string, got {spec!r}")
    kind, _, arg = spec.partition(":")
    if kind == "addition" and not arg:
        task: Task = AdditionTask(**kwargs)
    elif kind == "countdown" and not arg:
        task = CountdownTask(**kwargs)
    elif kind == "reasoning_gym" and arg:
        task = ReasoningGymTask(arg, **kwargs)
    elif kind == "math" and arg:
        task = MathTask(arg, **kwargs)
    else:
        raise ValueError(
            f"unknown task spec {spec!r}; expected 'addition', 'countdown', "
            "'reasoning_gym:<name>' or 'math:<path>'"
        )
    if overlong is not None:
        task.overlong = overlong if isinstance(overlong, OverlongPenalty) else OverlongPenalty(*overlong)
    return task
