"""`sinkmech patch`: activation patching between the `<bos>` and no-`<bos>` runs
(Barbero et al. 2025, Sec. 3), over layers, positions or heads."""

from __future__ import annotations

from typing import get_args

from sinkmech.cli.common import (
    add_intervention_common, add_metric, answers, conditions, load_model_arg, non_negative_int, prompts_arg,
    warn_short, write_results,
)
from sinkmech.figures.core import heatmap_grid, heatmap_panels, save, shared_limits
from sinkmech.interventions.patching import HEAD_ACTS, PatchAct, PatchBy, bos_pair, patch

BOS_LABEL = {"prepend": "<bos> run", "none": "no-<bos> run"}


def add_patch_parser(sub) -> None:
    p = sub.add_parser("patch", help="activation patching between the <bos> and no-<bos> runs")
    add_intervention_common(p)
    p.add_argument("--act", choices=get_args(PatchAct), default="resid_pre",
                   help="activation patched from one run into the other (default resid_pre)")
    p.add_argument("--by", choices=get_args(PatchBy), default=None, help="default: layer_pos for residual activations, head for z/q/k/v")
    p.add_argument("--source", choices=["prepend", "none", "both"], default="both", help="run the activations come from (patched into the other)")
    p.add_argument("--layers", type=non_negative_int, nargs="+", default=None, help="patch only these layers (default: all)")
    add_metric(p)
    p.set_defaults(func=cmd_patch)


def cmd_patch(args) -> None:
    prompts = prompts_arg(args)  # a bad prompt file fails before the slow model load
    model = load_model_arg(args)
    by = args.by or ("head" if args.act in HEAD_ACTS else "layer_pos")
    pair = bos_pair(model, prompts, max_tokens=args.max_tokens)
    warn_short(pair.without_bos, args.max_tokens)
    results = {}
    for source in conditions(args.source):
        r = patch(model, pair, act=args.act, by=by, source=source, metric=args.metric,
                  answers=answers(model, args), layers=args.layers, max_rows=max(args.batch_size, 1) * 8)
        results[source] = r
        print(f"{BOS_LABEL[source]} -> {BOS_LABEL[r.target]}: unpatched {r.metric} {r.baseline:.4f}, "
              f"patched min {float(r.values.min()):.4f} max {float(r.values.max()):.4f}")

    def payload() -> dict:
        return {
            "model": args.model, "act": args.act, "by": by, "metric": args.metric,
            "n_layers": model.cfg.n_layers, "n_heads": model.cfg.n_heads, "n_prompts": len(pair.with_bos),
            **pair.without_bos.used(args.max_tokens), "results": {k: r.to_dict() for k, r in results.items()},
        }

    def png_out() -> None:
        first = next(iter(results.values()))
        panels = [(f"{BOS_LABEL[k]} into {BOS_LABEL[r.target]}", heatmap_grid(r.values.float())) for k, r in results.items()]
        xlabel = {"layer_pos": "content position", "layer": "", "head": "head", "head_pos": "head (mean over positions)"}[by]
        fig = heatmap_panels(panels, title=f"Patching {args.act} across <bos> / no-<bos> — {args.model}",
                             xlabel=xlabel, ylabel="layer", cbar_label=f"{first.metric} vs source run", **shared_limits(panels, args.metric != "kl"))
        print(f"wrote {save(fig, args.png)}")

    write_results(args, payload, png_out)
