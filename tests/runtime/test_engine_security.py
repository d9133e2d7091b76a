"""The vllm engine's weights channel and its leftovers, against another local user and a killed trainer.

The weights travel through a file: it lives in a directory only the trainer's user can enter, is created
exclusively without following a link, mode 0600, and the engine installs only what the trainer wrote (its
SHA-256, sent over the socket) and only finite weights. These tests need no vLLM: the server's checks and
its loop import only the standard library and torch.
"""

import os
import stat
import subprocess
import sys
from multiprocessing.connection import Listener
from pathlib import Path

import pytest
import torch

from respo.runtime.engines import vllm as engine_mod
from respo.runtime.engines.vllm import PID_FILE, SERVER, _digest, _private_dir, _weights_file, remove_leftovers


def _server_module():
    """The server script as a module, loaded from its file: putting its folder on sys.path would make that
    folder's vllm.py (respo's engine) look like the vllm package to every later test."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("respo_vllm_server_under_test", SERVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


checked_weights = _server_module().checked_weights


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_the_weights_file_is_private_and_new(tmp_path):
    run = _private_dir(tmp_path)
    path = _weights_file(run, 64)
    assert path.stat().st_size == 64 and _mode(path) == 0o600
    assert _mode(path.parent) == 0o700 and path.parent.name.startswith("respo-vllm-")
    assert path.parent != run or not Path("/dev/shm").is_dir()  # in /dev/shm, a directory of its own
    other = _weights_file(run, 64)
    assert other.parent != path.parent  # every engine gets a new, unpredictable directory


def test_a_planted_link_is_never_followed(tmp_path, monkeypatch):
    # no room in /dev/shm: the file goes into the engine's own directory; a link planted there (by anyone who
    # could) is refused by the exclusive, no-follow creation, and the file it points to is left as it was
    victim = tmp_path / "victim.txt"
    victim.write_text("the trainer user's file")

    class _Full:
        free = 0

    monkeypatch.setattr(engine_mod.shutil, "disk_usage", lambda p: _Full())
    run = _private_dir(tmp_path)
    (run / "weights.f32").symlink_to(victim)
    with pytest.raises(FileExistsError):
        _weights_file(run, 2 * 1024 * 1024)
    assert victim.read_text() == "the trainer user's file"


def _flat_file(tmp_path, values) -> tuple[Path, torch.Tensor]:
    d = _private_dir(tmp_path)
    path = d / "weights.f32"
    os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
    flat = torch.from_file(str(path), shared=True, size=len(values), dtype=torch.float32)
    flat.copy_(torch.tensor(values))
    return path, flat


def test_the_engine_installs_only_what_the_trainer_wrote(tmp_path):
    path, flat = _flat_file(tmp_path, [0.5, -1.0, 2.0, 0.25])
    digest = _digest(flat)
    assert torch.equal(checked_weights(str(path), 4, digest), flat)
    # the file changed after the trainer hashed it (another writer): refused
    flat[1] = float("nan")
    with pytest.raises(ValueError, match="not what the trainer wrote"):
        checked_weights(str(path), 4, digest)
    # NaN weights with a matching checksum (the trainer's own NaN): refused as non-finite
    with pytest.raises(ValueError, match="not all finite"):
        checked_weights(str(path), 4, _digest(flat))
    # a file others may write, or of another size than the layout: refused
    flat[1] = 1.0
    os.chmod(path, 0o666)
    with pytest.raises(ValueError, match="not private"):
        checked_weights(str(path), 4, _digest(flat))
    os.chmod(path, 0o600)
    with pytest.raises(ValueError, match="has 16 bytes, the layout needs 20"):
        checked_weights(str(path), 5, _digest(flat))
    link = path.parent / "link.f32"
    link.symlink_to(path)
    with pytest.raises(ValueError, match="not a regular file"):
        checked_weights(str(link), 4, _digest(flat))


def test_leftovers_of_dead_trainers_are_removed_and_live_ones_kept(tmp_path):
    dead = _private_dir(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    (dead / PID_FILE).write_text(str(proc.pid))  # a trainer that is gone
    live = _private_dir(tmp_path)  # this process: alive
    unknown = tmp_path / "respo-vllm-nopid"
    unknown.mkdir()
    assert remove_leftovers((tmp_path,)) == [dead]
    assert not dead.exists() and live.is_dir() and unknown.is_dir()


def test_the_engine_cleans_up_when_the_trainer_dies_mid_reply(tmp_path):
    # the server is asked for something that takes a while (checking a 64 MB weights file), and the trainer's
    # end of the socket is gone before the reply: the server removes the engine directory and the weights'
    # directory instead of dying on the broken pipe with them left behind
    engine_dir, weights_dir = _private_dir(tmp_path), _private_dir(tmp_path)
    n = 16 * 1024 * 1024
    path = weights_dir / "weights.f32"
    with open(path, "wb") as fh:
        fh.truncate(4 * n)
    os.chmod(path, 0o600)
    address, key = str(tmp_path / "s.sock"), os.urandom(16)
    env = {**os.environ, "RESPO_ENGINE_ADDRESS": address, "RESPO_ENGINE_KEY": key.hex(),
           "RESPO_ENGINE_DIR": str(engine_dir), "PYTHONPATH": ""}
    with Listener(address, family="AF_UNIX", authkey=key) as listener:
        proc = subprocess.Popen([sys.executable, "-P", str(SERVER)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        conn = listener.accept()
        conn.send(("weights", {"path": str(path), "layout": [("w", (n,), 0, n)], "sha256": "0" * 64}))
        conn.close()
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out.decode()[-500:]
    assert not engine_dir.exists() and not weights_dir.exists()
    assert b"Traceback" not in out


def test_an_engine_python_without_torch_is_told_how_to_fix_it(monkeypatch):
    # RESPO_VLLM_PYTHON naming an interpreter that lacks torch: the engine process starts (its script imports
    # only the standard library at first) and its init fails; the error names the interpreter and the fix
    import shutil as sh

    from respo.runtime.engines.vllm import PYTHON_ENV, EngineError, VLLMEngine
    from respo.runtime.models import build_policy
    from respo.runtime.tokenizer import build_char_tokenizer

    bare = None
    for candidate in ("/usr/bin/python3", sh.which("python3"), sh.which("python")):
        if candidate and subprocess.run([candidate, "-c", "import torch"], capture_output=True).returncode != 0:
            bare = candidate
            break
    if bare is None:
        pytest.skip("every Python on this machine has torch")
    tok = build_char_tokenizer()
    model = build_policy("tiny-dense", tok, seed=0)
    monkeypatch.setenv(PYTHON_ENV, bare)
    with pytest.raises(EngineError) as err:
        VLLMEngine(model, tok, dtype="float32", verbose=False)
    msg = str(err.value)
    assert "\n" not in msg and "No module named" in msg and bare in msg and "make setup" in msg
