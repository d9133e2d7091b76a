"""The run directory: what a run writes there, and when a directory may be used.

A new run goes only into an empty or absent directory (``--overwrite`` deletes a previous run's
files first, nothing else); ``--resume`` needs a checkpoint whenever the directory holds a previous
run's files, and refuses any setting that would change the experiment (`RESUMABLE` lists the
settings that cannot; they may change and are recorded in config.json under ``resumed``). One
process at a time may use a run directory (an advisory lock on the directory itself, so nothing
extra is written). A path that cannot become a run directory (a regular file, a path under a file,
a directory this process may not write) is refused by `check_writable` before anything is written.

The trainer's order: `check_writable` → `lock_run_dir` → `prepare_run_dir` (the checkpoint to resume from) →
`check_resume` (settings, and a ``metrics.jsonl`` that logs exactly the checkpoint's updates: `log_problem`)
and `finished` → `reopen` (a resumed run that goes on drops what described its end) → `write_config`.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

from respo.errors import RespoError
from respo.fileio import read_jsonl, write_text_atomic
from respo.train.checkpoint import latest_checkpoint
from respo.train.config import rule

__all__ = ["RunDirError", "RUN_ENTRIES", "RESUMABLE", "ENDING_ENTRIES", "run_entries", "check_writable",
           "prepare_run_dir", "lock_run_dir", "read_record", "resume_changes", "check_resume", "finished",
           "resumed_entries", "reopen", "close_previous_end", "PREVIOUS_END", "write_config", "log_problem"]

#: What a run writes into its directory; anything else there (a sweep's train.log, notes) is left alone.
RUN_ENTRIES = ("config.json", "metrics.jsonl", "summary.json", "ckpt", "final", "tb", "report.md", "curve.png",
               "previous-end")
#: What describes a run's end (the CLI and the demo add report.md and curve.png); removed when a resumed
#: run goes on past it.
ENDING_ENTRIES = ("final", "summary.json", "report.md", "curve.png")
#: Where a resumed run that goes on past its end keeps that end's files until the new end is written.
PREVIOUS_END = "previous-end"
#: Settings a resumed run may change (``"resumable"`` in their `TrainConfig` field's metadata): they change
#: neither the weights nor the per-update records (evaluation draws from its own generator, so
#: ``eval_every`` only adds or removes eval records; ``max_nonfinite_steps`` only says how many skipped
#: updates in a row stop a run). Every other setting, ``threads`` included (the thread count changes CPU
#: floating-point sums), is part of the experiment.
RESUMABLE = tuple(rule("resumable"))


class RunDirError(RespoError, RuntimeError):
    """A run directory cannot be used as asked (not a writable directory, a previous run in it, nothing
    to resume, changed settings)."""


def run_entries(run_dir: str | Path) -> list[str]:
    """The `RUN_ENTRIES` present in ``run_dir``: the files of a previous run."""
    run_dir = Path(run_dir)
    return [name for name in RUN_ENTRIES if (run_dir / name).exists()]


def _writable(path: Path) -> bool:
    """This process may create entries in directory ``path`` (by its effective ids where the OS allows)."""
    effective = os.access in os.supports_effective_ids
    return os.access(path, os.W_OK | os.X_OK, effective_ids=effective)


#: The subdirectories a run (or a resumed one) writes into, checked with the run directory itself.
_WRITTEN_DIRS = ("ckpt", "final", "tb")


def check_writable(run_dir: str | Path) -> None:
    """Refuse, before anything is written, a ``run_dir`` that cannot become a run directory.

    Raises:
        RunDirError: ``run_dir`` is not a directory (a regular file, ...), lies under a file, or is (or
            would be created in) a directory this process may not write, or holds a ``ckpt/``, ``final/`` or
            ``tb/`` it may not write (so a resume never deletes a finished run's outputs and then fails).
    """
    run_dir = Path(run_dir)
    if run_dir.exists() or run_dir.is_symlink():
        if not run_dir.is_dir():
            raise RunDirError(f"run directory {str(run_dir)!r} exists and is not a directory; choose another "
                              f"--out-dir")
        if not _writable(run_dir):
            raise RunDirError(f"run directory {str(run_dir)!r} is not writable; choose another --out-dir or "
                              f"make it writable")
        for name in _WRITTEN_DIRS:  # a resumed run writes into these too: refuse before anything changes
            sub = run_dir / name
            if sub.is_dir() and not _writable(sub):
                raise RunDirError(f"{str(sub)!r} is not writable, and a run in {str(run_dir)!r} writes into it; make "
                                  f"it writable or choose another --out-dir (nothing was changed)")
        return
    parent = run_dir.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise RunDirError(f"run directory {str(run_dir)!r} cannot be created: {str(parent)!r} is a file, not a "
                          f"directory")
    if not _writable(parent):
        raise RunDirError(f"run directory {str(run_dir)!r} cannot be created: {str(parent)!r} is not writable")


def prepare_run_dir(run_dir: str | Path, *, resume: bool, overwrite: bool) -> Path | None:
    """Check that ``run_dir`` may be used as asked; return the checkpoint to resume from (None: start fresh).

    - neither flag: the directory must hold no previous run (`RUN_ENTRIES`);
    - ``overwrite``: a previous run's files are deleted first (nothing else in the directory is touched);
    - ``resume``: the newest checkpoint, or None when the directory holds no previous run at all (said on
      stdout: "nothing to resume in DIR; starting a new run"), or None when it holds a run stopped before
      its first checkpoint (a preempted job relaunched with ``--resume``): that run's files are moved into
      ``interrupted-<k>/`` first, so nothing is lost, and a new run starts.

    Raises:
        RunDirError: both flags, a previous run without either flag, or ``resume`` of a finished run
            (``summary.json`` or ``final/``) that has no checkpoint.
    """
    run_dir = Path(run_dir)
    if resume and overwrite:
        raise RunDirError("--resume continues the run in the directory and --overwrite deletes it: pass one of them")
    used = run_entries(run_dir)
    if overwrite:
        for name in used:
            path = run_dir / name
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        return None
    if not resume:
        if used:
            raise RunDirError(f"run directory {str(run_dir)!r} already holds a run ({', '.join(used)}); pass --resume "
                              f"to continue it or --overwrite to delete it and start again")
        return None
    ckpt = latest_checkpoint(run_dir / "ckpt")
    if ckpt is None and used and any(name in used for name in ("summary.json", "final")):
        raise RunDirError(f"--resume: run directory {str(run_dir)!r} holds a finished run ({', '.join(used)}) but no "
                          f"checkpoint under ckpt/ to continue from; pass --overwrite instead to delete it and "
                          f"start again")
    if ckpt is None and used:  # stopped before its first checkpoint: nothing to continue, nothing to lose
        aside = _set_aside(run_dir, used)
        print(f"[respo] --resume: {run_dir} holds a run stopped before its first checkpoint; its files "
              f"({', '.join(used)}) moved to {aside}; starting a new run", flush=True)
        return None
    if ckpt is None:
        print(f"[respo] --resume: nothing to resume in {run_dir}; starting a new run", flush=True)
    return ckpt


def _set_aside(run_dir: Path, names: list[str]) -> Path:
    """Move a run's files ``names`` into a new ``interrupted-<k>/`` directory of ``run_dir`` (k = 1, 2, ...)."""
    k = 1
    while (run_dir / f"interrupted-{k}").exists():
        k += 1
    aside = run_dir / f"interrupted-{k}"
    aside.mkdir()
    for name in names:
        os.rename(run_dir / name, aside / name)
    return aside


@contextmanager
def lock_run_dir(run_dir: str | Path) -> Iterator[Path]:
    """Create ``run_dir`` if needed and hold an exclusive advisory lock on it (``flock`` on the
    directory itself, released when the process ends, however it ends). When the block raises and the
    directories this created are still empty (the run failed before writing anything), they are removed.

    Raises:
        RunDirError: another process holds the lock (a run is writing into this directory).
    """
    run_dir = Path(run_dir)
    created = [p for p in (run_dir, *run_dir.parents) if not p.exists()]  # the deepest first
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirError(f"run directory {str(run_dir)!r} is in use by another respo process; wait for it "
                              f"to finish or choose another --out-dir") from None
        yield run_dir
    except BaseException:  # a run that failed before writing anything leaves no directory behind
        for path in created:
            try:
                path.rmdir()  # only while empty
            except OSError:
                break
        raise
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def resume_changes(old: Mapping[str, Any], new: Mapping[str, Any], *, defaults: Mapping[str, Any]) -> dict[str, list]:
    """Settings that differ between the run being resumed (``old``) and now (``new``): ``{field: [old, new]}``.

    Both are JSON-ready dicts of the config fields; a field ``old`` lacks (recorded before it existed)
    counts as its value in ``defaults``.

    Raises:
        RunDirError: naming every changed field outside `RESUMABLE` (they would change the experiment).
    """
    changes = {name: [old.get(name, defaults[name]), value] for name, value in new.items()
               if old.get(name, defaults[name]) != value}
    locked = {name: pair for name, pair in changes.items() if name not in RESUMABLE}
    if locked:
        said = "; ".join(f"{name} {json.dumps(a)} -> {json.dumps(b)}" for name, (a, b) in locked.items())
        raise RunDirError(f"--resume would change the experiment: {said}. Resume with the run's settings "
                          f"(see its config.json) or start a new run in another --out-dir; only "
                          f"{', '.join(RESUMABLE)} may change on resume")
    return changes


def read_record(run_dir: Path) -> dict | None:
    """The run's ``config.json`` (None when there is none).

    Raises:
        RunDirError: it is not readable as a JSON object (truncated, say): the run's record of its settings,
            starting policy and resumes cannot be continued.
    """
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        record = err
    if not isinstance(record, dict):
        why = f"({record})" if isinstance(record, Exception) else "(not a JSON object)"
        raise RunDirError(f"--resume: {str(path)!r} is corrupt {why}; restore it, or pass --overwrite to delete "
                          f"the run and start again")
    return record


def check_resume(run_dir: Path, settings: Mapping[str, Any], defaults: Mapping[str, Any], manifest: Mapping[str, Any],
                 updates: int) -> dict[str, list]:
    """The settings changed since the checkpoint was written, ``{field: [old, new]}`` (all in `RESUMABLE`).

    ``settings`` are this run's (JSON-ready), ``defaults`` every field's default, ``manifest`` the
    checkpoint's; its manifest records the settings that produced it (older checkpoints fall back
    on config.json).

    Raises:
        RunDirError: a setting that changes the experiment differs, ``metrics.jsonl`` does not log exactly
            the checkpoint's updates 1 .. U (records past U, which the resumed run drops, aside), or the run
            is already past ``updates``.
    """
    record = read_record(run_dir)  # a corrupt one is refused even when the manifest has the settings
    old = manifest.get("config", record)
    changes = {}
    if old is None:
        print(f"[respo] --resume: {run_dir} records no settings for its checkpoint; they cannot be checked",
              flush=True)
    else:
        changes = resume_changes(old, settings, defaults=defaults)
    path = run_dir / "metrics.jsonl"
    logged = [r.get("update") for r in (read_jsonl(path) if path.is_file() else [])
              if "event" not in r and not (isinstance(r.get("update"), int) and r["update"] > manifest["update"])]
    problem = log_problem(logged, manifest["update"])
    if problem:
        raise RunDirError(f"--resume: {path} {problem}, but the checkpoint is at update {manifest['update']}: the log "
                          f"and the checkpoint disagree; restore the log, or start again with --overwrite")
    if manifest["update"] > updates:
        raise RunDirError(f"--resume: the run in {str(run_dir)!r} is at update {manifest['update']}, past "
                          f"updates = {updates}; a run cannot be shortened (pass --updates "
                          f"{manifest['update']} or more)")
    return changes


def finished(run_dir: Path, update: int, updates: int) -> bool:
    """The run ended: its last checkpoint is at ``updates`` and final/ and summary.json were written."""
    return update == updates and (run_dir / "final").is_dir() and (run_dir / "summary.json").is_file()


def resumed_entries(run_dir: Path, update: int, changes: Mapping[str, list]) -> list[dict]:
    """config.json's ``resumed`` list plus this resume, ``{"update": U, field: [old, new], ...}``; entries
    of parts that left no checkpoint after ``update`` (killed before one) are dropped: this entry
    compares with the checkpoint's own settings."""
    earlier = (read_record(run_dir) or {}).get("resumed", [])
    return [e for e in earlier if e.get("update", 0) < update] + [{"update": update, **changes}]


def _remove(path: Path) -> None:
    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)


