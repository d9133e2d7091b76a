"""Per-update metrics: a mini-batch's own numbers (`batch_metrics`), JSON lines (always) and TensorBoard
events (when tensorboard is installed), phase timing, and a finished run's ``summary.json``."""

from __future__ import annotations

import json
import math
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch

from respo.core.mismatch import mismatch_metrics
from respo.fileio import read_jsonl, write_text_atomic  # read_jsonl: re-exported for its older importers
from respo.core.staleness import token_staleness_metrics
from respo.train.buffer import Batch
from respo.train.scores import late_mean

__all__ = ["MetricsLogger", "to_float", "read_jsonl", "timed", "write_summary", "batch_metrics"]



@contextmanager
def timed(record: dict[str, Any], phase: str) -> Iterator[None]:
    """Wall time of the block, in seconds, written to ``record[f"time/{phase}"]``."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        record[f"time/{phase}"] = time.perf_counter() - t0


def to_float(v: Any) -> Any:
    """Detached 0-d tensors and numpy scalars -> float; NaN/inf -> None (valid JSON)."""
    if isinstance(v, torch.Tensor):
        v = v.detach().float().item() if v.numel() == 1 else v.detach().tolist()
    elif hasattr(v, "item") and not isinstance(v, (str, bytes)):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _finite_or_none(v: Any) -> tuple[Any, int]:
    """`to_float`, through lists too; returns the value and how many NaN/inf it replaced by None."""
    if isinstance(v, (list, tuple)):
        pairs = [_finite_or_none(x) for x in v]
        return [x for x, _ in pairs], sum(n for _, n in pairs)
    x = to_float(v)
    if isinstance(x, list):
        return _finite_or_none(x)
    return x, int(x is None and v is not None)


class MetricsLogger:
    """Append-only ``metrics.jsonl`` writer with an optional TensorBoard mirror.

    NaN/inf values are written as null (valid JSON); a record holding any gets
    ``nonfinite_metrics`` (how many of its metrics were not finite), and a warning names each such
    metric the first time (a mean over an empty set, e.g. no positive-advantage tokens, is NaN too).

    On resume, records with ``update`` beyond the resumed update are dropped first so the file
    describes one consistent run.
    """

    def __init__(self, run_dir: str | Path, *, tensorboard: bool = True, resume_update: int | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_update is not None and self.path.exists():
            keep = [r for r in read_jsonl(self.path) if r.get("update", 0) <= resume_update]
            write_text_atomic(self.path, "".join(json.dumps(r) + "\n" for r in keep))
        elif resume_update is None and self.path.exists():
            self.path.unlink()
        self._fh = open(self.path, "a")
        self._warned: set[str] = set()  # metrics already warned about as not finite
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                pass
            else:
                self._tb = SummaryWriter(str(Path(run_dir) / "tb"))

    def log(self, record: Mapping[str, Any]) -> dict:
        rec, nonfinite = {}, []
        for k, v in record.items():
            rec[k], n = _finite_or_none(v)
            if n:
                nonfinite.append(k)
        if nonfinite:
            rec["nonfinite_metrics"] = len(nonfinite)
        new = [k for k in nonfinite if k not in self._warned]
        if new:
            self._warned.update(new)
            where = f" at update {rec['update']}" if "update" in rec else ""
            warnings.warn(f"metric(s) {', '.join(new)} not finite (NaN or inf){where}: written as null in "
                          f"{self.path} and counted in nonfinite_metrics (said once per metric; a mean over "
                          f"an empty set, e.g. no positive-advantage tokens, is NaN too)", stacklevel=2)
        self._fh.write(json.dumps(rec) + "\n")
        self._fh.flush()
        if self._tb is not None and "update" in rec:
            for k, v in rec.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "update":
                    self._tb.add_scalar(k, v, rec["update"])
        return rec

    def close(self) -> None:
        self._fh.close()
        if self._tb is not None:
            self._tb.close()


def write_summary(run_dir: str | Path, cfg, evals: dict, update: int, dropped: int,
                  wall_s_parts: Sequence[float], *, waited: int = 0) -> None:
    """``summary.json``: staleness reached (and the async batches dropped or held back), first and late training score, held-out evaluations, wall time
    (``wall_s`` the total over every part of a resumed run, ``wall_s_parts`` each part)."""
    run_dir = Path(run_dir)
    recs = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "event" not in r]
    scores = [r["score"] for r in recs if r.get("score") is not None]
    summary = {
        "updates": update,
        "objective": cfg.objective,
        "reuse": cfg.reuse,
        "mode": cfg.mode,
        "lr": cfg.lr,
        "seed": cfg.seed,
        "staleness_mean": float(np.mean([r["staleness_mean"] for r in recs])) if recs else None,
        "staleness_max": max((r["staleness_max"] for r in recs), default=None),
        "dropped": dropped,
        "waited": waited,
        "score_first": scores[0] if scores else None,
        "score_late_mean": late_mean(scores) if scores else None,
        "eval_before": evals.get("before"),
        "eval_after": evals.get("after"),
        "evals": {k: v for k, v in evals.items() if k not in ("before", "after")},
        "wall_s": float(sum(wall_s_parts)),
        "wall_s_parts": [float(t) for t in wall_s_parts],
    }
    write_text_atomic(run_dir / "summary.json", json.dumps(summary, indent=1, default=to_float))


def batch_metrics(batch: Batch, old_logp: torch.Tensor, version: int) -> dict[str, Any]:
    """Score, pass rate, length and staleness of a mini-batch, and the rollout mismatch

    Staleness is per token (`respo.core.staleness.token_staleness_metrics`: ``staleness_mean``,
    ``staleness_max``, ``staleness/lag_k``, ``staleness/mixed``): with partial rollouts one response holds
    tokens of several versions; with whole responses the numbers are the rows'.

        mismatch = sum_t m_t |old_logp_t - behaviour_logp_t| / sum_t m_t

    (training vs sampling log-probs of the same weights; 0 up to kernel differences with the respo engine),
    and the rest of the engine–trainer mismatch under verl's ``rollout_corr/*`` names
    (`respo.core.mismatch.mismatch_metrics`; all 0 with ``rollout_bypass``, where old_logp is the engine's).
    """
    mismatch = mismatch_metrics(old_logp, batch.behaviour_logp, batch.mask)
    return {"score": ((batch.rewards + 1) / 2).mean(), "pass_rate": (batch.rewards > 0).float().mean(),
            "response_length": batch.mask.sum(1).mean(),
            **token_staleness_metrics(batch.token_versions(), batch.mask, version),
            "rollout_mismatch": mismatch["rollout_corr/abs_diff"], **mismatch}
