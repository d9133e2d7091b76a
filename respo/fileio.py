"""Files that are either wholly old or wholly new (`write_text_atomic`), a log read line by line that says
which of its lines it cannot read (`read_jsonl`), and whether a path can be a directory to write into
(`dir_problem`).

Every file respo rewrites in place (a run's ``config.json``, ``summary.json`` and, on resume, its
``metrics.jsonl``; a sweep's ``sweep.json``; a report's ``runs.csv`` and markdown; the README whose
table blocks ``respo table fill`` regenerates) is written to a temporary file beside it, flushed to
disk and renamed over it. A process killed mid-write therefore leaves the previous file intact (and
at worst a hidden ``.<name>-*`` temporary, never a truncated file under the real name).
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path

from respo.errors import RespoError

__all__ = ["write_text_atomic", "read_jsonl", "LogReadError", "dir_problem"]


class LogReadError(RespoError, ValueError):
    """A JSON-lines log with a line that is not a JSON object, other than a torn last line."""


def write_text_atomic(path: str | Path, text: str, *, encoding: str = "utf-8", newline: str | None = None) -> None:
    """Replace ``path``'s content by ``text`` atomically: a temporary file in the same directory,
    fsynced, then ``os.replace``. The file gets mode 0o644 (``mkstemp`` would leave it private).
    ``newline`` is passed to `open` (``""`` for a csv writer's own line endings)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding=encoding, newline=newline) as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def dir_problem(path: str | Path, what: str, flag: str) -> str | None:
    """Why ``path`` cannot be (or become) a directory to write into, in one line naming ``what`` it is for
    and the ``flag`` that chose it; None when it can (an existing directory, or a path whose nearest existing
    ancestor is a directory)."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        return None if path.is_dir() else f"{what} {str(path)!r} is not a directory; choose another {flag}"
    parent = path.absolute().parent
    while not parent.exists() and not parent.is_symlink():
        parent = parent.parent
    if not parent.is_dir():
        return f"{what} {str(path)!r} cannot be created: {str(parent)!r} is not a directory; choose another {flag}"
    return None


def read_jsonl(path: str | Path) -> list[dict]:
    """Every record (JSON object, one per line) of a JSON-lines log such as ``metrics.jsonl``.

    A process killed mid-write leaves at most its last line torn: a final line without its newline that
    is not JSON. That line is left out with a warning naming it; any other line that is not a JSON object
    (a damaged or edited file) is an error, never skipped, since the records around it would be read as a
    whole log.

    Raises:
        LogReadError: naming the file and the line.
    """
    path = Path(path)
    with open(path, encoding="utf-8", errors="replace") as fh:
        lines = fh.readlines()
    out = []
    for n, line in enumerate(lines, start=1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            if n == len(lines) and not line.endswith("\n"):
                warnings.warn(f"{path}: line {n} is torn (a write cut short, e.g. by a kill) and is left out: "
                              f"{line[:60]!r}", stacklevel=2)
                break
            raise LogReadError(f"{path}: line {n} is not a JSON record ({err.msg}): {line.strip()[:60]!r}; the log is "
                               f"damaged (only a torn last line is left out)") from None
        if not isinstance(rec, dict):
            raise LogReadError(f"{path}: line {n} is not a JSON object: {line.strip()[:60]!r}")
        out.append(rec)
    return out
