"""Writes the catalogue of objectives, read from the registry (``respo.core.registry``), into the places that
show it: the table of docs/method.md (every objective), the module docstrings of ``respo.core.objectives``,
``corrections`` and ``rules`` (each the objectives registered in it) and of ``respo.integrations.verl`` (the
losses it registers with verl). ``--check`` writes nothing and exits 1 naming
each place that differs from the registry (tests/core/test_catalogue.py runs the same check).

    python scripts/catalogue.py [--check]

Each place is the block of lines after its heading line and one blank line, up to the next blank line.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's respo, whatever is installed

from respo.core.registry import catalogue_block, catalogue_table, objective_names  # noqa: E402


@dataclass(frozen=True)
class Place:
    """One place the catalogue is written: a file, the heading line above the block, the objectives it lists."""

    path: str  # relative to the checkout
    heading: str
    names: Callable[[], List[str]]
    render: Callable[[List[str]], str]
    needs: str = ""  # a package the names are read from (the integration's), or ""


def _verl_names() -> List[str]:
    import respo.integrations.verl as rv

    return list(rv.OBJECTIVES + rv.CORRECTIONS)


def _module(module: str) -> Callable[[], List[str]]:
    return lambda: objective_names(module=module)


PLACES = (
    Place("respo/core/objectives.py",
          "The objectives registered here (``python scripts/catalogue.py`` writes the list from the registry):",
          _module("respo.core.objectives"), lambda names: catalogue_block(names, by_family=True)),
    Place("respo/core/corrections.py",
          "The corrections (``python scripts/catalogue.py`` writes the list from the registry):",
          _module("respo.core.corrections"), catalogue_block),
    Place("respo/core/rules.py",
          "The rules (``python scripts/catalogue.py`` writes the list from the registry):",
          _module("respo.core.rules"), catalogue_block),
    Place("respo/integrations/verl/__init__.py",
          "The losses it registers, with their defaults (``python scripts/catalogue.py`` writes the list from the "
          "registry):", _verl_names, lambda names: catalogue_block(names, brief=True), needs="verl"),
    Place("docs/method.md",
          "The catalogue (`python scripts/catalogue.py` writes this table from the registry; a test checks it):",
          objective_names, catalogue_table),
)  # fmt: skip


def block_lines(lines: List[str], place: Place) -> Tuple[int, int]:
    """The [start, end) line indices of ``place``'s block in ``lines``."""
    at = [i for i, line in enumerate(lines) if line.strip() == place.heading]
    if len(at) != 1:
        raise ValueError(f"{place.path}: the heading {place.heading!r} must stand once on a line of its own, "
                         f"found {len(at)}")  # fmt: skip
    start = at[0] + 2
    if start > len(lines) or lines[start - 1].strip():
        raise ValueError(f"{place.path}: a blank line must follow the heading {place.heading!r}")
    end = start
    while end < len(lines) and lines[end].strip() and lines[end].strip() != '"""':
        end += 1
    return start, end


def written(place: Place, root: Path = ROOT) -> str:
    """The block as the file has it."""
    lines = (root / place.path).read_text().split("\n")
    start, end = block_lines(lines, place)
    return "\n".join(lines[start:end])


def expected(place: Place) -> str:
    """The block as the registry gives it."""
    return place.render(place.names())


def stale(places=PLACES, root: Path = ROOT) -> List[str]:
    """The paths of the places whose block differs from the registry."""
    return [p.path for p in places if written(p, root) != expected(p)]


def write(place: Place, root: Path = ROOT) -> bool:
    """Write ``place``'s block from the registry; True if the file changed."""
    path = root / place.path
    lines = path.read_text().split("\n")
    start, end = block_lines(lines, place)
    new = lines[:start] + expected(place).split("\n") + lines[end:]
    if new == lines:
        return False
    path.write_text("\n".join(new))
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Write the catalogue of objectives from the registry.")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a place differs")
    args = parser.parse_args(argv)
    if args.check:
        bad = stale()
        for path in bad:
            print(f"{path}: the catalogue differs from the registry (python scripts/catalogue.py writes it)")
        return 1 if bad else 0
    for place in PLACES:
        if write(place):
            print(f"wrote {place.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
