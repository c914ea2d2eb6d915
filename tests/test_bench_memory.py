"""scripts/bench_report_memory.py reads each section's own peak: resetting the
peak and allocating must show the allocation, and only it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
from bench_report_memory import proc_status_gib, reset_peak  # noqa: E402


def test_a_reset_peak_sees_the_next_allocation_only():
    big = np.ones(2**28 // 8)  # 256 MiB, touched
    del big
    reset_peak()
    base = proc_status_gib("VmHWM")
    assert base - proc_status_gib("VmRSS") < 0.05  # the reset peak is where we stand now, not the old 256 MiB
    block = np.ones(2**27 // 8)  # 128 MiB, touched
    grew = proc_status_gib("VmHWM") - base
    assert 0.1 < grew < 0.2, grew
    del block
