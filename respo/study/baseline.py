"""Pre-warm evaluation: a sweep builds (or loads) each distinct starting policy once, before its runs race
for it, and evaluates it with the runs' own held-out protocol (``SWEEP/baseline_eval/<model>.json``: the
"before RL" reference of the report). A run whose starting policy is a warm start measured there under
its protocol skips its own ``eval_before`` (it would sample the same prompts from the same policy with
the same generator again), and `sweep_baseline` finds that record for the run's report.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from respo.fileio import write_text_atomic
from respo.study.grid import RunSpec
from respo.train.config import rule

__all__ = ["PROTOCOL_FIELDS", "eval_protocol", "sweep_baseline", "prewarm"]


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


def prewarm(specs: list[RunSpec], base_config: Path, threads: int, sweep_dir: Path,
             device: str = "cpu") -> set[str]:
    """Train (or load) each distinct starting policy once, before the parallel runs race for it, and
    evaluate it with the runs' own held-out protocol (``baseline_eval/<model>.json``: the "before
    RL" reference of the report). Returns the names of the specs whose starting policy is a warm start
    measured there under their protocol: those runs skip their own ``eval_before``, which would sample
    the same prompts from the same policy with the same generator again (a warm start does not depend on
    the run's seed; a policy built from scratch does, so those runs keep theirs)."""
    import torch

    from respo.runtime.chat import render_for
    from respo.runtime.engines import make_engine
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
        engine = None
        if cfg.rollout_engine != "respo":  # the runs evaluate through their engine: so does their reference
            engine = make_engine(cfg.rollout_engine, policy.model, policy.tokenizer, dtype=cfg.dtype,
                                 engine_dtype=cfg.engine_dtype, threads=cfg.engine_threads, verbose=False)
        try:
            if engine is not None:
                engine.sync_weights(policy.model)
            ev = evaluate_held_out(policy, task, held_out, cfg, engine=engine)
        finally:
            if engine is not None:
                engine.close()
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out, json.dumps({"model": cfg.model, "task": cfg.task, "task_kwargs": cfg.task_kwargs,
                                           "policy": policy.info, "protocol": protocol, "eval": ev},
                                          indent=1, default=str))
        print(f"[sweep] starting policy {cfg.model}: held-out pass@1 {ev.get('pass@1')} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    return on_record
