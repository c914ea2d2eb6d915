"""Benchmark: the no-op check's stacked restarted passes vs one pass per intervention vs a full forward each.

Measured side by side in one run, on the same prompts and heads, the three
methods of `noop_check`:
- "restart" (the default): each intervened pass restarts at the head's layer
  from the clean residual, on the prompts that hold an intervened query only,
  the three interventions of one set of queries stacked along the batch axis
  in one pass; the positions they can change are unembedded a full chunk at a
  time across passes;
- "restart_each": the same restart, one pass and one unembedding per
  intervention, on every prompt of the batch;
- "full", the reference: a whole forward pass per intervention, every
  position scored.
All three give the same numbers (every per-query effect and matched control
is checked here against "restart", to 1e-4 nats per query). The methods run
interleaved, round after round; wall-clock and CPU seconds are printed, with
each method's ratio to "restart".

    python scripts/bench_noop.py --model smollm2 --threads 1
    python scripts/bench_noop.py --model gemma3-270m --methods restart restart_each
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from sinkmech.options import QUIET

# the heads `make demo` checks (compare's if_else heads at the default cut, then its three closest candidates)
DEMO_HEADS = {
    "smollm2": ["15.0", "28.4", "20.0", "25.0", "14.2", "26.2", "26.8", "18.2", "22.7", "20.6", "20.5", "18.6"],
    "gemma3-270m": ["1.0", "1.1", "1.3", "11.1", "12.0", "5.1"],
}
METHODS = ("restart", "restart_each", "full")


def effects(check) -> dict[str, float]:
    """Every per-query effect and matched-control difference of a NoopCheck, by a flat key."""
    from sinkmech.findings import flatten

    out = {}
    for r in check.results:
        for k, v in flatten(f"L{r.layer}.H{r.head}", r.to_dict()).items():
            if isinstance(v, float) and k.endswith(("per_query.value", "difference.value")):
                out[k] = v
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--heads", nargs="+", default=None, help="LAYER.HEAD (default: the heads the demo checks)")
    p.add_argument("--n-prompts", type=int, default=16, help="held-out prompts (default 16, from prompt 64; the demo checks 8)")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    methods = list(dict.fromkeys(["restart", *args.methods]))  # the others are compared with "restart"

    import torch

    from sinkmech.dormant.noop import noop_check
    from sinkmech.files import json_text
    from sinkmech.hooks import parse_head
    from sinkmech.loading.models import load_model
    from sinkmech.prompts import load_prompts, tokenize

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    model = load_model(args.model)
    heads = [parse_head(h, model) for h in (args.heads or DEMO_HEADS.get(args.model, ["0.0"]))]
    batch = tokenize(model, load_prompts(None)[64 : 64 + args.n_prompts], bos="prepend", max_tokens=args.tokens)
    results, wall, cpu = {}, {m: [] for m in methods}, {m: [] for m in methods}
    for _ in range(args.repeats):
        for method in methods:
            w, c = time.perf_counter(), time.process_time()
            results[method] = noop_check(model, batch, heads, method=method, options=QUIET)
            wall[method].append(time.perf_counter() - w)
            cpu[method].append(time.process_time() - c)
    med = {m: sorted(v)[len(v) // 2] for m, v in wall.items()}
    med_cpu = {m: sorted(v)[len(v) // 2] for m, v in cpu.items()}
    ref = effects(results["restart"])
    worst = {}
    for m in methods[1:]:
        other = effects(results[m])
        if other.keys() != ref.keys():
            raise SystemExit(f"{m} reports other effects than restart")
        worst[m] = max((abs(v - other[k]) for k, v in ref.items()), default=0.0)
    out = {"model": args.model, "heads": [f"L{l}.H{h}" for l, h in heads], "n_prompts": len(batch),
           "tokens": args.tokens, "threads": torch.get_num_threads(), "wall_s": med, "cpu_s": med_cpu,
           "over_restart": {m: med[m] / med["restart"] for m in methods},
           "over_restart_cpu": {m: med_cpu[m] / med_cpu["restart"] for m in methods},
           "max_abs_difference": worst}
    print(f"{args.model}, {len(heads)} heads ({', '.join(out['heads'])}), {len(batch)} prompts x {args.tokens} tokens, "
          f"{out['threads']} torch thread(s):")
    print(f"  {'method':<13} {'wall s':>8} {'CPU s':>8} {'/ restart wall':>15} {'/ restart CPU':>14}")
    for m in methods:
        print(f"  {m:<13} {med[m]:>8.1f} {med_cpu[m]:>8.1f} {out['over_restart'][m]:>14.2f}x "
              f"{out['over_restart_cpu'][m]:>13.2f}x")
    for m, d in worst.items():
        print(f"  largest difference from restart, {m}: {d:.2e} nats per query ({len(ref)} effects)")
    bad = {m: d for m, d in worst.items() if d > 1e-4}
    if bad:
        raise SystemExit(f"the methods disagree: {bad}")
    if args.json is not None:
        args.json.write_text(json_text(out))
    return out


if __name__ == "__main__":
    main()
