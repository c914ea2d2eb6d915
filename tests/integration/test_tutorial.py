"""docs/tutorial.ipynb: stored with its outputs (tables, figures, the circuitsvis
views), so it reads on the web without running; and run again top to bottom in a
fresh kernel, offline, it gives every cell the same kinds of output, its views
inline and no remote script. `make tutorial` writes the outputs."""

from __future__ import annotations

import copy
import os
import re
import time

import nbformat
import pytest
from helpers.paths import REPO

NOTEBOOK = REPO / "docs" / "tutorial.ipynb"
# A script fetched from the network: <script src="https://...">, or a module
# script's `import ... from "https://..."` / `import("https://...")` (circuitsvis' cdn_src).
REMOTE_SCRIPT = re.compile(
    r"<script[^>]*\bsrc\s*=\s*[\"']?(https?:)?//|\bimport\b[^;\"']*\bfrom\s*[\"'](https?:)?//|\bimport\s*\(\s*[\"'](https?:)?//",
    re.I)


def kinds(cell) -> set[str]:
    """What a code cell shows: "table" (an HTML table), "view" (a circuitsvis view),
    "image/png", "text" (printed or a plain value), "error"."""
    out = set()
    for o in cell.outputs:
        if o.output_type == "error":
            out.add("error")
        elif o.output_type == "stream":
            out.add("text" if o.name == "stdout" else "stderr")
        else:
            data = o.get("data", {})
            html = data.get("text/html", "")
            out |= {"view"} if "sinkmech-cv" in html else {"table"} if "<table" in html else set()
            out |= {m for m in data if m.startswith("image/")}
            if set(data) == {"text/plain"}:
                out.add("text")
    return out


def html_outputs(nb) -> list[str]:
    return [o.data["text/html"] for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if "text/html" in o.get("data", {})]


def test_the_tutorial_is_stored_with_its_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert 8 <= len(nb.cells) <= 24 and code
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))  # one run, top to bottom
    shown = [kinds(c) for c in code]
    assert all(shown), "a code cell without output"
    assert not any({"error", "stderr"} & k for k in shown)
    every = set().union(*shown)
    assert {"table", "view", "image/png", "text"} <= every
    html = html_outputs(nb)
    views = [h for h in html if "sinkmech-cv" in h]
    assert len(views) == 2 and all("CircuitsVis.render(" in v for v in views)  # the bundle is inlined
    assert not any(REMOTE_SCRIPT.search(h) for h in html)
    assert any("<table" in h and "gemma3-270m" in h and "smollm2" in h for h in html)  # the comparison table
    assert sum("image/png" in k for k in shown) == 2  # the two figures


def test_the_remote_script_check_would_catch_a_cdn_view():
    """What circuitsvis writes by default (its cdn_src) is caught by the check above."""
    from circuitsvis.tokens import colored_tokens

    assert REMOTE_SCRIPT.search(str(colored_tokens(["a", "b"], [0.0, 1.0]).cdn_src))
    from sinkmech import render

    assert not REMOTE_SCRIPT.search(render.View("t", ((render._panel(colored_tokens(["a"], [1.0]), "c"),),))._repr_html_())


def test_the_kinds_tell_a_missing_output_apart():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code" and "image/png" in kinds(c))
    empty = copy.deepcopy(cell)
    empty.outputs = [o for o in empty.outputs if "image/png" not in o.get("data", {})]
    assert kinds(empty) != kinds(cell)


@pytest.mark.slow
def test_the_tutorial_runs_again_with_the_stored_kinds_of_output(tmp_path):
    from nbclient import NotebookClient

    stored = nbformat.read(NOTEBOOK, as_version=4)
    nb = copy.deepcopy(stored)
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")  # the kernel inherits it: no download
    t0 = time.perf_counter()
    try:  # a generous cell timeout: a busy shared machine runs it several times slower
        NotebookClient(nb, timeout=1800, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}).execute()
    finally:
        nbformat.write(nb, tmp_path / "tutorial.ipynb")  # the outputs, for a look
    seconds = time.perf_counter() - t0
    ran = [kinds(c) for c in nb.cells if c.cell_type == "code"]
    want = [kinds(c) for c in stored.cells if c.cell_type == "code"]
    assert not any("error" in k for k in ran)
    assert ran == want
    html = html_outputs(nb)
    assert all("CircuitsVis.render(" in h for h in html if "sinkmech-cv" in h)
    assert not any(REMOTE_SCRIPT.search(h) for h in html)
    print(f"tutorial ran in {seconds:.0f} s")
