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


def test_eval_of_a_run_reproduces_its_own_final_evaluation(tmp_path, capsys):
    # `respo eval RUN` with the run's evaluation size re-scores final/ as the run scored itself: the same
    # held-out examples (EVAL_SEED), the same draws (--seed defaults to EVAL_SEED), the same sampler
    # (the run's recorded engine, respo here) and prompt rendering, so every figure is equal.
    run = tmp_path / "run"
    assert main(["train", *TINY, "--out-dir", str(run)]) == 0
    after = json.loads((run / "summary.json").read_text())["eval_after"]
    capsys.readouterr()
    assert main(["eval", str(run), "--prompts", "4", "--k", "2", "--threads", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["engine"] == "respo" and out["prompt_format"] == "auto"
    for name in ("mean@2", "pass@1", "pass@2", "greedy_acc", "response_length"):
        assert out[name] == after[name], name


def test_eval_renders_prompts_through_the_chat_template_as_runs_do(tmp_path, capsys, monkeypatch):
    # A model whose tokenizer has a chat template is trained and evaluated on rendered prompts (prompt_format
    # "auto"); `respo eval` must sample the same rendered prompts, or it scores a different protocol.
    import respo.train.evaluate as evaluate
    from respo.runtime.models import build_policy
    from respo.runtime.tokenizer import TEXT_ALPHABET, build_char_tokenizer

    tok = build_char_tokenizer(TEXT_ALPHABET + "<>|")
    tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
    model_dir = tmp_path / "chat-model"
    build_policy("tiny-dense", tok, num_hidden_layers=1, hidden_size=32, head_dim=8,
                 intermediate_size=64).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    seen = []
    real_sample = evaluate.sample
    monkeypatch.setattr(evaluate, "sample", lambda m, t, prompts, **kw: seen.append(prompts) or real_sample(m, t, prompts, **kw))
    args = ["eval", str(model_dir), "--task", "addition", "--prompts", "2", "--k", "1", "--max-new-tokens", "4",
            "--threads", "1", "--no-greedy"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["prompt_format"] == "auto"
    assert all(p.startswith("<|user|>\n") and p.endswith("<|assistant|>\n") for p in seen[0])
    seen.clear()
    assert main([*args, "--prompt-format", "raw"]) == 0
    assert not any("<|user|>" in p for p in seen[0])


def test_eval_takes_the_runs_sampling_settings_unless_a_flag_names_others(tmp_path):
    from respo.cli import _eval_protocol, _eval_source

    def protocol(argv):  # as `respo eval` resolves it: from the run config that _eval_source read
        args = build_parser().parse_args(argv)
        return _eval_protocol(args, _eval_source(args)[4])

    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"task": "addition", "max_new_tokens": 24, "dtype": "bfloat16",
                                                 "rollout_engine": "vllm", "engine_dtype": "float32",
                                                 "engine_threads": 2, "prompt_format": "raw"}))
    assert protocol(["eval", str(run)]) == {
        "dtype": "bfloat16", "rollout_engine": "vllm", "engine_dtype": "float32", "engine_threads": 2, "prompt_format": "raw"}
    assert protocol(["eval", str(run), "--rollout-engine", "respo", "--prompt-format", "chat", "--dtype", "float32"]) == {
        "dtype": "float32", "rollout_engine": "respo", "engine_dtype": "float32", "engine_threads": 2, "prompt_format": "chat"}
    # a model directory records no run settings: the training defaults
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    assert protocol(["eval", str(model_dir)]) == {
        "dtype": "float32", "rollout_engine": "respo", "engine_dtype": "auto", "engine_threads": 1, "prompt_format": "auto"}


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
    src, task, kwargs, max_new, run_cfg = _eval_source(parse(["eval", str(ws)]))
    assert (src, task, kwargs, max_new, run_cfg) == (ws, "addition", {"digits": 5, "scratchpad": True}, 39, {})
    _, _, kwargs, _, _ = _eval_source(parse(["eval", str(ws), "--task-kwargs", '{"digits": 3}']))
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
