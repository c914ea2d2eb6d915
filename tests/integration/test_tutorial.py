"""docs/tutorial.ipynb: stored with its outputs (so it reads on the web), and
runs top to bottom in a fresh kernel, offline, giving the same kinds of output
(tables, figures, circuitsvis views inline, no remote script)."""

from __future__ import annotations

import os
import re
import time

import nbformat
import pytest
from helpers.paths import REPO

ROOT = REPO
NOTEBOOK = ROOT / "docs" / "tutorial.ipynb"
# A script fetched from the network: <script src="https://...">, or a module
# script's `import ... from "https://..."` / `import("https://...")` (circuitsvis' cdn_src).
REMOTE_SCRIPT = re.compile(
    r"<script[^>]*\bsrc\s*=\s*[\"']?(https?:)?//|\bimport\b[^;\"']*\bfrom\s*[\"'](https?:)?//|\bimport\s*\(\s*[\"'](https?:)?//",
    re.I)


def output_kinds(nb) -> list[list[str]]:
    """Per code cell, the kinds of output it shows: an error, a circuitsvis view, a
    table, a figure, text."""
    kinds = []
    for c in (c for c in nb.cells if c.cell_type == "code"):
        k = set()
        for o in c.outputs:
            data = o.get("data", {})
            html = data.get("text/html", "")
            if o.output_type == "error":
                k.add("error")
            elif "sinkmech-cv" in html:
                k.add("view")
            elif "<table" in html:
                k.add("table")
            elif "image/png" in data:
                k.add("figure")
            elif o.output_type == "stream" and o.get("name") == "stdout" or "text/plain" in data:
                k.add("text")
        kinds.append(sorted(k))
    return kinds


def check_outputs(nb) -> None:
    """What a reader must see: every code cell ran and showed something, no error,
    the two circuitsvis views with their bundle inlined and no remote script, the
    two figures, and the two models' comparison table."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code)
    kinds = output_kinds(nb)
    assert all(kinds) and not any("error" in k for k in kinds)
    outputs = [o for c in code for o in c.outputs]
    html = [o.data["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    views = [h for h in html if "sinkmech-cv" in h]
    assert len(views) == 2 and all("CircuitsVis.render(" in v for v in views)  # the bundle is inlined
    assert not any(REMOTE_SCRIPT.search(h) for h in html)
    assert any("<table" in h and "gemma3-270m" in h and "smollm2" in h for h in html)  # the comparison table
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2  # the two figures


def test_the_tutorial_is_stored_with_its_outputs():
    """`make tutorial` ran it in a fresh kernel and stored what it showed."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert 8 <= len(nb.cells) <= 24
    check_outputs(nb)


def test_the_remote_script_check_would_catch_a_cdn_view():
    """What circuitsvis writes by default (its cdn_src) is caught by the check below."""
    from circuitsvis.tokens import colored_tokens

    assert REMOTE_SCRIPT.search(str(colored_tokens(["a", "b"], [0.0, 1.0]).cdn_src))
    from sinkmech import render

    assert not REMOTE_SCRIPT.search(render.View("t", ((render._panel(colored_tokens(["a"], [1.0]), "c"),),))._repr_html_())


@pytest.mark.slow
def test_the_tutorial_runs_top_to_bottom_in_a_fresh_kernel(tmp_path):
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")  # the kernel inherits it: no download
    t0 = time.perf_counter()
    try:  # a generous cell timeout: a busy shared machine runs it several times slower
        NotebookClient(nb, timeout=1800, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    finally:
        nbformat.write(nb, tmp_path / "tutorial.ipynb")  # the outputs, for a look
    seconds = time.perf_counter() - t0
    check_outputs(nb)
    assert output_kinds(nb) == output_kinds(nbformat.read(NOTEBOOK, as_version=4))  # what is stored is what it shows
    print(f"tutorial ran in {seconds:.0f} s")