def reopen(run_dir: Path) -> None:
    """A resumed run goes on past its end: what described that end (`ENDING_ENTRIES`) no longer does, but
    it is not removed before its replacement exists: it moves into `PREVIOUS_END`, which `close_previous_end`
    removes once the new ``final/`` and ``summary.json`` are written. A run interrupted in between keeps the
    last complete end there. Ending entries without both ``final/`` and ``summary.json`` (a new end cut short)
    are no end: where `PREVIOUS_END` already holds one, they are removed."""
    present = [n for n in ENDING_ENTRIES if (run_dir / n).exists() or (run_dir / n).is_symlink()]
    if not present:
        return
    aside = run_dir / PREVIOUS_END
    complete = (run_dir / "final").is_dir() and (run_dir / "summary.json").is_file()
    if aside.exists() and not complete:
        for name in present:
            _remove(run_dir / name)
        return
    if aside.exists():
        _remove(aside)
    aside.mkdir()
    for name in present:
        os.replace(run_dir / name, aside / name)


def close_previous_end(run_dir: Path) -> None:
    """The run's new end is written: the end it went on past (`reopen`) is no longer needed."""
    aside = run_dir / PREVIOUS_END
    if aside.exists():
        _remove(aside)


def write_config(run_dir: Path, record: Mapping[str, Any]) -> None:
    """``config.json``: every setting of the run, the policy it started from and its resumes."""
    write_text_atomic(run_dir / "config.json", json.dumps(record, indent=1))


