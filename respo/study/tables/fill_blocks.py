"""``respo table fill FILE.md``: regenerate, in place, every block of a markdown file that starts with a line
``<!-- respo table ARGS -->`` (or ``<!-- respo recommend ARGS -->``) and ends with ``<!-- /respo -->``: the lines
between become that command's output (paths relative to the current directory)."""

from __future__ import annotations

import argparse
import io
from pathlib import Path

from respo.errors import RespoError
from respo.fileio import write_text_atomic
from respo.study.tables import command
from respo.study.tables.registry import TableKind
from respo.study.tables.runs_csv import TableError

__all__ = ["FILL_COMMANDS", "fill"]


#: The commands a ``fill`` block may run: their output is a markdown table.
FILL_COMMANDS = ("table", "recommend")


def _fill_parser() -> argparse.ArgumentParser:
    """The command lines a ``fill`` block may run (`FILL_COMMANDS`), parsed as ``respo table`` and ``respo
    recommend`` parse them."""
    from respo.study import recommend

    parser = argparse.ArgumentParser(prog="respo")
    sub = parser.add_subparsers(dest="command", required=True)
    command.add_arguments(sub.add_parser("table"))
    sub.choices["table"].set_defaults(func=command.run)
    recommend.add_arguments(sub.add_parser("recommend"))
    sub.choices["recommend"].set_defaults(func=recommend.run)
    return parser


def fill(path: Path) -> int:
    """Regenerate every ``<!-- respo CMD ARGS -->`` ... ``<!-- /respo -->`` block of ``path`` in place,
    CMD one of `FILL_COMMANDS` (module docstring); returns how many blocks were filled."""
    import contextlib
    import shlex

    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise TableError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    out, i, n = [], 0, 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        head = line.strip()
        if not (head.startswith("<!-- respo ") and head.endswith("-->")):
            continue
        end = next((j for j in range(i, len(lines)) if lines[j].strip() == "<!-- /respo -->"), None)
        if end is None:
            raise TableError(f"{path}: line {i}: no closing <!-- /respo --> for {head}")
        argv = shlex.split(head[len("<!-- respo "):-len("-->")])
        if not argv or argv[0] not in FILL_COMMANDS or argv[:2] == ["table", "fill"]:
            raise TableError(f"{path}: line {i}: a block runs respo {' or respo '.join(FILL_COMMANDS)} (not fill), "
                             f"got: {' '.join(argv)}")
        buf, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
                args = _fill_parser().parse_args(argv)
                args.func(args)
        except SystemExit:
            raise TableError(f"{path}: line {i}: bad arguments: respo {' '.join(argv)}") from None
        except RespoError as e:
            raise TableError(f"{path}: line {i}: respo {argv[0]}: {e}") from None
        out += buf.getvalue().rstrip("\n").split("\n")
        out.append(lines[end])
        i, n = end + 1, n + 1
    write_text_atomic(path, "\n".join(out))
    return n


def _main(args: argparse.Namespace) -> int:
    for f in args.paths:
        print(f"{f}: {fill(Path(f))} table block(s) regenerated")
    return 0


KIND = TableKind("fill", "regenerate the table blocks of markdown files", main=_main, paths="markdown files")
