"""User-facing errors: the command line prints them as one line (``respo <command>: error: ...``) and
exits with status 2. Raise a subclass for anything a person can fix (a bad setting, a used run
directory, a missing file); let programming errors propagate as tracebacks."""

from __future__ import annotations

__all__ = ["RespoError", "NonFiniteLogitsError"]


class RespoError(Exception):
    """An error whose message alone tells the user what is wrong and how to fix it."""


class NonFiniteLogitsError(RespoError, ArithmeticError):
    """The policy's logits are not finite (its weights overflowed or turned NaN): nothing can be sampled from it."""
