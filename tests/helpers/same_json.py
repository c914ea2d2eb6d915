"""Two JSON outputs compared leaf by leaf: the check that a sharded, resumed or Ray
run wrote what the one-process run writes."""

from __future__ import annotations

import math


def numbers(x) -> list[float] | None:
    """The leaves of a list nested of numbers only (an array), else None."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return [float(x)]
    if not isinstance(x, list):
        return None
    out = []
    for v in x:
        leaves = numbers(v)
        if leaves is None:
            return None
        out += leaves
    return out


def assert_same_json(a, b, path="$", *, tol: float = 1e-6, normwise: bool = False):
    """Equal keys and values, floats to `tol` (relative or absolute); with `normwise`, an array
    (a list nested of numbers) to `tol` relative to its largest |value|: max |a - b| <= tol * max |a|."""
    if normwise and isinstance(a, list) and numbers(a) and numbers(b) is not None:
        x, y = numbers(a), numbers(b)
        assert len(x) == len(y), path
        scale = max(abs(v) for v in x)
        worst = max(abs(u - v) for u, v in zip(x, y))
        assert worst <= tol * scale, (path, f"max |difference| {worst:.3g} > {tol:g} x largest |value| {scale:.3g}")
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (path, set(a) ^ set(b))
        for k in a:
            assert_same_json(a[k], b[k], f"{path}.{k}", tol=tol, normwise=normwise)
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_json(x, y, f"{path}[{i}]", tol=tol, normwise=normwise)
    elif isinstance(a, float) or isinstance(b, float):
        assert math.isclose(a, b, rel_tol=tol, abs_tol=tol), (path, a, b)
    else:
        assert a == b, (path, a, b)
