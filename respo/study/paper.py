"""The ReSPO paper's reference figures, read from ``paper.toml`` beside this module (package data).

A report that compares with the paper quotes a `PaperFigure` (its value, what it measures, the
paper's setting, and where in the paper it stands) instead of writing the number into its prose.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

__all__ = ["PaperFigure", "paper_figure", "PAPER_FILE"]

PAPER_FILE = Path(__file__).with_name("paper.toml")


@dataclass(frozen=True)
class PaperFigure:
    """One reference figure: a fraction ``value`` of the paper, ``what`` it measures, its ``setting``,
    ``where`` it stands in the paper and the paper's citation (``cite``: authors and year, ``arxiv``)."""

    name: str
    value: float
    what: str
    setting: str
    where: str
    cite: str
    arxiv: str

    @property
    def percent(self) -> str:
        """The value as a percentage with one decimal: 0.228 -> "22.8 %"."""
        return f"{100 * self.value:.1f} %"

    @property
    def about(self) -> str:
        """The value rounded to ten percentage points: 0.228 -> "about 20 %"."""
        return f"about {round(10 * self.value) * 10} %"


@cache
def _paper() -> dict:
    return tomllib.loads(PAPER_FILE.read_text(encoding="utf-8"))


def paper_figure(name: str) -> PaperFigure:
    """The figure ``name`` of ``paper.toml`` (a `KeyError` naming the known ones when it has none)."""
    data = _paper()
    figures = data["figures"]
    if name not in figures:
        raise KeyError(f"paper.toml has no figure {name!r}; it has {', '.join(figures)}")
    src = data["source"]
    return PaperFigure(name=name, cite=f"{src['authors']} {src['year']}", arxiv=src["arxiv"], **figures[name])
