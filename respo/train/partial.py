"""Partial rollouts: a batch of responses generated in segments, each token with the version that sampled it.

The asynchronous worker (`respo.train.async_`) generates a batch ``segment_tokens`` tokens at a time. Between
two segments it installs any weights the learner has published, so a response can span several policy
versions:

    segment 1 (version 3): prompt -> y_1 .. y_16          token_version 3, behaviour log π_3(y_t | y_<t)
    segment 2 (version 4): prompt + y_1..16 -> y_17 .. y_32  token_version 4, behaviour log π_4(y_t | y_<t)

Each segment is a new engine call (`RolloutEngine.sample_ids`) on the prompt followed by the response so far:
the engine runs that whole prefix with the weights it now holds, so token t is drawn from π_{v_t}(· | y_<t)
with all of its context processed by version v_t (no key/value cache kept across the switch, which would mix
two versions inside one token's distribution). Rows that have emitted EOS take no further part; the rows
still going all have the same length, so a segment asks for the same number of tokens from each.

``old_logp`` per token is log π_{v_t}(y_t | y_<t) recomputed by the trainer's forward (`recompute_logp`) with
the worker's snapshot of version v_t: before the worker installs new weights (`PartialRollout.score`, called
from the job's ``before_switch``) and when the batch is complete, the tokens not yet scored (all of them from
the version the snapshot holds) are scored over the response so far; a token's log-prob depends only on
what precedes it, so scoring a prefix gives what scoring the whole response would (to float rounding, the
shapes differ). With ``rollout_bypass`` the engine's log-probs are ``old_logp`` and nothing is recomputed.

A `PartialRollout`'s `state` is tensors and plain values (checkpoints save a batch in the making).
"""

from __future__ import annotations

from typing import Any

import torch

from respo.runtime.sampler import Rollout, left_pad
from respo.runtime.tasks import score_rollout
from respo.train.buffer import Batch
from respo.train.config import Rollouts, Sampling
from respo.train.rollout import recompute_logp

__all__ = ["PartialRollout"]


