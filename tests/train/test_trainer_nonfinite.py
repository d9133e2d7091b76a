"""A step whose loss or gradient is not finite is never applied; a run stops after a stated number of them in a
row, with a checkpoint of its last good state (tiny dense preset, random init, 1 thread)."""

import copy
import dataclasses
import json
import math

import pytest
import torch
from safetensors.torch import load_file

from cli_support import one_error_line, records, train_cli
from respo.train.config import ConfigError, load_config
from respo.train.update import UpdateSettings, make_optimizer, update_step
from trainer_support import rollout as _rollout, setup, small_cfg as _cfg  # noqa: F401 (setup is a fixture)

torch.set_num_threads(1)


def test_a_non_finite_step_changes_nothing(setup):
    # Advantages of 1e38 are finite, but the loss overflows to NaN and the gradient norm to inf: that step
    # must leave the weights, AdamW's moments and the schedule as they were, so good, bad, good ends bitwise
    # where good, good does.
    cfg = _cfg(grad_clip=0.0, warmup=3)
    batch = _rollout(setup, cfg, cfg.prompts)
    bad = dataclasses.replace(batch, adv=batch.adv * 1e38)
    models = []
    for steps in ((batch, bad, batch), (batch, batch)):
        model = copy.deepcopy(setup[0].model)
        opt, sched = make_optimizer(model, cfg)
        for b in steps:
            weights, moments, schedule = (copy.deepcopy(x) for x in (model.state_dict(), opt.state_dict(),
                                                                     sched.state_dict()))
            m, _ = update_step(model, opt, sched, b, UpdateSettings.of(cfg))
            if b is bad:
                assert m["skipped"] == 1
                assert not math.isfinite(float(m["loss"])) or not math.isfinite(float(m["grad_norm"]))
                assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
                assert sched.state_dict() == schedule and opt.state_dict()["state"].keys() == moments["state"].keys()
                for k, s in opt.state_dict()["state"].items():
                    assert all(torch.equal(s[n], moments["state"][k][n]) for n in s)
                assert all(p.grad is None for p in model.parameters())  # nothing carried into the next step
            else:
                assert "skipped" not in m
        assert sched.last_epoch == 2  # two applied steps in both runs
        models.append(model)
    assert all(torch.equal(a, b) for a, b in zip(models[0].state_dict().values(), models[1].state_dict().values()))


def test_max_nonfinite_steps_must_be_positive():
    with pytest.raises(ConfigError, match="max_nonfinite_steps must be >= 1, got 0"):
        load_config(None, {"max_nonfinite_steps": 0})


def test_a_diverging_run_stops_with_one_line_and_a_checkpoint_of_its_last_good_state(tmp_path, capsys):
    # lr 1e6 without clipping: the first updates are applied (finite gradients) and wreck the weights, then the
    # gradients are NaN. Before, a NaN step was applied and the next rollout died in the sampler with no
    # checkpoint. Now each such update is skipped (recorded, policy version unchanged) and the third in a row
    # stops the run.
    run = tmp_path / "run"
    diverge = ("--lr", "1e6", "--grad-clip", "0", "--warmup", "0")
    assert train_cli(run, *diverge, "--updates", "12") == 2
    line = one_error_line(capsys.readouterr().err, "train")
    recs = [r for r in records(run) if "event" not in r]
    first = next(r["update"] for r in recs if r.get("skipped"))
    last = first + 2  # max_nonfinite_steps = 3 (the default)
    assert [r["update"] for r in recs] == list(range(1, last + 1))
    assert [r.get("skipped", 0) for r in recs] == [0] * (first - 1) + [1, 1, 1]
    assert [r["version"] for r in recs] == list(range(1, first)) + [first - 1] * 3  # the policy did not change
    assert line.startswith(f"respo train: error: non-finite gradient at update {last} (objective respo: loss ")
    assert f"the weights after update {first - 1}" in line and f"update-{last:06d}" in line
    assert [p.name for p in (run / "ckpt").iterdir()] == [f"update-{last:06d}"]
    assert not (run / "final").exists() and not (run / "summary.json").exists()  # the run did not finish
    # the checkpoint holds exactly the weights of the last applied update: those of a run stopped there
    good = tmp_path / "good"
    assert train_cli(good, *diverge, "--updates", str(first - 1)) == 0
    saved = load_file(run / "ckpt" / f"update-{last:06d}" / "model.safetensors")
    expected = load_file(good / "ckpt" / f"update-{first - 1:06d}" / "model.safetensors")
    assert saved.keys() == expected.keys() and all(torch.equal(saved[k], expected[k]) for k in saved)
    state = torch.load(run / "ckpt" / f"update-{last:06d}" / "trainer.pt", weights_only=False)
    assert state["scheduler"]["last_epoch"] == first - 1 and state["skipped_in_a_row"] == 3
    # a resume may allow more skipped updates; the count goes on from the checkpoint, so one more stops it
    capsys.readouterr()
    assert train_cli(run, *diverge, "--updates", "12", "--resume", "--max-nonfinite-steps", "4") == 2
    assert f"non-finite gradient at update {last + 1} " in one_error_line(capsys.readouterr().err, "train")
    assert json.loads((run / "config.json").read_text())["resumed"][-1]["max_nonfinite_steps"] == [3, 4]


@pytest.mark.parametrize("lr,what", [(1e30, "a weight is not finite"), (1e15, "its logits are not finite")])
def test_a_finite_step_that_breaks_the_policy_stops_the_run_in_one_line(tmp_path, capsys, lr, what):
    # AdamW's first step moves every weight by about lr. At 1e30 some weight overflows to inf at once; at 1e15 the
    # weights stay finite, but the next rollout's logits do not (the sampler used to die in torch.multinomial
    # with a traceback). Either way: one line naming the broken update, no checkpoint of the broken weights.
    run = tmp_path / "run"
    assert train_cli(run, "--updates", "4", "--lr", str(lr), "--grad-clip", "0", "--reuse", "1",
                     "--checkpoint-every", "1") == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert f"the policy after update 1 is broken ({what}" in line and "lower --lr" in line
    assert not (run / "ckpt").exists() or not list((run / "ckpt").glob("update-*"))  # none --resume would take
    if lr == 1e15:  # written after update 1, before the next rollout found the logits broken: set aside, named
        assert "renamed broken-update-*" in line and (run / "ckpt" / "broken-update-000001").is_dir()
