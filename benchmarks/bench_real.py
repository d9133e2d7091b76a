"""Speed of a real 135 M-parameter model (SmolLM2-135M-Instruct, packaged) on this machine, side by side.

Comparisons, each printed as one JSON line with both sides' medians and their ratio:

- ``sample``: respo's sampler (preallocated KV cache, behaviour log-probs recorded) against
  transformers' ``generate`` (its own cache, ``do_sample=True``), both float32, at ``--batch`` chat
  prompts x ``--new-tokens`` new tokens (EOS ignored on both sides, so both do the same work);
  tokens/s = batch x new tokens / seconds.
- ``train``: one forward+backward of the response log-probs (``token_logprobs``, as the trainer's
  update) over ``--rows`` x ``--seq`` tokens, float32 against bfloat16 autocast
  (``respo.runtime.precision.mixed_precision``); tokens/s, and GFLOP/s as 6 x parameters x tokens /
  seconds, as a fraction of the measured one-thread matmul peak of the same dtype (``peak``).
- ``logits``: the same float32 forward+backward with the output layer over chunks of positions
  (the default above ``LOGITS_BUDGET``) against one whole-batch logits tensor.
- ``engines``: the rollout engines at ``--batch`` chat prompts x ``--new-tokens`` (EOS ignored): the vLLM
  engine (``respo.runtime.engines.vllm``, its ``auto`` dtype, ``--threads`` threads) against respo's
  float32 sampler and transformers' ``generate``; also the weight sync's seconds and the engine-trainer
  mismatch on its samples (``respo.core.mismatch``: per-token mean |delta|, the sequence log-ratio's
  spread) after a sync of moved weights, and the CPU's ISA flags that decide vLLM's dtype.
- ``update``: one update of the reuse schedule at ``--prompts`` x ``--group`` responses, N = ``--reuse``,
  ``--max-new-tokens`` (the real-model study's batch), by phase: a rollout step of N x prompts x group
  responses (EOS honoured) sampled by respo's float32 sampler and by the vLLM engine, the weight sync,
  ``old_logp`` of the N - 1 stale mini-batches and one training step, in float32 and in bfloat16
  autocast; per update = (sample + sync + old_logp) / N + train. Also the bfloat16 noise: the sequence
  log-ratio between bfloat16 and float32 recomputes of the same rollout by the same weights, and the
  error bfloat16 puts into log W itself (the learner's log-probs over the behaviour's, each in bfloat16,
  against the same in float32) after the benchmark's updates, next to that log W's own spread.
- ``engine-dtypes``: the vLLM engine in bfloat16 against float32 on the study's rollout step (the warm start,
  ``--prompts`` x ``--group`` responses, EOS honoured, up to ``--max-new-tokens``): sampled tokens/s, and the
  engine-trainer mismatch of each side's own rollout against the float32 trainer's recompute (per-token mean
  |log rho|, the sequence log rho's p10 / p90, the fraction of sequences beyond +-1): what the cheaper dtype
  costs the correction. One engine is alive at a time (two would not fit beside a training run): each round
  starts a side's engine, syncs the weights, warms it up with one full-size rollout, times the next, closes it.
- ``schedules``: the sync on-policy schedule (N = 1), the bounded asynchronous mode with whole responses and
  the asynchronous mode with partial rollouts (segments of ``--segment-tokens``), on the vLLM engine
  (``--engine respo``: respo's sampler), ``--updates`` updates per run at ``--prompts`` x ``--group``: the
  learner's wall time per update (``time/update``, the first update of each run left out as the warm-up), the
  ratios, and the per-token staleness each reaches (mean, max, share of responses spanning versions). Where
  the asynchronous modes pay: the engine (its own core) samples the next batch while the learner trains.
  Each repeat is a whole run per schedule, in alternating order. ``--model tiny-dense`` runs the tiny preset
  from random weights on addition instead of SmolLM2 (for a machine without the memory for SmolLM2).

- ``prefix``: today's float32 forward against the fast one at the real-model study's batch (the warm start,
  ``--prompts`` x ``--group`` responses sampled once by the vLLM engine, up to ``--max-new-tokens``): one forward
  per row with the output layer checkpointed above the old 2**24-element logits budget, against each prompt run
  once for its group (``share_prompts``), its responses in length-sorted pieces, with the logits kept within
  ``LOGITS_BUDGET``. Timed per side: the ``old_logp`` recompute of one stale mini-batch and one training step
  (``update_step``, float32); the peak resident memory each adds above what the process held before it (a
  fresh process per side, the kernel's resident high-water mark reset before each); the tokens each forward
  computes (prompt, response, padding); and the floor: the float32 FLOPs of the distinct tokens (6 x decoder parameters per token, 6 x V x D per scored
  token) at the one-thread matmul peak measured in the same run. Per update = (rollout step + sync +
  (N - 1) x old_logp) / N + train, the rollout step's seconds measured once (both sides train on its rows).
Every side is warmed up once at full size; then ``--repeats`` rounds alternate which side goes first;
medians are reported.

    .venv/bin/python benchmarks/bench_real.py [--threads 1] [--batch 16] [--new-tokens 64]
        [--rows 8] [--seq 192] [--repeats 3] [--cache-dir .cache/respo] [--only sample,train,logits]
        [--prompts 4] [--group 8] [--reuse 8] [--max-new-tokens 160]     # --only engines,update
        [--updates 3] [--segment-tokens 32] [--model tiny-dense] [--engine respo]   # --only schedules
        [--prompts 4] [--group 8] [--max-new-tokens 160]                 # --only engine-dtypes
        [--prompts 4] [--group 8] [--reuse 8] [--max-new-tokens 160]     # --only prefix
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import statistics
import time

import torch

from respo.runtime import logprobs
from respo.runtime.chat import render_prompt
from respo.runtime.logprobs import token_logprobs
from respo.runtime.packaged import resolve_packaged
from respo.runtime.precision import mixed_precision
from respo.runtime.pretrained_sft import load_pretrained
from respo.runtime.sampler import sample
from respo.runtime.tasks import get_task
from timing import check_repeats

MODEL = "smollm2-135m-instruct"


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def side_by_side(sides: dict, repeats: int) -> dict[str, float]:
    """Median seconds per side: one full-size warm-up each, then ``repeats`` rounds in alternating order."""
    for fn in sides.values():
        fn()
    names, times = list(sides), {n: [] for n in sides}
    for r in range(repeats):
        for n in names if r % 2 == 0 else names[::-1]:
            times[n].append(_timed(sides[n]))
    return {n: statistics.median(t) for n, t in times.items()}


def matmul_peak(dtype: torch.dtype, n: int = 1024, repeats: int = 5) -> float:
    """GFLOP/s of an n x n x n matmul in ``dtype`` on the current threads (median of ``repeats``)."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    torch.mm(a, b)
    secs = statistics.median(_timed(lambda: torch.mm(a, b)) for _ in range(repeats))
    return 2 * n**3 / secs / 1e9


