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

import os
import tempfile
from pathlib import Path


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
