"""Benchmark: the no-op check's restarted passes vs a full forward per intervention.

Measured side by side in one run, on the same prompts and heads: `noop_check`
with method "restart" (each intervened pass restarts at the head's layer from
the clean residual, and only the positions from a prompt's first intervened
query on are unembedded) and method "full" (the reference: a whole forward
pass per intervention, every position scored). Both give the same numbers
(checked here to 1e-4 nats per query); the ratio is what the restart saves.
The phases run interleaved (`benchtime.interleaved_medians`); wall-clock and
CPU seconds are printed.

    python scripts/bench_noop.py --model gemma3-270m --heads 1.1 1.3 1.0
    python scripts/bench_noop.py --model smollm2 --heads 20.6 18.6 17.3
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

DEMO_HEADS = {"gemma3-270m": ["1.1", "1.3", "1.0"], "smollm2": ["20.6", "18.6", "17.3"]}  # compare's candidates


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--heads", nargs="+", default=None, help="LAYER.HEAD (default: the demo's three candidates)")
    p.add_argument("--n-prompts", type=int, default=16, help="held-out prompts (compare's start at 64)")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)

    from sinkmech.dormant.noop import noop_check
    from sinkmech.files import json_text
    from sinkmech.hooks import parse_head
    from sinkmech.loading.models import load_model
    from sinkmech.prompts import load_prompts, tokenize

    model = load_model(args.model)
    heads = [parse_head(h, model) for h in (args.heads or DEMO_HEADS.get(args.model, ["0.0"]))]
    batch = tokenize(model, load_prompts(None)[64 : 64 + args.n_prompts], bos="prepend", max_tokens=args.tokens)
    results, wall, cpu = {}, {"restart": [], "full": []}, {"restart": [], "full": []}
    for _ in range(args.repeats):
        for method in ("restart", "full"):
            w, c = time.perf_counter(), time.process_time()
            results[method] = noop_check(model, batch, heads, method=method, progress=False)
            wall[method].append(time.perf_counter() - w)
            cpu[method].append(time.process_time() - c)
    worst = 0.0
    for a, b in zip(results["restart"].results, results["full"].results):
        for k in ("per_query_dormant", "per_query_active", "zero_dormant", "zero_active"):
            x, y = getattr(a, k), getattr(b, k)
            if x is not None and y is not None:
                worst = max(worst, abs(x - y))
    med = {m: sorted(v)[len(v) // 2] for m, v in wall.items()}
    med_cpu = {m: sorted(v)[len(v) // 2] for m, v in cpu.items()}
    out = {"model": args.model, "heads": [f"L{l}.H{h}" for l, h in heads], "n_prompts": len(batch),
           "tokens": args.tokens, "wall_s": med, "cpu_s": med_cpu, "full_over_restart": med["full"] / med["restart"],
           "full_over_restart_cpu": med_cpu["full"] / med_cpu["restart"], "max_abs_difference": worst}
    print(f"{args.model}, heads {', '.join(out['heads'])}, {len(batch)} prompts x {args.tokens} tokens:")
    print(f"  restart: {med['restart']:.1f} s wall ({med_cpu['restart']:.1f} s CPU)")
    print(f"  full:    {med['full']:.1f} s wall ({med_cpu['full']:.1f} s CPU)")
    print(f"  full / restart: {out['full_over_restart']:.2f}x wall, {out['full_over_restart_cpu']:.2f}x CPU; "
          f"largest difference {worst:.2e} nats per query")
    if worst > 1e-4:
        raise SystemExit(f"the two methods disagree by {worst:.2e} nats per query")
    if args.json is not None:
        args.json.write_text(json_text(out))
    return out


if __name__ == "__main__":
    main()
