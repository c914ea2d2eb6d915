"""How fast the command line answers: `sinkmech --help`, a command's `--help`
and a rejected flag (`sinks --batch-size 0`), each a fresh `python -m
sinkmech.cli` process, beside `python -c "import torch"` and `python -c "import
transformer_lens"` for reference (what every answer paid when the parser
imported the analyses). Phases run interleaved (`benchtime.interleaved_medians`);
medians of wall seconds. Target: under 2 s for each answer.

    python scripts/bench_cli.py --repeats 5
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from benchtime import interleaved_medians

from sinkmech.files import json_text, write_text

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 2.0

PHASES = {
    "sinkmech --help": ["-m", "sinkmech.cli", "--help"],
    "sinkmech sinks --help": ["-m", "sinkmech.cli", "sinks", "--help"],
    "sinkmech sinks --batch-size 0 (refused)": ["-m", "sinkmech.cli", "sinks", "--batch-size", "0"],
    'python -c "import torch"': ["-c", "import torch"],
    'python -c "import transformer_lens"': ["-c", "import transformer_lens"],
}
ANSWERS = [k for k in PHASES if k.startswith("sinkmech")]


def run(args: list[str], expect: int) -> None:
    done = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True)
    if done.returncode != expect:
        raise SystemExit(f"{' '.join(args)} exited {done.returncode}, expected {expect}: {done.stderr[-500:]}")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--no-reference", action="store_true", help="skip the import torch / transformer_lens lines")
    p.add_argument("--json", type=Path, default=None, help="also write the medians here")
    args = p.parse_args(argv)
    phases = {k: v for k, v in PHASES.items() if k in ANSWERS or not args.no_reference}
    medians = interleaved_medians(
        {k: (lambda v=v, k=k: run(v, 2 if "refused" in k else 0)) for k, v in phases.items()}, args.repeats)
    print(f"median wall seconds over {args.repeats} interleaved rounds (each a fresh Python process):")
    for k, s in medians.items():
        mark = "" if k not in ANSWERS else ("  (< 2 s)" if s < TARGET_S else "  (over 2 s)")
        print(f"  {k:<42} {s:6.2f} s{mark}")
    if 'python -c "import torch"' in medians:
        base = medians['python -c "import torch"']
        print("ratio to `import torch`: " + ", ".join(f"{k.split(' (')[0]} {medians[k] / base:.2f}x" for k in ANSWERS))
    out = {"repeats": args.repeats, "median_s": medians, "target_s": TARGET_S}
    if args.json is not None:
        write_text(args.json, json_text(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
