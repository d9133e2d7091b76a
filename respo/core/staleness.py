"""Staleness of a batch token by token: for responses whose tokens come from several policy versions.

With partial rollouts a response is generated in segments and the weights may change between them, so
token t of response i was sampled by version v_it. Against the learner's version c its lag is
s_it = c − v_it, and over the valid tokens (mask m_it = 1):

    staleness_mean  = Σ_it m_it s_it / Σ_it m_it               (per token, not per response)
    staleness_max   = max over valid tokens of s_it
    staleness/lag_k = (1/R) Σ_i (Σ_t m_it [s_it = k]) / (Σ_t m_it)   for k = 0 .. staleness_max
                      (the fraction of a response from lag k, averaged over its R responses)
    staleness/mixed = the share of responses whose tokens span two or more versions

With one version per response the lag fractions are the share of responses at each lag and ``mixed`` is 0;
``staleness_mean`` stays a mean over tokens, which is the mean over responses when every response of the
batch has one version (every batch respo makes without partial rollouts) or all have one length.
"""

from __future__ import annotations

import torch

__all__ = ["token_staleness_metrics"]


def token_staleness_metrics(token_version: torch.Tensor, mask: torch.Tensor, current: int) -> dict[str, float]:
    """The per-token staleness numbers of the module docstring.

    Args:
        token_version: (S, T) integer, the version that sampled each token (padding is not read).
        mask: (S, T), 1 on valid tokens.
        current: the learner's version.

    Raises:
        ValueError: shapes differ, no token is valid, or a valid token's version is ahead of ``current``.
    """
    if token_version.shape != mask.shape:
        raise ValueError(f"token_version has shape {tuple(token_version.shape)}, mask {tuple(mask.shape)}: "
                         "they must match")
    valid = mask > 0  # (S, T)
    if not bool(valid.any()):
        raise ValueError("no valid token in the batch: its staleness is undefined")
    lag = (current - token_version.long()).masked_fill(~valid, 0)  # (S, T)
    if bool((lag < 0).any()):
        ahead = int(token_version.long().masked_fill(~valid, current).max())
        raise ValueError(f"a token's version {ahead} is ahead of the learner's {current}")
    n = valid.sum(1)  # (S,) tokens per response
    rows = n > 0  # responses with a token
    s_max = int(lag.max())
    out = {"staleness_mean": float(lag[valid].double().mean()), "staleness_max": s_max}
    for k in range(s_max + 1):
        share = ((lag == k) & valid).sum(1).double() / n.clamp_min(1)  # (S,)
        out[f"staleness/lag_{k}"] = float(share[rows].mean())
    lo = token_version.long().masked_fill(~valid, torch.iinfo(torch.long).max).min(1).values  # (S,)
    hi = token_version.long().masked_fill(~valid, torch.iinfo(torch.long).min).max(1).values  # (S,)
    out["staleness/mixed"] = float((hi[rows] > lo[rows]).double().mean())
    return out
