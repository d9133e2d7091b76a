"""Write reports/real/warm_start.json: the cached warm start's own record plus the command that built it.

    python reports/real/record_warm_start.py CACHE_DIR/smollm2-135m-instruct-worded_addition-<hash> > reports/real/warm_start.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

COMMAND = "python -m respo sft --model smollm2-135m-instruct --task worded_addition --threads 1"


def record(path: Path) -> dict:
    info = json.loads((path / "respo_warm_start.json").read_text())
    history = info["history"]
    return {
        "command": COMMAND,
        "model": info["config"]["model"], "task": info["config"]["task"], "task_kwargs": info["config"]["task_kwargs"],
        "settings_key": info["key"],
        "how": "SFT on the task's natural-language worked solutions through the chat template, loss on the response "
               "tokens (EOS included), AdamW, bfloat16 autocast; stopped once the sampled pass rate on held-out "
               "prompts reached the target",
        "before": info["before"],
        "steps": info["steps"], "stopped_by": info["stopped_by"], "train_seconds": info["train_seconds"],
        "train_tokens": info["train_tokens"], "final_eval_seconds": info["final_eval_seconds"],
        "torch_threads": info["torch_threads"],
        "pass_rate": info["pass_rate"], "pass_rate_measured_on": info["pass_rate_measured_on"],
        "mean_response_tokens": info["mean_response_tokens"], "cut_share": info["cut_share"],
        "in_band_0.15_0.6": info["in_band"],
        "history": history, "example_responses": info["example_responses"], "config": info["config"],
    }


if __name__ == "__main__":
    print(json.dumps(record(Path(sys.argv[1])), indent=1))
