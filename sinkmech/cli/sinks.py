"""`sinkmech sinks`: sink scores and sink rates per head, with and without `<bos>`
(Gu et al. 2025's sink rate, as used by Barbero et al. 2025)."""

from __future__ import annotations

from sinkmech import models
from sinkmech.cli.common import UsageError, add_common, conditions, prompts_arg, warn_short, write_json
from sinkmech.figures import sink_heatmap
from sinkmech.prompts import tokenize
from sinkmech.sinks import sink_scores


def add_sinks_parser(sub) -> None:
    p = sub.add_parser("sinks", help="sink scores, sink rates and next-token loss, with and without <bos>")
    add_common(p)
    p.add_argument("--n-prompts", type=int, default=None, help="use only the first N prompts")
    p.add_argument("--bos", choices=["prepend", "none", "both"], default="both")
    p.add_argument("--eps", nargs="+", default=["0.3", "0.8"], help="sink-rate thresholds (strict >)")
    p.add_argument("--top", type=int, default=10, help="how many top sink heads to list")
    p.set_defaults(func=cmd_sinks)


def sinks_payload(results: dict, eps: list[str]) -> dict:
    """The JSON contract of `sinkmech sinks`."""
    first = next(iter(results.values()))
    return {
        "model": first.model_name,
        "n_layers": first.n_layers,
        "n_heads": first.n_heads,
        "max_tokens": first.max_tokens,
        "n_prompts": first.n_prompts,
        "conditions": {k: r.summary(eps) for k, r in results.items()},
    }


def print_sinks_table(results: dict, eps: list[str], top: int) -> None:
    conds = list(results)
    print()
    print("sink rate (% of prompt x head pairs with score > eps)")
    print(f"{'eps':>6} " + " ".join(f"{c:>10}" for c in conds))
    for e in eps:
        print(f"{e:>6} " + " ".join(f"{results[c].sink_rate(e):>9.2f}%" for c in conds))
    print(f"{'loss':>6} " + " ".join(f"{results[c].loss:>10.3f}" for c in conds)
          + "   (mean next-token loss in nats on the same content targets)")
    print()
    print("mean first-token score per layer")
    print(f"{'layer':>6} " + " ".join(f"{c:>10}" for c in conds))
    per_layer = {c: results[c].per_layer() for c in conds}
    for l in range(next(iter(results.values())).n_layers):
        print(f"{l:>6} " + " ".join(f"{float(per_layer[c][l]):>10.3f}" for c in conds))
    for c in conds:
        r = results[c]
        print()
        print(f"top sink heads (bos={c}; uniform attention would score {r.uniform_score():.3f})")
        for layer, head, score in r.top_heads(top):
            print(f"  L{layer}.H{head}  {score:.3f}")


def cmd_sinks(args) -> None:
    for e in args.eps:
        try:
            value = float(e)
        except ValueError:
            raise UsageError(f"--eps takes numbers, got {e!r}") from None
        if not 0.0 <= value < 1.0:
            raise UsageError(f"--eps values must lie in [0, 1), got {e}")
    prompts = prompts_arg(args)  # bad prompt files fail before the slow model load
    model = models.load_model(args.model)
    results = {}
    for bos in conditions(args.bos):
        batch = tokenize(model, prompts, bos=bos, max_tokens=args.max_tokens)
        warn_short(batch, args.max_tokens)
        results[bos] = sink_scores(model, batch, batch_size=args.batch_size, max_tokens=args.max_tokens, loss=True)
    print_sinks_table(results, args.eps, args.top)
    if args.json:
        write_json(args.json, sinks_payload(results, args.eps))
    if args.png:
        print(f"wrote {sink_heatmap(results, args.png, model_name=args.model)}")
