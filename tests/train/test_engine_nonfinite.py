"""Non-finite log-probs from the engine: one rule for every correction and for bypass. The row is dropped from the
loss and counted in ``bad_rows/nonfinite``; a NaN at a padded position changes nothing."""

import copy
import math

import pytest
import torch

from respo.core.mismatch import mismatch_metrics
from respo.train.config import apply_overrides
from respo.train.update import UpdateSettings, make_optimizer, update_step
from trainer_support import rollout as _rollout, setup, small_cfg as _cfg  # noqa: F401 (setup is a fixture)


def test_mismatch_metrics_ignore_padding_and_count_nonfinite_rows():
    # rows 0, 1: log rho = old - engine = +0.1 on each of 2 valid tokens (row sum 0.2); row 2 has NaN on a valid token
    old = torch.tensor([[-1.0, -1.0, 0.0], [-2.0, -2.0, 0.0], [-1.0, -1.0, 0.0]])
    eng = torch.tensor([[-1.1, -1.1, float("nan")], [-2.1, -2.1, float("nan")], [-1.1, float("nan"), 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    m = mismatch_metrics(old, eng, mask)
    assert float(m["rollout_corr/nonfinite_rows"]) == 1.0
    assert float(m["rollout_corr/abs_diff"]) == pytest.approx(0.1, abs=1e-6)  # rows 0 and 1 only, NaN padding unread
    assert float(m["rollout_corr/seq_log_ratio_p10"]) == pytest.approx(0.2, abs=1e-6)
    assert all(math.isfinite(float(v)) for v in m.values())


@pytest.mark.parametrize("extra", [{"rollout_correction": "token-tis"}, {"rollout_correction": "seq-tis"},
                                   {"rollout_correction": "token-mis"}, {"rollout_correction": "seq-mis"},
                                   {"rollout_bypass": True}])
def test_a_nan_engine_log_prob_drops_and_counts_its_row_under_every_rule(setup, extra):
    cfg = apply_overrides(_cfg(objective="vespo"), extra)
    batch = _rollout(setup, cfg, cfg.prompts)
    bad = copy.copy(batch)
    bad.behaviour_logp = batch.behaviour_logp.clone()
    bad.behaviour_logp[1, 0] = float("nan")  # row 1, a valid (first) response token
    pad = batch.mask[0] == 0
    if bool(pad.any()):
        bad.behaviour_logp[0, pad] = float("nan")  # a NaN at row 0's padding must change nothing
    if cfg.rollout_bypass:
        bad.old_logp = bad.behaviour_logp  # bypass: the engine's log-probs are old_logp
    model = copy.deepcopy(setup[0].model)
    opt, sched = make_optimizer(model, cfg)
    metrics, _ = update_step(model, opt, sched, bad, UpdateSettings.of(cfg))
    assert float(metrics["bad_rows/nonfinite"]) == 1.0
    assert math.isfinite(float(metrics["loss"])) and "skipped" not in metrics
