"""Per-run summaries of the training-score curve, as the ReSPO paper reports them.

The paper (Chen, Ban, Hsieh 2026, arXiv 2609.35433) trains for 1,024 policy updates and reports
the normalised training score s = (r + 1)/2 two ways: the *late mean*, the mean over the last 128
updates, and the *early max*, the best over the first 256. As fractions of the run, for U
recorded per-update scores s_1 .. s_U:

    late mean = mean(s_{U-L+1} .. s_U),   L = max(1, floor(U * LATE_FRACTION))    (128/1024 = 1/8)
    early max = max(s_1 .. s_E),          E = max(1, floor(U * EARLY_FRACTION))   (256/1024 = 1/4)

Every report, plot and run summary computes them here, so they mean the same thing everywhere.
Pure Python and NumPy; no torch.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["LATE_FRACTION", "EARLY_FRACTION", "late_count", "early_count", "late_mean", "early_max"]

#: Share of the updates the late mean averages: the paper's last 128 of 1,024 updates.
LATE_FRACTION_DENOMINATOR = 8
LATE_FRACTION = 1 / LATE_FRACTION_DENOMINATOR
#: Share of the updates the early max searches: the paper's first 256 of 1,024 updates.
EARLY_FRACTION_DENOMINATOR = 4
EARLY_FRACTION = 1 / EARLY_FRACTION_DENOMINATOR


def late_count(n: int) -> int:
    """L = max(1, n // 8): how many of ``n`` updates form the late window (1,024 -> 128)."""
    return max(1, n // LATE_FRACTION_DENOMINATOR)


def early_count(n: int) -> int:
    """E = max(1, n // 4): how many of ``n`` updates form the early window (1,024 -> 256)."""
    return max(1, n // EARLY_FRACTION_DENOMINATOR)


def late_mean(scores: Sequence[float]) -> float:
    """Mean of the last eighth (at least one) of the per-update scores; NaN if there are none.

    Example: 16 scores 0.00, 0.01, .., 0.15: L = 2, (0.14 + 0.15)/2 = 0.145.
    """
    if len(scores) == 0:
        return math.nan
    return float(np.mean(scores[-late_count(len(scores)):]))


def early_max(scores: Sequence[float]) -> float:
    """Best per-update score in the first quarter (at least one) of the updates; NaN if there are none.

    Example: 16 scores 0.00, 0.01, .., 0.15: E = 4, max(0.00 .. 0.03) = 0.03.
    """
    if len(scores) == 0:
        return math.nan
    return float(max(scores[:early_count(len(scores))]))
