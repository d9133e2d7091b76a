"""The off-policy training loop: rollout → advantages → update → log → evaluate → checkpoint.

`train` is one run: it checks and prepares the run directory (`respo.train.rundir`), `_setup` builds
what the run needs (task, policy, objective, optimizer and run state, resuming a checkpoint) and
`_loop` is the algorithm, each phase under its comment. Its components live next door: the policy
(`respo.train.policy`), the mini-batch sources, sync reuse-N or an async worker
(`respo.train.sources`), which sample and recompute ``old_logp`` (`respo.train.rollout`), one update
(`respo.train.update`), checkpoints and the run state (`respo.train.checkpoint`), held-out evaluation
(`respo.train.evaluate`) and metrics (`respo.train.metrics`).
"""

from __future__ import annotations

import dataclasses
import random
import signal
import sys
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from tqdm.auto import tqdm

from respo.core import group_advantages
from respo.errors import NonFiniteLogitsError, RespoError
from respo.runtime import moe
from respo.runtime.chat import render_for
from respo.runtime.engines import RolloutEngine, make_engine
from respo.runtime.precision import emulated_bf16_note, resolve_device
from respo.runtime.tasks import get_task
from respo.train.buffer import PromptStream, RolloutBuffer
from respo.train.checkpoint import RunState, checkpoint_manifest, rng_state, set_rng_state, verify_checkpoint
from respo.train.config import AsyncWorker, ConfigError, Rollouts, TrainConfig, config_to_dict, validate
from respo.train.forward import forward_path
from respo.train.evaluate import EVAL_SEED, eval_record, evaluate_held_out
from respo.train.metrics import MetricsLogger, batch_metrics, timed, write_summary
from respo.train.policy import Policy, load_run_policy
from respo.train.rundir import (check_resume, check_writable, finished, lock_run_dir, prepare_run_dir, read_record,
                                close_previous_end, reopen, resumed_entries, write_config)
from respo.train.sources import AsyncSource, MiniBatchSource, SyncReuseSource
from respo.train.update import UpdateSettings, make_optimizer, update_step

__all__ = ["train", "NonFiniteError"]

NUMPY_SEED_RANGE = 2**32  # numpy's legacy seeding takes seeds in [0, 2**32)


class NonFiniteError(RespoError, RuntimeError):
    """``max_nonfinite_steps`` updates in a row had a non-finite loss or gradient; the run stopped with a
    checkpoint of its last good state."""


def train(cfg: TrainConfig, *, resume: bool = False, overwrite: bool = False) -> Path:
    """Run one training job described by ``cfg``; return its run directory.

    Writes ``config.json``, ``metrics.jsonl`` (one record per update, plus ``eval`` records),
    ``summary.json`` (final and initial held-out evaluation, staleness reached, wall time),
    checkpoints under ``ckpt/`` and the trained policy under ``final/``; a report of the run is
    written from that directory afterwards (``respo train`` and ``respo demo`` do it with
    `respo.study.run_report.write_run_report`). While it runs, the run seeds the global torch, python
    and numpy RNGs and sets ``cfg.threads`` torch threads; all of them are restored on return.

    The run directory (`respo.train.rundir`): a path that cannot be a writable directory is refused
    before anything is written; a new run needs an empty or absent ``out_dir``; ``overwrite=True``
    deletes a previous run's files first. ``resume=True`` continues from the newest checkpoint (verified: a
    corrupt one raises `CheckpointError`), bitwise identical to an uninterrupted run in sync mode on
    the CPU with fixed threads; only the settings in `respo.train.rundir.RESUMABLE` may differ from
    the run's (config.json records them under ``resumed``), any other difference raises `RunDirError`.
    A finished run is left untouched; a run stopped after its last checkpoint is finished without
    evaluating again.

    An update whose loss or gradient is not finite is skipped (`respo.train.update.update_step`: the weights,
    the optimizer's moments and the learning-rate schedule stay as they were; the policy version does not
    advance) and recorded with ``skipped = 1``; after ``cfg.max_nonfinite_steps`` of them in a row the run
    writes a checkpoint (its weights those of the last applied update) and raises `NonFiniteError`.
    """
    validate(cfg)
    run_dir = Path(cfg.out_dir)
    check_writable(run_dir)
    with lock_run_dir(run_dir):
        ckpt = prepare_run_dir(run_dir, resume=resume, overwrite=overwrite)
        settings = config_to_dict(cfg)
        changes: dict[str, list] = {}
        if ckpt is not None:
            manifest = checkpoint_manifest(ckpt)
            changes = check_resume(run_dir, settings, config_to_dict(TrainConfig()), manifest, cfg.updates)
            if finished(run_dir, manifest["update"], cfg.updates):
                verify_checkpoint(ckpt)
                print(f"[respo] {run_dir} holds a finished run ({cfg.updates} updates); nothing to do "
                      f"(raise --updates to continue it)", flush=True)
                return run_dir
        part_start = time.perf_counter()
        with _global_state_restored():
            run = _setup(cfg, run_dir, ckpt, settings, changes, part_start)
            try:
                _loop(cfg, run)
            finally:
                run.engine.close()
        state = run.state
        write_summary(run_dir, cfg, state.evals, state.update, state.dropped, state.wall_parts(), waited=state.waited)
        close_previous_end(run_dir)  # the new final/ and summary.json exist: the end this run went past can go
    return run_dir


