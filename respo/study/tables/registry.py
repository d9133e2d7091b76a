"""The kinds of ``respo table``: each declares its name, its clause of the help text, its own flags and its
builder (`TableKind`), and `register` adds it to `KINDS`. The command line (`respo.study.tables.command`) is
generated from `KINDS`: the ``kind`` argument's choices and help, every kind's own flags, and the one-line
refusal of a flag given to a kind that does not take it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

__all__ = ["Flag", "TableInput", "TableKind", "KINDS", "register"]


@dataclass(frozen=True)
class Flag:
    """One option of ``respo table``, added as ``add_argument(name, help=help, **spec)``.

    ``refusal`` is the one-line error when it is given to a kind that does not take it (``{flag}``, ``{kind}``
    and ``{owner}``, the kind whose own flag it is, are filled in); ``check`` raises `TableError` on a value the
    kind that takes it cannot use. A flag counts as given when its value is not its default."""

    name: str
    help: str
    spec: Mapping[str, Any] = field(default_factory=dict)
    refusal: str = "{flag} applies to the {owner} table, not to {kind}"
    check: Callable[[Any], None] | None = None

    @property
    def dest(self) -> str:
        """The attribute of the parsed command line that holds its value."""
        return self.name.removeprefix("--").replace("-", "_")

    def given(self, args: argparse.Namespace) -> bool:
        default = self.spec.get("default", False if self.spec.get("action") == "store_true" else None)
        return getattr(args, self.dest) != default


@dataclass(frozen=True)
class TableInput:
    """What a kind's ``build`` tabulates: the selected rows (a finished run without an endpoint refused or left
    out, `respo.study.tables.runs_csv.endpoint_rule`), the columns some given runs.csv lacks, the command line
    (a kind's own flags under their `Flag.dest`) and, under ``--starts-by-seed``, each starting policy's seeds
    (`respo.study.tables.pooling.starts_by_seed`; empty otherwise)."""

    rows: list[dict]
    absent: set[str]
    args: argparse.Namespace
    starts: dict[str, list[int]]


@dataclass(frozen=True)
class TableKind:
    """One kind of ``respo table``.

    - ``name``, ``help``: its choice of the ``kind`` argument and its clause of that argument's help;
    - ``build``: its markdown lines from a `TableInput`; the command prints them, then the note on the starting
      policies pooled and the runs left out. Or, instead, ``main``: a kind that reads its own ``paths`` is
      called with the command line and returns the exit status;
    - ``flags``: its own options (`Flag`), which every other kind refuses;
    - ``paths``: what its ``paths`` are, when not runs.csv files or run directories (said in their help);
    - ``endpoints``: the columns it pools over seeds (or a function of the command line giving them): a finished
      run that lacks one its cell's other runs have is refused, or left out under ``--skip-missing``; a kind
      without endpoints refuses ``--skip-missing``;
    - ``pools``: it pools runs over seeds, so refuses runs of two starting policies or rollout engines;
    - ``paired``: it takes ``--paired``;
    - ``starts_by_seed``: it pools seeds of several starting policies as blocks under ``--starts-by-seed``
      (True), only with ``--paired`` too ("paired"), or refuses that flag (False);
    - ``pooled_seeds``: the seeds its table pools from the rows, where not all of them (the note on the
      starting policies names only these);
    - ``replay_both``: it keeps the runs with and without MoE routing replay (``--routing-replay`` selects
      nothing)."""

    name: str
    help: str
    build: Callable[[TableInput], list[str]] | None = None
    main: Callable[[argparse.Namespace], int] | None = None
    flags: tuple[Flag, ...] = ()
    paths: str = ""
    endpoints: tuple[str, ...] | Callable[[argparse.Namespace], tuple[str, ...]] = ()
    pools: bool = True
    paired: bool = False
    starts_by_seed: bool | Literal["paired"] = False
    pooled_seeds: Callable[[list[dict]], set[int]] | None = None
    replay_both: bool = False

    def __post_init__(self):
        if (self.build is None) == (self.main is None):
            raise ValueError(f"table kind {self.name!r}: give it build or main, one of the two")

    def endpoints_of(self, args: argparse.Namespace) -> tuple[str, ...]:
        return self.endpoints(args) if callable(self.endpoints) else self.endpoints


#: Every kind of ``respo table`` by name, in the order the command lists them.
KINDS: dict[str, TableKind] = {}


def register(kind: TableKind) -> TableKind:
    """Add ``kind`` to `KINDS`, after the kinds there; a command line built from then on offers it. A name
    already registered raises ValueError."""
    if kind.name in KINDS:
        raise ValueError(f"a table kind {kind.name!r} is already registered")
    KINDS[kind.name] = kind
    return kind
