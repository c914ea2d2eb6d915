"""Sharded runs: 1 process vs 2 local Ray workers on the same prompts, and the cost
of partial files.

Each run is `sinkmech sinks` end to end in a fresh process, as a user runs it:
the Ray run includes starting the local cluster and loading the model in each
worker. Both run interleaved, round after round (`benchtime.interleaved_medians`).
On 2 cores there is little to gain: two workers share the cores the single
process already uses. Also prints the size of a sinks part and of a heads part
per 1,000 prompts (see `heads_part_sizes`).

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
from sinkmech.files import json_text


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
        from sinkmech.corpora import load_prompts

        corpus = load_prompts(None)
        if args.prompts > len(corpus):
            p.error(f"--prompts: the default corpus has {len(corpus)} prompts")
        (tmp / "prompts.json").write_text(json_text(corpus[: args.prompts], indent=None))
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
        sinks_kb = (tmp / "sinks.partial.json").stat().st_size / 1024
        print(f"  sinks part: {sinks_kb:.0f} KiB for {args.prompts} prompts = "
              f"{sinks_kb / args.prompts * 1000 / 1024:.1f} MiB per 1,000 prompts (both conditions)")
        heads = heads_part_sizes(common, args.prompts, tmp, env)
    return {"single_s": single, "ray_s": ray, "sinks_kib": sinks_kb, **heads}


def heads_part_sizes(common: list[str], n: int, tmp: Path, env: dict) -> dict:
    """A heads part holds fixed-size sums (moments, bands, positions: independent of
    the prompts), trigger counts (sparse: they grow with the distinct (head, token)
    pairs seen, less than linearly) and per-prompt rows. Measured on the first n/2
    and on all n prompts: the growth per prompt between them, extrapolated
    linearly to 1,000 prompts (an upper bound: the trigger counts grow less)."""
    sizes = {}
    for k in (n // 2, n):
        path = tmp / f"heads-{k}.partial.json"
        subprocess.run([sys.executable, "-m", "sinkmech.cli", "heads", *common, "--n-prompts", str(k), "--noop", "0",
                        "--shard", "1/1", "--json", str(path)], check=True, env=env, cwd=tmp,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        sizes[k] = path.stat().st_size / 1024**2
        rows = json.loads(path.read_text())["rows"]
        sizes[f"rows_{k}"] = len(json_text(rows, compact=True)) / 1024**2
    per_prompt = (sizes[n] - sizes[n // 2]) / (n - n // 2)
    print(f"  heads part: {sizes[n // 2]:.1f} MiB for {n // 2} prompts, {sizes[n]:.1f} MiB for {n} "
          f"(per-prompt rows {sizes[f'rows_{n}']:.1f} MiB); growth {1024 * per_prompt:.0f} KiB per prompt -> "
          f"<= {sizes[n] + per_prompt * (1000 - n):.0f} MiB per 1,000 prompts")
    return {"heads_mib": sizes[n], "heads_half_mib": sizes[n // 2], "heads_per_prompt_kib": 1024 * per_prompt,
            "heads_per_1000_mib": sizes[n] + per_prompt * (1000 - n)}


if __name__ == "__main__":
    main()
