"""`sinkmech length`: sink rate, mean first-token score against uniform
attention, and the top sink heads' mask_first cost as the evaluation length
grows (the same texts cut to each length; see sinkmech.context.length).

Sharded in two stages (`sinkmech.sharding.context`), since the heads whose cost is
measured are chosen on the whole corpus: `--shard I/N` writes shard I's sink
scores by length; `--shard I/N --scores PARTS...` chooses the heads on every
stage-1 part and writes shard I's costs, which `sinkmech merge` turns into the
result. `--ray` runs both stages on a cluster.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from sinkmech.cli.common import (
    add_attention,
    MODEL_HELP, PNG_HELP, Distinct, UsageError, at_least, head_spec, image_file, load_model_arg, model_name,
    output_file, positive_float, positive_int, prompts_arg, run_options, source_constant, write_results,
)
from sinkmech.cli.shard import ModelTask, add_shard_flags, check_part_output, model_settings, run_command_on_ray, run_shard
from sinkmech.sharding.resume import ShardRun, model_sha256, prompts_sha256, sinkmech_version
from sinkmech.loading.names import DEFAULT_MODEL
from sinkmech.sharding.format import differing_setting, read_parts, shard_span
from sinkmech.options import QUIET, RunOptions


DEFAULT_TEXTS = 8  # texts of the default corpus without --prompts


def add_length_parser(sub) -> None:
    p = sub.add_parser("length", help="sink rate and top-head mask_first cost against the evaluation length")
    p.add_argument("--model", type=model_name, default=DEFAULT_MODEL, help=MODEL_HELP)
    p.add_argument("--lengths", type=at_least(2), nargs="+", action=Distinct, default=list(source_constant("sinkmech.context.length", "DEFAULT_LENGTHS")),
                   help="content lengths to measure (default 64 128 256 512 1024; longer than the context: skipped)")
    p.add_argument("--prompts", default=None,
                   help="prompt file, read as by every command (one prompt per line, .jsonl/.ndjson or .json); "
                        "each prompt is cut to each length, and a length beyond the shortest prompt is skipped (said "
                        "so); default: windows of the Python docs")
    p.add_argument("--n-prompts", type=positive_int, default=None,
                   help=f"use the first N prompts (default: {DEFAULT_TEXTS} texts of the Python docs, or every prompt "
                        "of --prompts)")
    p.add_argument("--bos", choices=["prepend", "none"], default="prepend", help="<bos> before each text (default prepend)")
    p.add_argument("--top", type=positive_int, default=3, help="strongest sink heads whose mask_first cost is measured (default 3)")
    p.add_argument("--uniform-multiples", type=positive_float, nargs="+", action=Distinct,
                   default=list(source_constant("sinkmech.context.length", "UNIFORM_MULTIPLES")), metavar="M",
                   help="also count a head a sink when alpha_0 > M x H_T / T, the uniform share at that length "
                        "(default 2 4; 4 is eps 0.3 at T = 64)")
    p.add_argument("--head", type=head_spec, default=None,
                   help="the head tracked across every length, LAYER.HEAD (default: the top head at the shortest length)")
    p.add_argument("--batch-size", type=positive_int, default=8, help="prompts per forward pass (default 8)")
    p.add_argument("--json", type=output_file, default=None, help="write results as JSON here ('-': stdout)")
    p.add_argument("--png", type=image_file, default=None, help=PNG_HELP)
    p.add_argument("--scores", type=Path, nargs="+", default=None, metavar="PART",
                   help="stage 2 of a sharded run, with --shard I/N: every stage-1 part (`length --shard I/N` "
                        "without --scores); the heads are chosen on all of them and shard I's mask_first costs "
                        "written, which `sinkmech merge` joins")
    add_shard_flags(p, ray=True)
    add_attention(p, needs_pattern="measures mask_first, an edit of the attention scores of every query")
    p.set_defaults(func=cmd_length)


def print_length_table(sweep) -> None:
    from sinkmech.hooks import head_label
    from sinkmech.measures.sinks import format_eps

    print()
    fixed = None if sweep.fixed_layer is None else head_label(sweep.fixed_layer, sweep.fixed_head)
    print(f"{'length':>7} " + " ".join(f"{'rate>' + format_eps(e):>9}" for e in sweep.eps)
          + " " + " ".join(f"{'>' + format_eps(m) + 'xU':>8}" for m in sweep.uniform_multiples)
          + f" {'mean a0':>8} {'uniform':>8} {str(fixed) + ' a0/U':>12} {'its KL':>8}  top heads (mask_first KL)")
    for i, T in enumerate(sweep.lengths):
        heads = ", ".join(f"{head_label(int(sweep.top_layer[i, r]), int(sweep.top_head[i, r]))} ({float(sweep.mask_first_cost[i, r]):.4f})"
                          for r in range(sweep.top_layer.shape[1]))
        rel = " ".join("     n/a" if v is None else f"{v:>7.1f}%" for v in sweep.relative_rates(i).values())
        print(f"{T:>7} " + " ".join(f"{float(sweep.sink_rate[i, j]):>8.1f}%" for j in range(len(sweep.eps)))
              + f" {rel} {float(sweep.mean_score[i]):>8.3f} {float(sweep.uniform_score[i]):>8.3f}"
              + f" {float(sweep.fixed_score[i]) / float(sweep.uniform_score[i]):>12.2f} {float(sweep.fixed_cost[i]):>8.4f}"
              + f"  {heads}")
    if fixed is not None:
        how = (f"the top head at length {sweep.fixed_chosen_at}" if sweep.fixed_chosen_at is not None else "named by --head")
        print(f"fixed head {fixed} ({how}); xU: alpha_0 > M x H_T / T, the uniform share (n/a: M x H_T / T >= 1)")
    for T, why in sweep.skipped:
        print(f"skipped {T}: {why}")


def cmd_length(args) -> None:
    from sinkmech.context.length import long_prompts, sinks_vs_length
    from sinkmech.plots.mechanisms import length_lines
    from sinkmech.hooks import parse_head
    from sinkmech.prompts import DEFAULT_EPS, tokenize

    lengths = sorted(args.lengths)  # each >= 2 and none repeated: checked by the flag's type and action
    texts = prompts_arg(args) if args.prompts is not None else None  # a bad file fails before the model load
    if args.shard is not None or args.ray is not None or args.resume or args.scores is not None:
        args.n_prompts = len(texts) if texts is not None else args.n_prompts or DEFAULT_TEXTS
        return sharded_length(args, lengths, texts)
    model = load_model_arg(args)
    if args.top > model.cfg.n_layers * model.cfg.n_heads:
        raise UsageError(f"--top must be <= {model.cfg.n_layers * model.cfg.n_heads} (the model's heads), got {args.top}")
    fixed = None if args.head is None else parse_head(args.head, model)
    if texts is None:
        batch = long_prompts(model, args.n_prompts or DEFAULT_TEXTS, max(lengths), bos=args.bos)
    else:  # each prompt's first max(lengths) content tokens (cut to the context, room kept for <bos>)
        batch = tokenize(model, texts, bos=args.bos, max_tokens=min(max(lengths), model.cfg.n_ctx - 1))
    sweep = sinks_vs_length(model, batch, lengths=lengths, top_k=args.top, eps=DEFAULT_EPS,
                            uniform_multiples=args.uniform_multiples, fixed_head=fixed, options=run_options(args))
    print_length_table(sweep)

    def png_out() -> None:
        if not sweep.lengths:
            raise UsageError("every length was skipped: nothing to draw")
        print(f"wrote {length_lines(sweep, args.png, model_name=args.model)}")

    write_results(args, sweep.to_dict(), png_out)


# The sharded forms. A shard's prompts are numbers of texts: of --prompts (each
# task holds them all), or of windows of the default corpus, which each worker
# cuts itself once its model gives the context (`long_prompt_texts`); a worker
# tokenizes its own, text by text as the whole list is.

@dataclass(frozen=True, kw_only=True)
class LengthTask(ModelTask):
    """What both stages' shards share: the texts of their prompts, tokenized."""

    lengths: tuple[int, ...]
    bos: str
    batch_size: int
    texts: tuple | None = None  # --prompts (None: the default corpus)

    def batch(self, model, index: range):
        """The shard's prompts tokenized as the one-process run tokenizes the corpus, and the sha256 of all the texts."""
        from sinkmech.context.length import long_prompt_texts
        from sinkmech.prompts import tokenize

        if self.texts is not None:
            texts, n_tokens = list(self.texts), min(max(self.lengths), model.cfg.n_ctx - 1)
        else:
            texts, n_tokens = long_prompt_texts(model, self.n_prompts_total, max(self.lengths))
        return tokenize(model, [texts[i] for i in index], bos=self.bos, max_tokens=n_tokens), prompts_sha256(texts)


