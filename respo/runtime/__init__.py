"""Embedded runtime: tasks and rewards, char tokenizer, tiny policies, log-probs, sampler, SFT,
device and precision (``precision``), MoE routing record/replay (``moe``).

Submodules are imported on first use (``respo.runtime.sampler`` etc. pull in transformers);
``from respo.runtime import sample`` works too.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "build_char_tokenizer": "tokenizer",
    "build_policy": "models",
    "PRESETS": "models",
    "token_logprobs": "logprobs",
    "Example": "tasks",
    "Task": "tasks",
    "get_task": "tasks",
    "score_batch": "tasks",
    "OverlongPenalty": "tasks",
    "Rollout": "sampler",
    "sample": "sampler",
    "WarmStart": "sft",
    "warm_start": "sft",
    "load_policy": "sft",
    "encode_pairs": "sft",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
