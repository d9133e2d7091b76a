"""Shared helpers of the CLI-level tests: a smoke-sized `respo train` and checks of what it printed."""

import json
from pathlib import Path

from respo.cli import main

TINY = ["--warm-start", "false", "--threads", "1", "--prompts", "2", "--group-size", "4", "--max-new-tokens", "8",
        "--eval-prompts", "4", "--eval-k", "2", "--progress", "false", "--tensorboard", "false",
        "--task-kwargs", '{"overlong": [8, 7]}', "--lr", "1e-3", "--warmup", "1"]


def train_cli(run, *extra) -> int:
    """`respo train` with smoke-sized settings into ``run``; the exit status."""
    return main(["train", *TINY, "--out-dir", str(run), *extra])


def records(run) -> list[dict]:
    return [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines()]


def one_error_line(err: str, command: str) -> str:
    """The last line of ``err``, checked to be `respo <command>: error: ...` with no traceback anywhere."""
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert lines, "no error message"
    assert lines[-1].startswith(f"respo {command}: error: "), err
    assert "Traceback" not in err, err
    return lines[-1]
