"""Long multiplication with a partial-products scratchpad: a long worked answer, a one-number check.

"123*45=" -> "5:5160,5160;4:2940,53550;05535": one group per digit b_j of the multiplier, least
significant first,

    b_j ":" P_j "," S_j ";"      P_j = a·b_j            written reversed, zero-padded to n + 1 digits
                                  S_j = Σ_{i≤j} a·b_i·10^i  written reversed, zero-padded to n + j + 1 digits

(n = ``digits`` of a, m = ``multiplier_digits`` of b; S_j < 10^(n+j+1) since a < 10^n), then the
product a·b zero-padded to n + m digits in the usual order. Reversed numbers put the least
significant digit first, so every digit depends only on what is already written (the carries
run left to right), as in the addition scratchpad. Only the final product is checked: the
reward is +1 when the text after the last ';' is the product, whatever the scratchpad says.

Response length in tokens (the characters, + 1 for EOS), group j taking 2n + j + 6:

    ℓ(n, m) = m·(2n + 6) + m(m − 1)/2 + (n + m) + 1

    digits  multiplier_digits  response tokens (EOS included)
         3                  2   31
         5                  6  123
         8                  9  252
        13                 13  521

(``tests/runtime/test_long_tasks.py`` measures these from the demonstrations with the char tokenizer.)
The prompt takes n + m + 2 tokens (+ BOS). The alphabet is the arithmetic one (digits and
``*=:,;``), so a policy warm-started on addition shares its vocabulary.
"""

from __future__ import annotations

import random

from ..tokenizer import ARITHMETIC_ALPHABET
from .base import Example, ProceduralTask

__all__ = ["MultiplicationTask", "MAX_FACTOR_DIGITS", "multiplication_response_length"]

#: Largest number of digits of either factor: 30 × 30 already gives 2 476 response tokens, far past
#: any study setting; the bound only rejects typos.
MAX_FACTOR_DIGITS = 30
GROUP_END, PART_SEP, DIGIT_SEP = ";", ",", ":"


def multiplication_response_length(digits: int, multiplier_digits: int) -> int:
    """Response tokens without EOS: Σ_j (2n + j + 6) + (n + m) with n = digits, m = multiplier_digits."""
    n, m = digits, multiplier_digits
    return m * (2 * n + 6) + m * (m - 1) // 2 + n + m


class MultiplicationTask(ProceduralTask):
    """a·b with an n-digit ``a`` and an m-digit ``b``, worked one multiplier digit at a time.

    Args:
        digits: n, the digits of the multiplicand a (its leading digit is non-zero).
        multiplier_digits: m, the digits of the multiplier b; ``None`` means m = n.
    """

    alphabet = ARITHMETIC_ALPHABET

    def __init__(self, digits: int = 3, multiplier_digits: int | None = None):
        multiplier_digits = digits if multiplier_digits is None else multiplier_digits
        for knob, value in (("digits", digits), ("multiplier_digits", multiplier_digits)):
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_FACTOR_DIGITS:
                raise ValueError(f"multiplication: {knob} must be an int in [1, {MAX_FACTOR_DIGITS}], got {value!r}")
        self.digits, self.multiplier_digits = digits, multiplier_digits
        self.name = f"multiplication(digits={digits},multiplier_digits={multiplier_digits})"

    def draw(self, rng: random.Random) -> Example:
        n, m = self.digits, self.multiplier_digits
        a = rng.randint(10 ** (n - 1), 10**n - 1)
        b = rng.randint(10 ** (m - 1), 10**m - 1)
        return Example(prompt=f"{a}*{b}=", answer=str(a * b), meta={"a": a, "b": b})

    def response_length(self) -> int:
        """Response tokens without EOS (see the module docstring)."""
        return multiplication_response_length(self.digits, self.multiplier_digits)

    def demonstration(self, example: Example) -> str:
        a, b = example.meta["a"], example.meta["b"]
        n, m = self.digits, self.multiplier_digits
        groups, running = [], 0
        for j, b_j in enumerate(str(b).zfill(m)[::-1]):
            partial = a * int(b_j)
            running += partial * 10**j
            p_rev = str(partial).zfill(n + 1)[::-1]
            s_rev = str(running).zfill(n + j + 1)[::-1]
            groups.append(f"{b_j}{DIGIT_SEP}{p_rev}{PART_SEP}{s_rev}")
        return GROUP_END.join(groups) + GROUP_END + str(a * b).zfill(n + m)

    def is_correct(self, completion: str, example: Example) -> bool:
        final = completion.strip().rsplit(GROUP_END, 1)[-1].strip()
        return final.isascii() and final.isdigit() and int(final) == int(example.answer)
