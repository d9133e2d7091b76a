"""Checkpoints: round trip (weights, optimizer, RNG, buffer), atomic layout, corruption detected."""

import random

import numpy as np
import pytest
import torch

from respo.train.buffer import Batch, PromptStream, RolloutBuffer
from respo.train.checkpoint import (CheckpointError, RunState, latest_checkpoint, load_checkpoint, rng_state,
                                    save_checkpoint, set_rng_state)


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
