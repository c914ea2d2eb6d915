"""Side-by-side timing shared by the benchmark scripts: phases run interleaved,
round after round, so a machine that slows down mid-run slows every phase alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping


def interleaved_medians(phases: Mapping[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median wall seconds of each phase over `repeats` interleaved rounds."""
    times: dict[str, list[float]] = {k: [] for k in phases}
    for _ in range(repeats):
        for name, fn in phases.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}
