"""The package's shape: folders by concern, few flat modules, none too long,
one JSON writer, and the old import paths of moved modules still working."""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path

import pytest

import sinkmech

PACKAGE = Path(sinkmech.__file__).resolve().parent
REPO = PACKAGE.parent


def test_at_most_ten_modules_sit_flat_in_the_package():
    flat = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(flat) <= 10, flat


def test_no_module_passes_400_lines():
    long = {str(p.relative_to(REPO)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400}
    assert long == {}


def test_json_is_written_only_by_the_one_writer():
    pattern = re.compile(r"\bjson\.dumps?\(")
    users = sorted(str(p.relative_to(REPO)) for folder in (PACKAGE, REPO / "scripts") for p in folder.rglob("*.py")
                   if pattern.search(p.read_text(encoding="utf-8")))
    assert users == ["sinkmech/files.py"]


def test_the_plotting_package_is_not_named_like_the_outputs_folder():
    assert not (PACKAGE / "figures").exists() and (PACKAGE / "plots" / "__init__.py").exists()


@pytest.mark.parametrize("old, new", sorted(sinkmech.MOVED.items()))
def test_a_moved_module_imports_under_its_old_path_with_a_warning(old, new):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=re.escape(f"{old} moved to {new}")):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


def test_every_moved_target_exists_and_no_old_file_is_left():
    for old, new in sinkmech.MOVED.items():
        assert importlib.util.find_spec(new) is not None, new
        assert not (REPO / (old.replace(".", "/") + ".py")).exists(), old


def test_the_project_speaks_of_itself_only():
    """No file says how the work was organised (when, in which round, by whom)."""
    words = ["moon" + "shot", "was " + "lent", "GPU " + "lent", "15-minute " + "budget", "this " + "sess" + "ion"]
    files = [REPO / "README.md", *(REPO / "docs").glob("*.md"), *PACKAGE.rglob("*.py"), *(REPO / "scripts").glob("*"),
             *(REPO / "tests").rglob("*.py")]
    hits = [f"{p.relative_to(REPO)}: {w}" for p in files if p.is_file()
            for w in words if w.lower() in p.read_text(encoding="utf-8", errors="replace").lower()]
    assert hits == []
