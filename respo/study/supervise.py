"""Process supervision of a sweep: one `respo train` process per run, ``jobs`` at a time, that die with
the sweep, and a lock per run directory that says which sweep is running it.

Each run is a separate ``python -m respo train --config BASE --resume|--overwrite --field value ...``
process (`train_command`), started behind `CHILD_GUARD` so that on Linux it dies with the sweep however
the sweep dies (SIGKILL included). While a run is going its directory holds ``sweep.lock`` (`RunLock`): an
``flock`` held by the sweep and inherited by the run's process, so it is held exactly while either
lives; no process id is trusted, and a file left by a killed sweep locks nothing (`clear_stale_lock`).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from respo.study.grid import RunSpec, finished
from respo.train.checkpoint import latest_checkpoint

__all__ = ["train_command", "CHILD_GUARD", "LOCK", "RunLock", "clear_stale_lock", "run_jobs"]


def _flag_value(v: Any) -> str:
    if isinstance(v, (dict, list, tuple)):
        return json.dumps(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def train_command(spec: RunSpec, run_dir: Path, base_config: Path, threads: int, device: str = "cpu") -> list[str]:
    """The exact `respo train` command of one run: ``--resume`` from its newest checkpoint, or
    ``--overwrite`` when it has none (a fresh run, or one killed before its first checkpoint, whose
    partial records cannot be continued). ``device`` is passed through as ``--device``; it is not part
    of the run's name, so a sweep on a GPU writes the run directories a CPU sweep writes."""
    resume = latest_checkpoint(run_dir / "ckpt") is not None
    cmd = [sys.executable, "-m", "respo", "train", "--config", str(base_config),
           "--resume" if resume else "--overwrite", "--out-dir", str(run_dir), "--threads", str(threads)]
    if device != "cpu":
        cmd += ["--device", device]
    for k, v in spec.overrides.items():
        cmd += [f"--{k.replace('_', '-')}", _flag_value(v)]
    return cmd


#: Run in each run's process before `respo train` (``python -c CHILD_GUARD SWEEP_PID CMD...``): on Linux
#: the kernel sends it SIGKILL when the sweep's thread that started it dies, whatever kills the sweep
#: (``prctl(PR_SET_PDEATHSIG)``, kept across the exec); a sweep already gone by then is caught by the
#: parent check. Elsewhere the guard only execs the command.
CHILD_GUARD = """
import ctypes, os, signal, sys
if sys.platform.startswith("linux"):
    if ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
        sys.exit("respo sweep: prctl(PR_SET_PDEATHSIG) failed: errno %d" % ctypes.get_errno())
    if os.getppid() != int(sys.argv[1]):
        os._exit(1)
os.execv(sys.argv[2], sys.argv[2:])
"""
LOCK = "sweep.lock"


def _guarded(cmd: list[str]) -> list[str]:
    """``cmd`` behind `CHILD_GUARD`: the process dies with this sweep."""
    return [sys.executable, "-c", CHILD_GUARD, str(os.getpid()), *cmd]


class RunLock:
    """An exclusive ``flock`` on ``RUN/sweep.lock``, held by the sweep and inherited by the run's
    process, so it is held exactly while either is alive; the file names the run's process id for the
    message only. No process id is ever trusted (one may be reused), and a file left by a killed sweep
    locks nothing."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / LOCK
        self.fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock without waiting; False when another sweep's run holds it."""
        import fcntl

        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            try:  # the file we locked may have been removed by its holder meanwhile: lock the new one
                if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                    self.fd = fd
                    return True
            except FileNotFoundError:
                pass
            os.close(fd)

    def holder(self) -> str:
        try:
            return self.path.read_text().strip() or "?"
        except OSError:
            return "?"

    def write(self, pid: int) -> None:
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{pid}\n".encode(), 0)

    def release(self) -> None:
        """Remove the file, then let go (in this order: a sweep that locks the file in between sees it gone)."""
        if self.fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self.fd)
            self.fd = None


def clear_stale_lock(run_dir: Path) -> None:
    """Remove a ``sweep.lock`` nobody holds (left by a killed sweep)."""
    if (run_dir / LOCK).exists():
        lock = RunLock(run_dir)
        if lock.acquire():
            lock.release()


def run_jobs(todo: list[RunSpec], runs_dir: Path, base_config: Path, *, jobs: int, threads: int,
             device: str) -> tuple[dict[str, str], list[dict]]:
    """Run each spec's `train_command` in ``runs_dir/<name>``, ``jobs`` processes at a time, each behind
    `CHILD_GUARD` and holding its run's `RunLock`; its stdout and stderr go to ``train.log``.

    Returns ``({name: "ran" | "skipped" | "running" | "failed"}, [{"run", "rc", "last_line"} of each failed
    run])``: ``skipped`` is a run another sweep finished meanwhile, ``running`` one another sweep holds."""
    outcome: dict[str, str] = {}
    failed: list[dict] = []
    t_start = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "TOKENIZERS_PARALLELISM": "false"}

    def one(i_spec):
        i, s = i_spec
        run_dir = runs_dir / s.name
        run_dir.mkdir(parents=True, exist_ok=True)
        lock = RunLock(run_dir)
        if not lock.acquire():
            outcome[s.name] = "running"
            print(f"[sweep] not run {s.name}: another sweep is running it (process {lock.holder()})", flush=True)
            return
        try:
            if finished(run_dir):  # finished by another sweep since this one looked
                outcome[s.name] = "skipped"
                return
            cmd = train_command(s, run_dir, base_config, threads, device)
            t0 = time.perf_counter()
            with open(run_dir / "train.log", "a") as log:
                log.write("$ " + shlex.join(cmd) + "\n")
                log.flush()
                # started and waited for by this thread: the parent-death signal follows this thread
                proc = subprocess.Popen(_guarded(cmd), stdout=log, stderr=subprocess.STDOUT, env=env,
                                        pass_fds=(lock.fd,))
                lock.write(proc.pid)
                rc = proc.wait()
        finally:
            lock.release()
        dt = time.perf_counter() - t0
        if rc != 0 or not finished(run_dir):
            tail = (run_dir / "train.log").read_text().strip().splitlines()[-1:] or [""]
            outcome[s.name] = "failed"
            failed.append({"run": s.name, "rc": rc, "last_line": tail[0]})
            print(f"[sweep] FAILED {s.name} rc={rc}: {tail[0]}", flush=True)
        else:
            outcome[s.name] = "ran"
            print(f"[sweep] done {i + 1}/{len(todo)} {s.name} in {dt:.0f} s "
                  f"(elapsed {time.perf_counter() - t_start:.0f} s)", flush=True)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, enumerate(todo)))
    return outcome, failed
