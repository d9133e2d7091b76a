"""Warm start: supervised fine-tuning on task demonstrations to a measured, mid-range pass rate.

RL needs a base policy that is neither hopeless nor saturated (`PASS_BAND`). One SFT loop,
`sft_loop`, serves both kinds of warm start: a character preset built from random weights
(``warm_start``, here) and a pretrained instruct model prompted through its chat template
(``respo.runtime.pretrained_sft``). It trains on the task's demonstrations with cross-entropy on
the response tokens (EOS included) and stops *partway*: it samples at temperature 1 on held-out
prompts every ``eval_every`` steps (every ``fine_eval_every`` once any of them passes) and stops as
soon as the sampled pass rate reaches ``target_pass`` (or at ``max_steps`` / ``max_seconds``). The
final pass rate is then measured on ``eval_n`` other held-out prompts with the sampler at
temperature 1 and stored with the model. For presets, optional demonstration noise (``noise``: the
fraction of demonstrations with one character replaced) makes the policy less certain.

Sampled accuracy, not greedy accuracy, is what RL sees as reward, and the two differ widely (in
the table below greedy accuracy is about twice the sampled one). Both are recorded.

Cache layout (one directory per settings hash, reused by later calls; a directory holding the info
file is complete, written atomically)::

    cache_dir/<preset or model>-<task>-<hash>/
        config.json, model.safetensors, generation_config.json   (save_pretrained)
        tokenizer.json, tokenizer_config.json, ...                (save_pretrained)
        respo_warm_start.json  (settings, pass rates, timings, eval history)

Command line: ``respo sft --preset tiny-dense --threads 1`` (caches under .cache/respo, where
``respo train`` looks); ``respo sft --model smollm2-135m-instruct --task worded_addition`` for the
pretrained warm start. ``--record FILE`` also writes the warm start's record (see ``respo.cli``).

Measured with the defaults (5-digit scratchpad addition, 32-token responses, batch 64, AdamW
1e-3, target 0.3; one torch thread, one seed):

    preset      steps  train s  sampled pass (512 held-out)  greedy pass
    tiny-dense    245       87                        0.414        0.893
    tiny-moe      295       87                        0.293        0.580

The sampled pass rate climbs steeply once the scratchpad is learnt (dense: 0.09, 0.21, 0.29,
0.41 at steps 230-245), hence the finer evaluations near the target.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import random
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

import torch

from .logprobs import token_logprobs
from .models import PRESETS, build_policy
from .precision import DTYPES, cpuinfo_field, mixed_precision, resolve_device
from .sampler import sample
from respo.errors import RespoError

from .tasks import Task, get_task, score_batch, task_defaults
from .tokenizer import build_char_tokenizer

__all__ = ["SFTConfig", "WarmStart", "SFTRun", "SFTSettingsError", "warm_start", "load_policy", "sft_loop",
           "check_settings", "build_cached", "encode_pairs", "sft_loss", "measure_pass_rate", "PASS_BAND",
           "INFO_FILE", "DEFAULT_CACHE_DIR", "DEFAULT_TASK", "DEFAULT_TASK_KWARGS"]

INFO_FILE = "respo_warm_start.json"
#: The sampled pass rate RL wants from a base policy, for presets and pretrained models alike: a warm start
#: outside it is built all the same, with a warning. Below 0.15, with G = 8 responses per prompt, over a quarter
#: of the groups are all wrong (0.85^8 = 0.27) and carry no group-relative signal; above 0.6 the policy has less
#: than 0.4 left to gain and the study's late windows crowd against the ceiling. Every warm start the reports
#: start from lies inside it (sampled pass 0.27 to 0.56).
PASS_BAND = (0.15, 0.6)
DEFAULT_TASK = "addition"
#: Where warm starts are cached; ``respo train``'s ``cache_dir`` has the same default, so both find them.
DEFAULT_CACHE_DIR = ".cache/respo"
#: 5-digit scratchpad addition: 31 response characters + EOS = 32 tokens.
DEFAULT_TASK_KWARGS: dict[str, Any] = {"digits": 5, "scratchpad": True}


class SFTSettingsError(RespoError, ValueError):
    """A warm-start setting out of its range (the message names it and the range)."""


@dataclass(frozen=True)
class SFTConfig:
    """Everything that determines a warm-started preset (its hash names the cache directory)."""

    task: str = DEFAULT_TASK
    task_kwargs: dict = field(default_factory=lambda: dict(DEFAULT_TASK_KWARGS))
    preset: str = "tiny-dense"
    seed: int = 0
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 20
    batch_size: int = 64
    max_steps: int = 1500
    max_seconds: float | None = None  # wall-clock cap; None keeps the result machine-independent
    noise: float = 0.0
    target_pass: float = 0.3
    eval_every: int = 25
    fine_eval_every: int = 5  # once any held-out sample passes
    eval_prompts: int = 128
    eval_n: int = 512
    max_new_tokens: int | None = None  # None: the longest demonstration + 8
    model_overrides: dict = field(default_factory=dict)

    def key(self) -> str:
        """Stable 10-hex-digit hash of the settings."""
        return settings_key(self)


@dataclass
class WarmStart:
    """A cached base policy and what was measured on it."""

    path: Path
    pass_rate: float  # sampled (temperature 1) held-out pass rate, normalised (r+1)/2 with r = ±1
    greedy_pass_rate: float
    steps: int
    train_seconds: float
    reused: bool
    config: dict
    history: list = field(default_factory=list)
    stopped_by: str = ""  # "target", "max_steps" or "max_seconds"


def settings_key(cfg) -> str:
    """Stable 10-hex-digit hash of a settings dataclass (it names the warm start's cache directory)."""
    blob = json.dumps(asdict(cfg), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


#: The range of each numeric warm-start setting (of either settings class): its test and the range in words.
_RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "lr": (lambda v: v > 0, "> 0"),
    "weight_decay": (lambda v: v >= 0, ">= 0"),
    "warmup_steps": (lambda v: v >= 0, ">= 0"),
    "batch_size": (lambda v: v >= 1, ">= 1"),
    "max_steps": (lambda v: v >= 1, ">= 1"),
    "max_seconds": (lambda v: v > 0, "> 0 (or unset)"),
    "noise": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "target_pass": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "eval_every": (lambda v: v >= 1, ">= 1"),
    "fine_eval_every": (lambda v: v >= 1, ">= 1"),
    "eval_prompts": (lambda v: v >= 1, ">= 1"),
    "eval_n": (lambda v: v >= 1, ">= 1"),
    "max_new_tokens": (lambda v: v >= 1, ">= 1 (or unset)"),
    "seed": (lambda v: v >= 0, ">= 0"),
}


def check_settings(cfg) -> None:
    """Refuse warm-start settings (an `SFTConfig` or ``PretrainedSFTConfig``) that cannot train, before anything is
    built: one `SFTSettingsError` naming the first bad setting and its range. A number must be finite and in its
    `_RANGES` range (``max_seconds`` and ``max_new_tokens`` may be unset); a preset must be one of ``PRESETS``, a
    dtype one of ``DTYPES``."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if f.name not in _RANGES or value is None:
            continue
        test, bound = _RANGES[f.name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SFTSettingsError(f"{f.name} must be a number {bound}, got {value!r}")
        if not math.isfinite(value):
            raise SFTSettingsError(f"{f.name} must be a finite number {bound}, got {value}")
        if not test(value):
            raise SFTSettingsError(f"{f.name} must be {bound}, got {value}")
    preset, dtype = getattr(cfg, "preset", None), getattr(cfg, "dtype", None)
    if preset is not None and preset not in PRESETS:
        raise SFTSettingsError(f"preset {preset!r} is unknown; choose one of {', '.join(PRESETS)}")
    if dtype is not None and dtype not in DTYPES:
        raise SFTSettingsError(f"dtype {dtype!r} is unknown; choose one of {', '.join((*DTYPES, 'auto'))}")


def cpu_model(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU's model name: the first ``model name`` line of ``cpuinfo`` (Linux), else
    ``platform.processor()``, else ``"unknown"``."""
    return cpuinfo_field(("model name",), cpuinfo) or platform.processor() or "unknown"


def built_on(device: torch.device | str = "cpu") -> dict:
    """Where a warm start was built: torch's version, the architecture, the CPU model and the vector
    instructions torch's CPU kernels dispatch to, and the CUDA device's name when it ran on one. Two
    machines have built different policies from the same settings and code (float reductions need not
    round the same way on different hardware), while a rebuild on the same kind of machine reproduced
    each one's SFT record exactly, so a warm start's record says which machine it is from."""
    device = torch.device(device)
    where = {"torch": torch.__version__, "machine": platform.machine(), "cpu": cpu_model(),
             "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    if device.type == "cuda":
        where["cuda_device"] = torch.cuda.get_device_name(device)
    return where


def cache_path(cache_dir: str | Path, name: str, task: str, key: str) -> Path:
    """``<cache_dir>/<name>-<task slug>-<key>``: where a warm start of ``name`` on ``task`` is cached."""
    slug = "".join(c if c.isalnum() or c in "-_" else "_" for c in task)[:40]
    return Path(cache_dir) / f"{Path(name).name}-{slug}-{key}"


def build_atomically(path: Path, build) -> dict:
    """Run ``build(tmp)`` into a fresh directory beside ``path`` and rename it to ``path``; its result.

    A directory holding the info file is therefore always complete; a failed build leaves nothing.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        info = build(tmp)
        if path.exists():
            shutil.rmtree(path)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private
        os.replace(tmp, path)  # atomic
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return info


def encode_pairs(tokenizer, prompts: list[str], responses: list[str], *, add_eos: bool = True):
    """Lay out prompt/response pairs like a rollout: left-padded prompts, right-padded responses.

    Returns:
        input_ids (B, P+T) long, attention_mask (B, P+T) long, response_start P,
        response_mask (B, T) float (1 on response tokens, EOS included).
    """
    enc = tokenizer(list(prompts), padding=True, return_tensors="pt", padding_side="left")
    prompt_ids, prompt_mask = enc["input_ids"], enc["attention_mask"]  # (B, P)
    eos = [tokenizer.eos_token_id] if add_eos else []
    resp = [tokenizer(r, add_special_tokens=False)["input_ids"] + eos for r in responses]
    T = max(len(r) for r in resp)
    B = len(resp)
    resp_ids = torch.full((B, T), tokenizer.pad_token_id, dtype=torch.long)  # (B, T)
    resp_mask = torch.zeros(B, T)  # (B, T)
    for b, r in enumerate(resp):
        resp_ids[b, : len(r)] = torch.tensor(r, dtype=torch.long)
        resp_mask[b, : len(r)] = 1.0
    input_ids = torch.cat([prompt_ids, resp_ids], dim=1)  # (B, P+T)
    attention_mask = torch.cat([prompt_mask, resp_mask.long()], dim=1)  # (B, P+T)
    return input_ids, attention_mask, prompt_ids.shape[1], resp_mask


def sft_loss(model, input_ids, attention_mask, response_start, response_mask) -> torch.Tensor:
    """Token-mean cross-entropy on response tokens: -Σ m·log π(y_t) / Σ m."""
    logp, _ = token_logprobs(model, input_ids, attention_mask, response_start)  # (B, T)
    return -(logp * response_mask).sum() / response_mask.sum().clamp_min(1.0)


@dataclass(frozen=True)
class SFTRun:
    """What one `sft_loop` did."""

    steps: int
    stopped_by: str  # "target", "max_steps" or "max_seconds"
    history: list  # one {"step", "loss", "sampled_pass", ..., "seconds"} per evaluation
    seconds: float  # wall time of the loop, evaluations included
    tokens: int  # prompt and response tokens trained on (attention mask sum)


def sft_loop(model, tokenizer, cfg, next_batch: Callable[[], tuple[list[str], list[str]]],
             evaluate: Callable[[int], dict], *, device: torch.device, fine_eval_every: int, dtype: str = "float32",
             log: Callable[[str], None] = lambda _: None, log_steps: bool = False) -> SFTRun:
    """Train ``model`` on demonstrations until its sampled pass rate reaches ``cfg.target_pass``: the SFT of every
    warm start.

    Step s = 1, 2, ...: ``next_batch()`` gives (prompts, demonstrations); the loss is `sft_loss` on them, the
    forward in ``dtype`` (`mixed_precision`); AdamW (``cfg.lr``, ``cfg.weight_decay``) at lr·min(1, s/w) with
    w = ``cfg.warmup_steps``, the gradient norm clipped at 1; the global torch RNG seeded with ``cfg.seed`` inside,
    restored after. ``evaluate(s)`` returns ``{"sampled_pass": p, ...}`` (recorded in the history with the loss);
    the first evaluation is at step ``cfg.eval_every``, the next one ``fine_eval_every`` steps later when p > 0,
    else ``cfg.eval_every`` later; the last step (``cfg.max_steps``, or past ``cfg.max_seconds``) is evaluated too.
    The loop stops at the first evaluation with p >= ``cfg.target_pass``.
    """
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(cfg.warmup_steps, 1)))
    history, t0, step, tokens, next_eval, stopped_by = [], time.perf_counter(), 0, 0, cfg.eval_every, "max_steps"
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        while step < cfg.max_steps:
            prompts, demos = next_batch()
            ids, attn, P, mask = encode_pairs(tokenizer, prompts, demos)
            with mixed_precision(model, dtype):
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
            if log_steps:
                log(f"sft step {step} loss {loss.item():.4f} ({elapsed:.0f}s)")
            if step >= next_eval or out_of_time or step == cfg.max_steps:
                ev = evaluate(step)
                passed = ev["sampled_pass"]
                history.append({"step": step, "loss": round(loss.item(), 5), **ev,
                                "seconds": round(time.perf_counter() - t0, 2)})
                # close to the target the pass rate climbs fast: evaluate more often there
                next_eval = step + (fine_eval_every if passed > 0 else cfg.eval_every)
                log(f"sft step {step} loss {loss.item():.4f} sampled pass {passed:.3f} "
                    f"({time.perf_counter() - t0:.1f}s)")
                if passed >= cfg.target_pass:
                    stopped_by = "target"
                    break
                if out_of_time:
                    stopped_by = "max_seconds"
                    break
    return SFTRun(step, stopped_by, history, time.perf_counter() - t0, tokens)


def in_pass_band(pass_rate: float) -> bool:
    """``pass_rate`` lies in `PASS_BAND` (bounds included)."""
    return PASS_BAND[0] <= pass_rate <= PASS_BAND[1]


def save_warm_start(out_dir: Path, model, tokenizer, cfg, run: SFTRun, device: torch.device, *, pass_rate: float,
                    max_new_tokens: int, **measured) -> dict:
    """Save the trained policy (from the CPU, wherever it was trained) and its tokenizer into ``out_dir`` with the
    info file: the settings and their key, the held-out ``pass_rate`` (with ``measured``), how the loop ran and
    where; the info."""
    model.eval()
    model.to("cpu")
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    info = {
        "config": asdict(cfg), "key": cfg.key(), "pass_rate": pass_rate, **measured,
        "pass_rate_measured_on": f"{cfg.eval_n} held-out prompts, one sample each, temperature 1",
        "steps": run.steps, "stopped_by": run.stopped_by, "in_band": in_pass_band(pass_rate),
        "train_seconds": round(run.seconds, 2), "train_tokens": run.tokens, "max_new_tokens": max_new_tokens,
        "torch_threads": torch.get_num_threads(), "device": str(device), "built_on": built_on(device),
        "history": run.history,
    }
    (out_dir / INFO_FILE).write_text(json.dumps(info, indent=1))
    return info


def build_cached(path: Path, cfg, train: Callable[[Path, Callable], dict], *, force: bool, verbose: bool,
                 what: str) -> tuple[dict, bool]:
    """The info of the warm start cached at ``path``, built first by ``train(tmp_dir, log)`` (atomically, see
    `build_atomically`) when it is not cached or ``force``: ``(info, reused)``.

    Building says so on stderr, and why (forced, or no cached warm start has these settings: the settings in
    which a cached one of the same name and task differs), whether or not ``verbose`` (which adds the loop's
    progress lines): SFT takes minutes. A built warm start whose pass rate lies outside `PASS_BAND` warns.
    """
    if (path / INFO_FILE).is_file() and not force:
        return json.loads((path / INFO_FILE).read_text()), True
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if verbose else (lambda *_: None)
    print(f"warm start: building {path} by SFT{what} (up to {cfg.max_steps} steps): {_why_not_cached(path, cfg, force)}",
          file=sys.stderr, flush=True)
    info = build_atomically(path, lambda tmp: train(tmp, log))
    if not info["in_band"]:
        warnings.warn(
            f"warm start {path.name}: sampled pass rate {info['pass_rate']:.3f} is outside {PASS_BAND} "
            f"(stopped by {info['stopped_by']} after {info['steps']} steps); adjust target_pass or max_steps",
            stacklevel=3,
        )
    return info, False


def _why_not_cached(path: Path, cfg, force: bool) -> str:
    """Why a warm start is being built: forced, or no cached one has these settings (key); when one of the
    same name and task is cached, the settings in which it differs."""
    if force:
        return "force=True"
    why = f"no cached warm start with key {cfg.key()} in {path.parent}"
    mine = json.loads(json.dumps(asdict(cfg), default=str))
    for other in sorted(path.parent.glob(f"{path.name.rsplit('-', 1)[0]}-*/{INFO_FILE}")):
        theirs = json.loads(other.read_text()).get("config", {})
        diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        why += f"; cached {other.parent.name} differs in {', '.join(diff)}"
        break
    return why


# --- the preset warm start ---

def _corrupt(text: str, alphabet: str, rng: random.Random) -> str:
    """Replace one random character with a different random character of the alphabet."""
    if not text:
        return text
    i = rng.randrange(len(text))
    choices = [c for c in alphabet if c != text[i] and c not in "\n"]
    return text[:i] + rng.choice(choices) + text[i + 1 :]


@torch.no_grad()
def measure_pass_rate(
    model, tokenizer, task: Task, examples, *, max_new_tokens: int, temperature: float = 1.0,
    seed: int = 0, batch_rows: int = 256,
) -> float:
    """Normalised held-out score (r+1)/2 averaged over examples, sampling one response each."""
    was_training = model.training
    model.eval()
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    rewards: list[float] = []
    for i in range(0, len(examples), batch_rows):
        chunk = examples[i : i + batch_rows]
        ro = sample(model, tokenizer, [ex.prompt for ex in chunk], max_new_tokens=max_new_tokens,
                    temperature=temperature, generator=g)
        rewards += score_batch(task, ro.responses, chunk, finished=ro.finished.tolist())
    model.train(was_training)
    return sum((r + 1) / 2 for r in rewards) / max(len(rewards), 1)


def load_policy(path: str | Path):
    """Load a warm-started policy: ``(model, tokenizer, info)``; the model is in eval mode."""
    from transformers import AutoTokenizer

    path = Path(path)
    info_path = path / INFO_FILE
    if not info_path.is_file():
        raise FileNotFoundError(f"{path} is not a warm-start directory (no {INFO_FILE})")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    tokenizer.padding_side = "left"
    model = build_policy(path, tokenizer)
    return model, tokenizer, json.loads(info_path.read_text())


def _train(cfg: SFTConfig, out_dir: Path, log, device: torch.device) -> dict:
    """SFT of a freshly initialised preset on the task's demonstrations (`sft_loop`); saved into ``out_dir``."""
    task = get_task(cfg.task, **cfg.task_kwargs)
    tokenizer = build_char_tokenizer(task.alphabet)
    model = build_policy(cfg.preset, tokenizer, seed=cfg.seed, **cfg.model_overrides).to(device)
    rng = random.Random(f"sft|{cfg.seed}")
    train_pool = task.examples("train", cfg.batch_size * 50, seed=cfg.seed)
    eval_during = task.examples("test", cfg.eval_prompts, seed=cfg.seed + 1)
    eval_final = task.examples("test", cfg.eval_n, seed=cfg.seed + 2)
    demo_len = max(len(task.demonstration(ex)) for ex in train_pool[:512])
    max_new = cfg.max_new_tokens or demo_len + 8

    def next_batch() -> tuple[list[str], list[str]]:
        batch = rng.sample(train_pool, cfg.batch_size)
        demos = [task.demonstration(ex) for ex in batch]
        if cfg.noise > 0:
            demos = [_corrupt(d, task.alphabet, rng) if rng.random() < cfg.noise else d for d in demos]
        return [ex.prompt for ex in batch], demos

    def evaluate(step: int) -> dict:
        return {"sampled_pass": measure_pass_rate(model, tokenizer, task, eval_during, max_new_tokens=max_new,
                                                  seed=cfg.seed + step)}

    run = sft_loop(model, tokenizer, cfg, next_batch, evaluate, device=device, fine_eval_every=cfg.fine_eval_every,
                   log=log)
    model.eval()
    pass_rate = measure_pass_rate(model, tokenizer, task, eval_final, max_new_tokens=max_new, seed=cfg.seed + 10**6)
    greedy = measure_pass_rate(model, tokenizer, task, eval_final, max_new_tokens=max_new, temperature=0.0)
    return save_warm_start(out_dir, model, tokenizer, cfg, run, device, pass_rate=pass_rate, max_new_tokens=max_new,
                           greedy_pass_rate=greedy)


def warm_start(
    task_spec: str = DEFAULT_TASK,
    preset: str = "tiny-dense",
    cache_dir: str | Path = DEFAULT_CACHE_DIR,
    *,
    seed: int = 0,
    task_kwargs: dict | None = None,
    force: bool = False,
    verbose: bool = False,
    device: str = "cpu",
    **config: Any,
) -> WarmStart:
    """Train (or reuse from ``cache_dir``) a warm-started base policy and its measured pass rate.

    Args:
        task_spec: a ``get_task`` spec. Default: 5-digit scratchpad addition (32-token responses).
        preset: a ``respo.runtime.models`` preset.
        cache_dir: parent directory of the per-settings cache directories.
        seed: model init, data order and evaluation seed.
        task_kwargs: the task's knobs; ``None`` means ``DEFAULT_TASK_KWARGS`` for the default
            task and ``{}`` otherwise. The task's own defaults fill the knobs not given, so
            ``{"digits": 5}`` and ``{"digits": 5, "scratchpad": True}`` name one cached warm start.
        force: retrain even if a cached policy exists.
        verbose: print progress lines (to stderr). Whether or not, building a warm start that is
            not cached says so, and why, on stderr: SFT takes minutes.
        device: where SFT runs ("cpu", "cuda", "cuda:K", "auto"). Not part of the cache key: a
            warm start built on either device serves runs on both (its info file records where it
            was built; CUDA kernels do not give the CPU's numbers bitwise).
        **config: any other ``SFTConfig`` field (lr, batch_size, max_steps, max_seconds, noise,
            target_pass, eval_every, eval_prompts, eval_n, max_new_tokens, model_overrides, ...).

    Returns:
        ``WarmStart`` with the directory, the sampled and greedy held-out pass rates, and
        ``reused=True`` when it came from the cache.

    Raises:
        SFTSettingsError: a setting out of its range or an unknown preset (`check_settings`), before anything
            is written.
    """
    if task_kwargs is None:
        task_kwargs = dict(DEFAULT_TASK_KWARGS) if task_spec == DEFAULT_TASK else {}
    unknown = set(config) - set(SFTConfig.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown warm_start settings: {sorted(unknown)}")
    task_kwargs = {**task_defaults(task_spec), **task_kwargs}
    cfg = SFTConfig(task=task_spec, task_kwargs=task_kwargs, preset=str(preset), seed=seed, **config)
    check_settings(cfg)
    path = cache_path(cache_dir, cfg.preset, cfg.task, cfg.key())
    info, reused = build_cached(path, cfg, lambda tmp, log: _train(cfg, tmp, log, resolve_device(device)),
                                force=force, verbose=verbose, what="")
    return WarmStart(
        path=path, pass_rate=info["pass_rate"], greedy_pass_rate=info["greedy_pass_rate"],
        steps=info["steps"], train_seconds=info["train_seconds"], reused=reused,
        config=info["config"], history=info.get("history", []), stopped_by=info.get("stopped_by", ""),
    )
