"""Where a run computes (``device``) and in which precision (``dtype``).

Mixed precision keeps float32 master weights and runs the matrix work of the decoder in
bfloat16 under ``torch.autocast``; the output layer runs in float32 on float32 hidden states, so
logits, log-probs, entropies and the loss are float32:

    h = decoder_bf16(x)          (autocast: matmuls in bf16, norms and softmax in float32)
    logits = W_out · float32(h)  (float32, autocast off)
    logp = log_softmax(logits)   (float32)

``dtype = "float32"`` enters no context at all: the numbers are those of a plain forward.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

__all__ = ["DTYPES", "DEVICES", "resolve_device", "device_problem", "mixed_precision"]

#: Compute dtypes a run may ask for (parameters and optimizer state stay float32).
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
#: Device settings: a device type, or "auto" (CUDA when available, else the CPU).
DEVICES = ("cpu", "cuda", "auto")


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
