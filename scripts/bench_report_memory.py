"""Peak memory of the default `sinkmech report` against loading the model and
running one plain forward pass, side by side in one run (each in a fresh
process, peak resident set size read from the OS).

    python scripts/bench_report_memory.py --model gemma3-270m     # target: report <= 5 GiB
    python scripts/bench_report_memory.py --model smollm2 --n-prompts 16
    python scripts/bench_report_memory.py --model gemma3-270m --sections   # peak per report section
    python scripts/bench_report_memory.py --model gemma3-270m --dtypes float32 bfloat16   # side by side

`--sections` runs the report (instead of `sinkmech report`) in a process that
wraps every section: the peak resident set is reset before each section
(Linux `clear_refs`) and read after it (`VmHWM`), so each section's own peak
is seen, next to the resident set it started from (what earlier sections left
behind); the report's peak is the largest of them. Rows print as sections end.

Gemma 3's 262k-token vocabulary is what makes memory a question: full logits
for 170 prompts x 64 tokens would be ~11 GB, so analyses stop before the
unembedding or unembed in chunks, and sweeps cap rows per pass.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sinkmech.files import json_text, write_text

BASELINE = """
import sys, torch
from sinkmech.loading.models import load_model
from sinkmech.corpora import default_corpus
from sinkmech.prompts import tokenize
m = load_model(sys.argv[1], dtype=sys.argv[2])
batch = tokenize(m, default_corpus(16), bos="prepend", max_tokens=64)
with torch.no_grad():
    m(batch.tokens)
"""


SECTIONS_CHILD = """
import sys, tempfile, time
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from bench_report_memory import proc_status_gib, reset_peak
from sinkmech.files import json_text
from sinkmech.loading.models import load_model
from sinkmech.options import RunOptions
from sinkmech.report.page import build_report
from sinkmech.report.sections import SECTIONS

def row(**r):
    print("ROW " + json_text(r, indent=None), flush=True)

t0 = time.perf_counter()
m = load_model(sys.argv[1], dtype=sys.argv[5])
row(section="load model", seconds=time.perf_counter() - t0, cpu_s=time.process_time(), rss_before_gib=0.0,
    peak_gib=proc_status_gib("VmHWM"), rss_after_gib=proc_status_gib("VmRSS"))

def measured(section):
    def run(ctx):
        before = proc_status_gib("VmRSS")
        reset_peak()
        t, cpu = time.perf_counter(), time.process_time()
        out = section(ctx)
        row(section=section.__name__, seconds=time.perf_counter() - t, cpu_s=time.process_time() - cpu, rss_before_gib=before,
            peak_gib=proc_status_gib("VmHWM"), rss_after_gib=proc_status_gib("VmRSS"))
        return out
    run.__name__ = section.__name__
    return run

only = set(sys.argv[4].split(",")) if sys.argv[4] else None
with tempfile.TemporaryDirectory() as tmp:
    build_report(m, Path(tmp) / "r", sections=[measured(s) for s in SECTIONS if only is None or s.__name__ in only],
                 n_prompts=int(sys.argv[2]), options=RunOptions(progress=False))
"""


def proc_status_gib(field: str) -> float:
    """A memory field of /proc/self/status (VmRSS: now; VmHWM: peak) in GiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 2**20  # kB
    raise RuntimeError(f"{field} not in /proc/self/status (Linux only)")


def reset_peak() -> None:
    """Reset this process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0)."""
    Path("/proc/self/clear_refs").write_text("5")


