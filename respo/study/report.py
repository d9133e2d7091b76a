"""``respo report SWEEP_DIR [SWEEP_DIR ...]``: the staleness study's ``report.md`` and PNG figures.

Every number in the report's tables comes from the runs' runs.csv rows (`respo.study.tables.run_row`,
tabulated by `respo.study.tables`); every other figure it states is read from a record: the run files
(``config.json``, ``metrics.jsonl``, ``summary.json``, the warm start's SFT record inside ``config.json``),
the sweeps' ``baseline_eval/``, and the paper's reference figures (`respo.study.paper`, ``paper.toml``). The
commands that produced the runs (from each ``sweep.json``) and the report itself are written into it.
Sections appear when the sweeps contain their runs:

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
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Iterable

from respo.core.objectives import hyperparameters
from respo.errors import RespoError
from respo.fileio import dir_problem, write_text_atomic
from respo.study.aggregate import STARVATION_KEYS, Run, fmt_cell, load_runs, mean_std
from respo.study.paper import paper_figure
from respo.study.tables import (WHERE, TableError, best_lr_cells, cell_table, column_cells, endpoint_rule, group_rows,
                                means_row, mismatch_table, read_rows, run_row, runs_table, seed_list, starts_by_seed,
                                write_runs_csv)

__all__ = ["build_report", "main", "add_arguments", "MAIN_ORDER", "NoRunsError", "ReportDirError", "OVERLAY_MAX_RUNS"]

MAIN_ORDER = ("grpo", "gspo", "vespo", "respo")
#: Up to this many runs, the report also overlays every run's curve and lists each run in one table.
OVERLAY_MAX_RUNS = 12


class NoRunsError(RespoError, FileNotFoundError):
    """``respo report`` found no run directory (one with ``config.json``) under the given paths."""


class ReportDirError(RespoError, NotADirectoryError):
    """``respo report --out`` names a path that cannot be a directory (a file, or a path under one)."""


#: The endpoints the report's tables pool over seeds (`respo.study.tables.endpoint_rule`).
REPORT_ENDPOINTS = ("late_mean", "pass@1", "greedy_acc")

ABLATION_ORDER = ("grpo", "vespo", "respo", "respo+/vespo-", "vespo+/respo-", "respo+/truncated-", "respo+/respo0-",
                  "reinforce")


def _order(labels: Iterable[str], preferred: Iterable[str]) -> list[str]:
    labels = set(labels)
    pref = [x for x in preferred if x in labels]
    return pref + sorted(labels - set(pref))


def _rows(runs: Iterable[Run]) -> list[dict]:
    """The runs.csv row of each run (`respo.study.tables.run_row`), the run itself under ``_run`` (for the
    figures; not a column): every number of the report's tables is computed from these rows."""
    return [{**run_row(r), "_run": r, WHERE: str(r.path)} for r in runs]


def _runs(groups: dict[tuple, list[dict]]) -> dict[tuple, list[Run]]:
    """The runs behind grouped rows, for the figures: kept rows (`--keep-rows`) have no run directory to draw
    from, so a group of kept rows alone is left out."""
    runs = {k: [r["_run"] for r in rs if "_run" in r] for k, rs in groups.items()}
    return {k: v for k, v in runs.items() if v}


def _given(rows: Iterable[dict]) -> list[Run]:
    """The runs given as directories among ``rows`` (not the kept rows)."""
    return [r["_run"] for r in rows if "_run" in r]


def _figure(alt: str, runs, draw) -> list[str]:
    """``draw()``'s figure as a markdown image, or a line saying why there is none: every run it would show is a
    kept row (`--keep-rows`), with no per-update log to draw."""
    if not runs:
        return ["No figure: its runs are kept rows whose directories were not given.", ""]
    return [f"![{alt}]({draw().name})", ""]


def _shared_lr(rows: list[dict], objectives: list[str]) -> float | None:
    """The lr with the most finished runs of the main objectives (ties: the smaller lr)."""
    count: dict[float, int] = {}
    for r in rows:
        if r["finished"] and r["objective"] in objectives:
            count[r["lr"]] = count.get(r["lr"], 0) + 1
    if not count:
        return None
    return sorted(count, key=lambda lr: (-count[lr], lr))[0]


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


