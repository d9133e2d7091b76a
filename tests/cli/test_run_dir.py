"""Run directories that cannot be corrupted: refusals, resume, finishing (CLI level, temporary dirs).

Every test here drives `respo.cli.main` the way a user drives `respo ...` and checks what is left on
disk: nothing overwritten, nothing mixed, nothing recorded falsely, one readable line on failure.
"""

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from cli_support import one_error_line, records, train_cli

NOBODY = 65534  # the unprivileged user id the read-only tests run as when run by root


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished 4-update run with checkpoints at 2 and 4."""
    run = tmp_path_factory.mktemp("finished") / "run"
    assert train_cli(run, "--updates", "4", "--checkpoint-every", "2") == 0
    return run


def _copy(run, tmp_path):
    import shutil

    dst = tmp_path / "copy"
    shutil.copytree(run, dst)
    return dst


def test_a_second_run_into_a_used_directory_is_refused(finished_run, tmp_path, capsys):
    run = _copy(finished_run, tmp_path)
    before = (run / "metrics.jsonl").read_bytes()
    capsys.readouterr()
    assert train_cli(run, "--updates", "3") == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert "--resume" in line and "--overwrite" in line
    assert (run / "metrics.jsonl").read_bytes() == before  # nothing touched


def test_overwrite_clears_the_directory_first(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    assert train_cli(run, "--updates", "3", "--checkpoint-every", "1", "--overwrite") == 0
    updates = [r["update"] for r in records(run) if "event" not in r]
    assert updates == [1, 2, 3]
    ckpts = sorted(p.name for p in (run / "ckpt").iterdir())
    assert all("4" not in name for name in ckpts), ckpts  # the old run's update-4 checkpoint is gone
    assert json.loads((run / "summary.json").read_text())["updates"] == 3


def test_resume_refuses_settings_that_change_the_experiment(finished_run, tmp_path, capsys):
    run = _copy(finished_run, tmp_path)
    config_before = (run / "config.json").read_text()
    capsys.readouterr()
    assert train_cli(run, "--resume", "--objective", "grpo", "--objective-kwargs", "{}", "--lr", "1e-2") == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert "objective" in line and "lr" in line
    assert (run / "config.json").read_text() == config_before


def test_resume_may_extend_updates_and_records_the_change(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    assert train_cli(run, "--resume", "--updates", "6", "--checkpoint-every", "2") == 0
    updates = [r["update"] for r in records(run) if "event" not in r]
    assert updates == [1, 2, 3, 4, 5, 6]
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["updates"] == 6
    assert any(change.get("updates") == [4, 6] for change in cfg["resumed"]), cfg["resumed"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["updates"] == 6
    # wall time: the total over every part, and each part on its own
    assert len(summary["wall_s_parts"]) == 2
    assert summary["wall_s"] == pytest.approx(sum(summary["wall_s_parts"]))


def test_extending_a_finished_run_keeps_its_end_until_the_new_one_is_written(finished_run, tmp_path, monkeypatch,
                                                                            capsys):
    # the extension fails right after the run was reopened (here: writing config.json, as on a full disk). The
    # finished run's final/ and summary.json used to be deleted at that point; now they wait in previous-end/
    import respo.train.trainer as trainer

    run = _copy(finished_run, tmp_path)
    summary = (run / "summary.json").read_bytes()
    weights = {p.name: p.read_bytes() for p in (run / "final").iterdir()}

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(trainer, "write_config", full_disk)
    with pytest.raises(OSError):
        train_cli(run, "--resume", "--updates", "6", "--checkpoint-every", "2")
    assert not (run / "summary.json").exists() and not (run / "final").exists()
    assert (run / "previous-end" / "summary.json").read_bytes() == summary
    assert {p.name: p.read_bytes() for p in (run / "previous-end" / "final").iterdir()} == weights
    # a second try that succeeds writes the new end and only then removes the old one
    monkeypatch.undo()
    assert train_cli(run, "--resume", "--updates", "6", "--checkpoint-every", "2") == 0
    assert json.loads((run / "summary.json").read_text())["updates"] == 6 and (run / "final").is_dir()
    assert not (run / "previous-end").exists()


def test_resume_of_a_run_killed_before_its_first_checkpoint_starts_again_and_keeps_its_files(tmp_path, capsys):
    # a preempted job relaunched with --resume: nothing to continue, so a new run starts, and the killed run's
    # files are moved to interrupted-1/, not lost
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"update": 1, "score": 0.5}\n')
    assert train_cli(run, "--resume", "--updates", "2") == 0
    assert "stopped before its first checkpoint" in capsys.readouterr().out
    assert (run / "interrupted-1" / "metrics.jsonl").read_text() == '{"update": 1, "score": 0.5}\n'
    assert [r["update"] for r in records(run) if "event" not in r] == [1, 2]


def test_resume_of_a_finished_run_without_a_checkpoint_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text("{}\n")
    assert train_cli(run, "--resume", "--updates", "2") == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert "finished run" in line and "no checkpoint" in line


def test_resume_in_an_empty_directory_starts_fresh(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    assert train_cli(run, "--resume", "--updates", "2") == 0
    assert [r["update"] for r in records(run) if "event" not in r] == [1, 2]


def test_resume_of_a_finished_run_changes_nothing(finished_run, tmp_path, capsys):
    run = _copy(finished_run, tmp_path)
    files = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert train_cli(run, "--resume", "--updates", "4") == 0
    assert "finished" in capsys.readouterr().out + capsys.readouterr().err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == files


def test_resume_after_a_kill_before_final_does_not_evaluate_twice(finished_run, tmp_path):
    # Killed after the last checkpoint (which holds the final evaluation) but before final/ was written.
    import shutil

    run = _copy(finished_run, tmp_path)
    shutil.rmtree(run / "final")
    (run / "summary.json").unlink()
    assert train_cli(run, "--resume", "--updates", "4") == 0
    evals_at_end = [r for r in records(run) if r.get("event") == "eval" and r["update"] == 4]
    assert len(evals_at_end) == 1
    assert (run / "final").is_dir() and json.loads((run / "summary.json").read_text())["updates"] == 4


def test_nan_metrics_are_counted_and_warned(tmp_path):
    from respo.train.metrics import MetricsLogger

    log = MetricsLogger(tmp_path, tensorboard=False)
    with pytest.warns(UserWarning, match="grad_norm"):
        rec = log.log({"update": 1, "grad_norm": float("nan"), "loss": 0.5})
    log.close()
    assert rec["grad_norm"] is None and rec["nonfinite_metrics"] == 1
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["nonfinite_metrics"] == 1


def test_repeated_prompts_are_said(tmp_path, capsys):
    # 3 mini-batches of 2 prompts per rollout step from a pool of 4 prompts: 2 prompts repeat.
    run = tmp_path / "run"
    assert train_cli(run, "--reuse", "3", "--train-pool", "4", "--updates", "3") == 0
    assert "repeat" in capsys.readouterr().err
    first = [r for r in records(run) if "event" not in r][0]
    assert first["repeated_prompts"] == 2


# --------------------------------------------------------------------------------------------------
# Directories and numbers that cannot work: one line naming the path or value, nothing written
# --------------------------------------------------------------------------------------------------


def _tree(path):
    """Every path under ``path`` (itself included), to show that nothing was written."""
    return sorted(str(p) for p in [path, *path.rglob("*")])


@contextmanager
def _unwritable(directory):
    """``directory`` made one this process may not write: mode 0o555, and, for root (whom modes do
    not stop), the effective user ``nobody`` until the block ends. The directory's ancestors must be
    searchable by everyone (see `_open_base`)."""
    import respo.study.run_report  # noqa: F401 (imported now: nobody may not be able to read a cache later)
    import respo.train.trainer  # noqa: F401

    directory.chmod(0o555)
    as_root = os.geteuid() == 0
    try:
        if as_root:
            os.seteuid(NOBODY)
        yield
    finally:
        if as_root:
            os.seteuid(0)
        directory.chmod(0o755)


@pytest.fixture
def _open_base():
    """A fresh directory under /tmp that every user may search (pytest's tmp_path is private to root)."""
    with tempfile.TemporaryDirectory(prefix="respo-rundir-") as base:
        Path(base).chmod(0o755)
        yield Path(base)


def test_an_out_dir_that_is_a_regular_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_text("my notes\n")
    assert train_cli(path, "--updates", "1") == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert str(path) in line and "not a directory" in line
    assert path.read_text() == "my notes\n" and _tree(tmp_path) == [str(tmp_path), str(path)]


def test_an_out_dir_under_a_regular_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_text("my notes\n")
    assert train_cli(path / "runs" / "a", "--updates", "1") == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert str(path / "runs" / "a") in line and f"{str(path)!r} is a file" in line
    assert _tree(tmp_path) == [str(tmp_path), str(path)]


def test_an_out_dir_in_a_read_only_parent_is_one_line(_open_base, capsys):
    parent = _open_base / "shared"
    parent.mkdir()
    with _unwritable(parent):
        status = train_cli(parent / "run", "--updates", "1")
    assert status == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert str(parent / "run") in line and f"{str(parent)!r} is not writable" in line
    assert _tree(parent) == [str(parent)]


def test_a_read_only_run_directory_is_one_line(_open_base, capsys):
    run = _open_base / "run"
    run.mkdir()
    with _unwritable(run):
        status = train_cli(run, "--updates", "1")
    assert status == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert str(run) in line and "is not writable" in line
    assert _tree(run) == [str(run)]  # no config.json attempted


def test_an_infinite_learning_rate_is_refused_before_anything_is_written(tmp_path, capsys):
    assert train_cli(tmp_path / "run", "--lr", "inf", "--updates", "2") == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert "lr must be a finite number, got inf" in line
    assert not (tmp_path / "run").exists()


# ---- a log that disagrees with the checkpoint is never continued ------------------------------------
def _rewrite_log(run: Path, keep) -> str:
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    text = "".join(keep(lines))
    (run / "metrics.jsonl").write_text(text)
    return text


def test_resume_refuses_a_log_that_lost_updates_the_checkpoint_has(finished_run, tmp_path, capsys):
    # the run's log kept its first 2 of 4 update records; its newest checkpoint is at update 4: resuming would
    # log updates 1-2 and 5-6, a gap that every window computed later would silently span
    run = _copy(finished_run, tmp_path)
    text = _rewrite_log(run, lambda lines: [ln for ln in lines if '"event"' not in ln][:2])
    capsys.readouterr()
    assert train_cli(run, "--resume", "--updates", "6", "--checkpoint-every", "2") == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert "logs updates 1–2 (2 records)" in line and "checkpoint is at update 4" in line, line
    assert (run / "metrics.jsonl").read_text() == text  # nothing touched


def test_resume_leaves_out_a_torn_last_line_with_a_warning(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    _rewrite_log(run, lambda lines: [*lines, '{"update": 5, "sco'])  # killed while writing update 5
    with pytest.warns(UserWarning, match=r"metrics\.jsonl: line \d+ is torn"):
        assert train_cli(run, "--resume", "--updates", "6", "--checkpoint-every", "2") == 0
    assert [r["update"] for r in records(run) if "event" not in r] == [1, 2, 3, 4, 5, 6]


def test_resume_refuses_a_damaged_line_naming_file_and_line(finished_run, tmp_path, capsys):
    run = _copy(finished_run, tmp_path)
    text = _rewrite_log(run, lambda lines: ["{not json\n", *lines[1:]])
    capsys.readouterr()
    assert train_cli(run, "--resume", "--updates", "6") == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert "metrics.jsonl: line 1 is not a JSON record" in line, line
    assert (run / "metrics.jsonl").read_text() == text


def test_report_and_table_refuse_a_run_whose_log_has_a_gap(finished_run, tmp_path, capsys):
    from respo.cli import main

    run = _copy(finished_run, tmp_path)
    _rewrite_log(run, lambda lines: [ln for ln in lines if '"update": 3,' not in ln or '"event"' in ln])
    for argv in (["report", str(run), "--out", str(tmp_path / "rep")], ["table", "calib", str(run)]):
        capsys.readouterr()
        assert main(argv) == 2
        line = one_error_line(capsys.readouterr().err, argv[0])
        assert "logs updates 1–2, 4 (3 records)" in line and "finished at update 4" in line, line
    assert not (tmp_path / "rep").exists()
    # a log that ends early without a gap: a finished run's windows would be computed on 2 of its 4 updates
    _rewrite_log(run, lambda lines: [ln for ln in lines if '"update": 4,' not in ln or '"event"' in ln])
    capsys.readouterr()
    assert main(["table", "calib", str(run)]) == 2
    assert "logs updates 1–2 (2 records), but the run finished at update 4" in capsys.readouterr().err


def test_resume_into_an_unwritable_ckpt_changes_nothing(tmp_path, capsys, monkeypatch):
    # a finished run extended with --resume while its ckpt/ cannot be written: refused in one line before its
    # final/ and summary.json (which a resume past the end replaces) are touched. The process runs as root
    # here, so the permission check is made to see ckpt/ as unwritable, as it would for another user.
    from respo.train import rundir

    run = tmp_path / "run"
    assert train_cli(run, "--updates", "2") == 0
    before = sorted(p.name for p in run.iterdir())
    real = rundir._writable
    monkeypatch.setattr(rundir, "_writable", lambda p: p.name != "ckpt" and real(p))
    assert train_cli(run, "--resume", "--updates", "3") == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert "ckpt" in line and "not writable" in line and "nothing was changed" in line
    assert sorted(p.name for p in run.iterdir()) == before
    assert (run / "summary.json").is_file() and (run / "final").is_dir()


def test_reopen_keeps_the_last_complete_end_and_drops_a_partial_one(tmp_path):
    from respo.train.rundir import PREVIOUS_END, close_previous_end, reopen

    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    (run / "summary.json").write_text('{"updates": 4}')
    (run / "report.md").write_text("end at 4")
    reopen(run)  # a complete end moves aside whole
    aside = run / PREVIOUS_END
    assert sorted(p.name for p in aside.iterdir()) == ["final", "report.md", "summary.json"]
    assert not (run / "summary.json").exists()
    # an extension cut short after writing final/ but before summary.json: no end, so it goes and the aside stays
    (run / "final").mkdir()
    reopen(run)
    assert not (run / "final").exists() and (aside / "summary.json").read_text() == '{"updates": 4}'
    # a new complete end (killed before the aside was removed) replaces the aside on the next reopen
    (run / "final").mkdir()
    (run / "summary.json").write_text('{"updates": 6}')
    reopen(run)
    assert (aside / "summary.json").read_text() == '{"updates": 6}' and not (aside / "report.md").exists()
    close_previous_end(run)
    assert not aside.exists()
