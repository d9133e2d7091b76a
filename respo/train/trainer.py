"""The off-policy training loop: get a mini-batch, update, log, evaluate, checkpoint.

`train` is the whole run, read top to bottom. Its components live next door: the policy
(`respo.train.policy`), the mini-batch sources, sync reuse-N or an async worker
(`respo.train.sources`), one update (`respo.train.step`), the run state and checkpoints
(`respo.train.checkpoint`), held-out evaluation (`respo.train.evaluate`) and metrics
(`respo.train.metrics`).
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from tqdm.auto import tqdm

from respo.runtime import moe
from respo.runtime.chat import render_for
from respo.runtime.precision import resolve_device
from respo.runtime.tasks import get_task
from respo.train.buffer import PromptStream, RolloutBuffer
from respo.train.checkpoint import (RunDirError, RunState, checkpoint_manifest, lock_run_dir, prepare_run_dir,
                                    resume_changes, rng_state, set_rng_state, verify_checkpoint)
from respo.train.config import ConfigError, TrainConfig, config_to_dict, validate
from respo.train.evaluate import EVAL_SEED, eval_record, evaluate_held_out
from respo.train.metrics import MetricsLogger, timed, write_summary
from respo.train.policy import load_run_policy
from respo.train.sources import AsyncSource, MiniBatchSource, SyncReuseSource
from respo.train.step import batch_metrics, make_optimizer, update_step

__all__ = ["train"]

NUMPY_SEED_RANGE = 2**32  # numpy's legacy seeding takes seeds in [0, 2**32)
#: What a run writes when it ends; removed when a resumed run goes on past it.
ENDING_ENTRIES = ("final", "summary.json", "report.md", "curve.png")



def train(cfg: TrainConfig, *, resume: bool = False, overwrite: bool = False, report: bool = True) -> Path:
    """Run one training job described by ``cfg``; return its run directory.

    Writes ``config.json``, ``metrics.jsonl`` (one record per update, plus ``eval`` records),
    ``summary.json`` (final and initial held-out evaluation, staleness reached, wall time),
    checkpoints under ``ckpt/`` and, with ``report``, ``report.md`` + ``curve.png``
    (`respo.study.run_report`). While it runs, the run seeds the global torch, python and numpy RNGs
    and sets ``cfg.threads`` torch threads; all of them are restored on return.

    The run directory (`respo.train.checkpoint.prepare_run_dir`): a new run needs an empty or absent
    ``out_dir``; ``overwrite=True`` deletes a previous run's files first. ``resume=True`` continues
    from the newest checkpoint (verified: a corrupt one raises `CheckpointError`), bitwise identical
    to an uninterrupted run in sync mode on the CPU with fixed threads; only the settings in
    `respo.train.checkpoint.RESUMABLE` may differ from the run's (config.json records them under
    ``resumed``), any other difference raises `RunDirError`. A finished run is left untouched; a run
    stopped after its last checkpoint is finished without evaluating again.
    """
    validate(cfg)
    run_dir, ckpt_root = Path(cfg.out_dir), Path(cfg.out_dir) / "ckpt"
    with lock_run_dir(run_dir):
        ckpt = prepare_run_dir(run_dir, resume=resume, overwrite=overwrite)
        settings = config_to_dict(cfg)
        changes: dict[str, list] = {}
        if ckpt is not None:
            manifest = checkpoint_manifest(ckpt)
            changes = _check_resume(cfg, settings, manifest, run_dir)
            if _finished(run_dir, manifest["update"], cfg):
                verify_checkpoint(ckpt)
                print(f"[respo] {run_dir} holds a finished run ({cfg.updates} updates); nothing to do "
                      f"(raise --updates to continue it)", flush=True)
                return run_dir
        state = _run(cfg, run_dir, ckpt_root, ckpt, settings, changes)
        write_summary(run_dir, cfg, state.evals, state.update, state.dropped, state.wall_parts())
        if report:
            from respo.study.run_report import write_run_report  # matplotlib, loaded only when a run ends

            write_run_report(run_dir)
    return run_dir


def _run(cfg: TrainConfig, run_dir: Path, ckpt_root: Path, ckpt: Path | None, settings: dict,
         changes: dict[str, list]) -> RunState:
    """Build everything, load ``ckpt`` (if any), train up to ``cfg.updates`` and write final/; the run state."""
    part_start = time.perf_counter()
    with _global_state_restored():
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        _seed_all(cfg.seed)
        task = get_task(cfg.task, **cfg.task_kwargs)
        pool = task.examples("train", cfg.train_pool, cfg.seed)
        held_out = task.examples("test", cfg.eval_prompts, EVAL_SEED) if cfg.eval_prompts else []
        device = resolve_device(cfg.device)
        policy = load_run_policy(cfg)
        task, pool, held_out = render_for(policy.tokenizer, cfg.prompt_format, task, pool, held_out)  # chat or raw
        model = policy.model.to(device)  # a no-op on the CPU
        if cfg.routing_replay and not moe.is_moe(model):
            raise ConfigError(f"routing_replay needs a mixture-of-experts policy; {cfg.model!r} is dense")
        model.train()
        state = RunState(*make_optimizer(model, cfg), stream=PromptStream(pool, cfg.seed),
                         buffer=RolloutBuffer(cfg.mini_batch_seqs),
                         generator=torch.Generator(device=device).manual_seed(cfg.seed),
                         part_start=part_start)
        record = {**settings, "policy": policy.info, "prompt_rendering": getattr(task, "rendering", "raw")}
        if ckpt is not None:
            state.load(ckpt, model)
            record["resumed"] = _resumed_entries(run_dir, state.update, changes)
            if state.update < cfg.updates:  # the run goes on: what described its end no longer does
                for name in ENDING_ENTRIES:
                    path = run_dir / name
                    shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
                if "after" in state.evals:  # extending a finished run: its final evaluation becomes a periodic one
                    state.evals[f"update_{state.update}"] = state.evals.pop("after")
        (run_dir / "config.json").write_text(json.dumps(record, indent=1))
        log = MetricsLogger(run_dir, tensorboard=cfg.tensorboard, resume_update=state.update if ckpt else None)

        def evaluate(name: str) -> None:
            state.evals[name] = evaluate_held_out(policy, task, held_out, cfg)
            log.log({"event": "eval", "update": state.update, **eval_record(state.evals[name])})

        def checkpoint() -> None:
            state.save(ckpt_root, model, keep=cfg.keep_checkpoints, config=settings)

        if cfg.eval_before and held_out and "before" not in state.evals:
            evaluate("before")
        start_update = state.update
        source: MiniBatchSource
        if cfg.mode == "sync":
            source = SyncReuseSource(policy, task, pool, cfg, stream=state.stream, buffer=state.buffer,
                                     generator=state.generator)
        else:
            source = AsyncSource(policy, task, pool, cfg, stream=state.stream, version=state.version)
        try:
            with _StopOnSignal() as stop, _progress(cfg, state.update) as bar:
                while state.update < cfg.updates:
                    if stop.signum is not None:  # SIGINT/SIGTERM: stop at an update boundary with a checkpoint
                        checkpoint()
                        log.close()
                        print(f"[respo] signal {stop.signum}: checkpoint at update {state.update} written to "
                              f"{ckpt_root}; continue with --resume", flush=True)
                        raise KeyboardInterrupt(f"stopped by signal {stop.signum} at update {state.update}")
                    mb = source.next(state.version)
                    rec = dict(mb.metrics)
                    with timed(rec, "train"):
                        metrics, old_logp = update_step(model, state.optimizer, state.scheduler, mb.batch, cfg,
                                                        on_policy=mb.on_policy)
                    rec.update(metrics)
                    rec.update(batch_metrics(mb.batch, old_logp, state.version))
                    state.dropped += rec.get("dropped", 0)
                    state.update += 1
                    state.version += 1
                    source.after_update(model, state.update, state.version)
                    rec = log.log({"update": state.update, "version": state.version,
                                   "dropped_total": state.dropped, **rec})
                    bar.update(1)
                    bar.set_postfix(score=f"{rec['score']:.3f}", stale=f"{rec['staleness_mean']:.1f}")
                    if _due(cfg.eval_every, state.update, cfg.updates) and held_out:
                        evaluate(f"update_{state.update}")
                    if _due(cfg.checkpoint_every, state.update, cfg.updates):
                        checkpoint()
        finally:
            source.close()
        evaluated = bool(held_out) and "after" not in state.evals
        if evaluated:
            evaluate("after")
        if state.update > start_update or evaluated:  # the last checkpoint holds the final evaluation
            checkpoint()
        log.close()
        model.save_pretrained(run_dir / "final")
        policy.tokenizer.save_pretrained(run_dir / "final")
    return state


def _check_resume(cfg: TrainConfig, settings: dict, manifest: dict, run_dir: Path) -> dict[str, list]:
    """The settings changed since the checkpoint was written, ``{field: [old, new]}`` (all in `RESUMABLE`).

    The checkpoint's manifest records its settings; older checkpoints fall back on config.json.

    Raises:
        RunDirError: a setting that changes the experiment differs, or the run is already past ``cfg.updates``.
    """
    old = manifest.get("config")
    if old is None and (run_dir / "config.json").is_file():
        old = json.loads((run_dir / "config.json").read_text())
    changes = {}
    if old is None:
        print(f"[respo] --resume: {run_dir} records no settings for its checkpoint; they cannot be checked",
              flush=True)
    else:
        changes = resume_changes(old, settings, defaults=config_to_dict(TrainConfig()))
    if manifest["update"] > cfg.updates:
        raise RunDirError(f"--resume: the run in {str(run_dir)!r} is at update {manifest['update']}, past "
                          f"updates = {cfg.updates}; a run cannot be shortened (pass --updates "
                          f"{manifest['update']} or more)")
    return changes


def _finished(run_dir: Path, update: int, cfg: TrainConfig) -> bool:
    """The run ended: its last checkpoint is at ``cfg.updates`` and final/ and summary.json were written."""
    return update == cfg.updates and (run_dir / "final").is_dir() and (run_dir / "summary.json").is_file()


def _resumed_entries(run_dir: Path, update: int, changes: dict[str, list]) -> list[dict]:
    """config.json's ``resumed`` list plus this resume, ``{"update": U, field: [old, new], ...}``; entries
    of parts that left no checkpoint after ``update`` (killed before one) are dropped: this entry
    compares with the checkpoint's own settings."""
    path = run_dir / "config.json"
    earlier = json.loads(path.read_text()).get("resumed", []) if path.is_file() else []
    return [e for e in earlier if e.get("update", 0) < update] + [{"update": update, **changes}]


def _due(every: int, update: int, updates: int) -> bool:
    """A periodic event (every ``every`` updates, 0 = never) falls due, except at the last update."""
    return bool(every) and update % every == 0 and update < updates


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % NUMPY_SEED_RANGE)


@contextmanager
def _global_state_restored() -> Iterator[None]:
    """Put torch's thread count and the global torch/python/numpy RNG states back as they were."""
    threads, rng = torch.get_num_threads(), rng_state()
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        set_rng_state(rng)


class _StopOnSignal:
    """Turn SIGINT/SIGTERM into a flag the loop checks between updates (main thread only), so an
    interrupted run writes a consistent checkpoint instead of dying mid-update; a second signal stops at once."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self) -> "_StopOnSignal":
        self.signum = None
        self._old = {}
        if threading.current_thread() is threading.main_thread():
            self._old = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _progress(cfg: TrainConfig, initial: int) -> tqdm:
    return tqdm(total=cfg.updates, initial=initial, disable=not cfg.progress, desc=f"{cfg.objective} N={cfg.reuse}",
                unit="upd", dynamic_ncols=True)