@dataclass(frozen=True, kw_only=True)
class ScoresTask(LengthTask):
    """Stage 1 on one shard: its prompts' sink scores at every length."""

    top_k: int
    uniform_multiples: tuple[float, ...]
    head: str | None

    def run(self, model, shard: int, n_shards: int, index: range, prompts: list):
        from sinkmech.context.length import check_sweep, length_scores, plan_lengths
        from sinkmech.hooks import parse_head
        from sinkmech.prompts import DEFAULT_EPS
        from sinkmech.sharding.context import scores_partial, sweep_settings

        fixed = None if self.head is None else parse_head(self.head, model)
        lengths, eps, multiples = check_sweep(model.cfg.n_layers, model.cfg.n_heads, lengths=self.lengths,
                                              top_k=self.top_k, eps=DEFAULT_EPS,
                                              uniform_multiples=self.uniform_multiples, fixed_head=fixed)
        batch, sha = self.batch(model, index)
        done, _ = plan_lengths(lengths, model.cfg.n_ctx, int(batch.lengths.min()) - batch.offset)
        scores = length_scores(model, batch, done, options=RunOptions(batch_size=self.batch_size, progress=False))
        sweep = sweep_settings(lengths=lengths, top_k=self.top_k, eps=eps, uniform_multiples=multiples,
                               fixed_head=fixed)
        return scores_partial(scores, batch, {**self.settings, **model_settings(model), "prompts_sha256": sha, **sweep},
                              cfg=model.cfg, **self.where(shard, n_shards, index))


