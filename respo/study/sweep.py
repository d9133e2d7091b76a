"""``respo sweep``: a resumable grid of training runs for the staleness study.

A sweep is a directory::

    SWEEP/sweep.json          manifest: every invocation (preset, grid, exact command) and every run
    SWEEP/runs/<name>/        one `respo train` run each (config.json, metrics.jsonl, summary.json,
                              ckpt/, train.log)

Each run is a separate ``python -m respo train --config BASE --resume|--overwrite --field value ...`` process
(one torch thread by default), ``--jobs`` of them at a time. A run whose ``summary.json`` exists is
skipped; an interrupted run restarts from its newest checkpoint (``--resume``; one killed before its
first checkpoint starts again with ``--overwrite``), so killing and
re-launching the same command continues the sweep: its run processes die with it (on Linux, even
when it is killed with SIGKILL), and each run's ``sweep.lock`` is held while its sweep lives, so a
second sweep over the same directory leaves a run that is still going to the first and reports it
as ``running`` (exit 1: not finished). A finished run is reused only if it was made with the same
settings (every setting but the device and those `respo train --resume` may change); otherwise the
sweep stops in one line naming the setting. Several presets may share one sweep directory:
a run is identified by its grid coordinates only, so the calibration's runs are reused by the
main sweep when the coordinates coincide.

Every run of a preset takes the same number of policy updates (``updates`` of the base config or
``--updates``), whatever its N: at N = 32 and 64 updates that is 2 rollout steps, at N = 1 it is 64.

Presets (grid dimensions; `PRESETS` has the exact values):
    quick      CI: grpo and respo, N = 4, one seed, a tiny budget.
    calibrate  lr x N stability map: 4 objectives x lr {1e-5, 3e-5, 1e-4} x N {1, 8, 32}, seed 0.
    full       the study: 4 objectives x N {1, 8, 16, 32} x seeds {0, 1, 2} at ``--lr``, dense preset.
    moe        the same grid on the tiny-moe preset (seeds {0, 1}).
    groups     G in {4, 8, 16} at N = 16 for respo and grpo (``--objectives`` picks the baseline).
    ablation   ReSPO's positive branch with VESPO's negative branch and the reverse, N {1, 8, 32}.
    replay     respo on tiny-moe with and without routing replay, N {1, 16}.
    long-calibrate  long-response calibration (with ``--config configs/long/base-128.toml``): grpo and
               vespo x N {1, 32} x lr {3e-5, 1e-4, 1e-5}, seed 0, 64 updates (2 rollout steps at
               N = 32). Calibration only: a study at these lengths needs >= 8 rollout steps per run.
    long-main  grpo, vespo, respo, ReSPO+/VESPO- and ReSPO+ with lambda- = 0 x N {1, 32} x seeds {0, 1, 2}
               at ``--lrs`` (with a ``configs/long`` base).
    long-negative  the negative-branch family under ReSPO's positive branch, plus reinforce, grpo, gspo
               (seq-mean-token-mean and token-mean) x N {1, 32} x seeds {0, 1, 2}.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from respo.fileio import write_text_atomic
from respo.runtime.precision import device_problem
from respo.study.names import ABLATION_KERNELS, LONG_KERNELS, objective_label, run_name
from respo.train.checkpoint import latest_checkpoint
from respo.train.rundir import RESUMABLE
from respo.train.config import ConfigError, rule

__all__ = ["RunSpec", "PRESETS", "plan", "run_name", "run_sweep", "objective_label", "main", "add_arguments",
           "BASE_CONFIG", "ABLATION_KERNELS"]

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
    out = []
    for n in names:
        if n in ABLATION_KERNELS:
            pos, neg = ABLATION_KERNELS[n]
            out.append({"objective": "reshaped", "objective_kwargs": {"pos_kernel": pos, "neg_kernel": neg}})
        else:
            out.append({"objective": n})
    return out


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
            raise ValueError(f"objective {n!r}: unknown loss_agg_mode {agg!r}; choose one of {', '.join(AGG_MODES)}")
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
        raise ValueError(f"unknown sweep preset {preset!r}; choose one of {', '.join(PRESETS)}")
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


def _flag_value(v: Any) -> str:
    if isinstance(v, (dict, list, tuple)):
        return json.dumps(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def train_command(spec: RunSpec, run_dir: Path, base_config: Path, threads: int, device: str = "cpu") -> list[str]:
    """The exact `respo train` command of one run: ``--resume`` from its newest checkpoint, or
    ``--overwrite`` when it has none (a fresh run, or one killed before its first checkpoint, whose
    partial records cannot be continued). ``device`` is passed through as ``--device``; it is not part
    of the run's name, so a sweep on a GPU writes the run directories a CPU sweep writes."""
    resume = latest_checkpoint(run_dir / "ckpt") is not None
    cmd = [sys.executable, "-m", "respo", "train", "--config", str(base_config),
           "--resume" if resume else "--overwrite", "--out-dir", str(run_dir), "--threads", str(threads)]
    if device != "cpu":
        cmd += ["--device", device]
    for k, v in spec.overrides.items():
        cmd += [f"--{k.replace('_', '-')}", _flag_value(v)]
    return cmd


