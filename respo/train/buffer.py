"""Rollout batches, their policy versions, and staleness bookkeeping.

A `Batch` holds sequences in prompt-major order (the G responses of a prompt are contiguous
rows) together with everything an update needs: the behaviour log-probs reported by the sampler,
the trainer's recomputed ``old_logp``, rewards, group advantages and the policy ``version`` that
produced each row (with partial rollouts, ``token_version`` that of each token; ``version`` is then each
row's oldest). `RolloutBuffer` splits one rollout step into N mini-batches (sync mode);
`PromptStream` is the deterministic, resumable data cursor.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any, Sequence

import torch

__all__ = ["Batch", "RolloutBuffer", "PromptStream", "repeated_prompts"]


@dataclass
class Batch:
    """Sequences of one or more groups, prompt-major (rows g*G .. g*G+G-1 share a prompt).

    Shapes: S sequences, L = prompt + response columns, T = L - response_start.
    """

    input_ids: torch.Tensor  # (S, L) long, prompts left-padded to response_start
    attention_mask: torch.Tensor  # (S, L)
    response_start: int
    mask: torch.Tensor  # (S, T) float, 1 for generated tokens up to and including EOS
    behaviour_logp: torch.Tensor  # (S, T) log-prob under the sampling distribution
    rewards: torch.Tensor  # (S,) +1 / -1
    version: torch.Tensor  # (S,) long, policy version that sampled each row
    adv: torch.Tensor | None = None  # (S,) group advantages, computed by the loop for the mini-batch it trains on
    old_logp: torch.Tensor | None = None  # (S, T) trainer recomputation with the behaviour weights
    routing: torch.Tensor | None = None  # (S, L, n_layers, k) MoE experts chosen while sampling
    example_index: torch.Tensor | None = None  # (S,) long, index of the prompt in the task's pool
    token_version: torch.Tensor | None = None  # (S, T) long, the version that sampled each token (partial
    #   rollouts); None: every token of a row comes from ``version`` (then ``version`` is the row's oldest token's)

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    def rows(self, start: int, stop: int) -> "Batch":
        """Rows [start, stop) (a view; no copy)."""
        kw = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            kw[f.name] = v[start:stop] if isinstance(v, torch.Tensor) else v
        return Batch(**kw)

    def trimmed(self) -> "Batch":
        """Drop response columns that are padding in every row (saves compute; keeps shapes consistent
        between the old-logp and the training forward as both trim the same rows)."""
        lengths = self.mask.sum(1)
        t_max = int(lengths.max().item()) if self.size else 0
        t_max = max(t_max, 1)
        if t_max >= self.mask.shape[1]:
            return self
        cols = self.response_start + t_max
        kw = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in ("input_ids", "attention_mask", "routing"):
                v = v[:, :cols] if v is not None else None
            elif f.name in ("mask", "behaviour_logp", "old_logp", "token_version"):
                v = v[:, :t_max] if v is not None else None
            kw[f.name] = v
        return Batch(**kw)

    def token_versions(self) -> torch.Tensor:
        """(S, T) long: the version that sampled each token (``token_version``, or each row's ``version``)."""
        if self.token_version is not None:
            return self.token_version
        return self.version.unsqueeze(-1).expand(self.mask.shape)

    def state(self) -> dict[str, Any]:
        """Plain dict of tensors/ints for checkpoints."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "Batch":
        return cls(**state)


def repeated_prompts(batch: Batch, group_size: int) -> int:
    """Prompt draws of a rollout beyond its distinct prompts: S / G - |distinct example_index|
    (0 when the batch does not record its prompts). E.g. 3 mini-batches of 2 prompts from a pool of
    4 prompts: 6 draws, at most 4 distinct, so at least 2 repeats."""
    if batch.example_index is None:
        return 0
    return batch.size // group_size - int(torch.unique(batch.example_index).numel())


class RolloutBuffer:
    """One synchronous rollout step split into N mini-batches of B prompts (B*G rows).

    Staleness of the k-th mini-batch (k = 1..N) is k - 1 because one update happens between
    consecutive mini-batches. The buffer is saved in checkpoints, so a run resumed in the middle of
    a rollout step trains on exactly the rows it would have.
    """

    def __init__(self, mini_batch_rows: int):
        if mini_batch_rows < 1:
            raise ValueError(f"mini_batch_rows must be >= 1, got {mini_batch_rows}")
        self.mini_batch_rows = mini_batch_rows
        self.batch: Batch | None = None
        self.next_index = 0

    def put(self, batch: Batch) -> None:
        if batch.size % self.mini_batch_rows:
            raise ValueError(f"rollout of {batch.size} rows is not a whole number of mini-batches of "
                             f"{self.mini_batch_rows} rows ({batch.size % self.mini_batch_rows} rows left over)")
        if self.remaining:
            raise RuntimeError(f"buffer still holds {self.remaining} unconsumed mini-batch(es)")
        self.batch, self.next_index = batch, 0

    @property
    def remaining(self) -> int:
        if self.batch is None:
            return 0
        return self.batch.size // self.mini_batch_rows - self.next_index

    def take(self) -> Batch:
        if not self.remaining:
            raise RuntimeError("buffer is empty")
        k = self.next_index
        self.next_index += 1
        return self.batch.rows(k * self.mini_batch_rows, (k + 1) * self.mini_batch_rows)

    def state(self) -> dict[str, Any]:
        return {"batch": None if self.batch is None else self.batch.state(), "next_index": self.next_index,
                "mini_batch_rows": self.mini_batch_rows}

    def load_state(self, state: dict[str, Any]) -> None:
        self.mini_batch_rows = state["mini_batch_rows"]
        self.batch = None if state["batch"] is None else Batch.from_state(state["batch"])
        self.next_index = state["next_index"]


class PromptStream:
    """Deterministic cursor over a pool of training examples: a fresh permutation per epoch,
    seeded by (seed, epoch), so the position (epoch, pos) is the whole state."""

    def __init__(self, pool: Sequence[Any], seed: int):
        if not pool:
            raise ValueError("the training pool is empty")
        self.pool, self.seed = list(pool), seed
        self.epoch, self.pos = 0, 0
        self._perm = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.pool)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next(self, n: int) -> list[int]:
        """Indices of the next ``n`` examples (crossing epochs as needed)."""
        out = []
        while len(out) < n:
            if self.pos == len(self._perm):
                self.epoch, self.pos = self.epoch + 1, 0
                self._perm = self._permutation(self.epoch)
            take = min(n - len(out), len(self._perm) - self.pos)
            out += self._perm[self.pos:self.pos + take]
            self.pos += take
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._perm = self._permutation(self.epoch)
