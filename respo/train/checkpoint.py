"""Atomic, verified checkpoints.

Layout of ``<run>/ckpt/update-000042/``:

- ``model.safetensors``  model weights (`safetensors.torch.save_model`, handles tied weights)
- ``trainer.pt``         optimizer + scheduler state, RNG states (torch, python, numpy, sampling
                         generator), update counter, data cursor, rollout buffer contents: tensors and
                         plain values only (numbers, strings, lists, tuples, dicts), read back with
                         ``torch.load(weights_only=True)``, which refuses any other object, so a
                         checkpoint cannot run code when it is loaded
- ``manifest.json``      format version, update, and the SHA-256 and size of every file above

A checkpoint is written into a temporary directory next to the final one, fsynced, and renamed
into place, so a kill at any moment leaves either the previous checkpoints or the new complete one
(plus, at worst, a ``.tmp-*`` directory that is ignored and cleaned up). Loading verifies the
manifest; a missing file, wrong size or checksum raises `CheckpointError` rather than loading
anything. The checksums protect against corruption, not against whoever can write the run directory
(they can rewrite the manifest too): that protection is weights-only loading, which refuses a
``trainer.pt`` that holds anything but tensors and plain values, in one line, before any of it is used.

When: every ``checkpoint_every`` updates, at the end of a run, and on SIGINT/SIGTERM (the trainer
finishes the current update first, so the checkpoint is always at an update boundary).

What is saved besides the weights is `RunState`: counters, optimizer and scheduler, every RNG, the
data cursor and the rollout buffer.

Each checkpoint's manifest records the settings that produced it (``config``), which
`respo.train.rundir.check_resume` compares with a resumed run's. The rest of the run directory's
rules are `respo.train.rundir`'s.

Buffer rule: in sync mode the unconsumed mini-batches of the current rollout step are saved, so
resume is bitwise. In async mode the rollout worker is held at a boundary while the checkpoint is
written, and what it has in flight is saved with the run state (``rollouts``: the finished batches, the
partial rollout in the making with every token's version and log-probs, the worker's version, counters and
generator, and its snapshot's weights when it is behind the learner), so a resumed run trains on the same
batches with the versions they were sampled with; its timing, and so which version the next segments get,
is as nondeterministic as any async run's (`respo.train.async_`).
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from safetensors.torch import load_model, save_model

from respo.errors import RespoError
from respo.train.buffer import PromptStream, RolloutBuffer

__all__ = ["CheckpointError", "RunState", "save_checkpoint", "load_checkpoint", "latest_checkpoint",
           "verify_checkpoint", "checkpoint_manifest", "rng_state", "set_rng_state", "FORMAT"]

FORMAT = 1
MANIFEST = "manifest.json"
HASH_CHUNK_BYTES = 1 << 20  # files are hashed 1 MiB at a time


class CheckpointError(RespoError, RuntimeError):
    """A checkpoint is missing, partial or corrupt."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(HASH_CHUNK_BYTES), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def rng_state(generator: torch.Generator | None = None) -> dict[str, Any]:
    """Every RNG a run draws from, as tensors and plain values (numpy's key as a tensor, not an array)."""
    kind, key, pos, has_gauss, cached = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": (kind, torch.from_numpy(key.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
            "generator": None if generator is None else generator.get_state()}


def set_rng_state(state: dict[str, Any], generator: torch.Generator | None = None) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    kind, key, pos, has_gauss, cached = state["numpy"]
    key = key.numpy() if isinstance(key, torch.Tensor) else np.asarray(key)
    np.random.set_state((kind, key.astype(np.uint32), pos, has_gauss, cached))
    if generator is not None and state.get("generator") is not None:
        generator.set_state(state["generator"])


