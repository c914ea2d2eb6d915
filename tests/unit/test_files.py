"""The one writer: atomic text and bytes, and its error message."""

from __future__ import annotations

import pytest

from sinkmech.files import atomic_path, write_bytes, write_text


def test_write_text_replaces_the_file_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "a" / "b.json"
    write_text(path, "old")
    write_text(path, "new ü")
    assert path.read_text(encoding="utf-8") == "new ü"
    assert sorted(p.name for p in path.parent.iterdir()) == ["b.json"]


def test_a_write_that_fails_midway_keeps_the_old_file(tmp_path):
    path = tmp_path / "part.json"
    write_bytes(path, b"complete")
    with pytest.raises(RuntimeError):
        with atomic_path(path) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("interrupted")
    assert path.read_bytes() == b"complete"
    assert [p.name for p in tmp_path.iterdir()] == ["part.json"]


def test_a_blocked_path_names_the_action_and_the_path(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OSError, match=r"cannot write findings to .*file/f.json"):
        write_text(blocker / "f.json", "{}", action="write findings to")
