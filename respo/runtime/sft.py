"""Warm start: supervised fine-tuning on task demonstrations to a measured, mid-range pass rate.

RL needs a base policy that is neither hopeless nor saturated. ``warm_start`` builds a preset
(random init), trains it on the task's demonstrations with cross-entropy on the response
tokens (EOS included), and stops *partway*: every ``eval_every`` steps it samples at
temperature 1 on held-out prompts and stops as soon as the sampled pass rate reaches
``target_pass`` (or at ``max_steps`` / ``max_seconds``). The final pass rate is then measured
on ``eval_n`` other held-out prompts with the sampler at temperature 1 and stored with the
model. Optional demonstration noise (``noise``: the fraction of demonstrations with one
character replaced) makes the policy less certain.

Sampled accuracy, not greedy accuracy, is what RL sees as reward, and the two differ widely (in
the table below greedy accuracy is about twice the sampled one). Both are recorded.

Cache layout (one directory per settings hash, reused by later calls)::

    cache_dir/<preset>-<task>-<hash>/
        config.json, model.safetensors, generation_config.json   (save_pretrained)
        tokenizer.json, tokenizer_config.json, ...                (save_pretrained)
        respo_warm_start.json  (settings, pass rates, timings, eval history)

Command line (``respo sft`` takes the same flags)::

    python -m respo.runtime.sft --preset tiny-dense --threads 1   # caches under .cache/respo, where respo train looks

``--record FILE`` then writes the warm start's record (built or found in the cache): its
``respo_warm_start.json`` and, as ``command``, the ``respo sft`` command without ``--cache-dir`` and
``--record``, so a report can commit exactly what it started from.

Measured with the defaults (5-digit scratchpad addition, 32-token responses, batch 64, AdamW
1e-3, target 0.3; one torch thread, one seed):

    preset      steps  train s  sampled pass (512 held-out)  greedy pass
    tiny-dense    245       87                        0.414        0.893
    tiny-moe      295       87                        0.293        0.580

The sampled pass rate climbs steeply once the scratchpad is learnt (dense: 0.09, 0.21, 0.29,
0.41 at steps 230-245), hence the finer evaluations near the target.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .logprobs import token_logprobs
from .models import build_policy
from .precision import device_problem, resolve_device
from .sampler import sample
from respo.errors import RespoError
from respo.fileio import write_text_atomic

from .tasks import Task, get_task, load_task, score_batch, task_defaults, task_help
from .tasks.args import TASK_KWARGS_HELP, add_task_kwargs_arguments
from .tokenizer import build_char_tokenizer

INFO_FILE = "respo_warm_start.json"
#: The pass-rate band RL wants from a base policy (neither hopeless nor saturated).
PASS_BAND = (0.2, 0.5)
DEFAULT_TASK = "addition"
#: Where warm starts are cached; ``respo train``'s ``cache_dir`` has the same default, so both find them.
DEFAULT_CACHE_DIR = ".cache/respo"
#: 5-digit scratchpad addition: 31 response characters + EOS = 32 tokens.
DEFAULT_TASK_KWARGS: dict[str, Any] = {"digits": 5, "scratchpad": True}


class SFTSettingsError(RespoError, ValueError):
    """A warm-start setting out of its range (the message names it and the range)."""


@dataclass(frozen=True)
class SFTConfig:
    """Everything that determines a warm-started policy (its hash names the cache directory)."""

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


def cpu_model(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU's model name: the first ``model name`` line of ``cpuinfo`` (Linux), else
    ``platform.processor()``, else ``"unknown"``."""
    try:
        for line in Path(cpuinfo).read_text(errors="replace").splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


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
    task = get_task(cfg.task, **cfg.task_kwargs)
    tokenizer = build_char_tokenizer(task.alphabet)
    model = build_policy(cfg.preset, tokenizer, seed=cfg.seed, **cfg.model_overrides).to(device)
    model.train()
    rng = random.Random(f"sft|{cfg.seed}")
    train_pool = task.examples("train", cfg.batch_size * 50, seed=cfg.seed)
    eval_during = task.examples("test", cfg.eval_prompts, seed=cfg.seed + 1)
    eval_final = task.examples("test", cfg.eval_n, seed=cfg.seed + 2)
    demo_len = max(len(task.demonstration(ex)) for ex in train_pool[:512])
    max_new = cfg.max_new_tokens or demo_len + 8
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(cfg.warmup_steps, 1)))
    history, t0, step, passed, next_eval = [], time.perf_counter(), 0, 0.0, cfg.eval_every
    stopped_by = "max_steps"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        while step < cfg.max_steps:
            batch = rng.sample(train_pool, cfg.batch_size)
            demos = [task.demonstration(ex) for ex in batch]
            if cfg.noise > 0:
                demos = [_corrupt(d, task.alphabet, rng) if rng.random() < cfg.noise else d for d in demos]
            ids, attn, P, mask = encode_pairs(tokenizer, [ex.prompt for ex in batch], demos)
            loss = sft_loss(model, ids.to(device), attn.to(device), P, mask.to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            elapsed = time.perf_counter() - t0
            out_of_time = cfg.max_seconds is not None and elapsed > cfg.max_seconds
            if step >= next_eval or out_of_time or step == cfg.max_steps:
                passed = measure_pass_rate(model, tokenizer, task, eval_during, max_new_tokens=max_new,
                                           seed=cfg.seed + step)
                history.append({"step": step, "loss": round(loss.item(), 5), "sampled_pass": passed,
                                "seconds": round(time.perf_counter() - t0, 2)})
                # close to the target the pass rate climbs fast: evaluate more often there
                fine = passed > 0
                next_eval = step + (cfg.fine_eval_every if fine else cfg.eval_every)
                log(f"sft step {step} loss {loss.item():.4f} sampled pass {passed:.3f} "
                    f"({time.perf_counter() - t0:.1f}s)")
                if passed >= cfg.target_pass:
                    stopped_by = "target"
                    break
                if out_of_time:
                    stopped_by = "max_seconds"
                    break
    train_seconds = time.perf_counter() - t0
    model.eval()
    pass_rate = measure_pass_rate(model, tokenizer, task, eval_final, max_new_tokens=max_new, seed=cfg.seed + 10**6)
    greedy = measure_pass_rate(model, tokenizer, task, eval_final, max_new_tokens=max_new, temperature=0.0)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    info = {
        "config": asdict(cfg),
        "key": cfg.key(),
        "pass_rate": pass_rate,
        "greedy_pass_rate": greedy,
        "pass_rate_measured_on": f"{cfg.eval_n} held-out prompts, one sample each, temperature 1",
        "steps": step,
        "stopped_by": stopped_by,
        "in_band": PASS_BAND[0] <= pass_rate <= PASS_BAND[1],
        "train_seconds": round(train_seconds, 2),
        "max_new_tokens": max_new,
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
        "built_on": built_on(device),
        "history": history,
    }
    (out_dir / INFO_FILE).write_text(json.dumps(info, indent=2))
    return info


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
    """
    if task_kwargs is None:
        task_kwargs = dict(DEFAULT_TASK_KWARGS) if task_spec == DEFAULT_TASK else {}
    unknown = set(config) - set(SFTConfig.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown warm_start settings: {sorted(unknown)}")
    task_kwargs = {**task_defaults(task_spec), **task_kwargs}
    cfg = SFTConfig(task=task_spec, task_kwargs=task_kwargs, preset=str(preset), seed=seed, **config)
    if not 0 <= cfg.noise < 1:
        raise SFTSettingsError(f"noise must be in [0, 1), got {cfg.noise}")
    if not 0 < cfg.target_pass <= 1:
        raise SFTSettingsError(f"target_pass must be in (0, 1], got {cfg.target_pass}")
    path = cache_path(cache_dir, cfg.preset, cfg.task, cfg.key())
    if (path / INFO_FILE).is_file() and not force:
        info = json.loads((path / INFO_FILE).read_text())
        return _result(path, info, reused=True)
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if verbose else (lambda *_: None)
    print(f"warm start: building {path} by SFT (up to {cfg.max_steps} steps): {_why_not_cached(path, cfg, force)}",
          file=sys.stderr, flush=True)
    info = build_atomically(path, lambda tmp: _train(cfg, tmp, log, resolve_device(device)))
    if not info["in_band"]:
        warnings.warn(
            f"warm start {path.name}: sampled pass rate {info['pass_rate']:.3f} is outside "
            f"{PASS_BAND} (stopped by {info['stopped_by']} after {info['steps']} steps); adjust "
            "target_pass, max_steps or noise",
            stacklevel=2,
        )
    return _result(path, info, reused=False)


def _why_not_cached(path: Path, cfg: SFTConfig, force: bool) -> str:
    """Why a warm start is being built: forced, or no cached one has these settings (key); when one of the
    same preset and task is cached, the settings in which it differs."""
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


def _result(path: Path, info: dict, *, reused: bool) -> WarmStart:
    return WarmStart(
        path=path, pass_rate=info["pass_rate"], greedy_pass_rate=info["greedy_pass_rate"],
        steps=info["steps"], train_seconds=info["train_seconds"], reused=reused,
        config=info["config"], history=info.get("history", []), stopped_by=info.get("stopped_by", ""),
    )


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The warm-start flags: task, preset, cache, and one ``--field-name`` per ``SFTConfig`` field."""
    ap.add_argument("--task", default=DEFAULT_TASK, help=f"task spec: {task_help()} (default: addition)")
    add_task_kwargs_arguments(ap, f"{TASK_KWARGS_HELP} (default for addition: digits=5, scratchpad=true)")
    ap.add_argument("--preset", default="tiny-dense", help="model preset (tiny-dense, tiny-moe)")
    ap.add_argument("--model", default=None,
                    help="a packaged pretrained model (smollm2-135m-instruct) or a model directory to warm-start "
                         "instead of a preset: SFT through its chat template (respo.runtime.pretrained_sft)")
    ap.add_argument("--cache-dir", default=DEFAULT_CACHE_DIR,
                    help=f"directory of cached warm starts, one per settings hash (default: {DEFAULT_CACHE_DIR}, "
                         "where respo train looks)")
    ap.add_argument("--seed", type=int, default=0, help="seed of initialisation, data order and evaluation samples")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: torch's; 1 is faster when other processes share the cores)")
    ap.add_argument("--force", action="store_true", help="retrain even if cached")
    ap.add_argument("--device", default="cpu", help="where SFT runs: cpu, cuda, cuda:K or auto (not part of the cache key)")
    ap.add_argument("--record", default=None, metavar="FILE",
                    help="also write the warm start's record to FILE (atomically): its cached respo_warm_start.json "
                         "and, as \"command\", this command without --cache-dir and --record")
    defaults = SFTConfig()
    for name, f in SFTConfig.__dataclass_fields__.items():
        if name in ("task", "task_kwargs", "preset", "seed", "model_overrides"):
            continue
        kind = {"int": int, "float": float, "int | None": int, "float | None": float}.get(str(f.type), str)
        ap.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None,
                        help=f"SFTConfig.{name} (default: {getattr(defaults, name)})")


