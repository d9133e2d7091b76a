"""Where a run computes (``device``) and in which precision (``dtype``).

Mixed precision keeps float32 master weights and runs the matrix work of the decoder in
bfloat16 under ``torch.autocast``; the output layer runs in float32 on float32 hidden states, so
logits, log-probs, entropies and the loss are float32:

    h = decoder_bf16(x)          (autocast: matmuls in bf16, norms and softmax in float32)
    logits = W_out · float32(h)  (float32, autocast off)
    logp = log_softmax(logits)   (float32)

``dtype = "float32"`` enters no context at all: the numbers are those of a plain forward.

Whether bfloat16 pays depends on the hardware: CUDA devices with bf16 and CPUs with a native bfloat16
extension (x86: AVX-512 BF16 or AMX; Arm: BF16) run it faster than float32, while other CPUs (AVX2 only,
or AVX-512 without BF16) emulate it, several times slower than float32. `native_bf16` tells which, from
the CPU's flags (`cpu_flags`; where they cannot be read it does not guess); ``"auto"`` settings resolve
through it (`resolve_dtype`: float32 only where bfloat16 is known to be emulated), and
`emulated_bf16_note` is the one-line notice for a bfloat16 asked for explicitly where it is emulated.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

__all__ = ["DTYPES", "DEVICES", "NATIVE_BF16_FLAGS", "BF16_MIN_SPEEDUP", "resolve_device", "device_problem",
           "mixed_precision", "cpuinfo_field", "cpu_flags", "bf16_speedup", "native_bf16", "resolve_dtype", "emulated_bf16_note"]

#: Compute dtypes a run may ask for (parameters and optimizer state stay float32).
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
#: Device settings: a device type, or "auto" (CUDA when available, else the CPU).
DEVICES = ("cpu", "cuda", "auto")
#: CPU flags of a native bfloat16 extension: x86 AVX-512 BF16 and AMX, Arm's BF16 (``Features``).
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
#: The vLLM engine's ``auto`` takes bfloat16 where a matmul runs at least this much faster in it (`bf16_speedup`).
BF16_MIN_SPEEDUP = 1.3


def resolve_device(name: str) -> torch.device:
    """The torch device of a ``device`` setting ("cpu", "cuda", "cuda:K" or "auto")."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def device_problem(name: str) -> str | None:
    """What is wrong with a ``device`` setting on this machine (None: it can run)."""
    base = name.split(":", 1)[0]
    if base not in DEVICES or (base != "cuda" and ":" in name):
        return f"device {name!r} is unknown; choose cpu, cuda, cuda:K or auto"
    if base == "cuda":
        if not torch.cuda.is_available():
            return f"device {name!r} asks for CUDA but torch sees no CUDA device here (use cpu or auto)"
        index = name.split(":", 1)[1] if ":" in name else "0"
        if not index.isdigit() or int(index) >= torch.cuda.device_count():
            return f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
    return None


@contextmanager
def mixed_precision(model: torch.nn.Module, dtype: str) -> Iterator[None]:
    """Run ``model``'s forwards inside the context in ``dtype`` ("float32": nothing changes).

    "bfloat16": autocast to bfloat16 on the model's device, except the output layer, which gets
    float32 inputs with autocast off (float32 logits). Backward may run outside the context.
    """
    if dtype == "float32":
        yield
        return
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is unknown; choose one of {', '.join(DTYPES)}")
    device_type = next(model.parameters()).device.type
    head = model.get_output_embeddings()
    inner: list[torch.autocast] = []

    def float_head_inputs(module, args):
        off = torch.autocast(device_type, enabled=False)
        off.__enter__()
        inner.append(off)
        return tuple(a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args)

    def leave(module, args, out):
        inner.pop().__exit__(None, None, None)

    handles = [head.register_forward_pre_hook(float_head_inputs), head.register_forward_hook(leave)]
    try:
        with torch.autocast(device_type, dtype=DTYPES[dtype]):
            yield
    finally:
        for h in handles:
            h.remove()


def cpuinfo_field(names: tuple[str, ...], cpuinfo: str | Path = "/proc/cpuinfo") -> str | None:
    """The value of the first line of ``cpuinfo`` (Linux) whose key is one of ``names`` and whose value is not
    empty; None where there is none or the file cannot be read."""
    try:
        for line in Path(cpuinfo).read_text(errors="replace").splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() in names and value.strip():
                return value.strip()
    except OSError:
        pass
    return None


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature flags: the first ``flags`` line (x86) or ``Features`` line (Arm) of ``cpuinfo``;
    empty where it cannot be read (unknown, not "none")."""
    return set((cpuinfo_field(("flags", "Features"), cpuinfo) or "").split())


def bf16_speedup(width: int = 576, rows: int = 256, repeats: int = 5) -> float:
    """How many times faster a (rows, width) @ (width, 4*width) matmul runs in bfloat16 than in float32 on
    this CPU, one thread, best of ``repeats`` each (both warmed up)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        best = {}
        for dtype in (torch.float32, torch.bfloat16):
            a, b = torch.randn(rows, width, dtype=dtype), torch.randn(width, 4 * width, dtype=dtype)
            a @ b  # warm-up
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                a @ b
                times.append(time.perf_counter() - t0)
            best[dtype] = min(times)
        return best[torch.float32] / max(best[torch.bfloat16], 1e-9)
    finally:
        torch.set_num_threads(threads)


def native_bf16(device: torch.device, *, flags: set[str] | None = None) -> bool | None:
    """Whether ``device`` computes bfloat16 natively: a CUDA device that supports it; a CPU with one of
    `NATIVE_BF16_FLAGS` (``flags``: the CPU's, read by `cpu_flags` when None). None where the CPU's flags
    cannot be read (unknown: a timing, as the vLLM engine's ``auto`` takes, would depend on the machine's
    load, and this answer decides cache keys)."""
    device = torch.device(device)
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    flags = cpu_flags() if flags is None else flags
    if not flags:
        return None
    return any(f in flags for f in NATIVE_BF16_FLAGS)


def resolve_dtype(dtype: str, device: torch.device, *, flags: set[str] | None = None) -> str:
    """The compute dtype of a ``dtype`` setting on ``device``: ``"auto"`` is float32 where bfloat16 is known to
    be emulated (`native_bf16` False), else bfloat16 (native, or unknown: then it is the pretrained warm start's
    former default); any other value is returned as given (the caller checks it)."""
    if dtype != "auto":
        return dtype
    return "float32" if native_bf16(device, flags=flags) is False else "bfloat16"


def emulated_bf16_note(dtype: str, device: torch.device, *, flags: set[str] | None = None) -> str | None:
    """A one-line notice when ``dtype`` is bfloat16 on a CPU whose flags show no native bfloat16 (`native_bf16`
    False); None otherwise, and where the flags are unknown."""
    device = torch.device(device)
    if dtype != "bfloat16" or device.type != "cpu" or native_bf16(device, flags=flags) is not False:
        return None
    return (f"bfloat16 on this CPU is emulated (it has none of {', '.join(NATIVE_BF16_FLAGS)}) and runs several "
            f"times slower than float32; float32 avoids it")
