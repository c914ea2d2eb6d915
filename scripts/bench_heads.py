"""Benchmark: `scan_heads` over the default corpus vs plain forward passes over
the same tokens (target: scan <= 1.5x a plain forward).

    PYTHONPATH=. python scripts/bench_heads.py [--model smollm2] [--n-prompts 170] [--json OUT]

Prints the wall time of (a) plain forward passes `model(tokens)`, (b) the same
passes stopped after the last block (what the scan needs: no unembedding),
(c) the scan, and the ratios c/a and c/b, measured side by side in one run.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from sinkmech.options import RunOptions


def main(argv: list[str] | None = None) -> int:
    from sinkmech.dormant.scan import scan_heads
    from sinkmech.files import write_text
    from sinkmech.loading.models import load_model
    from sinkmech.prompts import default_corpus, tokenize

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--n-prompts", type=int, default=170)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--json", type=Path, default=None, help="also write the scan's JSON here")
    args = p.parse_args(argv)

    model = load_model(args.model)
    prompts = default_corpus()[: args.n_prompts]
    batch = tokenize(model, prompts, bos="prepend", max_tokens=args.max_tokens)
    sync = torch.cuda.synchronize if model.cfg.device.startswith("cuda") else (lambda: None)

    def forward(**kw) -> float:
        sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            for s in range(0, len(batch), args.batch_size):
                model(batch.slice(s, min(s + args.batch_size, len(batch))).tokens, **kw)
        sync()
        return time.perf_counter() - t0

    forward(stop_at_layer=1)  # warm-up
    plain = forward()
    blocks = forward(stop_at_layer=model.cfg.n_layers)
    sync()
    t0 = time.perf_counter()
    scan = scan_heads(model, batch, options=RunOptions(batch_size=args.batch_size, progress=False))
    sync()
    t_scan = time.perf_counter() - t0
    n_tok = int(batch.lengths.sum())
    print(f"{args.model}: {len(batch)} prompts, {n_tok} tokens, device {model.cfg.device}, {torch.get_num_threads()} threads")
    print(f"plain forward (with logits)      {plain:8.2f} s")
    print(f"forward through the last block   {blocks:8.2f} s")
    print(f"scan_heads                       {t_scan:8.2f} s")
    print(f"ratio scan / plain forward       {t_scan / plain:8.2f}x  (target <= 1.5x)")
    print(f"ratio scan / forward w/o logits  {t_scan / blocks:8.2f}x")
    print("labels: " + ", ".join(f"{v} {k}" for k, v in scan.mode_counts().items()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_text(args.json, scan.to_json(profiles=True))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
