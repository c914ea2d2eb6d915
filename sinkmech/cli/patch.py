"""`sinkmech patch`: activation patching between the `<bos>` and no-`<bos>` runs
(Barbero et al. 2025, Sec. 3), over layers, positions or heads."""

from __future__ import annotations

from dataclasses import dataclass

from sinkmech.cli.common import (
    add_attention,
    add_intervention_common, add_metric, answers, conditions, load_model_arg, non_negative_int, prompts_arg,
    run_options,
    source_constant, warn_short, write_results,
)
from sinkmech.cli.shard import AnswersTask, add_shard_flags, model_settings, sharded
from sinkmech.options import RunOptions

BOS_LABEL = {"prepend": "<bos> run", "none": "no-<bos> run"}


def add_patch_parser(sub) -> None:
    p = sub.add_parser("patch", help="activation patching between the <bos> and no-<bos> runs")
    add_intervention_common(p)
    p.add_argument("--act", choices=source_constant("sinkmech.interventions.patching", "PatchAct"), default="resid_pre",
                   help="activation patched from one run into the other (default resid_pre)")
    p.add_argument("--by", choices=source_constant("sinkmech.interventions.patching", "PatchBy"), default=None, help="default: layer_pos for residual activations, head for z/q/k/v")
    p.add_argument("--source", choices=["prepend", "none", "both"], default="both", help="run the activations come from (patched into the other)")
    p.add_argument("--layers", type=non_negative_int, nargs="+", default=None, help="patch only these layers (default: all)")
    add_metric(p)
    add_shard_flags(p, ray=True)
    add_attention(p, needs_pattern="patches activations between two runs, the attention pattern among them")
    p.set_defaults(func=cmd_patch)


@dataclass(frozen=True, kw_only=True)
class PatchTask(AnswersTask):
    """Patching on one shard (`--shard`, or a Ray worker's)."""

    act: str
    by: str
    sources: tuple[str, ...]
    metric: str
    layers: tuple[int, ...] | None
    max_rows: int

    def run(self, state, shard: int, n_shards: int, index: range, prompts: list):
        from sinkmech.interventions.metrics import resolve_metric
        from sinkmech.interventions.patching import bos_pair, patch
        from sinkmech.sharding.interventions import patch_partial

        model, ids = state
        pair = bos_pair(model, prompts, max_tokens=self.max_tokens)
        results = {source: patch(model, pair, act=self.act, by=self.by, source=source,
                                 metric=resolve_metric(self.metric, ids),
                                 layers=None if self.layers is None else list(self.layers),
                                 options=RunOptions(batch_size=self.max_rows, progress=False))
                   for source in self.sources}
        settings = {**self.settings, **model_settings(model), "n_layers": model.cfg.n_layers,
                    "n_heads": model.cfg.n_heads}
        return patch_partial(results, pair, settings, width=self.max_tokens, **self.where(shard, n_shards, index))


def merged_patch(part, args) -> None:
    """`sinkmech merge` for patch parts: the lines and --json / --png as `patch` writes them."""
    from sinkmech.sharding.interventions import patch_result
    from sinkmech.sharding.format import used

    s = part.settings
    meta = {"model": s["model"], "act": s["act"], "by": s["by"], "metric": s["metric"], "n_layers": s["n_layers"],
            "n_heads": s["n_heads"], "n_prompts": len(part.prompt_index), **used(part, s["max_tokens"])}
    patch_output(args, patch_result(part), meta)


def cmd_patch(args) -> None:
    from sinkmech.interventions.metrics import resolve_metric
    from sinkmech.interventions.patching import HEAD_ACTS, bos_pair, patch

    prompts = prompts_arg(args)  # a bad prompt file fails before the slow model load
    by = args.by or ("head" if args.act in HEAD_ACTS else "layer_pos")

    def task(settings: dict) -> PatchTask:
        return PatchTask.from_args(args, prompts, settings, act=args.act, by=by, sources=tuple(conditions(args.source)),
                                   metric=args.metric, layers=None if args.layers is None else tuple(args.layers),
                                   max_rows=max(args.batch_size, 1) * 8)

    extra = {"act": args.act, "by": by, "source": args.source, "metric": args.metric, "answers": args.answers,
             "layers": args.layers}
    if sharded(args, prompts, "patch", task, merged_patch, **extra):
        return
    model = load_model_arg(args)
    _sink_note(model)
    pair = bos_pair(model, prompts, max_tokens=args.max_tokens)
    warn_short(pair.without_bos, args.max_tokens)
    results = {}
    metric = resolve_metric(args.metric, answers(model, args))
    for source in conditions(args.source):  # 8 copies of a batch of prompts per stacked forward pass
        results[source] = patch(model, pair, act=args.act, by=by, source=source, metric=metric, layers=args.layers,
                                options=run_options(args, batch_size=max(args.batch_size, 1) * 8))
    meta = {"model": args.model, "act": args.act, "by": by, "metric": args.metric, "n_layers": model.cfg.n_layers,
            "n_heads": model.cfg.n_heads, "n_prompts": len(pair.with_bos), **pair.without_bos.used(args.max_tokens)}
    patch_output(args, results, meta)


def _sink_note(model) -> None:
    import sys

    from sinkmech.loading.backend import learned_sink_note

    note = learned_sink_note(model, "patching moves activations between the two runs; the sink logits are parameters, "
                                    "the same in both, and stay in")
    if note:
        print(note, file=sys.stderr)


def patch_output(args, results: dict, meta: dict) -> None:
    """The printed lines and the outputs of `patch` (`meta`: the JSON's fields before "results")."""
    from sinkmech.plots.core import heatmap_grid, heatmap_panels, save, shared_limits

    for source, r in results.items():
        print(f"{BOS_LABEL[source]} -> {BOS_LABEL[r.target]}: unpatched {r.metric} {r.baseline:.4f}, "
              f"patched min {float(r.values.min()):.4f} max {float(r.values.max()):.4f}")

    def payload() -> dict:
        return {**meta, "results": {k: r.to_dict() for k, r in results.items()}}

    def png_out() -> None:
        first = next(iter(results.values()))
        panels = [(f"{BOS_LABEL[k]} into {BOS_LABEL[r.target]}", heatmap_grid(r.values.float())) for k, r in results.items()]
        xlabel = {"layer_pos": "content position", "layer": "", "head": "head", "head_pos": "head (mean over positions)"}[meta["by"]]
        fig = heatmap_panels(panels, title=f"Patching {meta['act']} across <bos> / no-<bos> — {meta['model']}",
                             xlabel=xlabel, ylabel="layer", cbar_label=f"{first.metric} vs source run",
                             **shared_limits(panels, meta["metric"] != "kl"))
        print(f"wrote {save(fig, args.png)}")

    write_results(args, payload, png_out)
