"""``respo report SWEEP_DIR [SWEEP_DIR ...]``: the staleness study's ``report.md`` and PNG figures.

Every number in the report is computed here from the run files (``config.json``,
``metrics.jsonl``, ``summary.json``) of the given sweep directories; the commands that produced the
runs (from each ``sweep.json``) and the report itself are written into it. Sections appear when
the sweeps contain their runs:

- main comparison per model preset (the four main objectives at the most common group size, no
  routing replay): late mean / early max / held-out sampled pass@1 at a shared learning rate, the
  best learning rate per objective and N, the lr x N stability map, training curves, KL to the
  behaviour policy and the mean coefficient, the starvation diagnostic, log W histograms;
- group size (G sweep), branch ablation (``reshaped`` runs), routing replay (MoE runs with replay);
- an analysis section taken verbatim from ``--notes FILE`` (hand-written, citing these tables).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Iterable

from respo.errors import RespoError
from respo.fileio import write_text_atomic
from respo.study.aggregate import (STARVATION_KEYS, Run, best_per_column, early_max, fmt_cell, greedy_acc,
                                   group_runs, late_mean, load_runs, mean_std, nanmean, pass_at_1, run_mean)
from respo.study.tables import write_runs_csv

__all__ = ["build_report", "main", "add_arguments", "MAIN_ORDER", "NoRunsError", "OVERLAY_MAX_RUNS"]

MAIN_ORDER = ("grpo", "gspo", "vespo", "respo")
#: Up to this many runs, the report also overlays every run's curve and lists each run in one table.
OVERLAY_MAX_RUNS = 12


class NoRunsError(RespoError, FileNotFoundError):
    """``respo report`` found no run directory (one with ``config.json``) under the given paths."""


ABLATION_ORDER = ("grpo", "vespo", "respo", "respo+/vespo-", "vespo+/respo-", "respo+/truncated-", "respo+/respo0-",
                  "reinforce")


def _order(labels: Iterable[str], preferred: Iterable[str]) -> list[str]:
    labels = set(labels)
    pref = [x for x in preferred if x in labels]
    return pref + sorted(labels - set(pref))


def _table(rows: list[str], cols: list, cell_values: dict[tuple, list[float]], *, col_name=lambda c: str(c),
           row_head: str = "objective", digits: int = 3, higher: bool = True,
           suffix: dict | None = None) -> list[str]:
    """Markdown table of mean ± std (n) per (row, col), best mean per column in bold."""
    stats = {k: mean_std(v) for k, v in cell_values.items()}
    best = best_per_column({k: s[0] for k, s in stats.items()}, higher=higher)
    out = ["| " + row_head + " | " + " | ".join(col_name(c) for c in cols) + " |",
           "|---|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for c in cols:
            m, s, n = stats.get((r, c), (math.nan, math.nan, 0))
            cells.append(fmt_cell(m, s, n, digits=digits, bold=(r, c) in best) + (suffix or {}).get((r, c), ""))
        out.append(f"| {r} | " + " | ".join(cells) + " |")
    return out


def _by(runs: list[Run], **match) -> list[Run]:
    return [r for r in runs if r.finished and all(r.coords.get(k) == v for k, v in match.items())]


def _shared_lr(runs: list[Run], objectives: list[str]) -> float | None:
    """The lr with the most finished runs of the main objectives (ties: the smaller lr)."""
    count: dict[float, int] = {}
    for r in runs:
        if r.finished and r.coords["objective"] in objectives:
            count[r.coords["lr"]] = count.get(r.coords["lr"], 0) + 1
    if not count:
        return None
    return sorted(count, key=lambda lr: (-count[lr], lr))[0]


def _fmt(x: float, digits: int = 3) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def _baselines(sweep_dirs: list[Path], model: str) -> list[dict]:
    """``baseline_eval/*.json`` files (written by `respo sweep`) whose policy is ``model``."""
    out = []
    for d in sweep_dirs:
        for f in sorted((d / "baseline_eval").glob("*.json")):
            b = json.loads(f.read_text())
            pol = b.get("policy") or {}
            label = (pol.get("config") or {}).get("preset") or Path(str(b.get("model"))).name
            if label == model and "pass@1" in (b.get("eval") or {}):
                out.append(b)
    return out[:1]


def _main_section(runs: list[Run], model: str, out_dir: Path, shared_lr: float | None,
                  sweep_dirs: list[Path] = ()) -> list[str]:
    """The main comparison of one model preset: the four main objectives at the modal G and budget."""
    G = _mode([r.coords["group_size"] for r in runs if r.coords["model"] == model])
    U_main = _mode([r.coords["updates"] for r in runs if r.coords["model"] == model])
    base = [r for r in runs if r.finished and r.coords["model"] == model and r.coords["group_size"] == G
            and not r.coords["routing_replay"] and r.coords["objective"] in MAIN_ORDER
            and r.coords["updates"] == U_main]
    if not base:
        return []
    objs = _order({r.coords["objective"] for r in base}, MAIN_ORDER)
    lr = shared_lr if shared_lr is not None else _shared_lr(base, objs)
    at_lr = [r for r in base if r.coords["lr"] == lr]
    Ns = sorted({r.coords["reuse"] for r in at_lr})
    tag = model.replace("/", "_")
    g = group_runs(at_lr, ("objective", "reuse"))
    return (_shared_lr_tables(at_lr, g, objs, Ns, model, G, lr, sweep_dirs)
            + _best_lr_tables(base, objs, model, out_dir / f"stability_{tag}.png")
            + _curves_and_kl(g, objs, Ns, model, lr, out_dir, tag)
            + _starvation_tables(g, objs, Ns, model, lr, out_dir / f"logw_hist_{tag}.png"))


def _shared_lr_tables(at_lr: list[Run], g: dict, objs: list[str], Ns: list[int], model: str, G: int, lr: float,
                      sweep_dirs: list[Path]) -> list[str]:
    """Late mean, early max and held-out pass@1 per objective x N at the shared learning rate."""
    lines = [f"## Main comparison: {model} (G = {G}, shared lr = {lr:g})", ""]
    U = sorted({len(r.records) for r in at_lr})
    lines += [f"{len(at_lr)} finished runs at lr {lr:g}; updates per run: {', '.join(map(str, U))}. "
              "Cells: mean ± std over seeds (number of seeds); **bold** = best in its column.", ""]
    if U:
        u = U[-1]
        steps = ", ".join(f"N = {n}: {math.ceil(u / n)} (last at update {((u - 1) // n) * n})" for n in Ns)
        lines += [f"Reading the training score at high N: a run of U = {u} updates takes ⌈U/N⌉ rollout steps ({steps}). "
                  "Every update's score is the score of its mini-batch, sampled by the policy of the rollout step it "
                  "belongs to, so the late mean of a run measures the policy as it was at its last rollout step, and "
                  "at N ≥ U/4 the first quarter contains only the initial policy's samples (early max is then the same "
                  "for every objective by construction). The held-out pass@1 table measures every final policy after "
                  "the same number of updates.", ""]
    lines += ["### Late mean (training score, last eighth of the updates)", ""]
    lines += _table(objs, Ns, {k: [late_mean(r.scores) for r in v] for k, v in g.items()}, col_name=lambda n: f"N = {n}")
    lines += ["", "### Early max (best training score in the first quarter)", ""]
    lines += _table(objs, Ns, {k: [early_max(r.scores) for r in v] for k, v in g.items()}, col_name=lambda n: f"N = {n}")
    lines += ["", "### Held-out sampled pass@1 after training (temperature 1)", ""]
    ev_n = sorted({((r.summary or {}).get("eval_after") or {}).get("prompts") for r in at_lr} - {None})
    ev_k = sorted({((r.summary or {}).get("eval_after") or {}).get("k") for r in at_lr} - {None})
    lines += [f"Held-out prompts: {ev_n}, samples per prompt k = {ev_k}; pass@1 = mean correctness of the k samples.", ""]
    lines += _table(objs, Ns, {k: [pass_at_1(r) for r in v] for k, v in g.items()}, col_name=lambda n: f"N = {n}")
    baselines = [b["eval"] for b in _baselines(sweep_dirs, model)]

    def before_row(cell: str) -> str:  # the starting policy's value, repeated under every N
        return "| before RL (the starting policy, same protocol) | " + " | ".join(cell for _ in Ns) + " |"

    lines += [before_row(f"{ev['pass@1']:.3f} ± {ev.get('pass@1_se', math.nan):.3f} (se)") for ev in baselines]
    greedy = {k: [greedy_acc(r) for r in v] for k, v in g.items()}
    if any(math.isfinite(x) for v in greedy.values() for x in v):
        lines += ["", "### Held-out greedy accuracy after training (one decode per prompt, the same prompts)", ""]
        lines += _table(objs, Ns, greedy, col_name=lambda n: f"N = {n}")
        lines += [before_row(f"{ev['greedy_acc']:.3f}") for ev in baselines if ev.get("greedy_acc") is not None]
    ws = sorted({str(r.config.get("policy", {}).get("pass_rate")) for r in at_lr})
    return lines + ["", f"Starting policy's sampled pass rate as recorded by its SFT (512 prompts, one sample each): "
                    f"{', '.join(ws)}.", ""]


def _best_lr_tables(base: list[Run], objs: list[str], model: str, heatmap: Path) -> list[str]:
    """Late mean at each objective's best lr per N, the lr x N stability map and the log W spread
    per lr at the largest N (only when more than one lr was run)."""
    from respo.study import plots

    lrs = sorted({r.coords["lr"] for r in base})
    if len(lrs) < 2:
        return []
    gl = group_runs(base, ("objective", "reuse", "lr"))
    lm = {k: mean_std([late_mean(r.scores) for r in v]) for k, v in gl.items()}
    Nall = sorted({r.coords["reuse"] for r in base})
    best_cells, best_lr = {}, {}
    for o in objs:
        for n in Nall:
            cands = [(lm[(o, n, x)][0], x) for x in lrs if (o, n, x) in lm and math.isfinite(lm[(o, n, x)][0])]
            if cands:
                v, x = max(cands)
                best_cells[(o, n)] = [late_mean(r.scores) for r in gl[(o, n, x)]]
                best_lr[(o, n)] = x
    lines = ["### Late mean at each objective's best learning rate per N", "",
             f"Learning rates tried: {', '.join(f'{x:g}' for x in lrs)}; the best lr (by mean late mean) is in "
             "brackets. Where the best lr has one seed the cell is one run.", ""]
    if all(len(r.records) <= r.coords["reuse"] for r in base):
        lines += ["**No run here got past its first rollout step** (updates ≤ N): every training score is of "
                  "the starting policy's own samples (the same at every learning rate for one seed), so these late "
                  "means rank no learning rate; only the log W diagnostics below differ.", ""]
    lines += _table(objs, Nall, best_cells, col_name=lambda n: f"N = {n}",
                    suffix={k: f" [{v:g}]" for k, v in best_lr.items()}) + [""]
    cells = {(o, x, n): lm[(o, n, x)][0] for o in objs for x in lrs for n in Nall if (o, n, x) in lm}
    p = plots.plot_heatmaps(cells, heatmap, title=f"{model}: late mean over lr x N")
    lines += ["### Stability map (late mean over learning rate x N, mean over the seeds run)", "",
              f"![stability map]({p.name})", ""]
    lines += ["| objective | lr | " + " | ".join(f"N = {n}" for n in Nall) + " |", "|---|---|" + "---|" * len(Nall)]
    for o in objs:
        for x in lrs:
            lines.append(f"| {o} | {x:g} | " + " | ".join(fmt_cell(*lm.get((o, n, x), (math.nan, math.nan, 0)))
                                                        for n in Nall) + " |")
    nmax = max(Nall)
    lines += ["", f"### log W spread reached per learning rate (N = {nmax}; calibration)", "",
              "The same diagnostics as the starvation table, per learning rate, over stale updates; N = 1 late mean "
              "is the on-policy control (a learning rate that degrades N = 1 is too large whatever the objective). "
              "The paper's regime is a baseline with about 20 % of positives at log W < −1 at high N (22.8 % in "
              "Chen, Ban, Hsieh 2026) without collapsing at N = 1.", "",
              "| objective | lr | runs | frac_pos_low_w | pos_low_w_mass_share | frac_starved | log W p10 | kl_k3 | "
              f"late mean N = {nmax} | late mean N = 1 |", "|---|---|---|---|---|---|---|---|---|---|"]
    for o in objs:
        for x in lrs:
            rs = gl.get((o, nmax, x), [])
            if not rs:
                continue
            vals = [nanmean(run_mean(r, k, stale_only=True) for r in rs)
                    for k in ("frac_pos_low_w", "pos_low_w_mass_share", "frac_starved", "log_w/p10", "kl_k3")]
            on = lm.get((o, 1, x), (math.nan, math.nan, 0))
            lines.append(f"| {o} | {x:g} | {len(rs)} | " + " | ".join(_fmt(v, 4 if i == 4 else 3) for i, v in enumerate(vals))
                         + f" | {fmt_cell(*lm[(o, nmax, x)])} | {fmt_cell(*on)} |")
    return lines + [""]


def _curves_and_kl(g: dict, objs: list[str], Ns: list[int], model: str, lr: float, out_dir: Path, tag: str) -> list[str]:
    """Training curves, and KL to the behaviour policy with the mean coefficient over stale updates."""
    from respo.study import plots

    p = plots.plot_curves(g, out_dir / f"curves_{tag}.png", title=f"{model}, lr {lr:g}: training score per update "
                                                                        "(line: seed mean, band: seed min..max)")
    lines = ["### Training curves", "", f"![training curves]({p.name})", ""]
    p1 = plots.plot_metric_curves(g, "kl_k3", out_dir / f"kl_{tag}.png", ylabel="k3 KL(π_old‖π_θ) per token",
                                  smooth=1, log_y=True, title=f"{model}, lr {lr:g}: per-update KL to the behaviour policy")
    p2 = plots.plot_metric_curves(g, "coef_mean", out_dir / f"coef_{tag}.png", ylabel="coef_mean = Σφ/n", smooth=1,
                                  title=f"{model}, lr {lr:g}: mean coefficient per update")
    lines += ["### KL to the behaviour policy and mean coefficient", "",
              "Means over the updates with staleness > 0 (the first mini-batch of each rollout step has log W = 0 "
              "exactly), then over seeds. kl_k3: per-token k3 estimate of KL(π_old ‖ π_θ); coef_mean = Σφ/n over "
              "the mini-batch (the effective step size); φ± = mean coefficient of positive / negative responses.", "",
              "| objective | N | kl_k3 | approx_kl (k1) | coef_mean | φ+ mean | φ− mean | log W p10 | log W p50 |",
              "|---|---|---|---|---|---|---|---|---|"]
    for o in objs:
        for n in Ns:
            rs = g.get((o, n), [])
            if not rs or n == 1:
                continue
            vals = [nanmean(run_mean(r, k, stale_only=True) for r in rs)
                    for k in ("kl_k3", "approx_kl", "coef_mean", "phi/pos_mean", "phi/neg_mean", "log_w/p10", "log_w/p50")]
            lines.append(f"| {o} | {n} | " + " | ".join(_fmt(v, 4 if i < 2 else 3) for i, v in enumerate(vals)) + " |")
    return lines + ["", f"![KL]({p1.name})", "", f"![mean coefficient]({p2.name})", ""]


def _starvation_tables(g: dict, objs: list[str], Ns: list[int], model: str, lr: float, hist: Path) -> list[str]:
    """The starvation diagnostic per objective x N over stale updates, and the log W histograms."""
    from respo.study import plots

    lines = ["### Starvation diagnostic", "",
             "Over the updates with staleness > 0, mean over updates then seeds: frac_pos_low_w = fraction of "
             "positive-advantage responses with log W < −1; mass share = their share of the positives' coefficient "
             "mass Σφ; frac_starved = fraction of all responses with coefficient < 1e-3 (the paper, N = 32 on "
             "Qwen3-30B-A3B: 22.8 % of positives, 38.5 % of ReSPO's mass vs 15.5 % under VESPO).", "",
             "| objective | N | frac_pos_low_w | pos_low_w_mass_share | frac_starved |", "|---|---|---|---|---|"]
    for n in Ns:
        if n == 1:
            continue
        for o in objs:
            rs = g.get((o, n), [])
            if rs:
                vals = [nanmean(run_mean(r, k, stale_only=True) for r in rs) for k in STARVATION_KEYS]
                lines.append(f"| {o} | {n} | " + " | ".join(_fmt(v) for v in vals) + " |")
    p = plots.plot_logw_hist(g, hist, title=f"{model}, lr {lr:g}: log W, early (first quarter) vs late (last eighth), "
                                            "stale updates")
    return lines + ["", "### log W histograms", "",
                    "Reconstructed from the per-update quantiles the trainer logs (1, 10, 50, 90, 99 %; piecewise-linear "
                    "inverse CDF between them, tails beyond 1 %/99 % not shown), pooled over stale updates and seeds.", "",
                    f"![log W histograms]({p.name})", ""]


def _mode(xs: list):
    xs = [x for x in xs if x is not None]
    return max(set(xs), key=xs.count) if xs else None


def _runs_section(runs: list[Run], out_dir: Path) -> list[str]:
    """A few runs side by side (any runs, not only a study grid): one row each, curves overlaid."""
    from respo.study import plots

    lines: list[str] = []
    runs = sorted(runs, key=lambda r: str(r.path))
    lines += ["## Runs compared", "",
              "| run | objective | N | lr | seed | updates | late mean | early max | held-out pass@1 |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        c = r.coords
        lines += [f"| `{r.path.name}` | {c['objective']} | {c['reuse']} | {c['lr']} | {c['seed']} | "
                  f"{len(r.records)}{'' if r.finished else ' (unfinished)'} | {_fmt(late_mean(r.scores))} | "
                  f"{_fmt(early_max(r.scores))} | {_fmt(pass_at_1(r))} |"]
    p = plots.plot_runs_overlay(runs, out_dir / "runs_compared.png", title="training score per run")
    lines += ["", f"![runs compared]({p.name})", ""]
    return lines


def _budget_section(runs: list[Run]) -> list[str]:
    """Runs with a different number of updates than their model's main sweep, next to the main runs."""
    lines: list[str] = []
    fin = [r for r in runs if r.finished and not r.coords["routing_replay"]]
    for model in sorted({r.coords["model"] for r in fin}):
        mine = [r for r in fin if r.coords["model"] == model]
        U_main = _mode([r.coords["updates"] for r in mine])
        other = [r for r in mine if r.coords["updates"] != U_main]
        if not other:
            continue
        keys = {(r.coords["objective"], r.coords["reuse"], r.coords["lr"], r.coords["group_size"]) for r in other}
        sel = [r for r in mine if (r.coords["objective"], r.coords["reuse"], r.coords["lr"], r.coords["group_size"]) in keys]
        g = group_runs(sel, ("objective", "updates"))
        objs = _order({o for o, _ in g}, ABLATION_ORDER)
        cols = sorted({u for _, u in g})
        desc = ", ".join(sorted({f"N = {n}, lr {lr:g}, G = {G}" for _, n, lr, G in keys}))
        lines += [f"## Longer budget ({model}; {desc})", "",
                  "The same settings with more policy updates (more rollout steps at the same N), to see whether the "
                  "high-N ordering is a transient of the short budget. Late mean:", ""]
        lines += _table(objs, cols, {k: [late_mean(r.scores) for r in v] for k, v in g.items()},
                        col_name=lambda u: f"{u} updates")
        lines += ["", "Held-out sampled pass@1 after training:", ""]
        lines += _table(objs, cols, {k: [pass_at_1(r) for r in v] for k, v in g.items()}, col_name=lambda u: f"{u} updates")
        lines += [""]
    return lines


def _groups_section(runs: list[Run]) -> list[str]:
    lines: list[str] = []
    Gs = sorted({r.coords["group_size"] for r in runs if r.finished})
    if len(Gs) < 2:
        return lines
    lines += ["## Group size G (the other reading of \"more sampled responses\")", ""]
    for (model, n, lr), _ in sorted(group_runs(runs, ("model", "reuse", "lr")).items()):
        sel = [r for r in runs if r.finished and r.coords["model"] == model and r.coords["reuse"] == n
               and r.coords["lr"] == lr and not r.coords["routing_replay"]]
        if len({r.coords["group_size"] for r in sel}) < 2:
            continue
        g = group_runs(sel, ("objective", "group_size"))
        objs = _order({o for o, _ in g}, ABLATION_ORDER)
        cols = sorted({c for _, c in g})
        lines += [f"{model}, N = {n}, lr {lr:g}; late mean (prompts per update B fixed, so a larger G means more "
                  "sequences per update):", ""]
        lines += _table(objs, cols, {k: [late_mean(r.scores) for r in v] for k, v in g.items()}, col_name=lambda c: f"G = {c}")
        lines += [""]
    return lines


def _ablation_section(runs: list[Run], out_dir: Path) -> list[str]:
    from respo.study import plots

    lines: list[str] = []
    abl = [r for r in runs if r.finished and "/" in r.coords["objective"]]
    if not abl:
        return lines
    lines += ["## Branch ablation (the core's `reshaped` objective, one kernel per advantage sign)", "",
              "respo+/vespo- = ReSPO's positive branch respo(2,0.5,2) with VESPO's negative branch vespo(3,2); "
              "vespo+/respo- = VESPO's positive branch vespo(2,3) with ReSPO's negative branch respo(1,0.5,2). "
              "Shown next to the plain objectives at the same model, G and lr, and next to plain REINFORCE (φ ≡ 1 on both "
              "branches: no staleness correction at all) where it was run.", ""]
    for (model, G, lr) in sorted({(r.coords["model"], r.coords["group_size"], r.coords["lr"]) for r in abl}):
        sel = [r for r in runs if r.finished and r.coords["model"] == model and r.coords["group_size"] == G
               and r.coords["lr"] == lr and not r.coords["routing_replay"] and r.coords["objective"] in ABLATION_ORDER]
        Ns = sorted({r.coords["reuse"] for r in sel if "/" in r.coords["objective"]})
        if not Ns:  # only reshaped pairs without a label here: runs.csv lists them
            continue
        sel = [r for r in sel if r.coords["reuse"] in Ns]
        g = group_runs(sel, ("objective", "reuse"))
        objs = _order({o for o, _ in g}, ABLATION_ORDER)
        lines += [f"### {model}, G = {G}, lr {lr:g}: late mean", ""]
        lines += _table(objs, Ns, {k: [late_mean(r.scores) for r in v] for k, v in g.items()}, col_name=lambda n: f"N = {n}")
        lines += ["", "Held-out sampled pass@1 after training:", ""]
        lines += _table(objs, Ns, {k: [pass_at_1(r) for r in v] for k, v in g.items()}, col_name=lambda n: f"N = {n}")
        lines += ["", "Mean coefficient of negatives (φ− mean) and k3 KL per token over stale updates:", "",
                  "| objective | N | φ− mean | φ+ mean | kl_k3 | frac_pos_low_w | log W p10 |", "|---|---|---|---|---|---|---|"]
        for o in objs:
            for n in Ns:
                rs = g.get((o, n), [])
                if rs and n > 1:
                    vals = [nanmean(run_mean(r, k, stale_only=True) for r in rs)
                            for k in ("phi/neg_mean", "phi/pos_mean", "kl_k3", "frac_pos_low_w", "log_w/p10")]
                    lines.append(f"| {o} | {n} | " + " | ".join(_fmt(v, 4 if i == 2 else 3) for i, v in enumerate(vals)) + " |")
        tag = f"{model}_G{G}_lr{lr:g}".replace("/", "_")
        p = plots.plot_curves(g, out_dir / f"ablation_{tag}.png", title=f"branch ablation, {model}, lr {lr:g}")
        lines += ["", f"![ablation curves]({p.name})", ""]
    return lines


def _replay_section(runs: list[Run]) -> list[str]:
    lines: list[str] = []
    rep = [r for r in runs if r.finished and r.coords["routing_replay"]]
    if not rep:
        return lines
    lines += ["## Routing replay (MoE)", "",
              "Same objective, model, G and lr with and without routing replay (rollout experts forced in the "
              "training forward). router_shift = fraction of response tokens whose top-k expert set changed between "
              "rollout and training (mean over stale updates; with replay on, the shift the router would have had).", ""]
    keys = sorted({(r.coords["model"], r.coords["objective"], r.coords["group_size"], r.coords["lr"]) for r in rep})
    for model, obj, G, lr in keys:
        sel = [r for r in runs if r.finished and (r.coords["model"], r.coords["objective"], r.coords["group_size"],
                                                  r.coords["lr"]) == (model, obj, G, lr)]
        g = group_runs(sel, ("routing_replay", "reuse"))
        Ns = sorted({n for _, n in g})
        rows = {False: "replay off", True: "replay on"}
        vals = {(rows[k[0]], k[1]): [late_mean(r.scores) for r in v] for k, v in g.items()}
        lines += [f"### {model}, {obj}, G = {G}, lr {lr:g}: late mean", ""]
        lines += _table([rows[False], rows[True]], Ns, vals, col_name=lambda n: f"N = {n}", row_head="routing")
        lines += ["", "Held-out sampled pass@1 after training:", ""]
        lines += _table([rows[False], rows[True]], Ns, {(rows[k[0]], k[1]): [pass_at_1(r) for r in v] for k, v in g.items()},
                        col_name=lambda n: f"N = {n}", row_head="routing")
        lines += ["", "| routing | N | router_shift | kl_k3 | frac_pos_low_w |", "|---|---|---|---|---|"]
        for (rr, n), v in sorted(g.items()):
            if n > 1:
                lines.append(f"| {rows[rr]} | {n} | " + " | ".join(
                    _fmt(nanmean(run_mean(r, k, stale_only=True) for r in v), 4) for k in ("router_shift", "kl_k3", "frac_pos_low_w")) + " |")
        lines += [""]
    return lines


def _commands_section(dirs: list[Path], report_cmd: str) -> list[str]:
    lines = ["## How this report was produced", "", "Sweeps (from each `sweep.json`, in order):", "", "```"]
    base_texts = {}
    for d in dirs:
        m = d / "sweep.json"
        if m.is_file():
            man = json.loads(m.read_text())
            for inv in man.get("invocations", []):
                lines.append(f"# {inv.get('time')}  preset={inv.get('preset')}  runs={len(inv.get('runs', []))}")
                lines.append(inv.get("command", ""))
                base_texts[inv.get("base_config")] = inv.get("base_config_text", "")
    lines += ["```", "", "Report:", "", "```", report_cmd, "```", ""]
    for path, text in base_texts.items():
        if text:
            lines += [f"Base config `{Path(path).name}` (as used):", "", "```toml", text.strip(), "```", ""]
    return lines


def build_report(dirs: list[str | Path], out_dir: str | Path, *, shared_lr: float | None = None,
                 notes: str | Path | None = None, command: str = "", title: str = "Staleness study") -> Path:
    """Write ``out_dir/report.md`` and its PNGs from the runs under ``dirs``; return the report path."""
    from respo.study import plots

    dirs = [Path(d) for d in dirs]
    out_dir = Path(out_dir)
    runs = load_runs(dirs)
    if not runs:
        raise NoRunsError(f"no runs found under {', '.join(map(str, dirs))} (a run directory has a config.json)")
    out_dir.mkdir(parents=True, exist_ok=True)
    fin = [r for r in runs if r.finished]
    lines = [f"# {title}", "",
             f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `respo report` from "
             f"{len(runs)} run directories ({len(fin)} finished). Every number below is computed from the run files "
             "(config.json, metrics.jsonl, summary.json). Training score = (r + 1)/2 with r = ±1, averaged over the "
             "mini-batch of each update. Late mean = mean over the last eighth of the updates; early max = best "
             "over the first quarter.", ""]
    if notes and Path(notes).is_file():
        lines += [Path(notes).read_text().strip(), ""]
    lines += _commands_section(dirs, command)
    p = plots.plot_kernels(out_dir / "kernels.png")
    lines += ["## Kernels: coefficient φ(W) per advantage sign", "",
              "Drawn from the core's loss gradients (one-token responses, c = −B·∂L/∂logp / Â): ReSPO and VESPO's "
              "φ(W), and GRPO's effective per-token coefficient (r where unclipped, 0 where clipped, dual clip at 3).",
              "", f"![kernels]({p.name})", ""]
    if len(runs) <= OVERLAY_MAX_RUNS:
        lines += _runs_section(runs, out_dir)
    modal = {m: _mode([r.coords["updates"] for r in runs if r.coords["model"] == m]) for m in {r.coords["model"] for r in runs}}
    main_budget = [r for r in runs if r.coords["updates"] == modal[r.coords["model"]]]  # one budget per model
    for model in sorted({r.coords["model"] for r in fin}):
        lines += _main_section(main_budget, model, out_dir, shared_lr, dirs)
    lines += _budget_section(runs)
    lines += _groups_section(main_budget)
    lines += _ablation_section(main_budget, out_dir)
    lines += _replay_section(main_budget)
    write_runs_csv(runs, out_dir / "runs.csv")
    lines += ["Per-run numbers behind every table (one row per run: coordinates, late mean, early max, held-out "
              "pass@1, diagnostics over stale updates) are in [runs.csv](runs.csv).", ""]
    unfinished = [r for r in runs if not r.finished]
    lines += ["## Runs not finished", ""]
    if unfinished:
        lines += [f"- `{r.path.name}`: {len(r.records)} updates logged" for r in unfinished]
    else:
        lines += ["None."]
    lines += [""]
    path = out_dir / "report.md"
    write_text_atomic(path, "\n".join(lines))
    return path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sweeps", nargs="+", help="sweep directories (or run directories)")
    p.add_argument("--out", default="reports/staleness", help="report directory (report.md + PNGs)")
    p.add_argument("--shared-lr", type=float, default=None, help="lr of the main tables (default: the most-run lr)")
    p.add_argument("--notes", default=None, help="a markdown file included verbatim (the analysis)")
    p.add_argument("--title", default="Staleness study", help="first heading of report.md")


def cmd_report(args: argparse.Namespace, command: str) -> int:
    path = build_report(args.sweeps, args.out, shared_lr=args.shared_lr, notes=args.notes, command=command,
                        title=args.title)
    print(f"report: {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m respo.study.report", description=__doc__.split("\n")[0])
    add_arguments(p)
    return cmd_report(p.parse_args(argv), "python -m respo.study.report " + shlex.join(argv))


if __name__ == "__main__":
    sys.exit(main())
