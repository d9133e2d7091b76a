"""The off-policy training loop: rollout -> old log-probs -> group advantages -> N mini-batch updates.

Read top to bottom: `train` is the whole run; the pieces it calls are small functions above it.

Synchronous mode (the paper's staleness, DESIGN.md section 2). One rollout step samples
N*B prompts x G responses with policy version v, recomputes ``old_logp`` with the same weights
(the same micro-batch shapes and the same module mode as the training forward, so at the first
update of a rollout step log W is exactly 0), computes group advantages, and takes one optimizer
step per mini-batch of B prompts: mini-batch k has staleness k - 1.

Asynchronous mode. A worker thread (`respo.train.async_`) samples B x G batches with a snapshot of
the policy and recomputes their ``old_logp`` with that same snapshot; the learner trains on them as
they arrive, syncs weights every ``sync_every`` updates and drops batches more than
``max_staleness`` versions behind.

Micro-batching: each mini-batch is processed in chunks of ``micro_batch`` sequences whose losses use
the mini-batch's token/sequence counts as normaliser (``global_tokens``/``global_seqs``), so the
summed gradients equal the whole mini-batch's gradient.
"""

from __future__ import annotations

import copy
import json
import random
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch

from respo.train.buffer import Batch, PromptStream, RolloutBuffer, staleness_stats
from respo.train.checkpoint import (latest_checkpoint, load_checkpoint, rng_state,
                                    save_checkpoint, set_rng_state)
from respo.train.config import TrainConfig, config_to_dict, validate
from respo.train.metrics import MetricsLogger, to_float
from respo.runtime.tasks import score_rollout

__all__ = ["train", "load_run_policy", "rollout_batch", "recompute_logp", "update_step", "Policy"]

EVAL_SEED = 1234  # held-out examples and eval sampling do not depend on the run seed


# ----------------------------------------------------------------------------------------------
# Policy loading
# ----------------------------------------------------------------------------------------------
class Policy:
    """The model, its tokenizer, and where they came from."""

    def __init__(self, model, tokenizer, info: dict):
        self.model, self.tokenizer, self.info = model, tokenizer, info


def load_run_policy(cfg: TrainConfig) -> Policy:
    """Preset + warm start (cached SFT), preset from scratch, or a local model directory."""
    from respo.runtime import models

    if cfg.model in models.PRESETS:
        if cfg.warm_start:
            from respo.runtime.sft import load_policy, warm_start

            ws = warm_start(cfg.task, cfg.model, cfg.cache_dir, seed=0, **_warm_kwargs(cfg))
            model, tok, info = load_policy(ws.path)
            return Policy(model, tok, {"source": "warm_start", "path": str(ws.path), **_jsonable(info)})
        from respo.runtime.tokenizer import build_char_tokenizer

        tok = build_char_tokenizer(_alphabet_for(cfg))
        model = models.build_policy(cfg.model, tok, seed=cfg.seed)
        return Policy(model, tok, {"source": "preset", "preset": cfg.model})
    path = Path(cfg.model)
    try:
        from respo.runtime.sft import load_policy

        model, tok, info = load_policy(path)
        return Policy(model, tok, {"source": "dir", "path": str(path), **_jsonable(info)})
    except (ImportError, FileNotFoundError, KeyError, ValueError, OSError):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = models.build_policy(path, tok)
        return Policy(model, tok, {"source": "dir", "path": str(path)})


def _warm_kwargs(cfg: TrainConfig) -> dict:
    """The warm start is trained on exactly the task the run trains on (same task kwargs; the overlong
    penalty only changes rewards, so it is left out of the warm-start cache key)."""
    return {"task_kwargs": {k: v for k, v in cfg.task_kwargs.items() if k != "overlong"}}


def _alphabet_for(cfg: TrainConfig) -> str:
    """The characters the run's task needs (as the warm start's SFT uses): arithmetic tasks keep the
    small arithmetic vocabulary, text tasks (reasoning_gym, math files) get printable text."""
    from respo.runtime.tasks import get_task

    return get_task(cfg.task, **cfg.task_kwargs).alphabet


def _jsonable(info: Any) -> dict:
    if info is None:
        return {}
    if not isinstance(info, dict):
        info = getattr(info, "__dict__", {"info": str(info)})
    return json.loads(json.dumps(info, default=str))


# ----------------------------------------------------------------------------------------------
# MoE hook points (respo.runtime.moe, when present)
# ----------------------------------------------------------------------------------------------
def _is_moe(model) -> bool:
    from respo.runtime import moe

    return moe.is_moe(model)


