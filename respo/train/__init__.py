"""Off-policy training with controllable staleness: ``train(load_config("configs/tiny-dense.toml"))``.

- `TrainConfig` / `load_config`: one flat frozen config (TOML + overrides, validated up front).
- `train(cfg, resume=False, overwrite=False) -> Path`: the run directory with ``config.json``, ``metrics.jsonl``,
  ``summary.json``, ``ckpt/`` and ``final/``.

Reports of a run (``report.md`` + ``curve.png``) belong to the study layer
(`respo.study.run_report.write_run_report`); ``respo train`` and ``respo demo`` write them after
`train` returns.
"""

from respo.train.config import ConfigError, TrainConfig, load_config
from respo.train.trainer import train

__all__ = ["ConfigError", "TrainConfig", "load_config", "train"]