def _done(run_dir: Path) -> bool:
    return (run_dir / "summary.json").is_file()


#: Run in each run's process before `respo train` (``python -c CHILD_GUARD SWEEP_PID CMD...``): on Linux
#: the kernel sends it SIGKILL when the sweep's thread that started it dies, whatever kills the sweep
#: (``prctl(PR_SET_PDEATHSIG)``, kept across the exec); a sweep already gone by then is caught by the
#: parent check. Elsewhere the guard only execs the command.
CHILD_GUARD = """
import ctypes, os, signal, sys
if sys.platform.startswith("linux"):
    if ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
        sys.exit("respo sweep: prctl(PR_SET_PDEATHSIG) failed: errno %d" % ctypes.get_errno())
    if os.getppid() != int(sys.argv[1]):
        os._exit(1)
os.execv(sys.argv[2], sys.argv[2:])
"""
LOCK = "sweep.lock"


def _guarded(cmd: list[str]) -> list[str]:
    """``cmd`` behind `CHILD_GUARD`: the process dies with this sweep."""
    return [sys.executable, "-c", CHILD_GUARD, str(os.getpid()), *cmd]


class _RunLock:
    """An exclusive ``flock`` on ``RUN/sweep.lock``, held by the sweep and inherited by the run's
    process, so it is held exactly while either is alive; the file names the run's process id for the
    message only. No process id is ever trusted (one may be reused), and a file left by a killed sweep
    locks nothing."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / LOCK
        self.fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock without waiting; False when another sweep's run holds it."""
        import fcntl

        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            try:  # the file we locked may have been removed by its holder meanwhile: lock the new one
                if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                    self.fd = fd
                    return True
            except FileNotFoundError:
                pass
            os.close(fd)

    def holder(self) -> str:
        try:
            return self.path.read_text().strip() or "?"
        except OSError:
            return "?"

    def write(self, pid: int) -> None:
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{pid}\n".encode(), 0)

    def release(self) -> None:
        """Remove the file, then let go (in this order: a sweep that locks the file in between sees it gone)."""
        if self.fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self.fd)
            self.fd = None


def _clear_stale_lock(run_dir: Path) -> None:
    """Remove a ``sweep.lock`` nobody holds (left by a killed sweep)."""
    if (run_dir / LOCK).exists():
        lock = _RunLock(run_dir)
        if lock.acquire():
            lock.release()


#: Settings that may differ between a finished run and a sweep that would reuse it: `RESUMABLE`
#: (the ones `respo train --resume` accepts) and those marked ``"reusable"`` in their `TrainConfig`
#: field's metadata: where it runs (not part of a run's name) and ``eval_before`` (a sweep turns it off
#: for runs whose starting policy it measured itself, `_prewarm`).
REUSABLE = (*RESUMABLE, *rule("reusable"))


def _changed_settings(specs: list[RunSpec], runs_dir: Path, base_config: Path, threads: int) -> dict[str, dict]:
    """Runs this sweep would reuse (finished, or resumable from a checkpoint) that were made with other
    settings: ``{name: {field: (recorded, asked)}}``, every field outside `REUSABLE` compared."""
    from respo.train.config import TrainConfig, config_to_dict, load_config

    defaults = config_to_dict(TrainConfig())
    out = {}
    for s in specs:
        run_dir = runs_dir / s.name
        path = run_dir / "config.json"
        if not path.is_file() or not (_done(run_dir) or latest_checkpoint(run_dir / "ckpt") is not None):
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


def _update_manifest(sweep_dir: Path, invocation: dict, specs: list[RunSpec]) -> None:
    path = sweep_dir / "sweep.json"
    manifest = json.loads(path.read_text()) if path.is_file() else {"invocations": [], "runs": {}}
    manifest["invocations"].append(invocation)
    for s in specs:
        manifest["runs"][s.name] = {"overrides": s.overrides, "preset": invocation["preset"]}
    write_text_atomic(path, json.dumps(manifest, indent=1))


