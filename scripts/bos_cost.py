"""How much of the `<bos>` cost do the sink heads carry (`sinkmech.studies.bos_cost`)?
Each head's `mask_first` loss change on content targets, ranked on the first
--select prompts; on the next --eval prompts (held out), the first key masked
in the top 1, 2, 4, 8, 16 heads at once, against removing `<bos>`.

    python scripts/bos_cost.py --models gemma3-270m --out figures/bos_cost.json --findings figures/findings.json

With --checkpoints, models trained here (`sinkmech train study text`; each a
directory `save_checkpoint` wrote) instead, on their own held-out text windows
(`sinkmech.studies.text_bos_cost`): --select windows from the first half of the
validation split rank the heads, --eval windows from the second half are held
out; findings under `train.text.bos_cost.<run>`. With --logs, each run's log
beside its checkpoint is compared with the committed one of the same name.

    python scripts/bos_cost.py --checkpoints runs/train/text/text-L2H4-wd0-fixedbos-s0 --select 64 --eval 256 \
        --out figures/train/text_bos_cost.json --logs figures/train/logs/text \
        --findings figures/train/findings_train.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from sinkmech.loading import models
from sinkmech.studies.bos_cost import bos_cost
from sinkmech.files import json_text
from sinkmech.findings import flatten, record
from sinkmech.corpora import default_corpus
from sinkmech.options import RunOptions


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["gemma3-270m"])
    p.add_argument("--checkpoints", nargs="+", type=Path, default=None,
                   help="trained run directories (model.safetensors, config.json): measured instead of --models")
    p.add_argument("--logs", type=Path, default=None,
                   help="with --checkpoints: committed logs <logs>/<run>.json to compare each run's log.json with")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
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
    if args.checkpoints:
        return trained(args, results)
    for name in args.models:
        t0 = time.perf_counter()
        model = models.load_model(name)
        r = results[name] = bos_cost(model, default_corpus()[: args.select + args.eval], select_prompts=args.select,
                                     eval_prompts=args.eval, ks=args.ks, max_tokens=args.max_tokens,
                                     options=RunOptions(batch_size=args.batch_size))
        r["max_tokens"], r["seconds"] = args.max_tokens, round(time.perf_counter() - t0, 1)
        del model
        args.out.write_text(json_text(results))
        if args.findings is not None:
            record(args.findings, flatten(f"{name}.bos_cost", r), replace_prefix=f"{name}.bos_cost")
        e = r["eval"]
        print(f"{name}: removing <bos> costs {e['no_bos'][0]:+.3f} [{e['no_bos'][1]:+.3f}, {e['no_bos'][2]:+.3f}] "
              f"nats per target on {e['n_prompts']} held-out prompts")
        print_top_k(e)
    print(f"wrote {args.out}")
    return 0


def print_top_k(e: dict) -> None:
    for k, v in e["top_k"].items():
        share = "n/a" if v["share"] is None else f"{v['share'][0]:.3f} [{v['share'][1]:.3f}, {v['share'][2]:.3f}]"
        print(f"  top {k:>2} heads masked: {v['loss_change'][0]:+.4f} nats, share {share}  "
              f"({', '.join(v['heads'][:4])}{' ...' if int(k) > 4 else ''})")


def trained(args, results: dict) -> int:
    """--checkpoints: each trained run on its own held-out windows."""
    import torch

    from sinkmech.studies.text_bos_cost import FINDINGS_PREFIX, bos_cost_findings, checkpoint_bos_cost, reproduction

    torch.set_num_threads(args.threads)
    for run_dir in args.checkpoints:
        t0 = time.perf_counter()
        r = checkpoint_bos_cost(run_dir, n_select=args.select, n_eval=args.eval, ks=args.ks,
                                options=RunOptions(batch_size=args.batch_size, progress=True))
        name = r["run"]
        if args.logs is not None:
            committed, log = args.logs / f"{name}.json", run_dir / "log.json"
            if committed.exists() and log.exists():
                r["reproduction"] = reproduction(json.loads(log.read_text()), json.loads(committed.read_text()))
        r["seconds"] = round(time.perf_counter() - t0, 1)
        results[name] = r
        args.out.write_text(json_text(results))
        if args.findings is not None:
            record(args.findings, bos_cost_findings({name: r}), replace_prefix=f"{FINDINGS_PREFIX}.{name}")
        e = r["eval"]
        print(f"{name}: removing <bos> costs {e['no_bos'][0]:+.4f} [{e['no_bos'][1]:+.4f}, {e['no_bos'][2]:+.4f}] "
              f"nats per target on {e['n_prompts']} held-out windows of {r['content_tokens']} tokens")
        print_top_k(e)
        if "reproduction" in r:
            rep = r["reproduction"]
            print("  against the committed log: " + ", ".join(
                f"{k} {v[0]:.4f} vs {v[1]:.4f}" for k, v in rep.items() if isinstance(v, list) and k != "step"))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