def _chat_prompts(tok, n: int, split: str = "test", seed: int = 0):
    task = get_task("worded_addition")
    examples = task.examples(split, n, seed)
    return task, examples, [render_prompt(tok, ex.prompt, task.answer_format) for ex in examples]


def bench_sample(model, tok, args) -> dict:
    _, _, prompts = _chat_prompts(tok, args.batch)
    enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left")
    T = args.new_tokens

    def respo_side():
        sample(model, tok, prompts, max_new_tokens=T, generator=torch.Generator().manual_seed(0), stop_at_eos=False)

    def generate_side():
        model.generate(**enc, max_new_tokens=T, min_new_tokens=T, do_sample=True, temperature=1.0, top_p=1.0,
                       top_k=0, pad_token_id=tok.pad_token_id)

    with torch.no_grad():
        secs = side_by_side({"respo": respo_side, "generate": generate_side}, args.repeats)
    tokens = args.batch * T
    return {"bench": "sample", "batch": args.batch, "new_tokens": T, "prompt_tokens": enc["input_ids"].shape[1],
            "respo_tok_s": round(tokens / secs["respo"], 1), "generate_tok_s": round(tokens / secs["generate"], 1),
            "respo_over_generate": round(secs["generate"] / secs["respo"], 3)}


def _train_batch(args):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 40000, (args.rows, args.seq), generator=g)
    return ids, torch.ones_like(ids), args.seq // 3  # prompt third, response two thirds


def bench_train(model, args) -> dict:
    ids, mask, P = _train_batch(args)
    model.train()

    def step(dtype):
        def run():
            with mixed_precision(model, dtype):
                logp, _ = token_logprobs(model, ids, mask, P)
            logp.sum().backward()
            model.zero_grad(set_to_none=True)
        return run

    secs = side_by_side({"float32": step("float32"), "bfloat16": step("bfloat16")}, args.repeats)
    n_params = sum(p.numel() for p in model.parameters())
    tokens = ids.numel()
    out = {"bench": "train", "rows": args.rows, "seq": args.seq, "threads": torch.get_num_threads()}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        gflops = 6 * n_params * tokens / secs[name] / 1e9
        peak = matmul_peak(dtype)
        out.update({f"{name}_tok_s": round(tokens / secs[name], 1), f"{name}_gflop_s": round(gflops, 1),
                    f"{name}_matmul_peak_gflop_s": round(peak, 1), f"{name}_of_peak": round(gflops / peak, 3)})
    out["bfloat16_over_float32"] = round(secs["float32"] / secs["bfloat16"], 3)
    return out


