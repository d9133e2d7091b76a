"""Tasks with verifiable rewards: prompts with answers, train/test splits, and a scorer.

Rewards follow the paper's DAPO setup: ``Task.score`` returns +1.0 for a correct completion and
-1.0 otherwise (unparseable or malformed completions are simply incorrect, never an error; a
response cut before EOS is incorrect), plus an optional linear overlong penalty
(``OverlongPenalty``, DAPO's "soft overlong punishment") of the response length ℓ in tokens
(characters for the char tokenizer). ``score_batch`` and ``score_rollout`` score many rows
through ``Task.score``, the one place the penalty is added.

Specs accepted by ``get_task``:

- ``addition`` (kwargs ``digits=3``, ``scratchpad=True``): "123+456=" -> "3609;2507;1405;0579".
  One column per group, least significant first: a_i b_i c_i s_i, where c_i is the carry
  *into* the column and s_i = (a_i + b_i + c_i) mod 10, then the sum zero-padded to
  ``digits + 1`` characters. Response length = 5·digits + digits + 1 (+ EOS): 20 tokens at
  3 digits, 32 at 5 digits, 128 at 21, 254 at 42, 512 at 85 (up to ``MAX_DIGITS`` = 120).
  Without scratchpad the response is the plain sum "579".
- ``multiplication`` (kwargs ``digits``, ``multiplier_digits``): "123*45=" -> one group of partial
  product and running sum per digit of the multiplier, then the product; a long worked answer of
  another kind (31 tokens at 3x2 digits, 123 at 5x6, 252 at 8x9, 521 at 13x13).
- ``countdown`` (kwargs ``n_numbers=4``, ``max_number=20``, ``max_target=200``):
  "3,7,12,5>120:" -> an expression over the given numbers, each used at most once, with
  + - * / and parentheses, that evaluates exactly to the target ("(3+7)*12").
- ``reasoning_gym:<name>`` (kwargs passed to ``reasoning_gym.create_dataset``): the package's
  procedural datasets, scored by the dataset's own ``score_answer`` (a score >= ``threshold``,
  default 1.0, is correct). An ``<answer>...</answer>`` span is extracted when present.
- ``worded_addition`` (kwargs ``digits=2``): "What is 347 + 586?" -> a column-by-column solution in
  words, in several phrasings, ending in "Answer: 933" (for pretrained instruct models; graded on the
  extracted final answer).
- ``math:<path>``: verl/DAPO-format rows in a local JSONL or parquet file (or a directory
  with ``train.*`` and ``test.*``), scored with ``math-verify`` against the ground truth.

Splits are deterministic and disjoint, decided by a stable hash of the prompt (``base``):
procedural tasks put a problem in the test split when its hash falls in the test fraction
(``hash_split``), so the two splits can never share a prompt whatever the seeds; a finite file
puts the test fraction of rows with the smallest hashes in the test split (``hash_split_rows``).
``examples(split, n, seed)`` draws n problems of that split from a generator seeded by
(task, split, seed).

Modules: ``base`` (interface, reward, penalty, splits, batch scoring), ``arithmetic``
(addition, countdown), ``multiplication``, ``reasoning_gym_task``, ``math_files``.

Adding a task
-------------
1. Subclass ``ProceduralTask`` for problems generated from a seed: implement
   ``draw(rng) -> Example`` (one random problem of either split; the hash split filters it) and
   ``is_correct(completion, example)`` (must not raise); set ``name`` (the spec, with its knobs)
   and ``alphabet`` (the characters a char tokenizer needs); optionally ``demonstration`` (a
   correct completion, for SFT). For a fixed set of problems subclass ``Task`` and implement
   ``examples(split, n, seed)`` (``check_request``, ``hash_split_rows`` and ``split_rng`` help).
2. Register it in ``TASK_KINDS`` below: ``"kind": (TaskClass, None)`` for a plain ``kind``
   spec, or ``(TaskClass, "arg")`` for a ``kind:<arg>`` spec whose argument is passed first.
   ``get_task(spec, **kwargs)`` passes the kwargs to the constructor and attaches the overlong
   penalty.
3. Test that its splits are deterministic and disjoint and that demonstrations score +1
   (``tests/runtime/test_tasks.py`` parametrises over specs).
"""

from __future__ import annotations

import inspect
from typing import Any

