"""`sinkmech ablate`: per-head sink ablations over every (layer, head), exact and,
optionally, estimated by attribution patching."""

from __future__ import annotations

import sys
from argparse import Namespace
from dataclasses import dataclass

from sinkmech.cli.common import (
    add_attention,
    BOS_HELP,
    UsageError,
    add_intervention_common,
    add_metric,
    check_metric_answers,
    answers,
    count_or_all,
    load_model_arg,
    positive_int,
    prompts_arg,
    run_options,
    write_results,
)
from sinkmech.cli.shard import AnswersTask, add_shard_flags, base_settings, model_settings, run_command_on_ray, shard_run
from sinkmech.sharding.resume import already_done
from sinkmech.sharding.format import write_partial
from sinkmech.options import RunOptions


def add_ablate_parser(sub) -> None:
    p = sub.add_parser("ablate", help="per-head sink ablations over every (layer, head)")
    add_intervention_common(p)
    p.add_argument("--mode", choices=["mask_first", "all_to_first", "zero", "mean", "drop_sink"], default="mask_first",
                   help="mask_first (default; the report's ablation): the head may not attend to position 0 (a learned "
                        "sink logit, gpt-oss's, stays in); "
                        "all_to_first: it attends only there; zero / mean: its output replaced by 0 / its mean output; "
                        "drop_sink (models with learned sink logits only): the head's sink logit removed")
    p.add_argument("--bos", choices=["prepend", "none"], default="prepend", help=BOS_HELP)
    p.add_argument("--attribution", action="store_true", help="also estimate by attribution patching and print its correlation")
    p.add_argument("--top", type=positive_int, default=10, help="heads listed, by effect (default 10)")
    p.add_argument("--prompt-batch", type=count_or_all, default=None, metavar="N|all",
                   help="prompts per group of forward passes (default all: a shard's prompts in one group, the fast "
                        "sweep; --shard / --ray runs then equal the whole run to float32 rounding, within 1e-5 of the "
                        "largest effect). 1 runs each prompt on its own (1.5x slower at 4 prompts on 2 CPU cores, "
                        "more with more prompts; not measured on a GPU), so that a sharded and a whole run made with "
                        "it make the same passes and agree to 1e-6. Ignored by --mode mean, which needs every prompt "
                        "at once")
    add_metric(p, loss="the change of the next-token loss on content targets, nats per target (one process)")
    add_shard_flags(p, ray=True)
    add_attention(p, needs_pattern="edits each head's attention pattern (mask_first, all_to_first, drop_sink)")
    p.set_defaults(func=cmd_ablate)


@dataclass(frozen=True, kw_only=True)
class AblateTask(AnswersTask):
    """Per-head ablations on one shard (`--shard`, or a Ray worker's)."""

    mode: str
    bos: str
    metric: str
    max_rows: int
    prompt_batch: int | None

    def run(self, state, shard: int, n_shards: int, index: range, prompts: list):
        from sinkmech.interventions.ablation import head_ablations
        from sinkmech.interventions.metrics import resolve_metric
        from sinkmech.prompts import tokenize
        from sinkmech.sharding.interventions import ablate_partial

        model, ids = state
        batch = tokenize(model, prompts, bos=self.bos, max_tokens=self.max_tokens)
        result = head_ablations(model, batch, mode=self.mode, bos=self.bos, metric=resolve_metric(self.metric, ids),
                                max_tokens=self.max_tokens, prompt_batch=self.prompt_batch,
                                options=RunOptions(batch_size=self.max_rows, progress=False))
        return ablate_partial(result, batch, {**self.settings, **model_settings(model)},
                              **self.where(shard, n_shards, index))


