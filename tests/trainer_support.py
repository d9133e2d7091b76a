"""Shared pieces of the trainer-level tests: a smoke-sized config, a random-init tiny-dense policy on
addition with the overlong penalty (so a random policy gets non-zero group advantages), a rollout."""

import pytest
import torch

from respo.runtime.models import build_policy
from respo.runtime.tasks import get_task
from respo.runtime.tokenizer import build_char_tokenizer
from respo.train.config import Forward, Sampling, TrainConfig, apply_overrides
from respo.train.policy import Policy
from respo.core import group_advantages
from respo.runtime.engines.respo import RespoEngine
from respo.train.rollout import recompute_logp, sample_rollout


def small_cfg(**kw) -> TrainConfig:
    base = dict(task_kwargs={"overlong": [12, 11]}, warm_start=False, prompts=2, group_size=4, max_new_tokens=12,
                eval_prompts=0, progress=False, tensorboard=False, lr=1e-3, warmup=0)
    return apply_overrides(TrainConfig(), {**base, **kw})


@pytest.fixture(scope="module")
def setup():
    tok = build_char_tokenizer()
    model = build_policy("tiny-dense", tok, seed=0)
    task = get_task("addition", overlong=(12, 11))
    pool = task.examples("train", 64, 0)
    return Policy(model, tok, {}), task, pool


def rollout(setup, cfg, n_prompts):
    """A rollout of ``n_prompts`` prompts x G with advantages and ``old_logp`` (as the sync trainer computes them)."""
    policy, task, pool = setup
    engine = RespoEngine(policy.model, policy.tokenizer, dtype=cfg.dtype)
    batch, _ = sample_rollout(engine, task, pool, list(range(n_prompts)), Sampling.of(cfg), torch.Generator().manual_seed(0), 0)
    batch.adv = group_advantages(batch.rewards, cfg.group_size, kind=cfg.adv_kind)  # (S,)
    batch.old_logp = recompute_logp(policy.model, batch, Forward.of(cfg), mini_batch=cfg.mini_batch_seqs)
    return batch
