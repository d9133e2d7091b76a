"""Test-wide environment: nothing is written under the home directory, nothing reaches a hub.

The tests are grouped by floor (core/, runtime/, train/, study/, integrations/, cli/); the helper
modules they share (cli_support, trainer_support) stay here, so this directory goes on sys.path."""

import atexit
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

_TMP = tempfile.mkdtemp(prefix="respo-tests-")
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)
os.environ.setdefault("MPLCONFIGDIR", os.path.join(_TMP, "matplotlib"))
os.environ["RAY_AUTH_MODE"] = "disabled"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HOME", os.path.join(_TMP, "hf"))
os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(_TMP, "triton"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_TMP, "inductor"))
# vLLM's CPU engine reserves its KV cache up front (respo's default 2 GiB); the tests' engines hold a few
# hundred short sequences, and 1 GiB leaves room on a machine where other work holds most of the memory.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

# One intra-op thread: the tiny models here gain nothing from two, and on a small machine two
# threads per process made the runtime tests ~15x slower. Subprocesses set their own thread count.
import torch  # noqa: E402

torch.set_num_threads(1)