def cmd_ablate(args) -> None:
    check_metric_answers(args)
    if args.metric == "loss" and (args.shard is not None or args.resume or args.ray is not None or args.attribution):
        raise UsageError("--metric loss runs in one process without --attribution: drop --shard / --ray / --attribution")
    prompts = prompts_arg(args)  # a bad prompt file fails before torch is imported
    if args.mode == "drop_sink":
        refuse_drop_sink_early(args.model)
    if args.metric == "loss":
        return ablate_loss(args, prompts)
    if args.shard is not None or args.resume or args.ray is not None:
        if args.mode == "mean" or args.attribution:
            raise UsageError("--shard / --ray: the mean ablation and --attribution need the whole corpus at once "
                             "(the mean output, one backward pass); shard mask_first, all_to_first or zero")
        extra = {"bos": args.bos, "mode": args.mode, "metric": args.metric, "answers": args.answers}
        if args.ray is not None:
            settings = base_settings(args, prompts, **extra)
            return merged_ablate(run_command_on_ray(args, prompts, ablate_task(args, prompts, settings), "ablate",
                                                    settings), args)
        shard = shard_run(args, prompts, **extra)
        if args.resume and already_done(args.json, shard, "ablate"):
            print(f"shard {shard.i}/{shard.n} is already in {args.json}: skipped (--resume)", file=sys.stderr)
            return
        task = ablate_task(args, prompts, shard.settings)
        part = task.run(task.load(), shard.i, shard.n, shard.index, [prompts[i] for i in shard.index])
        print(f"wrote {write_partial(args.json, part)}", file=sys.stderr)
        return
    from sinkmech.interventions.ablation import head_ablations
    from sinkmech.interventions.metrics import resolve_metric

    model = load_model_arg(args)
    _sink_note(model, args.mode)
    kw = dict(mode=args.mode, bos=args.bos, metric=resolve_metric(args.metric, answers(model, args)),
              max_tokens=args.max_tokens)
    # by default every prompt in one group of passes; --prompt-batch 1 (not for "mean", which needs them all)
    # makes a prompt's effects independent of the prompts beside it, so shards make this run's passes exactly;
    # 8 copies of a batch of prompts per stacked forward pass
    exact = head_ablations(model, prompts, prompt_batch=None if args.mode == "mean" else args.prompt_batch,
                           options=run_options(args, batch_size=max(args.batch_size, 1) * 8), **kw)
    ablate_output(args, model, prompts, exact, kw)


def refuse_drop_sink_early(model: str) -> None:
    """--mode drop_sink on a model that shows before loading that it has no learned
    sink logits: the offline SmolLM2 and Gemma 3, and a local Hugging Face folder
    whose safetensors headers name no `sinks` tensor. Any other model is checked
    right after it loads (`interventions.ablation.check_mode`)."""
    import json
    import struct
    from pathlib import Path

    from sinkmech.loading.names import DEFAULT_MODEL, PACKAGED_MODELS

    why = "a model without learned sink logits (only gpt-oss-style models, whose softmax has a learned per-head " \
          "sink column, have one to drop)"
    if model in (DEFAULT_MODEL, *PACKAGED_MODELS):
        raise UsageError(f"--mode drop_sink: {model} is {why}")
    folder = Path(model)
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    names = []
    try:
        for f in files:
            with open(f, "rb") as fh:
                n = struct.unpack("<Q", fh.read(8))[0]
                names += list(json.loads(fh.read(n)))
    except (OSError, ValueError, struct.error):
        return  # an unreadable header: the load says what is wrong with the folder
    if files and not any(k.endswith(".sinks") for k in names):
        raise UsageError(f"--mode drop_sink: {model} is {why} (no `sinks` tensor in its weights)")


SINK_NOTES = {"drop_sink": "drop_sink removes each head's sink logit in turn (its attention renormalised over the real "
                           "keys)",
              "mask_first": "mask_first masks key 0 and leaves each head's learned sink logit in (--mode drop_sink "
                            "removes it)",
              "all_to_first": "all_to_first puts all of a head's attention on key 0, the learned sink's share too"}