def bench_logits(model, args) -> dict:
    ids, mask, P = _train_batch(args)
    model.train()
    default = logprobs.LOGITS_BUDGET

    def step(budget):
        def run():
            logprobs.LOGITS_BUDGET = budget
            try:
                logp, _ = token_logprobs(model, ids, mask, P)
                logp.sum().backward()
                model.zero_grad(set_to_none=True)
            finally:
                logprobs.LOGITS_BUDGET = default
        return run

    V = model.get_output_embeddings().weight.shape[0]
    full_elems = args.rows * (args.seq - P + 1) * V
    secs = side_by_side({"chunked": step(default), "whole": step(1 << 62)}, args.repeats)
    return {"bench": "logits", "rows": args.rows, "seq": args.seq, "whole_logits_mib": round(full_elems * 4 / 2**20),
            "chunk_logits_mib": round(min(full_elems, default) * 4 / 2**20),
            "chunked_s": round(secs["chunked"], 3), "whole_s": round(secs["whole"], 3),
            "chunked_over_whole_speed": round(secs["whole"] / secs["chunked"], 3)}


def _trainer_logp(model, ro) -> torch.Tensor:
    with torch.no_grad():
        lp, _ = token_logprobs(model, ro.input_ids, ro.attention_mask, ro.response_start)  # (B, T)
    return lp * ro.response_mask


def _cpu_flags() -> list[str]:
    """The ISA flags that decide what vLLM's CPU backend can do and its dtype (``auto``)."""
    from respo.runtime.engines.vllm import cpu_flags

    have = cpu_flags()
    return [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if f in have]


def bench_engines(model, tok, args) -> dict:
    from respo.core.mismatch import mismatch_metrics
    from respo.runtime.engines import make_engine
    from respo.runtime.engines.respo import RespoEngine

    _, _, prompts = _chat_prompts(tok, args.batch)
    enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left")
    T = args.new_tokens
    engine = make_engine("vllm", model, tok, engine_dtype="auto", threads=args.threads, verbose=False)
    respo = RespoEngine(model, tok, dtype="float32")
    try:
        kw = dict(max_new_tokens=T, temperature=1.0, top_p=1.0, version=0, stop_at_eos=False)
        syncs = [engine.sync_weights(model) for _ in range(1 + args.repeats)][1:]  # the first allocates the file

        def generate_side():
            model.generate(**enc, max_new_tokens=T, min_new_tokens=T, do_sample=True, temperature=1.0, top_p=1.0,
                           top_k=0, pad_token_id=tok.pad_token_id)

        with torch.no_grad():
            secs = side_by_side({"vllm": lambda: engine.sample(prompts, generator=torch.Generator().manual_seed(0), **kw),
                                 "respo": lambda: respo.sample(prompts, generator=torch.Generator().manual_seed(0), **kw),
                                 "generate": generate_side}, args.repeats)
        # the mismatch on real rollouts (EOS honoured), after the weights moved and were synced
        moved, g = copy.deepcopy(model), torch.Generator().manual_seed(2)
        with torch.no_grad():  # every weight moved by 1e-3 of its tensor's spread (an update's size)
            for p in moved.parameters():
                p.add_(1e-3 * p.std() * torch.randn(p.shape, generator=g))
        engine.sync_weights(moved)
        ro = engine.sample(prompts, max_new_tokens=T, temperature=1.0, top_p=1.0,
                           generator=torch.Generator().manual_seed(1), version=1)
        mm = mismatch_metrics(_trainer_logp(moved, ro), ro.behaviour_logp, ro.response_mask)
    finally:
        engine.close()
    tokens = args.batch * T
    return {"bench": "engines", "batch": args.batch, "new_tokens": T, "threads": args.threads,
            "vllm_dtype": engine.info.get("dtype"), "cpu_flags": _cpu_flags(),
            "vllm_tok_s": round(tokens / secs["vllm"], 1), "respo_tok_s": round(tokens / secs["respo"], 1),
            "generate_tok_s": round(tokens / secs["generate"], 1),
            "vllm_over_respo": round(secs["respo"] / secs["vllm"], 3),
            "vllm_over_generate": round(secs["generate"] / secs["vllm"], 3),
            "sync_s": round(statistics.median(syncs), 3), "load_s": round(engine.info.get("load_s", float("nan")), 1),
            **{f"mismatch/{k.split('/', 1)[-1]}": round(float(v), 4) for k, v in mm.items()}}


