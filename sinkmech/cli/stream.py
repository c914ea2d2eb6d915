"""`sinkmech stream`: perplexity of one long text under sliding-window
attention, keeping the first keys (the sink) or not (Xiao et al. 2024,
StreamingLLM), against full attention; the same scored tokens in every setting."""

from __future__ import annotations

import sys
from pathlib import Path

from sinkmech.cli.common import (
    add_attention,
    MODEL_HELP, model_name, UsageError, image_file, load_model_arg, non_negative_int, output_file, positive_int, write_results,
)
from sinkmech.loading.names import DEFAULT_MODEL
from sinkmech.findings import flatten, record


def add_stream_parser(sub) -> None:
    p = sub.add_parser("stream", help="perplexity under sliding-window attention, with and without the first keys (StreamingLLM)")
    p.add_argument("--model", type=model_name, default=DEFAULT_MODEL, help=MODEL_HELP)
    p.add_argument("--window", type=positive_int, default=64, help="keys (t - W, t] each query sees (default 64)")
    p.add_argument("--keep", type=non_negative_int, nargs="+", default=[0, 1, 4],
                   help="first keys kept visible beside the window, one run each (0: window only; default 0 1 4)")
    p.add_argument("--max-tokens", type=positive_int, default=512, help="content tokens of the long text (default 512)")
    p.add_argument("--bos", choices=["prepend", "none"], default="prepend", help="<bos> before the text (default prepend)")
    p.add_argument("--reindex", action="store_true",
                   help="number the kept first keys as StreamingLLM's cache does (0 .. keep-1, the window after them; "
                        "rotary models); default: every key keeps its original position")
    p.add_argument("--json", type=output_file, default=None, help="write results as JSON here ('-': stdout)")
    p.add_argument("--png", type=image_file, default=None, help="write a bar chart here (.png, .svg or .pdf)")
    p.add_argument("--findings", type=output_file, default=None,
                   help="merge the perplexities into this findings file, named MODEL.stream.BOS[.reindex].wWINDOW...")
    add_attention(p, needs_pattern="masks the attention scores of every query to a sliding window")
    p.set_defaults(func=cmd_stream)


def check_stream_args(window: int, keep: list[int], max_tokens: int, bos: str) -> int:
    """The window check of `stream_perplexity` (`sinkmech.context.first_scored`),
    before the model loads (each flag alone is checked by its type). Returns the
    first scored position."""
    from sinkmech.context import first_scored

    n_pos = max_tokens + (1 if bos == "prepend" else 0)
    try:
        return first_scored(window, keep, n_pos)
    except ValueError as e:
        above = window + max(keep) + 1 - (n_pos - max_tokens)
        raise UsageError(f"{e} (--window + max --keep): raise --max-tokens above {above} or lower --window") from None


def print_stream_table(result) -> None:
    print()
    print(f"perplexity over {result.n_scored} tokens (positions {result.scored_from}..{result.n_tokens - 2} predict the next)")
    print(f"{'attention':>28} {'ppl':>10}")
    print(f"{'full':>28} {result.full_ppl:>10.2f}")
    for k, p, c in zip(result.keep, result.ppl, result.control_ppl or (None,) * len(result.keep)):
        label = f"last {result.window}" + (f" + first {k}" if k else " only")
        print(f"{label:>28} {p:>10.2f}" + ("" if c is None else f"   (control: last {result.window + k} only, {c:.2f})"))
    print(f"positions: {result.positions()}")


def cmd_stream(args) -> None:
    from sinkmech.context import check_fits
    from sinkmech.context.stream import long_tokens, stream_perplexity
    from sinkmech.plots.mechanisms import stream_bars

    check_stream_args(args.window, args.keep, args.max_tokens, args.bos)
    model = load_model_arg(args)
    check_fits(args.max_tokens, model.cfg.n_ctx, args.bos == "prepend")  # before any compute
    batch = long_tokens(model, args.max_tokens, bos=args.bos)
    result = stream_perplexity(model, batch, window=args.window, keep=args.keep, reindex=args.reindex)
    print_stream_table(result)
    write_results(args, result.to_dict(), lambda: print(f"wrote {stream_bars(result, args.png, model_name=args.model)}"))
    if args.findings is not None:
        label = args.model if "/" not in args.model else Path(args.model).stem
        prefix = f"{label}.stream.{args.bos}{'.reindex' if args.reindex else ''}.w{args.window}"
        record(args.findings, flatten(prefix, result.to_dict()), replace_prefix=prefix)
        print(f"recorded findings in {args.findings}", file=sys.stderr)