def _sink_note(model, mode: str) -> None:
    """The one line on a model with learned sink logits: what `mode` does with them."""
    from sinkmech.loading.backend import learned_sink_note

    note = learned_sink_note(model, SINK_NOTES.get(mode, f"{mode} replaces each head's output; the sink logits stay in"))
    if note:
        print(note, file=sys.stderr)


def ablate_loss(args, prompts) -> None:
    """--metric loss: each head ablated alone, the change of the next-token loss on
    content targets in nats per target (`sinkmech.studies.bos_cost.head_loss_changes`)."""
    from sinkmech.studies.bos_cost import head_loss_changes
    from sinkmech.plots.core import heatmap_panels, save, shared_limits
    from sinkmech.hooks import head_label

    model = load_model_arg(args)
    res = head_loss_changes(model, prompts, mode=args.mode, bos=args.bos, max_tokens=args.max_tokens,
                            options=run_options(args))
    payload = {"model": args.model, "bos": args.bos, **res.to_dict()}
    print(f"{args.mode} ablation (bos={args.bos}): change of the next-token loss on content targets, nats per target "
          f"(the unablated run: {payload['clean_loss']:.4f})")
    for l, h in res.ranking()[: args.top]:
        print(f"  {head_label(l, h)}  {float(res.mean_changes()[l, h]):+.4f}")
    panels = [("loss change", res.mean_changes().numpy())]

    def png_out() -> None:
        fig = heatmap_panels(panels, title=f"Per-head {args.mode} ablation (bos={args.bos}) — {args.model}",
                             xlabel="head", ylabel="layer", cbar_label="loss change (nats)", **shared_limits(panels, True))
        print(f"wrote {save(fig, args.png)}")

    write_results(args, payload, png_out)


def ablate_task(args, prompts, settings: dict) -> AblateTask:
    return AblateTask.from_args(args, prompts, settings, mode=args.mode, bos=args.bos, metric=args.metric,
                                max_rows=max(args.batch_size, 1) * 8, prompt_batch=args.prompt_batch)


def merged_ablate(part, args) -> None:
    """`sinkmech merge` for ablate parts: the list and --json / --png as `ablate` writes them."""
    from sinkmech.sharding.interventions import ablate_result

    s = part.settings
    run = Namespace(**{**vars(args), "model": s["model"], "mode": s["mode"], "bos": s["bos"], "metric": s["metric"],
                       "attribution": False})
    ablate_output(run, None, None, ablate_result(part), {})


def ablate_output(args, model, prompts, exact, kw) -> None:
    """The printed list, the attribution estimate when asked, and the outputs of `ablate`."""
    from sinkmech.plots.core import heatmap_panels, save, shared_limits
    from sinkmech.hooks import head_label
    from sinkmech.interventions.attribution import attribute_ablations, pearson

    if exact.metric == "kl":
        print(f"{args.mode} ablation (bos={args.bos}): KL(clean || ablated) over content positions, nats (0 = no effect)")
    else:
        print(f"{args.mode} ablation (bos={args.bos}), {exact.metric}; the unablated run scores {exact.baseline:.4f}")
    for layer, head, value in exact.top_heads(args.top):
        print(f"  {head_label(layer, head)}  {value:.4f}")
    payload = {"model": args.model, **exact.to_dict()}
    panels = [("exact", exact.effects.numpy())]
    if args.attribution:
        approx = attribute_ablations(model, prompts, **kw)
        r = pearson(exact.effects, approx.effects)
        print(f"attribution patching: Pearson r = {r:.3f} with the exact effects")
        payload["attribution"] = {"effects": approx.effects.tolist(), "pearson": r}
        panels.append((f"attribution (r = {r:.2f})", approx.effects.numpy()))
    def png_out() -> None:
        fig = heatmap_panels(panels, title=f"Per-head {args.mode} ablation (bos={args.bos}) — {args.model}",
                             xlabel="head", ylabel="layer", cbar_label=f"{exact.metric} vs clean run", **shared_limits(panels, args.metric != "kl"))
        print(f"wrote {save(fig, args.png)}")

    write_results(args, payload, png_out)
