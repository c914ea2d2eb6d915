"""scripts/bench_report_memory.py reads each section's own peak: resetting the
peak and allocating must show the allocation, and only it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers.paths import REPO

SCRIPTS = REPO / "scripts"

# Run in a fresh interpreter: after a long test run the allocator may hand
# back pages it already holds, and the peak would (rightly) not move.
CHECK = f"""
import sys
sys.path.insert(0, {str(SCRIPTS)!r})
import numpy as np
from bench_report_memory import proc_status_gib, reset_peak

big = np.ones(2**28 // 8)  # 256 MiB, touched
del big
reset_peak()
base = proc_status_gib("VmHWM")
print(base - proc_status_gib("VmRSS"))  # the reset peak is where we stand now, not the old 256 MiB
block = np.ones(2**27 // 8)  # 128 MiB, touched
print(proc_status_gib("VmHWM") - base)
"""


@pytest.mark.slow  # a fresh interpreter that imports the benchmark script
def test_a_reset_peak_sees_the_next_allocation_only():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, check=True).stdout.split()
    above_now, grew = float(out[0]), float(out[1])
    assert above_now < 0.05
    assert 0.1 < grew < 0.2, grew
