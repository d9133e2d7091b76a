"""What a sweep is: its runs (`RunSpec`: a name and the config fields it overrides), the presets'
grids (`PRESETS`, the study's named grids), `plan` (a preset and the command line's dimensions -> the
runs, in launch order), `check_grid` (every run of a grid validated as `respo train` validates it, before
anything is written) and which recorded settings a sweep may reuse a run across (`REUSABLE`,
`changed_settings`).

A run is identified by its grid coordinates only (`respo.study.names.run_name`), so presets that share a
sweep directory reuse each other's runs where their coordinates coincide. Every run of a preset takes the
same number of policy updates (``updates`` of the base config or ``--updates``), whatever its N.
"""

from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from respo.runtime.precision import device_problem
from respo.study.names import ABLATION_KERNELS, LONG_KERNELS, objective_fields, run_name
from respo.train.checkpoint import latest_checkpoint
from respo.train.config import ConfigError, rule
from respo.train.rundir import RESUMABLE

__all__ = ["RunSpec", "Preset", "PRESETS", "plan", "BASE_CONFIG", "MAIN_OBJECTIVES", "MOE_MODEL", "LONG_LR",
           "LONG_MAIN_OBJECTIVES", "LONG_NEGATIVE_OBJECTIVES", "REUSABLE", "changed_settings", "check_grid",
           "finished"]

BASE_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "study" / "base.toml"
MAIN_OBJECTIVES = ("grpo", "gspo", "vespo", "respo")
#: The MoE presets' policy: the tiny-moe warm start on the base task (see configs/study/base.toml).
MOE_MODEL = "runs/study/warm/tiny-moe"


@dataclass(frozen=True)
class RunSpec:
    """One run: its name (unique within a sweep) and the config fields it overrides."""

    name: str
    overrides: dict = field(default_factory=dict)


def _grid(**dims: Iterable[Any]) -> list[dict]:
    """Cartesian product of the dimensions as a list of override dicts (seed varies slowest, so a
    partially finished sweep has complete seeds first)."""
    keys = list(dims)
    order = sorted(keys, key=lambda k: (k != "seed", k != "lr"))  # seed, then lr, then the rest
    rows = []
    for values in itertools.product(*(list(dims[k]) for k in order)):
        rows.append({k: v for k, v in zip(order, values)})
    return rows


def _objectives(names: Iterable[str]) -> list[dict]:
    """Objective coordinates: plain names, or ablation labels mapped to ``reshaped`` + kernels."""
    return [objective_fields(n) for n in names]


def _expand(rows: list[dict]) -> list[dict]:
    """Turn the ``obj`` coordinate (a dict of objective fields) into flat overrides."""
    out = []
    for r in rows:
        r = dict(r)
        obj = r.pop("obj", None)
        if obj:
            r.update(obj)
        out.append(r)
    return out


@dataclass(frozen=True)
class Preset:
    """A named grid: ``grid(args)`` -> list of override dicts; ``updates`` a default budget (None = base)."""

    doc: str
    grid: Callable[[argparse.Namespace], list[dict]]
    updates: int | None = None
    base: dict = field(default_factory=dict)


def _lrs(args, default):
    return args.lrs or default


def _seeds(args, default):
    return args.seeds if args.seeds is not None else default


def _obj_names(args, default):
    return args.objectives or default


