"""Per-update metrics: JSON lines (always) and TensorBoard events (when tensorboard is installed),
phase timing, and a finished run's ``summary.json``."""

from __future__ import annotations

import json
import math
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import torch

from respo.train.scores import late_mean

__all__ = ["MetricsLogger", "to_float", "read_jsonl", "timed", "write_summary"]



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


def read_jsonl(path: str | Path) -> list[dict]:
    """All records of a metrics file (a truncated last line, e.g. after a kill, is skipped)."""
    out = []
    with open(path) as fh:
        for line in fh:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


class MetricsLogger:
    """Append-only ``metrics.jsonl`` writer with an optional TensorBoard mirror.

    On resume, records with ``update`` beyond the resumed update are dropped first so the file
    describes one consistent run.
    """

    def __init__(self, run_dir: str | Path, *, tensorboard: bool = True, resume_update: int | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_update is not None and self.path.exists():
            keep = [r for r in read_jsonl(self.path) if r.get("update", 0) <= resume_update]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in keep))
        elif resume_update is None and self.path.exists():
            self.path.unlink()
        self._fh = open(self.path, "a")
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                pass
            else:
                self._tb = SummaryWriter(str(Path(run_dir) / "tb"))

    def log(self, record: Mapping[str, Any]) -> dict:
        rec = {k: to_float(v) for k, v in record.items()}
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


def write_summary(run_dir: str | Path, cfg, evals: dict, update: int, dropped: int, wall: float) -> None:
    """``summary.json``: staleness reached, first and late training score, held-out evaluations, wall time."""
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
        "score_first": scores[0] if scores else None,
        "score_late_mean": late_mean(scores) if scores else None,
        "eval_before": evals.get("before"),
        "eval_after": evals.get("after"),
        "evals": {k: v for k, v in evals.items() if k not in ("before", "after")},
        "wall_s": wall,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=to_float))
