"""Procedural arithmetic tasks: addition with a scratchpad, and countdown."""

from __future__ import annotations

import ast
import random
from collections.abc import Callable
from fractions import Fraction

from ..tokenizer import ARITHMETIC_ALPHABET
from .base import Example, ProceduralTask

__all__ = ["AdditionTask", "CountdownTask", "safe_eval", "MAX_DIGITS", "MAX_EXPRESSION_CHARS"]

#: Largest addition operand: at 120 digits prompt (2·120 + 2, + BOS) and response (6·120 + 1, + EOS)
#: take 965 tokens, within the presets' 1024 positions (answers are Python ints: no overflow).
MAX_DIGITS = 120
MIN_NUMBERS, MAX_NUMBERS = 2, 8  # countdown: how many numbers a prompt may give
MAX_EXPRESSION_CHARS = 200  # longer countdown answers are rejected unparsed

# ---------------------------------------------------------------------------------- addition


class AdditionTask(ProceduralTask):
    """a + b with ``digits``-digit operands, optionally with a column-by-column scratchpad.

    "123+456=" -> "3609;2507;1405;0579": one column per group, least significant first,
    a_i b_i c_i s_i, where c_i is the carry *into* the column and s_i = (a_i + b_i + c_i) mod 10,
    then the sum zero-padded to ``digits + 1`` characters. Without scratchpad the response is
    the plain sum "579".

    The scratchpad makes the response length a knob: 6·digits + 1 characters, + 1 for EOS.

        digits  response tokens (EOS included)
             5   32
            21  128
            42  254
            85  512

    (``tests/runtime/test_long_tasks.py`` measures these from the demonstrations with the char tokenizer.)
    The prompt takes 2·digits + 2 tokens (+ BOS): 85 digits need 173 + 512 = 685 positions.
    """

    alphabet = ARITHMETIC_ALPHABET

    def __init__(self, digits: int = 3, scratchpad: bool = True):
        if not isinstance(digits, int) or not 1 <= digits <= MAX_DIGITS:
            raise ValueError(f"addition: digits must be an int in [1, {MAX_DIGITS}], got {digits!r}")
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


# --------------------------------------------------------------------------------- countdown

_OPS: dict[type, Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: lambda x, y: x + y,
    ast.Sub: lambda x, y: x - y,
    ast.Mult: lambda x, y: x * y,
    ast.Div: lambda x, y: x / y,
}


def safe_eval(expression: str, max_len: int = MAX_EXPRESSION_CHARS) -> tuple[Fraction, list[int]]:
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
    """Reach the target with some of the given numbers (each at most once) and + - * /.

    "3,7,12,5>120:" -> an expression over the given numbers, with parentheses, that evaluates
    exactly to the target ("(3+7)*12").
    """

    alphabet = ARITHMETIC_ALPHABET

    def __init__(self, n_numbers: int = 4, max_number: int = 20, max_target: int = 200):
        if not isinstance(n_numbers, int) or not MIN_NUMBERS <= n_numbers <= MAX_NUMBERS:
            raise ValueError(
                f"countdown: n_numbers must be an int in [{MIN_NUMBERS}, {MAX_NUMBERS}], got {n_numbers!r}"
            )
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
