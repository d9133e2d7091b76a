"""Addition explained in words: a task for pretrained instruct models, with worked solutions in many phrasings.

"What is 347 + 586?" -> a natural-language column-by-column solution ending in "Answer: 933", e.g.

    Let's add 347 and 586 column by column, starting from the ones.
    Ones: 7 + 6 = 13, so we write 3 and carry 1.
    In the tens place, 4 plus 8 plus the carried 1 makes 13; write 3, carry 1.
    Hundreds digits: 3 + 5 + 1 (carry) = 9, so the digit is 9 with no carry.
    So 347 + 586 = 933.
    Answer: 933

The question, the opening, every column line and the closing are each drawn from several phrasings
(chosen by a hash of the prompt, so an example's demonstration is fixed but the set of
demonstrations varies in wording): a warm start on them keeps the variety of natural language
instead of one rigid template. With the SmolLM2 tokenizer (one token per digit) a solution is
70-120 tokens at 2 digits (the default; mean 96) and 90-165 at 3.

Grading reads the final answer only (``respo.runtime.answers``: the last "Answer:" line, else the
last ``\\boxed{}``), whatever the reasoning says.
"""

from __future__ import annotations

import random
import re

from ..answers import answers_match, extract_answer
from .base import Example, ProceduralTask, hash_split, stable_hash

__all__ = ["WordedAdditionTask"]

MAX_WORDED_DIGITS = 12
_PLACES = ("ones", "tens", "hundreds", "thousands", "ten-thousands", "hundred-thousands")

_QUESTIONS = (
    "What is {a} + {b}?",
    "Compute {a} + {b}.",
    "Add {a} and {b}.",
    "Find the sum of {a} and {b}.",
    "Calculate {a} plus {b}.",
)
_OPENINGS = (
    "Let's add {a} and {b} column by column, starting from the ones.",
    "We add the digits from right to left, carrying whenever a column reaches 10.",
    "I'll work through the place values of {a} and {b} from right to left.",
    "Line up {a} and {b} and add one place value at a time.",
)
_CLOSINGS = (
    "So {a} + {b} = {s}.",
    "Putting the digits together gives {s}.",
    "Reading the digits from left to right, the sum is {s}.",
    "Therefore the sum of {a} and {b} is {s}.",
)
_FINAL_CARRY = (
    "The last carry of 1 becomes the leading digit.",
    "There is a carry left over, so we write 1 in front.",
    "The leftover carry 1 goes at the front.",
)


def _place(i: int) -> str:
    return _PLACES[i] if i < len(_PLACES) else f"column {i + 1}"


def _column_line(style: int, place: str, x: int, y: int, carry: int, total: int) -> str:
    d, out = total % 10, total // 10
    Place = place[0].upper() + place[1:]
    if style == 0:
        plus = f" + {carry}" if carry else ""
        tail = f"so we write {d} and carry 1." if out else f"so we write {d}."
        return f"{Place}: {x} + {y}{plus} = {total}, {tail}"
    if style == 1:
        plus = " plus the carried 1" if carry else ""
        tail = f"write {d}, carry 1." if out else f"write {d}, no carry."
        return f"In the {place} place, {x} plus {y}{plus} makes {total}; {tail}"
    if style == 2:
        plus = " + 1 (carry)" if carry else ""
        tail = f"so the digit is {d} and we carry 1." if out else f"so the digit is {d} with no carry."
        return f"{Place} digits: {x} + {y}{plus} = {total}, {tail}"
    plus = f" and the carry {carry}" if carry else ""
    tail = f"Keep {d} and carry the 1." if out else f"Keep {d}."
    return f"The {place}: {x} and {y}{plus} give {total}. {tail}"


class WordedAdditionTask(ProceduralTask):
    """a + b with ``digits``-digit operands, asked and solved in natural language (see the module docstring)."""

    answer_format = "Think step by step, then give the final answer on the last line in the form \"Answer: <number>\"."

    def __init__(self, digits: int = 2):
        if not isinstance(digits, int) or isinstance(digits, bool) or not 1 <= digits <= MAX_WORDED_DIGITS:
            raise ValueError(f"worded_addition: digits must be an int in [1, {MAX_WORDED_DIGITS}], got {digits!r}")
        self.digits = digits
        self.name = f"worded_addition(digits={digits})"

    def split_of(self, prompt: str) -> str:
        """The split of the *problem* {a, b}, whatever the phrasing of its question: "Add 347 and 586." and
        "What is 586 + 347?" are one problem and always share a split."""
        numbers = sorted(int(n) for n in re.findall(r"\d+", prompt))
        return hash_split(f"worded_addition|{numbers}", self.test_fraction)

    def draw(self, rng: random.Random) -> Example:
        lo, hi = 10 ** (self.digits - 1), 10**self.digits - 1
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        question = rng.choice(_QUESTIONS).format(a=a, b=b)
        return Example(prompt=question, answer=str(a + b), meta={"a": a, "b": b})

    def demonstration(self, example: Example) -> str:
        a, b = example.meta["a"], example.meta["b"]
        rng = random.Random(stable_hash(f"{self.name}|demo|{example.prompt}"))
        lines = [rng.choice(_OPENINGS).format(a=a, b=b)]
        style = rng.randrange(4)
        carry = 0
        for i, (x, y) in enumerate(zip(str(a).zfill(self.digits)[::-1], str(b).zfill(self.digits)[::-1])):
            total = int(x) + int(y) + carry
            if rng.random() < 0.25:  # now and then another phrasing for one column
                style = rng.randrange(4)
            lines.append(_column_line(style, _place(i), int(x), int(y), carry, total))
            carry = total // 10
        if carry:
            lines.append(rng.choice(_FINAL_CARRY))
        lines.append(rng.choice(_CLOSINGS).format(a=a, b=b, s=a + b))
        lines.append(f"Answer: {a + b}")
        return "\n".join(lines)

    def is_correct(self, completion: str, example: Example) -> bool:
        return answers_match(extract_answer(completion), example.answer)
