"""float32 against bfloat16 and float16 on the CPU, side by side: a `sinks`
forward pass (first-token scores and the loss, with `<bos>`) on a few short
prompts, for each offline model, in each dtype; the ratio to float32 is what
a user pays for a half-precision `--dtype` on this CPU. Beside it, the
256x256 matmul ratio `load_model`'s warning measures, and whether the CPU
reports native bfloat16 / float16 instructions.

Each model is loaded once per dtype (load time printed, not counted), then the
dtypes' forward passes run interleaved (`benchtime.interleaved_medians`).
`--as-avx2` reruns it with torch and oneDNN limited to AVX2
(ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2): what a CPU without
AVX-512 BF16 / FP16 or AMX pays, measured on one that has them.

    python scripts/bench_dtype.py --models smollm2 gemma3-270m --prompts 2 --tokens 32
    python scripts/bench_dtype.py --as-avx2 --repeats 1
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import torch
from benchtime import interleaved_medians

from sinkmech.files import json_text, write_text
from sinkmech.loading.models import cpu_slowdown, load_model, native_cpu_dtype
from sinkmech.prompts import default_corpus, tokenize
from sinkmech.measures.sinks import sink_scores
from sinkmech.options import RunOptions

DTYPES = ("float32", "bfloat16", "float16")
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def bench_model(spec: str, n_prompts: int, n_tokens: int, repeats: int) -> dict:
    """Median seconds of one `sinks` forward per dtype, and the ratio to float32."""
    loaded, load_s = {}, {}
    texts = default_corpus(n_prompts)
    for name in DTYPES:
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the slow-dtype warning: this script measures it
            model = load_model(spec, device="cpu", dtype=name)
        load_s[name] = time.perf_counter() - t
        loaded[name] = (model, tokenize(model, texts, bos="prepend", max_tokens=n_tokens))

    def forward(name: str):
        model, batch = loaded[name]
        return lambda: sink_scores(model, batch, loss=True, options=RunOptions(batch_size=n_prompts, progress=False))

    failed = {}

    def phase(name: str):
        """A dtype whose forward fails (overflows) is reported, not timed."""
        def run() -> None:
            if name not in failed:
                try:
                    forward(name)()
                except (FloatingPointError, RuntimeError) as e:
                    failed[name] = f"{type(e).__name__}: {e}"
        return run

    medians = interleaved_medians({name: phase(name) for name in DTYPES}, repeats)
    medians = {name: s for name, s in medians.items() if name not in failed}
    return {"load_s": load_s, "forward_s": medians, "failed": failed,
            "ratio_to_float32": {name: medians[name] / medians["float32"] for name in medians}}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["smollm2", "gemma3-270m"])
    p.add_argument("--prompts", type=int, default=2, help="prompts per forward pass (default 2)")
    p.add_argument("--tokens", type=int, default=32, help="content tokens per prompt (default 32)")
    p.add_argument("--repeats", type=int, default=2, help="interleaved rounds (default 2)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    p.add_argument("--as-avx2", action="store_true",
                   help="rerun with torch and oneDNN limited to AVX2 (no native bfloat16 / float16)")
    args = p.parse_args(argv)
    if args.as_avx2 and os.environ.get("ONEDNN_MAX_CPU_ISA") != AVX2_ENV["ONEDNN_MAX_CPU_ISA"]:
        rest = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--as-avx2"]
        os.execve(sys.executable, [sys.executable, __file__, "--as-avx2", *rest], {**os.environ, **AVX2_ENV})
    limited = {k: os.environ[k] for k in AVX2_ENV if k in os.environ}
    out = {
        "limited_isa": limited,
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "native": {name: native_cpu_dtype(getattr(torch, name)) for name in DTYPES[1:]},
        "matmul_256_ratio": {name: cpu_slowdown(getattr(torch, name)) for name in DTYPES[1:]},
        "prompts": args.prompts, "tokens": args.tokens, "repeats": args.repeats, "models": {},
    }
    print(f"CPU: {out['cpu_capability']}, {out['threads']} threads; flags: native bfloat16 {out['native']['bfloat16']}, "
          f"float16 {out['native']['float16']}" + (f" (torch limited: {limited})" if limited else "")
          + "; 256x256 matmul vs float32: "
          + ", ".join(f"{k} {v:.2f}x" for k, v in out["matmul_256_ratio"].items()))
    print(f"`sinks` forward, {args.prompts} prompts x {args.tokens} tokens, median of {args.repeats}:")
    print(f"{'model':<14} " + " ".join(f"{d:>12}" for d in DTYPES) + "   ratio to float32")
    for spec in args.models:
        r = out["models"][spec] = bench_model(spec, args.prompts, args.tokens, args.repeats)
        print(f"{spec:<14} " + " ".join(f"{r['forward_s'][d]:>11.2f}s" if d in r["forward_s"] else f"{'failed':>12}"
                                         for d in DTYPES) + "   "
              + ", ".join(f"{d} {r['ratio_to_float32'][d]:.2f}x" for d in DTYPES[1:] if d in r["ratio_to_float32"])
              + "   (load " + ", ".join(f"{r['load_s'][d]:.0f}" for d in DTYPES) + " s)", flush=True)
        for d, why in r["failed"].items():
            print(f"  {spec} {d}: {why}")
    if args.json is not None:
        write_text(args.json, json_text(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