def _routing_ctx(model, batch: Batch, cfg: TrainConfig, record: bool):
    """Context for a forward over ``batch``: routing replay (MoE + ``routing_replay``), a routing
    recorder (MoE, to measure router shift), or nothing (dense models)."""
    if batch.routing is None:
        return nullcontext()
    from respo.runtime import moe

    if cfg.routing_replay:
        return moe.routing_replay(model, batch.routing)
    return moe.RoutingRecorder(model) if record else nullcontext()


def _current_routing(ctx, length: int):
    """Routing the current router would pick (replay: its natural choice; recorder: what it did)."""
    if hasattr(ctx, "router_routing"):
        return ctx.router_routing()
    if hasattr(ctx, "routing"):
        return ctx.routing(length=length)
    return None


# ----------------------------------------------------------------------------------------------
# Rollout
# ----------------------------------------------------------------------------------------------
@torch.no_grad()
def rollout_batch(policy: Policy, task, pool, indices: list[int], cfg: TrainConfig, generator: torch.Generator,
                  version: int) -> tuple[Batch, dict]:
    """Sample G responses for each example ``pool[i]``, score them, and compute group advantages.

    Returns:
        The batch (prompt-major, ``old_logp`` not yet computed) and sampling metrics.
    """
    from respo import group_advantages
    from respo.runtime.sampler import sample

    model, G = policy.model, cfg.group_size
    examples = [pool[i] for i in indices for _ in range(G)]
    recorder = nullcontext()
    if _is_moe(model):  # record the experts every sampled token used (router shift, routing replay)
        from respo.runtime.moe import RoutingRecorder

        recorder = RoutingRecorder(model)
    model.eval()
    t0 = time.perf_counter()
    with recorder:
        ro = sample(model, policy.tokenizer, [ex.prompt for ex in examples], max_new_tokens=cfg.max_new_tokens,
                    temperature=cfg.temperature, top_p=cfg.top_p, generator=generator, version=version)
    t_sample = time.perf_counter() - t0
    routing = recorder.routing(length=ro.input_ids.shape[1]) if hasattr(recorder, "routing") else None
    model.train()
    rewards = torch.tensor(score_rollout(task, ro, examples))  # (S,)
    adv = group_advantages(rewards, G, kind=cfg.adv_kind)  # (S,)
    batch = Batch(input_ids=ro.input_ids, attention_mask=ro.attention_mask, response_start=ro.response_start,
                  mask=ro.response_mask.float(), behaviour_logp=ro.behaviour_logp.float(), rewards=rewards,
                  version=torch.full((len(examples),), version, dtype=torch.long), adv=adv, routing=routing,
                  example_index=torch.tensor([i for i in indices for _ in range(G)], dtype=torch.long))
    return batch, {"time/sample": t_sample}


def _chunks(n_rows: int, micro: int):
    m = micro or n_rows
    return [(i, min(i + m, n_rows)) for i in range(0, n_rows, m)]


@torch.no_grad()
def recompute_logp(model, batch: Batch, cfg: TrainConfig, *, start_row: int = 0) -> torch.Tensor:
    """``old_logp``: the behaviour policy's log-probs recomputed by the trainer, (S, T).

    Uses exactly the chunking, trimming and module mode of `update_step`'s training forward (the
    model stays in ``train()``; the presets have no dropout), so a mini-batch trained before any
    update gets log W = 0 exactly. Micro-batch boundaries line up with mini-batch boundaries because
    ``micro_batch`` divides B*G.

    Rows before ``start_row`` are left at 0: the sync loop passes ``start_row = B*G`` because the
    first mini-batch is trained before any update, where ``old_logp`` equals the training forward's
    detached log-probs bitwise (tested), so `update_step(on_policy=True)` takes them from there and
    saves one forward pass per rollout step.
    """
    from respo.runtime.logprobs import token_logprobs

    model.train()
    old = torch.zeros_like(batch.mask)  # (S, T)
    if start_row % cfg.mini_batch_seqs:
        raise ValueError(f"start_row {start_row} is not a mini-batch boundary ({cfg.mini_batch_seqs} rows)")
    for mb_start in range(start_row, batch.size, cfg.mini_batch_seqs):
        for i, j in _chunks(min(cfg.mini_batch_seqs, batch.size - mb_start), cfg.micro_batch):
            mb = batch.rows(mb_start + i, mb_start + j).trimmed()
            with _routing_ctx(model, mb, cfg, record=False):
                logp, _ = token_logprobs(model, mb.input_ids, mb.attention_mask, mb.response_start,
                                         temperature=cfg.temperature)
            old[mb_start + i:mb_start + j, :logp.shape[1]] = logp * mb.mask  # (m, t)
    return old


