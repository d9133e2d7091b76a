"""write_text_atomic: the file is either wholly old or wholly new, never truncated or left private."""

import os
import stat

import pytest

from respo import fileio
from respo.fileio import write_text_atomic


def test_writes_replaces_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "sweep.json"
    write_text_atomic(path, "first\n")
    assert path.read_text() == "first\n"
    write_text_atomic(path, "second")
    assert path.read_text() == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.json"]
    # mkstemp creates its file 0o600; the result must be readable like any other written file
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644


def test_a_failed_replace_keeps_the_old_file_and_removes_the_temporary(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"update": 1}\n{"update": 2}\n')

    def refuse(src, dst):
        raise OSError("disk went away")

    monkeypatch.setattr(fileio.os, "replace", refuse)
    with pytest.raises(OSError, match="disk went away"):
        write_text_atomic(path, '{"update": 1}\n')
    assert path.read_text() == '{"update": 1}\n{"update": 2}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def test_newline_is_passed_through_for_csv_line_endings(tmp_path):
    # the csv module writes "\r\n" itself; newline="" must keep it as is (not "\r\r\n" on any platform)
    path = tmp_path / "runs.csv"
    write_text_atomic(path, "a,b\r\n1,2\r\n", newline="")
    assert path.read_bytes() == b"a,b\r\n1,2\r\n"


# ---- read_jsonl: only a torn last line is left out, with a warning naming it ----------------------------
def test_read_jsonl_leaves_out_only_a_torn_last_line_and_says_so(tmp_path):
    from respo.fileio import read_jsonl

    p = tmp_path / "metrics.jsonl"
    p.write_text('{"update": 1}\n{"update": 2}\n{"update": 3, "sco')  # killed mid-write: no newline, not JSON
    with pytest.warns(UserWarning, match=r"metrics\.jsonl: line 3 is torn"):
        assert read_jsonl(p) == [{"update": 1}, {"update": 2}]
    p.write_text('{"update": 1}\n{"update": 2}\n')
    assert read_jsonl(p) == [{"update": 1}, {"update": 2}]


@pytest.mark.parametrize("text, line", [
    ('{"upd\n{"update": 2}\n{"update": 3}\n', 1),  # a bad first line
    ('{"update": 1}\nxx\n{"update": 3}\n', 2),  # a bad line inside
    ('{"update": 1}\n{"update": 2\n', 2),  # a bad last line that ends with its newline: no torn write
    ('{"update": 1}\n[1, 2]\n', 2),  # JSON, but not a record
    ('{"update": 1}\n\n{"update": 3}\n', 2),  # an empty line
])
def test_read_jsonl_refuses_any_other_unreadable_line_naming_file_and_line(tmp_path, text, line):
    from respo.fileio import LogReadError, read_jsonl

    p = tmp_path / "metrics.jsonl"
    p.write_text(text)
    with pytest.raises(LogReadError, match=rf"metrics\.jsonl: line {line} is not a JSON"):
        read_jsonl(p)
