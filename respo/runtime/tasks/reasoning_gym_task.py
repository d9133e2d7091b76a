"""``reasoning_gym`` procedural datasets as tasks, scored by each dataset's own verifier."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import Any

from ..tokenizer import TEXT_ALPHABET
from .base import Example, ProceduralTask, stable_hash

__all__ = ["ReasoningGymTask"]

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
DEFAULT_CHUNK = 256  # entries per ``create_dataset`` call
_SEED_MODULUS = 2**31  # reasoning_gym seeds are 31-bit


class ReasoningGymTask(ProceduralTask):
    """A ``reasoning_gym`` procedural dataset, scored with the dataset's own verifier.

    ``config`` is passed to ``reasoning_gym.create_dataset``; a ``score_answer`` >= ``threshold``
    is correct. An ``<answer>...</answer>`` span is extracted when present.
    """

    alphabet = TEXT_ALPHABET

    def __init__(self, dataset: str, *, threshold: float = 1.0, chunk: int = DEFAULT_CHUNK, **config: Any):
        import reasoning_gym

        self.dataset, self.config, self.threshold, self.chunk = dataset, config, threshold, chunk
        self.name = f"reasoning_gym:{dataset}"
        try:
            self._probe = reasoning_gym.create_dataset(dataset, size=1, seed=0, **config)
        except Exception as err:
            raise ValueError(f"reasoning_gym dataset {dataset!r} could not be created: {err}") from err

    def candidates(self, split: str, seed: int) -> Iterator[Example]:
        """Chunks of ``chunk`` entries, each a dataset seeded by (task, split, seed, chunk index)."""
        import reasoning_gym

        for c in itertools.count():
            sub_seed = stable_hash(f"{self.name}|{split}|{seed}|{c}") % _SEED_MODULUS
            ds = reasoning_gym.create_dataset(self.dataset, size=self.chunk, seed=sub_seed, **self.config)
            for entry in ds:
                yield Example(prompt=entry["question"], answer=str(entry["answer"]), meta={"entry": entry})

    def demonstration(self, example: Example) -> str:
        return example.answer

    def is_correct(self, completion: str, example: Example) -> bool:
        m = _ANSWER_TAG.search(completion)
        answer = (m.group(1) if m else completion).strip()
        return float(self._probe.score_answer(answer, example.meta["entry"])) >= self.threshold
