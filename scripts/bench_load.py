"""Cold vs warm model loading through the converted-model cache.

Cold: a fresh, empty cache folder (GGUF -> HookedTransformer, then the entry
is written; on TransformerLens 4, GGUF -> a Hugging Face folder, then the
Bridge boots it). Warm: the same call again, read back from that entry. Run it
in each environment (`make setup`, `make setup-tl4`) for both backends. Targets on
2 CPU cores: warm SmolLM2 <= 5 s, warm Gemma 3 270M <= 10 s.

    python scripts/bench_load.py --models smollm2 gemma3-270m --out bench/
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path

from sinkmech.loading.backend import BACKEND
from sinkmech.files import json_text, write_text
from sinkmech.loading.cache import ModelCache
from sinkmech.loading.models import load_model

DEFAULT_MODELS = ("smollm2", "gemma3-270m")


def bench(spec: str, cache_root: Path, *, n_ctx: int = 2048) -> dict:
    """Seconds for a cold load into an empty cache at `cache_root`, then a warm one."""
    cache = ModelCache(cache_root)
    t0 = time.perf_counter()
    model = load_model(spec, device="cpu", n_ctx=n_ctx, cache=cache)
    cold = time.perf_counter() - t0
    del model
    gc.collect()
    t0 = time.perf_counter()
    model = load_model(spec, device="cpu", n_ctx=n_ctx, cache=cache)
    warm = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters())
    del model
    gc.collect()
    return {"model": spec, "backend": BACKEND, "cold_s": cold, "warm_s": warm, "ratio": cold / warm,
            "n_params": n_params}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    parser.add_argument("--n-ctx", type=int, default=2048)
    parser.add_argument("--out", type=Path, default=None, help="folder for bench_load.json")
    args = parser.parse_args(argv)
    rows = []
    for spec in args.models:
        # Each model gets its own empty cache, so "cold" really converts; the
        # shared GGUF hash memo and the assembled Gemma file live there too.
        with tempfile.TemporaryDirectory(prefix="sinkmech-bench-") as root:
            row = bench(spec, Path(root), n_ctx=args.n_ctx)
        rows.append(row)
        print(f"{spec:>12} ({BACKEND}): cold {row['cold_s']:6.1f} s  warm {row['warm_s']:5.1f} s  ratio {row['ratio']:5.1f}x", flush=True)
    if args.out is not None:
        write_text(args.out / "bench_load.json", json_text(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
