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


def test_finite_or_none_equals_the_recursive_definition_at_any_depth():
    """The writer's NaN/inf cleaning (one loop over a stack) against the plain recursion it replaces."""
    import math
    import random

    from sinkmech.files import finite_or_none

    def reference(v):
        if isinstance(v, float):
            return v if math.isfinite(v) else None
        if isinstance(v, dict):
            return {k: reference(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [reference(x) for x in v]
        return v

    rng = random.Random(0)

    def tree(depth):
        leaves = [1.5, float("nan"), float("inf"), -float("inf"), 3, "text", None, True]
        if depth == 0 or rng.random() < 0.3:
            return rng.choice(leaves)
        kind = rng.choice([dict, list, tuple])
        items = [tree(depth - 1) for _ in range(rng.randint(0, 4))]
        return {f"k{i}": x for i, x in enumerate(items)} if kind is dict else kind(items)

    for _ in range(200):
        value = tree(5)
        got = finite_or_none(value)
        assert repr(got) == repr(reference(value))  # repr: None in place of NaN, the same keys in the same order
    assert finite_or_none(float("nan")) is None and finite_or_none((1, 2)) == [1, 2] and finite_or_none("s") == "s"
