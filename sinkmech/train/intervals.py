"""Intervals over seeds: a handful of independent training runs per setting,
summarised by the mean and the 95 % Student-t interval of the mean."""

from __future__ import annotations

import math
from collections.abc import Sequence

# Two-sided 95 % quantiles t_{0.975, df} of Student's t for df = 1..10 (any
# statistics table, e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2; checked against a
# numerical integral of the t density in tests/unit/train/test_train_attention.py).
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def t975(df: int) -> float:
    """t_{0.975, df}; 1.96 (the normal quantile) above df 10 would understate
    the width, so larger df are refused rather than guessed."""
    if not 1 <= df <= len(T975):
        raise ValueError(f"t quantile tabulated for 1..{len(T975)} degrees of freedom, got {df}")
    return T975[df - 1]


def seed_interval(values: Sequence[float]) -> dict[str, float | int]:
    """{"mean", "lo", "hi", "n"}: the mean of `values` (one per seed) and its
    95 % t interval. Needs at least two values."""
    n = len(values)
    if n < 2:
        raise ValueError(f"an interval over seeds needs at least 2 values, got {n}")
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t975(n - 1) * sd / math.sqrt(n)
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "n": n}


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ys on xs."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError("slope needs two or more (x, y) pairs of equal length")
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("slope needs at least two distinct x")
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
