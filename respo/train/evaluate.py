"""Held-out evaluation: mean@k and unbiased pass@k from k samples per prompt, plus greedy accuracy.

For a prompt with n samples of which c are correct, the unbiased estimator of pass@j (Chen et al.,
2021, "Evaluating Large Language Models Trained on Code") is

    pass@j = 1 - C(n - c, j) / C(n, j)

averaged over prompts; mean@k is the mean correctness of all samples (the expected pass@1). The
standard error of each is the standard deviation of its per-prompt value divided by sqrt(P).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from respo.runtime.precision import mixed_precision
from respo.runtime.sampler import sample
from respo.runtime.tasks import score_rollout

__all__ = ["pass_at_k", "evaluate_policy", "summarize_correct", "paired_difference", "evaluate_held_out",
           "eval_record", "EVAL_SEED"]

EVAL_SEED = 1234  # held-out examples and eval sampling do not depend on the run seed
EVAL_TEMPERATURE = 1.0  # held-out samples come from the policy itself, whatever the run's temperature
GREEDY_TOP_P = 1e-9  # nucleus sampling that keeps only the arg-max token: greedy decoding


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k)/C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _mean_se(values: Sequence[float]) -> tuple[float, float]:
    t = torch.tensor(values, dtype=torch.float64)
    if t.numel() < 2:
        return float(t.mean()) if t.numel() else float("nan"), float("nan")
    return float(t.mean()), float(t.std(unbiased=True) / math.sqrt(t.numel()))


def paired_difference(before: Sequence[float], after: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the per-prompt difference ``after - before`` (same prompts)."""
    if len(before) != len(after):
        raise ValueError(f"paired evaluation needs the same prompts: {len(before)} vs {len(after)} values")
    return _mean_se([a - b for a, b in zip(after, before)])


def summarize_correct(correct: torch.Tensor) -> dict[str, float]:
    """Metrics from a (P, k) 0/1 correctness table (P prompts, k samples each)."""
    P, k = correct.shape
    c = correct.sum(1).long().tolist()
    out: dict[str, float] = {"prompts": P, "k": k}
    per_prompt = correct.double().mean(1).tolist()
    out[f"mean@{k}"], out[f"mean@{k}_se"] = _mean_se(per_prompt)
    out["per_prompt_mean"] = per_prompt  # for paired before/after comparisons
    for j in sorted({1, k} | ({2, 4, 8} & set(range(1, k + 1)))):
        out[f"pass@{j}"], out[f"pass@{j}_se"] = _mean_se([pass_at_k(k, ci, j) for ci in c])
    return out


@torch.no_grad()
def evaluate_policy(model, tokenizer, task, examples, *, k: int, max_new_tokens: int, temperature: float = 1.0,
                    generator: torch.Generator | None = None, batch_rows: int = 512, greedy: bool = True,
                    router_recorder=None, engine=None) -> dict[str, float]:
    """Sample ``k`` responses per held-out example at ``temperature`` and score them.

    The samples come from respo's sampler on ``model``, or from ``engine`` (a
    `respo.runtime.engines.RolloutEngine` already holding ``model``'s weights) when one is given.

    Returns:
        ``mean@k`` (+ ``_se``), ``pass@j`` for j in {1, 2, 4, 8, k} up to k (+ ``_se``), the mean
        response length, and ``greedy_acc`` (+ ``_se``) when ``greedy`` (`GREEDY_TOP_P` keeps only the
        arg-max token, i.e. greedy decoding).
    """
    def draw(prompts: list, top_p: float):
        t = temperature if top_p == 1.0 else 1.0  # greedy: the nucleus keeps the arg-max at temperature 1
        if engine is not None:
            return engine.sample(prompts, max_new_tokens=max_new_tokens, temperature=t, top_p=top_p,
                                 generator=generator, version=0)
        return sample(model, tokenizer, prompts, max_new_tokens=max_new_tokens, temperature=t, top_p=top_p,
                      generator=generator)

    was_training = model.training
    model.eval()
    try:
        prompts = [ex.prompt for ex in examples for _ in range(k)]
        rewards, lengths = [], []
        for i in range(0, len(prompts), batch_rows):
            ro = draw(prompts[i:i + batch_rows], 1.0)
            exs = [examples[j // k] for j in range(i, i + len(ro.responses))]
            rewards += score_rollout(task, ro, exs)
            lengths += ro.response_mask.sum(1).tolist()
        correct = (torch.tensor(rewards) > 0).float().view(len(examples), k)  # (P, k)
        out = summarize_correct(correct)
        out["response_length"] = float(sum(lengths) / max(len(lengths), 1))
        if greedy:
            acc = []
            for i in range(0, len(examples), batch_rows):
                chunk = examples[i:i + batch_rows]
                ro = draw([ex.prompt for ex in chunk], GREEDY_TOP_P)
                acc += [float(r > 0) for r in score_rollout(task, ro, chunk)]
            out["greedy_acc"], out["greedy_acc_se"] = _mean_se(acc)
        return out
    finally:
        model.train(was_training)


def evaluate_held_out(policy, task, examples, cfg, *, engine=None) -> dict:
    """A run's held-out evaluation: ``cfg.eval_k`` samples per example at `EVAL_TEMPERATURE`, drawn
    from a generator seeded with `EVAL_SEED` (the same draws before, during and after training).

    Args:
        policy: anything with ``model`` and ``tokenizer`` (a `respo.train.policy.Policy`).
        cfg: the run's `TrainConfig` (``eval_k``, ``max_new_tokens``, ``dtype``); the draws come from a
            generator on the model's device (CUDA draws differ from the CPU's).
        engine: the run's rollout engine, holding ``policy.model``'s current weights, when it is not respo's
            own sampler (``cfg.rollout_engine``): the evaluation then samples as the rollouts do.
    """
    gen = torch.Generator(device=next(policy.model.parameters()).device).manual_seed(EVAL_SEED)
    with mixed_precision(policy.model, cfg.dtype):
        return evaluate_policy(policy.model, policy.tokenizer, task, examples, k=cfg.eval_k,
                               max_new_tokens=cfg.max_new_tokens, temperature=EVAL_TEMPERATURE, generator=gen,
                               engine=engine)


def eval_record(ev: dict) -> dict:
    """The scalar part of an evaluation as ``eval/<name>`` metrics (per-prompt lists left out)."""
    return {f"eval/{k}": v for k, v in ev.items() if not isinstance(v, list)}
