"""The policy a run trains: a preset (random init or warm-started by SFT) or a model directory."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from respo.runtime import models
from respo.runtime.packaged import is_packaged
from respo.runtime.precision import resolve_device
from respo.runtime.pretrained_sft import load_packaged_policy
from respo.runtime.sft import INFO_FILE, load_policy, warm_start
from respo.runtime.tasks import get_task
from respo.runtime.tokenizer import build_char_tokenizer
from respo.train.config import ConfigError, TrainConfig, model_dir_problem

__all__ = ["Policy", "load_run_policy", "weights_sha256"]

WARM_START_SEED = 0  # one cached warm start per (task, preset), shared by every run seed


class Policy:
    """The model, its tokenizer, and where they came from."""

    def __init__(self, model, tokenizer, info: dict):
        self.model, self.tokenizer, self.info = model, tokenizer, info


def load_run_policy(cfg: TrainConfig) -> Policy:
    """Preset + warm start (cached SFT), preset from scratch, a packaged pretrained model (warm-started on the
    task or as shipped), or a local model directory, on ``cfg.device``.

    A directory holding a warm start's info file is loaded as a warm start (its tokenizer is
    left-padded); any other directory as a plain Hugging Face model and tokenizer. A warm start
    that is not cached yet is trained on ``cfg.device`` too.
    """
    policy = _load(cfg)
    if policy.info.get("source") != "preset":  # a starting policy shared by every seed: its identity is its weights
        policy.info["weights_sha256"] = weights_sha256(policy.model)
    policy.model.to(resolve_device(cfg.device))  # in place; a no-op on the CPU
    return policy


def weights_sha256(model) -> str:
    """sha256 of a model's state (every tensor's name, dtype, shape and bytes, in name order): the
    identity of a starting policy. Two warm starts built by the same settings have come out as
    different policies, so the settings' hash does not identify the weights; this does."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(-1).view(torch.uint8).numpy())  # the tensor's own bytes, hashed without a copy
    return h.hexdigest()


def _load(cfg: TrainConfig) -> Policy:
    if cfg.model in models.PRESETS:
        if cfg.warm_start:
            ws = warm_start(cfg.task, cfg.model, cfg.cache_dir, seed=WARM_START_SEED, verbose=cfg.progress,
                            device=cfg.device, **_warm_kwargs(cfg))
            model, tok, info = load_policy(ws.path)
            return Policy(model, tok, {"source": "warm_start", "path": str(ws.path), **_jsonable(info)})
        tok = build_char_tokenizer(get_task(cfg.task, **cfg.task_kwargs).alphabet)
        model = models.build_policy(cfg.model, tok, seed=cfg.seed)
        return Policy(model, tok, {"source": "preset", "preset": cfg.model})
    if is_packaged(cfg.model):  # a pretrained checkpoint shipped in a package (respo.runtime.packaged)
        return Policy(*load_packaged_policy(cfg.model, cfg.task, _warm_kwargs(cfg)["task_kwargs"], cfg.cache_dir,
                                            warm_start=cfg.warm_start, sft_kwargs=cfg.sft_kwargs, verbose=cfg.progress,
                                            device=cfg.device))
    path = Path(cfg.model)
    problem = model_dir_problem(path)
    if problem:
        raise ConfigError(problem)
    try:
        if (path / INFO_FILE).is_file():
            model, tok, info = load_policy(path)
            return Policy(model, tok, {"source": "dir", "path": str(path), **_jsonable(info)})
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = models.build_policy(path, tok)
    except (OSError, ValueError, KeyError) as err:  # transformers' ways of saying a directory is no model it reads
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"model directory {str(path)!r} could not be loaded as a Hugging Face model and "
                          f"tokenizer: {first}") from None
    return Policy(model, tok, {"source": "dir", "path": str(path)})


def _warm_kwargs(cfg: TrainConfig) -> dict:
    """The warm start is trained on exactly the task the run trains on (same task kwargs; the overlong
    penalty only changes rewards, so it is left out of the warm-start cache key), with the run's
    ``sft_kwargs`` (empty = the SFT defaults)."""
    return {**cfg.sft_kwargs, "task_kwargs": {k: v for k, v in cfg.task_kwargs.items() if k != "overlong"}}


def _jsonable(info: Any) -> dict:
    if info is None:
        return {}
    if not isinstance(info, dict):
        info = getattr(info, "__dict__", {"info": str(info)})
    return json.loads(json.dumps(info, default=str))
