"""Checkpoints: round trip (weights, optimizer, RNG, buffer), atomic layout, corruption detected; the run
directory's rules (refusals, overwrite, resume settings, one process at a time)."""

import random

import numpy as np
import pytest
import torch

from respo.train.buffer import Batch, PromptStream, RolloutBuffer, repeated_prompts
from respo.train.checkpoint import (CheckpointError, RunState, checkpoint_manifest, latest_checkpoint, load_checkpoint,
                                    rng_state, save_checkpoint, set_rng_state)
from respo.train.rundir import RESUMABLE, RunDirError, lock_run_dir, prepare_run_dir, resume_changes


class Tied(torch.nn.Module):
    """Embedding and output head share one weight, like the tiny presets (tie_word_embeddings)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(7, 4)
        self.head = torch.nn.Linear(4, 7, bias=False)
        self.head.weight = self.emb.weight


def _batch(rows=4):
    g = torch.Generator().manual_seed(0)
    return Batch(input_ids=torch.randint(0, 7, (rows, 6), generator=g), attention_mask=torch.ones(rows, 6),
                 response_start=2, mask=torch.ones(rows, 4), behaviour_logp=-torch.rand(rows, 4, generator=g),
                 rewards=torch.tensor([1.0, -1.0] * (rows // 2)), version=torch.zeros(rows, dtype=torch.long),
                 adv=torch.randn(rows, generator=g), old_logp=-torch.rand(rows, 4, generator=g))


def _state(model, gen):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.emb.weight.sum().backward()
    opt.step()
    buf = RolloutBuffer(2)
    buf.put(_batch())
    buf.take()
    return opt, buf, {"update": 3, "optimizer": opt.state_dict(), "rng": rng_state(gen), "buffer": buf.state()}


def test_round_trip_restores_weights_optimizer_rng_and_buffer(tmp_path):
    torch.manual_seed(0)
    model, gen = Tied(), torch.Generator().manual_seed(5)
    opt, buf, state = _state(model, gen)
    path = save_checkpoint(tmp_path, 3, model, state)
    assert path.name == "update-000003" and latest_checkpoint(tmp_path) == path
    # Draws after the save, from every RNG...
    after = (torch.rand(3), random.random(), np.random.rand(), torch.rand(2, generator=gen))
    other = Tied()  # different init
    assert not torch.equal(other.emb.weight, model.emb.weight)
    loaded = load_checkpoint(path, other)
    assert torch.equal(other.emb.weight, model.emb.weight)
    assert other.head.weight is other.emb.weight  # tying survives
    gen2 = torch.Generator().manual_seed(99)
    set_rng_state(loaded["rng"], gen2)
    # ...repeat exactly after restoring the states.
    again = (torch.rand(3), random.random(), np.random.rand(), torch.rand(2, generator=gen2))
    assert torch.equal(after[0], again[0]) and after[1] == again[1] and after[2] == again[2]
    assert torch.equal(after[3], again[3])
    opt2 = torch.optim.AdamW(other.parameters(), lr=1e-2)
    opt2.load_state_dict(loaded["optimizer"])
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    buf2 = RolloutBuffer(2)
    buf2.load_state(loaded["buffer"])
    assert buf2.remaining == 1 and torch.equal(buf2.take().input_ids, buf.take().input_ids)


def _run_state(model, seed):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: min(1.0, (u + 1) / 4))  # 4-update warm-up
    return RunState(opt, sched, stream=PromptStream(list(range(10)), 0), buffer=RolloutBuffer(2),
                    generator=torch.Generator().manual_seed(seed))


def test_run_state_round_trips_through_a_checkpoint(tmp_path):
    torch.manual_seed(0)
    model = Tied()
    state = _run_state(model, seed=5)
    model.emb.weight.sum().backward()
    state.optimizer.step()
    state.scheduler.step()  # lr factor min(1, 2/4) = 0.5
    state.stream.next(7)
    state.buffer.put(_batch())
    state.buffer.take()
    state.update, state.version, state.dropped, state.evals = 3, 3, 1, {"before": {"pass@1": 0.25}}
    path = state.save(tmp_path, model, keep=1)
    assert path.name == "update-000003"
    after = (torch.rand(2, generator=state.generator), state.stream.next(5), torch.rand(3))

    other = Tied()
    fresh = _run_state(other, seed=99)
    fresh.load(path, other)
    assert torch.equal(other.emb.weight, model.emb.weight)
    assert (fresh.update, fresh.version, fresh.dropped, fresh.evals) == (3, 3, 1, {"before": {"pass@1": 0.25}})
    assert fresh.optimizer.param_groups[0]["lr"] == 0.5e-2 == state.optimizer.param_groups[0]["lr"]
    assert fresh.buffer.remaining == 1 and torch.equal(fresh.buffer.take().input_ids, _batch().rows(2, 4).input_ids)
    again = (torch.rand(2, generator=fresh.generator), fresh.stream.next(5), torch.rand(3))
    assert torch.equal(after[0], again[0]) and after[1] == again[1] and torch.equal(after[2], again[2])


def test_keeps_newest_and_ignores_partial_temp_dirs(tmp_path):
    model = Tied()
    for u in (1, 2, 3):
        save_checkpoint(tmp_path, u, model, {"update": u}, keep=2)
    assert sorted(p.name for p in tmp_path.glob("update-*")) == ["update-000002", "update-000003"]
    (tmp_path / ".tmp-update-000004-x").mkdir()  # what a kill during a save leaves behind
    assert latest_checkpoint(tmp_path).name == "update-000003"


@pytest.mark.parametrize("damage", ["flip_byte", "truncate", "drop_manifest", "drop_file"])
def test_corrupt_or_partial_checkpoint_is_reported(tmp_path, damage):
    model = Tied()
    path = save_checkpoint(tmp_path, 1, model, {"update": 1})
    target = path / "model.safetensors"
    if damage == "flip_byte":
        data = bytearray(target.read_bytes())
        data[-1] ^= 0xFF  # same size, different content: only the checksum can tell
        target.write_bytes(bytes(data))
        match = "SHA-256"
    elif damage == "truncate":
        target.write_bytes(target.read_bytes()[:-8])
        match = "bytes"
    elif damage == "drop_manifest":
        (path / "manifest.json").unlink()
        match = "partial"
    else:
        (path / "trainer.pt").unlink()
        match = "missing"
    before = Tied().emb.weight.detach().clone()
    fresh = Tied()
    fresh.emb.weight.data.copy_(before)
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(path, fresh)
    assert torch.equal(fresh.emb.weight, before)  # nothing was loaded


# ----------------------------------------------------------------------------------------------
# The run directory
# ----------------------------------------------------------------------------------------------
def test_manifest_records_the_settings_and_run_state_the_wall_time_of_each_part(tmp_path):
    model = Tied()
    state = _run_state(model, seed=0)
    state.wall_s_parts = [2.5]  # an earlier part of the run took 2.5 s up to its last checkpoint
    path = state.save(tmp_path, model, keep=1, config={"lr": 1e-3})
    assert checkpoint_manifest(path)["config"] == {"lr": 1e-3}
    fresh = _run_state(Tied(), seed=0)
    fresh.load(path, Tied())
    assert len(fresh.wall_s_parts) == 2 and fresh.wall_s_parts[0] == 2.5 and fresh.wall_s_parts[1] >= 0
    assert len(fresh.wall_parts()) == 3  # the two before + this one


def test_resume_changes_refuses_every_experiment_setting_and_returns_the_rest():
    defaults = {"lr": 1e-4, "threads": 0, "updates": 64, "progress": True, "objective": "respo"}
    old = {"lr": 1e-3, "threads": 1, "updates": 4, "progress": True}  # "objective" recorded before it existed
    new = {"lr": 1e-3, "threads": 1, "updates": 6, "progress": False, "objective": "respo"}
    assert resume_changes(old, new, defaults=defaults) == {"updates": [4, 6], "progress": [True, False]}
    with pytest.raises(RunDirError) as err:
        resume_changes(old, {**new, "lr": 1e-2, "threads": 2, "objective": "grpo"}, defaults=defaults)
    msg = str(err.value)
    assert "lr 0.001 -> 0.01" in msg and "threads 1 -> 2" in msg and 'objective "respo" -> "grpo"' in msg
    assert "updates 4 -> 6" not in msg and "progress" not in msg.split("only")[0]  # free changes are not refused
    assert set(RESUMABLE) >= {"updates", "checkpoint_every", "progress"} and "threads" not in RESUMABLE


def test_prepare_run_dir_refuses_overwrites_and_leaves_foreign_files_alone(tmp_path):
    run = tmp_path / "run"
    assert prepare_run_dir(run, resume=False, overwrite=False) is None  # absent: fresh
    run.mkdir()
    (run / "train.log").write_text("a sweep's log\n")  # not a run file
    assert prepare_run_dir(run, resume=True, overwrite=False) is None  # no previous run: resume starts fresh
    assert prepare_run_dir(run, resume=False, overwrite=False) is None
    (run / "metrics.jsonl").write_text("{}\n")
    save_checkpoint(run / "ckpt", 2, Tied(), {"update": 2})
    with pytest.raises(RunDirError, match="--resume.*--overwrite"):
        prepare_run_dir(run, resume=False, overwrite=False)
    with pytest.raises(RunDirError, match="pass one of them"):
        prepare_run_dir(run, resume=True, overwrite=True)
    assert prepare_run_dir(run, resume=True, overwrite=False).name == "update-000002"
    assert prepare_run_dir(run, resume=False, overwrite=True) is None
    assert sorted(p.name for p in run.iterdir()) == ["train.log"]  # only the run's own files were deleted
    (run / "metrics.jsonl").write_text("{}\n")  # a run killed before its first checkpoint: set aside, a new run
    assert prepare_run_dir(run, resume=True, overwrite=False) is None
    assert (run / "interrupted-1" / "metrics.jsonl").read_text() == "{}\n"
    assert sorted(p.name for p in run.iterdir()) == ["interrupted-1", "train.log"]
    (run / "summary.json").write_text("{}\n")  # a finished run whose checkpoints are gone: refused
    with pytest.raises(RunDirError, match="finished run .* no checkpoint"):
        prepare_run_dir(run, resume=True, overwrite=False)


def test_one_process_at_a_time_per_run_directory(tmp_path):
    with lock_run_dir(tmp_path / "run"):
        with pytest.raises(RunDirError, match="in use"):
            with lock_run_dir(tmp_path / "run"):
                pass
    with lock_run_dir(tmp_path / "run"):  # released on exit
        pass


def test_repeated_prompts_counts_draws_beyond_the_distinct_prompts():
    # 3 prompts drawn (G = 2 rows each): pool indices 0, 1, 0 -> 2 distinct, 1 repeat.
    b = _batch(rows=6)
    b.example_index = torch.tensor([0, 0, 1, 1, 0, 0])
    assert repeated_prompts(b, group_size=2) == 1
    b.example_index = torch.tensor([0, 0, 1, 1, 2, 2])
    assert repeated_prompts(b, group_size=2) == 0
    b.example_index = None  # a batch that does not record its prompts
    assert repeated_prompts(b, group_size=2) == 0


class _RunsACommand:
    """A pickle that, when unpickled, creates ``marker`` (what a hostile trainer.pt would do with a shell)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))  # unpickling calls open(marker, "w"): the file appears


