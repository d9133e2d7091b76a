"""``respo table``'s command line, generated from the registered kinds (`respo.study.tables.registry.KINDS`): the
``kind`` argument's choices and help, what the ``paths`` are, every kind's own flags (after the options all kinds
share, before the selection) and the one-line refusal of a flag given to a kind that does not take it."""

from __future__ import annotations

import argparse
import math
from typing import Callable

from respo.study.tables.common import MARGIN
from respo.study.tables.pooling import _select, pool
from respo.study.tables.registry import KINDS, Flag, TableInput, TableKind
from respo.study.tables.runs_csv import TableError, endpoint_rule, read_rows

__all__ = ["add_arguments", "run"]


def _check_margin(margin: float) -> None:
    if not margin > 0 or math.isinf(margin):
        raise TableError(f"--margin must be a positive number, got {margin}")


#: Which kinds take a shared option (None: every kind).
Takes = Callable[[TableKind], bool] | None

#: The options every kind shares that ``--help`` lists before the kinds' own, with the kinds that take them.
#: ``--starts-by-seed`` is refused after the rows are read, by the kinds that read rows (`pooling.pool`).
_BEFORE: tuple[tuple[Flag, Takes], ...] = (
    (Flag("--margin", f"equivalence margin δ of the headline table (default {MARGIN:g})",
          {"type": float, "default": MARGIN}, check=_check_margin), None),
    (Flag("--adjust", "multiplicity adjustment within the headline table (default bh: Benjamini–Hochberg)",
          {"choices": ("holm", "bh"), "default": "bh"}), None),
    (Flag("--paired", "headline, factorial: pair each seed's arms (they share their first rollout step: the same seed "
          "and starting policy, and where recorded the same first-step score, else refused) and use the "
          "paired t-test over the seeds both ran instead of Welch's (the factorial kind always pairs)",
          {"action": "store_true"}, refusal="--paired applies to the headline and factorial tables, not to {kind}"),
     lambda k: k.paired),
    (Flag("--starts-by-seed", "factorial, staleness, mismatch, headline --paired: pool seeds that started from "
          "different policies as blocks, where all runs of each seed share one start (else refused); the table "
          "names each start's seeds, and the factorial adds each start's mean contrasts as a description",
          {"action": "store_true"}), None),
)
#: The options every kind shares that ``--help`` lists after the kinds' own: the selection (`pooling._select`)
#: and the rule for a finished run without an endpoint.
_AFTER: tuple[tuple[Flag, Takes], ...] = (
    (Flag("--model", "only runs of this model (default tiny-dense)", {"default": "tiny-dense"}), None),
    (Flag("--group-size", "only runs with this G (default 8)", {"type": int, "default": 8}), None),
    (Flag("--objectives", "comma-separated objectives to keep (default: all)", {"default": None}), None),
    (Flag("--reuse", "keep runs with this N only", {"type": int, "default": None}), None),
    (Flag("--lrs", "comma-separated learning rates to keep (default: all)", {"default": None}), None),
    (Flag("--updates", "keep runs with this budget only", {"type": int, "default": None}), None),
    (Flag("--routing-replay", "keep the runs with MoE routing replay (default: the runs without; the replay kind "
          "takes both)", {"action": "store_true"}), None),
    (Flag("--skip-missing", "leave out a finished run that lacks an endpoint (empty, nan or inf) the other runs of "
          "its cell have, naming it under the table (default: refused, naming its file, line and column)",
          {"action": "store_true"},
          refusal="--skip-missing applies to the tables that pool an endpoint over seeds (headline, replay, "
                  "breakdown, regime, factorial), not to {kind}"), lambda k: bool(k.endpoints)),
)


def _flags() -> list[tuple[Flag, str, Takes]]:
    """Every option in ``--help`` order: (flag, the name of the kind whose own flag it is or "", which kinds take
    it: None for every kind)."""
    own = [(f, k.name, lambda kind, k=k: kind is k) for k in KINDS.values() for f in k.flags]
    return [*((f, "", takes) for f, takes in _BEFORE), *own, *((f, "", takes) for f, takes in _AFTER)]


def add_arguments(p: argparse.ArgumentParser) -> None:
    kinds = list(KINDS.values())
    p.add_argument("kind", choices=tuple(KINDS), help="; ".join(f"{k.name}: {k.help}" for k in kinds))
    other = "; ".join(f"{k.name}: {k.paths}" for k in kinds if k.paths)
    p.add_argument("paths", nargs="+", help="runs.csv files and/or sweep or run directories" + (f" ({other})" * bool(other)))
    for flag, owner, _ in _flags():
        p.add_argument(flag.name, help=f"{owner}: {flag.help}" if owner else flag.help, **flag.spec)


def _check_flags(kind: TableKind, args: argparse.Namespace) -> None:
    """Each flag given, in ``--help`` order: refused in one line by a kind that does not take it, else its value
    checked."""
    for flag, owner, takes in _flags():
        if not flag.given(args):
            continue
        if takes is not None and not takes(kind):
            raise TableError(flag.refusal.format(flag=flag.name, kind=kind.name, owner=owner))
        if flag.check is not None:
            flag.check(getattr(args, flag.dest))


def run(args: argparse.Namespace) -> int:
    """Print the table ``args.kind`` of the runs under ``args.paths``; bad input raises `TableError`."""
    kind = KINDS[args.kind]
    _check_flags(kind, args)
    if kind.main is not None:
        return kind.main(args)
    rows, absent = read_rows(args.paths)
    rows, left = endpoint_rule(_select(rows, args), kind.endpoints_of(args), skip=args.skip_missing)
    starts, note = pool(kind, rows, args)
    print("\n".join(kind.build(TableInput(rows, absent, args, starts)) + note + left))
    return 0
