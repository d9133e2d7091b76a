"""Final-answer extraction from natural-language responses, and answer comparison.

A response that reasons in words ends with its answer in one of the forms an instruct model
writes when asked for it:

    ... so 347 + 586 = 933.
    Answer: 933                       (the form the chat instruction asks for; the last one wins)
    ... the answer is \\boxed{933}    (math-style)

``extract_answer`` returns the text of the last "Answer:" line (case-insensitive, markdown bold
allowed), else the content of the last ``\\boxed{...}``, else None: a response without a marked
answer is not graded on whatever number it happens to end with.

``answers_match`` compares an extracted answer with the reference: integers exactly (thousands
separators, a trailing period, surrounding ``$`` or ``**`` ignored), anything else through
math-verify (``parse`` + ``verify``, which handles fractions, LaTeX and equivalent forms).
"""

from __future__ import annotations

import re

__all__ = ["extract_answer", "answers_match", "as_integer"]

_ANSWER_LINE = re.compile(r"(?:^|\n)[ \t*#_]*(?:final\s+)?answer[ \t*_]*[:：][ \t*_]*(?P<ans>[^\n]*)", re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\{")
_INTEGER = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+|[+-]?\d+")


def _boxed_contents(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` with balanced braces, or None."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    i, depth = starts[-1], 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def extract_answer(text: str) -> str | None:
    """The final answer marked in ``text`` (stripped), or None when none is marked."""
    if not isinstance(text, str):
        return None
    found = list(_ANSWER_LINE.finditer(text))
    if found:
        ans = found[-1].group("ans").strip().strip("*_").strip()
        boxed = _boxed_contents(ans)
        ans = boxed if boxed is not None else ans
        return ans.strip().strip("$").strip() or None
    boxed = _boxed_contents(text)
    return boxed.strip() if boxed is not None and boxed.strip() else None


def as_integer(text: str) -> int | None:
    """``text`` as an integer when it is exactly one ("1,234", "-7.", "$933$"), else None."""
    s = text.strip().strip("$*_ ").rstrip(".").strip()
    m = _INTEGER.fullmatch(s)
    return int(m.group(0).replace(",", "")) if m else None


def answers_match(answer: str | None, reference: str) -> bool:
    """Whether an extracted ``answer`` equals ``reference`` (integers exactly, else math-verify). Never raises."""
    if answer is None:
        return False
    a, r = as_integer(answer), as_integer(reference)
    if r is not None:
        return a == r
    try:
        from math_verify import parse, verify

        gold, pred = parse(f"${reference}$"), parse(f"${answer}$")
        return bool(gold) and bool(pred) and bool(verify(gold, pred))
    except Exception:  # a verifier failure on odd input is an incorrect answer, not a crash
        return False
