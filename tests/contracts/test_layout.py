"""The package's shape: one JSON writer, no outputs folder inside the package, and a
project that speaks of itself."""

from __future__ import annotations

import re
from pathlib import Path


import sinkmech

PACKAGE = Path(sinkmech.__file__).resolve().parent
REPO = PACKAGE.parent


def test_json_is_written_only_by_the_one_writer():
    pattern = re.compile(r"\bjson\.dumps?\(")
    users = sorted(str(p.relative_to(REPO)) for folder in (PACKAGE, REPO / "scripts") for p in folder.rglob("*.py")
                   if pattern.search(p.read_text(encoding="utf-8")))
    assert users == ["sinkmech/files.py"]


def test_the_plotting_package_is_not_named_like_the_outputs_folder():
    assert not (PACKAGE / "figures").exists() and (PACKAGE / "plots" / "__init__.py").exists()


def test_the_project_speaks_of_itself_only():
    """No file says how the work was organised (when, in which round, by whom)."""
    words = ["moon" + "shot", "was " + "lent", "GPU " + "lent", "15-minute " + "budget", "this " + "sess" + "ion"]
    files = [REPO / "README.md", *(REPO / "docs").glob("*.md"), *PACKAGE.rglob("*.py"), *(REPO / "scripts").glob("*"),
             *(REPO / "tests").rglob("*.py")]
    hits = [f"{p.relative_to(REPO)}: {w}" for p in files if p.is_file()
            for w in words if w.lower() in p.read_text(encoding="utf-8", errors="replace").lower()]
    assert hits == []


def test_the_quick_start_benchmark_times_the_readmes_quick_start():
    """scripts/bench_quickstart.py runs the commands the README's quick start shows, in its order."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_quickstart", REPO / "scripts" / "bench_quickstart.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = readme[readme.index("On the command line"):].split("\n\n")[1]
    shown = [line.split() for line in block.splitlines() if line.strip().startswith("sinkmech ")]
    timed = [["sinkmech", *(a.replace("{out}", "out") for a in argv)] for argv in bench.COMMANDS.values()]
    assert len(shown) == 4 and shown == timed