PRESETS: dict[str, Preset] = {
    "quick": Preset(
        "CI smoke test: grpo and respo at N = 4, one seed, 8 updates of 4 prompts, 3-digit addition",
        lambda a: _expand(_grid(seed=_seeds(a, [0]), lr=_lrs(a, [3e-5]), obj=_objectives(_obj_names(a, ["grpo", "respo"])),
                                reuse=a.reuse or [4])),
        updates=8,
        base={"model": "tiny-dense", "warm_start": False, "prompts": 4, "group_size": 4, "eval_prompts": 8, "eval_k": 2, "max_new_tokens": 22,
              "task_kwargs": {"digits": 3, "scratchpad": True}, "checkpoint_every": 4},
    ),
    "calibrate": Preset(
        "lr x N stability map: 4 objectives x lr {1e-5, 3e-5, 1e-4} x N {1, 8, 32}, seed 0",
        lambda a: _expand(_grid(seed=_seeds(a, [0]), lr=_lrs(a, [3e-5, 1e-4, 1e-5]),
                                obj=_objectives(_obj_names(a, MAIN_OBJECTIVES)), reuse=a.reuse or [1, 8, 32])),
    ),
    "full": Preset(
        "the study: grpo, gspo, vespo, respo x N {1, 8, 16, 32} x seeds {0, 1, 2} at --lr (dense preset)",
        lambda a: _expand(_grid(seed=_seeds(a, [0, 1, 2]), lr=_lrs(a, [3e-5]), obj=_objectives(_obj_names(a, MAIN_OBJECTIVES)),
                                reuse=a.reuse or [1, 8, 16, 32])),
    ),
    "moe": Preset(
        "the main grid on the tiny-moe preset: 4 objectives x N {1, 8, 16, 32} x seeds {0, 1}",
        lambda a: _expand(_grid(seed=_seeds(a, [0, 1]), lr=_lrs(a, [3e-5]), obj=_objectives(_obj_names(a, MAIN_OBJECTIVES)),
                                reuse=a.reuse or [1, 8, 16, 32], model=[MOE_MODEL])),
    ),
    "groups": Preset(
        "group size G in {4, 8, 16} at N = 16 for respo and the best baseline (--objectives respo,grpo)",
        lambda a: _expand(_grid(seed=_seeds(a, [0, 1]), lr=_lrs(a, [3e-5]), obj=_objectives(_obj_names(a, ["respo", "grpo"])),
                                reuse=a.reuse or [16], group_size=[4, 8, 16])),
    ),
    "ablation": Preset(
        "branch ablation: ReSPO+ with VESPO- and VESPO+ with ReSPO- (the core's reshaped objective), N {1, 8, 32}",
        lambda a: _expand(_grid(seed=_seeds(a, [0, 1]), lr=_lrs(a, [3e-5]), obj=_objectives(_obj_names(a, list(ABLATION_KERNELS))),
                                reuse=a.reuse or [1, 8, 32])),
    ),
    "replay": Preset(
        "routing replay: respo on tiny-moe with and without replay, N {1, 16}",
        lambda a: _expand(_grid(seed=_seeds(a, [0, 1]), lr=_lrs(a, [3e-5]), obj=_objectives(_obj_names(a, ["respo"])),
                                reuse=a.reuse or [1, 16], model=[MOE_MODEL], routing_replay=[False, True])),
    ),
    "long-calibrate": Preset(
        "long-response calibration (--config configs/long/base-128.toml): grpo and vespo x N {1, 32} x "
        "lr {3e-5, 1e-4, 1e-5}, seed 0, 64 updates = 2 rollout steps at N = 32 (calibration only; "
        "a study needs >= 8 rollout steps per run)",
        lambda a: _expand(_grid(seed=_seeds(a, [0]), lr=_lrs(a, [3e-5, 1e-4, 1e-5]),
                                obj=_objectives(_obj_names(a, ["grpo", "vespo"])), reuse=a.reuse or [1, 32])),
        updates=64,
    ),
}


# ---- the long-response study (configs/long: 128 to 512 response tokens) ------------------------
#: Its learning rate until the long calibration picks one (``--lrs`` overrides).
LONG_LR = 3e-5
LONG_MAIN_OBJECTIVES = ("grpo", "vespo", "respo", "respo+/vespo-", "respo+/respo0-")
#: ReSPO's φ⁻ = respo(1,0.5,2) is plain ``respo``, so those runs are long-main's.
LONG_NEGATIVE_OBJECTIVES = ("respo+/vespo-", "respo+/truncated-", "respo+/respo0-", "respo", "reinforce", "grpo",
                            "gspo", "gspo@token-mean")


def _long_objectives(names: Iterable[str]) -> list[dict]:
    """Like `_objectives`, plus `LONG_KERNELS` labels and an ``@AGG`` suffix setting ``loss_agg_mode``
    (``gspo@token-mean``; no suffix = the objective's published aggregation)."""
    from respo.core.aggregation import AGG_MODES

    out = []
    for n in names:
        label, _, agg = n.partition("@")
        if agg and agg not in AGG_MODES:
            raise ConfigError(f"objective {n!r}: unknown loss_agg_mode {agg!r}; choose one of {', '.join(AGG_MODES)}")
        if label in LONG_KERNELS:
            pos, neg = LONG_KERNELS[label]
            obj = {"objective": "reshaped", "objective_kwargs": {"pos_kernel": pos, "neg_kernel": neg}}
        else:
            (obj,) = _objectives([label])
        out.append({**obj, "loss_agg_mode": agg} if agg else obj)
    return out


PRESETS.update({
    "long-main": Preset(
        "long responses: grpo, vespo, respo, ReSPO+/VESPO- (reshaped respo(2,0.5,2) / vespo(3,2)) and ReSPO+ with "
        "lambda- = 0 (reshaped respo(2,0.5,2) / respo(1,0.5,0)) x N {1, 32} x seeds {0, 1, 2} at --lrs "
        f"(default {LONG_LR:g}); pass a configs/long base with --config",
        lambda a: _expand(_grid(seed=_seeds(a, [0, 1, 2]), lr=_lrs(a, [LONG_LR]),
                                obj=_long_objectives(_obj_names(a, LONG_MAIN_OBJECTIVES)), reuse=a.reuse or [1, 32])),
    ),
    "long-negative": Preset(
        "long responses, negative branch under ReSPO's positive respo(2,0.5,2): neg in {vespo(3,2), truncated(1), "
        "respo(1,0.5,0), respo(1,0.5,2) (= respo)}, plus reinforce, grpo, gspo (published seq-mean-token-mean) and "
        f"gspo@token-mean x N {{1, 32}} x seeds {{0, 1, 2}} at --lrs (default {LONG_LR:g}); pass a configs/long base "
        "with --config",
        lambda a: _expand(_grid(seed=_seeds(a, [0, 1, 2]), lr=_lrs(a, [LONG_LR]),
                                obj=_long_objectives(_obj_names(a, LONG_NEGATIVE_OBJECTIVES)), reuse=a.reuse or [1, 32])),
    ),
})


