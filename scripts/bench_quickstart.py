"""Benchmark: the README's quick-start commands, each in a fresh process with its defaults.

For each command: the wall time from launch to exit (imports and the model load
from the converted-model cache included), and the longest silence on the
terminal, stderr (progress bars, notes) and stdout (tables, a report's section
lines) together: each text that arrives counts, from the launch, so a slow
import or load before the first line counts too: how long a user watches
nothing move. The outputs go to a temporary folder.
Run it with the cache warm (`make demo` fills it); `--avx2` limits torch's
kernels, MKL and oneDNN to AVX2 (a CPU without AVX-512); `--timeline DIR` writes
each command's updates on the terminal, each with its seconds since launch, to
DIR/NAME.txt (where a silence sits).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The README's quick start, in its order ({out}: the temporary folder).
COMMANDS = {
    "sinks": ["sinks", "--model", "gemma3-270m", "--bos", "both", "--json", "{out}/sinks.json", "--png", "{out}/sinks.png"],
    "heads": ["heads", "--model", "smollm2", "--json", "{out}/heads.json"],
    "report": ["report", "--model", "smollm2", "--out", "{out}/report"],
    "compare": ["study", "compare", "--models", "smollm2", "--n-prompts", "24", "--json", "{out}/compare.json"],
}
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def timed(argv: list[str], env: dict, timeline: list[str] | None = None) -> dict:
    """Run `sinkmech ARGV`; its wall seconds, exit status, and the longest gap between
    updates on stdout and stderr (with the text that ended it). Each update, with its seconds
    since launch, is appended to `timeline` when given."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "sinkmech.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env={**env, "PYTHONUNBUFFERED": "1"})
    last, gap, where = start, 0.0, ""
    # An update is text arriving: a progress bar writes "\r" and then its line, so
    # the text after the last separator is shown now, not when the next one comes.
    while chunk := proc.stdout.read1(4096):
        now = time.perf_counter()
        shown = [p.decode(errors="replace").strip() for p in chunk.replace(b"\r", b"\n").split(b"\n")]
        shown = [p for p in shown if p]
        if timeline is not None:
            timeline += [f"{now - start:7.1f} s  {p}" for p in shown]
        if shown:
            if now - last > gap:
                gap, where = now - last, shown[-1]
            last = now
    code = proc.wait()
    end = time.perf_counter()
    if end - last > gap:
        gap, where = end - last, "(exit)"
    return {"seconds": end - start, "exit": code, "longest_silence_s": gap, "silence_ended_by": where.strip()[:100]}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", choices=list(COMMANDS), default=list(COMMANDS))
    p.add_argument("--avx2", action="store_true", help="limit torch, MKL and oneDNN to AVX2 kernels")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--timeline", type=Path, default=None, metavar="DIR",
                   help="write each command's timestamped stderr updates to DIR/NAME.txt")
    args = p.parse_args(argv)
    env = {**os.environ, **(AVX2 if args.avx2 else {})}
    results = {}
    with tempfile.TemporaryDirectory() as out:
        for name in args.only:
            command = [a.format(out=out) for a in COMMANDS[name]]
            timeline = [] if args.timeline else None
            results[name] = r = {"command": "sinkmech " + " ".join(COMMANDS[name]).replace("{out}", "out"),
                                 **timed(command, env, timeline)}
            if timeline is not None:
                args.timeline.mkdir(parents=True, exist_ok=True)
                (args.timeline / f"{name}.txt").write_text("\n".join(timeline) + "\n")
            print(f"{r['command']}\n  {r['seconds']:.1f} s (exit {r['exit']}), longest silence "
                  f"{r['longest_silence_s']:.1f} s (ended by: {r['silence_ended_by']!r})", flush=True)
    out = {"avx2": args.avx2, "threads": os.environ.get("OMP_NUM_THREADS"), "commands": results}
    if args.json:
        from sinkmech.files import json_text, write_text

        write_text(args.json, json_text(out))
    return out


if __name__ == "__main__":
    main()