def _sft_pass_rates(runs: Iterable[Run]) -> str:
    """" (N prompts, one sample each): RATE": the starting policies' sampled pass rates as their SFT records
    state them, with the number of prompts each was measured on (the record's ``config.eval_n``, else its
    ``pass_rate_measured_on``); one such clause per measurement when the records differ in it."""
    said: dict[str, set[str]] = {}
    for r in runs:
        policy = r.config.get("policy") or {}
        sft = policy.get("config") if isinstance(policy.get("config"), dict) else {}
        on = (f"{sft['eval_n']} prompts, one sample each" if sft.get("eval_n") is not None else
              policy.get("pass_rate_measured_on") or "the record does not say on how many prompts")
        said.setdefault(on, set()).add(str(policy.get("pass_rate")))
    if len(said) == 1:
        ((on, rates),) = said.items()
        return f" ({on}): {', '.join(sorted(rates))}"
    return ": " + "; ".join(f"{', '.join(sorted(rates))} ({on})" for on, rates in said.items())


def _starts_section(rows: list[dict], *, by_seed: bool = False) -> list[str]:
    """A note, where the runs start from more than one policy (the ``start`` column, or none recorded), naming
    each start's runs and seeds. Two recorded starts among the finished runs are refused (`TableError`, as
    ``respo table`` refuses them) unless ``by_seed`` (``--starts-by-seed``), which needs every finished run's
    start recorded and each seed's runs to share one (`respo.study.tables.starts_by_seed`)."""
    fin = [r for r in rows if r["finished"]]
    recorded = sorted({r["start"] for r in fin if r["start"]}, key=lambda s: min(r["seed"] for r in fin
                                                                                 if r["start"] == s))
    if by_seed:
        starts_by_seed(fin)
    elif len(recorded) > 1:
        a, b = (next(r for r in fin if r["start"] == s) for s in recorded[:2])
        raise TableError(f"two starting policies in one report: {a['run']} started from {a['start']} and {b['run']} "
                         f"from {b['start']}; report each start's runs on their own, or pass --starts-by-seed where "
                         "each seed's runs share one start (the report then names each start's seeds)")
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["start"] or "not recorded", []).append(r)
    if len(by) < 2:
        return []
    parts = []
    for start, rs in sorted(by.items(), key=lambda kv: min(r["seed"] for r in kv[1])):  # by first seed
        seeds = sorted({r["seed"] for r in rs})
        parts.append(f"{start}: {len(rs)} run{'s' * (len(rs) != 1)}, seed{'s' * (len(seeds) != 1)} {seed_list(seeds)}")
    return ["## Starting policies", "",
            f"These runs start from {len(by)} policies (their weights' hashes, the `start` column of runs.csv): "
            + "; ".join(parts) + ". " + ("Pooled under `--starts-by-seed`: every run of a seed shares one start, and the "
            "tables below average over the seeds, so over their starts; `respo table ... --starts-by-seed` tests the "
            "seeds as blocks." if by_seed else "One start is recorded, so the tables below may pool starts that "
            "differ; `respo table ... --starts-by-seed` tests seeds as blocks where every run records its start."), ""]


def _main_section(rows: list[dict], model: str, out_dir: Path, shared_lr: float | None,
                  sweep_dirs: list[Path] = ()) -> list[str]:
    """The main comparison of one model preset: the four main objectives at the modal G and budget."""
    G = _mode([r["group_size"] for r in rows if r["model"] == model])
    U_main = _mode([r["updates"] for r in rows if r["model"] == model])
    base = [r for r in rows if r["finished"] and r["model"] == model and r["group_size"] == G
            and not r["routing_replay"] and r["objective"] in MAIN_ORDER and r["updates"] == U_main]
    if not base:
        return []
    objs = _order({r["objective"] for r in base}, MAIN_ORDER)
    lr = shared_lr if shared_lr is not None else _shared_lr(base, objs)
    at_lr = [r for r in base if r["lr"] == lr]
    Ns = sorted({r["reuse"] for r in at_lr})
    tag = model.replace("/", "_")
    g = group_rows(at_lr, ("objective", "reuse"))
    return (_shared_lr_tables(at_lr, g, objs, Ns, model, G, lr, sweep_dirs)
            + _best_lr_tables(base, objs, model, out_dir / f"stability_{tag}.png")
            + _curves_and_kl(g, objs, Ns, model, lr, out_dir, tag)
            + _starvation_tables(g, objs, Ns, model, lr, out_dir / f"logw_hist_{tag}.png"))