def bench_update(args) -> dict:
    from respo.core import group_advantages
    from respo.runtime.engines import make_engine
    from respo.runtime.engines.respo import RespoEngine
    from respo.train.config import Forward, Sampling, TrainConfig
    from respo.train.rollout import recompute_logp, sample_rollout
    from respo.train.update import UpdateSettings, make_optimizer, run_objective, update_step

    from respo.runtime.chat import render_for
    from respo.train.policy import load_run_policy

    B, G, N = args.prompts, args.group, args.reuse
    cfg = {d: TrainConfig(model=MODEL, task="worded_addition", warm_start=True, cache_dir=args.cache_dir,
                          objective="respo", prompts=B, group_size=G, reuse=N, micro_batch=8, dtype=d, lr=1e-6,
                          warmup=0, weight_decay=0.0, max_new_tokens=args.max_new_tokens)
           for d in ("float32", "bfloat16")}
    policy = load_run_policy(cfg["float32"])  # the study's starting policy: the warm start (built if not cached)
    model, tok = policy.model, policy.tokenizer
    model.train()  # as the trainer holds it (the recompute and the update run in train mode)
    task = get_task("worded_addition")
    task, pool = render_for(tok, "auto", task, task.examples("train", B * N, 0))
    engine = make_engine("vllm", model, tok, engine_dtype="auto", threads=args.threads, verbose=False)
    respo = RespoEngine(model, tok, dtype="float32")
    indices = list(range(B * N))
    try:
        syncs = [engine.sync_weights(model) for _ in range(1 + args.repeats)][1:]
        batches = {}

        def sampler(name, eng):
            def run():
                batches[name], _ = sample_rollout(eng, task, pool, indices, Sampling.of(cfg["float32"]),
                                                  torch.Generator().manual_seed(0), 0)
            return run

        with torch.no_grad():
            sample_s = side_by_side({"respo": sampler("respo", respo), "vllm": sampler("vllm", engine)}, args.repeats)
    finally:
        engine.close()
    batch = batches["vllm"]  # what the faster runtime trains on; both dtypes score and train the same rows
    S = B * G
    lp = {}
    forward = {d: Forward.of(c) for d, c in cfg.items()}

    def scorer(d):
        def run():
            lp[d] = recompute_logp(model, batch, forward[d], mini_batch=S, start_row=S)
        return run

    old_s = side_by_side({"float32": scorer("float32"), "bfloat16": scorer("bfloat16")}, args.repeats)
    mask = batch.mask[S:]  # (S', T) the stale mini-batches' tokens
    seq = ((lp["bfloat16"] - lp["float32"])[S:] * mask).sum(1)  # (S',) bf16 - fp32 sequence log-ratio
    tok_diff = ((lp["bfloat16"] - lp["float32"])[S:].abs() * mask).sum() / mask.sum()
    mb = dataclasses.replace(batch.rows(S, 2 * S), old_logp=lp["float32"][S:2 * S],
                             adv=group_advantages(batch.rewards[S:2 * S], G, kind="grpo"))
    learner = copy.deepcopy(model)
    opt, sched = make_optimizer(learner, cfg["float32"])
    objective = run_objective(cfg["float32"])
    settings = {d: UpdateSettings.of(c, objective) for d, c in cfg.items()}

    def trainer(d):
        def run():
            update_step(learner, opt, sched, mb, settings[d], on_policy=False, version=1)
        return run

    train_s = side_by_side({"float32": trainer("float32"), "bfloat16": trainer("bfloat16")}, args.repeats)
    # log W of one stale mini-batch after the learner's 2 x (1 + repeats) updates, computed in each dtype:
    # what the bfloat16 rounding adds to a log W that the staleness itself spreads
    rows = batch.rows(0, 2 * S)
    log_w = {d: recompute_logp(learner, rows, forward[d], mini_batch=S, start_row=S)[S:] - lp[d][S:2 * S]
             for d in cfg}  # (S, T)
    m = mask[:S]
    lw_seq = {d: (w * m).sum(1) for d, w in log_w.items()}  # (S,) sequence log W
    sync = statistics.median(syncs)
    before = (sample_s["respo"] + old_s["float32"]) / N + train_s["float32"]
    after = (sample_s["vllm"] + sync + old_s["bfloat16"]) / N + train_s["bfloat16"]
    lengths = {n: float(b.mask.sum(1).mean()) for n, b in batches.items()}
    return {"bench": "update", "start": policy.info.get("weights_sha256", "")[:12], "prompts": B, "group": G, "reuse": N, "max_new_tokens": args.max_new_tokens,
            "threads": args.threads, "mean_response_tokens": {n: round(v, 1) for n, v in lengths.items()},
            "rollout_step_s": {n: round(v, 1) for n, v in sample_s.items()}, "sync_s": round(sync, 3),
            "old_logp_s": {n: round(v, 1) for n, v in old_s.items()}, "train_s": {n: round(v, 1) for n, v in train_s.items()},
            "per_update_respo_float32_s": round(before, 1), "per_update_vllm_bfloat16_s": round(after, 1),
            "per_update_vllm_float32_s": round((sample_s["vllm"] + sync + old_s["float32"]) / N + train_s["float32"], 1),
            "update_cheaper": round(before / after, 3),
            "bf16_minus_f32_logp": {"token_mean_abs": round(float(tok_diff), 4), "seq_sd": round(float(seq.std()), 4),
                                    "seq_max_abs": round(float(seq.abs().max()), 4)},
            "log_w_after_updates": {"updates": 2 * (1 + args.repeats), "lr": cfg["float32"].lr,
                                    "rows_with_advantage": int((mb.adv != 0).sum()),
                                    "float32_seq_sd": round(float(lw_seq["float32"].std()), 4),
                                    "float32_seq_p10": round(float(lw_seq["float32"].quantile(0.1)), 4),
                                    "bf16_error_seq_sd": round(float((lw_seq["bfloat16"] - lw_seq["float32"]).std()), 4),
                                    "bf16_error_seq_max_abs": round(float((lw_seq["bfloat16"] - lw_seq["float32"]).abs().max()), 4)}}


