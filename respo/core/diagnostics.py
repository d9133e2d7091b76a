"""Weight diagnostics: make the spread of W and gradient starvation visible.

All statistics are over non-empty rows (at least one valid token) and returned as detached 0-d
tensors (the caller converts), computed in float32 for float16/bfloat16 inputs (``stat_dtype``). A statistic of an empty set (e.g. the mean φ of positives in a batch
with no positive advantage) is NaN, not 0, and ``n_pos``/``n_neg`` say why.

Keys:
  log_w/p01 … log_w/p99     quantiles (1, 10, 50, 90, 99 %) of log W
  log_w/mean, log_w/min, log_w/max
  ess_w                     (Σ W)² / (n Σ W²) of the raw weights (1 = uniform, 1/n = one sample)
  ess_phi                   the same for the coefficients φ
  coef_mean                 Σ φ / n: the effective step size the objective takes
  phi/pos_mean|min|max      φ over positive-advantage responses (Â > 0)
  phi/neg_mean|min|max      φ over negative-advantage responses (Â < 0)
  n_pos, n_neg, n_zero_adv  counts of responses by advantage sign
  frac_pos_low_w            fraction of positives with log W < −1 (under-generated correct responses)
  pos_low_w_mass_share      their share of the positives' coefficient mass Σφ (ReSPO paper: 22.8 % of
                            positives received 38.5 % of ReSPO's mass vs 15.5 % under VESPO)
  frac_starved              fraction of responses whose coefficient φ < 1e-3
  approx_kl                 k1 estimate of KL(π_old ‖ π_θ) per token: −Σ log W / Σ tokens
  kl_k3                     k3 estimate per token, mean of (r − 1 − log r), when token ratios are given

Same-batch kernel comparison (whatever objective trains, on this batch's log W and signs):
  same_batch/frac_pos_low_w              fraction of positives with log W < −1 (= frac_pos_low_w)
  same_batch/respo_pos_low_w_mass_share  Σ_{low} φ⁺_ReSPO / Σ_{pos} φ⁺_ReSPO with the published φ⁺
                                         (respo_kernel(*RESPO_POS)): the share of positive
                                         coefficient mass ReSPO would give the under-generated
  same_batch/vespo_pos_low_w_mass_share  the same under VESPO's φ⁺ (vespo_kernel(*VESPO_POS))
  (the paper's "22.8 % of positives, 38.5 % of ReSPO's mass vs 15.5 % under VESPO" reads these
  three on one batch.)

Histogram of log W per advantage sign, counts over fixed left-closed bins [lo, hi) with the edges
LOG_W_BIN_EDGES between −inf and +inf (12 bins; the four below −1 hold exactly the "low" rows):
  log_w_hist/pos/[-inf,-8) … log_w_hist/pos/[2,+inf)   positives (Â > 0)
  log_w_hist/neg/[-inf,-8) … log_w_hist/neg/[2,+inf)   negatives (Â < 0)
(rows with NaN log W are in no bin.)
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch

from respo.core.kernels import RESPO_POS, VESPO_POS, respo_kernel, vespo_kernel
from respo.core.ratios import LOG_W_CLAMP

QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
LOW_W = -1.0  # log W threshold of "under-generated"
STARVED = 1e-3  # coefficient below which a response is "starved"
#: Inner edges of the log W histogram; the bins are [−inf, −8), [−8, −4), …, [2, +inf).
LOG_W_BIN_EDGES = (-8.0, -4.0, -2.0, -1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.0, 2.0)
SIGNS = ("pos", "neg")  # advantage signs of the histogram: Â > 0, Â < 0

_RESPO_POS_PHI = respo_kernel(*RESPO_POS)  # φ⁺(W) = ((1+W)/2)·e^(1−W)
_VESPO_POS_PHI = vespo_kernel(*VESPO_POS)  # φ⁺(W) = W²·e^(3(1−W))


def stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype diagnostics are computed in: float64 stays, float16/bfloat16 (and non-float) become float32.

    Quantiles do not exist for half types, and sums of many half values lose the counts' precision."""
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def masked_frac(cond: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Fraction of valid tokens where cond holds (verl's masked_mean of a 0/1 tensor)."""
    m = mask.to(stat_dtype(mask.dtype))
    return (cond.to(m.dtype) * m).sum() / m.sum().clamp(min=1)


def clip_fractions(mask: torch.Tensor, high, low, dual=None, either=None) -> Dict[str, torch.Tensor]:
    """``clipfrac_high``, ``clipfrac_low``, ``clipfrac_dual`` and verl's ``clipfrac`` of the given cuts."""
    cuts = {"clipfrac_high": high, "clipfrac_low": low, "clipfrac_dual": dual, "clipfrac": either}
    return {key: masked_frac(cut, mask) for key, cut in cuts.items() if cut is not None}


def _edge_name(x: float) -> str:
    return "+inf" if x == math.inf else f"{x:g}"


def log_w_bin_names(edges: Tuple[float, ...] = LOG_W_BIN_EDGES) -> Tuple[str, ...]:
    """"[lo,hi)" per bin of the inner ``edges`` bounded by ∓inf: "[-inf,-8)", …, "[2,+inf)"."""
    bounds = (-math.inf, *edges, math.inf)
    return tuple(f"[{_edge_name(lo)},{_edge_name(hi)})" for lo, hi in zip(bounds[:-1], bounds[1:]))


LOG_W_BIN_NAMES = log_w_bin_names()


def _nan(like: torch.Tensor) -> torch.Tensor:
    return torch.full((), math.nan, dtype=like.dtype, device=like.device)


def _masked_stats(x: torch.Tensor, sel: torch.Tensor, prefix: str) -> Dict[str, torch.Tensor]:
    n = sel.sum()
    big = torch.finfo(x.dtype).max
    mean = torch.where(sel, x, torch.zeros_like(x)).sum() / n
    mn = torch.where(sel, x, torch.full_like(x, big)).min()
    mx = torch.where(sel, x, torch.full_like(x, -big)).max()
    empty = n == 0
    nan = _nan(x)
    return {
        f"{prefix}_mean": torch.where(empty, nan, mean),
        f"{prefix}_min": torch.where(empty, nan, mn),
        f"{prefix}_max": torch.where(empty, nan, mx),
    }


def _mass_share(phi: torch.Tensor, pos: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """Σ_{low} φ / Σ_{pos} φ (NaN when the positives carry no mass); ``low`` ⊆ ``pos``, shapes (B,)."""
    zero = torch.zeros_like(phi)
    pos_mass = torch.where(pos, phi, zero).sum()
    low_mass = torch.where(low, phi, zero).sum()
    return torch.where(pos_mass > 0, low_mass / pos_mass.clamp(min=1e-38), _nan(phi))


def log_w_histogram(log_w: torch.Tensor, sel: torch.Tensor, edges: Tuple[float, ...] = LOG_W_BIN_EDGES) -> torch.Tensor:
    """Counts of the selected log W per left-closed bin [e_{i−1}, e_i) of ``edges`` bounded by ∓inf.

    Args:
      log_w: (B,) log-weights (±inf fall in the end bins; NaN in none).
      sel: (B,) bool selection, or (S, B) for S selections at once.

    Returns:
      (len(edges) + 1,) counts in ``log_w``'s dtype, or (S, len(edges) + 1).
    """
    bounds = torch.tensor(edges, dtype=log_w.dtype, device=log_w.device)  # (E,)
    idx = torch.bucketize(log_w, bounds, right=True)  # (B,), bounds[i−1] ≤ x < bounds[i]
    bins = torch.arange(len(edges) + 1, device=log_w.device)  # (E+1,)
    one_hot = ((idx.unsqueeze(1) == bins) & ~torch.isnan(log_w).unsqueeze(1)).to(log_w.dtype)  # (B, E+1)
    return sel.to(log_w.dtype) @ one_hot  # (E+1,) or (S, E+1): exact integer counts


def ess_ratio_log(log_v: torch.Tensor, sel: torch.Tensor) -> torch.Tensor:
    """(Σv)²/(nΣv²) from log v over the selected entries, computed in log space (no overflow)."""
    n = sel.sum()
    neg_inf = torch.full_like(log_v, -math.inf)
    lv = torch.where(sel, log_v, neg_inf)
    lse1 = torch.logsumexp(lv, dim=0)
    lse2 = torch.logsumexp(2 * lv, dim=0)
    ess = torch.exp(2 * lse1 - lse2) / n
    return torch.where((n == 0) | torch.isinf(lse1), _nan(log_v), ess)


@torch.no_grad()
def weight_diagnostics(
    log_w: torch.Tensor,
    phi: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    token_log_ratio: Optional[torch.Tensor] = None,
) -> Dict[str, torch.Tensor]:
    """Diagnostics of the sequence weights and the coefficients an objective gives them.

    Args:
      log_w: (B,) sequence log-weights log W.
      phi: (B,) per-sequence coefficient (for token-level objectives, the masked token mean of the
        per-token coefficient c in ∇L = −agg[c·Â·∇logp]).
      advantages: (B,) sequence advantages (or (B, T): the masked token mean is used).
      mask: (B, T) validity mask.
      token_log_ratio: optional (B, T) logp − old_logp, for the k3 KL estimate.

    Returns:
      dict of detached 0-d tensors (keys in the module docstring).
    """
    log_w = log_w.detach()
    dtype = stat_dtype(log_w.dtype)
    log_w = log_w.to(dtype)
    phi = phi.detach().to(dtype)
    m = mask.detach().to(dtype)
    n_tok = m.sum(dim=-1)  # (B,)
    rows = n_tok > 0  # (B,)
    adv = advantages.detach().to(dtype)
    if adv.dim() == 2:
        adv = (adv * m).sum(dim=-1) / n_tok.clamp(min=1)
    if not (log_w.shape == phi.shape == adv.shape == rows.shape):
        raise ValueError(
            f"log_w {tuple(log_w.shape)}, phi {tuple(phi.shape)}, advantages {tuple(adv.shape)} and mask rows "
            f"({rows.shape[0]},) must agree"
        )
    n = rows.sum().to(dtype)
    out: Dict[str, torch.Tensor] = {}

    lw_sel = log_w[rows]
    if lw_sel.numel():
        qs = torch.quantile(lw_sel, torch.tensor(QUANTILES, dtype=dtype, device=log_w.device))
        for q, v in zip(QUANTILES, qs):
            out[f"log_w/p{round(q * 100):02d}"] = v
    else:
        for q in QUANTILES:
            out[f"log_w/p{round(q * 100):02d}"] = _nan(log_w)
    st = _masked_stats(log_w, rows, "log_w/x")
    out["log_w/mean"], out["log_w/min"], out["log_w/max"] = st["log_w/x_mean"], st["log_w/x_min"], st["log_w/x_max"]

    out["ess_w"] = ess_ratio_log(log_w, rows)
    log_phi = torch.log(phi.clamp(min=0))
    out["ess_phi"] = ess_ratio_log(log_phi, rows)
    out["coef_mean"] = torch.where(n > 0, torch.where(rows, phi, torch.zeros_like(phi)).sum() / n.clamp(min=1), _nan(phi))

    pos = rows & (adv > 0)
    neg = rows & (adv < 0)
    out.update(_masked_stats(phi, pos, "phi/pos"))
    out.update(_masked_stats(phi, neg, "phi/neg"))
    n_pos = pos.sum().to(dtype)
    out["n_pos"] = n_pos
    out["n_neg"] = neg.sum().to(dtype)
    out["n_zero_adv"] = (rows & (adv == 0)).sum().to(dtype)

    low = pos & (log_w < LOW_W)
    out["frac_pos_low_w"] = torch.where(n_pos > 0, low.sum().to(dtype) / n_pos.clamp(min=1), _nan(phi))
    zero = torch.zeros_like(phi)
    out["pos_low_w_mass_share"] = _mass_share(phi, pos, low)
    out["frac_starved"] = (rows & (phi < STARVED)).sum().to(dtype) / n.clamp(min=1)

    total_tok = n_tok.sum()
    out["approx_kl"] = -torch.where(rows, log_w, zero).sum() / total_tok.clamp(min=1)
    if token_log_ratio is not None:
        d = token_log_ratio.detach().to(dtype).clamp(-LOG_W_CLAMP, LOG_W_CLAMP)  # clamp also maps NaN-free masked values to finite
        k3 = torch.expm1(d).sub_(d)  # (B, T), r − 1 − log r ≥ 0
        out["kl_k3"] = torch.where(m > 0, k3, torch.zeros((), dtype=dtype, device=k3.device)).sum() / total_tok.clamp(min=1)
    out.update(same_batch_diagnostics(log_w, pos, low, frac_pos_low_w=out["frac_pos_low_w"]))
    counts = log_w_histogram(log_w, torch.stack((pos, neg)))  # (2, n_bins), rows in SIGNS order
    for sign, row in zip(SIGNS, counts.unbind()):
        out.update({f"log_w_hist/{sign}/{name}": c for name, c in zip(LOG_W_BIN_NAMES, row.unbind())})
    return out


def same_batch_diagnostics(
    log_w: torch.Tensor, pos: torch.Tensor, low: torch.Tensor, *, frac_pos_low_w: torch.Tensor
) -> Dict[str, torch.Tensor]:
    """The share of positive coefficient mass ReSPO's and VESPO's published φ⁺ would each give the
    under-generated positives (log W < −1) of this batch, whichever objective produced it.

    Args:
      log_w: (B,) detached sequence log-weights.
      pos: (B,) bool, non-empty rows with Â > 0.
      low: (B,) bool, ``pos`` rows with log W < LOW_W.
      frac_pos_low_w: 0-d, |low| / |pos| (already computed; repeated under ``same_batch/``).
    """
    phi = torch.stack((_RESPO_POS_PHI(log_w), _VESPO_POS_PHI(log_w)))  # (2, B)
    zero = torch.zeros((), dtype=phi.dtype, device=phi.device)
    pos_mass = torch.where(pos, phi, zero).sum(dim=-1)  # (2,)
    low_mass = torch.where(low, phi, zero).sum(dim=-1)  # (2,)
    share = torch.where(pos_mass > 0, low_mass / pos_mass.clamp(min=1e-38), _nan(phi))  # (2,)
    respo_share, vespo_share = share.unbind()
    return {
        "same_batch/frac_pos_low_w": frac_pos_low_w,
        "same_batch/respo_pos_low_w_mass_share": respo_share,
        "same_batch/vespo_pos_low_w_mass_share": vespo_share,
    }
