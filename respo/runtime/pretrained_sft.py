"""Warm start of a pretrained instruct model: SFT on a task's worked solutions, through the chat template.

A small instruct model asked a task's question through its chat template may solve almost none of
them at temperature 1 (SmolLM2-135M-Instruct: 0 of 32 two-digit additions), which leaves RL with no
signal. ``warm_start_pretrained`` fine-tunes it on the task's own natural-language demonstrations
(``Task.demonstration``; ``worded_addition`` writes them in many phrasings), with the loss on the
response tokens only (EOS ``<|im_end|>`` included), AdamW with a short linear warm-up, and stops
*partway*, as the preset warm start does: every ``eval_every`` steps it samples at temperature 1 on
``eval_prompts`` held-out prompts and stops once the sampled pass rate reaches ``target_pass`` (or
at ``max_steps`` / ``max_seconds``). The final pass rate and mean response length are measured on
``eval_n`` other held-out prompts and stored with the model.

Cache layout (one directory per settings hash; a directory with ``respo_warm_start.json`` is
complete, written atomically)::

    cache_dir/<model>-<task>-<hash>/   save_pretrained model + tokenizer, respo_warm_start.json

``respo train --model <that directory>`` loads it as a warm start; ``respo train --model
smollm2-135m-instruct`` (warm start on, the default) builds or reuses it for the run's task.

Command line::

    python -m respo.runtime.pretrained_sft --model smollm2-135m-instruct --task worded_addition --threads 1
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .chat import ChatTask
from .precision import mixed_precision, resolve_device
from .sampler import sample
from .sft import INFO_FILE, build_atomically, built_on, cache_path, encode_pairs, settings_key, sft_loss
from .tasks import get_task, load_task, score_batch, task_defaults
from .tasks.args import TASK_KWARGS_HELP, add_task_kwargs_arguments

__all__ = ["PretrainedSFTConfig", "warm_start_pretrained", "load_pretrained", "load_packaged_policy", "evaluate_sampled",
           "DEFAULT_REAL_TASK"]

DEFAULT_REAL_TASK = "worded_addition"


@dataclass(frozen=True)
class PretrainedSFTConfig:
    """Everything that determines a warm-started pretrained policy (its hash names the cache directory)."""

    model: str = "smollm2-135m-instruct"
    task: str = DEFAULT_REAL_TASK
    task_kwargs: dict = field(default_factory=dict)
    seed: int = 0
    lr: float = 3e-5
    weight_decay: float = 0.0
    warmup_steps: int = 5
    batch_size: int = 8
    max_steps: int = 60
    max_seconds: float | None = None
    target_pass: float = 0.35
    eval_every: int = 8
    eval_prompts: int = 16
    eval_n: int = 64
    max_new_tokens: int | None = None  # None: the longest demonstration + 16
    dtype: str = "bfloat16"  # the SFT forward/backward (autocast, float32 master weights); sampling is float32

    def key(self) -> str:
        """Stable 10-hex-digit hash of the settings."""
        return settings_key(self)


def load_pretrained(path: str | Path, *, dtype: torch.dtype = torch.float32):
    """``(model, tokenizer)`` from a Hugging Face directory; left padding; the model in eval mode."""
    from transformers import AutoTokenizer

    from .models import build_policy

    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    tokenizer.padding_side = "left"
    return build_policy(path, tokenizer, dtype=dtype), tokenizer


@torch.no_grad()
def evaluate_sampled(model, tokenizer, task, examples, *, max_new_tokens: int, temperature: float = 1.0,
                     seed: int = 0, batch_rows: int = 32, keep: int = 3) -> dict[str, Any]:
    """Sampled pass rate (fraction of +1 rewards), mean response length in tokens (EOS included), the share
    of responses cut at ``max_new_tokens``, and ``keep`` example responses."""
    was_training = model.training
    model.eval()
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    rewards, lengths, cut, shown = [], [], 0, []
    for i in range(0, len(examples), batch_rows):
        chunk = examples[i : i + batch_rows]
        ro = sample(model, tokenizer, [ex.prompt for ex in chunk], max_new_tokens=max_new_tokens,
                    temperature=temperature, generator=g)
        rewards += score_batch(task, ro.responses, chunk, finished=ro.finished.tolist())
        lengths += ro.response_lengths.tolist()
        cut += int((~ro.finished).sum())
        shown += ro.responses[: max(0, keep - len(shown))]
    model.train(was_training)
    n = max(len(rewards), 1)
    return {"pass": sum(r > 0 for r in rewards) / n, "mean_len": sum(lengths) / n, "cut": cut / n,
            "n": len(rewards), "examples": shown}


def _train(cfg: PretrainedSFTConfig, source: Path, out_dir: Path, log, device: torch.device) -> dict:
    model, tokenizer = load_pretrained(source)
    model.to(device)
    task = ChatTask(get_task(cfg.task, **cfg.task_kwargs), tokenizer)
    rng = random.Random(f"pretrained-sft|{cfg.seed}")
    pool = task.examples("train", cfg.batch_size * 100, seed=cfg.seed)
    eval_during = task.examples("test", cfg.eval_prompts, seed=cfg.seed + 1)
    eval_final = task.examples("test", cfg.eval_n, seed=cfg.seed + 2)
    demo_tokens = max(len(tokenizer(task.demonstration(ex), add_special_tokens=False)["input_ids"]) for ex in pool[:256])
    max_new = cfg.max_new_tokens or demo_tokens + 16
    before = evaluate_sampled(model, tokenizer, task, eval_during, max_new_tokens=max_new, seed=cfg.seed)
    log(f"before SFT: sampled pass {before['pass']:.3f}, mean length {before['mean_len']:.1f}, cut {before['cut']:.2f}")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(cfg.warmup_steps, 1)))
    history, t0, step, stopped_by, tokens = [], time.perf_counter(), 0, "max_steps", 0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        while step < cfg.max_steps:
            batch = rng.sample(pool, cfg.batch_size)
            ids, attn, P, mask = encode_pairs(tokenizer, [ex.prompt for ex in batch],
                                              [task.demonstration(ex) for ex in batch])
            with mixed_precision(model, cfg.dtype):
                loss = sft_loss(model, ids.to(device), attn.to(device), P, mask.to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            tokens += int(attn.sum())
            elapsed = time.perf_counter() - t0
            out_of_time = cfg.max_seconds is not None and elapsed > cfg.max_seconds
            log(f"sft step {step} loss {loss.item():.4f} ({elapsed:.0f}s)")
            if step % cfg.eval_every == 0 or out_of_time or step == cfg.max_steps:
                ev = evaluate_sampled(model, tokenizer, task, eval_during, max_new_tokens=max_new, seed=cfg.seed + step)
                history.append({"step": step, "loss": round(loss.item(), 5), "sampled_pass": ev["pass"],
                                "mean_len": round(ev["mean_len"], 1), "seconds": round(time.perf_counter() - t0, 1)})
                log(f"sft step {step}: sampled pass {ev['pass']:.3f}, mean length {ev['mean_len']:.1f} "
                    f"({time.perf_counter() - t0:.0f}s)")
                if ev["pass"] >= cfg.target_pass:
                    stopped_by = "target"
                    break
                if out_of_time:
                    stopped_by = "max_seconds"
                    break
    train_seconds = time.perf_counter() - t0
    t1 = time.perf_counter()
    final = evaluate_sampled(model, tokenizer, task, eval_final, max_new_tokens=max_new, seed=cfg.seed + 10**6)
    model.eval()
    model.to("cpu")  # saved and reloaded from the CPU, wherever it was trained
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    info = {
        "config": asdict(cfg), "key": cfg.key(), "source": str(source), "prompt_format": "chat",
        "pass_rate": final["pass"], "greedy_pass_rate": None,
        "mean_response_tokens": final["mean_len"], "cut_share": final["cut"],
        "pass_rate_measured_on": f"{cfg.eval_n} held-out prompts, one sample each, temperature 1",
        "before": {k: before[k] for k in ("pass", "mean_len", "cut", "n", "examples")},
        "example_responses": final["examples"],
        "steps": step, "stopped_by": stopped_by, "in_band": 0.15 <= final["pass"] <= 0.6,
        "train_seconds": round(train_seconds, 1), "final_eval_seconds": round(time.perf_counter() - t1, 1),
        "train_tokens": tokens, "max_new_tokens": max_new, "torch_threads": torch.get_num_threads(),
        "device": str(device), "built_on": built_on(device), "history": history,
    }
    (out_dir / INFO_FILE).write_text(json.dumps(info, indent=1))
    return info


def warm_start_pretrained(model: str = "smollm2-135m-instruct", task_spec: str = DEFAULT_REAL_TASK,
                          cache_dir: str | Path = ".cache/respo", *, task_kwargs: dict | None = None,
                          force: bool = False, verbose: bool = True, device: str = "cpu", **config: Any) -> Path:
    """The cached warm-start directory for (model, task, settings), training it first if needed.

    Args:
        model: a packaged model name (``respo.runtime.packaged.PACKAGED``) or a local model directory.
        task_spec: a ``get_task`` spec whose task has demonstrations.
        device: where SFT and its evaluations run ("cpu", "cuda", "cuda:K", "auto"). Not part of the cache key
            (as for the preset warm start): one built on either device serves runs on both; its info file
            records where it was built.
        **config: other ``PretrainedSFTConfig`` fields (lr, batch_size, max_steps, target_pass, ...).
    """
    from .packaged import is_packaged, resolve_packaged

    unknown = set(config) - set(PretrainedSFTConfig.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown pretrained warm-start settings: {sorted(unknown)}")
    task_kwargs = {**task_defaults(task_spec), **(task_kwargs or {})}
    cfg = PretrainedSFTConfig(model=str(model), task=task_spec, task_kwargs=task_kwargs, **config)
    path = cache_path(cache_dir, cfg.model, task_spec, cfg.key())
    if (path / INFO_FILE).is_file() and not force:
        return path
    source = resolve_packaged(cfg.model, cache_dir) if is_packaged(cfg.model) else Path(cfg.model)
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if verbose else (lambda *_: None)
    print(f"warm start: building {path} by SFT of {cfg.model} on {task_spec} (up to {cfg.max_steps} steps)",
          file=sys.stderr, flush=True)
    info = build_atomically(path, lambda tmp: _train(cfg, source, tmp, log, resolve_device(device)))
    if not info["in_band"]:
        print(f"warm start {path.name}: sampled pass rate {info['pass_rate']:.3f} is outside [0.15, 0.6] "
              f"(stopped by {info['stopped_by']} after {info['steps']} steps)", file=sys.stderr, flush=True)
    return path


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(prog="python -m respo.runtime.pretrained_sft", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="packaged model name or local directory")
    ap.add_argument("--task", default=DEFAULT_REAL_TASK)
    add_task_kwargs_arguments(ap, TASK_KWARGS_HELP)
    ap.add_argument("--cache-dir", default=".cache/respo")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--force", action="store_true")
    defaults = PretrainedSFTConfig()
    for name, f in PretrainedSFTConfig.__dataclass_fields__.items():
        if name in ("model", "task", "task_kwargs"):
            continue
        kind = {"int": int, "float": float, "int | None": int, "float | None": float}.get(str(f.type), str)
        ap.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None,
                        help=f"default: {getattr(defaults, name)}")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    load_task(args.task, args.task_kwargs)
    overrides = {n: getattr(args, n) for n in PretrainedSFTConfig.__dataclass_fields__
                 if n not in ("model", "task", "task_kwargs") and getattr(args, n, None) is not None}
    path = warm_start_pretrained(args.model, args.task, args.cache_dir, task_kwargs=args.task_kwargs,
                                 force=args.force, **overrides)
    info = json.loads((path / INFO_FILE).read_text())
    print(json.dumps({"path": str(path), **{k: info[k] for k in ("pass_rate", "mean_response_tokens", "steps",
                                                               "stopped_by", "train_seconds")}}))
    return path


if __name__ == "__main__":
    main()


def load_packaged_policy(name: str, task_spec: str, task_kwargs: dict, cache_dir: str | Path, *,
                         warm_start: bool = True, sft_kwargs: dict | None = None, verbose: bool = True,
                         device: str = "cpu"):
    """``(model, tokenizer, info)`` for packaged model ``name``: its cached warm start on the task (built first if
    needed, on ``device``) or, with ``warm_start=False``, the converted checkpoint as shipped. The model is returned
    on the CPU."""
    from .packaged import resolve_packaged

    if warm_start:
        path = warm_start_pretrained(name, task_spec, cache_dir, task_kwargs=task_kwargs, verbose=verbose,
                                     device=device, **(sft_kwargs or {}))
        model, tokenizer = load_pretrained(path)
        info = json.loads((path / INFO_FILE).read_text())
        return model, tokenizer, {"source": "warm_start", "packaged": name, "path": str(path), **info}
    path = resolve_packaged(name, cache_dir, verbose=verbose)
    model, tokenizer = load_pretrained(path)
    return model, tokenizer, {"source": "packaged", "packaged": name, "path": str(path)}
