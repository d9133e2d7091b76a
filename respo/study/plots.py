"""Figures of the staleness report (matplotlib, Agg backend, PNG files).

Each function takes loaded `Run`s (or plain numbers) and a path, draws one figure, saves it and
returns the path. No number is computed here that the report's tables do not also show, except
the kernel curves (drawn from the core's own loss gradients) and the reconstructed log W
histograms (see `logw_samples_from_quantiles`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from respo.study.aggregate import Run, metric_series  # noqa: E402
from respo.train.scores import early_count, late_count  # noqa: E402

__all__ = ["kernel_coefficients", "plot_kernels", "plot_curves", "plot_metric_curves", "plot_heatmaps",
           "logw_samples_from_quantiles", "plot_logw_hist", "plot_run_curve", "plot_runs_overlay", "plot_side_by_side", "COLORS"]

COLORS = {"grpo": "tab:blue", "gspo": "tab:green", "vespo": "tab:orange", "respo": "tab:red",
          "respo+/vespo-": "tab:purple", "vespo+/respo-": "tab:brown", "reinforce": "tab:gray"}
QUANTILE_KEYS = (("log_w/p01", 0.01), ("log_w/p10", 0.10), ("log_w/p50", 0.50), ("log_w/p90", 0.90),
                 ("log_w/p99", 0.99))



def _save(fig, path: str | Path, title: str, *, dpi: int) -> Path:
    """Title (if any), tight layout, write the PNG, free the figure."""
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return Path(path)


def _color(label: str, i: int) -> str:
    return COLORS.get(label, f"C{i % 10}")


def kernel_coefficients(objective: str, log_w: torch.Tensor, sign: float, **hparams) -> torch.Tensor:
    """Gradient coefficient c(W) an objective gives a one-token response with log-ratio ``log_w``.

    With one token per row and token-mean aggregation, L = (1/B) Σ_i ℓ_i and the core's objectives
    all satisfy ∂L/∂logp_i = −c_i·Â_i/B, so c_i = −B·(∂L/∂logp_i)/Â_i. For ReSPO/VESPO c = φ(W);
    for GRPO it is the per-token ratio r = W where unclipped and 0 where clipped (its effective
    coefficient).

    Args:
        log_w: (B,) log W values; sign: +1 or −1 (the advantage sign).
    Returns:
        (B,) coefficients.
    """
    from respo import policy_loss

    B = log_w.shape[0]
    old = torch.zeros(B, 1, dtype=torch.float64)
    logp = log_w.to(torch.float64).view(B, 1).clone().requires_grad_(True)  # (B, 1)
    adv = torch.full((B,), float(sign), dtype=torch.float64)
    mask = torch.ones(B, 1, dtype=torch.float64)
    loss, _ = policy_loss(objective, logp, old, adv, mask, loss_agg_mode="token-mean", **hparams)
    (g,) = torch.autograd.grad(loss, logp)
    return (-B * g.view(B) / adv).detach()


def plot_kernels(path: str | Path) -> Path:
    """φ(W) of ReSPO, VESPO and GRPO's effective coefficient, both advantage signs."""
    log_w = torch.linspace(-6, 3, 601, dtype=torch.float64)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for ax, sign, title in ((axes[0], 1.0, "Â > 0 (positive branch)"), (axes[1], -1.0, "Â < 0 (negative branch)")):
        for name in ("respo", "vespo", "grpo"):
            c = kernel_coefficients(name, log_w, sign)
            ax.plot(log_w.numpy(), c.numpy(), label=name if name != "grpo" else "grpo (token r, clipped → 0)",
                    color=_color(name, 0))
        ax.axvline(-1, color="k", lw=0.6, ls=":")
        ax.set_title(title)
        ax.set_xlabel("log W")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("coefficient φ(W)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def _smooth(x: np.ndarray, w: int) -> np.ndarray:
    """Trailing running mean over ``w`` updates (NaN-aware)."""
    if w <= 1:
        return x
    out = np.full_like(x, np.nan, dtype=float)
    for i in range(len(x)):
        seg = x[max(0, i - w + 1): i + 1]
        seg = seg[np.isfinite(seg)]
        out[i] = seg.mean() if seg.size else np.nan
    return out


def plot_metric_curves(groups: dict[tuple[str, int], list[Run]], key: str, path: str | Path, *, ylabel: str,
                       smooth: int = 8, log_y: bool = False, title: str = "") -> Path:
    """One panel per N, one line per objective (mean over seeds), band = min..max over seeds.

    Args:
        groups: (objective label, N) -> runs (the seeds).
    """
    Ns = sorted({n for _, n in groups})
    labels = list(dict.fromkeys(lbl for lbl, _ in groups))
    fig, axes = plt.subplots(1, len(Ns), figsize=(3.6 * len(Ns), 3.2), sharey=True, squeeze=False)
    for ax, N in zip(axes[0], Ns):
        for i, lbl in enumerate(labels):
            runs = groups.get((lbl, N), [])
            if not runs:
                continue
            L = min(len(r.records) for r in runs)
            if L == 0:
                continue
            ys = np.array([_smooth(np.array(metric_series(r, key)[:L], dtype=float), smooth) for r in runs])
            x = np.arange(1, L + 1)
            with np.errstate(all="ignore"):
                m = np.nanmean(ys, 0)
            ax.plot(x, m, color=_color(lbl, i), label=f"{lbl} ({len(runs)})")
            if len(runs) > 1:
                ax.fill_between(x, np.nanmin(ys, 0), np.nanmax(ys, 0), color=_color(lbl, i), alpha=0.15)
        ax.set_title(f"N = {N}")
        ax.set_xlabel("policy update")
        if log_y:
            ax.set_yscale("symlog", linthresh=1e-3)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    axes[0][-1].legend(fontsize=7)
    return _save(fig, path, title, dpi=100)


def plot_curves(groups: dict[tuple[str, int], list[Run]], path: str | Path, *, smooth: int = 8, title: str = "") -> Path:
    """Training score (normalised, (r+1)/2) per update, one panel per N."""
    return plot_metric_curves(groups, "score", path, ylabel=f"training score (running mean of {smooth})",
                              smooth=smooth, title=title)


def plot_heatmaps(cells: dict[tuple[str, float, int], float], path: str | Path, *, title: str = "") -> Path:
    """Late mean over lr x N, one heat map per objective (the stability map).

    Args:
        cells: (objective, lr, N) -> late mean (mean over seeds).
    """
    objs = list(dict.fromkeys(o for o, _, _ in cells))
    lrs = sorted({lr for _, lr, _ in cells})
    Ns = sorted({n for _, _, n in cells})
    vals = [v for v in cells.values() if math.isfinite(v)]
    vmin, vmax = (min(vals), max(vals)) if vals else (0, 1)
    fig, axes = plt.subplots(1, len(objs), figsize=(3.1 * len(objs) + 1.0, 3.0), squeeze=False)
    fig.subplots_adjust(wspace=0.45, top=0.82)
    im = None
    for ax, o in zip(axes[0], objs):
        grid = np.full((len(lrs), len(Ns)), np.nan)
        for (oo, lr, n), v in cells.items():
            if oo == o:
                grid[lrs.index(lr), Ns.index(n)] = v
        im = ax.imshow(grid, origin="lower", cmap="viridis", vmin=vmin, vmax=vmax, aspect="auto")
        for a in range(len(lrs)):
            for b in range(len(Ns)):
                if np.isfinite(grid[a, b]):
                    ax.text(b, a, f"{grid[a, b]:.2f}", ha="center", va="center", fontsize=8,
                            color="w" if grid[a, b] < (vmin + vmax) / 2 else "k")
        ax.set_xticks(range(len(Ns)), [str(n) for n in Ns])
        ax.set_yticks(range(len(lrs)), [f"{lr:g}" for lr in lrs])
        ax.set_xlabel("N")
        ax.set_title(o)
    axes[0][0].set_ylabel("learning rate")
    if im is not None:
        fig.colorbar(im, ax=axes[0].tolist(), shrink=0.85, label="late mean")
    if title:
        fig.suptitle(title, fontsize=10, y=0.99)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return Path(path)


def logw_samples_from_quantiles(records: Sequence[dict], n_per_record: int = 50) -> np.ndarray:
    """Approximate log W samples from the logged per-update quantiles (1, 10, 50, 90, 99 %).

    The trainer logs five quantiles per update, not raw weights; between them the inverse CDF is
    taken as piecewise linear, evaluated at ``n_per_record`` evenly spaced probabilities in
    [0.01, 0.99]. Tails beyond the 1 % / 99 % quantiles are therefore not represented.
    """
    probs = np.linspace(0.01, 0.99, n_per_record)
    qp = np.array([p for _, p in QUANTILE_KEYS])
    out = []
    for r in records:
        qv = [r.get(k) for k, _ in QUANTILE_KEYS]
        if any(v is None for v in qv):
            continue
        out.append(np.interp(probs, qp, np.array(qv, dtype=float)))
    return np.concatenate(out) if out else np.zeros(0)


def plot_logw_hist(groups: dict[tuple[str, int], list[Run]], path: str | Path, *, title: str = "") -> Path:
    """Histograms of log W early (first quarter of updates) and late (last eighth), stale updates
    only (staleness > 0), one row per N > 1, one column per objective."""
    Ns = sorted({n for _, n in groups if n > 1})
    labels = list(dict.fromkeys(lbl for lbl, _ in groups))
    if not Ns:
        Ns = sorted({n for _, n in groups})
    fig, axes = plt.subplots(len(Ns), len(labels), figsize=(2.8 * len(labels), 2.2 * len(Ns)), squeeze=False)
    for a, N in enumerate(Ns):
        for b, lbl in enumerate(labels):
            ax = axes[a][b]
            runs = groups.get((lbl, N), [])
            early, late = [], []
            for r in runs:
                U = len(r.records)
                stale = [(i, x) for i, x in enumerate(r.records) if (x.get("staleness_mean") or 0) > 0]
                early += [x for i, x in stale if i < early_count(U)]
                late += [x for i, x in stale if i >= U - late_count(U)]
            e, lt = logw_samples_from_quantiles(early), logw_samples_from_quantiles(late)
            both = np.concatenate([e, lt]) if e.size + lt.size else np.zeros(1)
            lo, hi = min(-3.0, float(np.percentile(both, 0.5))), max(0.5, float(np.percentile(both, 99.5)))
            bins = np.linspace(lo, hi, 40)
            if e.size:
                ax.hist(e, bins=bins, density=True, alpha=0.5, label="early", color="tab:blue")
            if lt.size:
                ax.hist(lt, bins=bins, density=True, alpha=0.5, label="late", color="tab:red")
            ax.axvline(-1, color="k", lw=0.6, ls=":")
            ax.set_title(f"{lbl}, N = {N}", fontsize=8)
            ax.tick_params(labelsize=7)
            if a == len(Ns) - 1:
                ax.set_xlabel("log W", fontsize=8)
    axes[0][0].legend(fontsize=7)
    return _save(fig, path, title, dpi=90)


#: Window of the moving mean drawn over a single run's training score.
RUN_CURVE_WINDOW = 8


def plot_run_curve(records: Sequence[dict], path: str | Path, title: str) -> Path:
    """One run: training score per update (raw and a moving mean) and the weight spread (log W p10, p50)."""
    u = [r["update"] for r in records]
    score = [r.get("score") for r in records]
    win = RUN_CURVE_WINDOW
    smooth = [float(np.mean(score[max(0, i - win + 1):i + 1])) for i in range(len(score))]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    axes[0].plot(u, score, color="0.75", lw=0.8, label="score (r+1)/2")
    axes[0].plot(u, smooth, color="C0", lw=2, label=f"{win}-update mean")
    axes[0].set_xlabel("update")
    axes[0].set_ylabel("training score")
    axes[0].legend(loc="lower right")
    for key, color in (("log_w/p10", "C3"), ("log_w/p50", "C1")):
        vals = [r.get(key) for r in records]
        if any(v is not None for v in vals):
            axes[1].plot(u, [math.nan if v is None else v for v in vals], color=color, lw=1, label=f"log W {key[-3:]}")
    if axes[1].lines:
        axes[1].axhline(0, color="0.5", lw=0.5)
        axes[1].set_xlabel("update")
        axes[1].set_ylabel("sequence log-weight")
        axes[1].legend(loc="lower left")
    return _save(fig, path, title, dpi=110)


def plot_runs_overlay(runs: Sequence[Run], path: str | Path, *, smooth: int = RUN_CURVE_WINDOW, title: str = "") -> Path:
    """A few runs on one axis: each run's training score per update (moving mean of ``smooth``), labelled
    by its directory name and objective."""
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for i, r in enumerate(runs):
        y = np.array(metric_series(r, "score"), dtype=float)
        if y.size == 0:
            continue
        lbl = f"{r.path.name} ({r.coords['objective']})"
        ax.plot(np.arange(1, y.size + 1), _smooth(y, smooth), color=f"C{i % 10}", label=lbl)
    ax.set_xlabel("policy update")
    ax.set_ylabel(f"training score (running mean of {smooth})")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)
    return _save(fig, path, title, dpi=100)


