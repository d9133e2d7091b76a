"""The task interface, the reward, the overlong penalty and the train/test split rule."""

from __future__ import annotations

import hashlib
import random
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from respo.errors import RespoError

from ..tokenizer import TEXT_ALPHABET

__all__ = [
    "SPLITS",
    "TaskError",
    "CORRECT_REWARD",
    "INCORRECT_REWARD",
    "DEFAULT_TEST_FRACTION",
    "Example",
    "OverlongPenalty",
    "stable_hash",
    "hash_split",
    "hash_split_rows",
    "split_rng",
    "check_request",
    "Task",
    "ProceduralTask",
    "score_batch",
    "score_rollout",
]

SPLITS = ("train", "test")
CORRECT_REWARD = 1.0
INCORRECT_REWARD = -1.0
DEFAULT_TEST_FRACTION = 0.1
HASH_BUCKETS = 10_000  # resolution of the test fraction in the hash split
DRAWS_PER_EXAMPLE = 1000  # a procedural split gives up after this many draws per example asked ...
EXTRA_DRAWS = 10_000  # ... plus this many


class TaskError(RespoError, ValueError):
    """A task that cannot be built from what the user gave: unknown spec, missing or malformed file,
    unknown setting. The message names the spec, file or row; the CLI prints it as one line."""


@dataclass(frozen=True)
class Example:
    """One problem. ``answer`` is the reference answer as text; ``meta`` is task specific."""

    prompt: str
    answer: str
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class OverlongPenalty:
    """DAPO's linear overlong penalty: 0 up to ``max_len - buffer``, then down to -1 at ``max_len``.

        penalty(ℓ) = 0                              if ℓ <= L_max - L_buf
                   = ((L_max - L_buf) - ℓ) / L_buf   if L_max - L_buf < ℓ <= L_max
                   = -1                             if ℓ > L_max
    """

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


# ------------------------------------------------------------------------------------ splits


def stable_hash(text: str) -> int:
    """A process-independent 64-bit hash (Python's ``hash`` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def hash_split(prompt: str, test_fraction: float) -> str:
    """The split of a prompt drawn from an unbounded stream: "test" for a ``test_fraction`` share
    of the hash space, else "train". The two splits can never share a prompt whatever the seeds."""
    return "test" if stable_hash(prompt) % HASH_BUCKETS < test_fraction * HASH_BUCKETS else "train"


def hash_split_rows(rows: Sequence[Example], test_fraction: float) -> dict[str, list[Example]]:
    """The splits of a finite set of rows: the ``test_fraction`` of rows with the smallest prompt
    hashes (at least one row, at most all but one) are the test split.

    Rows sharing a prompt share a split, so the train split is empty when every row has the
    test rows' prompt; the caller decides whether that is an error. File order is kept.
    """
    order = sorted(range(len(rows)), key=lambda i: (stable_hash(rows[i].prompt), i))
    n_test = min(len(rows) - 1, max(1, round(test_fraction * len(rows))))
    test_prompts = {rows[i].prompt for i in order[:n_test]}
    return {
        "train": [r for r in rows if r.prompt not in test_prompts],
        "test": [r for r in rows if r.prompt in test_prompts],
    }


def split_rng(name: str, split: str, seed: int) -> random.Random:
    """The generator that draws the examples of (task, split, seed)."""
    return random.Random(f"{name}|{split}|{seed}")


def check_request(split: str, n: int) -> None:
    """Raise ``ValueError`` unless ``split`` is a known split and ``n`` a non-negative int."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")


# ------------------------------------------------------------------------------------- tasks


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

    def score(
        self, completion: str, example: Example, *, length: int | None = None, finished: bool = True
    ) -> float:
        """+1.0 if finished and correct else -1.0, plus the overlong penalty of ``length``
        (default: len(completion)). An unfinished response (cut before EOS) is never correct."""
        reward = CORRECT_REWARD if finished and self._verified(completion, example) else INCORRECT_REWARD
        if self.overlong is not None:
            reward += self.overlong(len(completion) if length is None else int(length))
        return reward

    def _verified(self, completion: str, example: Example) -> bool:
        try:
            return bool(self.is_correct(completion, example))
        except Exception:  # a verifier bug or odd input must not crash a training run
            return False

    def demonstration(self, example: Example) -> str:
        """A correct completion (for SFT). Tasks without one raise ``NotImplementedError``."""
        raise NotImplementedError(f"task {self.name!r} has no demonstrations")


class ProceduralTask(Task):
    """A task generated from a seeded stream of problems; the split of a problem is decided by its
    prompt hash (``hash_split``), so the splits are disjoint whatever the seeds.

    Subclasses implement ``draw(rng)`` (one random problem), or override ``candidates`` when
    their stream is not one draw per problem.
    """

    test_fraction: float = DEFAULT_TEST_FRACTION

    def split_of(self, prompt: str) -> str:
        """"test" for a ``test_fraction`` share of the prompt hash space, else "train"."""
        return hash_split(prompt, self.test_fraction)

    def draw(self, rng: random.Random) -> Example:
        """One random problem (either split)."""
        raise NotImplementedError(f"task {self.name!r} implements neither draw nor candidates")

    def candidates(self, split: str, seed: int) -> Iterator[Example]:
        """An endless deterministic stream of problems of either split for (split, seed)."""
        rng = split_rng(self.name, split, seed)
        while True:
            yield self.draw(rng)

    def examples(self, split: str, n: int, seed: int) -> list[Example]:
        check_request(split, n)
        stream = self.candidates(split, seed)
        out: list[Example] = []
        limit = DRAWS_PER_EXAMPLE * max(n, 1) + EXTRA_DRAWS
        for _ in range(limit):
            if len(out) >= n:
                break
            ex = next(stream)
            if self.split_of(ex.prompt) == split:
                out.append(ex)
        if len(out) < n:
            raise RuntimeError(
                f"task {self.name!r}: found only {len(out)} of {n} {split} examples in "
                f"{limit} draws; the problem space is too small for this split"
            )
        return out


# ------------------------------------------------------------------------------------ scoring


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
    return [
        task.score(
            text,
            ex,
            length=None if lengths is None else lengths[i],
            finished=True if finished is None else bool(finished[i]),
        )
        for i, (text, ex) in enumerate(zip(completions, examples))
    ]


def score_rollout(task: Task, rollout, examples: Sequence[Example]) -> list[float]:
    """+1/-1 (plus any overlong penalty) per row of a sampler ``Rollout``; a response cut at
    ``max_new_tokens`` (no EOS) scores -1 (see ``score_batch``)."""
    finished = None if rollout.finished is None else rollout.finished.tolist()
    lengths = rollout.response_mask.sum(1).long().tolist()  # (B,) response tokens
    return score_batch(task, rollout.responses, examples, finished=finished, lengths=lengths)