@dataclass
class _Run:
    """What the loop works with: the run's pieces, built once by `_setup`."""

    run_dir: Path
    cfg: TrainConfig
    settings: dict[str, Any]  # JSON-ready config, recorded in every checkpoint's manifest
    task: Any
    pool: list
    held_out: list
    policy: Policy
    update: UpdateSettings  # what each update reads, its objective built once
    rollouts: Rollouts  # what the mini-batch source reads
    state: RunState
    log: MetricsLogger
    engine: RolloutEngine  # samples the rollouts and evaluations (closed at the end of the loop)
    active: MiniBatchSource | None = None  # the loop's source while it runs (a checkpoint saves what it holds)

    def evaluate(self, name: str, source: MiniBatchSource | None = None) -> None:
        """Evaluate the learner's current weights, sampled by the run's engine (``source`` is the running
        rollout source, which hands the engine over; before and after the loop the engine is idle)."""
        model = self.policy.model
        engine = None if self.cfg.rollout_engine == "respo" else self.engine  # respo's sampler: the model itself
        with (source.evaluating(model) if source is not None and engine is not None else nullcontext()):
            if engine is not None and source is None:
                engine.sync_weights(model)
            self.state.evals[name] = evaluate_held_out(self.policy, self.task, self.held_out, self.cfg,
                                                       engine=engine)
        self.log.log({"event": "eval", "update": self.state.update, **eval_record(self.state.evals[name])})

    def checkpoint(self) -> None:
        source = self.active
        with source.checkpointing(self.state.version) if source is not None else nullcontext() as in_flight:
            if source is not None:
                self.state.rollouts = in_flight
            self.state.save(self.run_dir / "ckpt", self.policy.model, keep=self.cfg.keep_checkpoints,
                            config=self.settings)

    def skipped(self, metrics: dict) -> None:
        """An update whose loss or gradient was not finite was skipped: say so; after
        ``cfg.max_nonfinite_steps`` such updates in a row, checkpoint the last good state and stop."""
        state, limit = self.state, self.cfg.max_nonfinite_steps
        what = f"loss {float(metrics['loss']):.4g}, grad norm {float(metrics['grad_norm']):.4g}"
        print(f"[respo] update {state.update}: {what} not finite; step skipped ({state.skipped_in_a_row} of "
              f"max_nonfinite_steps = {limit} in a row)", flush=True)
        if state.skipped_in_a_row < limit:
            return
        self.checkpoint()
        self.log.close()
        ckpt = self.run_dir / "ckpt" / f"update-{state.update:06d}"
        raise NonFiniteError(
            f"non-finite gradient at update {state.update} (objective {self.cfg.objective}: {what}): {limit} updates "
            f"in a row skipped; the last good state (the weights after update {state.update - limit}) is checkpointed "
            f"in {ckpt}; lower --lr, set --grad-clip or check the objective's settings")

    def wrecked(self, what: str) -> None:
        """The policy after the last applied update cannot be trained or sampled (``what``): stop without
        checkpointing it, naming the newest checkpoint written before that update (the last good state); one
        written from the broken weights since is renamed ``broken-update-*``, which ``--resume`` does not take."""
        self.log.close()
        bad = self.state.update  # the weights after this update are the broken ones
        before = sorted(int(p.name.split("-")[1]) for p in (self.run_dir / "ckpt").glob("update-*") if p.is_dir())
        good = [u for u in before if u < bad]
        for u in before:  # written from the broken weights: kept, but out of --resume's way
            if u >= bad:
                ckpt = self.run_dir / "ckpt" / f"update-{u:06d}"
                ckpt.rename(ckpt.with_name(f"broken-{ckpt.name}"))
        moved = [u for u in before if u >= bad]
        what += f"; its checkpoint at update {', '.join(map(str, moved))} renamed broken-update-*" if moved else ""
        where = (f"the last good state is the checkpoint {self.run_dir / 'ckpt' / f'update-{good[-1]:06d}'} "
                 f"(update {good[-1]}); continue from it" if good else "no checkpoint from before it was kept; start "
                 "again")
        raise NonFiniteError(f"the policy after update {bad} is broken ({what}: a finite step at lr {self.cfg.lr:g} "
                             f"overflowed the weights; nothing of it was checkpointed); {where} with a lower --lr or "
                             "a --grad-clip")

    def stop(self, signum: int) -> None:
        """SIGINT/SIGTERM: checkpoint at this update boundary and stop."""
        self.checkpoint()
        self.log.close()
        print(f"[respo] signal {signum}: checkpoint at update {self.state.update} written to "
              f"{self.run_dir / 'ckpt'}; continue with --resume", flush=True)
        raise KeyboardInterrupt(f"stopped by signal {signum} at update {self.state.update}")

    def source(self) -> MiniBatchSource:
        cfg, state = self.cfg, self.state
        engine = self.engine
        if cfg.mode == "sync":
            return SyncReuseSource(self.policy, self.task, self.pool, self.rollouts, stream=state.stream,
                                   buffer=state.buffer, generator=state.generator, engine=engine)
        return AsyncSource(self.policy, self.task, self.pool, self.rollouts, AsyncWorker.of(cfg), stream=state.stream,
                           version=state.version, engine=engine, resume=state.rollouts)