def _peak_child(conn, cache_dir: str, batch_path: str, side: str, budget: int, share: bool, group: int) -> None:
    """In a fresh process: the peak resident memory (MiB) one ``old_logp`` recompute and one training step of
    ``side`` each add above the memory in use before it (the kernel's high-water mark, reset first), sent back on
    ``conn``."""
    from respo.train.config import Forward, TrainConfig
    from respo.train.policy import load_run_policy
    from respo.train.rollout import recompute_logp
    from respo.train.update import UpdateSettings, make_optimizer, update_step

    torch.set_num_threads(1)
    logprobs.LOGITS_BUDGET = budget
    stale = torch.load(batch_path, weights_only=False)  # written by this benchmark a moment ago
    cfg = TrainConfig(model=MODEL, task="worded_addition", warm_start=True, cache_dir=cache_dir, objective="respo",
                      prompts=stale.size // group, group_size=group, reuse=8, micro_batch=8, lr=1e-6, warmup=0,
                      weight_decay=0.0, max_new_tokens=160, share_prompts=share)
    model = load_run_policy(cfg).model
    model.train()
    opt, sched = make_optimizer(model, cfg)
    forward, settings = Forward.of(cfg), UpdateSettings.of(cfg)

    def status(field: str) -> float:  # MiB, from /proc/self/status (VmRSS: now; VmHWM: the peak since a reset)
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
        raise SystemExit(f"prefix: /proc/self/status has no {field}")

    def reset_peak() -> float:  # writing 5 to clear_refs resets VmHWM to the current RSS (Linux)
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return status("VmRSS")

    out = {}
    for name, work in (("old_logp", lambda: recompute_logp(model, stale, forward, mini_batch=cfg.mini_batch_seqs)),
                       ("train", lambda: update_step(model, opt, sched, stale, settings, version=1))):
        before = reset_peak()
        work()
        out[name] = status("VmHWM") - before
    conn.send(out)
    conn.close()


def _peak_rss(cache_dir: str, batch, side: str, budget: int, share: bool, group: int) -> dict[str, float]:
    import multiprocessing as mp
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/batch.pt"
        torch.save(batch, path)
        ctx = mp.get_context("spawn")
        here, there = ctx.Pipe()
        proc = ctx.Process(target=_peak_child, args=(there, cache_dir, path, side, budget, share, group))
        proc.start()
        there.close()  # only the child writes: its death ends recv() with EOFError instead of a wait forever
        try:
            out = here.recv()
        except EOFError:
            proc.join()
            raise SystemExit(f"prefix: the memory measurement's process for {side!r} died (exit code {proc.exitcode})")
        proc.join()
    return out


def _forward_tokens(batch, cfg, shared: bool) -> dict[str, int]:
    """Tokens the forwards of one mini-batch compute: prompt and response columns (padding included) and the
    real response tokens, over the micro-batches ``cfg`` cuts."""
    from respo.runtime.logprobs import prompt_groups, response_pieces
    from respo.train.config import MicroBatching
    from respo.train.forward import micro_batches

    prompt = response = 0
    for i, j in micro_batches(batch.mask, batch.response_start, MicroBatching.of(cfg)):
        mb = batch.rows(i, j).trimmed()
        share = prompt_groups(mb.input_ids, mb.attention_mask, mb.response_start) if shared else None
        prompt += (j - i if share is None else len(share[0])) * mb.response_start
        pieces = response_pieces(mb.mask.sum(1)) if share is not None else [(range(j - i), mb.mask.shape[1])]
        response += sum(len(rows) * t for rows, t in pieces)
    return {"prompt_columns": prompt, "response_columns": response, "response_tokens": int(batch.mask.sum())}


