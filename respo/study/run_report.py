"""``report.md`` + ``curve.png`` for one finished run directory (``respo demo``, or any ``respo train`` run).

Every number is read from the run's own files (``config.json``, ``metrics.jsonl``,
``summary.json``). The diagnostics table compares the early window (first quarter of the updates)
with the late window (last eighth), the windows of `respo.train.scores.early_max` and
`respo.train.scores.late_mean`. The staleness study across many runs is `respo.study.report`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

from respo.fileio import write_text_atomic
from respo.study.aggregate import nanmean
from respo.study.plots import plot_run_curve
from respo.study.baseline import sweep_baseline
from respo.train.evaluate import paired_difference
from respo.fileio import read_jsonl
from respo.train.scores import early_count, late_count

__all__ = ["write_run_report", "DIAGNOSTICS", "LOW_W_STARVATION_SHARE"]

#: (metrics.jsonl key, label) of the per-update diagnostics the report tabulates.
DIAGNOSTICS = (("score", "training score (r+1)/2"), ("response_length", "response length"), ("entropy", "entropy"),
               ("log_w/p10", "log W p10"), ("log_w/p50", "log W p50"),
               ("frac_pos_low_w", "positives with log W < -1"),
               ("pos_low_w_mass_share", "their share of positive coefficient mass"),
               ("frac_starved", "starved (phi < 1e-3)"), ("ess_phi", "ESS of phi"), ("approx_kl", "approx KL"),
               ("grad_norm", "grad norm"))
#: Share of positives at log W < -1 above which the report calls the run starvation-prone.
LOW_W_STARVATION_SHARE = 0.05


def _fmt(ev: Mapping[str, Any] | None, key: str) -> str:
    if not ev or ev.get(key) is None:
        return "n/a"
    se = ev.get(f"{key}_se")
    return f"{ev[key]:.3f} ± {se:.3f}" if se is not None and math.isfinite(se) else f"{ev[key]:.3f}"


def _window_mean(recs: list[dict], key: str) -> float:
    return nanmean(r.get(key) for r in recs)


def _cell(x: float) -> str:
    return f"{x:.4g}" if math.isfinite(x) else "n/a"


def write_run_report(run_dir: str | Path, *, note: str = "", wall_s: float | None = None) -> Path:
    """Write ``report.md`` and ``curve.png`` into ``run_dir``; returns the path of ``report.md``.

    Args:
        run_dir: a finished run directory (``config.json``, ``metrics.jsonl``, ``summary.json``).
        note: markdown written under "Why these settings" (omitted when empty).
        wall_s: total wall time of the command that made the run, if known.
    """
    run_dir = Path(run_dir)
    cfg = json.loads((run_dir / "config.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    recs = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "event" not in r]
    before, after = summary.get("eval_before"), summary.get("eval_after")
    before_note = ""
    if before is None and cfg.get("eval_before") is False:
        before = sweep_baseline(run_dir)  # a sweep measured the starting policy once for all its runs
        if before is not None:
            before_note = ("\n\n\"before\" is the sweep's own evaluation of this starting policy under the same "
                           "protocol (`baseline_eval/`), which the run did not repeat.")
    k = cfg["eval_k"]
    title = f"{cfg['objective']} N={cfg['reuse']} lr={cfg['lr']:g} ({cfg['model']}, {cfg['task']})"
    plot_run_curve(recs, run_dir / "curve.png", title)
    mean_key = f"mean@{k}"
    lines = [
        f"# respo run report: {title}",
        "",
        "## Held-out accuracy (sampled at temperature 1; ± one standard error over prompts)",
        "",
        f"{cfg['eval_prompts']} held-out prompts, k = {k} samples each.{before_note}",
        "",
        "| metric | before | after |",
        "|---|---|---|",
        f"| mean@{k} (sampled accuracy) | {_fmt(before, mean_key)} | {_fmt(after, mean_key)} |",
        f"| pass@{k} | {_fmt(before, f'pass@{k}')} | {_fmt(after, f'pass@{k}')} |",
        f"| greedy accuracy | {_fmt(before, 'greedy_acc')} | {_fmt(after, 'greedy_acc')} |",
        "",
    ]
    if before and after and before.get("per_prompt_mean") and after.get("per_prompt_mean"):
        delta, se_delta = paired_difference(before["per_prompt_mean"], after["per_prompt_mean"])
        verdict = "larger" if abs(delta) > se_delta else "NOT larger"
        lines += [f"Change in sampled accuracy: **{delta:+.3f} ± {se_delta:.3f}** (paired over the same prompts: "
                  f"mean and standard error of the per-prompt change in mean@{k}); the change is {verdict} than its "
                  f"standard error ({abs(delta) / se_delta if se_delta else float('inf'):.1f} SE).", ""]
    early, late = recs[:early_count(len(recs))], recs[-late_count(len(recs)):]
    lines += [
        "## Staleness reached",
        "",
        f"- mode: {cfg['mode']}, reuse ratio N = {cfg['reuse']}, {summary['updates']} updates",
        f"- staleness per update: mean {summary.get('staleness_mean', float('nan')):.2f}, "
        f"max {summary.get('staleness_max')}",
        f"- dropped batches (async only): {summary.get('dropped', 0)}",
        "",
        "## Training curve and diagnostics",
        "",
        "![training curve](curve.png)",
        "",
        "| | first quarter of updates | last eighth of updates |",
        "|---|---|---|",
    ]
    for key, label in DIAGNOSTICS:
        a, b = _window_mean(early, key), _window_mean(late, key)
        if math.isfinite(a) or math.isfinite(b):
            lines.append(f"| {label} (`{key}`) | {_cell(a)} | {_cell(b)} |")
    low, p10 = _window_mean(late, "frac_pos_low_w"), _window_mean(late, "log_w/p10")
    if math.isfinite(low) and math.isfinite(p10):
        lines += ["", f"Reading: over the last eighth of updates log W p10 was {p10:.3g} and {100 * low:.1f} % of "
                  f"positives had log W < -1. " + (
                      "At this staleness the weights stay close to 1, so there is little gradient starvation for any "
                      "reshaping to fix; the objectives differ mainly in how hard they push stale samples."
                      if low < LOW_W_STARVATION_SHARE else
                      "A sizeable share of positives is under-generated by the current policy: this is the starvation "
                      "regime ReSPO's positive branch targets.")]
    t_sample, t_old, t_train = (sum(r.get(f"time/{p}", 0) or 0 for r in recs) for p in ("sample", "old_logp", "train"))
    lines += [
        "",
        f"Time: sampling {t_sample:.1f} s, old log-probs {t_old:.1f} s, training {t_train:.1f} s; "
        f"run wall time {summary.get('wall_s', 0):.1f} s" + (f", command total {wall_s:.1f} s" if wall_s else "") +
        f" with {cfg.get('threads') or 'default'} torch thread(s); wall time grows with other load on the machine.",
        "",
        "## Settings",
        "",
        "```json",
        json.dumps({k2: v for k2, v in cfg.items() if k2 != "policy"}, indent=1),
        "```",
        "",
        f"Policy: `{json.dumps(cfg.get('policy', {}))}`",
        "",
    ]
    if note:
        lines += ["## Why these settings", "", note, ""]
    lines += ["Files: `metrics.jsonl` (one record per update), `summary.json`, `config.json`, `curve.png`, "
              "`final/` (trained policy), `ckpt/`."]
    path = run_dir / "report.md"
    write_text_atomic(path, "\n".join(lines) + "\n")
    return path