# what a stage-2 shard checks against stage 1: the same model and the same texts
SAME_AS_STAGE1 = ("backend", "dtype", "n_ctx", "n_layers", "n_heads", "model_name", "prompts_sha256")


@dataclass(frozen=True, kw_only=True)
class CostsTask(LengthTask):
    """Stage 2 on one shard: the chosen heads' mask_first costs; its prompts are
    their stage-1 rows (`prompt_rows`), attached to the part."""

    heads: dict
    scores_settings: dict

    def run(self, model, shard: int, n_shards: int, index: range, prompts: list):
        from sinkmech.context.length import ChosenHeads, length_costs
        from sinkmech.sharding.context import costs_partial, scores_shard

        batch, sha = self.batch(model, index)
        here = {**model_settings(model), "prompts_sha256": sha, "n_ctx": model.cfg.n_ctx,
                "n_layers": model.cfg.n_layers, "n_heads": model.cfg.n_heads, "model_name": model.cfg.model_name}
        diff = differing_setting({k: self.scores_settings.get(k) for k in SAME_AS_STAGE1},
                                 {k: here[k] for k in SAME_AS_STAGE1})
        if diff is not None:
            raise ValueError(f"stage 2 runs on another '{diff[0]}' than stage 1 (here {diff[2]!r}, "
                             f"stage 1 {diff[1]!r})")
        heads = ChosenHeads.from_dict(self.heads)
        scores = scores_shard(self.scores_settings, prompts, **self.where(shard, n_shards, index))
        costs = length_costs(model, batch, heads, options=QUIET)
        return costs_partial(costs, heads, batch, {**self.settings, **model_settings(model)}, scores=scores,
                             **self.where(shard, n_shards, index))


def length_settings(args, lengths: list[int], texts: list | None = None) -> dict:
    """What every part of one sharded `length` run shares, known before the model loads."""
    corpus = {"corpus": "default_corpus"} if texts is None else {"corpus": "prompts",
                                                                   "prompts_sha256": prompts_sha256(texts)}
    return {"command": "length", "model": args.model, "model_sha256": model_sha256(args.model),
            **corpus, "n_prompts": args.n_prompts, "lengths": lengths, "bos": args.bos,
            "top_k": args.top, "uniform_multiples": [float(m) for m in args.uniform_multiples], "head": args.head,
            "sinkmech_version": sinkmech_version()}


def task_of(cls, args, lengths: list[int], settings: dict, texts: list | None, **fields):
    return cls(model=args.model, device=args.device, dtype=args.dtype, max_tokens=max(lengths),
               n_prompts_total=args.n_prompts, settings=settings, lengths=tuple(lengths), bos=args.bos,
               batch_size=args.batch_size, texts=None if texts is None else tuple(texts), **fields)


