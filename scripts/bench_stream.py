"""Benchmark: sliding-window perplexity (one window setting) vs a plain forward over the same tokens.

Measured side by side in one run, interleaved over repeats (median time).

    python scripts/bench_stream.py [--model smollm2] [--tokens 512] [--window 128] [--keep 4] [--repeats 3]
"""

from __future__ import annotations

import argparse

import torch

from benchtime import interleaved_medians
from sinkmech.hooks import run
from sinkmech.loading.models import load_model
from sinkmech.context.stream import long_tokens, stream_perplexity
from sinkmech.options import QUIET


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--keep", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)

    model = load_model(args.model)
    batch = long_tokens(model, args.tokens, bos="prepend")

    def plain():
        run(model, batch.tokens)

    def stream():
        # one full-attention pass + one windowed pass
        stream_perplexity(model, batch, window=args.window, keep=(args.keep,), options=QUIET)

    phases = {"plain forward": plain, "stream_perplexity (full + 1 window)": stream}
    plain()  # warm-up
    med = interleaved_medians(phases, args.repeats)
    print(f"{args.model}: {int(batch.lengths[0])} positions, window {args.window}, keep {args.keep}, "
          f"{torch.get_num_threads()} threads, median of {args.repeats}")
    for k, v in med.items():
        print(f"  {k:<38} {v:7.2f} s")
    ratio = med["stream_perplexity (full + 1 window)"] / med["plain forward"]
    print(f"ratio stream / plain = {ratio:.3f}  (two passes: ~2 expected; per pass {ratio / 2:.3f})")
    return {"seconds": med, "ratio": ratio}


if __name__ == "__main__":
    main()
