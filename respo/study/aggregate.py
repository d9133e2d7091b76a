"""Reading sweep runs and reducing them to the study's numbers (pure functions, no plotting).

A run's per-update normalised training scores s_1..s_U (``score`` = mean of (r + 1)/2 over the
mini-batch) are summarised by `respo.train.scores.late_mean` (the last eighth of the updates) and
`respo.train.scores.early_max` (the first quarter), the paper's definitions; they are re-exported here.

Across seeds a cell is reported as mean ± sample standard deviation (ddof = 1; ± is omitted for
one seed). "Best per column" marks the largest mean in each column.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from respo.core.diagnostics import LOG_W_BIN_EDGES, LOG_W_BIN_NAMES
from respo.core.objectives import hyperparameters
from respo.study.names import objective_label
from respo.errors import RespoError
from respo.fileio import read_jsonl
from respo.train.rundir import log_problem
from respo.train.scores import early_max, late_mean

__all__ = ["Run", "RunLogError", "load_runs", "late_mean", "early_max", "mean_std", "best_per_column", "fmt_cell",
           "metric_series", "run_mean", "group_runs", "STARVATION_KEYS", "nanmean", "kernels_label",
           "pooled_low_fraction", "pass_at_1", "greedy_acc", "first_step_problem"]

STARVATION_KEYS = ("frac_pos_low_w", "pos_low_w_mass_share", "frac_starved")


@dataclass
class Run:
    """One training run of a sweep: its config, per-update records, eval records and summary."""

    path: Path
    config: dict
    records: list[dict]
    evals: list[dict]
    summary: dict | None
    label: str = ""
    coords: dict = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.summary is not None

    @property
    def scores(self) -> list[float]:
        return [r["score"] for r in self.records if r.get("score") is not None]


class RunLogError(RespoError):
    """A run whose ``metrics.jsonl`` does not hold one record per update 1, 2, .. (a gap, a repeat, or a
    finished run that logged fewer or more updates than it took)."""


def load_runs(dirs: Iterable[str | Path]) -> list[Run]:
    """Every run directory (has ``config.json``) under the given sweep directories or run dirs.

    Raises:
        RunLogError: a run's log has a gap or a repeat, or a finished run logged another number of updates
            than its ``updates`` (`respo.train.rundir.log_problem`).
        respo.fileio.LogReadError: a line of a log other than a torn last one is not a JSON record.
    """
    runs, seen = [], set()
    for d in dirs:
        d = Path(d)
        cands = [d] if (d / "config.json").is_file() else sorted(p.parent for p in d.glob("**/config.json"))
        for rd in cands:
            key = rd.resolve()
            if key in seen or rd.name == "final" or "ckpt" in rd.parts:
                continue
            seen.add(key)
            cfg = json.loads((rd / "config.json").read_text())
            recs = read_jsonl(rd / "metrics.jsonl") if (rd / "metrics.jsonl").is_file() else []
            summ = json.loads((rd / "summary.json").read_text()) if (rd / "summary.json").is_file() else None
            problem = log_problem([r.get("update") for r in recs if "event" not in r],
                                  cfg.get("updates") if summ is not None else None)
            if problem:
                raise RunLogError(f"{rd / 'metrics.jsonl'} {problem}"
                                  + (f", but the run finished at update {cfg.get('updates')}" if summ is not None else "")
                                  + ": its windows would be computed on the wrong updates; restore its log or leave "
                                    "the run out")
            label = objective_label(cfg.get("objective", "?"), cfg.get("objective_kwargs") or {})
            if cfg.get("loss_agg_mode"):  # an aggregation override is its own row of every table
                label += f"@{cfg['loss_agg_mode']}"
            coords = {"model": _model_label(cfg), "objective": label, "reuse": cfg.get("reuse"), "lr": cfg.get("lr"),
                      "seed": cfg.get("seed"), "group_size": cfg.get("group_size"),
                      "routing_replay": bool(cfg.get("routing_replay")), "updates": cfg.get("updates"),
                      "task": cfg.get("task"), "task_kwargs": json.dumps(cfg.get("task_kwargs", {}), sort_keys=True),
                      "prompts": cfg.get("prompts"), "loss_agg_mode": cfg.get("loss_agg_mode") or "",
                      "kernels": kernels_label(cfg), "start": start_label(cfg),
                      "engine": cfg.get("rollout_engine") or "respo"}  # runs before engines existed sampled with respo's
            runs.append(Run(rd, cfg, [r for r in recs if "event" not in r], [r for r in recs if r.get("event") == "eval"],
                            summ, label, coords))
    return runs


def kernels_label(cfg: dict) -> str:
    """The objective with its exact kernel choice: ``reshaped`` runs as ``POS+/NEG-`` kernel specs (e.g.
    ``respo(2,0.5,2)+/vespo(3,2)-``, whatever their short label), others as `objective_label`."""
    kw = cfg.get("objective_kwargs") or {}
    if cfg.get("objective") == "reshaped":
        spec = {**hyperparameters("reshaped"), **kw}  # the core's default branches where a run sets none
        pos, neg = (re.sub(r"\s+", "", str(spec[k])) for k in ("pos_kernel", "neg_kernel"))
        return f"{pos}+/{neg}-"
    return objective_label(cfg.get("objective", "?"), kw)


def start_label(cfg: dict) -> str:
    """The starting policy's identity shared by a run's seeds: the first 12 hex digits of its weights'
    sha256 (``policy.weights_sha256`` in config.json) for a loaded policy (warm start, model directory,
    packaged model); empty for a preset trained from scratch (its weights depend on the seed) and for
    runs recorded before the fingerprint existed."""
    policy = cfg.get("policy") or {}
    return str(policy.get("weights_sha256") or "")[:12]


def _model_label(cfg: dict) -> str:
    """The preset behind a run's policy: the warm start's recorded preset, else the model field."""
    policy = cfg.get("policy") or {}
    preset = (policy.get("config") or {}).get("preset") if isinstance(policy.get("config"), dict) else None
    return str(preset or policy.get("preset") or Path(str(cfg.get("model"))).name)


def nanmean(xs: Iterable[float | None]) -> float:
    vals = [float(x) for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(vals) / len(vals) if vals else math.nan


def mean_std(xs: Sequence[float]) -> tuple[float, float, int]:
    """(mean, sample std with ddof=1 (NaN for one value), n) over the finite values."""
    vals = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
    n = len(vals)
    if n == 0:
        return math.nan, math.nan, 0
    m = sum(vals) / n
    if n == 1:
        return m, math.nan, 1
    return m, math.sqrt(sum((v - m) ** 2 for v in vals) / (n - 1)), n


def metric_series(run: Run, key: str) -> list[float]:
    """Per-update values of ``key`` (None/NaN kept as NaN so positions match updates)."""
    return [math.nan if r.get(key) is None else float(r[key]) for r in run.records]


def run_mean(run: Run, key: str, *, stale_only: bool = False) -> float:
    """Mean of ``key`` over the run's updates (NaN values skipped); ``stale_only`` keeps the updates
    with staleness > 0 (the first mini-batch of a rollout step has log W = 0 exactly)."""
    recs = [r for r in run.records if not stale_only or (r.get("staleness_mean") or 0) > 0]
    return nanmean(r.get(key) for r in recs)


def greedy_acc(run: Run) -> float:
    """Held-out greedy (temperature 0) accuracy after the last update: one decode per prompt, so on the
    same prompts it has no sampling noise; NaN when not evaluated."""
    v = ((run.summary or {}).get("eval_after") or {}).get("greedy_acc")
    return math.nan if v is None else float(v)


def pass_at_1(run: Run) -> float:
    """Held-out pass@1 after the last update (``mean@1`` in older summaries); NaN when not evaluated."""
    ev = (run.summary or {}).get("eval_after") or {}
    v = ev.get("pass@1", ev.get("mean@1"))
    return math.nan if v is None else float(v)


def pooled_low_fraction(run: Run, sign: str, below: float = -1.0, *, min_staleness: int = 1) -> float:
    """Fraction of all stale responses of one advantage sign (``"pos"`` / ``"neg"``) with log W <
    ``below``, pooled over the run's updates of staleness >= ``min_staleness`` (>= 1: every stale one) from
    the fixed-bin ``log_w_hist/<sign>/<bin>`` counts: Σ counts of bins whose upper edge is <= ``below`` /
    Σ all counts (NaN when none). ``below`` must be a bin edge (`respo.core.diagnostics.LOG_W_BIN_EDGES`)."""
    if below not in LOG_W_BIN_EDGES:
        raise ValueError(f"pooled_low_fraction: below={below} is not a histogram edge {LOG_W_BIN_EDGES}")
    low_bins = {name for name, upper in zip(LOG_W_BIN_NAMES, LOG_W_BIN_EDGES) if upper <= below}
    low = total = 0.0
    for rec in run.records:
        stale = rec.get("staleness_mean") or 0
        if stale <= 0 or stale < min_staleness:  # an asynchronous update mixing levels counts as stale
            continue
        for k, v in rec.items():
            if k.startswith(f"log_w_hist/{sign}/") and v is not None:
                total += v
                low += v if k.split("/", 2)[2] in low_bins else 0.0
    return low / total if total else math.nan


def group_runs(runs: Iterable[Run], keys: Sequence[str]) -> dict[tuple, list[Run]]:
    """Finished runs grouped by the given coordinates (e.g. ("objective", "reuse"))."""
    out: dict[tuple, list[Run]] = {}
    for r in runs:
        if r.finished:
            out.setdefault(tuple(r.coords[k] for k in keys), []).append(r)
    return out


def best_per_column(table: dict[tuple[Any, Any], float], *, higher: bool = True) -> set[tuple[Any, Any]]:
    """Cells (row, col) holding the best finite value of their column (ties all marked).

    Args:
        table: (row, col) -> value; NaN cells never win.
    """
    best: dict[Any, float] = {}
    for (row, col), v in table.items():
        if v is None or not math.isfinite(v):
            continue
        if col not in best or (v > best[col] if higher else v < best[col]):
            best[col] = v
    return {(row, col) for (row, col), v in table.items()
            if v is not None and math.isfinite(v) and col in best and v == best[col]}


def fmt_cell(mean: float, std: float, n: int, *, digits: int = 3, bold: bool = False) -> str:
    """``.504 ± .012 (3)`` style cell; ``–`` when empty; bold with ``**``."""
    if n == 0 or not math.isfinite(mean):
        return "–"
    s = f"{mean:.{digits}f}"
    if n > 1 and math.isfinite(std):
        s += f" ± {std:.{digits}f}"
    s += f" ({n})"
    return f"**{s}**" if bold else s


def first_step_problem(a: dict, b: dict) -> str | None:
    """Why two rows of one seed (two arms) did not share their first rollout step, or None when nothing
    recorded says they did not: the same seed, the same recorded starting policy (``start``), and, where both
    record it (N > 1), the same mean score of the first rollout step (``step_scores``: its samples, hence its
    scores, are the same for every objective when the step was shared)."""
    if a["seed"] != b["seed"]:
        return f"{a['run']} is seed {a['seed']} and {b['run']} seed {b['seed']}"
    if a.get("start", "") != b.get("start", ""):
        return f"{a['run']} started from {a['start'] or 'an unrecorded policy'} and {b['run']} from " \
               f"{b['start'] or 'an unrecorded policy'}"
    sa, sb = a.get("step_scores") or [], b.get("step_scores") or []
    if sa and sb and abs(sa[0] - sb[0]) > 1e-6:
        return f"the first rollout step scored {sa[0]:.6g} in {a['run']} and {sb[0]:.6g} in {b['run']}"
    return None