def _setup(cfg: TrainConfig, run_dir: Path, ckpt: Path | None, settings: dict, changes: dict[str, list],
           part_start: float) -> _Run:
    """Seed, build the task, policy, objective, optimizer and run state, load ``ckpt`` (if any), write
    config.json and open the metrics log."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    _seed_all(cfg.seed)
    task = get_task(cfg.task, **cfg.task_kwargs)
    pool = task.examples("train", cfg.train_pool, cfg.seed)
    held_out = task.examples("test", cfg.eval_prompts, EVAL_SEED) if cfg.eval_prompts else []
    device = resolve_device(cfg.device)
    note = emulated_bf16_note(cfg.dtype, device)
    if note:
        print(f"[respo] dtype: {note}", file=sys.stderr, flush=True)
    policy = load_run_policy(cfg)
    task, pool, held_out = render_for(policy.tokenizer, cfg.prompt_format, task, pool, held_out)  # chat or raw
    model = policy.model.to(device)  # a no-op on the CPU
    if cfg.routing_replay and not moe.is_moe(model):
        raise ConfigError(f"routing_replay needs a mixture-of-experts policy; {cfg.model!r} is dense")
    model.train()
    update = UpdateSettings.of(cfg)  # its objective built here, once per run
    state = RunState(*make_optimizer(model, cfg), stream=PromptStream(pool, cfg.seed),
                     buffer=RolloutBuffer(cfg.mini_batch_seqs),
                     generator=torch.Generator(device=device).manual_seed(cfg.seed), part_start=part_start)
    engine = make_engine(cfg.rollout_engine, model, policy.tokenizer, dtype=cfg.dtype, engine_dtype=cfg.engine_dtype,
                         threads=cfg.engine_threads, verbose=cfg.progress)
    record = {**settings, "policy": policy.info, "prompt_rendering": getattr(task, "rendering", "raw"),
              "engine": engine.info, "forward": forward_path(model, update.forward)}
    if ckpt is not None:
        _check_same_start(run_dir, policy.info)
        state.load(ckpt, model)
        record["resumed"] = resumed_entries(run_dir, state.update, changes)
        if state.update < cfg.updates:  # the run goes on: what described its end no longer does
            reopen(run_dir)
            if "after" in state.evals:  # extending a finished run: its final evaluation becomes a periodic one
                state.evals[f"update_{state.update}"] = state.evals.pop("after")
    write_config(run_dir, record)
    log = MetricsLogger(run_dir, tensorboard=cfg.tensorboard, resume_update=state.update if ckpt else None)
    return _Run(run_dir, cfg, settings, task, pool, held_out, policy, update, Rollouts.of(cfg), state, log, engine)


def _check_same_start(run_dir: Path, info: dict) -> None:
    """A resumed run continues from its checkpoint, but its record names the policy it started from:
    refuse to resume when the starting policy's weights (``weights_sha256``) are not the ones this run
    recorded (a warm start rebuilt or replaced since), rather than record a start the run never had."""
    before = ((read_record(run_dir) or {}).get("policy") or {}).get("weights_sha256")
    now = info.get("weights_sha256")
    if before and now and before != now:
        where = info.get("path") or info.get("source")
        raise ConfigError(f"{run_dir}: the starting policy {where} is not the one this run started from "
                          f"(weights sha256 {now[:12]}, recorded {before[:12]}); resume with the original "
                          "policy, or start the run afresh in a new directory")


def _loop(cfg: TrainConfig, run: _Run) -> None:
    """Train up to ``cfg.updates``, then evaluate, checkpoint and write final/."""
    state, model = run.state, run.policy.model
    if cfg.eval_before and run.held_out and "before" not in state.evals:
        run.evaluate("before")
    start_update = state.update
    source = run.active = run.source()
    try:
        with _StopOnSignal() as stop, _progress(cfg, state.update) as bar:
            while state.update < cfg.updates:
                if stop.signum is not None:  # stop at an update boundary, with a checkpoint
                    run.stop(stop.signum)
                t_update = time.perf_counter()
                # -- rollout: B prompts x G responses sampled by policy version <= v, old_logp recomputed
                try:
                    mb = source.next(state.version)
                except NonFiniteLogitsError:
                    run.wrecked("its logits are not finite")
                rec = dict(mb.metrics)
                # -- advantages: group-relative, within each prompt's G responses
                adv = group_advantages(mb.batch.rewards, cfg.group_size, kind=cfg.adv_kind)  # (B*G,)
                batch = dataclasses.replace(mb.batch, adv=adv)
                # -- update: one optimizer step on the objective; policy version v -> v + 1
                with timed(rec, "train"):
                    metrics, old_logp = update_step(model, state.optimizer, state.scheduler, batch, run.update,
                                                    on_policy=mb.on_policy, version=state.version)
                rec.update(metrics)
                rec.update(batch_metrics(batch, old_logp, state.version))
                state.dropped += rec.get("dropped", 0)
                state.waited += rec.get("waited", 0)
                state.update += 1
                skipped = "skipped" in metrics  # a non-finite loss or gradient: the weights did not change
                state.version += 0 if skipped else 1
                state.skipped_in_a_row = state.skipped_in_a_row + 1 if skipped else 0
                source.after_update(model, state.update, state.version)
                # the update's wall time, waits included (in async mode the phases overlap: no sum of them is it)
                rec["time/update"] = time.perf_counter() - t_update
                # -- log: one metrics.jsonl record per update
                rec = run.log.log({"update": state.update, "version": state.version,
                                   "dropped_total": state.dropped,
                                   **({"waited_total": state.waited} if cfg.mode == "async" else {}), **rec})
                if skipped:
                    run.skipped(metrics)
                if "nonfinite_weights" in metrics:
                    run.wrecked("a weight is not finite")
                bar.update(1)
                bar.set_postfix(score=f"{rec['score']:.3f}", stale=f"{rec['staleness_mean']:.1f}")
                # -- evaluate, checkpoint: when due
                if _due(cfg.eval_every, state.update, cfg.updates) and run.held_out:
                    run.evaluate(f"update_{state.update}", source)
                if _due(cfg.checkpoint_every, state.update, cfg.updates):
                    run.checkpoint()
        _keep_in_flight(source, state)
    finally:
        run.active = None
        source.close()
    # -- the end: final evaluation, the last checkpoint (it holds that evaluation), the trained policy
    evaluated = bool(run.held_out) and "after" not in state.evals
    if evaluated:
        run.evaluate("after")
    if state.update > start_update or evaluated:
        run.checkpoint()
    run.log.close()
    model.save_pretrained(run.run_dir / "final")
    run.policy.tokenizer.save_pretrained(run.run_dir / "final")


def _keep_in_flight(source: MiniBatchSource, state: RunState) -> None:
    """What the source has in flight at the end of the loop, for the last checkpoint (an extension of the run
    resumes it); the source is closed while it is held, so the data cursor stays where those batches left it.
    A worker that failed after its last batch was taken leaves nothing to resume: said, and the extension's
    worker starts afresh."""
    try:
        with source.checkpointing(state.version) as in_flight:
            state.rollouts = in_flight
            source.close()
    except RuntimeError as err:
        state.rollouts = None
        print(f"[respo] the rollout worker failed after the last update ({err.__cause__ or err}); the last checkpoint "
              "holds no in-flight batches, and an extension of this run starts its worker afresh", file=sys.stderr,
              flush=True)


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
