"""Running a host framework's own functions in the environment that has it (.venv-areal, .venv-skyrl).

A host whose pins clash with .venv (AReaL 1.0.4: torch < 2.11, transformers <= 5.3; SkyRL 0.3.0:
transformers <= 5.8) has a virtual environment of its own, made by `make setup`. A cross-check writes
its cases (tensors and settings) to a file, runs a script of tests/integrations/hosts/ with that
environment's interpreter once, and reads the host's results back from another file; respo's side runs
in the test process on the same tensors. Both environments have torch 2.13.0, so the files are
``torch.save``/``torch.load`` (weights only).

The interpreter is ``$RESPO_<HOST>_PYTHON`` or the repository's ``.venv-<host>/bin/python``. Without
one the test fails (it does not skip): CI makes the environment with `make setup` and runs the test.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
HOSTS = REPO / "tests" / "integrations" / "hosts"


class HostEnvError(RuntimeError):
    """The host's environment is missing or its script failed; the message says which and how to fix it."""


def host_python(host: str) -> str:
    """The interpreter of ``host``'s environment: ``$RESPO_<HOST>_PYTHON`` or ``.venv-<host>/bin/python``."""
    var = f"RESPO_{host.upper()}_PYTHON"
    if os.environ.get(var):
        path = os.environ[var]
        if not os.access(path, os.X_OK):
            raise HostEnvError(f"{var}={path} is not an executable Python")
        return path
    path = REPO / f".venv-{host}" / "bin" / "python"
    if not path.exists():
        raise HostEnvError(f"{host}'s environment {path.parent.parent} is missing: run `make setup` (it makes "
                           f".venv-{host}), or set {var} to a Python that has {host}")  # fmt: skip
    return str(path)


def run_host(host: str, script: str, payload: Any, *, timeout: float = 3600.0) -> Any:
    """Run ``tests/integrations/hosts/<script>`` with ``host``'s interpreter on ``payload``; its output.

    The script is called as ``python <script> <in.pt> <out.pt>``: it reads ``payload`` from the first
    file and writes its results to the second. The repository is on its PYTHONPATH (respo's plug-ins
    are imported there from this checkout); one intra-op thread.
    """
    python = host_python(host)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "WANDB_MODE": "disabled", "RAY_AUTH_MODE": "disabled"}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix=f"respo-{host}-") as tmp:
        src, dst = Path(tmp) / "in.pt", Path(tmp) / "out.pt"
        torch.save(payload, src)
        proc = subprocess.run([python, str(HOSTS / script), str(src), str(dst)], env=env, cwd=tmp,
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip
        if proc.returncode != 0 or not dst.exists():
            tail = (proc.stdout + proc.stderr)[-6000:]
            raise HostEnvError(f"{script} in {host}'s environment ({python}) exited with {proc.returncode}:\n{tail}")
        return torch.load(dst, weights_only=True)
