"""Device, precision and token micro-batches: the float32 CPU path is the reference, token
micro-batches give the whole-batch update up to float rounding, bfloat16 stays close with float32
log-probs, and the CUDA paths (run where CUDA exists, skipped elsewhere) match the CPU."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from respo.runtime.logprobs import token_logprobs
from respo.runtime.precision import device_problem, mixed_precision, resolve_device
from respo.runtime.sampler import sample
from respo.train.checkpoint import rng_state, set_rng_state
from respo.train.config import ConfigError, MicroBatching, apply_overrides, validate
from respo.train.forward import micro_batches
from respo.train.update import UpdateSettings, make_optimizer, update_step
from trainer_support import rollout as _rollout, setup, small_cfg as _cfg  # noqa: F401 (setup is a fixture)

torch.set_num_threads(1)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


# ----------------------------------------------------------------------------------------------
# Token micro-batches
# ----------------------------------------------------------------------------------------------
def _mask(lengths, T=16):
    return (torch.arange(T) < torch.tensor(lengths)[:, None]).float()  # (S, T)


def test_micro_batches_by_rows_are_unchanged():
    assert micro_batches(_mask([1] * 8), 6, MicroBatching.of(_cfg(micro_batch=0))) == [(0, 8)]
    assert micro_batches(_mask([1] * 8), 6, MicroBatching.of(_cfg(micro_batch=4))) == [(0, 4), (4, 8)]


def test_micro_batches_by_tokens_by_hand():
    cfg = _cfg(micro_batch_tokens=40)
    # response_start 6: 4 rows of longest 4 cost 4 * (6 + 4) = 40 <= 40, one micro-batch
    assert micro_batches(_mask([2, 4, 4, 1]), 6, MicroBatching.of(cfg)) == [(0, 4)]
    # [2, 14] costs 2 * 20 = 40; adding row 2 would cost 3 * 20 = 60 > 40; then [4, 1] costs 2 * 10 = 20
    assert micro_batches(_mask([2, 14, 4, 1]), 6, MicroBatching.of(cfg)) == [(0, 2), (2, 4)]
    # a row over the budget on its own still gets a micro-batch: 1 * (6 + 16) = 22 > 20
    assert micro_batches(_mask([16, 16, 1]), 6, MicroBatching.of(_cfg(micro_batch_tokens=20))) == [(0, 1), (1, 2), (2, 3)]


def test_token_micro_batches_give_the_whole_batch_update(setup):
    # the summed micro-batch gradients use the mini-batch's global counts: the update equals the
    # whole-batch update up to float rounding (different reduction order), for token- and seq-level agg.
    for agg in ("token-mean", "seq-mean-token-mean"):
        cfg = _cfg(loss_agg_mode=agg, grad_clip=0)
        batch = _rollout(setup, cfg, cfg.prompts)
        budget = int(batch.response_start + batch.mask.sum(1).max()) * 3  # three rows a micro-batch
        results = []
        for c in (cfg, apply_overrides(cfg, {"micro_batch_tokens": budget})):
            assert len(micro_batches(batch.mask, batch.response_start, MicroBatching.of(c))) == (1 if c is cfg else 3)
            model = copy.deepcopy(setup[0].model)
            # plain SGD with lr 1: the weights move by -grad (Adam would blow rounding up on near-zero grads)
            opt = torch.optim.SGD(model.parameters(), lr=1.0)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: 1.0)
            m, _ = update_step(model, opt, sched, batch, UpdateSettings.of(c))
            results.append((m, [p.detach().clone() for p in model.parameters()]))
        (m0, w0), (m1, w1) = results
        torch.testing.assert_close(m1["loss"], m0["loss"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(m1["grad_norm"], m0["grad_norm"], rtol=1e-4, atol=1e-6)
        for a, b in zip(w0, w1):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_token_micro_batches_keep_log_w_exactly_zero_on_policy(setup):
    # recompute_logp and update_step pack the same micro-batches: on-policy log W is exactly 0
    cfg = _cfg(micro_batch_tokens=60)
    batch = _rollout(setup, cfg, cfg.prompts)
    model = copy.deepcopy(setup[0].model)
    opt, sched = make_optimizer(model, cfg)
    m, old_logp = update_step(model, opt, sched, batch, UpdateSettings.of(cfg), on_policy=True)
    assert float(m["log_w/min"]) == 0.0 and float(m["log_w/max"]) == 0.0
    assert torch.equal(old_logp, batch.old_logp)


# ----------------------------------------------------------------------------------------------
# Precision
# ----------------------------------------------------------------------------------------------
def _forward_batch(setup, cfg):
    batch = _rollout(setup, cfg, cfg.prompts)
    return batch.input_ids, batch.attention_mask, batch.response_start, batch.mask


def test_float32_context_changes_nothing(setup):
    model = setup[0].model
    ids, attn, P, mask = _forward_batch(setup, _cfg())
    ref, _ = token_logprobs(model, ids, attn, P)
    with mixed_precision(model, "float32"):
        got, _ = token_logprobs(model, ids, attn, P)
    assert torch.equal(ref, got)


def test_bfloat16_keeps_float32_logits_and_is_close(setup):
    model = setup[0].model
    ids, attn, P, mask = _forward_batch(setup, _cfg())
    ref, _ = token_logprobs(model, ids, attn, P)
    head_dtypes = []
    handle = model.get_output_embeddings().register_forward_hook(lambda m, a, out: head_dtypes.append(out.dtype))
    try:
        with mixed_precision(model, "bfloat16"):
            got, ent = token_logprobs(model, ids, attn, P, with_entropy=True)
    finally:
        handle.remove()
    assert head_dtypes == [torch.float32] and got.dtype == torch.float32 and ent.dtype == torch.float32
    assert not torch.equal(got, ref)  # the decoder really ran in bfloat16
    # bf16 has 8 mantissa bits (relative step 2^-8 = 0.004): per-token log-probs of a tiny model move by ~1e-2
    assert float(((got - ref).abs() * mask).max().detach()) < 0.1
    assert torch.is_autocast_enabled("cpu") is False  # the context was left


def test_bfloat16_update_step_runs_and_trains_float32_weights(setup):
    cfg = _cfg(dtype="bfloat16")
    batch = _rollout(setup, cfg, cfg.prompts)
    model = copy.deepcopy(setup[0].model)
    opt, sched = make_optimizer(model, cfg)
    m, _ = update_step(model, opt, sched, batch, UpdateSettings.of(cfg), on_policy=True)
    assert float(m["log_w/min"]) == 0.0 and float(m["log_w/max"]) == 0.0  # same bf16 forward both times
    assert torch.isfinite(m["loss"]) and float(m["grad_norm"]) > 0
    assert all(p.dtype == torch.float32 for p in model.parameters())


# ----------------------------------------------------------------------------------------------
# Settings
# ----------------------------------------------------------------------------------------------
def test_settings_are_checked():
    with pytest.raises(ConfigError, match="dtype 'float16' is unknown"):
        validate(_cfg(dtype="float16"))
    with pytest.raises(ConfigError, match="device 'tpu' is unknown"):
        validate(_cfg(device="tpu"))
    with pytest.raises(ConfigError, match="set one of them to 0"):
        validate(_cfg(micro_batch=4, micro_batch_tokens=100))
    with pytest.raises(ConfigError, match="compile applies to sync mode"):
        validate(_cfg(compile=True, mode="async"))
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert device_problem("cpu") is None and device_problem("auto") is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_without_cuda_is_one_readable_error():
    with pytest.raises(ConfigError) as err:
        validate(_cfg(device="cuda"))
    # one problem is one line: "1 problem in the training config: device 'cuda' asks for CUDA but ..."
    lines = str(err.value).splitlines()
    assert len(lines) == 1 and lines[0].startswith("1 problem in the training config:") and "no CUDA device" in lines[0]


@pytest.mark.slow
def test_compile_option_trains_like_eager(setup):
    pytest.importorskip("torch._dynamo")
    cfg = _cfg(grad_clip=0)
    batch = _rollout(setup, cfg, cfg.prompts)
    weights = []
    for c in (cfg, apply_overrides(cfg, {"compile": True})):
        model = copy.deepcopy(setup[0].model)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)  # weights move by -grad
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: 1.0)
        update_step(model, opt, sched, batch, UpdateSettings.of(c))
        weights.append([p.detach().clone() for p in model.parameters()])
        assert "_respo_compiled" not in dict(model.named_modules())
        assert set(model.state_dict()) == set(setup[0].model.state_dict())
    for a, b in zip(*weights):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------------------------
# CUDA (run where CUDA exists)
# ----------------------------------------------------------------------------------------------
@cuda
def test_cuda_sampler_identity_and_generator(setup):
    policy = setup[0]
    model = copy.deepcopy(policy.model).cuda()
    prompts = [ex.prompt for ex in setup[2][:8]]
    rollouts = []
    for _ in range(2):
        gen = torch.Generator(device="cuda").manual_seed(0)
        rollouts.append(sample(model, policy.tokenizer, prompts, max_new_tokens=12, generator=gen))
    ro = rollouts[0]
    assert ro.input_ids.device.type == "cuda" and torch.equal(ro.input_ids, rollouts[1].input_ids)
    logp, _ = token_logprobs(model.train(), ro.input_ids, ro.attention_mask, ro.response_start)
    torch.testing.assert_close(logp * ro.response_mask, ro.behaviour_logp, rtol=0, atol=1e-4)


@cuda
def test_cuda_generator_state_round_trips():
    gen = torch.Generator(device="cuda").manual_seed(5)
    torch.rand(3, device="cuda", generator=gen)
    state = rng_state(gen)
    want = torch.rand(4, device="cuda", generator=gen)
    other = torch.Generator(device="cuda").manual_seed(0)
    set_rng_state(state, other)
    assert torch.equal(torch.rand(4, device="cuda", generator=other), want)


@cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_update_matches_cpu(setup, dtype):
    cfg = _cfg(dtype=dtype, micro_batch=4)
    batch = _rollout(setup, _cfg(), cfg.prompts)  # a CPU batch, as the trainer keeps them
    out = []
    for device in ("cpu", "cuda"):
        model = copy.deepcopy(setup[0].model).to(device)
        opt, sched = make_optimizer(model, cfg)
        m, old = update_step(model, opt, sched, batch, UpdateSettings.of(cfg))
        assert old.device.type == "cpu" and m["loss"].device.type == "cpu"
        out.append((m, [p.detach().cpu() for p in model.parameters()]))
    (m_cpu, w_cpu), (m_gpu, w_gpu) = out
    tol = 1e-4 if dtype == "float32" else 5e-2  # bf16 kernels differ between CPU and GPU
    torch.testing.assert_close(m_gpu["loss"], m_cpu["loss"], rtol=tol, atol=tol)
    assert torch.isfinite(m_gpu["grad_norm"])
    if dtype == "float32":
        # AdamW's first step moves each weight by lr * g / (|g| + eps), about lr (1e-3) wherever |g| >> eps:
        # where |g| is within a few hundred eps the step's size follows the last bits of g, which CPU and GPU
        # kernels round differently (an H200 moved one of 16384 elements 2.1e-5 from the CPU). A step
        # taken on the wrong values moves weights by about lr, which 5 % of lr still catches.
        for a, b in zip(w_cpu, w_gpu):
            torch.testing.assert_close(a, b, rtol=0, atol=0.05 * cfg.lr)


CLI_ARGS = ["--warm-start", "false", "--threads", "1", "--prompts", "2", "--group-size", "4", "--max-new-tokens", "12",
            "--reuse", "2", "--lr", "1e-3", "--warmup", "1", "--task-kwargs", '{"overlong": [12, 11]}',
            "--eval-prompts", "4", "--eval-k", "2", "--progress", "false", "--tensorboard", "false", "--seed", "3"]


def _train(out, *extra):
    cmd = [sys.executable, "-m", "respo", "train", *CLI_ARGS, "--out-dir", str(out), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


@cuda
@pytest.mark.parametrize("extra", [[], ["--dtype", "bfloat16", "--micro-batch-tokens", "64"]])
def test_cli_train_on_cuda_then_resume(tmp_path, extra):
    # a 4-update run straight, and a 2-update run resumed to 4: both finish, the resumed one restores the
    # CUDA sampling generator and ends near the straight run's weights (CUDA kernels need not be bitwise)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    res = _train(straight, "--device", "cuda", "--updates", "4", "--checkpoint-every", "2", *extra)
    assert res.returncode == 0, res.stderr[-2000:]
    res = _train(resumed, "--device", "cuda", "--updates", "2", *extra)
    assert res.returncode == 0, res.stderr[-2000:]
    res = _train(resumed, "--device", "cuda", "--updates", "4", "--resume", *extra)
    assert res.returncode == 0, res.stderr[-2000:]
    records = [json.loads(line) for line in open(resumed / "metrics.jsonl") if '"event"' not in line]
    assert [r["update"] for r in records] == [1, 2, 3, 4]
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["updates"] == 4
    a, b = load_file(str(Path(straight) / "final" / "model.safetensors")), load_file(str(resumed / "final" / "model.safetensors"))
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-3)


# ----------------------------------------------------------------------------------------------
# Device plumbing: CLI, sweep, SFT, evaluation
# ----------------------------------------------------------------------------------------------
def test_sweep_passes_the_device_through_without_renaming_runs(tmp_path):
    from respo.study.sweep import RunSpec, train_command

    spec = RunSpec("grpo_N4_lr3e-05_s0", {"objective": "grpo", "reuse": 4})
    cpu = train_command(spec, tmp_path / "r", tmp_path / "base.toml", 1)
    gpu = train_command(spec, tmp_path / "r", tmp_path / "base.toml", 1, "cuda")
    assert "--device" not in cpu  # the CPU command is as before
    assert gpu[gpu.index("--device") + 1] == "cuda" and gpu[gpu.index("--out-dir") + 1] == str(tmp_path / "r")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cli_device_cuda_without_cuda_is_one_line_exit_2(tmp_path, capsys):
    from respo.cli import main

    assert main(["train", "--device", "cuda", "--out-dir", str(tmp_path / "r")]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert main(["sweep", "--device", "cuda", "--out", str(tmp_path / "s"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "no CUDA device" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


@cuda
def test_sft_and_eval_on_cuda(tmp_path, capsys):
    from respo.cli import main
    from respo.runtime.sft import load_policy, warm_start

    ws = warm_start("addition", "tiny-dense", tmp_path, task_kwargs={"digits": 2}, max_steps=3, eval_every=3,
                    eval_prompts=8, eval_n=8, device="cuda")
    info = json.loads((ws.path / "respo_warm_start.json").read_text())
    assert info["device"] == "cuda" and info["steps"] == 3
    load_policy(ws.path)  # loads on the CPU, as a run then moves it
    assert main(["eval", str(ws.path), "--prompts", "4", "--k", "2", "--device", "cuda", "--dtype", "bfloat16"]) == 0
    assert "pass@1" in capsys.readouterr().out


@cuda
def test_sweep_on_cuda_writes_the_cpu_run_directories(tmp_path):
    from respo.cli import main

    args = ["sweep", "--preset", "quick", "--updates", "2", "--jobs", "2", "--no-prewarm"]
    assert main([*args, "--out", str(tmp_path / "cpu"), "--dry-run"]) == 0
    assert main([*args, "--out", str(tmp_path / "gpu"), "--device", "cuda"]) == 0
    runs = sorted(p.name for p in (tmp_path / "gpu" / "runs").iterdir())
    assert len(runs) == 2 and all((tmp_path / "gpu" / "runs" / r / "summary.json").is_file() for r in runs)
    saved = json.loads((tmp_path / "gpu" / "runs" / runs[0] / "config.json").read_text())
    assert saved["device"] == "cuda"


# --- "auto": bfloat16 only where the hardware computes it natively ---------------------------------------
# /proc/cpuinfo flags seen on the three CPUs the real-model study ran on: an Intel Xeon with AMX, an AMD
# EPYC with AVX-512 BF16, and an AMD EPYC with AVX2 only (where torch emulates bfloat16: a one-thread
# 1024 x 1024 matmul ran at 0.9 GFLOP/s against 89 in float32: benchmarks/bench_real.py --only train).
XEON_AMX = {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
EPYC_AVX512 = {"avx2", "avx512f", "avx512_bf16"}
EPYC_AVX2 = {"avx", "avx2", "fma"}
ARM_BF16 = {"fp", "asimd", "sve", "bf16"}


def test_cpu_flags_reads_x86_flags_and_arm_features(tmp_path):
    from respo.runtime.precision import cpu_flags

    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512_bf16\n\n"
                   "processor\t: 1\nflags\t\t: fpu avx2 avx512_bf16\n")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd bf16 i8mm\nCPU part\t: 0xd40\n")
    assert cpu_flags(x86) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_flags(arm) == {"fp", "asimd", "bf16", "i8mm"}
    assert cpu_flags(tmp_path / "missing") == set()  # unreadable: unknown, not "no flags"


def test_native_bf16_on_cpus_by_their_flags():
    from respo.runtime.precision import native_bf16

    cpu = torch.device("cpu")
    assert native_bf16(cpu, flags=XEON_AMX) is True
    assert native_bf16(cpu, flags=EPYC_AVX512) is True
    assert native_bf16(cpu, flags=ARM_BF16) is True
    assert native_bf16(cpu, flags=EPYC_AVX2) is False
    assert native_bf16(cpu, flags={"avx512f"}) is False  # AVX-512 without its BF16 extension emulates it


def test_unknown_flags_are_no_answer_and_auto_keeps_bfloat16(monkeypatch):
    # No flags to read (not Linux): native_bf16 does not guess (a timing would depend on the machine's load,
    # and the answer decides a cache key), and auto keeps bfloat16, the warm start's dtype before auto existed.
    import respo.runtime.precision as precision

    cpu = torch.device("cpu")
    monkeypatch.setattr(precision, "bf16_speedup", lambda *a, **k: pytest.fail("timed a matmul"))
    assert precision.native_bf16(cpu, flags=set()) is None
    assert precision.resolve_dtype("auto", cpu, flags=set()) == "bfloat16"


def test_cuda_follows_torchs_bf16_support(monkeypatch):
    from respo.runtime.precision import native_bf16, resolve_dtype

    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert native_bf16(cuda, flags=EPYC_AVX2) is True  # the host CPU's flags do not matter on the GPU
    assert resolve_dtype("auto", cuda, flags=EPYC_AVX2) == "bfloat16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert resolve_dtype("auto", cuda, flags=XEON_AMX) == "float32"


def test_resolve_dtype_auto_and_explicit():
    from respo.runtime.precision import resolve_dtype

    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu, flags=XEON_AMX) == "bfloat16"
    assert resolve_dtype("auto", cpu, flags=EPYC_AVX2) == "float32"
    # an explicit dtype is kept as asked, even where bfloat16 is emulated; an unknown one passes through for the
    # caller's own one-line error
    assert resolve_dtype("bfloat16", cpu, flags=EPYC_AVX2) == "bfloat16"
    assert resolve_dtype("float32", cpu, flags=XEON_AMX) == "float32"
    assert resolve_dtype("float16", cpu, flags=XEON_AMX) == "float16"


def test_emulated_bf16_note_names_the_missing_extension():
    from respo.runtime.precision import emulated_bf16_note

    cpu = torch.device("cpu")
    note = emulated_bf16_note("bfloat16", cpu, flags=EPYC_AVX2)
    assert note is not None and "\n" not in note
    assert "emulated" in note and "avx512_bf16" in note and "float32" in note
    assert emulated_bf16_note("bfloat16", cpu, flags=EPYC_AVX512) is None
    assert emulated_bf16_note("float32", cpu, flags=EPYC_AVX2) is None
    assert emulated_bf16_note("bfloat16", cpu, flags=set()) is None  # unknown flags: no claim either way


def test_a_run_in_emulated_bfloat16_says_so_once(tmp_path, monkeypatch, capsys):
    # A one-update run asking for bfloat16 on a CPU whose flags show no native bfloat16: it runs as asked and
    # says so in one line on stderr; in float32 it says nothing.
    from respo.train.trainer import train

    monkeypatch.setattr("respo.runtime.precision.cpu_flags", lambda *a: EPYC_AVX2)
    train(_cfg(updates=1, dtype="bfloat16", out_dir=str(tmp_path / "bf16")))
    notes = [line for line in capsys.readouterr().err.splitlines() if "emulated" in line]
    assert notes == [notes[0]] and notes[0].startswith("[respo] dtype: bfloat16 on this CPU is emulated")
    train(_cfg(updates=1, dtype="float32", out_dir=str(tmp_path / "fp32")))
    assert "emulated" not in capsys.readouterr().err