# ----------------------------------------------------------------------------------------------
# One policy update
# ----------------------------------------------------------------------------------------------
def update_step(model, optimizer, scheduler, batch: Batch, cfg: TrainConfig, *, on_policy: bool = False) -> dict[str, Any]:
    """One optimizer step on one mini-batch (gradient accumulation over micro-batches).

    With ``on_policy=True`` (no update since the rollout) ``old_logp`` is the detached training
    forward itself (written into ``batch.old_logp``), identical to a recomputation.

    Returns:
        Metrics: loss, grad_norm, lr, entropy, and the core's diagnostics from ``policy_loss`` on
        the whole mini-batch (recomputed from the detached micro-batch log-probs).
    """
    from respo import policy_loss
    from respo.runtime.logprobs import token_logprobs

    model.train()
    optimizer.zero_grad(set_to_none=True)
    S, T = batch.mask.shape
    global_tokens = batch.mask.sum()  # 0-d
    global_seqs = S
    logp_all = torch.zeros(S, T)  # (S, T) detached, for diagnostics
    ent_sum = torch.zeros(())
    loss_total = torch.zeros(())
    nows = []  # MoE: the current router's experts per micro-batch
    for i, j in _chunks(S, cfg.micro_batch):
        mb = batch.rows(i, j).trimmed()
        with _routing_ctx(model, mb, cfg, record=True) as ctx:
            logp, ent = token_logprobs(model, mb.input_ids, mb.attention_mask, mb.response_start,
                                       temperature=cfg.temperature, with_entropy=True)
        if on_policy:
            mb.old_logp = logp.detach() * mb.mask  # (m, t) == recompute_logp's rows, bitwise
            batch.old_logp[i:j, :logp.shape[1]] = mb.old_logp
        if mb.routing is not None:
            nows.append(_current_routing(ctx, mb.input_ids.shape[1]))
        loss, _ = policy_loss(cfg.objective, logp, mb.old_logp, mb.adv, mb.mask,
                              loss_agg_mode=cfg.loss_agg_mode or None, global_tokens=global_tokens,
                              global_seqs=global_seqs, diagnostics=False, **cfg.objective_kwargs)
        loss.backward()
        loss_total += loss.detach()
        logp_all[i:j, :logp.shape[1]] = logp.detach() * mb.mask
        ent_sum += (ent.detach() * mb.mask).sum()
    max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    scheduler.step()
    with torch.no_grad():
        _, diag = policy_loss(cfg.objective, logp_all, batch.old_logp, batch.adv, batch.mask,
                              loss_agg_mode=cfg.loss_agg_mode or None, **cfg.objective_kwargs)
    out = {"loss": loss_total, "grad_norm": grad_norm, "lr": lr, "entropy": ent_sum / global_tokens.clamp_min(1)}
    out.update(diag)
    if nows:  # MoE: router shift since the rollout (overall, per layer) and the rollout's expert load
        from respo.runtime.moe import cat_routings, find_moe_layers, moe_metrics

        now = cat_routings(nows, length=batch.routing.shape[1])  # (S, L, n_layers, k)
        E = find_moe_layers(model)[0].num_experts
        out.update(moe_metrics(batch.routing, now, E, batch.mask, prefix=""))
    return out


def _batch_metrics(batch: Batch, version: int) -> dict[str, Any]:
    """Score, pass rate, length and staleness of a mini-batch."""
    s_mean, s_max = staleness_stats(batch.version, version)
    tokens = batch.mask.sum().clamp_min(1)
    mism = ((batch.old_logp - batch.behaviour_logp).abs() * batch.mask).sum() / tokens
    return {"score": ((batch.rewards + 1) / 2).mean(), "pass_rate": (batch.rewards > 0).float().mean(),
            "response_length": batch.mask.sum(1).mean(), "staleness_mean": s_mean, "staleness_max": s_max,
            "rollout_mismatch": mism}


# ----------------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------------
def _optimizer(model, cfg: TrainConfig):
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=tuple(cfg.adam_betas), eps=cfg.adam_eps,
                            weight_decay=cfg.weight_decay)
    warm = cfg.warmup
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: min(1.0, (u + 1) / warm) if warm else 1.0)
    return opt, sched


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def _evaluate(policy: Policy, task, examples, cfg: TrainConfig) -> dict:
    from respo.train.evaluate import evaluate_policy

    gen = torch.Generator().manual_seed(EVAL_SEED)
    return evaluate_policy(policy.model, policy.tokenizer, task, examples, k=cfg.eval_k,
                           max_new_tokens=cfg.max_new_tokens, temperature=1.0, generator=gen)


