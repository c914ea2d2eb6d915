"""How fast the command line answers: `sinkmech --help`, a command's `--help`
and a rejected flag (`sinks --batch-size 0`), each a fresh `python -m
sinkmech.cli` process, beside `python -c "import torch"` and `python -c "import
transformer_lens"` for reference (what every answer paid when the parser
imported the analyses). Phases run interleaved (`benchtime.interleaved_medians`);
medians of wall seconds. Target: under 2 s for each answer.

`--ray-timeout S` also times, once, `sinks --ray 127.0.0.1:PORT --ray-timeout S`
at a free loopback port where nothing listens: the run must end with exit 1
and one `error:` line naming the address, within S seconds plus start-up.

    python scripts/bench_cli.py --repeats 5
    python scripts/bench_cli.py --repeats 1 --no-reference --ray-timeout 60
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
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


def unanswered_ray(timeout_s: float) -> float:
    """Wall seconds until `sinks --ray` at a loopback address where nothing
    listens gives up (exit 1, one `error:` line naming the address)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"  # free once closed: nothing listens there
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "sinkmech.cli", "sinks", "--model", "smollm2", "--n-prompts", "2",
                               "--ray", address, "--ray-timeout", str(timeout_s), "--json", f"{tmp}/sinks.json"],
                              cwd=REPO, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    if done.returncode != 1 or len(errors) != 1 or address not in errors[0]:
        raise SystemExit(f"--ray {address}: exit {done.returncode}, expected 1 and one error line: {done.stderr[-500:]}")
    print(f"  {errors[0]}")
    return seconds


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--no-reference", action="store_true", help="skip the import torch / transformer_lens lines")
    p.add_argument("--json", type=Path, default=None, help="also write the medians here")
    p.add_argument("--ray-timeout", type=float, default=None,
                   help="also time `sinks --ray` at an unanswered loopback address with this timeout")
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
    if args.ray_timeout is not None:
        ray_s = out["unanswered_ray_s"] = unanswered_ray(args.ray_timeout)
        print(f"  sinks --ray at an unanswered address, --ray-timeout {args.ray_timeout:g}: ended in {ray_s:.1f} s "
              f"({ray_s - args.ray_timeout:+.1f} s past the timeout)")
    if args.json is not None:
        write_text(args.json, json_text(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
