"""The `sinkmech` command: one subcommand per analysis.

`sinks`, `report` and `train` are defined here; `heads` in cli_heads.py;
`patch`, `ablate` and `perturb` in cli_interventions.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sinkmech.models import DEFAULT_MODEL


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL, help="'smollm2' (offline default), a .gguf path, or a TransformerLens model name")
    p.add_argument("--prompts", default=None, help="text file (one prompt per line) or JSONL with a 'text' field; default: 170 windows of the Python docs")
    p.add_argument("--max-tokens", type=int, default=64, help="content tokens per prompt (default 64)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--json", type=Path, default=None, help="write results as JSON here")
    p.add_argument("--png", type=Path, default=None, help="write a figure here (.png or .svg)")


def _conditions(bos: str) -> list[str]:
    return ["prepend", "none"] if bos == "both" else [bos]


def _write_json(path: Path, payload: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=1))
    except OSError as e:
        raise SystemExit(f"error: cannot write {path}: {e.strerror or e}")
    print(f"wrote {path}")


# sinkmech sinks ------------------------------------------------------------


def add_sinks_parser(sub) -> None:
    p = sub.add_parser("sinks", help="sink scores and sink rates per head, with and without <bos>")
    _add_common(p)
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
    from sinkmech.figures import sink_heatmap
    from sinkmech.models import load_model
    from sinkmech.prompts import load_prompts
    from sinkmech.sinks import sink_scores

    for e in args.eps:
        try:
            value = float(e)
        except ValueError:
            raise SystemExit(f"error: --eps takes numbers, got {e!r}")
        if not 0.0 <= value < 1.0:
            raise SystemExit(f"error: --eps values must lie in [0, 1), got {e}")
    prompts = load_prompts(args.prompts)  # bad prompt files fail before the slow model load
    model = load_model(args.model)
    results = {
        bos: sink_scores(model, prompts, bos=bos, max_tokens=args.max_tokens, batch_size=args.batch_size)
        for bos in _conditions(args.bos)
    }
    print_sinks_table(results, args.eps, args.top)
    if args.json:
        _write_json(args.json, sinks_payload(results, args.eps))
    if args.png:
        print(f"wrote {sink_heatmap(results, args.png, model_name=args.model)}")


# sinkmech report ------------------------------------------------------------


def add_report_parser(sub) -> None:
    p = sub.add_parser("report", help="one-page offline report: figures, summary.json and circuitsvis views")
    p.add_argument("--model", default=DEFAULT_MODEL, help="'smollm2' (offline default), a .gguf path, or a TransformerLens model name")
    p.add_argument("--out", type=Path, required=True, help="output folder (index.html, summary.json, figures/)")
    p.add_argument("--prompts", default=None, help="text file (one prompt per line) or JSONL with a 'text' field; default: the Python docs corpus")
    p.add_argument("--n-prompts", type=int, default=170, help="prompts for the sink scores (default 170, as in the paper)")
    p.add_argument("--max-tokens", type=int, default=64, help="content tokens per prompt (default 64)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--heads", type=int, default=3, help="how many top / least sink-like heads to show up close")
    p.add_argument("--view-tokens", type=int, default=32, help="tokens per prompt in the circuitsvis views")
    p.add_argument("--view-prompts", type=int, default=3, help="prompts in the head-activity views")
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> None:
    import time

    from sinkmech.models import load_model
    from sinkmech.report.page import build_report

    for flag in ("n_prompts", "max_tokens", "batch_size", "heads", "view_tokens", "view_prompts"):
        if getattr(args, flag) < 1:
            raise SystemExit(f"error: --{flag.replace('_', '-')} must be >= 1")
    try:  # fail before the slow model load, not after the analyses
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(f"cannot create the report folder {args.out}: {e.strerror or e}") from e
    t0 = time.perf_counter()
    print(f"loading {args.model} ...", flush=True)
    model = load_model(args.model)
    report = build_report(
        model,
        args.out,
        model_label=args.model,
        prompts=args.prompts,
        n_prompts=args.n_prompts,
        max_tokens=args.max_tokens,
        batch_size=args.batch_size,
        n_heads=args.heads,
        view_tokens=args.view_tokens,
        view_prompts=args.view_prompts,
    )
    rates = report.summary["sections"]["sinks"]["sink_rate"]
    for bos, r in rates.items():
        print(f"sink rate bos={bos}: " + ", ".join(f"eps {e}: {v:.1f}%" for e, v in r.items()))
    print(f"wrote {report.index} and {report.summary_json} ({len(report.figures)} figure files) "
          f"in {time.perf_counter() - t0:.0f} s")
# sinkmech train ----------------------------------------------------------------


def add_train_parser(sub) -> None:
    p = sub.add_parser("train", help="train a small model from scratch and track its sinks (see scripts/train_sinks.py)")
    p.add_argument("--data", choices=["text", "bigram_backcopy"], default="text")
    p.add_argument("--packing", choices=["causal", "intra_doc"], default="causal")
    p.add_argument("--no-fixed-bos", dest="fixed_bos", action="store_false", help="no <bos> forced at position 0")
    p.add_argument("--context-length", type=int, default=128)
    p.add_argument("--tokens-per-step", type=int, default=4096)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--out", type=Path, required=True, help="directory for model.safetensors, config.json, log.json")
    p.add_argument("--png", type=Path, default=None, help="plot of the sink signals against step")
    p.set_defaults(func=cmd_train)


def cmd_train(args) -> None:
    from sinkmech.train.run import TrainConfig, train
    from sinkmech.train_figures import training_curves

    cfg = TrainConfig(
        data=args.data, packing=args.packing, fixed_bos=args.fixed_bos, context_length=args.context_length,
        tokens_per_step=args.tokens_per_step, n_layers=args.layers, d_model=args.d_model, n_heads=args.heads,
        steps=args.steps, lr=args.lr, warmup=args.warmup, seed=args.seed, threads=args.threads,
        eval_every=args.eval_every,
    )
    result = train(cfg, args.out)
    final = result.final()
    print(f"trained in {result.seconds:.1f} s; wrote {args.out}")
    for cond in ("prepend", "none"):
        c = final["conditions"][cond]
        print(f"bos={cond:>7}: val loss {final['val_loss'][cond]:.3f}  sink rate {c['sink_rate']}  "
              f"max head {c['max_head_score']:.3f}  uniform {c['uniform_score']:.3f}")
    if args.png:
        print(f"wrote {training_curves({args.out.name: result.log}, args.png)}")
# entry point -----------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sinkmech", description="Attention-sink instruments (Barbero et al. 2025) for TransformerLens models."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    # The bigger front-ends live in their own modules; imported here, not at
    # the top, because they import the shared helpers above from this module.
    from sinkmech.cli.heads import add_heads_parser
    from sinkmech.cli.interventions import add_ablate_parser, add_patch_parser, add_perturb_parser

    add_sinks_parser(sub)
    add_heads_parser(sub)
    add_patch_parser(sub)
    add_ablate_parser(sub)
    add_perturb_parser(sub)
    add_report_parser(sub)
    add_train_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