#: Flags that say where a warm start is kept or recorded, not what it is: left out of its recorded command.
_WHERE_FLAGS = ("cache_dir", "record")


def sft_command(args: argparse.Namespace) -> str:
    """The ``respo sft`` command of parsed ``add_arguments`` flags: every flag whose value differs from its
    default, in the parser's order, except `_WHERE_FLAGS`; an absolute path is written as its last part."""
    import shlex

    ap = argparse.ArgumentParser(add_help=False)
    add_arguments(ap)
    words, seen = ["python", "-m", "respo", "sft"], set()
    for action in ap._actions:
        dest = action.dest
        if dest in seen or dest in _WHERE_FLAGS:
            continue
        seen.add(dest)
        value = getattr(args, dest, action.default)
        if value == action.default:
            continue
        flag = action.option_strings[0]
        if isinstance(action, argparse._StoreTrueAction):
            words.append(flag)
        elif dest == "task_kwargs":
            words += ["--task-kwargs", json.dumps(value, sort_keys=True)]
        else:
            text = str(value)
            words += [flag, Path(text).name if os.path.isabs(text) else text]
    return shlex.join(words)


def write_record(path: Path, args: argparse.Namespace, record_file: str | Path) -> dict:
    """Write ``{"command": sft_command(args), **<path>/respo_warm_start.json}`` to ``record_file`` atomically
    (a temporary file beside it, renamed); the record. A top-level value that is an absolute path (``source``,
    where the pretrained model was read from) is written as its last part, as in the command."""
    info = json.loads((Path(path) / INFO_FILE).read_text())
    record = {"command": sft_command(args), **{k: Path(v).name if isinstance(v, str) and os.path.isabs(v) else v
                                               for k, v in info.items()}}
    write_text_atomic(record_file, json.dumps(record, indent=1) + "\n")
    return record


