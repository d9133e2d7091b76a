"""Warm start of a pretrained instruct model: SFT on a task's worked solutions, through the chat template.

A small instruct model asked a task's question through its chat template may solve almost none of
them at temperature 1 (SmolLM2-135M-Instruct: 0 of 32 two-digit additions), which leaves RL with no
signal. ``warm_start_pretrained`` fine-tunes it on the task's own natural-language demonstrations
(``Task.demonstration``; ``worded_addition`` writes them in many phrasings) with the SFT loop of every
warm start (`respo.runtime.sft.sft_loop`: loss on the response tokens only, EOS ``<|im_end|>``
included, AdamW with a short linear warm-up, stopping *partway* once the sampled pass rate on
``eval_prompts`` held-out prompts, measured every ``eval_every`` steps, reaches ``target_pass``). The
forward and backward run in ``dtype``: by default float32 on a CPU whose flags show bfloat16 emulated
(several times slower) and bfloat16 autocast elsewhere (`respo.runtime.precision.resolve_dtype`), the
resolved dtype being part of the settings and so of the cache key. The final pass rate and mean
response length are measured on ``eval_n`` other held-out prompts and stored with the model.

Cache layout (as for the preset warm start; one directory per settings hash)::

    cache_dir/<model>-<task>-<hash>/   save_pretrained model + tokenizer, respo_warm_start.json

``respo train --model <that directory>`` loads it as a warm start; ``respo train --model
smollm2-135m-instruct`` (warm start on, the default) builds or reuses it for the run's task.

Command line: ``respo sft --model smollm2-135m-instruct --task worded_addition --threads 1``.
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from .chat import ChatTask
from .precision import emulated_bf16_note, resolve_device, resolve_dtype
from .sampler import sample
from .sft import (DEFAULT_CACHE_DIR, INFO_FILE, build_cached, cache_path, check_settings, save_warm_start, settings_key,
                  sft_loop)
from .tasks import get_task, score_batch, task_defaults

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
    eval_every: int = 8  # also once any held-out sample passes: each step of a pretrained model is slow
    eval_prompts: int = 16
    eval_n: int = 64
    max_new_tokens: int | None = None  # None: the longest demonstration + 16
    # the SFT forward/backward: auto (float32 on a CPU whose flags show bfloat16 emulated, else bfloat16 autocast;
    # resolved before the key is taken, so the key names the dtype that computed it), bfloat16 or float32.
    # Sampling is float32.
    dtype: str = "auto"

    def key(self) -> str:
        """Stable 10-hex-digit hash of the settings (``dtype`` resolved: `warm_start_pretrained` does it)."""
        if self.dtype == "auto":
            raise ValueError("dtype 'auto' names no warm start: resolve it on the device first "
                             "(respo.runtime.precision.resolve_dtype)")
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
    """SFT of the model at ``source`` on the chat-rendered task's demonstrations (`sft_loop`); saved into
    ``out_dir``."""
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

    def next_batch() -> tuple[list[str], list[str]]:
        batch = rng.sample(pool, cfg.batch_size)
        return [ex.prompt for ex in batch], [task.demonstration(ex) for ex in batch]

    def evaluate(step: int) -> dict:
        ev = evaluate_sampled(model, tokenizer, task, eval_during, max_new_tokens=max_new, seed=cfg.seed + step)
        return {"sampled_pass": ev["pass"], "mean_len": round(ev["mean_len"], 1)}

    run = sft_loop(model, tokenizer, cfg, next_batch, evaluate, device=device, fine_eval_every=cfg.eval_every,
                   dtype=cfg.dtype, log=log, log_steps=True)
    final = evaluate_sampled(model, tokenizer, task, eval_final, max_new_tokens=max_new, seed=cfg.seed + 10**6)
    return save_warm_start(
        out_dir, model, tokenizer, cfg, run, device, pass_rate=final["pass"], max_new_tokens=max_new,
        source=str(source), prompt_format="chat", greedy_pass_rate=None, mean_response_tokens=final["mean_len"],
        cut_share=final["cut"], before={k: before[k] for k in ("pass", "mean_len", "cut", "n", "examples")},
        example_responses=final["examples"])


def warm_start_pretrained(model: str = "smollm2-135m-instruct", task_spec: str = DEFAULT_REAL_TASK,
                          cache_dir: str | Path = DEFAULT_CACHE_DIR, *, task_kwargs: dict | None = None,
                          force: bool = False, verbose: bool = True, device: str = "cpu", **config: Any) -> Path:
    """The cached warm-start directory for (model, task, settings), training it first if needed.

    Args:
        model: a packaged model name (``respo.runtime.packaged.PACKAGED``) or a local model directory.
        task_spec: a ``get_task`` spec whose task has demonstrations.
        device: where SFT and its evaluations run ("cpu", "cuda", "cuda:K", "auto"). Not part of the cache key
            (as for the preset warm start), except that a ``dtype`` of ``auto`` (the default) is resolved on it
            (`respo.runtime.precision.resolve_dtype`) before the key is taken: one built in the same dtype on
            either device serves runs on both; its info file records where it was built.
        **config: other ``PretrainedSFTConfig`` fields (lr, batch_size, max_steps, target_pass, ...).

    Raises:
        SFTSettingsError: a setting out of its range (`respo.runtime.sft.check_settings`), before anything is
            written.
    """
    from .packaged import is_packaged, resolve_packaged

    unknown = set(config) - set(PretrainedSFTConfig.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown pretrained warm-start settings: {sorted(unknown)}")
    task_kwargs = {**task_defaults(task_spec), **(task_kwargs or {})}
    cfg = PretrainedSFTConfig(model=str(model), task=task_spec, task_kwargs=task_kwargs, **config)
    on = resolve_device(device)
    cfg = replace(cfg, dtype=resolve_dtype(cfg.dtype, on))
    check_settings(cfg)
    note = emulated_bf16_note(cfg.dtype, on)
    if note:
        print(f"[respo] warm start of {cfg.model}: {note}", file=sys.stderr, flush=True)
    path = cache_path(cache_dir, cfg.model, task_spec, cfg.key())

    def train(tmp: Path, log) -> dict:
        source = resolve_packaged(cfg.model, cache_dir) if is_packaged(cfg.model) else Path(cfg.model)
        return _train(cfg, source, tmp, log, on)

    build_cached(path, cfg, train, force=force, verbose=verbose, what=f" of {cfg.model} on {task_spec}")
    return path


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
