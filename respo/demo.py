"""``respo demo``: warm start -> off-policy ReSPO at reuse ratio N -> held-out eval before/after -> report.

`DEMO` holds the demo's settings (any of them overridable from the command line); `WHY` says what
they are meant to show and is copied into the report, which `respo.study.run_report` writes after
`respo.train.train` returns, like the report of any other run. Measured comparisons across
objectives, N and learning rates are not restated here: they live in the staleness study, ``reports/staleness/report.md``, produced by
``respo sweep`` and ``respo report``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping

from respo.study.run_report import write_run_report
from respo.train.config import TrainConfig, apply_overrides, validate
from respo.train.trainer import train

__all__ = ["DEMO", "WHY", "demo_config", "run_demo"]

#: Demo settings (overridable: ``respo demo --reuse 8 --lr 1e-4``).
DEMO: dict[str, Any] = {
    "task": "addition",
    "task_kwargs": {"digits": 5, "scratchpad": True},  # the warm start's default task: 32-token responses
    "model": "tiny-dense",
    "warm_start": True,
    "out_dir": "runs/demo",
    "objective": "respo",
    "prompts": 16,
    "group_size": 8,
    "reuse": 4,
    "updates": 64,
    "lr": 3e-5,
    "warmup": 10,
    "max_new_tokens": 40,
    "eval_prompts": 256,
    "eval_k": 4,
    "checkpoint_every": 0,
    "threads": 1,  # the tiny preset gains little from more threads, and one keeps timings steady under load
}

#: What the settings are for (written into report.md).
WHY = """\
The demo trains ReSPO off-policy at reuse ratio N = 4: each rollout step feeds 4 optimizer steps,
so three of every four updates learn from a stale batch (staleness 0..3). The learning rate
3e-5 is one at which on-policy training (N = 1) of this preset stays stable on this task.

This is not a regime in which ReSPO is expected to beat clipped objectives: with 32-token
responses the sequence weights stay close to 1, and larger N or learning rates favour the
clipped baselines here. The measured comparison (objectives x N x learning rate x seeds, with the
commands that produced it) is the staleness study, `reports/staleness/report.md` in the
repository. To run the demo with another objective or setting:
`respo demo --objective grpo --reuse 8 --out-dir runs/demo-grpo-n8`.
"""


def demo_config(overrides: Mapping[str, Any] | None = None) -> TrainConfig:
    """`DEMO` applied to the defaults, then ``overrides`` (field -> value); validated."""
    cfg = apply_overrides(TrainConfig(), DEMO)
    if overrides:
        cfg = apply_overrides(cfg, overrides)
    validate(cfg)
    return cfg


def run_demo(overrides: Mapping[str, Any] | None = None) -> Path:
    """Train with the demo settings and write the report; returns the path of ``report.md``.

    The demo owns its run directory: running it again replaces the previous demo run there."""
    cfg = demo_config(overrides)
    t0 = time.perf_counter()
    run_dir = train(cfg, overwrite=True)
    return write_run_report(run_dir, note=WHY, wall_s=time.perf_counter() - t0)
