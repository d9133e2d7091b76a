"""scripts/real_gpu_grid.sh and scripts/real_gpu_stage.sh: their syntax, and the grid the GPU script plans.

The GPU script cannot run its real sizes here (one update of the real model costs minutes on this CPU), so
its dry run (DRY_RUN=1: `respo sweep --dry-run` for every sweep, no warm start, no runs) is checked at full
size on the CPU: every planned `respo train` command, counted per cell. `DEVICE=cpu scripts/real_gpu_grid.sh
OUT` runs the same steps for real at smoke size (a few minutes; not a test).
"""

import os
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = [ROOT / "scripts" / "real_gpu_grid.sh", ROOT / "scripts" / "real_gpu_stage.sh"]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_the_scripts_parse(script):
    res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def _flag(cmd: str, name: str) -> str:
    m = re.search(rf"--{name} (\S+)", cmd)
    return m.group(1) if m else ""


@pytest.mark.slow
def test_the_gpu_grid_plans_the_regime_and_the_pilot(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "DEVICE": "cpu", "SIZE": "full", "DRY_RUN": "1", "WORK_DIR": str(work),
           "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("WHEELS", None)
    res = subprocess.run(["bash", str(SCRIPTS[0]), str(out)], capture_output=True, text=True, env=env, timeout=600,
                         cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    cmds = {}
    for log in (work / "logs").glob("*.log"):
        cmds[log.stem] = [line for line in log.read_text().splitlines() if " -m respo train " in line]
    # the regime: GRPO at 4 lrs; each N runs a whole rollout step (N = 1: 32 updates)
    for name, reuse, updates in (("regime_N1", "1", "32"), ("regime_N8", "8", "8"), ("regime_N32", "32", "32")):
        got = cmds[name]
        assert len(got) == 4, (name, got)
        assert {_flag(c, "objective") for c in got} == {"grpo"}
        assert {_flag(c, "reuse") for c in got} == {reuse} and {_flag(c, "updates") for c in got} == {updates}
        assert {_flag(c, "lr") for c in got} == {"1e-06", "3e-06", "1e-05", "3e-05"}
        assert all(_flag(c, "model") == "smollm2-135m-instruct" for c in got)
    # the pilot: 4 objectives (the ablation as the core's reshaped objective) x N {8, 32} x 3 seeds at lr 1e-5
    pilot = cmds["pilot"]
    assert len(pilot) == 24
    names = Counter(Path(_flag(c, "out-dir")).name.split("_")[1] for c in pilot)
    assert names == {"grpo": 6, "vespo": 6, "respo": 6, "respopos.vesponeg": 6}
    assert Counter(_flag(c, "reuse") for c in pilot) == {"8": 12, "32": 12}
    assert Counter(_flag(c, "seed") for c in pilot) == {"0": 8, "1": 8, "2": 8}
    assert {_flag(c, "updates") for c in pilot} == {"64"} and {_flag(c, "lr") for c in pilot} == {"1e-05"}
    # what the device tool brings back: at most 8 files, none deeper than 2 folders
    back = [p for p in out.rglob("*") if p.is_file() and len(p.relative_to(out).parts) <= 3]
    assert [p.name for p in back] == ["summary.txt"]