class PartialRollout:
    """One batch of responses in the making (rows in the order given: prompt-major groups).

    Args:
        prompt_rows: the token ids of each row's prompt.
        example_index: (S,) long, each row's prompt in the task's pool.
        max_new_tokens: the most response tokens per row.
        pad: the pad token id.
    """

    def __init__(self, prompt_rows: list[list[int]], example_index: torch.Tensor, max_new_tokens: int, pad: int):
        S, T = len(prompt_rows), max_new_tokens
        self.prompt_rows = [list(map(int, r)) for r in prompt_rows]
        self.example_index, self.pad = example_index.long(), int(pad)
        self.tokens = torch.full((S, T), int(pad), dtype=torch.long)  # (S, T)
        self.behaviour_logp = torch.zeros(S, T)  # (S, T) float32
        self.old_logp = torch.zeros(S, T)  # (S, T) float32, up to ``scored`` in each row
        self.token_version = torch.zeros(S, T, dtype=torch.long)  # (S, T)
        self.length = torch.zeros(S, dtype=torch.long)  # (S,) tokens so far
        self.scored = torch.zeros(S, dtype=torch.long)  # (S,) tokens whose old_logp is set
        self.finished = torch.zeros(S, dtype=torch.bool)  # (S,) emitted EOS
        self.segments = 0  # engine calls so far

    @property
    def max_new_tokens(self) -> int:
        return self.tokens.shape[1]

    @property
    def alive(self) -> torch.Tensor:
        """(S,) bool: rows still generating (no EOS yet, below ``max_new_tokens``)."""
        return ~self.finished & (self.length < self.max_new_tokens)

    @property
    def done(self) -> bool:
        return not bool(self.alive.any())

    def step(self, engine, version: int, segment_tokens: int, sampling: Sampling, generator: torch.Generator) -> bool:
        """Generate one segment of at most ``segment_tokens`` tokens for every row still going, with the
        engine's weights (policy ``version``); True when every row is complete."""
        rows = self.alive.nonzero().squeeze(-1).tolist()
        if not rows:
            return True
        n = int(self.length[rows[0]])
        if any(int(self.length[r]) != n for r in rows):  # an invariant of segment-wise generation
            raise RuntimeError("the rows of a partial rollout still generating have different lengths")
        k = min(segment_tokens, self.max_new_tokens - n)
        ids = [self.prompt_rows[r] + self.tokens[r, :n].tolist() for r in rows]
        ro = engine.sample_ids(ids, max_new_tokens=k, temperature=sampling.temperature, top_p=sampling.top_p,
                               generator=generator, version=version)
        new = ro.response_ids.cpu()
        got = ro.response_mask.sum(-1).long().cpu().tolist()
        for i, r in enumerate(rows):
            m = got[i]
            self.tokens[r, n:n + m] = new[i, :m]
            self.behaviour_logp[r, n:n + m] = ro.behaviour_logp[i, :m].float().cpu()
            self.token_version[r, n:n + m] = version
            self.length[r] = n + m
            self.finished[r] = bool(ro.finished[i]) if ro.finished is not None else False
        self.segments += 1
        return self.done

    def _batch(self, rows: list[int], columns: int) -> Batch:
        """Rows ``rows`` as a `Batch` of their first ``columns`` response columns (prompts left-padded as the
        finished batch pads them, so the prompt columns are the same)."""
        prompt_ids, prompt_mask = left_pad(self.prompt_rows, self.pad)  # (S, P)
        idx = torch.tensor(rows, dtype=torch.long)
        T = max(columns, 1)
        cols = torch.arange(T)
        mask = (cols.unsqueeze(0) < self.length[idx].unsqueeze(1)).float()  # (m, T)
        tokens = torch.where(mask.bool(), self.tokens[idx, :T], torch.full_like(self.tokens[idx, :T], self.pad))
        return Batch(input_ids=torch.cat([prompt_ids[idx], tokens], dim=1),
                     attention_mask=torch.cat([prompt_mask[idx], mask.long()], dim=1),
                     response_start=prompt_ids.shape[1], mask=mask, behaviour_logp=self.behaviour_logp[idx, :T] * mask,
                     rewards=torch.zeros(len(rows)), version=self.token_version[idx, 0],
                     example_index=self.example_index[idx])

    @torch.no_grad()
    def score(self, model, rollouts: Rollouts) -> None:
        """``old_logp`` of the tokens not yet scored, by ``model`` (the snapshot of the version that sampled
        them: the caller scores before installing other weights)."""
        rows = (self.scored < self.length).nonzero().squeeze(-1).tolist()
        if not rows:
            return
        columns = int(self.length[rows].max())
        batch = self._batch(rows, columns)
        old = recompute_logp(model, batch, rollouts.forward, mini_batch=rollouts.mini_batch, start_row=0)  # (m, T)
        for i, r in enumerate(rows):
            a, b = int(self.scored[r]), int(self.length[r])
            self.old_logp[r, a:b] = old[i, a:b]
            self.scored[r] = b

    def result(self, task, examples: list, tokenizer, *, bypass: bool) -> Batch:
        """The complete batch, scored by the task's verifier: ``version`` each row's oldest token's,
        ``token_version`` every token's, ``old_logp`` the recomputed log-probs (the engine's with ``bypass``)."""
        if not self.done:
            raise RuntimeError("result() of a partial rollout that is still generating")
        if not bypass and bool((self.scored < self.length).any()):
            raise RuntimeError("result() of a partial rollout with tokens not yet scored")
        S = len(self.prompt_rows)
        batch = self._batch(list(range(S)), int(self.length.max()))
        T = batch.mask.shape[1]
        versions = self.token_version[:, :T].clone()
        last = self.token_version[torch.arange(S), (self.length - 1).clamp_min(0)]  # (S,) each row's newest
        batch.token_version = torch.where(batch.mask.bool(), versions, last.unsqueeze(1).expand(S, T))
        batch.old_logp = batch.behaviour_logp.clone() if bypass else self.old_logp[:, :T] * batch.mask
        texts = []
        for r in range(S):
            ids = self.tokens[r, :int(self.length[r])].tolist()
            if self.finished[r] and ids and ids[-1] == tokenizer.eos_token_id:
                ids = ids[:-1]
            texts.append(tokenizer.decode(ids, skip_special_tokens=True))
        ro = Rollout(input_ids=batch.input_ids, attention_mask=batch.attention_mask, response_start=batch.response_start,
                     response_mask=batch.mask, behaviour_logp=batch.behaviour_logp, version=int(batch.version.min()),
                     responses=texts, finished=self.finished.clone())
        batch.rewards = torch.tensor(score_rollout(task, ro, examples))  # (S,)
        return batch

    def state(self) -> dict[str, Any]:
        """Tensors and plain values (a copy), for a checkpoint."""
        return {"prompt_rows": [list(r) for r in self.prompt_rows], "pad": self.pad, "segments": self.segments,
                **{name: getattr(self, name).clone() for name in self._TENSORS}}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "PartialRollout":
        pr = cls(state["prompt_rows"], state["example_index"], state["tokens"].shape[1], state["pad"])
        for name in cls._TENSORS:
            setattr(pr, name, state[name].clone())
        pr.segments = state["segments"]
        return pr

    _TENSORS = ("example_index", "tokens", "behaviour_logp", "old_logp", "token_version", "length", "scored",
                "finished")
