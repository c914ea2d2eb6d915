"""`sinkmech massive`: massive-activation dimensions of the first token (Sun et
al. 2024) per residual layer, and the content loss and sink rate with those
dimensions reset at position 0 from the onset layer on."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from sinkmech.cli.common import (
    UsageError, add_common, load_model_arg, non_negative_float, positive_float, positive_int, prompts_arg, run_options,
    warn_short, write_results,
)
from sinkmech.cli.shard import ModelTask, add_shard_flags, model_settings, sharded
from sinkmech.options import RunOptions


def add_massive_parser(sub) -> None:
    p = sub.add_parser("massive", help="massive activations of the first token per layer, and the cost of resetting them")
    add_common(p)
    p.add_argument("--n-prompts", type=positive_int, default=32, help="use only the first N prompts (default 32)")
    p.add_argument("--bos", choices=["prepend", "none"], default="prepend", help="<bos> before each prompt (default prepend)")
    p.add_argument("--top", type=positive_int, default=4, help="dimensions listed per layer (default 4)")
    p.add_argument("--threshold", type=positive_float, default=10.0,
                   help="onset: first layer where ||h_0|| / mean ||h_t|| exceeds this (default 10)")
    p.add_argument("--sun-min-abs", type=non_negative_float, default=100.0,
                   help="a massive dimension has |h_0[d]| above this (Sun et al.: 100)")
    p.add_argument("--sun-min-ratio", type=non_negative_float, default=1000.0,
                   help="... and at least this many times the hidden state's median magnitude (Sun et al.: ~1000)")
    p.add_argument("--no-reset", action="store_true", help="skip the two reset interventions (others_mean and Sun's "
                   "sun_mean; four more passes)")
    add_shard_flags(p, ray=True)
    p.set_defaults(func=cmd_massive)


@dataclass(frozen=True, kw_only=True)
class MassiveTask(ModelTask):
    """The massive-dimension sums of one shard (`--shard`, or a Ray worker's)."""

    bos: str
    batch_size: int

    def run(self, model, shard: int, n_shards: int, index: range, prompts: list):
        from sinkmech.measures.massive import massive_sums
        from sinkmech.prompts import tokenize
        from sinkmech.sharding.measures import massive_partial

        if self.settings["top"] > model.cfg.d_model:
            raise ValueError(f"--top must be <= d_model ({model.cfg.d_model}), got {self.settings['top']}")
        batch = tokenize(model, prompts, bos=self.bos, max_tokens=self.max_tokens)
        sums = massive_sums(model, batch, options=RunOptions(batch_size=self.batch_size, progress=False))
        return massive_partial(sums, batch, {**self.settings, **model_settings(model), "model_name": model.cfg.model_name},
                               **self.where(shard, n_shards, index))


def massive_settings(args) -> dict:
    """What every part of one sharded `massive` run shares beyond the common settings."""
    return {"bos": args.bos, "top": args.top, "threshold": args.threshold, "sun_min_abs": args.sun_min_abs,
            "sun_min_ratio": args.sun_min_ratio}


def merged_massive(part, args) -> None:
    """`sinkmech merge` for massive parts: the table and --json / --png as `massive --no-reset` writes them."""
    from sinkmech.plots.mechanisms import massive_figure
    from sinkmech.sharding.measures import massive_result
    from sinkmech.sharding.format import used

    s = part.settings
    md = massive_result(part, top_k=s["top"], threshold=s["threshold"], sun_min_abs=s["sun_min_abs"],
                        sun_min_ratio=s["sun_min_ratio"], model_name=s["model_name"])
    print_massive_table(md, None)
    payload = {**md.to_dict(), "n_prompts": len(part.prompt_index), **used(part, s["max_tokens"]), "reset": None}
    write_results(args, payload, lambda: print(f"wrote {massive_figure(md, args.png, model_name=s['model'])}",
                                               file=sys.stderr))


def print_massive_table(md, reset) -> None:
    from sinkmech.measures.massive import RESETS
    from sinkmech.prompts import DEFAULT_EPS

    print()
    print("first-token residual norm / mean norm of the other positions, and the top dimensions (|h_0[d]| / median)")
    print(f"{'layer':>6} {'ratio':>8}  top dims")
    for l, r in enumerate(md.norm_ratio.tolist()):
        dims = ", ".join(f"{int(d)} ({float(md.dim_ratio[l, d]):.0f}x)" for d in md.top_dims[l])
        mark = "  <- onset" if l == md.onset_layer else ""
        print(f"{l:>6} {r:>8.1f}  {dims}{mark}")
    if md.onset_layer is None:
        print(f"no layer passes the threshold {md.threshold:g}: no massive activation")
        return
    dims = md.massive_dims
    print(f"massive dims (Sun et al.: |h_0[d]| > {md.sun_min_abs:g} and >= {md.sun_min_ratio:g} x the hidden state's "
          f"median {float(md.hidden_median[md.onset_layer]):.3g}) at residual layer {md.onset_layer}: "
          + (", ".join(f"{d} ({100 * float(md.sq_share[md.onset_layer, d]):.1f}% of ||h_0||^2)" for d in dims)
             if dims else "none"))
    for r in reset or ():
        print(f"\nreset {r.mode}: {RESETS[r.mode]}")
        print(f"{'run':>6} {'loss':>8} " + " ".join(f"{'rate>' + format(e, 'g'):>9}" for e in DEFAULT_EPS))
        for c, loss in (("clean", r.loss_clean), ("reset", r.loss_reset)):
            print(f"{c:>6} {loss:>8.3f} " + " ".join(f"{r.sink_rate(e, c):>8.1f}%" for e in DEFAULT_EPS))


def cmd_massive(args) -> None:
    from sinkmech.plots.mechanisms import massive_figure
    from sinkmech.measures.massive import RESETS, massive_dims, reset_massive_dims
    from sinkmech.prompts import tokenize

    prompts = prompts_arg(args)
    if (args.shard is not None or args.ray is not None) and not args.no_reset:
        raise UsageError("--shard / --ray: the reset interventions need the massive dimensions of the whole corpus "
                         "first; shard with --no-reset (the reset is not sharded)")

    def task(settings: dict) -> MassiveTask:
        return MassiveTask.from_args(args, prompts, settings, bos=args.bos, batch_size=args.batch_size)

    if sharded(args, prompts, "massive", task, merged_massive, **massive_settings(args)):
        return
    model = load_model_arg(args)
    if args.top > model.cfg.d_model:
        raise ValueError(f"--top must be <= d_model ({model.cfg.d_model}), got {args.top}")
    batch = tokenize(model, prompts, bos=args.bos, max_tokens=args.max_tokens)
    warn_short(batch, args.max_tokens)
    md = massive_dims(model, batch, top_k=args.top, threshold=args.threshold, sun_min_abs=args.sun_min_abs,
                      sun_min_ratio=args.sun_min_ratio, options=run_options(args))
    reset = None
    if not args.no_reset and md.massive_dims and md.onset_layer < model.cfg.n_layers:
        reset = [reset_massive_dims(model, batch, dims=md.massive_dims, from_layer=md.onset_layer, mode=mode,
                                    first_mean=md.first_mean, options=run_options(args)) for mode in RESETS]
    print_massive_table(md, reset)
    payload = {**md.to_dict(), "n_prompts": len(batch), **batch.used(args.max_tokens),
               "reset": None if reset is None else {r.mode: r.to_dict() for r in reset}}
    write_results(args, payload, lambda: print(f"wrote {massive_figure(md, args.png, model_name=args.model)}"))
