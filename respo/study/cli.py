"""``respo sweep``, ``respo report``, ``respo table`` and ``respo recommend``: registered into ``respo.cli`` through its EXTENSIONS hook."""

from __future__ import annotations

import argparse
import shlex
import sys

__all__ = ["register"]


def _command() -> str:
    """The exact command line as typed (``respo ...`` or ``python -m respo ...``)."""
    prog = "respo" if sys.argv and not sys.argv[0].endswith("__main__.py") else "python -m respo"
    return prog + " " + shlex.join(sys.argv[1:])


def _sweep(args: argparse.Namespace) -> int:
    from respo.study.sweep import cmd_sweep

    return cmd_sweep(args, _command())


def _report(args: argparse.Namespace) -> int:
    from respo.study.report import cmd_report

    return cmd_report(args, _command())


def register(subparsers) -> None:
    """Add the ``sweep``, ``report``, ``table`` and ``recommend`` subcommands to the ``respo`` CLI."""
    from respo.study import recommend, report, sweep, tables

    p = subparsers.add_parser("sweep", help="resumable grid of training runs (the staleness study)",
                              description=sweep.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sweep.add_arguments(p)
    p.set_defaults(func=_sweep)
    p = subparsers.add_parser("report", help="report.md + figures from sweep directories",
                              description=report.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    report.add_arguments(p)
    p.set_defaults(func=_report)
    p = subparsers.add_parser("table", help="a study table (calib: per run; headline: over seeds) from runs.csv "
                              "files or run directories", description=tables.__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    tables.add_arguments(p)
    p.set_defaults(func=tables.run)
    p = subparsers.add_parser("recommend", help="which objective to use per response length x N, from runs.csv files",
                              description=recommend.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    recommend.add_arguments(p)
    p.set_defaults(func=recommend.run)
