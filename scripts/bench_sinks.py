"""Benchmark: streaming sink scores vs plain forward passes vs run_with_cache.

SmolLM2, 64 prompts x 64 content tokens (+ <bos>), all measured in one run,
interleaved over repeats (median time). Peak memory is the resident-set high
water mark above the level before each phase (Linux /proc/self/clear_refs).

    python scripts/bench_sinks.py [--prompts 64] [--tokens 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch

from sinkmech.hooks import run
from sinkmech.loading.models import load_model
from sinkmech.prompts import default_corpus, tokenize
from sinkmech.measures.sinks import sink_scores
from sinkmech.options import RunOptions


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure(fn) -> tuple[float, float]:
    """(seconds, peak MiB above the resident level at the start)."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    base = _rss_kib("VmRSS")
    t = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t
    return seconds, (_rss_kib("VmHWM") - base) / 1024


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)

    model = load_model(args.model)
    prompts = default_corpus()[: args.prompts]
    batch = tokenize(model, prompts, bos="prepend", max_tokens=args.tokens)
    bs = args.batch_size

    def plain():
        for i in range(0, len(batch), bs):
            run(model, batch.tokens[i : i + bs])

    def plain_no_unembed():
        for i in range(0, len(batch), bs):
            run(model, batch.tokens[i : i + bs], stop_at_layer=model.cfg.n_layers)

    def streaming():
        # The same tokens as the other phases: the timing holds no tokenization.
        sink_scores(model, batch, max_tokens=args.tokens, options=RunOptions(batch_size=bs, progress=False))

    def cached():
        scores = []
        with torch.no_grad():
            for i in range(0, len(batch), bs):
                _, cache = model.run_with_cache(batch.tokens[i : i + bs])
                scores.append(torch.stack([cache["pattern", l][:, :, :, 0].mean(-1) for l in range(model.cfg.n_layers)], 1))
                del cache
        return torch.cat(scores)

    phases = {"a plain forward": plain, "a' forward, no unembed": plain_no_unembed,
              "b sink_scores": streaming, "c run_with_cache": cached}
    times = {k: [] for k in phases}
    mems = {k: [] for k in phases}
    streaming()  # warm-up
    for _ in range(args.repeats):
        for name, fn in phases.items():
            s, m = measure(fn)
            times[name].append(s)
            mems[name].append(m)
    t = {k: statistics.median(v) for k, v in times.items()}
    m = {k: max(v) for k, v in mems.items()}
    print(f"{args.prompts} prompts x {args.tokens} tokens (+<bos>), batch {bs}, {torch.get_num_threads()} threads, "
          f"median of {args.repeats}")
    for k in phases:
        print(f"  {k:<24} {t[k]:7.2f} s   peak +{m[k]:7.1f} MiB")
    a, b, c = t["a plain forward"], t["b sink_scores"], t["c run_with_cache"]
    a_trunk = t["a' forward, no unembed"]
    print(f"time   b/a = {b / a:.3f}   (target <= 1.15)   b/a' = {b / a_trunk:.3f}   c/b = {c / b:.2f}")
    ma, mb = m["a plain forward"], m["b sink_scores"]
    print(f"memory b - a = {mb - ma:+.1f} MiB over a's +{ma:.1f} MiB peak "
          f"(b adds {100 * (mb - ma) / max(ma, 1e-9):+.1f} %; target <= 10 %)   "
          f"c/b = {m['c run_with_cache'] / max(mb, 1.0):.0f}x (b's peak counted as at least 1 MiB: below that is noise)")


if __name__ == "__main__":
    main()
