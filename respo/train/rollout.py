"""The rollout side of the loop: sampling and scoring responses, and recomputing ``old_logp``.

One rollout samples G responses per prompt with the current policy version through the run's rollout
engine (`respo.runtime.engines`: the respo sampler records, for an MoE policy, the experts every token
used) and scores them with the task's verifier (`sample_rollout`);
`recompute_logp` then recomputes the behaviour policy's log-probs with the training forward of
`respo.train.forward` (the same micro-batches, trimming and routing), so a mini-batch trained before any
update has log W = 0 exactly. Group advantages are computed by the loop, one mini-batch at a time
(`respo.train.trainer`).
"""

from __future__ import annotations

from typing import Any

import torch

from respo.runtime.engines import RolloutEngine
from respo.runtime.tasks import score_rollout
from respo.train.buffer import Batch
from respo.train.config import Forward, Sampling
from respo.train.metrics import timed
from respo.train.forward import forward_logprobs, micro_batches

__all__ = ["sample_rollout", "recompute_logp"]


@torch.no_grad()
def sample_rollout(engine: RolloutEngine, task, pool, indices: list[int], sampling: Sampling,
                   generator: torch.Generator, version: int) -> tuple[Batch, dict]:
    """Sample G = ``sampling.group_size`` responses for each example ``pool[i]`` with policy ``version`` through
    ``engine`` and score them.

    The engine must hold version ``version``'s weights (the respo engine samples the trainer's model itself;
    the sources sync the vllm engine before each rollout step).

    Returns:
        The batch (prompt-major; ``adv``, computed by the loop from ``rewards``, and ``old_logp`` not
        yet set; ``behaviour_logp`` the engine's log-probs) and sampling metrics.
    """
    G = sampling.group_size
    examples = [pool[i] for i in indices for _ in range(G)]
    rec: dict[str, Any] = {}
    with timed(rec, "sample"):
        ro = engine.sample([ex.prompt for ex in examples], max_new_tokens=sampling.max_new_tokens,
                           temperature=sampling.temperature, top_p=sampling.top_p, generator=generator,
                           version=version)
    ro = _on_cpu(ro)
    rewards = torch.tensor(score_rollout(task, ro, examples))  # (S,)
    batch = Batch(input_ids=ro.input_ids, attention_mask=ro.attention_mask, response_start=ro.response_start,
                  mask=ro.response_mask.float(), behaviour_logp=ro.behaviour_logp.float(), rewards=rewards,
                  version=torch.full((len(examples),), version, dtype=torch.long),
                  routing=_on_cpu_or_none(ro.routing),
                  example_index=torch.tensor([i for i in indices for _ in range(G)], dtype=torch.long))
    return batch, rec


def _on_cpu_or_none(x: torch.Tensor | None) -> torch.Tensor | None:
    return None if x is None else x.cpu()


def _on_cpu(ro):
    """The rollout's tensors on the CPU (a no-op there), where batches are kept."""
    for name in ("input_ids", "attention_mask", "response_mask", "behaviour_logp", "finished"):
        setattr(ro, name, _on_cpu_or_none(getattr(ro, name)))
    return ro


@torch.no_grad()
def recompute_logp(model, batch: Batch, forward: Forward, *, mini_batch: int, start_row: int = 0) -> torch.Tensor:
    """``old_logp``: the behaviour policy's log-probs recomputed by the trainer, (S, T).

    Uses exactly the chunking, trimming and module mode of `update_step`'s training forward (the
    model stays in ``train()``; the presets have no dropout), so a mini-batch trained before any
    update gets log W = 0 exactly. Micro-batches never cross a mini-batch boundary: they are cut
    within each mini-batch of ``mini_batch`` rows (B*G), as `update_step` cuts them.

    Rows before ``start_row`` are left at 0: the sync loop passes ``start_row = B*G`` because the
    first mini-batch is trained before any update, where ``old_logp`` equals the training forward's
    detached log-probs bitwise (tested), so `update_step(on_policy=True)` takes them from there and
    saves one forward pass per rollout step.
    """
    model.train()
    old = torch.zeros_like(batch.mask)  # (S, T)
    if start_row % mini_batch:
        raise ValueError(f"start_row {start_row} is not a mini-batch boundary ({mini_batch} rows)")
    for mb_start in range(start_row, batch.size, mini_batch):
        mini = batch.rows(mb_start, min(mb_start + mini_batch, batch.size))
        for i, j in micro_batches(mini.mask, mini.response_start, forward.micro):
            mb = mini.rows(i, j).trimmed()
            logp, _ = forward_logprobs(model, mb, forward)  # the run's MoE routing replay, its prompts shared
            old[mb_start + i:mb_start + j, :logp.shape[1]] = logp.cpu() * mb.mask  # (m, t)
    return old
