"""Warm start: SFT learns, stops at the target, caches, reuses, and the stored pass rate reproduces."""

import json
import platform
import random

import pytest
import torch

from respo.cli import build_parser, run_sft
from respo.runtime.sft import (
    INFO_FILE,
    SFTSettingsError,
    SFTConfig,
    _corrupt,
    built_on,
    cpu_model,
    encode_pairs,
    load_policy,
    measure_pass_rate,
    warm_start,
)
from respo.runtime.tasks import get_task
from respo.runtime.tokenizer import build_char_tokenizer

# A one-layer, 64-wide Qwen3 on 2-digit scratchpad addition ("12+34=" -> "2406;1304;046",
# 13 characters + EOS): reaches a sampled pass rate of 0.3 in about 150 steps (a few seconds).
SMALL = dict(
    task_kwargs={"digits": 2, "scratchpad": True},
    model_overrides={"num_hidden_layers": 1, "hidden_size": 64, "head_dim": 16, "intermediate_size": 128},
    lr=3e-3, warmup_steps=5, batch_size=32, max_steps=400, eval_every=20, eval_prompts=32, eval_n=64,
    target_pass=0.3,
)


def main(argv):
    """`respo sft ARGV` as the CLI runs it; the `WarmStart` (a preset) or the warm start's directory (--model)."""
    return run_sft(build_parser().parse_args(["sft", *argv]))


def test_encode_pairs_layout():
    tok = build_char_tokenizer()
    ids, attn, P, mask = encode_pairs(tok, ["1+2=", "10+20="], ["3", "30"])
    # prompts: "<bos>1+2=" (5 tokens) left-padded to "<bos>10+20=" (7); responses + EOS, right pad
    assert P == 7 and ids.shape == (2, 10)
    assert ids[0].tolist() == [0, 0, 1, 5, 14, 6, 18, 7, 2, 0]  # pad pad <bos> 1 + 2 = 3 <eos> pad
    assert attn[0].tolist() == [0, 0, 1, 1, 1, 1, 1, 1, 1, 0]
    assert mask.tolist() == [[1, 1, 0], [1, 1, 1]]


def test_corrupt_changes_exactly_one_character():
    rng = random.Random(0)
    for _ in range(50):
        text = "3609;2507;1405;0579"
        out = _corrupt(text, "0123456789;", rng)
        assert len(out) == len(text) and sum(a != b for a, b in zip(text, out)) == 1


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    cache = tmp_path_factory.mktemp("warm")
    return cache, warm_start("addition", "tiny-dense", cache, seed=0, **SMALL)


def test_warm_start_learns_and_stops_at_target(small_run):
    _, ws = small_run
    hist = ws.history
    assert not ws.reused and ws.steps < SMALL["max_steps"] and ws.stopped_by == "target"
    assert hist[-1]["sampled_pass"] >= SMALL["target_pass"]
    assert all(h["sampled_pass"] < SMALL["target_pass"] for h in hist[:-1])
    assert hist[-1]["loss"] < hist[0]["loss"] / 3  # it learned the demonstrations
    assert 0.1 <= ws.pass_rate <= 0.8  # final held-out sampled rate, 64 prompts
    assert ws.greedy_pass_rate >= ws.pass_rate - 0.15


def test_warm_start_cache_reuse_and_reproducible_pass_rate(small_run):
    cache, ws = small_run
    info = json.loads((ws.path / INFO_FILE).read_text())
    assert info["pass_rate"] == ws.pass_rate and info["config"]["task_kwargs"] == {"digits": 2, "scratchpad": True}
    again = warm_start("addition", "tiny-dense", cache, seed=0, **SMALL)
    assert again.reused and again.path == ws.path and again.pass_rate == ws.pass_rate
    other = SFTConfig(task="addition", seed=1, **SMALL)
    assert other.key() != SFTConfig(task="addition", seed=0, **SMALL).key()
    # The stored rate is re-measured exactly from the saved weights (same prompts, same seed).
    model, tok, info = load_policy(ws.path)
    task = get_task("addition", **SMALL["task_kwargs"])
    cfg = info["config"]
    examples = task.examples("test", cfg["eval_n"], seed=cfg["seed"] + 2)
    rate = measure_pass_rate(model, tok, task, examples, max_new_tokens=info["max_new_tokens"],
                             seed=cfg["seed"] + 10**6)
    assert rate == ws.pass_rate
    assert not list(cache.glob(".*"))  # no temporary directories left behind

