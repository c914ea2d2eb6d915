"""Intervals over seeds: a handful of independent training runs per setting,
summarised by the mean and the 95 % Student-t interval of the mean
(`sinkmech.stats.t_interval`, the package's one t interval). With 3 seeds the
interval has 2 degrees of freedom (t = 4.30): an interval that holds zero
means "not detected at this many seeds", not "no effect"."""

from __future__ import annotations

from collections.abc import Sequence

from sinkmech.stats import t_interval


def seed_interval(values: Sequence[float]) -> dict[str, float | int]:
    """{"mean", "lo", "hi", "n"}: the mean of `values` (one per seed) and its
    95 % t interval. Needs at least two values."""
    n = len(values)
    if n < 2:
        raise ValueError(f"an interval over seeds needs at least 2 values, got {n}")
    iv = t_interval(list(values), unit="seed")
    return {"mean": iv.value, "lo": iv.lo, "hi": iv.hi, "n": n}


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ys on xs."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError("slope needs two or more (x, y) pairs of equal length")
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("slope needs at least two distinct x")
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
