"""``respo sweep`` checks the whole grid before anything is written, in a dry run and a real sweep alike, and
says in one line (exit 2) what cannot run; ``--out`` naming a file is "not a directory"."""

import json

import pytest

from respo.cli import main

QUICK = ["--preset", "quick", "--updates", "1", "--no-prewarm"]


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("respo sweep: error:"), captured
    assert "[sweep]" not in captured.out  # no plan printed
    return err[0]


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "real"])
@pytest.mark.parametrize("flags, said", [
    (["--objectives", "respo,grpoo"], "objective 'grpoo' is unknown"),
    (["--reuse", "0"], "reuse (N, mini-batches per rollout step) must be >= 1, got 0"),
    (["--jobs", "0"], "--jobs must be >= 1, got 0"),
    (["--threads", "0"], "--threads must be >= 1, got 0"),
    (["--set", "lrr=1e-4"], "unknown config field 'lrr'"),
    (["--set", "eval_k=0"], "eval_k must be >= 1, got 0"),
    (["--objectives", "respo", "--set", 'objective_kwargs={"tau": 1}'], "objective 'respo' has no hyperparameter(s) tau"),
])
def test_a_grid_that_cannot_run_is_refused_before_anything_is_written(tmp_path, capsys, flags, said, dry):
    out = tmp_path / "sweep"
    rc = main(["sweep", "--out", str(out), *QUICK, *flags, *(["--dry-run"] if dry else [])])
    line = _one_error_line(capsys)
    assert rc == 2 and said in line, line
    assert not out.exists()  # no sweep.json listing runs that never ran, no run directory


def test_only_the_runs_with_a_problem_are_named_with_their_count(tmp_path, capsys):
    # grpoo is one of the 2 objectives of the grid: 1 of its 2 runs is named
    assert main(["sweep", "--out", str(tmp_path / "s"), *QUICK, "--objectives", "grpo,grpoo", "--dry-run"]) == 2
    line = _one_error_line(capsys)
    assert "1 of the 2 run(s), e.g. tiny-dense_grpoo_N4_G4_lr3e-05_s0_u1: " in line, line


def test_an_existing_sweep_keeps_its_manifest_when_a_new_invocation_is_refused(tmp_path, capsys):
    out = tmp_path / "sweep"
    out.mkdir()
    manifest = json.dumps({"invocations": [], "runs": {}})
    (out / "sweep.json").write_text(manifest)
    assert main(["sweep", "--out", str(out), *QUICK, "--set", "lrr=1e-4"]) == 2
    _one_error_line(capsys)
    assert (out / "sweep.json").read_text() == manifest and sorted(p.name for p in out.iterdir()) == ["sweep.json"]


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "real"])
def test_sweep_out_naming_a_file_is_not_a_directory(tmp_path, capsys, dry):
    f = tmp_path / "file"
    f.write_text("x")
    for out in (f, f / "below"):
        assert main(["sweep", "--out", str(out), *QUICK, *(["--dry-run"] if dry else [])]) == 2
        line = _one_error_line(capsys)
        assert "is not a directory" in line and "--out" in line, line
    assert f.read_text() == "x"


def test_a_valid_grid_still_plans_in_a_dry_run(tmp_path, capsys):
    assert main(["sweep", "--out", str(tmp_path / "s"), *QUICK, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "[sweep] 2 runs, 0 already finished, 2 to run" in out and not (tmp_path / "s").exists()


def test_report_out_naming_a_file_is_not_a_directory(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"objective": "grpo", "reuse": 1, "lr": 1e-4, "seed": 0}))
    f = tmp_path / "file"
    f.write_text("x")
    for out in (f, f / "below"):
        assert main(["report", str(run), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("respo report: error:") and "is not a directory" in err[0], err
    assert f.read_text() == "x"
