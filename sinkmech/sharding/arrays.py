"""How a part writes an array in JSON: exactly (float64 values as Python's shortest
repr that reads back to the same double), sparse where most values are zero, and
strict (no bare NaN). The part format is `sinkmech.sharding.format`.
"""

from __future__ import annotations

import math

import numpy as np

# Arrays in JSON: {"dtype", "shape", "values"} with the flat values, or, when
# at most a third of them are non-zero, {"dtype", "shape", "nonzero", "values"}
# with the flat indices of the non-zero ones. Non-finite floats are written as
# the strings "nan", "inf", "-inf" (strict JSON has no NaN).

DTYPES = ("float64", "float32", "int64", "int32", "int8", "bool")


def encode(a: np.ndarray) -> dict:
    """`a` as a JSON object (see above); a `ValueError` for a dtype a part cannot hold."""
    a = np.asarray(a)
    dtype = str(a.dtype)
    if dtype not in DTYPES:
        raise ValueError(f"cannot store an array of {dtype} in a partial (use one of {DTYPES})")
    flat = a.reshape(-1)
    out: dict = {"dtype": dtype, "shape": list(a.shape)}
    nz = np.flatnonzero(flat)
    if 3 * len(nz) <= len(flat) and len(flat) > 0:
        out["nonzero"] = nz.tolist()
        flat = flat[nz]
    out["values"] = [_value(x) for x in flat.tolist()]
    return out


def _value(x):
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def decode(d: dict) -> np.ndarray:
    """The array `encode` wrote, bit for bit; a `ValueError` (or `KeyError`) for a malformed one."""
    dtype, shape = d["dtype"], tuple(int(s) for s in d["shape"])
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}")
    values = [float(v) if isinstance(v, str) else v for v in d["values"]]
    if "nonzero" in d:
        a = np.zeros(int(np.prod(shape, dtype=np.int64)), dtype=dtype)
        idx = np.asarray(d["nonzero"], dtype=np.int64)
        if len(idx) != len(values):
            raise ValueError("nonzero indices and values differ in length")
        a[idx] = np.asarray(values, dtype=dtype) if values else a[idx]
        return a.reshape(shape)
    return np.asarray(values, dtype=dtype).reshape(shape)
