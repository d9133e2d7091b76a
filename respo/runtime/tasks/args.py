"""The task-settings flags every command shares: ``--task-kwargs JSON`` and ``--task-kwarg KEY=VALUE``.

Both write one dict to ``args.task_kwargs`` (``None`` when neither is given), merged left to right:
``--task-kwargs '{"digits": 4}' --task-kwarg scratchpad=false`` gives ``{"digits": 4, "scratchpad": False}``.
A ``KEY=VALUE`` value is read as JSON when it parses (``4``, ``false``, ``[8, 7]``), else as text.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["add_task_kwargs_arguments", "parse_value", "TASK_KWARGS_HELP"]


def parse_value(text: str) -> Any:
    """A command-line value: JSON when it parses (numbers, true/false, lists, objects), else the text itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


class _TaskKwargs(argparse.Action):
    """Merge one ``--task-kwargs JSON`` object or one ``--task-kwarg KEY=VALUE`` pair into ``dest``."""

    def __call__(self, parser, namespace, value, option_string=None):
        merged = dict(getattr(namespace, self.dest) or {})
        if option_string == "--task-kwargs":
            try:
                obj = json.loads(value)
            except json.JSONDecodeError as err:
                parser.error(f"--task-kwargs must be a JSON object, e.g. '{{\"digits\": 5}}' "
                             f"(or use --task-kwarg KEY=VALUE): {err}")
            if not isinstance(obj, dict):
                parser.error(f"--task-kwargs must be a JSON object, got {value!r}")
            merged.update(obj)
        else:
            key, sep, text = value.partition("=")
            if not sep or not key:
                parser.error(f"--task-kwarg expects KEY=VALUE, got {value!r}")
            merged[key] = parse_value(text)
        setattr(namespace, self.dest, merged)


#: The help line of ``--task-kwargs`` when the caller has no own description.
TASK_KWARGS_HELP = 'task settings as a JSON object, e.g. \'{"digits": 5}\''


def add_task_kwargs_arguments(p: argparse.ArgumentParser, json_help: str) -> None:
    """Add ``--task-kwargs JSON`` (help line ``json_help``) and ``--task-kwarg KEY=VALUE`` (repeatable), both
    into ``args.task_kwargs``."""
    p.add_argument("--task-kwargs", dest="task_kwargs", action=_TaskKwargs, default=None, metavar="JSON",
                   help=json_help)
    p.add_argument("--task-kwarg", dest="task_kwargs", action=_TaskKwargs, metavar="KEY=VALUE",
                   help="one task setting, repeatable, e.g. digits=5 (merged with --task-kwargs)")
