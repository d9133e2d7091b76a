"""Sampler throughput against ``model.generate(output_scores=True)``, side by side in one process.

Both decode the same model, prompts and number of steps (EOS ignored by both, so every row
runs ``--new-tokens`` steps and the work is identical), at temperature 1, top-p 1, top-k off,
and both deliver behaviour log-probs: for ``generate`` they are computed from its returned
scores (``log_softmax(score).gather(token)``), as a trainer would have to. The timing is
`timing.time_sides`: every side (method x dtype) is warmed up once at the full size, the sides
alternate their order from repeat to repeat, and the figure of merit is the ratio of median
tokens/s over ``--repeats`` (default 3; fewer print a warning line). Prints one JSON line per
(preset, batch, new tokens, dtype, method), a ratio line sampler/generate per dtype and, with two
dtypes, a ratio line bfloat16/float32 per method.

    .venv/bin/python benchmarks/bench_sampler.py [--presets tiny-dense tiny-moe] [--batch 64 256]
        [--new-tokens 32 256 512 1024] [--repeats 3] [--threads 1] [--dtype float32 [bfloat16]]

A quick look (not a figure to quote): ``--presets tiny-dense --batch 16 --new-tokens 32 --repeats 1``.
"""

from __future__ import annotations

import argparse
import json

import torch
from timing import check_repeats, median, time_sides

from respo.runtime.models import PRESETS, build_policy
from respo.runtime.precision import mixed_precision, resolve_device
from respo.runtime.sampler import sample
from respo.runtime.tasks import get_task
from respo.runtime.tokenizer import build_char_tokenizer


def run_generate(model, tok, prompts, new_tokens, seed):
    enc = tok(prompts, padding=True, return_tensors="pt", padding_side="left").to(model.device)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            **enc,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=tok.pad_token_id,
        )
        scores = torch.stack(out.scores, dim=1).float()  # (B, T, V)
        new = out.sequences[:, enc["input_ids"].shape[1] :]  # (B, T)
        logp = torch.log_softmax(scores, -1).gather(-1, new.unsqueeze(-1)).squeeze(-1)  # (B, T)
    return new.numel(), logp


def run_sampler(model, tok, prompts, new_tokens, seed):
    g = torch.Generator(device=model.device).manual_seed(seed)
    ro = sample(model, tok, prompts, max_new_tokens=new_tokens, generator=g, stop_at_eos=False)
    return int(ro.response_mask.sum()), ro.behaviour_logp


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["tiny-dense", "tiny-moe"])
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--new-tokens", type=int, nargs="+", default=[32, 256, 512, 1024])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    ap.add_argument("--dtype", nargs="+", default=["float32"], choices=["float32", "bfloat16"],
                    help="float32 and/or bfloat16 (autocast, float32 output layer); two: both, side by side")
    ap.add_argument("--skip-generate", action="store_true", help="time the sampler only")
    args = ap.parse_args(argv)
    check_repeats(args.repeats)
    device = resolve_device(args.device)
    torch.set_num_threads(args.threads)
    tok = build_char_tokenizer()
    task = get_task("addition", digits=5)
    methods = {"sampler": run_sampler} if args.skip_generate else {"generate": run_generate, "sampler": run_sampler}
    configs = [(p, b, n) for p in args.presets for b in args.batch for n in args.new_tokens]
    for preset, batch, new_tokens in configs:
        prompts = [ex.prompt for ex in task.examples("test", batch, seed=0)]
        positions = max(len(tok(p)["input_ids"]) for p in prompts) + new_tokens
        # RoPE has no table: a longer position range changes no weight and no number, only the config.
        model = build_policy(preset, tok, seed=0, max_position_embeddings=max(positions, PRESETS[preset]["max_position_embeddings"])).to(device)
        # generate() must not stop at EOS either: min_new_tokens suppresses it, and the sampler
        # runs with stop_at_eos=False, so both decode exactly batch x new_tokens tokens.
        counts: dict[tuple[str, str], int] = {}

        def side(name, fn, dtype):
            def call(r):
                with mixed_precision(model, dtype):
                    counts[name, dtype], _ = fn(model, tok, prompts, new_tokens, seed=r)
            return call

        run = {(name, dtype): side(name, fn, dtype) for dtype in args.dtype for name, fn in methods.items()}
        times = time_sides(run, args.repeats, sync=lambda: _sync(device))
        tps = {k: counts[k] / median(v) for k, v in times.items()}
        common = {"preset": preset, "batch": batch, "new_tokens": new_tokens, "threads": args.threads,
                  "repeats": args.repeats, "device": str(device)}
        for (name, dtype), v in times.items():
            print(json.dumps({**common, "method": name, "dtype": dtype, "median_s": round(median(v), 4),
                              "times_s": [round(t, 4) for t in v], "tokens": counts[name, dtype],
                              "tokens_per_s": round(tps[name, dtype], 1)}), flush=True)
        for dtype in args.dtype:
            if ("generate", dtype) in tps:
                print(json.dumps({**common, "dtype": dtype, "ratio_sampler_over_generate":
                                  round(tps["sampler", dtype] / tps["generate", dtype], 3)}), flush=True)
        if len(args.dtype) == 2:
            for name in methods:
                print(json.dumps({**common, "method": name, "ratio_bfloat16_over_float32":
                                  round(tps[name, "bfloat16"] / tps[name, "float32"], 3)}), flush=True)


if __name__ == "__main__":
    main()
