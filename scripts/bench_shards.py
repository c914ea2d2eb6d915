"""Sharded runs: 1 process vs 2 local Ray workers on the same prompts, and the cost
of partial files.

Each run is `sinkmech sinks` end to end in a fresh process, as a user runs it:
the Ray run includes starting the local cluster and loading the model in each
worker. Both run interleaved, round after round (`benchtime.interleaved_medians`).
On 2 cores there is little to gain: two workers share the cores the single
process already uses. Also prints the size of a sinks part and of a heads part
per 1,000 prompts (sinks parts grow with the prompts; a heads part is mostly
sparse trigger counts and grows with the distinct (head, token) pairs seen).

    python scripts/bench_shards.py --prompts 64 --max-tokens 64 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's sinkmech
from benchtime import interleaved_medians


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--prompts", type=int, default=64, help="prompts of the default corpus")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    root = Path(__file__).resolve().parent.parent
    # each side uses its own default threads: torch takes every core in one process;
    # Ray gives each worker one CPU (OMP_NUM_THREADS=1)
    env = {**{k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}, "PYTHONPATH": str(root)}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        from sinkmech.prompts import load_prompts

        corpus = load_prompts(None)
        if args.prompts > len(corpus):
            p.error(f"--prompts: the default corpus has {len(corpus)} prompts")
        (tmp / "prompts.json").write_text(json.dumps(corpus[: args.prompts]))
        common = ["--model", args.model, "--prompts", str(tmp / "prompts.json"), "--max-tokens", str(args.max_tokens)]
        base = [sys.executable, "-m", "sinkmech.cli", "sinks", *common, "--bos", "both"]

        def run(extra: list[str]) -> None:
            subprocess.run([*base, *extra], check=True, env=env, cwd=tmp, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)

        times = interleaved_medians({
            "1 process": lambda: run(["--json", str(tmp / "single.json")]),
            f"{args.workers} Ray workers": lambda: run(["--ray", "--workers", str(args.workers),
                                                        "--json", str(tmp / "ray.json")]),
        }, args.repeats)
        single, ray = times["1 process"], times[f"{args.workers} Ray workers"]
        print(f"sinks, {args.model}, {args.prompts} prompts x {args.max_tokens} tokens, both conditions "
              f"(median of {args.repeats}, end to end, fresh process each)")
        print(f"  1 process          {single:7.1f} s")
        print(f"  {args.workers} Ray workers      {ray:7.1f} s   ratio ray / single {ray / single:.2f}x, "
              f"overhead {ray - single:+.1f} s")
        run(["--shard", "1/1", "--json", str(tmp / "sinks.partial.json")])
        subprocess.run([sys.executable, "-m", "sinkmech.cli", "heads", *common, "--noop", "0", "--shard", "1/1",
                        "--json", str(tmp / "heads.partial.json")], check=True, env=env, cwd=tmp,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        sinks_kb = (tmp / "sinks.partial.json").stat().st_size / 1024
        heads_kb = (tmp / "heads.partial.json").stat().st_size / 1024
        print(f"  sinks part: {sinks_kb:.0f} KiB for {args.prompts} prompts = "
              f"{sinks_kb / args.prompts * 1000 / 1024:.1f} MiB per 1,000 prompts (both conditions)")
        print(f"  heads part: {heads_kb / 1024:.1f} MiB for the same {args.prompts} prompts (mostly sparse trigger "
              "counts per (head, token): they grow with the distinct pairs seen, less than linearly)")
    return {"single_s": single, "ray_s": ray, "sinks_kib": sinks_kb, "heads_kib": heads_kb}


if __name__ == "__main__":
    main()
