"""Named findings: every number the README states as a result is written here by
the code that measured it, into one flat JSON file (`figures/findings.json`),
e.g. `"smollm2.sink_rate.prepend.0.3": 66.8`. A test checks each number in the
findings sections of the README and docs/ against this file at the precision written.

`record` merges a command's values into the file (other commands' values stay);
the write is atomic, so an interrupted run never leaves a half-written file, and
the read-merge-write holds a lock, so commands run side by side lose no values.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Mapping
from pathlib import Path

from sinkmech.files import cannot, json_text, write_text

Value = float | int | str | None


def flatten(prefix: str, value) -> dict[str, Value]:
    """Nested dicts and lists -> flat `prefix.key.key` names (list items by index)."""
    if isinstance(value, Mapping):
        out: dict[str, Value] = {}
        for k, v in value.items():
            out.update(flatten(f"{prefix}.{k}" if prefix else str(k), v))
        return out
    if isinstance(value, (list, tuple)):
        out = {}
        for i, v in enumerate(value):
            out.update(flatten(f"{prefix}.{i}", v))
        return out
    if isinstance(value, bool) or value is None or isinstance(value, (int, float, str)):
        return {prefix: value}
    return {prefix: float(value)}  # numpy / torch scalars


def record(path: str | os.PathLike, values: Mapping[str, Value], *, replace_prefix: str | None = None) -> Path:
    """Merge `values` into the findings file at `path`.

    Args:
        values: flat name -> number (or string, e.g. a head label).
        replace_prefix: drop the file's earlier names under this prefix first
            (a rerun of the same measurement never leaves stale values).
    """
    path = Path(path)
    with cannot("write findings to", path):
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.parent / f".{path.name}.lock", "w")
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        return _merge(path, values, replace_prefix)


def _merge(path: Path, values: Mapping[str, Value], replace_prefix: str | None) -> Path:
    old: dict = {}
    if path.exists():
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON ({e.msg}); delete it to start afresh") from e
    if replace_prefix is not None:
        old = {k: v for k, v in old.items() if not (k == replace_prefix or k.startswith(replace_prefix + "."))}
    merged = dict(sorted({**old, **dict(values)}.items()))
    return write_text(path, json_text(merged) + "\n", action="write findings to")


# Per-head grids and raw id lists are in summary.json; findings keep the numbers
# a write-up quotes (rates, ratios, per-layer curves, top heads, losses).
SKIP = {"effects", "scores", "swap_ids", "values", "head_value_norms", "last_layer_change_per_prompt", "swaps",
        "content_lengths"}


def _prune(value):
    if isinstance(value, Mapping):
        return {k: _prune(v) for k, v in value.items() if k not in SKIP}
    if isinstance(value, (list, tuple)):
        return [_prune(v) for v in value]
    return value


def report_findings(label: str, summary: Mapping) -> dict[str, Value]:
    """The report's quotable numbers, named `LABEL.report.SECTION.KEY...`."""
    return flatten(f"{label}.report", {"settings": summary.get("settings", {}), **_prune(summary["sections"])})
