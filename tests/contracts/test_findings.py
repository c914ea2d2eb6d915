"""findings.json: written by the code that measures, and every README finding backed by it."""

from __future__ import annotations

import json
import re

import pytest

from sinkmech.findings import flatten, record
from helpers.paths import REPO

ROOT = REPO
NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?![\w])")
HEAD = re.compile(r"\bL\d+\.H\d+\b")
# Written by `make demo` (compare, report) and by `sinkmech train study findings` (training).
FINDINGS_FILES = ("figures/findings.json", "figures/train/findings_train.json")


def test_record_merges_replaces_a_prefix_and_writes_strict_json(tmp_path):
    f = tmp_path / "findings.json"
    record(f, flatten("a", {"x": 1.5, "y": [1, 2], "z": {"w": float("nan")}}))
    record(f, {"b.q": 3})
    record(f, flatten("a", {"x": 2.0}), replace_prefix="a")
    data = json.loads(f.read_text())
    assert data == {"a.x": 2.0, "b.q": 3}
    record(f, {"c": float("inf")})
    assert json.loads(f.read_text())["c"] is None
    f.write_text("{broken")
    with pytest.raises(ValueError, match="not valid JSON"):
        record(f, {"d": 1})


def _record_many(path, worker: int) -> None:
    for i in range(25):
        record(path, {f"w{worker}.k{i}": i})


def test_record_side_by_side_loses_no_values(tmp_path):
    """Commands that write the same findings file at once (make findings runs
    some side by side) each keep every value they recorded."""
    import multiprocessing

    f = tmp_path / "findings.json"
    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=_record_many, args=(f, w)) for w in range(4)]
    for p in workers:
        p.start()
    for p in workers:
        p.join()
    assert all(p.exitcode == 0 for p in workers)
    assert json.loads(f.read_text()) == {f"w{w}.k{i}": i for w in range(4) for i in range(25)}


def findings_sections(readme: str) -> list[str]:
    """Lines between <!-- findings --> and <!-- /findings --> markers."""
    blocks = re.findall(r"<!-- findings -->(.*?)<!-- /findings -->", readme, flags=re.S)
    return [line for block in blocks for line in block.splitlines()]


def matches(written: str, rounded: dict[int, set[float]], values: list[float]) -> bool:
    """Whether a value rounds to `written` at its precision (`rounded`: the values
    already rounded at each precision met, filled on first use)."""
    decimals = len(written.split(".")[1]) if "." in written else 0
    if decimals not in rounded:
        rounded[decimals] = {round(v, decimals) for v in values}
    return float(written) in rounded[decimals]  # both the double nearest the decimal written


def test_every_readme_finding_is_in_findings_json():
    """Numbers in the findings sections of the README and docs/*.md must be values of the findings files at
    the precision written; lines quoting the paper (they say "paper") are exempt."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    readme = "\n".join(page.read_text() for page in pages)
    findings = {}
    for f in FINDINGS_FILES:
        findings.update(json.loads((ROOT / f).read_text()))
    numbers = [float(v) for v in findings.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    numbers += [abs(v) for v in numbers]
    labels = {v for v in findings.values() if isinstance(v, str)}
    labels |= {h for k in findings for h in HEAD.findall(k)}  # heads measured, e.g. "...noop.L1.H1.per_query_active"
    lines = findings_sections(readme)
    assert len(lines) > 10, "the README and docs/ have no findings sections marked <!-- findings --> ... <!-- /findings -->"
    for page in ("README.md", "docs/findings.md"):  # the headline and the rest: both hold checked findings
        assert findings_sections((ROOT / page).read_text()), f"{page} has no findings section"
    missing, rounded = [], {}
    for line in lines:
        if "paper" in line.lower() or line.lstrip().startswith(("![", "|---", "<!--")):
            continue
        for head in HEAD.findall(line):
            if head not in labels:
                missing.append(f"{head} in: {line.strip()[:80]}")
        for n in NUMBER.findall(HEAD.sub(" ", line)):
            if not matches(n, rounded, numbers):
                missing.append(f"{n} in: {line.strip()[:80]}")
    assert not missing, "README numbers not in findings.json:\n" + "\n".join(missing)