def test_a_planted_pickle_in_trainer_pt_is_refused_and_runs_nothing(tmp_path):
    # a real run's checkpoint; trainer.pt replaced by a pickle that runs code and then holds the real state,
    # with the manifest's checksum updated to match (whoever writes the file can write the manifest): resuming
    # refuses it in one line and the code never runs
    import hashlib
    import json

    from respo.train.trainer import train
    from trainer_support import small_cfg

    cfg = small_cfg(updates=2, checkpoint_every=1, out_dir=str(tmp_path / "run"), threads=1)
    run = train(cfg)
    ckpt = latest_checkpoint(run / "ckpt")
    state = torch.load(ckpt / "trainer.pt", weights_only=True)  # the real state is plain: weights-only reads it
    marker = tmp_path / "ran"
    torch.save({**state, "payload": _RunsACommand(marker)}, ckpt / "trainer.pt")
    manifest = json.loads((ckpt / "manifest.json").read_text())
    data = (ckpt / "trainer.pt").read_bytes()
    manifest["files"]["trainer.pt"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="objects other than tensors and plain values") as err:
        train(small_cfg(updates=3, checkpoint_every=1, out_dir=str(run), threads=1), resume=True)
    assert "\n" not in str(err.value) and "(it calls io.open)" in str(err.value)
    assert not marker.exists()


def test_checkpoints_of_the_older_format_still_load(tmp_path):
    # before the RNG state was plain values, trainer.pt pickled numpy's RNG key as an array: still readable
    from respo.train.checkpoint import load_trainer_state

    np.random.seed(5)
    torch.save({"update": 1, "rng": {"numpy": np.random.get_state()}}, tmp_path / "trainer.pt")
    state = load_trainer_state(tmp_path / "trainer.pt")
    expected = np.random.rand()
    np.random.set_state(state["rng"]["numpy"])
    assert np.random.rand() == expected


def test_a_full_disk_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    import errno

    from respo.train import checkpoint as ck

    model = Tied()
    first = save_checkpoint(tmp_path / "ckpt", 1, model, {"update": 1})

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ck, "save_model", full)
    with pytest.raises(CheckpointError, match="no space left") as err:
        save_checkpoint(tmp_path / "ckpt", 2, model, {"update": 2})
    msg = str(err.value)
    assert "\n" not in msg and "MiB free there" in msg and "update-000001" in msg and "intact" in msg
    assert latest_checkpoint(tmp_path / "ckpt") == first and not list((tmp_path / "ckpt").glob(".tmp-*"))
    assert load_checkpoint(first, Tied())["update"] == 1
