"""Math problems from local verl/DAPO-format files, scored with ``math-verify``."""

from __future__ import annotations

import functools
import json
import threading
import warnings
from pathlib import Path
from typing import Any

from ..tokenizer import TEXT_ALPHABET
from .base import DEFAULT_TEST_FRACTION, SPLITS, Example, Task, check_request, hash_split_rows, split_rng

__all__ = ["MathTask", "read_math_rows"]

MATH_VERIFY_TIMEOUT_S = 5  # math-verify's parse and verify timeouts (main thread only)
_PROMPT_KEYS = ("prompt", "problem", "question")
_GROUND_TRUTH_KEYS = ("ground_truth", "answer")
_SPLIT_FILE_EXTENSIONS = (".parquet", ".jsonl", ".json")
_SHOWN_BAD_ROWS = 3  # unparseable ground truths named in the load warning
_GOLD_CACHE_SIZE = 65536  # parsed ground truths kept (a DAPO file has ~17k distinct answers)


def _timeout() -> int | None:
    """math-verify's timeouts use signal.alarm, which only works in the main thread (the trainer's async
    rollout worker is another thread): elsewhere run without timeouts."""
    return MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=_GOLD_CACHE_SIZE)
def _parse_gold(answer: str, timeout: int | None) -> list:
    """math-verify's parse of a ground truth (boxed unless it already is); empty when unparseable."""
    from math_verify import parse

    return parse(answer if "\\boxed" in answer else f"\\boxed{{{answer}}}", parsing_timeout=timeout)


def _parses_as_math(parsed: list) -> bool:
    """Whether math-verify found a math object; it appends the raw text (a str) to every parse."""
    return any(not isinstance(p, str) for p in parsed)


def _row_prompt(row: dict, where: str) -> str:
    for key in _PROMPT_KEYS:
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
    for key in _GROUND_TRUTH_KEYS:
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

    ``path`` is a file (split by ``hash_split_rows``: the ``test_fraction`` of prompts with the
    smallest hashes, at least one, is the test split) or a directory with
    ``train.{jsonl,parquet}`` and ``test.{jsonl,parquet}``.

    Attributes:
        unparseable_ground_truths: rows whose ground truth math-verify cannot parse as math (it keeps
            only the text); such a row scores -1 unless a response repeats that text verbatim, so
            loading warns with their count.
    """

    alphabet = TEXT_ALPHABET

    def __init__(self, path: str | Path, *, test_fraction: float = DEFAULT_TEST_FRACTION):
        path = Path(path)
        self.name = f"math:{path}"
        if path.is_dir():
            self._splits = {s: read_math_rows(self._find(path, s)) for s in SPLITS}
        else:
            rows = read_math_rows(path)
            if len(rows) < 2:
                raise ValueError(f"{path}: need at least 2 rows to make a train and a test split")
            self._splits = hash_split_rows(rows, test_fraction)
            if not self._splits["train"]:
                raise ValueError(f"{path}: every row has the same prompt; cannot split")
        rows = [ex for split in SPLITS for ex in self._splits[split]]
        bad = [ex for ex in rows if not _parses_as_math(_parse_gold(ex.answer, _timeout()))]
        self.unparseable_ground_truths = len(bad)
        if bad:
            first = ", ".join(f"row {ex.meta['row']} ({ex.answer!r})" for ex in bad[:_SHOWN_BAD_ROWS])
            warnings.warn(f"{path}: {len(bad)} of {len(rows)} rows have a ground truth math-verify cannot parse as "
                          f"math; they score -1 unless a response repeats it verbatim (e.g. {first})",
                          UserWarning, stacklevel=2)

    @staticmethod
    def _find(directory: Path, split: str) -> Path:
        for ext in _SPLIT_FILE_EXTENSIONS:
            candidate = directory / f"{split}{ext}"
            if candidate.is_file():
                return candidate
        raise FileNotFoundError(f"{directory}: no {split}.parquet, {split}.jsonl or {split}.json")

    def __len__(self) -> int:
        return sum(len(v) for v in self._splits.values())

    def examples(self, split: str, n: int, seed: int) -> list[Example]:
        """n rows of the split: a seeded permutation, repeated with fresh permutations if n > rows."""
        check_request(split, n)
        rows = self._splits[split]
        rng = split_rng(self.name, split, seed)
        out: list[Example] = []
        while len(out) < n:
            order = list(range(len(rows)))
            rng.shuffle(order)
            out.extend(rows[i] for i in order[: n - len(out)])
        return out

    def is_correct(self, completion: str, example: Example) -> bool:
        from math_verify import parse, verify

        timeout = _timeout()
        gold = _parse_gold(example.answer, timeout)
        pred = parse(completion, parsing_timeout=timeout)
        if not gold or not pred:
            return False
        return bool(verify(gold, pred, timeout_seconds=timeout))
