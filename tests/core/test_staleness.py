"""Per-token staleness of responses whose tokens come from several policy versions (partial rollouts)."""

import pytest
import torch

from respo.core.staleness import token_staleness_metrics


def test_per_token_staleness_worked_by_hand():
    # Learner at version 5. Row 0: 3 tokens from versions 3, 3, 4 (a partial rollout that took version 4's
    # weights after its first segment), then padding; row 1: 4 tokens all from version 4.
    #   lags  row 0: 2, 2, 1      row 1: 1, 1, 1, 1
    #   staleness_mean = (2 + 2 + 1 + 1 + 1 + 1 + 1) / 7 = 9/7 (over tokens, not rows)
    #   staleness_max  = 2
    #   lag_0 = 0
    #   lag_1 = mean over rows of the row's share at lag 1 = (1/3 + 4/4) / 2 = 2/3
    #   lag_2 = (2/3 + 0) / 2 = 1/3                         (lag_0 + lag_1 + lag_2 = 1)
    #   mixed = rows spanning two or more versions / rows = 1/2
    versions = torch.tensor([[3, 3, 4, 0], [4, 4, 4, 4]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    m = token_staleness_metrics(versions, mask, 5)
    assert m["staleness_mean"] == pytest.approx(9 / 7)
    assert m["staleness_max"] == 2
    assert m["staleness/lag_0"] == pytest.approx(0.0)
    assert m["staleness/lag_1"] == pytest.approx(2 / 3)
    assert m["staleness/lag_2"] == pytest.approx(1 / 3)
    assert m["staleness/mixed"] == pytest.approx(0.5)
    assert sorted(k for k in m if k.startswith("staleness/lag_")) == ["staleness/lag_0", "staleness/lag_1",
                                                                     "staleness/lag_2"]


def test_one_version_per_row_gives_the_row_staleness():
    # Whole responses (one version each), all rows of one version: the per-token numbers are the row ones.
    # Learner at 7, rows of version 4 with lengths 2 and 1: mean 3, max 3, lag_3 = 1, nothing mixed.
    versions = torch.tensor([[4, 4], [4, 4]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    m = token_staleness_metrics(versions, mask, 7)
    assert (m["staleness_mean"], m["staleness_max"], m["staleness/mixed"]) == (3.0, 3, 0.0)
    assert [m[f"staleness/lag_{k}"] for k in range(4)] == [0.0, 0.0, 0.0, 1.0]


def test_padding_versions_are_not_read():
    # A padded position's version (here 99, ahead of the learner) is never a token's: not refused, not counted.
    versions = torch.tensor([[2, 99]])
    m = token_staleness_metrics(versions, torch.tensor([[1.0, 0.0]]), 2)
    assert (m["staleness_mean"], m["staleness_max"], m["staleness/lag_0"]) == (0.0, 0, 1.0)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="ahead of the learner"):
        token_staleness_metrics(torch.tensor([[6]]), torch.ones(1, 1), 5)
    with pytest.raises(ValueError, match="shape"):
        token_staleness_metrics(torch.tensor([[1, 1]]), torch.ones(1, 3), 5)
    with pytest.raises(ValueError, match="no valid token"):
        token_staleness_metrics(torch.tensor([[1, 1]]), torch.zeros(1, 2), 5)