def plan(preset: str, args: argparse.Namespace) -> list[RunSpec]:
    """The runs of ``preset`` (with the budget override) as `RunSpec`s, in launch order."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown sweep preset {preset!r}; choose one of {', '.join(PRESETS)}")
    p = PRESETS[preset]
    updates = args.updates or p.updates
    specs, seen = [], set()
    for ov in p.grid(args):
        ov = {**p.base, **ov}
        if updates:
            ov["updates"] = updates
        if args.set:
            ov.update(args.set)
        name = run_name(ov)
        if name not in seen:
            seen.add(name)
            specs.append(RunSpec(name, ov))
    return specs


def finished(run_dir: Path) -> bool:
    """The run in ``run_dir`` ended (its ``summary.json`` exists): a sweep skips it."""
    return (run_dir / "summary.json").is_file()


#: Settings that may differ between a finished run and a sweep that would reuse it: `RESUMABLE`
#: (the ones `respo train --resume` accepts) and those marked ``"reusable"`` in their `TrainConfig`
#: field's metadata: where it runs (not part of a run's name) and ``eval_before`` (a sweep turns it off
#: for runs whose starting policy it measured itself, `respo.study.baseline.prewarm`).
REUSABLE = (*RESUMABLE, *rule("reusable"))


def changed_settings(specs: list[RunSpec], runs_dir: Path, base_config: Path, threads: int) -> dict[str, dict]:
    """Runs this sweep would reuse (finished, or resumable from a checkpoint) that were made with other
    settings: ``{name: {field: (recorded, asked)}}``, every field outside `REUSABLE` compared."""
    from respo.train.config import TrainConfig, config_to_dict, load_config

    defaults = config_to_dict(TrainConfig())
    out = {}
    for s in specs:
        run_dir = runs_dir / s.name
        path = run_dir / "config.json"
        if not path.is_file() or not (finished(run_dir) or latest_checkpoint(run_dir / "ckpt") is not None):
            continue  # nothing to reuse: a fresh run, or one restarted from scratch
        try:
            recorded = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ConfigError(f"cannot read {path}: {err}") from None
        asked = config_to_dict(load_config(base_config, {**s.overrides, "threads": threads}))
        diff = {k: (recorded.get(k, defaults.get(k)), v) for k, v in asked.items()
                if k not in REUSABLE and recorded.get(k, defaults.get(k)) != v}
        if diff:
            out[s.name] = diff
    return out


def _one_line(err: Exception) -> str:
    """An error's message on one line (a config with several problems lists them on separate lines)."""
    return "; ".join(part.strip(" -") for part in str(err).splitlines() if part.strip(" -"))


def check_grid(specs: list[RunSpec], base_config: str | Path, *, jobs: int, threads: int, device: str = "cpu",
               sweep_dir: str | Path | None = None) -> None:
    """Check, before anything is written, that the sweep can run as asked: ``jobs`` and ``threads`` >= 1, the
    device usable, ``sweep_dir`` a directory (or creatable as one), and every run's settings (the base config
    with the run's overrides, threads and device) valid as `respo train` validates them
    (`respo.train.config.load_config`: known fields, values, objective, task).

    Raises:
        ConfigError: one line naming each problem, and for a run's problem the runs that have it (one of
            them by name).
    """
    from respo.fileio import dir_problem
    from respo.runtime.tasks.base import TaskError
    from respo.train.config import load_config

    problems = [f"--{name} must be >= 1, got {value}" for name, value in (("jobs", jobs), ("threads", threads))
                if value < 1]
    problems += [p for p in (device_problem(device),
                             sweep_dir is not None and dir_problem(sweep_dir, "sweep directory", "--out")) if p]
    if problems:
        raise ConfigError("; ".join(problems))
    bad: dict[str, list[str]] = {}  # problem -> the runs that have it
    for s in specs:
        try:
            load_config(base_config, {**s.overrides, "threads": threads, "device": device})
        except (ConfigError, TaskError) as err:
            bad.setdefault(_one_line(err), []).append(s.name)
    if bad:
        said = "; ".join(f"{len(names)} of the {len(specs)} run(s), e.g. {names[0]}: {problem}"
                         for problem, names in bad.items())
        raise ConfigError(f"the sweep cannot run as asked (nothing was written): {said}")
