"""CLI: flags generated from the config, clear errors with exit code 2, train -> eval round trip."""

import json

import pytest

from respo.cli import build_parser, main

TINY = ["--warm-start", "false", "--threads", "1", "--prompts", "2", "--group-size", "4", "--max-new-tokens", "8",
        "--updates", "2", "--eval-prompts", "4", "--eval-k", "2", "--progress", "false", "--tensorboard", "false",
        "--task-kwargs", '{"overlong": [8, 7]}']


def test_every_config_field_is_a_flag(capsys):
    from dataclasses import fields

    from respo.train.config import TrainConfig

    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    out = capsys.readouterr().out
    for f in fields(TrainConfig):
        assert f"--{f.name.replace('_', '-')}" in out, f.name


def test_bad_config_exits_2_and_names_the_problem(tmp_path, capsys):
    rc = main(["train", "--reuse", "0", "--micro-batch", "3", "--out-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2
    assert "reuse (N, mini-batches per rollout step) must be >= 1, got 0" in err
    assert "micro_batch 3 does not divide" in err
    assert not (tmp_path / "metrics.jsonl").exists()  # nothing ran


def test_train_toml_plus_override_then_eval(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text('objective = "grpo"\nreuse = 3\n')
    run = tmp_path / "run"
    assert main(["train", "--config", str(cfg), "--reuse", "2", *TINY, "--out-dir", str(run)]) == 0
    saved = json.loads((run / "config.json").read_text())
    assert saved["objective"] == "grpo" and saved["reuse"] == 2  # TOML, then the flag wins
    capsys.readouterr()
    assert main(["eval", str(run), "--prompts", "4", "--k", "2", "--threads", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prompts"] == 4 and out["k"] == 2 and 0.0 <= out["mean@2"] <= out["pass@2"] <= 1.0


def test_eval_uses_the_recorded_task_settings(tmp_path, capsys):
    # A warm-start directory records its task settings; `respo eval` must use them (5-digit addition
    # here), not silently fall back to the task's defaults (3 digits). --task-kwargs overrides them.
    from respo.cli import _eval_source

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "respo_warm_start.json").write_text(
        json.dumps({"config": {"task": "addition", "task_kwargs": {"digits": 5, "scratchpad": True}}, "max_new_tokens": 39})
    )
    parse = build_parser().parse_args
    src, task, kwargs, max_new = _eval_source(parse(["eval", str(ws)]))
    assert (src, task, kwargs, max_new) == (ws, "addition", {"digits": 5, "scratchpad": True}, 39)
    _, _, kwargs, _ = _eval_source(parse(["eval", str(ws), "--task-kwargs", '{"digits": 3}']))
    assert kwargs == {"digits": 3}
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        _eval_source(parse(["eval", str(ws), "--task-kwargs", "digits=3"]))
    assert exit_.value.code == 2 and "must be a JSON object" in capsys.readouterr().err
    # a bare model directory records nothing: defaults are used, and the user is told so
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text("{}")  # what makes it a (Hugging Face) model directory
    assert _eval_source(parse(["eval", str(bare)]))[2] == {}
    assert "records no task settings" in capsys.readouterr().err