def bench_prefix(args) -> dict:
    from respo.core import group_advantages
    from respo.runtime.chat import render_for
    from respo.runtime.engines import make_engine
    from respo.train.config import Forward, Sampling, TrainConfig
    from respo.train.policy import load_run_policy
    from respo.train.rollout import recompute_logp, sample_rollout
    from respo.train.update import UpdateSettings, make_optimizer, run_objective, update_step

    B, G, N = args.prompts, args.group, args.reuse
    base = dict(model=MODEL, task="worded_addition", warm_start=True, cache_dir=args.cache_dir, objective="respo",
                prompts=B, group_size=G, reuse=N, micro_batch=8, lr=1e-6, warmup=0, weight_decay=0.0,
                max_new_tokens=args.max_new_tokens)
    cfg = {"today": TrainConfig(**base, share_prompts=False), "fast": TrainConfig(**base, share_prompts=True)}
    budget = {"today": 1 << 24, "fast": logprobs.LOGITS_BUDGET}
    policy = load_run_policy(cfg["fast"])  # the study's starting policy: the warm start (built if not cached)
    model, tok = policy.model, policy.tokenizer
    model.train()
    task = get_task("worded_addition")
    task, pool = render_for(tok, "auto", task, task.examples("train", 2 * B, 0))
    engine = make_engine("vllm", model, tok, engine_dtype="auto", threads=args.threads, verbose=False)
    try:
        engine.sync_weights(model)
        t0 = time.perf_counter()
        sync = engine.sync_weights(model)
        sync_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        with torch.no_grad():
            batch, _ = sample_rollout(engine, task, pool, list(range(2 * B)), Sampling.of(cfg["fast"]),
                                      torch.Generator().manual_seed(0), 0)
        sample_s = (time.perf_counter() - t0) * N / 2  # a rollout step samples N mini-batches; this sampled 2
        engine_dtype = engine.info.get("dtype")
    finally:
        engine.close()
    S = B * G
    stale = batch.rows(S, 2 * S)  # the mini-batch that is recomputed
    lp = {}

    def with_budget(side, fn):
        default = logprobs.LOGITS_BUDGET
        logprobs.LOGITS_BUDGET = budget[side]
        try:
            return fn()
        finally:
            logprobs.LOGITS_BUDGET = default

    def scorer(side):
        forward = Forward.of(cfg[side])

        def run():
            lp[side] = with_budget(side, lambda: recompute_logp(model, stale, forward, mini_batch=S))
        return run

    old_s = side_by_side({"today": scorer("today"), "fast": scorer("fast")}, args.repeats)
    mb = dataclasses.replace(stale, old_logp=lp["today"], adv=group_advantages(stale.rewards, G, kind="grpo"))
    learners = {side: copy.deepcopy(model) for side in cfg}
    opts = {side: make_optimizer(learners[side], cfg[side]) for side in cfg}
    objective = run_objective(cfg["fast"])

    def trainer(side):
        settings = UpdateSettings.of(cfg[side], objective)

        def run():
            with_budget(side, lambda: update_step(learners[side], *opts[side], mb, settings, version=1))
        return run

    train_s = side_by_side({"today": trainer("today"), "fast": trainer("fast")}, args.repeats)
    mb_mem = dataclasses.replace(mb, old_logp=lp["today"])
    mem = {side: _peak_rss(args.cache_dir, mb_mem, side, budget[side], side == "fast", G) for side in cfg}
    tokens = {side: _forward_tokens(stale, cfg[side], side == "fast") for side in cfg}
    # the floor: float32 FLOPs of the distinct tokens (each prompt once, no padding) at the measured matmul peak
    V, D = model.get_output_embeddings().weight.shape
    body = sum(p.numel() for p in model.parameters()) - V * D  # tied embeddings: the output layer is the embedding
    n_prompts = len({bytes(r.numpy()) for r in stale.input_ids[:, :stale.response_start]})
    distinct = n_prompts * stale.response_start + tokens["fast"]["response_tokens"]  # about: prompts' pads included
    peak = matmul_peak(torch.float32)
    train_flop = 6 * body * distinct + 6 * V * D * tokens["fast"]["response_tokens"]
    floor_train = train_flop / (peak * 1e9)
    floor_old = train_flop / 3 / (peak * 1e9)
    per_update = {side: (sample_s + sync_s + (N - 1) * old_s[side]) / N + train_s[side] for side in cfg}
    dlogp = float(((lp["fast"] - lp["today"]).abs() * stale.mask).max())
    return {"bench": "prefix", "start": policy.info.get("weights_sha256", "")[:12], "prompts": B, "group": G, "reuse": N,
            "max_new_tokens": args.max_new_tokens, "threads": args.threads, "repeats": args.repeats,
            "engine_dtype": engine_dtype, "mean_response_tokens": round(float(stale.mask.sum(1).mean()), 1),
            "prompt_columns": stale.response_start, "tokens": tokens,
            "old_logp_s": {k: round(v, 2) for k, v in old_s.items()}, "old_logp_faster": round(old_s["today"] / old_s["fast"], 3),
            "train_s": {k: round(v, 2) for k, v in train_s.items()}, "train_faster": round(train_s["today"] / train_s["fast"], 3),
            "peak_rss_mib": {side: {k: round(v) for k, v in m.items()} for side, m in mem.items()},
            "rollout_step_s": round(sample_s, 1), "sync_s": round(sync_s, 3),
            "per_update_s": {k: round(v, 1) for k, v in per_update.items()},
            "update_faster": round(per_update["today"] / per_update["fast"], 3),
            "matmul_peak_gflop_s": round(peak, 1), "floor_train_s": round(floor_train, 2), "floor_old_logp_s": round(floor_old, 2),
            "fast_train_of_floor": round(floor_train / train_s["fast"], 3),
            "fast_train_tok_s": round(tokens["fast"]["response_tokens"] / train_s["fast"], 1),
            "max_abs_dlogp": dlogp}