def run_from_args(args: argparse.Namespace) -> WarmStart:
    """Run ``warm_start`` from parsed ``add_arguments`` flags and print a JSON summary line; with ``--record
    FILE``, then write the warm start's record (`write_record`)."""
    record = getattr(args, "record", None)
    if record is not None and not Path(record).parent.is_dir():
        raise SFTSettingsError(f"--record {record}: directory {Path(record).parent} does not exist")
    if args.threads:
        torch.set_num_threads(args.threads)
    load_task(args.task, DEFAULT_TASK_KWARGS if args.task_kwargs is None and args.task == DEFAULT_TASK
              else args.task_kwargs)  # a bad task is a one-line error before anything is trained
    overrides = {
        name: getattr(args, name) for name in SFTConfig.__dataclass_fields__
        if name not in ("task", "task_kwargs", "preset", "seed") and getattr(args, name, None) is not None
    }
    problem = device_problem(args.device)
    if problem:
        raise SFTSettingsError(problem)
    if args.model:
        path = _run_pretrained(args, overrides)
        if record is not None:
            write_record(path, args, record)
        return path
    ws = warm_start(args.task, args.preset, args.cache_dir, seed=args.seed, task_kwargs=args.task_kwargs,
                    force=args.force, verbose=True, device=args.device, **overrides)
    print(json.dumps({"path": str(ws.path), "pass_rate": ws.pass_rate,
                      "greedy_pass_rate": ws.greedy_pass_rate, "steps": ws.steps,
                      "stopped_by": ws.stopped_by, "train_seconds": ws.train_seconds,
                      "reused": ws.reused}))
    if record is not None:
        write_record(ws.path, args, record)
    return ws


