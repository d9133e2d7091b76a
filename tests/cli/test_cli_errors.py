"""Errors a person can read, and a CLI that does what the README says (CLI level, temporary dirs).

Every test here drives `respo.cli.main` the way a user drives `respo ...`: a mistake gets one line
that names it (exit 2) and leaves nothing behind.
"""

import json
from pathlib import Path

import pytest

from cli_support import one_error_line, train_cli
from respo.cli import main

@pytest.mark.parametrize("task", ["nosuch", "reasoning_gym:nosuch", "math:/nonexistent/rows.jsonl"])
def test_a_bad_task_is_one_line_and_writes_nothing(tmp_path, capsys, task):
    run = tmp_path / "run"
    assert train_cli(run, "--task", task, "--task-kwargs", "{}", "--updates", "1") == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert task.split(":")[-1].split("/")[-1] in line
    assert not run.exists()


def test_a_malformed_math_row_is_named_in_one_line(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1+1?", "answer": "2"}\n{"prompt": "no answer here"}\n')
    run = tmp_path / "run"
    assert train_cli(run, "--task", f"math:{rows}", "--task-kwargs", "{}", "--updates", "1") == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert "row 2" in line
    assert not run.exists()


@pytest.mark.parametrize("kind", ["empty_dir", "missing"])
def test_eval_on_something_that_is_not_a_run(tmp_path, capsys, kind):
    path = tmp_path / "x"
    if kind == "empty_dir":
        path.mkdir()
    assert main(["eval", str(path), "--prompts", "2", "--k", "1"]) == 2
    line = one_error_line(capsys.readouterr().err, "eval")
    assert line == f"respo eval: error: not a run or model directory: {path}"


@pytest.mark.parametrize("kind", ["empty_dir", "missing"])
def test_report_with_no_runs_is_an_error(tmp_path, capsys, kind):
    path = tmp_path / "sweep"
    if kind == "empty_dir":
        path.mkdir()
    assert main(["report", str(path), "--out", str(tmp_path / "rep")]) == 2
    line = one_error_line(capsys.readouterr().err, "report")
    assert f"no runs found under {path}" in line
    assert not (tmp_path / "rep" / "report.md").exists()


def test_every_objective_lists_its_hyperparameters_when_given_an_unknown_one():
    import torch

    import respo

    logp = torch.zeros(2, 3)
    for fn, valid in ((respo.respo_loss, ("pos", "neg")), (respo.reshaped_loss, ("pos_kernel", "neg_kernel")),
                      (respo.grpo_loss, ("clip_ratio_low",))):
        with pytest.raises(ValueError) as err:
            fn(logp, logp, torch.ones(2), torch.ones(2, 3), tau=1.0)
        assert "tau" in str(err.value) and all(v in str(err.value) for v in valid), str(err.value)


def test_unparseable_math_ground_truths_are_counted_and_reported(tmp_path):
    from respo.runtime.tasks import get_task

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": a}) + "\n" for i, a in enumerate(["2", "???", "7"])))
    with pytest.warns(UserWarning, match="1 of 3"):
        task = get_task(f"math:{rows}")
    assert task.unparseable_ground_truths == 1


def test_negative_numbers_are_values_not_flags(tmp_path, capsys):
    assert train_cli(tmp_path / "run", "--lr", "-1e-4", "--updates", "1") == 2
    assert "lr must be > 0, got -0.0001" in capsys.readouterr().err


def test_changing_the_objective_drops_the_files_hyperparameters():
    from respo.train.config import load_config

    cfg = load_config(Path(__file__).parents[2] / "configs" / "tiny-dense.toml", {"reuse": 8, "objective": "grpo"})
    assert cfg.objective == "grpo" and cfg.objective_kwargs == {}
    # explicit hyperparameters for the new objective are kept
    cfg = load_config(Path(__file__).parents[2] / "configs" / "tiny-dense.toml",
                      {"objective": "grpo", "objective_kwargs": '{"clip_ratio_low": 0.1}'})
    assert cfg.objective_kwargs == {"clip_ratio_low": 0.1}


def test_sft_and_train_share_one_warm_start_cache():
    from respo.cli import build_parser
    from respo.train.config import TrainConfig

    args = build_parser().parse_args(["sft"])
    assert Path(args.cache_dir) == Path(TrainConfig().cache_dir)


def test_task_kwargs_have_one_spelling_in_both_forms(tmp_path):
    from respo.cli import build_parser

    parse = build_parser().parse_args
    for command in (["train"], ["sft"], ["eval", str(tmp_path)]):
        a = parse([*command, "--task-kwarg", "digits=4", "--task-kwarg", "scratchpad=false"])
        b = parse([*command, "--task-kwargs", '{"digits": 4, "scratchpad": false}'])
        assert a.task_kwargs == b.task_kwargs == {"digits": 4, "scratchpad": False}, command


def test_help_names_the_objectives_and_tasks(capsys):
    import respo
    from respo.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in respo.OBJECTIVES)
    assert all(task in out for task in ("addition", "countdown", "reasoning_gym:", "math:"))


def test_progress_false_silences_every_progress_bar(tmp_path, capfd):
    assert train_cli(tmp_path / "run", "--updates", "1") == 0
    out = capfd.readouterr()
    for text in ("Loading weights", "Writing model shards", "it/s]"):
        assert text not in out.out + out.err, text


