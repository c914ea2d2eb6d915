"""How much of the `<bos>` cost do the sink heads carry (`sinkmech.controls.bos_cost`)?
Each head's `mask_first` loss change on content targets, ranked on the first
--select prompts; on the next --eval prompts (held out), the first key masked
in the top 1, 2, 4, 8, 16 heads at once, against removing `<bos>`.

    python scripts/bos_cost.py --models gemma3-270m --out figures/bos_cost.json --findings figures/findings.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from sinkmech.loading import models
from sinkmech.controls.bos_cost import bos_cost
from sinkmech.files import json_text
from sinkmech.findings import flatten, record
from sinkmech.prompts import default_corpus


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["gemma3-270m"])
    p.add_argument("--select", type=int, default=8, help="prompts the heads are ranked on")
    p.add_argument("--eval", type=int, default=32, help="held-out prompts the top heads are masked on")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--ks", type=int, nargs="+", default=None, help="top-k head counts (default 1 2 4 8 16)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--out", type=Path, required=True, help="JSON output (other models' results in it stay)")
    p.add_argument("--findings", type=Path, default=None, help="merge into this findings file under <model>.bos_cost")
    args = p.parse_args(argv)
    if args.select < 1 or args.eval < 2 or args.max_tokens < 2:
        print("error: --select >= 1, --eval >= 2 and --max-tokens >= 2", file=sys.stderr)
        return 2
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for name in args.models:
        t0 = time.perf_counter()
        model = models.load_model(name)
        r = results[name] = bos_cost(model, default_corpus()[: args.select + args.eval], select_prompts=args.select,
                                     eval_prompts=args.eval, ks=args.ks, max_tokens=args.max_tokens,
                                     batch_size=args.batch_size)
        r["max_tokens"], r["seconds"] = args.max_tokens, round(time.perf_counter() - t0, 1)
        del model
        args.out.write_text(json_text(results))
        if args.findings is not None:
            record(args.findings, flatten(f"{name}.bos_cost", r), replace_prefix=f"{name}.bos_cost")
        e = r["eval"]
        print(f"{name}: removing <bos> costs {e['no_bos'][0]:+.3f} [{e['no_bos'][1]:+.3f}, {e['no_bos'][2]:+.3f}] "
              f"nats per target on {e['n_prompts']} held-out prompts")
        for k, v in e["top_k"].items():
            print(f"  top {k:>2} heads masked: {v['loss_change'][0]:+.3f} nats, share {v['share'][0]:.3f} "
                  f"[{v['share'][1]:.3f}, {v['share'][2]:.3f}]  ({', '.join(v['heads'][:4])}{' ...' if int(k) > 4 else ''})")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
