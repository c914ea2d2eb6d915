"""docs/tutorial.ipynb: saved clean, and runs top to bottom in a fresh kernel,
offline, with its circuitsvis views inline and no remote script."""

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


def test_the_tutorial_is_saved_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert 8 <= len(nb.cells) <= 20 and code
    assert all(c.outputs == [] and c.execution_count is None for c in code)


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
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    html = [o.data["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    views = [h for h in html if "sinkmech-cv" in h]
    assert len(views) == 2 and all("CircuitsVis.render(" in v for v in views)  # the bundle is inlined
    assert not any(REMOTE_SCRIPT.search(h) for h in html)
    assert any("<table" in h and "gemma3-270m" in h and "smollm2" in h for h in html)  # the comparison table
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2  # the two figures
    print(f"tutorial ran in {seconds:.0f} s")
