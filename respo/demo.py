"""``respo demo``: one warm start, three objectives side by side at a staleness where they differ.

The demo trains the same warm-started tiny policy with VESPO, ReSPO and ReSPO's positive branch with
VESPO's negative one (`DEMO_OBJECTIVES`), each at reuse ratio N = 16 from the same seed (so the first
rollout step is the same batch for all three), evaluates each on the same held-out prompts before and
after, and writes one report (``report.md``) with one figure (``demo.png``): the training score, the
starvation diagnostic (the fraction of stale positive responses whose sequence weight fell below
log W = −1, and the share of the coefficient mass they still get) and the held-out change of each.
`DEMO` holds the settings (any of them overridable from the command line); `WHY` says what they are
meant to show. Each objective's run keeps its own directory and run report under the demo's folder.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from respo.fileio import write_text_atomic
from respo.study.aggregate import load_runs, run_mean
from respo.study.names import ABLATION_KERNELS, LONG_KERNELS, label_slug, objective_fields
from respo.study.plots import plot_side_by_side
from respo.study.run_report import write_run_report
from respo.train.config import ConfigError, TrainConfig, apply_overrides, validate
from respo.train.evaluate import paired_difference
from respo.train.trainer import train

__all__ = ["DEMO", "DEMO_OBJECTIVES", "WHY", "demo_config", "run_demo"]

#: The objectives the demo puts side by side (``respo demo --objectives a,b`` picks others).
DEMO_OBJECTIVES: tuple[str, ...] = ("vespo", "respo", "respo+/vespo-")

#: Demo settings (overridable: ``respo demo --reuse 8 --lr 3e-5``).
DEMO: dict[str, Any] = {
    "task": "addition",
    "task_kwargs": {"digits": 5, "scratchpad": True},  # the warm start's default task: 32-token responses
    "model": "tiny-dense",
    "warm_start": True,
    "out_dir": "runs/demo",
    "objective": DEMO_OBJECTIVES[0],
    "prompts": 16,
    "group_size": 8,
    "reuse": 16,
    "updates": 48,
    "lr": 1e-4,
    "warmup": 10,
    "max_new_tokens": 40,
    "eval_prompts": 256,
    "eval_k": 4,
    "checkpoint_every": 0,
    "threads": 1,  # the tiny preset gains little from more threads, and one keeps timings steady under load
}

#: What the settings are for (written into report.md).
WHY = """\
Each rollout step feeds N = 16 optimizer steps at lr 1e-4, so fifteen of every sixteen updates learn
from a stale batch (staleness 0..15) and the sequence weights W = π_θ/π_old drift far from 1: the
regime where the kernels' two branches differ. The three objectives share the warm start, the seed and
so the first rollout step; they differ only in the coefficient φ(W) each gives a response.