def scores_task(args, lengths: list[int], settings: dict, texts: list | None) -> ScoresTask:
    return task_of(ScoresTask, args, lengths, settings, texts, top_k=args.top,
                   uniform_multiples=tuple(args.uniform_multiples), head=args.head)


def costs_stage(args, lengths: list[int], settings: dict, scores, texts: list | None) -> tuple[CostsTask, dict, list]:
    """Stage 2's task, its settings (the run's and the chosen heads) and its prompts
    (each one's stage-1 rows), from the merged stage-1 part `scores`."""
    from sinkmech.sharding.context import length_heads, prompt_rows

    heads = length_heads(scores).to_dict()
    costs_settings = {**settings, "heads": heads}
    task = task_of(CostsTask, args, lengths, costs_settings, texts, heads=heads, scores_settings=scores.settings)
    return task, costs_settings, prompt_rows(scores)


def read_scores(paths, settings: dict):
    """The stage-1 parts at `paths`, merged: complete, of `length --shard`, and run with these settings."""
    from sinkmech.sharding.context import SCORES

    part = read_parts(paths)
    if part.kind != SCORES:
        raise UsageError(f"--scores takes the stage-1 parts of `sinkmech length --shard I/N` (without --scores); "
                         f"these hold a '{part.kind}' result")
    diff = differing_setting(settings, {k: part.settings.get(k) for k in settings})
    if diff is not None:
        key, here, there = diff
        raise UsageError(f"the --scores parts were run with another '{key}' ({there!r}; here {here!r}): "
                         "run stage 2 with the flags of stage 1")
    return part


def sharded_length(args, lengths: list[int], texts: list | None = None) -> None:
    """`--shard I/N` (stage 1, or stage 2 with --scores) or `--ray` (both stages),
    on `texts` (--prompts) or the default corpus."""
    from sinkmech.sharding.context import COSTS, SCORES

    settings = length_settings(args, lengths, texts)
    windows = list(range(args.n_prompts))  # the prompts, by number (see the note above LengthTask)
    if args.ray is not None:
        if args.scores is not None:
            raise UsageError("--ray runs both stages itself: --scores is stage 2 of --shard I/N")
        scores = run_command_on_ray(args, windows, scores_task(args, lengths, settings, texts), SCORES, settings,
                                    stage="scores")
        task, costs_settings, rows = costs_stage(args, lengths, settings, scores, texts)
        return merged_length(run_command_on_ray(args, rows, task, COSTS, costs_settings, stage="costs"), args)
    if args.shard is None:
        if args.scores is not None:
            raise UsageError("--scores is stage 2 of a sharded run: it needs --shard I/N (the shard to cost)")
        raise UsageError("--resume needs --shard I/N or --ray")
    i, n = args.shard
    try:
        span = shard_span(args.n_prompts, i, n)
    except ValueError as e:
        raise UsageError(str(e)) from None
    check_part_output(args)
    if args.scores is None:
        run_shard(args, windows, ShardRun(i, n, span, args.n_prompts, settings),
                  scores_task(args, lengths, settings, texts), SCORES)
        return
    task, costs_settings, rows = costs_stage(args, lengths, settings, read_scores(args.scores, settings), texts)
    print(f"stage 2: heads chosen on {args.n_prompts} prompts' scores", file=sys.stderr)
    run_shard(args, rows, ShardRun(i, n, span, args.n_prompts, costs_settings), task, COSTS)


def merged_length(part, args) -> None:
    """`sinkmech merge` for stage-2 parts: the table and --json / --png as `length` writes them."""
    from sinkmech.plots.mechanisms import length_lines
    from sinkmech.sharding.context import length_result

    sweep = length_result(part)
    print_length_table(sweep)

    def png_out() -> None:
        if not sweep.lengths:
            raise UsageError("every length was skipped: nothing to draw")
        print(f"wrote {length_lines(sweep, args.png, model_name=part.settings['model'])}")

    write_results(args, sweep.to_dict(), png_out)


def merged_length_scores(part, args) -> None:
    """`sinkmech merge` for stage-1 parts: refused, they are half the run."""
    raise UsageError("these are stage-1 parts of a sharded `sinkmech length` (sink scores only): run stage 2 on "
                     "them, `sinkmech length ... --shard I/N --scores PARTS... --json NAME.partial.json` for each "
                     "shard I, then merge the stage-2 parts")
