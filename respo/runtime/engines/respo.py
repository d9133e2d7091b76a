"""The embedded rollout engine: respo's own KV-cached sampler on the trainer's model.

It samples with the very weights the trainer holds (nothing to sync), in the trainer's compute dtype, and
records the experts every token used when the policy is a mixture of experts (``Rollout.routing``), so
routing replay can force them on the training forwards. With the same weights its behaviour log-probs
equal the trainer's recomputed log-probs (1e-5 in float32), which makes it the exact reference.
"""

from __future__ import annotations

import torch

from respo.runtime import moe
from respo.runtime.precision import mixed_precision
from respo.runtime.sampler import Rollout, sample, sample_ids

__all__ = ["RespoEngine"]


class RespoEngine:
    name = "respo"

    def __init__(self, model: torch.nn.Module, tokenizer, *, dtype: str = "float32"):
        self.model, self.tokenizer, self.dtype = model, tokenizer, dtype
        self.info = {"name": self.name, "dtype": dtype}

    def sync_weights(self, model: torch.nn.Module) -> float:
        if model is not self.model:  # e.g. an async worker's snapshot: sample from that model from now on
            self.model = model
        return 0.0

    @torch.no_grad()
    def sample(self, prompts: list[str], *, max_new_tokens: int, temperature: float, top_p: float,
               generator: torch.Generator, version: int, stop_at_eos: bool = True) -> Rollout:
        return self._sample(sample, prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                            generator=generator, version=version, stop_at_eos=stop_at_eos)

    @torch.no_grad()
    def sample_ids(self, rows: list[list[int]], *, max_new_tokens: int, temperature: float, top_p: float,
                   generator: torch.Generator, version: int, stop_at_eos: bool = True) -> Rollout:
        return self._sample(sample_ids, rows, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                            generator=generator, version=version, stop_at_eos=stop_at_eos)

    def _sample(self, how, inputs, **kw) -> Rollout:
        model = self.model
        was_training = model.training
        recorder = moe.RoutingRecorder(model) if moe.is_moe(model) else None
        model.eval()
        try:
            with mixed_precision(model, self.dtype):
                ro = how(model, self.tokenizer, inputs, router_recorder=recorder, **kw)
        finally:
            model.train(was_training)
        if recorder is not None:
            ro.routing = recorder.routing(length=ro.input_ids.shape[1])
        return ro

    def close(self) -> None:
        pass