What to look for: how many stale positives fall below log W = −1 under each objective, how much
coefficient mass they keep, and what each run does to held-out accuracy. In this cell of the staleness
study (3 seeds), ReSPO's published negative branch let the weights run away and lowered held-out pass@1,
while its positive branch with VESPO's negative one did as well as VESPO; one seed here is an
illustration, not that measurement (`reports/staleness/analysis.md` in the repository). Other objectives
or settings: `respo demo --objectives grpo,vespo --reuse 8 --out-dir runs/demo-n8`.
"""

#: The starvation diagnostic's two metrics: the report averages both over the stale updates, the figure
#: plots the first per stale update.
_STARVED = "frac_pos_low_w"
_SHARE = "pos_low_w_mass_share"


def demo_config(overrides: Mapping[str, Any] | None = None) -> TrainConfig:
    """`DEMO` applied to the defaults, then ``overrides`` (field -> value); validated."""
    cfg = apply_overrides(TrainConfig(), DEMO)
    if overrides:
        cfg = apply_overrides(cfg, overrides)
    validate(cfg)
    return cfg


def _summary(objective: str, run_dir: Path, k: int) -> dict[str, Any]:
    (run,) = load_runs([run_dir])
    before, after = run.summary.get("eval_before") or {}, run.summary.get("eval_after") or {}
    row: dict[str, Any] = {"objective": objective, "dir": run_dir.name, "records": run.records,
                           "before": before.get(f"mean@{k}", math.nan), "after": after.get(f"mean@{k}", math.nan),
                           **{name: run_mean(run, key, stale_only=True)
                              for name, key in (("starved", _STARVED), ("share", _SHARE), ("p10", "log_w/p10"))}}
    if before.get("per_prompt_mean") and after.get("per_prompt_mean"):
        row["delta"], row["delta_se"] = paired_difference(before["per_prompt_mean"], after["per_prompt_mean"])
    else:
        row["delta"], row["delta_se"] = math.nan, math.nan
    return row


def _num(x: float, fmt: str = ".3f") -> str:
    return "—" if not isinstance(x, (int, float)) or math.isnan(x) else format(x, fmt)


def _report(cfg: TrainConfig, rows: Sequence[dict], figure: Path, wall_s: float) -> str:
    k = cfg.eval_k
    lines = [f"# respo demo: {', '.join(r['objective'] for r in rows)} at N = {cfg.reuse}, lr {cfg.lr:g}",
             "", f"{cfg.model} warm-started on {cfg.task}, {cfg.prompts} prompts × G = {cfg.group_size} responses "
             f"per rollout step, {cfg.updates} updates each, seed {cfg.seed}; held-out: {cfg.eval_prompts} prompts × "
             f"k = {k} samples at temperature 1, the same prompts and draws before and after every run. "
             f"Wall time {wall_s:.0f} s.", "",
             f"![the runs side by side]({figure.name})", "",
             f"| objective | held-out mean@{k} before → after | change (95 % CI, paired over prompts) | "
             "stale positives below log W = −1 | their share of the coefficient mass | log W p10 | run |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        ci = (f"{r['delta']:+.3f} ({r['delta'] - 1.96 * r['delta_se']:+.3f} to {r['delta'] + 1.96 * r['delta_se']:+.3f})"
              if not math.isnan(r["delta"]) else "—")
        lines.append(f"| {r['objective']} | {_num(r['before'])} → {_num(r['after'])} | {ci} | "
                     f"{_num(r['starved'])} | {_num(r['share'])} | {_num(r['p10'], '.2f')} | "
                     f"[{r['dir']}]({r['dir']}/report.md) |")
    lines += ["", "The diagnostics are means over the stale updates (staleness > 0). A positive's share of the "
              "coefficient mass is Σφ over the positives below log W = −1 divided by Σφ over all positives: "
              "near 0, those correct responses are starved of gradient.", "", "## Why these settings", "", WHY]
    return "\n".join(lines)


def run_demo(overrides: Mapping[str, Any] | None = None, objectives: Sequence[str] | None = None) -> Path:
    """Train each of ``objectives`` (default `DEMO_OBJECTIVES`) with the demo settings, each in its own
    directory under ``out_dir``, and write ``report.md`` and ``demo.png`` there; returns the report's path.

    The demo owns its folder: running it again replaces the previous demo's runs, report and figure."""
    overrides = dict(overrides or {})
    if objectives is None:
        objectives = (overrides["objective"],) if "objective" in overrides else DEMO_OBJECTIVES
    elif "objective" in overrides:
        raise ConfigError("give the demo --objectives or --objective, not both")
    objectives = list(dict.fromkeys(objectives))
    if not objectives:
        raise ConfigError("--objectives names no objective")
    base = demo_config(overrides)
    cfgs = [demo_config({**overrides, **objective_fields(o, {**ABLATION_KERNELS, **LONG_KERNELS}),
                         "out_dir": str(Path(base.out_dir) / label_slug(o))})
            for o in objectives]  # every objective validated before the first trains
    out = Path(base.out_dir)
    t0 = time.perf_counter()
    rows = []
    for objective, cfg in zip(objectives, cfgs):
        t = time.perf_counter()
        run_dir = train(cfg, overwrite=True)
        write_run_report(run_dir, wall_s=time.perf_counter() - t)
        rows.append(_summary(objective, run_dir, cfg.eval_k))
    figure = plot_side_by_side(rows, out / "demo.png", k=base.eval_k, starved_key=_STARVED)
    path = out / "report.md"
    write_text_atomic(path, _report(base, rows, figure, time.perf_counter() - t0))
    return path
