"""`sinkmech fit-sinks`: fit one sink logit per (layer, head) (gpt-oss's learned
sinks; optionally a value per head, one logit per layer, or the top-k sink heads
only) into a frozen model trained with `<bos>`, on prompts without `<bos>`, and
score them on disjoint held-out prompts: what share of the `<bos>` cost do they
recover? (`sinkmech.interventions.fit_sinks`.) The --json file is what
`sinkmech sinks --sink-logits` reads."""

from __future__ import annotations

import sys
from pathlib import Path

from sinkmech.cli.common import (
    MODEL_HELP, PROMPTS_HELP, UsageError, at_least, image_file, load_model_arg, model_name, non_negative_int,
    output_file,
    positive_float, positive_int, prompts_arg, write_results,
)
from sinkmech.findings import flatten, record
from sinkmech.loading.names import DEFAULT_MODEL


def add_fit_sinks_parser(sub) -> None:
    p = sub.add_parser("fit-sinks", help="fit per-head sink logits (gpt-oss's learned sinks) into a model trained "
                                         "with <bos>, scored on held-out prompts")
    p.add_argument("--model", type=model_name, default=DEFAULT_MODEL, help=MODEL_HELP)
    p.add_argument("--prompts", default=None, help=PROMPTS_HELP)
    p.add_argument("--n-fit", type=positive_int, default=64,
                   help="the first N prompts fit the sinks (default 64); recorded in --json, never evaluated on")
    p.add_argument("--n-eval", type=at_least(2), default=64, help="the next N prompts score them (default 64)")
    p.add_argument("--max-tokens", type=at_least(2), default=64, help="content tokens per prompt (default 64)")
    p.add_argument("--per", choices=["head", "layer"], default="head",
                   help="head: one sink logit per (layer, head) (default); layer: one per layer, shared by its heads")
    p.add_argument("--value", action="store_true", help="also fit a value vector per head (started at <bos>'s own)")
    p.add_argument("--top-k", type=positive_int, default=None, metavar="K",
                   help="only the K heads with the most attention on <bos> (on the fitting prompts) get a sink")
    p.add_argument("--steps", type=positive_int, default=100, help="Adam steps (default 100)")
    p.add_argument("--lr", type=positive_float, default=0.1, help="Adam's learning rate (default 0.1)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="the minibatch order (default 0)")
    p.add_argument("--batch-size", type=positive_int, default=4, help="fitting prompts per step (default 4)")
    p.add_argument("--json", type=output_file, required=True,
                   help="the fitted sinks, their fitting prompts and the held-out scores (sinks --sink-logits reads it)")
    p.add_argument("--png", type=image_file, default=None,
                   help="each head's learned sink mass against its attention on <bos> (.png, .svg or .pdf)")
    p.add_argument("--findings", type=output_file, default=None,
                   help="merge the held-out scores into this findings file, named MODEL.fit_sinks.VARIANT...")
    p.set_defaults(func=cmd_fit_sinks)


def cmd_fit_sinks(args) -> None:
    if args.per == "layer" and args.top_k is not None:
        raise UsageError("--top-k chooses heads: fit --per head with it")
    prompts = prompts_arg(args)
    need = args.n_fit + args.n_eval
    if len(prompts) < need:
        raise UsageError(f"--n-fit {args.n_fit} + --n-eval {args.n_eval} needs {need} prompts; there are {len(prompts)}")
    from sinkmech.interventions.fit_sinks import FitSettings, evaluate_sinks, fit_sinks
    from sinkmech.loading.models import bos_token_id
    from sinkmech.options import RunOptions
    from sinkmech.prompts import tokenize

    settings = FitSettings(per=args.per, value=args.value, top_k=args.top_k, steps=args.steps, lr=args.lr,
                           batch_prompts=args.batch_size, seed=args.seed)
    model = load_model_arg(args)
    if args.top_k is not None and args.top_k > model.cfg.n_layers * model.cfg.n_heads:
        raise UsageError(f"--top-k {args.top_k} is more than the model's {model.cfg.n_layers * model.cfg.n_heads} heads")
    fit_part, held_part = prompts[: args.n_fit], prompts[args.n_fit : need]
    fit = tokenize(model, fit_part, bos="none", max_tokens=args.max_tokens)
    held = tokenize(model, held_part, bos="none", max_tokens=args.max_tokens)
    bos = bos_token_id(model)
    options = RunOptions(batch_size=8, bos_token_id=bos)
    fitted = fit_sinks(model, fit, settings, fit_prompts=tuple(fit_part), options=options)
    from dataclasses import replace

    from sinkmech.corpora import prompt_documents

    docs = prompt_documents(args.prompts, need)  # the held-out windows' documents (None for a prompt file)
    fitted = replace(fitted, evaluation=evaluate_sinks(model, held, fitted, options=options,
                                                       documents=None if docs is None else docs[args.n_fit : need]))
    e = fitted.evaluation
    cell = lambda v: "n/a" if v is None else f"{v[0]:+.3f} [{v[1]:+.3f}, {v[2]:+.3f}]"  # noqa: E731
    print(f"{settings.name}: {len(fitted.heads)} sinks fitted on {len(fit)} prompts in {settings.steps} steps "
          f"(training loss {fitted.loss_trace[0]:.3f} -> {fitted.loss_trace[-1]:.3f})")
    print(f"held out ({e['n_prompts']} prompts from {e['n_documents']} documents; {e['interval']}), nats per "
          f"content target: <bos> first {e['loss']['bos'][0]:.3f}, "
          f"no <bos> {e['loss']['none'][0]:.3f}, no <bos> with the fitted sinks {e['loss']['fitted'][0]:.3f}")
    print(f"  cost against <bos> first: no <bos> {cell(e['vs_bos']['none'])}, fitted {cell(e['vs_bos']['fitted'])}; "
          f"share of the <bos> cost recovered {cell(e['recovery'])}")

    def findings_out() -> None:
        label = args.model if "/" not in args.model else Path(args.model).stem
        prefix = f"{label}.fit_sinks.{settings.name}"
        values = {k: e[k] for k in ("n_prompts", "n_documents", "loss", "vs_bos", "recovery")}
        values |= {"n_fit_prompts": len(fit), "n_sinks": len(fitted.heads), "steps": settings.steps}
        record(args.findings, flatten(prefix, values), replace_prefix=prefix)
        print(f"recorded findings in {args.findings}", file=sys.stderr)

    def png_out() -> None:
        from sinkmech.plots.decomposition import learned_mass_scatter

        print(f"wrote {learned_mass_scatter(fitted.to_dict(), args.png, model_name=args.model)}", file=sys.stderr)

    write_results(args, fitted.to_dict, png_out, extra=[("--findings", findings_out)] if args.findings else [])
