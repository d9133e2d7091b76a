"""Write verl/DAPO-format parquet files for the launch recipe in ``examples/verl``.

One row per prompt, the columns verl's ``RLHFDataset`` and its default reward function read:

    data_source   "math_dapo"  -> verl scores with ``verl.utils.reward_score.math_dapo``:
                                   +1 for a correct final answer, -1 otherwise (the paper's DAPO setup)
    prompt        [{"role": "user", "content": <DAPO prompt around the problem>}]
    ability       "MATH"
    reward_model  {"style": "rule-lighteval/MATH_v2", "ground_truth": <answer>}
    extra_info    {"index": i, "split": "train" | "test"}

Sources: a local JSONL file (one object per line with a problem and an answer field), or a
procedurally generated arithmetic set for smoke tests (no download).

Usage::

    python -m respo.integrations.verl.prepare_data --jsonl dapo_math_17k.jsonl --out-dir data/dapo
    python -m respo.integrations.verl.prepare_data --arithmetic 2048 --out-dir data/arith
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

DATA_SOURCE = "math_dapo"
REWARD_STYLE = "rule-lighteval/MATH_v2"
# The DAPO-Math-17k prompt: verl's math_dapo scorer reads the line after "Answer:".
PROMPT_TEMPLATE = (
    "Solve the following math problem step by step. The last line of your response should be of the "
    "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
    "{problem}\n\nRemember to put your answer on its own line after \"Answer:\"."
)


def dapo_row(problem: str, answer: str, index: int, split: str) -> dict:
    """One verl/DAPO row for ``problem`` with reference ``answer``."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": PROMPT_TEMPLATE.format(problem=problem.strip())}],
        "ability": "MATH",
        "reward_model": {"style": REWARD_STYLE, "ground_truth": str(answer).strip()},
        "extra_info": {"index": index, "split": split},
    }


def read_jsonl(path: str | Path, problem_key: str = "problem", answer_key: str = "answer") -> list[tuple[str, str]]:
    """(problem, answer) pairs from a JSONL file; raises naming the lines that lack a field."""
    pairs, bad = [], []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            obj = json.loads(line)
            if problem_key not in obj or answer_key not in obj:
                bad.append(lineno)
                continue
            pairs.append((str(obj[problem_key]), str(obj[answer_key])))
    if bad:
        raise ValueError(
            f"{path}: {len(bad)} line(s) lack '{problem_key}' or '{answer_key}' (first: line {bad[0]}); "
            "pass --problem-key/--answer-key to name the fields"
        )
    if not pairs:
        raise ValueError(f"{path}: no examples")
    return pairs


def arithmetic_pairs(n: int, *, digits: int = 3, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` distinct addition problems 'What is a + b?' with a, b of ``digits`` digits."""
    rng = random.Random(seed)
    lo, hi = 10 ** (digits - 1), 10**digits - 1
    if n > (hi - lo + 1) ** 2:
        raise ValueError(f"only {(hi - lo + 1) ** 2} distinct {digits}-digit additions exist, asked for {n}")
    seen, pairs = set(), []
    while len(pairs) < n:
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        if (a, b) in seen:
            continue
        seen.add((a, b))
        pairs.append((f"What is {a} + {b}?", str(a + b)))
    return pairs


def write_parquet(pairs: list[tuple[str, str]], out_dir: str | Path, *, test_size: int, seed: int = 0) -> dict:
    """Shuffle ``pairs``, hold out ``test_size`` as test.parquet, write the rest as train.parquet."""
    import pandas as pd

    if not 0 <= test_size < len(pairs):
        raise ValueError(f"test_size must be in [0, {len(pairs)}), got {test_size}")
    pairs = list(pairs)
    random.Random(seed).shuffle(pairs)
    splits = {"test": pairs[:test_size], "train": pairs[test_size:]}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, rows in splits.items():
        path = out_dir / f"{split}.parquet"
        frame = pd.DataFrame([dapo_row(p, a, i, split) for i, (p, a) in enumerate(rows)])
        frame.to_parquet(path, index=False)
        paths[split] = str(path)
    return paths


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--jsonl", help="local JSONL file with one problem per line")
    source.add_argument("--arithmetic", type=int, metavar="N", help="generate N addition problems")
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--problem-key", default="problem")
    parser.add_argument("--answer-key", default="answer")
    parser.add_argument("--digits", type=int, default=3)
    parser.add_argument("--test-size", type=int, default=None, help="held-out rows (default: 5%%, at most 512)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    if args.jsonl:
        pairs = read_jsonl(args.jsonl, args.problem_key, args.answer_key)
    else:
        pairs = arithmetic_pairs(args.arithmetic, digits=args.digits, seed=args.seed)
    test_size = args.test_size if args.test_size is not None else min(512, max(1, len(pairs) // 20))
    paths = write_parquet(pairs, args.out_dir, test_size=test_size, seed=args.seed)
    print(json.dumps({"train": paths["train"], "test": paths["test"], "rows": len(pairs), "test_rows": test_size}))
    return paths


if __name__ == "__main__":
    main()
