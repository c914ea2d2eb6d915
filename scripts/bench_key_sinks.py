"""Benchmark: streamed key-position sink scores vs a plain forward over the same tokens.

Measured side by side in one run, interleaved over repeats (median time).

    python scripts/bench_key_sinks.py [--model smollm2] [--prompts 64] [--tokens 64] [--repeats 3]
"""

from __future__ import annotations

import argparse

import torch

from benchtime import interleaved_medians
from sinkmech.hooks import run
from sinkmech.measures.key_sinks import key_sink_scores
from sinkmech.loading.models import load_model
from sinkmech.prompts import default_corpus, tokenize
from sinkmech.options import RunOptions


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)

    model = load_model(args.model)
    batch = tokenize(model, default_corpus()[: args.prompts], bos="prepend", max_tokens=args.tokens)
    bs, L = args.batch_size, model.cfg.n_layers

    def plain():
        for i in range(0, len(batch), bs):
            run(model, batch.tokens[i : i + bs], stop_at_layer=L)

    def keys():
        key_sink_scores(model, batch, options=RunOptions(batch_size=bs, progress=False))

    phases = {"plain forward (no unembed)": plain, "key_sink_scores": keys}
    keys()  # warm-up
    med = interleaved_medians(phases, args.repeats)
    print(f"{args.model}: {args.prompts} prompts x {args.tokens} tokens (+<bos>), batch {bs}, "
          f"{torch.get_num_threads()} threads, median of {args.repeats}")
    for k, v in med.items():
        print(f"  {k:<28} {v:7.2f} s")
    ratio = med["key_sink_scores"] / med["plain forward (no unembed)"]
    print(f"ratio key_sink_scores / plain = {ratio:.3f}")
    return {"seconds": med, "ratio": ratio}


if __name__ == "__main__":
    main()