#: The settings a held-out evaluation depends on besides the policy (and the fixed EVAL_SEED / EVAL_TEMPERATURE):
#: those marked ``"protocol"`` in their `TrainConfig` field's metadata.
PROTOCOL_FIELDS = tuple(rule("protocol"))


def eval_protocol(settings: dict, device: str) -> dict:
    """The evaluation protocol of a run's settings (a `TrainConfig`'s fields or a ``config.json``)."""
    return {**{k: settings.get(k) for k in PROTOCOL_FIELDS}, "device": device}


def _matching_eval(path: Path, *, model, task, task_kwargs, policy, protocol) -> dict | None:
    """The ``eval`` of the baseline record at ``path`` if it was measured for this model, task, task
    settings, starting policy (a warm start's cache key and history) and evaluation protocol; else None
    (also when the file is missing or unreadable, or was written before records stated their protocol)."""
    try:
        rec = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    want = {"model": model, "task": task, "task_kwargs": task_kwargs, "policy": policy, "protocol": protocol}
    same = json.loads(json.dumps(want, default=str)) == {k: rec.get(k) for k in want}
    return rec.get("eval") if same else None


def sweep_baseline(run_dir: str | Path) -> dict | None:
    """The before-RL evaluation a sweep measured for this run instead of the run's own ``eval_before``:
    ``<sweep>/baseline_eval/<model>.json`` two levels above the run directory, if it records the run's
    starting policy (``config.json``'s ``policy``) under the run's evaluation protocol; else None."""
    run_dir = Path(run_dir)
    try:
        cfg = json.loads((run_dir / "config.json").read_text())
        path = run_dir.parent.parent / "baseline_eval" / f"{Path(str(cfg['model'])).name}.json"
    except (OSError, ValueError, KeyError):
        return None
    return _matching_eval(path, model=cfg["model"], task=cfg.get("task"), task_kwargs=cfg.get("task_kwargs"),
                          policy=cfg.get("policy"), protocol=eval_protocol(cfg, cfg.get("device", "cpu")))