def bench_engine_dtypes(args) -> dict:
    from respo.core.mismatch import mismatch_metrics
    from respo.runtime.chat import render_for
    from respo.runtime.engines import make_engine
    from respo.train.config import Forward, Sampling, TrainConfig
    from respo.train.policy import load_run_policy
    from respo.train.rollout import recompute_logp, sample_rollout

    B, G = args.prompts, args.group
    cfg = TrainConfig(model=MODEL, task="worded_addition", warm_start=True, cache_dir=args.cache_dir, prompts=B,
                      group_size=G, micro_batch=8, max_new_tokens=args.max_new_tokens)
    policy = load_run_policy(cfg)  # the study's starting policy
    model, tok = policy.model, policy.tokenizer
    model.train()  # as the trainer holds it
    task = get_task("worded_addition")
    task, pool = render_for(tok, "auto", task, task.examples("train", B, 0))
    dtypes = ("bfloat16", "float32")
    times, tokens, batches = {d: [] for d in dtypes}, {d: [] for d in dtypes}, {}
    for r in range(args.repeats):
        for d in dtypes if r % 2 == 0 else dtypes[::-1]:
            engine = make_engine("vllm", model, tok, engine_dtype=d, threads=args.threads, verbose=False)
            try:
                engine.sync_weights(model)
                with torch.no_grad():
                    for timed in (False, True):  # a full-size warm-up, then the timed rollout (the same draws)
                        t0 = time.perf_counter()
                        batch, _ = sample_rollout(engine, task, pool, list(range(B)), Sampling.of(cfg),
                                                  torch.Generator().manual_seed(r), 0)
                        if timed:
                            times[d].append(time.perf_counter() - t0)
                            tokens[d].append(float(batch.mask.sum()))
            finally:
                engine.close()
            batches.setdefault(d, batch)
    out = {"bench": "engine_dtypes", "start": policy.info.get("weights_sha256", "")[:12], "prompts": B, "group": G,
           "max_new_tokens": args.max_new_tokens, "threads": args.threads, "repeats": args.repeats}
    for d in dtypes:
        batch = batches[d]  # the first round's rollout of this dtype, scored by the float32 trainer
        mm = mismatch_metrics(recompute_logp(model, batch, Forward.of(cfg), mini_batch=cfg.mini_batch_seqs),
                              batch.behaviour_logp, batch.mask)
        out[d] = {"tok_s": round(statistics.median(t / s for t, s in zip(tokens[d], times[d])), 1),
                  "mean_response_tokens": round(float(batch.mask.sum(1).mean()), 1),
                  **{k.split("/", 1)[-1]: round(float(mm[k]), 4) for k in
                     ("rollout_corr/abs_diff", "rollout_corr/seq_log_ratio_p10", "rollout_corr/seq_log_ratio_p90",
                      "rollout_corr/seq_frac_beyond_1")}}
    out["bfloat16_over_float32_speed"] = round(out["bfloat16"]["tok_s"] / out["float32"]["tok_s"], 3)
    return out


SCHEDULES = ("sync", "async", "partial")


def _schedule_config(args, name: str) -> dict:
    """One schedule's settings: sync on-policy (N = 1), async with whole responses, async with partial rollouts
    (``--segment-tokens``); the rest shared. ``--model tiny-dense`` runs the tiny preset from random weights on
    the addition task (the path a machine without room for SmolLM2 can run; its timings are not SmolLM2's)."""
    tiny = args.model != MODEL
    base = dict(model=args.model, task="addition" if tiny else "worded_addition", warm_start=not tiny,
                cache_dir=args.cache_dir, objective="respo", prompts=args.prompts, group_size=args.group, reuse=1,
                micro_batch=8, lr=1e-4 if tiny else 1e-6, warmup=0, weight_decay=0.0,
                max_new_tokens=args.max_new_tokens, rollout_engine=args.engine, engine_dtype="auto",
                engine_threads=args.threads, threads=args.threads, updates=args.updates, eval_prompts=0,
                checkpoint_every=0, progress=False, tensorboard=False, sft_kwargs=json.loads(args.sft_kwargs))
    if tiny:
        base["task_kwargs"] = {"overlong": [args.max_new_tokens, args.max_new_tokens - 1]}
    if name == "sync":
        return {**base, "mode": "sync"}
    return {**base, "mode": "async", "segment_tokens": args.segment_tokens if name == "partial" else 0}


