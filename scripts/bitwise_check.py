"""Fingerprint 13 short training runs, so a refactor can be checked to change no number.

    .venv/bin/python scripts/bitwise_check.py --work /tmp/bitwise-new --out new.json
    .venv/bin/python scripts/bitwise_check.py --compare old.json new.json

The first form runs, each through the ``respo train`` command of the checkout this script lives in
(``python -m respo`` with ``PYTHONPATH`` set to that checkout), on one torch thread and the CPU:

- one sync run per objective (respo, vespo, grpo, gspo, cispo, sapo, gmpo, topr, reinforce, reshaped),
  reuse N = 2, micro-batches of 4 sequences, a held-out evaluation before and after;
- a tiny-moe run with routing replay;
- an async run whose worker never receives new weights (``sync_every`` > ``updates``) and never drops
  a batch, so the batches it trains on do not depend on thread timing;
- a run killed with SIGKILL once its second checkpoint exists, then continued with ``--resume``.

Every run starts from the randomly initialised tiny preset (no warm start) on addition with the
overlong penalty (so a random policy gets non-zero group advantages), a few updates each. For each
run it records the SHA-256 of its ``metrics.jsonl`` records (every record, with the wall-clock fields
``time/*`` removed, and those starting with a ``--drop-metrics`` prefix, written back as sorted-key JSON lines) and of its final weights (every tensor of
``final/model.safetensors``, by name, as raw bytes with dtype and shape), and writes them as JSON to
``--out``. Run it at two commits and ``--compare`` the two files: the exit status is 0 only when
every run's two hashes are identical.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OBJECTIVES = ("respo", "vespo", "grpo", "gspo", "cispo", "sapo", "gmpo", "topr", "reinforce", "reshaped")
BASE = {
    "task": "addition", "task-kwargs": '{"overlong": [12, 11]}', "warm-start": "false", "prompts": 2,
    "group-size": 4, "max-new-tokens": 12, "lr": 1e-3, "warmup": 0, "threads": 1, "progress": "false",
    "tensorboard": "false", "eval-prompts": 4, "eval-k": 2, "seed": 0,
}
RUNS: dict[str, dict] = {
    **{name: {"objective": name, "reuse": 2, "updates": 4, "micro-batch": 4} for name in OBJECTIVES},
    "moe-replay": {"model": "tiny-moe", "routing-replay": "true", "reuse": 2, "updates": 4},
    "async": {"mode": "async", "updates": 4, "sync-every": 5, "max-staleness": 8, "queue-size": 1},
    "kill-resume": {"reuse": 2, "updates": 6, "checkpoint-every": 2, "eval-prompts": 0},
}
KILL_AFTER = "update-000002"  # the kill-resume run is killed once this checkpoint is complete
WAIT_S = 600


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def _command(out_dir: Path, settings: dict, *extra: str) -> list[str]:
    flags = [f"--{k}={v}" for k, v in {**BASE, **settings}.items()]
    return [sys.executable, "-m", "respo", "train", f"--out-dir={out_dir}", *flags, *extra]


def _run(name: str, out_dir: Path) -> None:
    settings = RUNS[name]
    if name != "kill-resume":
        subprocess.run(_command(out_dir, settings), env=_env(), check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
        return
    proc = subprocess.Popen(_command(out_dir, settings), env=_env(), stdout=subprocess.DEVNULL, cwd=ROOT)
    manifest = out_dir / "ckpt" / KILL_AFTER / "manifest.json"
    deadline = time.monotonic() + WAIT_S
    while not manifest.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if proc.poll() is not None:
        raise SystemExit(f"{name}: the run ended before it could be killed (exit {proc.returncode})")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    subprocess.run(_command(out_dir, settings, "--resume"), env=_env(), check=True, stdout=subprocess.DEVNULL,
                   cwd=ROOT)


def _metrics_hash(path: Path, drop: tuple[str, ...] = ()) -> tuple[str, int]:
    skip = ("time/",) + tuple(drop)
    lines = []
    for line in path.read_text().splitlines():
        rec = {k: v for k, v in json.loads(line).items() if not k.startswith(skip)}
        lines.append(json.dumps(rec, sort_keys=True))
    return hashlib.sha256("\n".join(lines).encode()).hexdigest(), len(lines)


def _weights_hash(path: Path) -> str:
    import torch
    from safetensors.torch import load_file

    h = hashlib.sha256()
    for key, tensor in sorted(load_file(str(path)).items()):
        h.update(f"{key}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        h.update(tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def fingerprint(work: Path, names: list[str], drop: tuple[str, ...] = ()) -> dict:
    out = {}
    for name in names:
        run_dir = work / name
        shutil.rmtree(run_dir, ignore_errors=True)
        t0 = time.perf_counter()
        _run(name, run_dir)
        metrics, n = _metrics_hash(run_dir / "metrics.jsonl", drop)
        out[name] = {"metrics_sha256": metrics, "records": n,
                     "weights_sha256": _weights_hash(run_dir / "final" / "model.safetensors")}
        print(f"{name}: {n} records, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return out


def compare(a_path: Path, b_path: Path) -> int:
    a, b = json.loads(a_path.read_text()), json.loads(b_path.read_text())
    bad = 0
    for name in sorted(set(a) | set(b)):
        same = a.get(name) == b.get(name)
        bad += not same
        print(f"{name:12s} {'identical' if same else 'DIFFERENT'}")
    print(f"{len(set(a) | set(b)) - bad} of {len(set(a) | set(b))} runs identical")
    return int(bad > 0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, help="directory for the run directories (each is replaced)")
    p.add_argument("--out", type=Path, help="JSON file of the hashes")
    p.add_argument("--runs", nargs="*", default=list(RUNS), choices=list(RUNS), help="a subset of the runs")
    p.add_argument("--drop-metrics", nargs="*", default=[], metavar="PREFIX",
                   help="also leave out metric keys starting with PREFIX (metrics added since the old commit, e.g. "
                        "chi2_ corr/), so the old numbers are compared with the same numbers of the new commit")
    p.add_argument("--compare", nargs=2, type=Path, metavar=("OLD", "NEW"), help="compare two JSON files")
    args = p.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.work is None or args.out is None:
        p.error("--work and --out are required unless --compare is given")
    result = fingerprint(args.work, args.runs, tuple(args.drop_metrics))
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