def _run_pretrained(args: argparse.Namespace, overrides: dict) -> Path:
    """``respo sft --model NAME``: the pretrained warm start (``respo.runtime.pretrained_sft``) with the given flags."""
    from .pretrained_sft import PretrainedSFTConfig, warm_start_pretrained

    unknown = sorted(set(overrides) - set(PretrainedSFTConfig.__dataclass_fields__))
    if unknown:
        raise SFTSettingsError(f"--model {args.model}: the pretrained warm start has no setting(s) "
                               f"{', '.join('--' + u.replace('_', '-') for u in unknown)}")
    path = warm_start_pretrained(args.model, args.task, args.cache_dir, task_kwargs=args.task_kwargs, force=args.force,
                                 seed=args.seed, device=args.device, **overrides)
    info = json.loads((path / INFO_FILE).read_text())
    print(json.dumps({"path": str(path), **{k: info[k] for k in ("pass_rate", "mean_response_tokens", "steps",
                                                               "stopped_by", "train_seconds")}}))
    return path


def register(subparsers) -> None:
    """Add ``respo sft`` to the ``respo`` CLI (list this module in ``respo.cli.EXTENSIONS``)."""
    p = subparsers.add_parser("sft", help="warm-start a preset or a packaged model on task demonstrations (cached)",
                              description=__doc__.splitlines()[0])
    add_arguments(p)
    p.set_defaults(func=lambda args: (run_from_args(args), 0)[1])


def main(argv: list[str] | None = None) -> WarmStart:
    ap = argparse.ArgumentParser(prog="python -m respo.runtime.sft", description=__doc__.splitlines()[0])
    add_arguments(ap)
    return run_from_args(ap.parse_args(argv))


if __name__ == "__main__":
    main()
