"""Speed of a real 135 M-parameter model (SmolLM2-135M-Instruct, packaged) on this machine, side by side.

Three comparisons, each printed as one JSON line with both sides' medians and their ratio:

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

Every side is warmed up once at full size; then ``--repeats`` rounds alternate which side goes first;
medians are reported.

    .venv/bin/python benchmarks/bench_real.py [--threads 1] [--batch 16] [--new-tokens 64]
        [--rows 8] [--seq 192] [--repeats 3] [--cache-dir .cache/respo] [--only sample,train,logits]
"""

from __future__ import annotations

import argparse
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


def bench_sample(model, tok, args) -> dict:
    task = get_task("worded_addition")
    prompts = [render_prompt(tok, ex.prompt, task.answer_format) for ex in task.examples("test", args.batch, 0)]
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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--seq", type=int, default=192)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cache-dir", default=".cache/respo")
    ap.add_argument("--only", default="sample,train,logits")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tok = load_pretrained(resolve_packaged(MODEL, args.cache_dir))
    runs = {"sample": lambda: bench_sample(model, tok, args), "train": lambda: bench_train(model, args),
            "logits": lambda: bench_logits(model, args)}
    for name in args.only.split(","):
        print(json.dumps({"model": MODEL, **runs[name]()}), flush=True)


if __name__ == "__main__":
    main()