def _shared_lr_tables(at_lr: list[dict], g: dict, objs: list[str], Ns: list[int], model: str, G: int, lr: float,
                      sweep_dirs: list[Path]) -> list[str]:
    """Late mean, early max and held-out pass@1 per objective x N at the shared learning rate."""
    lines = [f"## Main comparison: {model} (G = {G}, shared lr = {lr:g})", ""]
    U = sorted({r["updates_logged"] for r in at_lr})
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
    by_n = dict(col_name=lambda n: f"N = {n}")
    lines += ["### Late mean (training score, last eighth of the updates)", ""]
    lines += cell_table(objs, Ns, column_cells(g, "late_mean"), **by_n)
    lines += ["", "### Early max (best training score in the first quarter)", ""]
    lines += cell_table(objs, Ns, column_cells(g, "early_max"), **by_n)
    lines += ["", "### Held-out sampled pass@1 after training (temperature 1)", ""]
    ev_n = sorted({((r.summary or {}).get("eval_after") or {}).get("prompts") for r in _given(at_lr)} - {None})
    ev_k = sorted({((r.summary or {}).get("eval_after") or {}).get("k") for r in _given(at_lr)} - {None})
    lines += [f"Held-out prompts: {ev_n}, samples per prompt k = {ev_k}; pass@1 = mean correctness of the k samples."
              if ev_n else "pass@1 = mean correctness of the k samples per held-out prompt (the number of prompts and k "
              "are in the runs' summary.json, not in the kept rows).", ""]
    lines += cell_table(objs, Ns, column_cells(g, "pass@1"), **by_n)
    baselines = [b["eval"] for b in _baselines(sweep_dirs, model)]

    def before_row(cell: str) -> str:  # the starting policy's value, repeated under every N
        return "| before RL (the starting policy, same protocol) | " + " | ".join(cell for _ in Ns) + " |"

    lines += [before_row(f"{ev['pass@1']:.3f} ± {ev.get('pass@1_se', math.nan):.3f} (se)") for ev in baselines]
    greedy = column_cells(g, "greedy_acc")
    if any(math.isfinite(x) for v in greedy.values() for x in v):
        lines += ["", "### Held-out greedy accuracy after training (one decode per prompt, the same prompts)", ""]
        lines += cell_table(objs, Ns, greedy, **by_n)
        lines += [before_row(f"{ev['greedy_acc']:.3f}") for ev in baselines if ev.get("greedy_acc") is not None]
    if not _given(at_lr):  # the SFT record is in the run's config.json, not in its row
        return lines + [""]
    return lines + ["", f"Starting policy's sampled pass rate as recorded by its SFT"
                    f"{_sft_pass_rates(_given(at_lr))}.", ""]


