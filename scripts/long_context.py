"""The long-context study (`sinkmech.studies.long_context`) on one model: the
result as JSON, the figure (PNG and SVG) and the findings under `<model>.long.*`.

    python scripts/long_context.py --model gemma3-270m --out figures [--findings figures/findings.json]
        [--config CONFIG.toml|.json] [--lengths 512 2048 8192] [--n-prompts 4]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from sinkmech.files import json_text, write_text
from sinkmech.findings import record
from sinkmech.loading import models
from sinkmech.options import RunOptions
from sinkmech.plots.long_context import long_context_figure
from sinkmech.studies.configs import LongContextConfig
from sinkmech.studies.long_context import run


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--findings", type=Path, default=None)
    ap.add_argument("--config", type=Path, default=None)
    ap.add_argument("--lengths", type=int, nargs="+", default=None)
    ap.add_argument("--n-prompts", type=int, default=None)
    args = ap.parse_args(argv)
    config = LongContextConfig.read(args.config) if args.config else LongContextConfig()
    changes = {k: v for k, v in (("lengths", args.lengths), ("n_prompts", args.n_prompts)) if v is not None}
    config = config.replace(**changes) if changes else config
    need = max(*config.lengths, config.stream_length,
               config.collapse_prefix + max(config.collapse_repeats, default=0) + 1) + 1
    model = models.load_model(args.model, n_ctx=need)
    start = time.perf_counter()
    result = run(model, config, RunOptions(progress=True))
    d = result.to_dict() | {"seconds": round(time.perf_counter() - start, 1)}
    stem = f"long_context_{args.model}"
    write_text(args.out / f"{stem}.json", json_text(d))
    for suffix in (".png", ".svg"):
        print(f"wrote {long_context_figure(d, args.out / f'{stem}{suffix}')}", file=sys.stderr)
    if args.findings is not None:
        record(args.findings, result.findings(), replace_prefix=f"{result.model_name}.long")
        print(f"recorded findings in {args.findings}", file=sys.stderr)


if __name__ == "__main__":
    main()