def plot_side_by_side(rows: Sequence[dict], path: str | Path, *, k: int, starved_key: str) -> Path:
    """A few runs of one setting with different objectives (``respo demo``), one row each: ``objective``,
    ``records`` (the run's update records), ``delta`` and ``delta_se`` (held-out change after − before and
    its standard error). Three panels: the training score (moving mean of 8), ``starved_key`` per stale
    update, and each run's held-out change with its 95 % interval."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for i, row in enumerate(rows):
        color = _color(row["objective"], i)
        recs = row["records"]
        axes[0].plot([r["update"] for r in recs], _smooth(np.array([r.get("score", math.nan) for r in recs], dtype=float), 8),
                     color=color, label=row["objective"])
        stale = [r for r in recs if r.get("staleness_max", 0) > 0]
        axes[1].plot([r["update"] for r in stale], [r.get(starved_key, math.nan) for r in stale], ".", ms=3, color=color,
                     label=row["objective"])
        axes[2].errorbar([i], [row["delta"]], yerr=[1.96 * row["delta_se"]], fmt="o", color=color, capsize=4)
    axes[0].set(xlabel="update", ylabel="training score (running mean of 8)")
    axes[1].set(xlabel="update (stale mini-batches)", ylabel="positives with log W < −1", ylim=(-0.02, 1.02))
    axes[2].axhline(0, color="0.5", lw=0.6)
    axes[2].set_xticks(range(len(rows)), [r["objective"] for r in rows], fontsize=8)
    axes[2].set(ylabel=f"held-out mean@{k}: after − before (95 % CI)")
    for ax in axes[:2]:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, path, "", dpi=100)