def _eval_record(ev: dict) -> dict:
    return {f"eval/{k}": v for k, v in ev.items() if not isinstance(v, list)}


def train(cfg: TrainConfig, *, resume: bool = False) -> Path:
    """Run one training job described by ``cfg``; return its run directory.

    Writes ``config.json``, ``metrics.jsonl`` (one record per update, plus ``eval`` records),
    ``summary.json`` (final and initial held-out evaluation, staleness reached, wall time) and
    checkpoints under ``ckpt/``. With ``resume=True`` the newest checkpoint is verified and loaded
    (a corrupt one raises `CheckpointError`); the result is bitwise identical to an uninterrupted run
    in sync mode on the CPU with fixed threads.
    """
    validate(cfg)
    from respo.runtime.tasks import get_task

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t_start = time.perf_counter()
    run_dir = Path(cfg.out_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt_root = run_dir / "ckpt"
    _seed_all(cfg.seed)
    task = get_task(cfg.task, **cfg.task_kwargs)
    pool = task.examples("train", cfg.train_pool, cfg.seed)
    held_out = task.examples("test", cfg.eval_prompts, EVAL_SEED) if cfg.eval_prompts else []
    policy = load_run_policy(cfg)
    model = policy.model
    if cfg.routing_replay and not _is_moe(model):
        from respo.train.config import ConfigError

        raise ConfigError(f"routing_replay needs a mixture-of-experts policy; {cfg.model!r} is dense")
    model.train()
    optimizer, scheduler = _optimizer(model, cfg)
    stream = PromptStream(pool, cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    buffer = RolloutBuffer(cfg.mini_batch_seqs)
    update, version, dropped_total = 0, 0, 0
    evals: dict[str, Any] = {}

    ckpt = latest_checkpoint(ckpt_root) if resume else None
    if resume and ckpt is None:
        print(f"[respo] --resume: no checkpoint under {ckpt_root}, starting from scratch")
    if ckpt is not None:
        state = load_checkpoint(ckpt, model)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"], gen)
        stream.load_state(state["cursor"])
        buffer.load_state(state["buffer"])
        update, version, dropped_total = state["update"], state["version"], state["dropped"]
        evals = state.get("evals", {})
    elif resume and (run_dir / "metrics.jsonl").exists():
        (run_dir / "metrics.jsonl").unlink()
    (run_dir / "config.json").write_text(json.dumps({**config_to_dict(cfg), "policy": policy.info}, indent=1))
    log = MetricsLogger(run_dir, tensorboard=cfg.tensorboard, resume_update=update if ckpt is not None else None)

    def checkpoint() -> None:
        state = {"update": update, "version": version, "dropped": dropped_total, "optimizer": optimizer.state_dict(),
                 "scheduler": scheduler.state_dict(), "rng": rng_state(gen), "cursor": stream.state(),
                 "buffer": buffer.state() if cfg.mode == "sync" else RolloutBuffer(cfg.mini_batch_seqs).state(),
                 "evals": evals}
        save_checkpoint(ckpt_root, update, model, state, keep=cfg.keep_checkpoints)

    if cfg.eval_before and held_out and "before" not in evals:
        evals["before"] = _evaluate(policy, task, held_out, cfg)
        log.log({"event": "eval", "update": update, **_eval_record(evals["before"])})

    worker = None
    if cfg.mode == "async":
        worker = _start_worker(policy, task, pool, stream, cfg, version)

    stop = _StopOnSignal()
    bar = _progress(cfg, update)
    try:
        while update < cfg.updates:
            if stop.signum is not None:  # SIGINT/SIGTERM: finish at an update boundary, checkpoint, exit
                checkpoint()
                log.close()
                print(f"[respo] signal {stop.signum}: checkpoint at update {update} written to {ckpt_root}; "
                      f"continue with --resume", flush=True)
                raise KeyboardInterrupt(f"stopped by signal {stop.signum} at update {update}")
            rec: dict[str, Any] = {}
            if cfg.mode == "sync":
                if not buffer.remaining:  # a new rollout step with the current policy (version v)
                    idx = stream.next(cfg.rollout_prompts)
                    batch, rec = rollout_batch(policy, task, pool, idx, cfg, gen, version)
                    t0 = time.perf_counter()
                    batch.old_logp = recompute_logp(model, batch, cfg, start_row=cfg.mini_batch_seqs)
                    rec["time/old_logp"] = time.perf_counter() - t0
                    buffer.put(batch)
                on_policy = buffer.next_index == 0  # first mini-batch: no update since the rollout
                mb = buffer.take()
            else:
                t0 = time.perf_counter()
                mb, dropped = worker.take(version)
                dropped_total += dropped
                rec["time/wait"] = time.perf_counter() - t0
                rec["dropped"] = dropped
                on_policy = False
            t0 = time.perf_counter()
            rec.update(update_step(model, optimizer, scheduler, mb, cfg, on_policy=on_policy))
            rec["time/train"] = time.perf_counter() - t0
            rec.update(_batch_metrics(mb, version))
            update += 1
            version += 1
            if worker is not None and update % cfg.sync_every == 0:
                worker.publish(model.state_dict(), version)
            rec = log.log({"update": update, "version": version, "dropped_total": dropped_total, **rec})
            bar.update(1)
            bar.set_postfix(score=f"{rec['score']:.3f}", stale=f"{rec['staleness_mean']:.1f}")
            if cfg.eval_every and update % cfg.eval_every == 0 and update < cfg.updates and held_out:
                ev = _evaluate(policy, task, held_out, cfg)
                evals[f"update_{update}"] = ev
                log.log({"event": "eval", "update": update, **_eval_record(ev)})
            if cfg.checkpoint_every and update % cfg.checkpoint_every == 0 and update < cfg.updates:
                checkpoint()
    finally:
        stop.restore()
        bar.close()
        if worker is not None:
            worker.stop()
    if held_out:
        evals["after"] = _evaluate(policy, task, held_out, cfg)
        log.log({"event": "eval", "update": update, **_eval_record(evals["after"])})
    checkpoint()
    log.close()
    model.save_pretrained(run_dir / "final")
    policy.tokenizer.save_pretrained(run_dir / "final")
    _write_summary(run_dir, cfg, evals, update, dropped_total, time.perf_counter() - t_start)
    return run_dir


class _StopOnSignal:
    """Turn SIGINT/SIGTERM into a flag the loop checks between updates (main thread only), so an
    interrupted run writes a consistent checkpoint instead of dying mid-update."""

    def __init__(self):
        import signal
        import threading

        self.signum = None
        self._old = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        if self.signum is not None:  # second signal: stop now
            raise KeyboardInterrupt
        self.signum = signum

    def restore(self):
        import signal

        for sig, old in self._old.items():
            signal.signal(sig, old)


def _write_summary(run_dir: Path, cfg: TrainConfig, evals: dict, update: int, dropped: int, wall: float) -> None:
    from respo.train.metrics import read_jsonl

    recs = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "event" not in r]
    scores = [r["score"] for r in recs if r.get("score") is not None]
    late = scores[-max(1, len(scores) // 8):] if scores else []
    summary = {
        "updates": update,
        "objective": cfg.objective,
        "reuse": cfg.reuse,
        "mode": cfg.mode,
        "lr": cfg.lr,
        "seed": cfg.seed,
        "staleness_mean": float(np.mean([r["staleness_mean"] for r in recs])) if recs else None,
        "staleness_max": max((r["staleness_max"] for r in recs), default=None),
        "dropped": dropped,
        "score_first": scores[0] if scores else None,
        "score_late_mean": float(np.mean(late)) if late else None,
        "eval_before": evals.get("before"),
        "eval_after": evals.get("after"),
        "evals": {k: v for k, v in evals.items() if k not in ("before", "after")},
        "wall_s": wall,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=to_float))


def _progress(cfg: TrainConfig, initial: int):
    from tqdm.auto import tqdm

    return tqdm(total=cfg.updates, initial=initial, disable=not cfg.progress, desc=f"{cfg.objective} N={cfg.reuse}",
                unit="upd", dynamic_ncols=True)


def _start_worker(policy: Policy, task, pool, stream: PromptStream, cfg: TrainConfig, version: int):
    """Async mode: a worker thread with its own snapshot model, generator and data cursor."""
    from respo.train.async_ import AsyncRollouts

    snap = Policy(copy.deepcopy(policy.model), policy.tokenizer, policy.info)
    snap.model.requires_grad_(False)
    gen = torch.Generator().manual_seed(cfg.seed + 1)

    def produce(v: int) -> Batch:
        idx = stream.next(cfg.prompts)
        batch, _ = rollout_batch(snap, task, pool, idx, cfg, gen, v)
        batch.old_logp = recompute_logp(snap.model, batch, cfg)
        return batch

    def load(state: dict) -> None:
        snap.model.load_state_dict(state)

    return AsyncRollouts(produce, load, queue_size=cfg.queue_size, max_staleness=cfg.max_staleness,
                         initial_version=version).start()