def save_checkpoint(ckpt_root: str | Path, update: int, model: torch.nn.Module, trainer_state: dict[str, Any],
                    *, keep: int = 2, config: Mapping[str, Any] | None = None) -> Path:
    """Write checkpoint ``update`` atomically under ``ckpt_root`` and keep the newest ``keep``.

    Args:
        ckpt_root: directory holding ``update-*`` checkpoints.
        update: the number of optimizer steps taken so far.
        model: the policy (its ``state_dict`` is written with safetensors).
        trainer_state: picklable dict (optimizer/scheduler state dicts, RNG, cursor, buffer...).
        keep: number of newest checkpoints kept.
        config: the run's settings (JSON-ready), recorded in the manifest (see `respo.train.rundir.check_resume`).

    Returns:
        The final checkpoint directory.
    """
    root = Path(ckpt_root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"update-{update:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-update-{update:06d}-", dir=root))
    try:
        save_model(model, str(tmp / "model.safetensors"))
        buf = io.BytesIO()
        torch.save(trainer_state, buf)
        (tmp / "trainer.pt").write_bytes(buf.getvalue())
        files = {}
        for name in ("model.safetensors", "trainer.pt"):
            p = tmp / name
            with open(p, "rb+") as fh:
                os.fsync(fh.fileno())
            files[name] = {"sha256": _sha256(p), "bytes": p.stat().st_size}
        manifest = {"format": FORMAT, "update": update, "files": files}
        if config is not None:
            manifest["config"] = dict(config)
        with open(tmp / MANIFEST, "w") as fh:
            json.dump(manifest, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_dir(tmp)
        if final.exists():  # re-saving the same update (e.g. at exit): replace it
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(root)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        latest = latest_checkpoint(root)  # the temporary directory is gone: the previous checkpoint, if any
        need = sum(p.stat().st_size for p in latest.iterdir() if p.is_file()) if latest else 0
        kept = f"; the previous checkpoint {str(latest)!r} is intact" if latest else ""
        raise CheckpointError(f"checkpoint {str(final)!r} could not be written: no space left on the device of "
                              f"{str(root)!r} ({os.strerror(err.errno).lower()}; a checkpoint of this run needs about "
                              f"{max(need, 1) / 2**20:.0f} MiB free there){kept}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in sorted(p for p in root.glob("update-*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-update-*"):
        if stale != tmp:
            shutil.rmtree(stale, ignore_errors=True)
    return final


def latest_checkpoint(ckpt_root: str | Path) -> Path | None:
    """Newest ``update-*`` directory under ``ckpt_root`` (not verified), or None."""
    root = Path(ckpt_root)
    if not root.is_dir():
        return None
    dirs = sorted(p for p in root.glob("update-*") if p.is_dir())
    return dirs[-1] if dirs else None


def checkpoint_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest of checkpoint ``path`` (read, not verified: see `verify_checkpoint`)."""
    path = Path(path)
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} has no {MANIFEST}: it is partial or not a checkpoint")
    try:
        return json.loads(mpath.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"checkpoint {str(path)!r}: {MANIFEST} is corrupt ({err})") from None


def verify_checkpoint(path: str | Path) -> dict[str, Any]:
    """Check the manifest and every file's size and SHA-256; return the manifest."""
    path = Path(path)
    manifest = checkpoint_manifest(path)
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {str(path)!r} has format {manifest.get('format')!r}, expected {FORMAT}")
    bad = []
    for name, meta in manifest.get("files", {}).items():
        p = path / name
        if not p.is_file():
            bad.append(f"{name} is missing")
        elif p.stat().st_size != meta["bytes"]:
            bad.append(f"{name} has {p.stat().st_size} bytes, manifest says {meta['bytes']}")
        elif _sha256(p) != meta["sha256"]:
            bad.append(f"{name} fails its SHA-256 check")
    if not manifest.get("files"):
        bad.append("the manifest lists no files")
    if bad:
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt: " + "; ".join(bad))
    return manifest


def load_checkpoint(path: str | Path, model: torch.nn.Module) -> dict[str, Any]:
    """Verify ``path``, load its weights into ``model`` (strict) and return the trainer state."""
    path = Path(path)
    manifest = verify_checkpoint(path)
    missing, unexpected = load_model(model, str(path / "model.safetensors"), strict=False)
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {str(path)!r} does not match the model: {len(missing)} missing and "
                              f"{len(unexpected)} unexpected tensors (e.g. {(list(missing) + list(unexpected))[:3]})")
    state = load_trainer_state(path / "trainer.pt")
    if state.get("update") != manifest["update"]:
        raise CheckpointError(f"checkpoint {str(path)!r}: trainer state is for update {state.get('update')}, "
                              f"manifest says {manifest['update']}")
    return state


#: numpy's array reconstruction, which checkpoints written before the RNG state held plain values pickled
#: (numpy's RNG key): it builds an array of a dtype and nothing else, so weights-only loading may allow it.
_NUMPY_ARRAY_GLOBALS = (np.ndarray, np.dtype, np.dtypes.UInt32DType, np._core.multiarray._reconstruct)


def load_trainer_state(path: str | Path) -> dict[str, Any]:
    """``trainer.pt`` read with ``weights_only=True``: tensors and plain values only (and the numpy arrays of
    older checkpoints' RNG state); anything else is refused with `CheckpointError` before it can run."""
    import pickle

    try:
        with torch.serialization.safe_globals(list(_NUMPY_ARRAY_GLOBALS)):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        import re

        found = re.search(r"GLOBAL ([\w.]+)", str(err))
        what = f" (it calls {found.group(1)})" if found else ""
        raise CheckpointError(f"{str(path)!r} holds objects other than tensors and plain values{what}: refused, "
                              "since loading it could run code") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{str(path)!r} holds a {type(state).__name__}, not a trainer state (a dict)")
    return state


@dataclass
class RunState:
    """Everything of a run that changes from update to update, besides the weights.

    ``update`` counts updates, ``version`` the policy versions (one per applied update: a skipped one, with a
    non-finite gradient, leaves the policy as it was), ``skipped_in_a_row`` the skipped updates just before
    this one, ``dropped``
    the async batches dropped as too stale, ``waited`` those the wait policy held back, ``rollouts`` what the
    async worker had in flight (`respo.train.sources.AsyncSource.checkpointing`), ``evals`` the held-out evaluations so far,
    ``wall_s_parts`` the wall time of each earlier part of a resumed run (up to its last checkpoint)
    and ``part_start`` when this part began (`time.perf_counter`). `state_dict` /
    `load_state_dict` round-trip all of it, together with the global RNGs (torch, python, numpy),
    so a resumed sync run continues bitwise.
    """

    optimizer: torch.optim.Optimizer
    scheduler: Any  # torch.optim.lr_scheduler.LRScheduler
    stream: PromptStream  # the data cursor
    buffer: RolloutBuffer  # sync mode: the unconsumed mini-batches of the current rollout step
    generator: torch.Generator  # the sampling generator
    update: int = 0
    version: int = 0
    skipped_in_a_row: int = 0
    dropped: int = 0
    waited: int = 0
    rollouts: dict[str, Any] | None = None  # async mode: what the rollout worker had in flight at the checkpoint
    evals: dict[str, Any] = field(default_factory=dict)
    wall_s_parts: list[float] = field(default_factory=list)
    part_start: float = field(default_factory=time.perf_counter)

    def wall_parts(self) -> list[float]:
        """Wall time of every part of the run so far, this one included (seconds)."""
        return [*self.wall_s_parts, time.perf_counter() - self.part_start]

    def state_dict(self) -> dict[str, Any]:
        return {"update": self.update, "version": self.version, "skipped_in_a_row": self.skipped_in_a_row,
                "dropped": self.dropped, "waited": self.waited, "rollouts": self.rollouts,
                "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "rng": rng_state(self.generator), "cursor": self.stream.state(), "buffer": self.buffer.state(),
                "evals": self.evals, "wall_s_parts": self.wall_parts()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"], self.generator)
        self.stream.load_state(state["cursor"])
        self.buffer.load_state(state["buffer"])
        self.update, self.version, self.dropped = state["update"], state["version"], state["dropped"]
        self.skipped_in_a_row = state.get("skipped_in_a_row", 0)  # absent from checkpoints written before it
        self.waited = state.get("waited", 0)  # (the same)
        self.rollouts = state.get("rollouts")  # (the same: the async worker then starts afresh)
        self.evals = state.get("evals", {})
        self.wall_s_parts = list(state.get("wall_s_parts", []))

    def save(self, ckpt_root: str | Path, model: torch.nn.Module, *, keep: int,
             config: Mapping[str, Any] | None = None) -> Path:
        """Checkpoint ``model`` and this state as ``update-<update>`` under ``ckpt_root`` (``config``: the
        run's settings, recorded in the manifest)."""
        return save_checkpoint(ckpt_root, self.update, model, self.state_dict(), keep=keep, config=config)

    def load(self, path: str | Path, model: torch.nn.Module) -> None:
        """Verify checkpoint ``path``, load its weights into ``model`` and its state into this one."""
        self.load_state_dict(load_checkpoint(path, model))
