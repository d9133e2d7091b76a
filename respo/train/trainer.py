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
import signal
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from tqdm.auto import tqdm

from respo.runtime import moe
from respo.runtime.tasks import get_task
from respo.train.buffer import PromptStream, RolloutBuffer
from respo.train.checkpoint import RunState, latest_checkpoint, rng_state, set_rng_state
from respo.train.config import ConfigError, TrainConfig, config_to_dict, validate
from respo.train.evaluate import EVAL_SEED, eval_record, evaluate_held_out
from respo.train.metrics import MetricsLogger, timed, write_summary
from respo.train.policy import Policy, load_run_policy
from respo.train.sources import AsyncSource, MiniBatchSource, SyncReuseSource
from respo.train.step import batch_metrics, make_optimizer, recompute_logp, rollout_batch, update_step

__all__ = ["train", "load_run_policy", "rollout_batch", "recompute_logp", "update_step", "make_optimizer", "Policy",
           "EVAL_SEED"]

NUMPY_SEED_RANGE = 2**32  # numpy's legacy seeding takes seeds in [0, 2**32)



def train(cfg: TrainConfig, *, resume: bool = False) -> Path:
    """Run one training job described by ``cfg``; return its run directory.

    Writes ``config.json``, ``metrics.jsonl`` (one record per update, plus ``eval`` records),
    ``summary.json`` (final and initial held-out evaluation, staleness reached, wall time) and
    checkpoints under ``ckpt/``. With ``resume=True`` the newest checkpoint is verified and loaded
    (a corrupt one raises `CheckpointError`); the result is bitwise identical to an uninterrupted run
    in sync mode on the CPU with fixed threads. While it runs, the run seeds the global torch, python
    and numpy RNGs and sets ``cfg.threads`` torch threads; all of them are restored on return.
    """
    validate(cfg)
    run: dict[str, float] = {}
    with timed(run, "wall"), _global_state_restored():
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        _seed_all(cfg.seed)
        run_dir, ckpt_root = Path(cfg.out_dir), Path(cfg.out_dir) / "ckpt"
        run_dir.mkdir(parents=True, exist_ok=True)
        task = get_task(cfg.task, **cfg.task_kwargs)
        pool = task.examples("train", cfg.train_pool, cfg.seed)
        held_out = task.examples("test", cfg.eval_prompts, EVAL_SEED) if cfg.eval_prompts else []
        policy = load_run_policy(cfg)
        model = policy.model
        if cfg.routing_replay and not moe.is_moe(model):
            raise ConfigError(f"routing_replay needs a mixture-of-experts policy; {cfg.model!r} is dense")
        model.train()
        state = RunState(*make_optimizer(model, cfg), stream=PromptStream(pool, cfg.seed),
                         buffer=RolloutBuffer(cfg.mini_batch_seqs), generator=torch.Generator().manual_seed(cfg.seed))
        resumed = _resume(state, model, run_dir, ckpt_root) if resume else False
        (run_dir / "config.json").write_text(json.dumps({**config_to_dict(cfg), "policy": policy.info}, indent=1))
        log = MetricsLogger(run_dir, tensorboard=cfg.tensorboard, resume_update=state.update if resumed else None)

        def evaluate(name: str) -> None:
            state.evals[name] = evaluate_held_out(policy, task, held_out, cfg)
            log.log({"event": "eval", "update": state.update, **eval_record(state.evals[name])})

        if cfg.eval_before and held_out and "before" not in state.evals:
            evaluate("before")
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
                        state.save(ckpt_root, model, keep=cfg.keep_checkpoints)
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
                        state.save(ckpt_root, model, keep=cfg.keep_checkpoints)
        finally:
            source.close()
        if held_out:
            evaluate("after")
        state.save(ckpt_root, model, keep=cfg.keep_checkpoints)
        log.close()
        model.save_pretrained(run_dir / "final")
        policy.tokenizer.save_pretrained(run_dir / "final")
    write_summary(run_dir, cfg, state.evals, state.update, state.dropped, run["time/wall"])
    return run_dir


def _resume(state: RunState, model: torch.nn.Module, run_dir: Path, ckpt_root: Path) -> bool:
    """Load the newest checkpoint into ``model`` and ``state``; False (and a fresh metrics file) when there is none."""
    ckpt = latest_checkpoint(ckpt_root)
    if ckpt is None:
        print(f"[respo] --resume: no checkpoint under {ckpt_root}, starting from scratch")
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
        return False
    state.load(ckpt, model)
    return True


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