def _prewarm(specs: list[RunSpec], base_config: Path, threads: int, sweep_dir: Path,
             device: str = "cpu") -> set[str]:
    """Train (or load) each distinct starting policy once, before the parallel runs race for it, and
    evaluate it with the runs' own held-out protocol (``baseline_eval/<model>.json``: the "before
    RL" reference of the report). Returns the names of the specs whose starting policy is a warm start
    measured there under their protocol: those runs skip their own ``eval_before``, which would sample
    the same prompts from the same policy with the same generator again (a warm start does not depend on
    the run's seed; a policy built from scratch does, so those runs keep theirs)."""
    import torch

    from respo.runtime.chat import render_for
    from respo.runtime.tasks import get_task
    from respo.train.config import load_config
    from respo.train.evaluate import EVAL_SEED, evaluate_held_out
    from respo.train.policy import load_run_policy

    seen: dict[tuple, bool] = {}  # key -> its baseline is on record
    on_record: set[str] = set()
    for s in specs:
        cfg = load_config(base_config, {**s.overrides, "device": device})
        protocol = eval_protocol(vars(cfg), device)
        key = (cfg.model, cfg.task, json.dumps(cfg.task_kwargs, sort_keys=True), cfg.warm_start,
               json.dumps(protocol, sort_keys=True))
        out = sweep_dir / "baseline_eval" / f"{Path(cfg.model).name}.json"
        if key in seen:
            if seen[key]:
                on_record.add(s.name)
            continue
        if (out.is_file() and not cfg.warm_start) or not cfg.eval_prompts:
            continue
        seen[key] = bool(cfg.warm_start)
        if cfg.warm_start:
            on_record.add(s.name)
        torch.set_num_threads(max(1, threads))
        t0 = time.perf_counter()
        policy = load_run_policy(cfg)
        if _matching_eval(out, model=cfg.model, task=cfg.task, task_kwargs=cfg.task_kwargs, policy=policy.info,
                          protocol=protocol) is not None:
            continue  # a warm start already measured with this protocol (a second invocation into this sweep)
        task = get_task(cfg.task, **cfg.task_kwargs)
        # the runs' own rendering (chat template or raw), so the reference is measured on the prompts they see
        task, held_out = render_for(policy.tokenizer, cfg.prompt_format, task,
                                    task.examples("test", cfg.eval_prompts, EVAL_SEED))
        ev = evaluate_held_out(policy, task, held_out, cfg)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out, json.dumps({"model": cfg.model, "task": cfg.task, "task_kwargs": cfg.task_kwargs,
                                           "policy": policy.info, "protocol": protocol, "eval": ev},
                                          indent=1, default=str))
        print(f"[sweep] starting policy {cfg.model}: held-out pass@1 {ev.get('pass@1')} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    return on_record


def run_sweep(sweep_dir: str | Path, specs: list[RunSpec], *, jobs: int = 2, threads: int = 1,
              base_config: str | Path = BASE_CONFIG, preset: str = "", command: str = "",
              prewarm: bool = True, dry_run: bool = False, device: str = "cpu") -> dict:
    """Run every spec not finished yet, ``jobs`` processes at a time; return what happened to each.

    ``device`` is every run's ``--device``: with "cuda" the ``jobs`` processes share one GPU (each
    holds its own CUDA context) and write the same run directories as on the CPU.

    Each run's stdout/stderr go to ``runs/<name>/train.log``. A failed run is reported (name, exit
    code, last log line) and the sweep continues; re-running the same command retries it. Each run
    process dies with the sweep (`CHILD_GUARD`), and holds ``sweep.lock`` in its directory with it
    (`_RunLock`): a run locked by another sweep is left to it and reported as ``running``.

    Returns ``{"total", "skipped", "ran", "running", "failed"}``: ``skipped`` counts the runs finished
    before this sweep, ``ran`` the runs this sweep finished, ``running`` names the runs another sweep is
    still running, ``failed`` describes the runs that failed; every spec is in exactly one of them.

    Raises:
        ConfigError: the device is unusable, or a run this sweep would reuse was made with other
            settings (named in one line; nothing is written).
    """
    sweep_dir, base_config = Path(sweep_dir), Path(base_config)
    problem = device_problem(device)
    if problem:
        raise ConfigError(problem)
    runs_dir = sweep_dir / "runs"
    changed = _changed_settings(specs, runs_dir, base_config, threads)
    if changed:
        name, diff = next(iter(changed.items()))
        said = ", ".join(f"{k} = {json.dumps(old)} in the run, {json.dumps(new)} asked" for k, (old, new) in diff.items())
        more = f" (and {len(changed) - 1} more run(s))" if len(changed) > 1 else ""
        raise ConfigError(f"{len(changed)} run(s) under {runs_dir} were made with other settings, e.g. {name}: "
                          f"{said}{more}; rerun with the runs' settings or use another --out")
    todo = [s for s in specs if not _done(runs_dir / s.name)]
    if dry_run:
        print(f"[sweep] {len(specs)} runs, {len(specs) - len(todo)} already finished, {len(todo)} to run", flush=True)
        for s in todo:
            print(shlex.join(train_command(s, runs_dir / s.name, base_config, threads, device)))
        return {"total": len(specs), "skipped": len(specs) - len(todo), "ran": 0, "running": [], "failed": []}
    runs_dir.mkdir(parents=True, exist_ok=True)
    _update_manifest(sweep_dir, {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "preset": preset,
                                 "command": command, "base_config": str(base_config),
                                 "base_config_text": base_config.read_text(), "jobs": jobs, "threads": threads, "device": device,
                                 "runs": [s.name for s in specs]}, specs)
    for s in specs:
        if _done(runs_dir / s.name):
            _clear_stale_lock(runs_dir / s.name)
    print(f"[sweep] {len(specs)} runs, {len(specs) - len(todo)} already finished, {len(todo)} to run "
          f"({jobs} at a time) -> {runs_dir}", flush=True)
    if todo and prewarm:
        on_record = _prewarm(todo, base_config, threads * jobs, sweep_dir, device)
        todo = [RunSpec(s.name, {**s.overrides, "eval_before": False})
                if s.name in on_record and "eval_before" not in s.overrides else s for s in todo]

    outcome: dict[str, str] = {}  # name -> "ran" | "skipped" | "running" | "failed"
    failed: list[dict] = []
    t_start = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "TOKENIZERS_PARALLELISM": "false"}

    def one(i_spec):
        i, s = i_spec
        run_dir = runs_dir / s.name
        run_dir.mkdir(parents=True, exist_ok=True)
        lock = _RunLock(run_dir)
        if not lock.acquire():
            outcome[s.name] = "running"
            print(f"[sweep] not run {s.name}: another sweep is running it (process {lock.holder()})", flush=True)
            return
        try:
            if _done(run_dir):  # finished by another sweep since this one looked
                outcome[s.name] = "skipped"
                return
            cmd = train_command(s, run_dir, base_config, threads, device)
            t0 = time.perf_counter()
            with open(run_dir / "train.log", "a") as log:
                log.write("$ " + shlex.join(cmd) + "\n")
                log.flush()
                # started and waited for by this thread: the parent-death signal follows this thread
                proc = subprocess.Popen(_guarded(cmd), stdout=log, stderr=subprocess.STDOUT, env=env,
                                        pass_fds=(lock.fd,))
                lock.write(proc.pid)
                rc = proc.wait()
        finally:
            lock.release()
        dt = time.perf_counter() - t0
        if rc != 0 or not _done(run_dir):
            tail = (run_dir / "train.log").read_text().strip().splitlines()[-1:] or [""]
            outcome[s.name] = "failed"
            failed.append({"run": s.name, "rc": rc, "last_line": tail[0]})
            print(f"[sweep] FAILED {s.name} rc={rc}: {tail[0]}", flush=True)
        else:
            outcome[s.name] = "ran"
            print(f"[sweep] done {i + 1}/{len(todo)} {s.name} in {dt:.0f} s "
                  f"(elapsed {time.perf_counter() - t_start:.0f} s)", flush=True)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, enumerate(todo)))
    count = lambda kind: sum(v == kind for v in outcome.values())  # noqa: E731
    running = [s.name for s in todo if outcome.get(s.name) == "running"]
    if running:
        print(f"[sweep] {len(running)} run(s) still running in another sweep; this sweep is not finished", flush=True)
    return {"total": len(specs), "skipped": len(specs) - len(todo) + count("skipped"), "ran": count("ran"),
            "running": running, "failed": failed}