def _spans(updates: list[int]) -> str:
    """Sorted distinct update numbers as ranges: [1, 2, 3, 7, 9, 10] -> "1–3, 7, 9–10"."""
    out, nums = [], sorted(set(updates))
    for u in nums:
        if out and u == out[-1][1] + 1:
            out[-1][1] = u
        else:
            out.append([u, u])
    return ", ".join(f"{a}–{b}" if b > a else f"{a}" for a, b in out)


def log_problem(updates: list, last: int | None = None) -> str | None:
    """What is wrong with a log whose per-update records carry the update numbers ``updates`` (in file order),
    or None: they must be 1, 2, .., k (no gap, no repeat), and k = ``last`` when it is given. The answer
    reads after the log's name: "logs updates 1–100, 171–172 (102 records)"."""
    k = len(updates)
    if updates == list(range(1, k + 1)) and (last is None or k == last):
        return None
    numbered = [u for u in updates if isinstance(u, int) and not isinstance(u, bool)]
    said = f"updates {_spans(numbered)}" if numbered else "no update"
    extra = [f"{k - len(numbered)} record(s) without an update number"] if len(numbered) < k else []
    extra += [f"{len(numbered) - len(set(numbered))} repeated"] if len(set(numbered)) < len(numbered) else []
    return f"logs {said} ({k} record{'s' * (k != 1)}{''.join(f', {e}' for e in extra)})"