def section_peaks(model: str, n_prompts: int, only: list[str] | None = None, dtype: str = "float32") -> list[dict]:
    """Each report section's time and peak RSS, measured in a fresh process
    (each row is printed as its section ends); `only`: these sections alone."""
    rows = []
    with subprocess.Popen([sys.executable, "-c", SECTIONS_CHILD, model, str(n_prompts), str(Path(__file__).parent),
                           ",".join(only or ()), dtype],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        for line in proc.stdout:
            if line.startswith("ROW "):
                rows.append(json.loads(line[4:]))
                r = rows[-1]
                print(f"  {r['section']:<22} {r['seconds']:>6.1f} s ({r['cpu_s']:.1f} s CPU)  peak {r['peak_gib']:.2f} GiB",
                      flush=True)
        err = proc.stderr.read()
    if proc.returncode != 0:
        raise RuntimeError(f"the measured report failed (exit {proc.returncode}): {err.strip()[-2000:]}")
    return rows


def child_peak(cmd: list[str]) -> tuple[float, float]:
    """Run `cmd` in a fresh process; return (seconds, its peak RSS in GiB)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB, max over finished children
    if peak < before:
        raise RuntimeError("peak RSS went down: run each measurement in its own benchmark process")
    return seconds, peak / 2**20


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--n-prompts", type=int, default=170, help="report --n-prompts (default 170, the paper's count; the report's own default is 80)")
    p.add_argument("--limit-gb", type=float, default=5.0, help="target peak of the report, GiB (default 5)")
    p.add_argument("--sections", action="store_true", help="measure the peak of each report section (the report run in-process, sections wrapped)")
    p.add_argument("--only", nargs="+", default=None, metavar="SECTION",
                   help="with --sections: run these sections alone (e.g. length_section)")
    p.add_argument("--no-baseline", action="store_true", help="skip the load + one forward baseline")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--dtypes", nargs="+", default=["float32"], choices=["float32", "bfloat16", "float16"],
                   help="measure each, side by side (default: float32)")
    args = p.parse_args(argv)
    runs = [measure(args, dtype) for dtype in args.dtypes]
    if len(runs) > 1:
        first = runs[0]
        for r in runs[1:]:
            print(f"{args.model}: report peak {r['dtype']} / {first['dtype']}: "
                  f"{r['report_peak_gb'] / first['report_peak_gb']:.2f}x; load + one forward: "
                  f"{r['baseline_peak_gb'] / first['baseline_peak_gb']:.2f}x")
    if args.json:
        write_text(args.json, json_text(runs[0] if len(runs) == 1 else {"runs": runs}, indent=1))
    return 0


def measure(args, dtype: str) -> dict:
    """The baseline and the report's peak in one dtype (each in fresh processes)."""
    # The baseline first: ru_maxrss of children is a running maximum, so the
    # smaller process must finish before the larger one starts.
    base_s, base_gb = (float("nan"), float("nan")) if args.no_baseline else child_peak(
        [sys.executable, "-c", BASELINE, args.model, dtype])
    rows = []
    if args.sections:  # the report with each section measured; its peak is the largest section peak
        t0 = time.perf_counter()
        rows = section_peaks(args.model, args.n_prompts, args.only, dtype)
        rep_s, rep_gb = time.perf_counter() - t0, max(r["peak_gib"] for r in rows)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            rep_s, rep_gb = child_peak([sys.executable, "-m", "sinkmech.cli", "report", "--model", args.model,
                                        "--out", str(Path(tmp) / "r"), "--n-prompts", str(args.n_prompts),
                                        "--dtype", dtype])
    result = {"model": args.model, "dtype": dtype, "n_prompts": args.n_prompts, "baseline_peak_gb": round(base_gb, 2),
              "report_peak_gb": round(rep_gb, 2), "report_s": round(rep_s, 1), "baseline_s": round(base_s, 1),
              "ratio": round(rep_gb / base_gb, 2), "limit_gb": args.limit_gb, "within_limit": rep_gb <= args.limit_gb,
              "sections": rows}
    print(f"{args.model} ({dtype}): load + one forward (16 x 64): peak {base_gb:.2f} GiB in {base_s:.0f} s")
    print(f"{args.model} ({dtype}): default report ({args.n_prompts} prompts): peak {rep_gb:.2f} GiB in {rep_s:.0f} s "
          f"(x{rep_gb / base_gb:.2f} the baseline; target {args.limit_gb} GiB: "
          f"{'met' if rep_gb <= args.limit_gb else 'NOT met'})")
    if rows:
        print(f"{'section':<24} {'s':>6} {'CPU s':>6} {'RSS before':>11} {'peak':>7} {'RSS after':>10}  (GiB)")
        for r in rows:
            print(f"{r['section']:<24} {r['seconds']:>6.1f} {r['cpu_s']:>6.1f} {r['rss_before_gib']:>11.2f} "
                  f"{r['peak_gib']:>7.2f} {r['rss_after_gib']:>10.2f}")
    return result


if __name__ == "__main__":
    sys.exit(main())