def test_every_run_gets_a_report_and_report_compares_ordinary_runs(tmp_path, capsys):
    for obj in ("respo", "grpo"):
        assert train_cli(tmp_path / "runs" / obj, "--objective", obj, "--objective-kwargs", "{}", "--updates", "2") == 0
        assert (tmp_path / "runs" / obj / "report.md").is_file()
        assert (tmp_path / "runs" / obj / "curve.png").is_file()
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "cmp")]) == 0
    text = (tmp_path / "cmp" / "report.md").read_text()
    assert "respo" in text and "grpo" in text
    assert any(p.suffix == ".png" for p in (tmp_path / "cmp").iterdir())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A saved Hugging Face model directory: the tiny-dense preset (one small layer) and its tokenizer."""
    from respo.runtime.models import build_policy
    from respo.runtime.tokenizer import build_char_tokenizer

    path = tmp_path_factory.mktemp("model")
    tok = build_char_tokenizer()
    build_policy("tiny-dense", tok, num_hidden_layers=1, hidden_size=32, head_dim=8,
                 intermediate_size=64).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.mark.parametrize("flags, message", [
    (["--k", "0"], "--k must be >= 1, got 0"),
    (["--prompts", "-1"], "--prompts must be >= 1, got -1"),
    (["--temperature", "-1"], "--temperature must be a finite number > 0, got -1.0"),
    (["--temperature", "nan"], "--temperature must be a finite number > 0, got nan"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1 (or left out: the run's), got 0"),  # was read as unset
    (["--threads", "-2"], "--threads must be >= 0 (0 keeps torch's default), got -2"),
    (["--engine-threads", "0"], "--engine-threads must be >= 1 (or left out: the run's), got 0"),
    (["--rollout-engine", "sglang"], "--rollout-engine 'sglang' is unknown; choose one of respo, vllm"),
    (["--engine-dtype", "fp8"], "--engine-dtype 'fp8' is unknown; choose one of auto, bfloat16, float32"),
    (["--prompt-format", "jinja"], "--prompt-format 'jinja' is unknown; choose auto, chat or raw"),
])
def test_eval_refuses_bad_flags_in_one_line(model_dir, capsys, flags, message):
    before = sorted(p.name for p in model_dir.iterdir())
    assert main(["eval", str(model_dir), "--prompts", "2", "--k", "1", *flags]) == 2
    assert one_error_line(capsys.readouterr().err, "eval") == f"respo eval: error: {message}"
    assert sorted(p.name for p in model_dir.iterdir()) == before


@pytest.mark.parametrize("flags, message", [
    (["--preset", "tiny-dence"], "preset 'tiny-dence' is unknown; choose one of tiny-dense, tiny-moe"),
    (["--lr", "nan"], "lr must be a finite number > 0, got nan"),
    (["--lr", "inf"], "lr must be a finite number > 0, got inf"),
    (["--batch-size", "0"], "batch_size must be >= 1, got 0"),
    (["--model", "smollm2-135m-instruct", "--lr", "-1e-5"], "lr must be > 0, got -1e-05"),
])
def test_sft_refuses_bad_settings_before_building_anything(tmp_path, capsys, flags, message):
    cache = tmp_path / "cache"
    assert main(["sft", "--cache-dir", str(cache), "--max-steps", "1", *flags]) == 2
    assert one_error_line(capsys.readouterr().err, "sft") == f"respo sft: error: {message}"
    assert not cache.exists()


@pytest.mark.parametrize("config, message", [
    ({"name": "my project", "version": 2}, "config.json is not a Hugging Face model config (it has no model_type)"),
    ({"objective": "respo", "out_dir": "runs/x"}, "is a respo run directory, not a model's; its trained policy is"),
    ("{truncated", "config.json is not readable JSON"),
])
def test_train_on_a_directory_that_is_no_model_is_one_line_and_leaves_nothing(tmp_path, capsys, config, message):
    model = tmp_path / "notmodel"
    model.mkdir()
    (model / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    run = tmp_path / "out" / "run"
    assert train_cli(run, "--model", str(model), "--updates", "1") == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert message in line and str(model) in line
    assert not (tmp_path / "out").exists()


def test_a_model_directory_transformers_cannot_load_is_one_line_and_leaves_nothing(tmp_path, capsys, model_dir):
    # config.json names a model type, but the weights are missing: the load fails after the run directory was
    # created; the error is one line and the (still empty) directory, with the parent it needed, is removed
    import shutil

    model = tmp_path / "broken"
    shutil.copytree(model_dir, model)
    (model / "model.safetensors").unlink()
    run = tmp_path / "out" / "run"
    assert train_cli(run, "--model", str(model), "--updates", "1") == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert f"model directory {str(model)!r} could not be loaded as a Hugging Face model and tokenizer" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("betas", ['[0.9, null]', '["a", 0.9]', '[0.9, 0.99, 0.5]', '[0.9, NaN]'])
def test_adam_betas_that_are_not_two_numbers_are_one_line(tmp_path, capsys, betas):
    run = tmp_path / "run"
    assert train_cli(run, "--adam-betas", betas, "--updates", "1") == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert "adam_betas must be two numbers in [0, 1), got [" in line
    assert not run.exists()


def test_resume_with_a_truncated_config_json_is_one_line_and_changes_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    assert train_cli(run, "--updates", "1") == 0
    text = (run / "config.json").read_text()
    (run / "config.json").write_text(text[: len(text) // 2])
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert train_cli(run, "--updates", "2", "--resume") == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert f"{str(run / 'config.json')!r} is corrupt" in line and "--overwrite" in line
    assert {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_resume_of_a_missing_run_directory_says_it_starts_a_new_run(tmp_path, capsys):
    run = tmp_path / "run"
    assert train_cli(run, "--updates", "1", "--resume") == 0
    assert f"nothing to resume in {run}; starting a new run" in capsys.readouterr().out
    assert (run / "final").is_dir()