def test_cpu_model_reads_the_first_model_name_line(tmp_path, monkeypatch):
    # /proc/cpuinfo repeats a block per core; the first "model name" value, stripped, is the model.
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core Processor\n\n"
                    "processor\t: 1\nmodel name\t: something else\n")
    assert cpu_model(info) == "AMD EPYC 9654 96-Core Processor"
    # No such line (an ARM cpuinfo), or no file at all: platform.processor(), else "unknown".
    monkeypatch.setattr(platform, "processor", lambda: "")
    (tmp_path / "arm").write_text("processor\t: 0\nBogoMIPS\t: 50.00\nmodel name\t:   \n")
    assert cpu_model(tmp_path / "arm") == "unknown"
    monkeypatch.setattr(platform, "processor", lambda: "aarch64")
    assert cpu_model(tmp_path / "missing") == "aarch64"


def test_a_warm_start_records_the_machine_it_was_built_on(small_run):
    # The same settings built on two machines gave two different policies, so the record names the
    # machine: torch's version, the architecture, the CPU model and torch's CPU kernel dispatch level.
    _, ws = small_run
    where = json.loads((ws.path / INFO_FILE).read_text())["built_on"]
    assert where == built_on("cpu")
    assert where["torch"] == torch.__version__ and where["machine"] == platform.machine()
    assert where["cpu"] and where["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert "cuda_device" not in where  # built on the CPU


def test_cli_trains_then_reuses(tmp_path, capsys):
    # A 3-step run (its pass rate is ~0 and does not matter here):
    # the second identical command must come from the cache.
    argv = ["--cache-dir", str(tmp_path), "--task-kwarg", "digits=2", "--task-kwarg", "scratchpad=true",
            "--max-steps", "3", "--batch-size", "8", "--eval-prompts", "8", "--eval-n", "8"]
    with pytest.warns(UserWarning, match="outside"):  # 3 steps: pass rate 0, out of the band
        first = main(argv + ["--threads", str(torch.get_num_threads())])
    second = main(argv)
    assert not first.reused and first.steps == 3 and first.stopped_by == "max_steps"
    assert second.reused and second.path == first.path and second.pass_rate == first.pass_rate
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["reused"] is True
    assert first.config["task_kwargs"] == {"digits": 2, "scratchpad": True}


def test_load_policy_and_bad_settings(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a warm-start directory"):
        load_policy(tmp_path)
    with pytest.raises(TypeError, match="unknown warm_start settings"):
        warm_start("addition", "tiny-dense", tmp_path, learning_rate=1e-3)
    with pytest.raises(ValueError, match="noise"):
        warm_start("addition", "tiny-dense", tmp_path, noise=1.5)


def test_identity_on_a_trained_policy(small_run):
    # After SFT the distributions are sharp (sampled log-probs down to about -10). Float32 itself
    # is then only good to ~1e-5 relative: both the KV-cached sampler and the full forward were
    # measured within 2.3e-5 of a float64 forward at log-probs near -10. So the bound here is
    # 1e-5 absolute plus 2e-6 relative to |logp|.
    from respo.runtime.logprobs import token_logprobs
    from respo.runtime.sampler import sample

    _, ws = small_run
    model, tok, info = load_policy(ws.path)
    task = get_task("addition", **SMALL["task_kwargs"])
    prompts = [ex.prompt for ex in task.examples("test", 64, seed=9)]
    ro = sample(model, tok, prompts, max_new_tokens=info["max_new_tokens"], generator=torch.Generator().manual_seed(0))
    logp, _ = token_logprobs(model, ro.input_ids, ro.attention_mask, ro.response_start)
    torch.testing.assert_close(logp * ro.response_mask, ro.behaviour_logp, atol=1e-5, rtol=2e-6)


def test_the_cli_has_an_sft_subcommand(tmp_path):
    # respo.cli registers `sft` as it does train, eval and demo.
    args = build_parser().parse_args(["sft", "--cache-dir", str(tmp_path), "--preset", "tiny-moe",
                              "--task-kwarg", "digits=2", "--max-steps", "2", "--batch-size", "4",
                              "--eval-prompts", "4", "--eval-n", "4"])
    assert args.command == "sft" and args.preset == "tiny-moe" and args.max_steps == 2
    with pytest.warns(UserWarning, match="outside"):
        assert args.func(args) == 0
    (path,) = [p for p in tmp_path.iterdir() if p.name.startswith("tiny-moe-addition-")]
    assert json.loads((path / INFO_FILE).read_text())["steps"] == 2


def test_building_a_warm_start_says_so_and_why(tmp_path, capsys):
    tiny = dict(task_kwargs={"digits": 2}, max_steps=1, batch_size=4, eval_prompts=4, eval_n=4)
    with pytest.warns(UserWarning, match="outside"):
        first = warm_start("addition", "tiny-dense", tmp_path, **tiny)
    err = capsys.readouterr().err
    assert f"warm start: building {first.path} by SFT (up to 1 steps)" in err
    assert f"no cached warm start with key {first.path.name.rsplit('-', 1)[1]}" in err
    # another setting, same preset and task: the message names what differs from the cached one
    with pytest.warns(UserWarning, match="outside"):
        warm_start("addition", "tiny-dense", tmp_path, **{**tiny, "max_steps": 2})
    assert f"cached {first.path.name} differs in max_steps" in capsys.readouterr().err
    # a cached one is reused silently
    assert warm_start("addition", "tiny-dense", tmp_path, **tiny).reused
    assert "building" not in capsys.readouterr().err


def test_train_passes_its_sft_settings_to_the_warm_start():
    from respo.train.config import ConfigError, load_config
    from respo.train.policy import _warm_kwargs

    cfg = load_config(None, {"sft_kwargs": '{"max_steps": 300}', "task_kwargs": {"digits": 4, "overlong": [8, 7]}})
    assert _warm_kwargs(cfg) == {"max_steps": 300, "task_kwargs": {"digits": 4}}
    with pytest.raises(ConfigError, match="sft_kwargs has unknown setting.*max_step;"):
        load_config(None, {"sft_kwargs": {"max_step": 300}})


def test_sft_cli_bad_task_is_a_one_line_error(capsys):
    from respo.cli import main as respo_main

    assert respo_main(["sft", "--task", "nosuch", "--max-steps", "1"]) == 2
    assert capsys.readouterr().err.strip().startswith("respo sft: error: unknown task spec 'nosuch'")


def test_equivalent_task_settings_name_one_warm_start(tmp_path):
    # `respo sft` (addition: digits=5, scratchpad=true) and `respo train` with configs/tiny-dense.toml
    # (task_kwargs digits = 5; scratchpad is addition's default, True) must find the same cache entry
    tiny = dict(max_steps=1, batch_size=4, eval_prompts=4, eval_n=4)
    with pytest.warns(UserWarning, match="outside"):
        first = warm_start("addition", "tiny-dense", tmp_path, task_kwargs={"digits": 2, "scratchpad": True}, **tiny)
    again = warm_start("addition", "tiny-dense", tmp_path, task_kwargs={"digits": 2}, **tiny)
    assert again.reused and again.path == first.path


def _fake_cache(path, info):
    path.mkdir(parents=True)
    (path / INFO_FILE).write_text(json.dumps(info))


def test_record_of_a_cached_pretrained_warm_start_without_training(tmp_path, monkeypatch):
    # A cache directory holding only the info file: the command must find it and write the record, not train
    # (training would first need the packaged model, which this cache does not hold).
    from respo.runtime.pretrained_sft import PretrainedSFTConfig
    from respo.runtime.sft import cache_path
    from respo.runtime.tasks import task_defaults

    # on a CPU with native bfloat16 the default dtype (auto) is bfloat16: the committed warm start's settings
    monkeypatch.setattr("respo.runtime.precision.cpu_flags", lambda *a: {"avx2", "avx512f", "avx512_bf16"})
    cfg = PretrainedSFTConfig(model="smollm2-135m-instruct", task="worded_addition",
                              task_kwargs=task_defaults("worded_addition"), dtype="bfloat16")
    path = cache_path(tmp_path / "cache", cfg.model, cfg.task, cfg.key())
    assert path.name == "smollm2-135m-instruct-worded_addition-f3c9c82628"  # the committed warm start's key
    info = {"config": {"model": cfg.model}, "key": cfg.key(), "pass_rate": 0.469, "mean_response_tokens": 101.9,
            "steps": 48, "stopped_by": "target", "train_seconds": 2217.0}
    _fake_cache(path, {**info, "source": str(tmp_path / "cache" / "packaged" / "smollm2-135m-instruct-0.1.2")})
    monkeypatch.setattr("respo.runtime.packaged.resolve_packaged", lambda *a, **k: pytest.fail("tried to train"))
    threads = str(torch.get_num_threads())
    out = tmp_path / "rec" / "ws.json"
    out.parent.mkdir()
    assert main(["--model", "smollm2-135m-instruct", "--task", "worded_addition", "--threads", threads,
                 "--cache-dir", str(tmp_path / "cache"), "--record", str(out)]) == path
    # the info file as cached, after the command that finds (or builds) it: non-default flags in the parser's
    # order, without --cache-dir and --record (where, not what)
    assert json.loads(out.read_text()) == {
        "command": f"python -m respo sft --task worded_addition --model smollm2-135m-instruct --threads {threads}",
        **info, "source": "smollm2-135m-instruct-0.1.2"}  # the absolute path's last part only
    assert [p.name for p in out.parent.iterdir()] == ["ws.json"]  # written atomically: no temporary file left


def test_pretrained_warm_start_dtype_auto_resolves_before_the_key(tmp_path, monkeypatch, capsys):
    # auto is bfloat16 on a CPU with native bfloat16 and float32 on one that emulates it; the resolved dtype is
    # what the key hashes, so the two are two cache directories and neither is mistaken for the other. An
    # explicit bfloat16 where it is emulated is kept, with a one-line notice.
    from respo.runtime.pretrained_sft import PretrainedSFTConfig, warm_start_pretrained
    from respo.runtime.sft import cache_path
    from respo.runtime.tasks import task_defaults

    kw = dict(model="smollm2-135m-instruct", task="worded_addition", task_kwargs=task_defaults("worded_addition"))
    paths = {}
    for dtype in ("bfloat16", "float32"):
        cfg = PretrainedSFTConfig(**kw, dtype=dtype)
        paths[dtype] = cache_path(tmp_path, cfg.model, cfg.task, cfg.key())
        _fake_cache(paths[dtype], {"config": {"model": cfg.model, "dtype": dtype}, "key": cfg.key()})
    assert paths["bfloat16"] != paths["float32"]
    monkeypatch.setattr("respo.runtime.packaged.resolve_packaged", lambda *a, **k: pytest.fail("tried to train"))
    build = lambda **k: warm_start_pretrained("smollm2-135m-instruct", "worded_addition", tmp_path,  # noqa: E731
                                              verbose=False, **k)
    monkeypatch.setattr("respo.runtime.precision.cpu_flags", lambda *a: {"avx2", "avx512_bf16", "amx_bf16"})
    assert build() == paths["bfloat16"] and build(dtype="auto") == paths["bfloat16"]
    assert "emulated" not in capsys.readouterr().err
    monkeypatch.setattr("respo.runtime.precision.cpu_flags", lambda *a: {"avx", "avx2", "fma"})
    assert build() == paths["float32"]
    assert "emulated" not in capsys.readouterr().err
    assert build(dtype="bfloat16") == paths["bfloat16"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bfloat16 on this CPU is emulated" in err[0] and "avx512_bf16" in err[0]
    with pytest.raises(SFTSettingsError, match="dtype 'float16' is unknown; choose one of float32, bfloat16, auto"):
        build(dtype="float16")
    with pytest.raises(ValueError, match="dtype 'auto' names no warm start: resolve it on the device first"):
        PretrainedSFTConfig(**kw).key()  # the unresolved default is no cache directory


def test_record_of_a_cached_character_warm_start(tmp_path):
    from respo.runtime.sft import DEFAULT_TASK_KWARGS, cache_path
    from respo.runtime.tasks import task_defaults

    cfg = SFTConfig(task="addition", task_kwargs={**task_defaults("addition"), **DEFAULT_TASK_KWARGS},
                    preset="tiny-dense", seed=3)
    path = cache_path(tmp_path, "tiny-dense", "addition", cfg.key())
    info = {"config": {"preset": "tiny-dense", "seed": 3}, "key": cfg.key(), "pass_rate": 0.3,
            "greedy_pass_rate": 0.4, "steps": 10, "stopped_by": "target", "train_seconds": 5.0}
    _fake_cache(path, info)
    out = tmp_path / "ws.json"
    out.write_text("old")  # replaced, not appended to
    ws = main(["--seed", "3", "--cache-dir", str(tmp_path), "--record", str(out)])
    assert ws.reused and ws.path == path
    assert json.loads(out.read_text()) == {"command": "python -m respo sft --seed 3", **info}


def test_record_into_a_missing_directory_is_a_one_line_error_before_any_training(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    p = subprocess.run([sys.executable, "-m", "respo", "sft", "--cache-dir", str(tmp_path),
                        "--record", str(tmp_path / "nowhere" / "ws.json")],
                       cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().count("\n") == 0 and "nowhere" in p.stderr and "does not exist" in p.stderr
    assert list(tmp_path.iterdir()) == []  # nothing built


def test_one_sft_loop_and_one_import_direction():
    # pretrained_sft builds on sft (its loop, cache and pass band); sft imports neither it nor the CLI
    import ast
    import inspect

    import respo.runtime.pretrained_sft as pretrained_sft
    import respo.runtime.sft as sft

    def imported(module) -> set:
        tree = ast.parse(inspect.getsource(module))
        return ({n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
                | {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names})

    assert not {m for m in imported(sft) if "pretrained_sft" in m or m.endswith("cli")}
    assert "sft" in imported(pretrained_sft)
    assert pretrained_sft.sft_loop is sft.sft_loop and "PASS_BAND" not in inspect.getsource(pretrained_sft)


def test_the_pass_band_is_one_named_setting(small_run):
    from respo.runtime.sft import PASS_BAND, in_pass_band

    _, ws = small_run
    info = json.loads((ws.path / INFO_FILE).read_text())
    assert info["in_band"] == (PASS_BAND[0] <= ws.pass_rate <= PASS_BAND[1])
    assert PASS_BAND == (0.15, 0.6) and in_pass_band(0.15) and in_pass_band(0.6) and not in_pass_band(0.61)
