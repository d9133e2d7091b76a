"""Off-policy training with controllable staleness: ``train(load_config("configs/tiny-dense.toml"))``.

- `TrainConfig` / `load_config`: one flat frozen config (TOML + overrides, validated up front).
- `train(cfg, resume=False, overwrite=False) -> Path`: the run directory with ``config.json``, ``metrics.jsonl``,
  ``summary.json``, ``ckpt/`` and ``final/``.
- `write_report(run_dir)`: ``report.md`` + ``curve.png`` for any finished run.
"""

from respo.train.config import ConfigError, TrainConfig, load_config
from respo.train.demo import write_report
from respo.train.trainer import train

__all__ = ["ConfigError", "TrainConfig", "load_config", "train", "write_report"]
