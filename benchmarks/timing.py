"""Fair side-by-side timing, shared by the benchmarks in this folder.

Every benchmark compares sides (respo against a baseline, or one setting against another) in one
process, and a ratio is only as fair as the procedure behind it:

- warm-up: each side runs once at the full measured size before any timing, so no side pays the
  allocator's growth, lazy initialisation or a compilation inside a timed call;
- alternating order: repeat r runs the sides forwards when r is even and backwards when r is odd,
  so each side runs first as often as last and neither inherits the other's cache or heat;
- medians of at least `MIN_REPEATS` repeats per side; fewer are allowed for a quick look, with a
  warning line, and are not a figure to quote;
- results and ratios as JSON lines on stdout.

The benchmarks run as scripts (``python benchmarks/bench_x.py``), so this module is imported as
``timing`` from their folder.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any, Callable, Sequence

#: Fewest repeats per side whose median is a figure to quote.
MIN_REPEATS = 3


def check_repeats(repeats: int, what: str = "--repeats") -> None:
    """Refuse ``repeats < 1``; print a JSON warning line when ``repeats < MIN_REPEATS``."""
    if repeats < 1:
        raise SystemExit(f"{what} must be at least 1, got {repeats}")
    if repeats < MIN_REPEATS:
        print(json.dumps({"warning": f"{what} {repeats} < {MIN_REPEATS}: single timings, not a figure to quote"}),
              flush=True)


def order(sides: Sequence[Any], r: int) -> list:
    """The sides' order in repeat ``r``: as given when ``r`` is even, reversed when odd."""
    return list(sides) if r % 2 == 0 else list(sides)[::-1]


def time_sides(run: dict[str, Callable[[int], Any]], repeats: int, *, warmup: int = 1,
               sync: Callable[[], None] = lambda: None) -> dict[str, list[float]]:
    """Seconds of each call ``run[side](r)`` for r = 0 .. repeats-1, in `order`, after ``warmup`` untimed
    full-size calls ``run[side](0)`` of every side (in the same alternating order).

    ``sync`` is called before and after each timed call (``torch.cuda.synchronize`` on a GPU).
    Returns ``{side: [seconds of repeat 0, 1, ...]}``.
    """
    sides = list(run)
    for w in range(warmup):
        for side in order(sides, w):
            run[side](0)
    times: dict[str, list[float]] = {side: [] for side in sides}
    for r in range(repeats):
        for side in order(sides, r):
            sync()
            t0 = time.perf_counter()
            run[side](r)
            sync()
            times[side].append(time.perf_counter() - t0)
    return times


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)
