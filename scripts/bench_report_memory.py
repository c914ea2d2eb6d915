"""Peak memory of the default `sinkmech report` against loading the model and
running one plain forward pass, side by side in one run (each in a fresh
process, peak resident set size read from the OS).

    python scripts/bench_report_memory.py --model gemma3-270m     # target: report <= 8 GB
    python scripts/bench_report_memory.py --model smollm2 --n-prompts 16

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

BASELINE = """
import sys, torch
from sinkmech.models import load_model
from sinkmech.prompts import default_corpus, tokenize
m = load_model(sys.argv[1])
batch = tokenize(m, default_corpus(16), bos="prepend", max_tokens=64)
with torch.no_grad():
    m(batch.tokens)
"""


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
    p.add_argument("--n-prompts", type=int, default=170, help="report --n-prompts (default: the report's 170)")
    p.add_argument("--limit-gb", type=float, default=8.0)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    # The baseline first: ru_maxrss of children is a running maximum, so the
    # smaller process must finish before the larger one starts.
    base_s, base_gb = child_peak([sys.executable, "-c", BASELINE, args.model])
    with tempfile.TemporaryDirectory() as tmp:
        rep_s, rep_gb = child_peak([sys.executable, "-m", "sinkmech.cli", "report", "--model", args.model,
                                    "--out", str(Path(tmp) / "r"), "--n-prompts", str(args.n_prompts)])
    result = {"model": args.model, "n_prompts": args.n_prompts, "baseline_peak_gb": round(base_gb, 2),
              "report_peak_gb": round(rep_gb, 2), "report_s": round(rep_s, 1), "baseline_s": round(base_s, 1),
              "ratio": round(rep_gb / base_gb, 2), "limit_gb": args.limit_gb, "within_limit": rep_gb <= args.limit_gb}
    print(f"{args.model}: load + one forward (16 x 64): peak {base_gb:.2f} GiB in {base_s:.0f} s")
    print(f"{args.model}: default report ({args.n_prompts} prompts): peak {rep_gb:.2f} GiB in {rep_s:.0f} s "
          f"(x{rep_gb / base_gb:.2f} the baseline; limit {args.limit_gb} GB: {'met' if rep_gb <= args.limit_gb else 'NOT met'})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