from .arithmetic import AdditionTask, CountdownTask, safe_eval
from .base import (
    SPLITS,
    Example,
    TaskError,
    OverlongPenalty,
    ProceduralTask,
    Task,
    check_request,
    hash_split,
    hash_split_rows,
    score_batch,
    score_rollout,
    split_rng,
    stable_hash,
)
from .math_files import MathTask, read_math_rows
from .multiplication import MultiplicationTask
from .reasoning_gym_task import ReasoningGymTask
from .worded import WordedAdditionTask

__all__ = [
    "SPLITS",
    "TASK_KINDS",
    "TaskError",
    "Example",
    "OverlongPenalty",
    "Task",
    "ProceduralTask",
    "AdditionTask",
    "MultiplicationTask",
    "CountdownTask",
    "ReasoningGymTask",
    "MathTask",
    "WordedAdditionTask",
    "check_request",
    "get_task",
    "load_task",
    "task_defaults",
    "task_help",
    "hash_split",
    "hash_split_rows",
    "read_math_rows",
    "safe_eval",
    "score_batch",
    "score_rollout",
    "split_rng",
    "stable_hash",
]

# spec kind -> (task class, name of the argument after "kind:", or None for a plain "kind")
TASK_KINDS: dict[str, tuple[type[Task], str | None]] = {
    "addition": (AdditionTask, None),
    "countdown": (CountdownTask, None),
    "multiplication": (MultiplicationTask, None),
    "reasoning_gym": (ReasoningGymTask, "name"),
    "math": (MathTask, "path"),
    "worded_addition": (WordedAdditionTask, None),
}


def _spec_forms() -> str:
    forms = [f"'{kind}'" if arg is None else f"'{kind}:<{arg}>'" for kind, (_, arg) in TASK_KINDS.items()]
    return ", ".join(forms[:-1]) + " or " + forms[-1]


def task_help() -> str:
    """The task specs ``get_task`` accepts, for help texts: "'addition', ... or 'math:<path>'"."""
    return _spec_forms()


def get_task(spec: str, *, overlong: tuple[int, int] | OverlongPenalty | None = None, **kwargs: Any) -> Task:
    """Build a task from a spec string.

    Args:
        spec: ``addition``, ``countdown``, ``multiplication``, ``reasoning_gym:<name>`` or ``math:<path>`` (the
            kinds of ``TASK_KINDS``).
        overlong: optional ``(max_len, buffer)`` for the linear overlong penalty.
        **kwargs: the task's knobs (e.g. ``digits=5`` for addition).
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"task spec must be a non-empty string, got {spec!r}")
    kind, _, arg = spec.partition(":")
    task_cls, arg_name = TASK_KINDS.get(kind, (None, None))
    if task_cls is None or bool(arg) != (arg_name is not None):
        raise ValueError(f"unknown task spec {spec!r}; expected {_spec_forms()}")
    task = task_cls(arg, **kwargs) if arg_name is not None else task_cls(**kwargs)
    if overlong is not None:
        task.overlong = overlong if isinstance(overlong, OverlongPenalty) else OverlongPenalty(*overlong)
    return task


def task_defaults(spec: str) -> dict[str, Any]:
    """The settings a task of this spec takes by default (its constructor's keyword defaults), e.g.
    ``{"digits": 3, "scratchpad": True}`` for ``addition``; ``{}`` for an unknown spec."""
    task_cls, _ = TASK_KINDS.get(spec.partition(":")[0], (None, None))
    if task_cls is None:
        return {}
    params = inspect.signature(task_cls.__init__).parameters.values()
    return {p.name: p.default for p in params
            if p.default is not p.empty and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


def load_task(spec: str, kwargs: dict[str, Any] | None = None) -> Task:
    """``get_task(spec, **kwargs)`` for settings a person typed: whatever is wrong with the spec, its file
    or its settings is raised as one `TaskError` whose one-line message names it.

    Raises:
        TaskError: unknown spec, missing file, malformed row, unknown or invalid task setting.
    """
    kwargs = dict(kwargs or {})
    try:
        return get_task(spec, **kwargs)
    except (ValueError, FileNotFoundError) as err:
        raise TaskError(_one_line(err)) from None
    except TypeError as err:  # an unknown keyword for the task's constructor
        raise TaskError(f"task {spec!r} does not accept settings {kwargs}: {_one_line(err)}") from None
    except ModuleNotFoundError as err:
        raise TaskError(f"task {spec!r} needs the {err.name!r} package, which is not installed") from None


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())