def exit_code(res: dict) -> int:
    """0 when every run of the sweep is finished; 1 when one failed or another sweep is still running one."""
    return 1 if res["failed"] or res.get("running") else 0


def _kv(text: str) -> tuple[str, Any]:
    """``field=value`` (value parsed as JSON when possible) for ``--set``."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--set expects field=value, got {text!r}")
    k, v = text.split("=", 1)
    try:
        v = json.loads(v)
    except json.JSONDecodeError:
        pass
    return k.strip().replace("-", "_"), v


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="quick", choices=list(PRESETS),
                   help="; ".join(f"{k}: {v.doc}" for k, v in PRESETS.items()))
    p.add_argument("--out", default="runs/study", help="sweep directory (shared by presets; runs are reused)")
    p.add_argument("--jobs", type=int, default=2, help="parallel run processes (default 2 = the cores)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run process")
    p.add_argument("--device", default="cpu",
                   help="every run's device (cpu, cuda, cuda:K, auto); with cuda, --jobs runs share the GPU")
    p.add_argument("--config", default=str(BASE_CONFIG), help="base TOML config of every run")
    p.add_argument("--updates", type=int, default=0, help="policy updates per run (default: the preset's / base)")
    p.add_argument("--lrs", "--lr", type=_floats, default=None, help="learning rate(s), comma-separated")
    p.add_argument("--seeds", type=_ints, default=None, help="seeds, comma-separated")
    p.add_argument("--reuse", type=_ints, default=None, help="N values, comma-separated")
    p.add_argument("--objectives", type=_names, default=None,
                   help=f"objectives, comma-separated (ablation labels: {', '.join(ABLATION_KERNELS)})")
    p.add_argument("--set", type=_kv, action="append", default=None,
                   help="field=value applied to every run (repeatable), e.g. --set model=tiny-moe")
    p.add_argument("--dry-run", action="store_true", help="print the commands of the runs still to do")
    p.add_argument("--no-prewarm", action="store_true", help="do not build the warm start(s) before the runs")


def cmd_sweep(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    if args.set is not None:
        args.set = dict(args.set)
    specs = plan(args.preset, args)
    command = "respo sweep " + shlex.join(argv if argv is not None else sys.argv[1:])
    res = run_sweep(args.out, specs, jobs=args.jobs, threads=args.threads, base_config=args.config,
                    preset=args.preset, command=command, prewarm=not args.no_prewarm, dry_run=args.dry_run,
                    device=args.device)
    print(json.dumps(res, indent=1))
    return exit_code(res)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m respo.study.sweep", description=__doc__.split("\n")[0])
    add_arguments(p)
    return cmd_sweep(p.parse_args(argv), argv)


if __name__ == "__main__":
    sys.exit(main())
