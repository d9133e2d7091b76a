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

The whole grid is checked before anything is written, in a dry run too: ``--jobs`` and ``--threads``
(>= 1), ``--device``, ``--out`` (a directory), and every run's settings as `respo train` checks them (an
unknown objective, ``--reuse 0``, an unknown ``--set`` field or a bad value is refused in one line naming
the runs it concerns). What a sweep is (its grid and presets) lives in `respo.study.grid`, the runs'
processes and locks in `respo.study.supervise`, the evaluation of the starting policy in
`respo.study.baseline`.

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
import json
import shlex
import time
from pathlib import Path
from typing import Any

from respo.fileio import write_text_atomic
from respo.study.baseline import prewarm as _prewarm
from respo.study.grid import BASE_CONFIG, PRESETS, RunSpec, changed_settings, check_grid, finished, plan
from respo.study.names import ABLATION_KERNELS
from respo.study.supervise import clear_stale_lock, run_jobs, train_command
from respo.train.config import ConfigError

__all__ = ["run_sweep", "exit_code", "add_arguments", "cmd_sweep"]


def _update_manifest(sweep_dir: Path, invocation: dict, specs: list[RunSpec]) -> None:
    path = sweep_dir / "sweep.json"
    manifest = json.loads(path.read_text()) if path.is_file() else {"invocations": [], "runs": {}}
    manifest["invocations"].append(invocation)
    for s in specs:
        manifest["runs"][s.name] = {"overrides": s.overrides, "preset": invocation["preset"]}
    write_text_atomic(path, json.dumps(manifest, indent=1))


def run_sweep(sweep_dir: str | Path, specs: list[RunSpec], *, jobs: int = 2, threads: int = 1,
              base_config: str | Path = BASE_CONFIG, preset: str = "", command: str = "",
              prewarm: bool = True, dry_run: bool = False, device: str = "cpu") -> dict:
    """Run every spec not finished yet, ``jobs`` processes at a time; return what happened to each.

    ``device`` is every run's ``--device``: with "cuda" the ``jobs`` processes share one GPU (each
    holds its own CUDA context) and write the same run directories as on the CPU.

    First the whole grid is checked (`respo.study.grid.check_grid`: ``jobs``, ``threads``, the device,
    ``sweep_dir`` and every run's settings as `respo train` checks them), then the runs it would reuse
    (`respo.study.grid.changed_settings`); only then is anything written, in a real sweep and in a dry run
    alike. Each run's stdout/stderr go to ``runs/<name>/train.log``. A failed run is reported (name, exit
    code, last log line) and the sweep continues; re-running the same command retries it. Each run
    process dies with the sweep, and holds ``sweep.lock`` in its directory with it (`respo.study.supervise`):
    a run locked by another sweep is left to it and reported as ``running``.

    Returns ``{"total", "skipped", "ran", "running", "failed"}``: ``skipped`` counts the runs finished
    before this sweep, ``ran`` the runs this sweep finished, ``running`` names the runs another sweep is
    still running, ``failed`` describes the runs that failed; every spec is in exactly one of them.

    Raises:
        ConfigError: a setting of the grid cannot run, ``sweep_dir`` cannot be a directory, or a run this
            sweep would reuse was made with other settings (named in one line; nothing is written).
    """
    sweep_dir, base_config = Path(sweep_dir), Path(base_config)
    check_grid(specs, base_config, jobs=jobs, threads=threads, device=device, sweep_dir=sweep_dir)
    runs_dir = sweep_dir / "runs"
    changed = changed_settings(specs, runs_dir, base_config, threads)
    if changed:
        name, diff = next(iter(changed.items()))
        said = ", ".join(f"{k} = {json.dumps(old)} in the run, {json.dumps(new)} asked" for k, (old, new) in diff.items())
        more = f" (and {len(changed) - 1} more run(s))" if len(changed) > 1 else ""
        raise ConfigError(f"{len(changed)} run(s) under {runs_dir} were made with other settings, e.g. {name}: "
                          f"{said}{more}; rerun with the runs' settings or use another --out")
    todo = [s for s in specs if not finished(runs_dir / s.name)]
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
        if finished(runs_dir / s.name):
            clear_stale_lock(runs_dir / s.name)
    print(f"[sweep] {len(specs)} runs, {len(specs) - len(todo)} already finished, {len(todo)} to run "
          f"({jobs} at a time) -> {runs_dir}", flush=True)
    if todo and prewarm:
        on_record = _prewarm(todo, base_config, threads * jobs, sweep_dir, device)
        todo = [RunSpec(s.name, {**s.overrides, "eval_before": False})
                if s.name in on_record and "eval_before" not in s.overrides else s for s in todo]
    outcome, failed = run_jobs(todo, runs_dir, base_config, jobs=jobs, threads=threads, device=device)
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


def cmd_sweep(args: argparse.Namespace, command: str) -> int:
    """``respo sweep``: plan the preset's grid with the command line's dimensions, run it, print the outcome;
    ``command`` is the command line as typed (recorded in ``sweep.json``)."""
    if args.set is not None:
        args.set = dict(args.set)
    res = run_sweep(args.out, plan(args.preset, args), jobs=args.jobs, threads=args.threads, base_config=args.config,
                    preset=args.preset, command=command, prewarm=not args.no_prewarm, dry_run=args.dry_run,
                    device=args.device)
    print(json.dumps(res, indent=1))
    return exit_code(res)