def _best_lr_tables(base: list[dict], objs: list[str], model: str, heatmap: Path) -> list[str]:
    """Late mean at each objective's best lr per N, the lr x N stability map and the log W spread
    per lr at the largest N (only when more than one lr was run)."""
    from respo.study import plots

    lrs = sorted({r["lr"] for r in base})
    if len(lrs) < 2:
        return []
    gl = group_rows(base, ("objective", "reuse", "lr"))
    lm = {k: mean_std([r["late_mean"] for r in v]) for k, v in gl.items()}
    Nall = sorted({r["reuse"] for r in base})
    best_cells, best_lr = best_lr_cells(gl, objs, Nall, lrs)
    lines = ["### Late mean at each objective's best learning rate per N", "",
             f"Learning rates tried: {', '.join(f'{x:g}' for x in lrs)}; the best lr (by mean late mean) is in "
             "brackets. Where the best lr has one seed the cell is one run.", ""]
    if all(r["updates_logged"] <= r["reuse"] for r in base):
        lines += ["**No run here got past its first rollout step** (updates ≤ N): every training score is of "
                  "the starting policy's own samples (the same at every learning rate for one seed), so these late "
                  "means rank no learning rate; only the log W diagnostics below differ.", ""]
    lines += cell_table(objs, Nall, best_cells, col_name=lambda n: f"N = {n}",
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
    ref = paper_figure("frac_pos_low_w")
    lines += ["", f"### log W spread reached per learning rate (N = {nmax}; calibration)", "",
              "The same diagnostics as the starvation table, per learning rate, over stale updates; N = 1 late mean "
              "is the on-policy control (a learning rate that degrades N = 1 is too large whatever the objective). "
              f"The paper's regime is a baseline with {ref.about} of positives at log W < −1 at high N ({ref.percent} in "
              f"{ref.cite}) without collapsing at N = 1.", "",
              "| objective | lr | runs | frac_pos_low_w | pos_low_w_mass_share | frac_starved | log W p10 | kl_k3 | "
              f"late mean N = {nmax} | late mean N = 1 |", "|---|---|---|---|---|---|---|---|---|---|"]
    for o in objs:
        for x in lrs:
            rs = gl.get((o, nmax, x), [])
            if not rs:
                continue
            on = lm.get((o, 1, x), (math.nan, math.nan, 0))
            lines.append(means_row((o, f"{x:g}", len(rs)), rs, [f"stale_mean:{k}" for k in (
                "frac_pos_low_w", "pos_low_w_mass_share", "frac_starved", "log_w/p10", "kl_k3")], (3, 3, 3, 3, 4))
                + f" {fmt_cell(*lm[(o, nmax, x)])} | {fmt_cell(*on)} |")
    return lines + [""]


def _curves_and_kl(g: dict, objs: list[str], Ns: list[int], model: str, lr: float, out_dir: Path, tag: str) -> list[str]:
    """Training curves, and KL to the behaviour policy with the mean coefficient over stale updates."""
    from respo.study import plots

    gr = _runs(g)
    lines = ["### Training curves", ""] + _figure("training curves", gr, lambda: plots.plot_curves(
        gr, out_dir / f"curves_{tag}.png", title=f"{model}, lr {lr:g}: training score per update "
                                                   "(line: seed mean, band: seed min..max)"))
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
            lines.append(means_row((o, n), rs, [f"stale_mean:{k}" for k in (
                "kl_k3", "approx_kl", "coef_mean", "phi/pos_mean", "phi/neg_mean", "log_w/p10", "log_w/p50")],
                (4, 4, 3, 3, 3, 3, 3)))
    return (lines + [""]
            + _figure("KL", gr, lambda: plots.plot_metric_curves(
                gr, "kl_k3", out_dir / f"kl_{tag}.png", ylabel="k3 KL(π_old‖π_θ) per token", smooth=1, log_y=True,
                title=f"{model}, lr {lr:g}: per-update KL to the behaviour policy"))
            + _figure("mean coefficient", gr, lambda: plots.plot_metric_curves(
                gr, "coef_mean", out_dir / f"coef_{tag}.png", ylabel="coef_mean = Σφ/n", smooth=1,
                title=f"{model}, lr {lr:g}: mean coefficient per update")))


def _starvation_tables(g: dict, objs: list[str], Ns: list[int], model: str, lr: float, hist: Path) -> list[str]:
    """The starvation diagnostic per objective x N over stale updates, and the log W histograms."""
    from respo.study import plots

    pos, mass_r, mass_v = (paper_figure(k) for k in ("frac_pos_low_w", "respo_pos_low_w_mass_share",
                                                      "vespo_pos_low_w_mass_share"))
    lines = ["### Starvation diagnostic", "",
             "Over the updates with staleness > 0, mean over updates then seeds: frac_pos_low_w = fraction of "
             "positive-advantage responses with log W < −1; mass share = their share of the positives' coefficient "
             "mass Σφ; frac_starved = fraction of all responses with coefficient < 1e-3 (the paper, "
             f"{pos.setting}: {pos.percent} of positives, {mass_r.percent} of ReSPO's mass vs {mass_v.percent} under "
             "VESPO).", "",
             "| objective | N | frac_pos_low_w | pos_low_w_mass_share | frac_starved |", "|---|---|---|---|---|"]
    for n in Ns:
        if n == 1:
            continue
        for o in objs:
            rs = g.get((o, n), [])
            if rs:
                lines.append(means_row((o, n), rs, [f"stale_mean:{k}" for k in STARVATION_KEYS], (3, 3, 3)))
    gr = _runs(g)
    return lines + ["", "### log W histograms", "",
                    "Reconstructed from the per-update quantiles the trainer logs (1, 10, 50, 90, 99 %; piecewise-linear "
                    "inverse CDF between them, tails beyond 1 %/99 % not shown), pooled over stale updates and seeds.",
                    ""] + _figure("log W histograms", gr, lambda: plots.plot_logw_hist(
                        gr, hist, title=f"{model}, lr {lr:g}: log W, early (first quarter) vs late (last eighth), "
                                        "stale updates"))


def _mode(xs: list):
    xs = [x for x in xs if x is not None]
    return max(set(xs), key=xs.count) if xs else None


def _runs_section(rows: list[dict], out_dir: Path) -> list[str]:
    """A few runs side by side (any runs, not only a study grid): one row each, curves overlaid."""
    from respo.study import plots

    rows = sorted(rows, key=lambda r: r["run"])
    lines = ["## Runs compared", ""] + runs_table(rows)
    given = _given(rows)
    return lines + [""] + _figure("runs compared", given, lambda: plots.plot_runs_overlay(
        given, out_dir / "runs_compared.png", title="training score per run"))


def _budget_section(rows: list[dict]) -> list[str]:
    """Runs with a different number of updates than their model's main sweep, next to the main runs."""
    lines: list[str] = []
    fin = [r for r in rows if r["finished"] and not r["routing_replay"]]
    for model in sorted({r["model"] for r in fin}):
        mine = [r for r in fin if r["model"] == model]
        U_main = _mode([r["updates"] for r in mine])
        other = [r for r in mine if r["updates"] != U_main]
        if not other:
            continue
        keys = {(r["objective"], r["reuse"], r["lr"], r["group_size"]) for r in other}
        sel = [r for r in mine if (r["objective"], r["reuse"], r["lr"], r["group_size"]) in keys]
        g = group_rows(sel, ("objective", "updates"))
        objs = _order({o for o, _ in g}, ABLATION_ORDER)
        cols = sorted({u for _, u in g})
        desc = ", ".join(sorted({f"N = {n}, lr {lr:g}, G = {G}" for _, n, lr, G in keys}))
        by_u = dict(col_name=lambda u: f"{u} updates")
        lines += [f"## Longer budget ({model}; {desc})", "",
                  "The same settings with more policy updates (more rollout steps at the same N), to see whether the "
                  "high-N ordering is a transient of the short budget. Late mean:", ""]
        lines += cell_table(objs, cols, column_cells(g, "late_mean"), **by_u)
        lines += ["", "Held-out sampled pass@1 after training:", ""]
        lines += cell_table(objs, cols, column_cells(g, "pass@1"), **by_u)
        lines += [""]
    return lines


def _groups_section(rows: list[dict]) -> list[str]:
    lines: list[str] = []
    Gs = sorted({r["group_size"] for r in rows if r["finished"]})
    if len(Gs) < 2:
        return lines
    lines += ["## Group size G (the other reading of \"more sampled responses\")", ""]
    for (model, n, lr), _ in sorted(group_rows(rows, ("model", "reuse", "lr")).items()):
        sel = [r for r in rows if r["finished"] and r["model"] == model and r["reuse"] == n
               and r["lr"] == lr and not r["routing_replay"]]
        if len({r["group_size"] for r in sel}) < 2:
            continue
        g = group_rows(sel, ("objective", "group_size"))
        objs = _order({o for o, _ in g}, ABLATION_ORDER)
        cols = sorted({c for _, c in g})
        lines += [f"{model}, N = {n}, lr {lr:g}; late mean (prompts per update B fixed, so a larger G means more "
                  "sequences per update):", ""]
        lines += cell_table(objs, cols, column_cells(g, "late_mean"), col_name=lambda c: f"G = {c}")
        lines += [""]
    return lines


def _ablation_section(rows: list[dict], out_dir: Path) -> list[str]:
    from respo.study import plots

    lines: list[str] = []
    abl = [r for r in rows if r["finished"] and "/" in r["objective"]]
    if not abl:
        return lines
    lines += ["## Branch ablation (the core's `reshaped` objective, one kernel per advantage sign)", "",
              "respo+/vespo- = ReSPO's positive branch respo(2,0.5,2) with VESPO's negative branch vespo(3,2); "
              "vespo+/respo- = VESPO's positive branch vespo(2,3) with ReSPO's negative branch respo(1,0.5,2). "
              "Shown next to the plain objectives at the same model, G and lr, and next to plain REINFORCE (φ ≡ 1 on both "
              "branches: no staleness correction at all) where it was run.", ""]
    for (model, G, lr) in sorted({(r["model"], r["group_size"], r["lr"]) for r in abl}):
        sel = [r for r in rows if r["finished"] and r["model"] == model and r["group_size"] == G
               and r["lr"] == lr and not r["routing_replay"] and r["objective"] in ABLATION_ORDER]
        Ns = sorted({r["reuse"] for r in sel if "/" in r["objective"]})
        if not Ns:  # only reshaped pairs without a label here: runs.csv lists them
            continue
        sel = [r for r in sel if r["reuse"] in Ns]
        g = group_rows(sel, ("objective", "reuse"))
        objs = _order({o for o, _ in g}, ABLATION_ORDER)
        by_n = dict(col_name=lambda n: f"N = {n}")
        lines += [f"### {model}, G = {G}, lr {lr:g}: late mean", ""]
        lines += cell_table(objs, Ns, column_cells(g, "late_mean"), **by_n)
        lines += ["", "Held-out sampled pass@1 after training:", ""]
        lines += cell_table(objs, Ns, column_cells(g, "pass@1"), **by_n)
        lines += ["", "Mean coefficient of negatives (φ− mean) and k3 KL per token over stale updates:", "",
                  "| objective | N | φ− mean | φ+ mean | kl_k3 | frac_pos_low_w | log W p10 |", "|---|---|---|---|---|---|---|"]
        for o in objs:
            for n in Ns:
                rs = g.get((o, n), [])
                if rs and n > 1:
                    lines.append(means_row((o, n), rs, [f"stale_mean:{k}" for k in (
                        "phi/neg_mean", "phi/pos_mean", "kl_k3", "frac_pos_low_w", "log_w/p10")], (3, 3, 4, 3, 3)))
        tag = f"{model}_G{G}_lr{lr:g}".replace("/", "_")
        gr = _runs(g)
        lines += [""] + _figure("ablation curves", gr, lambda: plots.plot_curves(
            gr, out_dir / f"ablation_{tag}.png", title=f"branch ablation, {model}, lr {lr:g}"))
    return lines


def _replay_section(rows: list[dict]) -> list[str]:
    lines: list[str] = []
    rep = [r for r in rows if r["finished"] and r["routing_replay"]]
    if not rep:
        return lines
    lines += ["## Routing replay (MoE)", "",
              "Same objective, model, G and lr with and without routing replay (rollout experts forced in the "
              "training forward). router_shift = fraction of response tokens whose top-k expert set changed between "
              "rollout and training (mean over stale updates; with replay on, the shift the router would have had).", ""]
    keys = sorted({(r["model"], r["objective"], r["group_size"], r["lr"]) for r in rep})
    for model, obj, G, lr in keys:
        sel = [r for r in rows if r["finished"] and (r["model"], r["objective"], r["group_size"], r["lr"]) == (model, obj, G, lr)]
        g = group_rows(sel, ("routing_replay", "reuse"))
        Ns = sorted({n for _, n in g})
        names = {False: "replay off", True: "replay on"}
        by_n = dict(col_name=lambda n: f"N = {n}", row_head="routing")
        lines += [f"### {model}, {obj}, G = {G}, lr {lr:g}: late mean", ""]
        lines += cell_table([names[False], names[True]], Ns,
                            {(names[k[0]], k[1]): v for k, v in column_cells(g, "late_mean").items()}, **by_n)
        lines += ["", "Held-out sampled pass@1 after training:", ""]
        lines += cell_table([names[False], names[True]], Ns,
                            {(names[k[0]], k[1]): v for k, v in column_cells(g, "pass@1").items()}, **by_n)
        lines += ["", "| routing | N | router_shift | kl_k3 | frac_pos_low_w |", "|---|---|---|---|---|"]
        for (rr, n), v in sorted(g.items()):
            if n > 1:
                lines.append(means_row((names[rr], n), v, ["stale_mean:router_shift", "stale_mean:kl_k3",
                                                           "stale_mean:frac_pos_low_w"], (4, 4, 4)))
        lines += [""]
    return lines


def _mismatch_section(rows: list[dict]) -> list[str]:
    """Per model whose finished runs logged an engine–trainer mismatch (`respo.study.tables.mismatch_table`)."""
    lines: list[str] = []
    logged = [r for r in rows if r["finished"] and math.isfinite(r["mismatch_abs_diff"])]
    for model in sorted({r["model"] for r in logged}):
        lines += [f"## Engine–trainer mismatch ({model})", ""]
        lines += mismatch_table([r for r in logged if r["model"] == model]) + [""]
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
                 notes: str | Path | None = None, command: str = "", title: str = "Staleness study",
                 keep_rows: bool = False, skip_missing: bool = False, starts_by_seed: bool = False,
                 kernels_figure: str | Path | None = None) -> Path:
    """Write ``out_dir/report.md`` and its PNGs from the runs under ``dirs``; return the report path. With
    ``keep_rows``, ``out_dir/runs.csv`` keeps the rows it already holds of runs not under ``dirs`` (whose
    directories are gone): they count in every table as the runs under ``dirs`` do, report.md names them, and
    the figures, which need a run's per-update log, show the runs under ``dirs`` only. With ``keep_rows`` and no
    ``dirs``, report.md is redrawn from the kept rows alone (every figure that needs a log says so). The rules of
    ``respo table`` hold: a finished run without an endpoint its cell's other runs have is refused, or left out
    of the tables and named under ``skip_missing`` (runs.csv still holds its row); two recorded starting
    policies are refused unless ``starts_by_seed``. The kernels' figure, the same for every report, is drawn at
    ``kernels_figure`` and linked from there when given (one copy for a folder of reports), else in ``out_dir``."""
    from respo.study import plots

    dirs = [Path(d) for d in dirs]
    out_dir = Path(out_dir)
    problem = dir_problem(out_dir, "report directory", "--out")
    kernels = Path(kernels_figure) if kernels_figure is not None else out_dir / "kernels.png"
    if kernels_figure is not None and not problem:
        problem = dir_problem(kernels.parent, "kernels figure's directory", "--kernels-figure")
    if problem:
        raise ReportDirError(problem)
    if not dirs and not keep_rows:
        raise NoRunsError("no runs to report: give a sweep or run directory, or --keep-rows to redraw the report "
                          "folder's report.md from the rows of its runs.csv")
    runs = load_runs(dirs) if dirs else []
    if dirs and not runs:
        raise NoRunsError(f"no runs found under {', '.join(map(str, dirs))} (a run directory has a config.json)")
    given = {r.path.name for r in runs}
    old_csv = out_dir / "runs.csv"
    kept_rows = [r for r in read_rows([old_csv])[0] if r["run"] not in given] if keep_rows and old_csv.is_file() else []
    if not runs and not kept_rows:
        raise NoRunsError(f"no runs.csv rows to keep in {out_dir} and no run directory given: nothing to report")
    out_dir.mkdir(parents=True, exist_ok=True)
    fin = [r for r in runs if r.finished]
    also = (f" and the runs.csv rows of {len(kept_rows)} earlier run{'s' * (len(kept_rows) != 1)} (`--keep-rows`)"
            if kept_rows else "")
    lines = [f"# {title}", "",
             f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `respo report` from "
             f"{f'{len(runs)} run directories ({len(fin)} finished)' if runs else 'no run directory'}{also}. Every number below is computed from the run "
             "files (config.json, metrics.jsonl, summary.json) or those rows. Training score = (r + 1)/2 with r = ±1, averaged over the "
             "mini-batch of each update. Late mean = mean over the last eighth of the updates; early max = best "
             "over the first quarter.", ""]
    if notes and Path(notes).is_file():
        lines += [Path(notes).read_text().strip(), ""]
    lines += _commands_section(dirs, command)
    kernels.parent.mkdir(parents=True, exist_ok=True)
    p = plots.plot_kernels(kernels)
    lines += ["## Kernels: coefficient φ(W) per advantage sign", "",
              "Drawn from the core's loss gradients (one-token responses, c = −B·∂L/∂logp / Â): ReSPO and VESPO's "
              "φ(W), and GRPO's effective per-token coefficient (r where unclipped, 0 where clipped, dual clip at "
              f"{hyperparameters('grpo')['clip_ratio_c']:g}).",
              "", f"![kernels]({Path(os.path.relpath(p.resolve(), out_dir.resolve())).as_posix()})", ""]
    rows, left = endpoint_rule(_rows(runs) + kept_rows, REPORT_ENDPOINTS, skip=skip_missing)
    lines += _starts_section(rows, by_seed=starts_by_seed)
    lines += left[1:] + [""] if left else []
    if len(rows) <= OVERLAY_MAX_RUNS:
        lines += _runs_section(rows, out_dir)
    modal = {m: _mode([r["updates"] for r in rows if r["model"] == m]) for m in {r["model"] for r in rows}}
    main_budget = [r for r in rows if r["updates"] == modal[r["model"]]]  # one budget per model
    for model in sorted({r["model"] for r in rows if r["finished"]}):
        lines += _main_section(main_budget, model, out_dir, shared_lr, dirs)
    lines += _budget_section(rows)
    lines += _groups_section(main_budget)
    lines += _ablation_section(main_budget, out_dir)
    lines += _replay_section(main_budget)
    lines += _mismatch_section(main_budget)
    kept = write_runs_csv(runs, out_dir / "runs.csv", keep=keep_rows)
    lines += ["Per-run numbers behind every table (one row per run: coordinates, late mean, early max, held-out "
              "pass@1, diagnostics over stale updates) are in [runs.csv](runs.csv).", ""]
    if kept:
        one = len(kept) == 1
        lines += [f"The tables also hold {len(kept)} earlier run{'s' * (not one)} whose director"
                  f"{'y was' if one else 'ies were'} not given here, from the rows the runs.csv already in this folder "
                  "recorded (`--keep-rows`): " + ", ".join(f"`{k}`" for k in kept) + ". Their rows are kept in "
                  "runs.csv as written; the figures show only the runs whose directories were given.", ""]
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
    p.add_argument("sweeps", nargs="*", help="sweep directories (or run directories); none with --keep-rows "
                                             "redraws the report from its runs.csv rows alone")
    p.add_argument("--out", default="reports/staleness", help="report directory (report.md + PNGs)")
    p.add_argument("--shared-lr", type=float, default=None, help="lr of the main tables (default: the most-run lr)")
    p.add_argument("--notes", default=None, help="a markdown file included verbatim (the analysis)")
    p.add_argument("--title", default="Staleness study", help="first heading of report.md")
    p.add_argument("--keep-rows", action="store_true",
                   help="keep the rows the report directory's runs.csv already holds of runs not given here (their "
                        "directories are gone); they count in report.md's tables, which name them, and only the figures "
                        "leave them out")
    p.add_argument("--skip-missing", action="store_true",
                   help="leave out of the tables a finished run that lacks an endpoint (empty, nan or inf) the other "
                        "runs of its cell have, naming it in report.md (default: refused, naming its file or directory)")
    p.add_argument("--starts-by-seed", action="store_true",
                   help="report runs of several starting policies where each seed's runs share one start, naming each "
                        "start's seeds (default: two recorded starts are refused)")
    p.add_argument("--kernels-figure", default=None, metavar="PNG",
                   help="draw the kernels' figure (the same in every report) at PNG and link it from report.md, so a "
                        "folder of reports stores one copy (default: kernels.png in the report directory)")


def cmd_report(args: argparse.Namespace, command: str) -> int:
    path = build_report(args.sweeps, args.out, shared_lr=args.shared_lr, notes=args.notes, command=command,
                        title=args.title, keep_rows=args.keep_rows, skip_missing=args.skip_missing,
                        starts_by_seed=args.starts_by_seed, kernels_figure=args.kernels_figure)
    print(f"report: {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m respo.study.report", description=__doc__.split("\n")[0])
    add_arguments(p)
    return cmd_report(p.parse_args(argv), "python -m respo.study.report " + shlex.join(argv))


if __name__ == "__main__":
    sys.exit(main())