def bench_schedules(args) -> dict:
    """The three schedules on one engine: sync on-policy (N = 1: sample, then train), the bounded asynchronous
    mode with whole responses (the engine samples the next batch, and the worker scores its ``old_logp``, while
    the learner trains) and with partial rollouts (the worker takes published weights between segments of
    ``--segment-tokens``), ``--updates`` updates each; per update = the mean ``time/update`` (the learner's
    wall time, waits included) over all but the first update, which is the warm-up. The staleness each
    reaches is per token (mean and max over the measured updates, the share of responses spanning several
    versions); medians over ``--repeats`` runs per schedule, the schedules in alternating order."""
    import os
    import tempfile
    import warnings

    from respo.train.config import TrainConfig
    from respo.train.trainer import train
    from timing import order

    per = {n: [] for n in SCHEDULES}
    phases = {n: {} for n in SCHEDULES}
    stale = {n: {"mean": [], "max": [], "mixed": []} for n in SCHEDULES}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name in order(SCHEDULES, r):
                with warnings.catch_warnings():  # a run's per-metric notes (e.g. no positive rows): not the benchmark's
                    warnings.simplefilter("ignore")
                    run = train(TrainConfig(**_schedule_config(args, name), out_dir=f"{tmp}/{name}-{r}"))
                recs = [json.loads(line) for line in open(run / "metrics.jsonl") if '"event"' not in line][1:]
                per[name].append(statistics.fmean(rec["time/update"] for rec in recs))
                for rec in recs:
                    for k, v in rec.items():
                        if k.startswith("time/") and k != "time/update" and v is not None:
                            phases[name].setdefault(k, []).append(v)
                stale[name]["mean"].append(statistics.fmean(rec["staleness_mean"] for rec in recs))
                stale[name]["max"].append(max(rec["staleness_max"] for rec in recs))
                stale[name]["mixed"].append(statistics.fmean(rec["staleness/mixed"] for rec in recs))
    med = {n: statistics.median(v) for n, v in per.items()}
    return {"bench": "schedules", "model": args.model, "engine": args.engine, "prompts": args.prompts,
            "group": args.group, "max_new_tokens": args.max_new_tokens, "segment_tokens": args.segment_tokens,
            "updates_measured": args.updates - 1, "repeats": args.repeats, "threads": args.threads,
            "cores": len(os.sched_getaffinity(0)), "per_update_s": {n: round(v, 3) for n, v in med.items()},
            "sync_over_async": round(med["sync"] / med["async"], 3),
            "sync_over_partial": round(med["sync"] / med["partial"], 3),
            "async_over_partial": round(med["async"] / med["partial"], 3),
            "staleness_mean": {n: round(statistics.median(v["mean"]), 3) for n, v in stale.items()},
            "staleness_max": {n: max(v["max"]) for n, v in stale.items()},
            "mixed_responses": {n: round(statistics.median(v["mixed"]), 3) for n, v in stale.items()},
            "phase_mean_s": {n: {k: round(statistics.fmean(v), 3) for k, v in sorted(p.items())}
                             for n, p in phases.items()}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--seq", type=int, default=192)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cache-dir", default=".cache/respo")
    ap.add_argument("--only", default="sample,train,logits",
                    help="any of sample,train,logits,engines,update,schedules,engine-dtypes,prefix")
    ap.add_argument("--prompts", type=int, default=4, help="update: prompts per update (B)")
    ap.add_argument("--group", type=int, default=8, help="update: responses per prompt (G)")
    ap.add_argument("--reuse", type=int, default=8, help="update: updates per rollout step (N)")
    ap.add_argument("--max-new-tokens", type=int, default=160, help="update: response length cap")
    ap.add_argument("--updates", type=int, default=3, help="schedules: updates per run (the first is the warm-up)")
    ap.add_argument("--segment-tokens", type=int, default=32, help="schedules: the partial rollouts' segment length")
    ap.add_argument("--model", default=MODEL, choices=(MODEL, "tiny-dense"),
                    help="schedules: the policy (tiny-dense: the tiny preset from random weights, on addition)")
    ap.add_argument("--engine", default="vllm", choices=("vllm", "respo"), help="schedules: the rollout engine")
    ap.add_argument("--sft-kwargs", default="{}",
                    help='schedules: the warm start\'s settings as JSON (e.g. \'{"dtype": "float32"}\' names the warm '
                         'start built with a float32 SFT)')
    args = ap.parse_args(argv)
    check_repeats(args.repeats)
    if args.updates < 2:
        raise SystemExit(f"--updates must be >= 2 (the first update of each run is its warm-up), got {args.updates}")
    if args.segment_tokens < 1:
        raise SystemExit(f"--segment-tokens must be >= 1, got {args.segment_tokens}")
    if args.model != MODEL and args.only != "schedules":
        raise SystemExit(f"--model {args.model} applies to --only schedules; the other benchmarks measure {MODEL}")
    torch.set_num_threads(args.threads)
    if args.only == "schedules":  # the runs load their own policy
        print(json.dumps(bench_schedules(args)), flush=True)
        return
    model, tok = load_pretrained(resolve_packaged(MODEL, args.cache_dir))
    runs = {"sample": lambda: bench_sample(model, tok, args), "train": lambda: bench_train(model, args),
            "logits": lambda: bench_logits(model, args), "engines": lambda: bench_engines(model, tok, args),
            "update": lambda: bench_update(args), "schedules": lambda: bench_schedules(args),
            "engine-dtypes": lambda: bench_engine_dtypes(args), "prefix": lambda: bench_prefix(args)}
    unknown = [n for n in args.only.split(",") if n not in runs]
    if unknown:
        raise SystemExit(f"--only: unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(runs)}")
    for name in args.only.split(","):
        print(json.dumps({"model": MODEL, **runs[name]()}), flush=True)


if __name__ == "__main__":
    main()
