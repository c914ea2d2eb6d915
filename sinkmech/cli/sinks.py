"""`sinkmech sinks`: sink scores and sink rates per head, with and without `<bos>`
(Gu et al. 2025's sink rate, as used by Barbero et al. 2025); with `--keys all`,
also every key's score alpha_k and the heads whose strongest key is not the
first token (secondary sinks, Gu et al. 2025 Sec. 3; see sinkmech.measures.key_sinks)."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from sinkmech.cli.common import (
    Distinct,
    UsageError,
    add_attention,
    add_bos_token,
    add_common,
    bos_token_arg,
    check_attention_arg,
    check_context,
    conditions,
    eps_value,
    head_spec,
    load_model_arg,
    non_negative_int,
    output_file,
    positive_int,
    prompts_arg,
    run_options,
    share_below_one,
    warn_short,
    write_results,
)
from sinkmech.cli.shard import BosTokenTask, add_shard_flags, model_settings, sharded
from sinkmech.findings import flatten, record
from sinkmech.options import RunOptions


def add_sinks_parser(sub) -> None:
    p = sub.add_parser("sinks", help="sink scores, sink rates and next-token loss, with and without <bos>")
    add_common(p)
    add_bos_token(p)
    p.add_argument("--findings", type=output_file, default=None,
                   help="merge sink rates and losses into this findings file, named MODEL.sinks.FIRST_TOKEN...")
    p.add_argument("--n-prompts", type=positive_int, default=None, help="use only the first N prompts")
    p.add_argument("--bos", choices=["prepend", "none", "both"], default="both",
                   help="prepend: <bos> at position 0; none: the same content without it; both (default): each, side by side")
    p.add_argument("--bos-position", type=positive_int, default=None, metavar="K",
                   help="with --bos both|prepend: move <bos> into the sequence, K content tokens before it (K >= 1, "
                        "below --max-tokens); JSON 'bos_position' and 'bos_scores' (attention on the <bos> key from "
                        "the queries at and after it) under the with-<bos> condition; the loss stays on the same "
                        "content targets")
    p.add_argument("--eps", nargs="+", type=eps_value, default=["0.3", "0.8"], help="sink-rate thresholds (strict >)")
    p.add_argument("--top", type=positive_int, default=10, help="how many top sink heads to list")
    p.add_argument("--keys", choices=["first", "all"], default="first",
                   help="first: score key 0 only (default); all: also score every key, list each head's top keys "
                        "(JSON 'key_scores') and the heads whose strongest key is not position 0")
    p.add_argument("--top-keys", type=positive_int, default=5, help="with --keys all: top (prompt, position) keys kept per head")
    p.add_argument("--min-queries", type=positive_int, default=8,
                   help="with --keys all: score a key only when at least this many queries follow it (default 8)")
    p.add_argument("--min-excess", type=share_below_one, default=0.1,
                   help="with --keys all: a head's key of largest excess over its uniform share (query t gives "
                        "each key 1/(t+1)) is a relative sink only above this (default 0.1)")
    add_sink_flags(p)
    add_attention(p)
    add_shard_flags(p, ray=True)
    p.set_defaults(func=cmd_sinks)


def add_sink_flags(p) -> None:
    """The sink interventions (`sinkmech.interventions.phantom`): what removing <bos> takes, taken apart."""
    p.add_argument("--sink-value", choices=["zero"], default=None,
                   help="zero: the value-less <bos>, in the run with <bos> (--bos prepend|both): <bos> and every "
                        "head's attention to it kept, its value vector zeroed (the mass without the value)")
    p.add_argument("--phantom-sink", choices=["paired", "logits"], default=None,
                   help="a sink without a token on the run without <bos> (--bos none|both): each row's real keys "
                        "scaled by 1 - m and the head's output given m times a value; paired: m is the attention the "
                        "head put on <bos> at the same content query with <bos> first; logits: from --sink-logits")
    p.add_argument("--phantom-value", choices=["zero", "bos"], default=None,
                   help="the phantom's value: zero (default) or <bos>'s own value at that head (default with "
                        "--phantom-mode bias)")
    p.add_argument("--phantom-mode", choices=["dump", "bias"], default=None,
                   help="dump (default): the row rescaled by 1 - m and m times the value added; bias: only m times "
                        "the value added (the value without the mass)")
    p.add_argument("--sink-logits", type=Path, default=None, metavar="FILE.json",
                   help="the phantom's mass from these per-(layer, head) sink logits (sinkmech fit-sinks --json), "
                        "m = e^b / (e^b + the row's sum of exponentiated scores), with the file's fitted values if "
                        "it has them; the prompts they were fitted on are refused")
    p.add_argument("--sink-layers", type=non_negative_int, nargs="+", action=Distinct, default=None, metavar="L",
                   help="with a sink intervention: act in these layers only (default every layer)")
    p.add_argument("--sink-heads", type=head_spec, nargs="+", action=Distinct, default=None, metavar="L.H",
                   help="with a sink intervention: act in these heads only, written LAYER.HEAD (default every head)")


def sinks_settings(args) -> dict:
    """What every part of one `sinks` run must share beyond the common settings
    (with the prompts' documents where they are windows of a named corpus)."""
    keys = {"top_keys": args.top_keys, "min_queries": args.min_queries, "min_excess": args.min_excess}
    documents = getattr(args, "prompt_documents", None)
    return {"bos": args.bos, "eps": list(args.eps), "keys": args.keys, **(keys if args.keys == "all" else {}),
            **({} if args.bos_position is None else {"bos_position": args.bos_position}),
            **({} if documents is None else {"documents": list(documents)})}


def with_documents(results: dict, documents) -> dict:
    """Each condition's scores with the prompts' documents (their intervals then resample documents)."""
    if documents is None:
        return results
    return {k: replace(r, documents=tuple(documents)) for k, r in results.items()}


def merged_sinks(part, args) -> None:
    """`sinkmech merge` for sinks parts: the table, then --json / --png as `sinks` writes them."""
    from sinkmech.plots.sinks import sink_heatmap

    from sinkmech.sharding.format import detach
    from sinkmech.sharding.measures import key_sinks_result, sinks_result

    s = part.settings
    results, eps = with_documents(sinks_result(part), s.get("documents")), s["eps"]
    keys = {c: key_sinks_result(detach(part, f"keys.{c}"), top_k=s["top_keys"], min_queries=s["min_queries"],
                                min_excess=s["min_excess"], model_name=s["model_name"])
            for c in results if f"keys.{c}" in s}
    print_sinks_table(results, eps, args.top)
    if keys:
        print_flagged(keys)

    def png_out() -> None:
        print(f"wrote {sink_heatmap(results, args.png, model_name=s['model'])}", file=sys.stderr)

    write_results(args, lambda: sinks_payload(results, eps, keys), png_out)


@dataclass(frozen=True, kw_only=True)
class SinksTask(BosTokenTask):
    """`sinkmech sinks` on one shard (`--shard`, or a Ray worker's: `sinkmech.sharding.ray`);
    with --keys all, each condition's key-sink part attached as "keys.<condition>"."""

    conditions: tuple[str, ...]
    batch_size: int
    attention: str = "auto"

    def run(self, state, shard: int, n_shards: int, index: range, prompts: list):
        from sinkmech.prompts import tokenize
        from sinkmech.sharding.measures import sinks_partial
        from sinkmech.measures.sinks import sink_scores

        from sinkmech.measures.key_sinks import key_sink_sums
        from sinkmech.sharding.format import attach
        from sinkmech.prompts import token_text
        from sinkmech.sharding.measures import key_sinks_partial

        model, bos_id = state
        results, batches = {}, {}
        for bos in self.conditions:
            batches[bos] = batch = tokenize(model, prompts, bos=bos, max_tokens=self.max_tokens, bos_token_id=bos_id)
            moved = self.settings.get("bos_position") if bos == "prepend" else None
            check_moved_bos(batch, moved)
            results[bos] = sink_scores(model, batch, max_tokens=self.max_tokens, loss=True, bos_position=moved,
                                       options=RunOptions(batch_size=self.batch_size, progress=False),
                                       attention=self.attention)
        where = self.where(shard, n_shards, index)
        part = sinks_partial(results, {**self.settings, **model_settings(model), "bos_token_id": bos_id},
                             n_ctx=model.cfg.n_ctx, **where)
        s = self.settings
        if s["keys"] == "all":
            for bos, batch in batches.items():
                rows, sums = key_sink_sums(model, batch, top_k=s["top_keys"], min_queries=s["min_queries"],
                                           min_excess=s["min_excess"],
                                           options=RunOptions(batch_size=self.batch_size, progress=False))
                keys = key_sinks_partial(rows, sums, batch, {}, width=self.max_tokens + 1, decode=token_text(model),
                                         **where)
                part = attach(part, f"keys.{bos}", keys)
        return part


def sinks_payload(results: dict, eps: list[str], keys: dict | None = None) -> dict:
    """The JSON contract of `sinkmech sinks`; with `keys` (condition -> KeySinks),
    each condition also holds `key_scores[layer][head]`: the top keys as
    {"prompt", "position", "token", "score"}, and the scores against each key's
    uniform share (`relative_flagged`, `max_excess`, `strongest_relative_position`, ...)."""
    first = next(iter(results.values()))
    conditions = {k: r.summary(eps) for k, r in results.items()}
    for k, ks in (keys or {}).items():
        d = ks.to_dict()
        conditions[k]["key_scores"] = d["key_scores"]
        for name in ("min_excess", "uniform_by_position", "max_excess", "strongest_relative_position",
                     "off_first_rate_relative", "relative_flagged"):
            conditions[k][name] = d[name]
    return {
        "model": first.model_name,
        "n_layers": first.n_layers,
        "n_heads": first.n_heads,
        "max_tokens": max(r.max_tokens for r in results.values()),
        "max_tokens_requested": first.max_tokens_requested,
        "context_limit": first.context_limit,
        "n_prompts": first.n_prompts,
        "attention": first.attention,
        "conditions": conditions,
    }


def print_flagged(keys: dict) -> None:
    """Heads whose strongest key (alpha_k averaged over prompts) is not position 0,
    with the token text of their top keys."""
    from sinkmech.hooks import head_label

    for c, ks in keys.items():
        flagged = ks.flagged_heads()
        print()
        print(f"heads whose strongest key is not position 0 (bos={c}; keys with >= {ks.min_queries} queries after "
              f"them): {len(flagged)}")
        for l, h, pos in flagged:
            alpha, alpha0 = float(ks.by_position[l, h, pos]), float(ks.by_position[l, h, 0])
            top = ", ".join(f"{ks.top_token[l][h][r]!r} @{int(ks.top_position[l, h, r])} ({float(ks.top_scores[l, h, r]):.2f})"
                            for r in range(ks.top_scores.shape[-1]) if float(ks.top_scores[l, h, r]) > float("-inf"))
            print(f"  {head_label(l, h)}  position {pos}: mean alpha {alpha:.3f} vs alpha_0 {alpha0:.3f}; top keys: {top}")
        relative = ks.relative_flagged_heads()
        print(f"heads whose key of largest excess over its uniform share (> {ks.min_excess:g}) is not position 0 "
              f"(bos={c}): {len(relative)}")
        for l, h, pos in relative:
            print(f"  {head_label(l, h)}  position {pos}: excess {float(ks.excess_by_position[l, h, pos]):+.3f} "
                  f"({float(ks.ratio_by_position[l, h, pos]):.1f}x uniform) vs position 0 "
                  f"{float(ks.excess_by_position[l, h, 0]):+.3f}")


def print_sinks_table(results: dict, eps: list[str], top: int) -> None:
    from sinkmech.hooks import head_label

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
    if any(results[c].sink is not None for c in conds):
        print()
        for c in conds:
            if results[c].sink is not None:
                print(f"bos={c}: {results[c].sink}")
    if any(results[c].phantom_mass is not None for c in conds):
        print()
        print("mean phantom-sink mass per layer (the share each row gives the sink without a token)")
        for l in range(next(iter(results.values())).n_layers):
            print(f"{l:>6} " + " ".join(f"{float(results[c].phantom_mass[:, l].mean()):>10.3f}"
                                        if results[c].phantom_mass is not None else f"{'-':>10}" for c in conds))
    if all(results[c].learned_sink_scores is not None for c in conds):  # gpt-oss-style learned sink logits
        print()
        print("mean learned-sink mass per layer (the softmax's share on the learned sink logit, beside alpha_0 on key 0)")
        sink = {c: results[c].learned_sink_scores.mean((0, 2)) for c in conds}
        for l in range(next(iter(results.values())).n_layers):
            print(f"{l:>6} " + " ".join(f"{float(sink[c][l]):>10.3f}" for c in conds))
    for c in conds:
        r = results[c]
        print()
        print(f"top sink heads (bos={c}; uniform attention would score {r.uniform_score():.3f})")
        for layer, head, score in r.top_heads(top):
            print(f"  {head_label(layer, head)}  {score:.3f}")


def check_bos_position(args) -> None:
    """--bos-position K: refused before the model loads unless it can be honoured."""
    K = args.bos_position
    if K is None:
        return
    if args.bos == "none":
        raise UsageError("--bos-position moves <bos> into the sequence: it needs --bos both or --bos prepend")
    if K >= args.max_tokens:
        raise UsageError(f"--bos-position {K} is at or beyond the content length (--max-tokens {args.max_tokens}): "
                         "give a K below it")
    if args.keys == "all":
        raise UsageError("--bos-position scores key 0 and the <bos> key only: it cannot be combined with --keys all")


def check_moved_bos(batch, moved: int | None) -> None:
    """--bos-position K needs more than K content tokens in every prompt (the tokens decide: after the load)."""
    if moved is not None and int(batch.lengths.min()) - 1 <= moved:
        raise UsageError(f"--bos-position {moved} is at or beyond the content length: the shortest prompt has "
                         f"{int(batch.lengths.min()) - 1} content tokens")


@dataclass(frozen=True)
class SinkPlan:
    """The sink interventions the flags ask for, checked before torch loads: per
    condition a spec to build once the model is loaded (`specs`)."""

    valueless: bool
    phantom_form: str | None
    phantom_value: str | None
    phantom_mode: str
    layers: tuple[int, ...] | None
    heads: tuple[tuple[int, int], ...] | None
    sink_file: object | None  # sinkmech.interventions.sink_file.SinkFile

    @property
    def any(self) -> bool:
        return self.valueless or self.phantom_form is not None

    def tag(self) -> str:
        """What the findings names add for this run (never the plain run's names)."""
        parts = ["sink_value_zero"] if self.valueless else []
        if self.phantom_form is not None:
            value = "fitted" if self.phantom_value is None else self.phantom_value
            parts.append(f"phantom_{self.phantom_form}_{value}" + ("_bias" if self.phantom_mode == "bias" else ""))
        if self.layers is not None:
            parts.append("layers_" + "_".join(map(str, self.layers)))
        if self.heads is not None:
            parts.append("heads_" + "_".join(f"{l}.{h}" for l, h in self.heads))
        return "".join("_" + p for p in parts)

    def specs(self, model) -> dict:
        """condition -> ValuelessBos or PhantomSink, checked against the loaded model
        (a --sink-logits file of another model's shape is refused here, before any pass)."""
        import torch

        from sinkmech.interventions.phantom import PhantomSink, ValuelessBos, head_selection

        head_selection(model, self.layers, self.heads)
        out = {}
        if self.valueless:
            out["prepend"] = ValuelessBos(layers=self.layers, heads=self.heads)
        if self.phantom_form is not None:
            logits, value = None, self.phantom_value
            if self.sink_file is not None:
                f = self.sink_file
                f.check_shape(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
                logits = torch.tensor(f.logits)
                if f.values is not None:
                    value = torch.tensor(f.values)
            out["none"] = PhantomSink(self.phantom_form, value or "zero", self.phantom_mode, logits,
                                      layers=self.layers, heads=self.heads)
        return out


def check_sink_flags(args) -> SinkPlan:
    """The sink flags, refused before the model loads unless they can be honoured together."""
    from sinkmech.interventions.sink_file import read_sink_file

    form = args.phantom_sink
    if args.sink_logits is not None:
        if form == "paired":
            raise UsageError("--sink-logits gives the phantom's mass from logits: it cannot be combined with "
                             "--phantom-sink paired")
        form = "logits"
    elif form == "logits":
        raise UsageError("--phantom-sink logits needs --sink-logits FILE.json (sinkmech fit-sinks writes one)")
    if form is None and (args.phantom_value is not None or args.phantom_mode is not None):
        raise UsageError("--phantom-value and --phantom-mode shape a phantom sink: give --phantom-sink paired or "
                         "--sink-logits FILE.json")
    if args.sink_value is not None and args.bos == "none":
        raise UsageError("--sink-value zero zeroes <bos>'s value in the run with <bos>: it needs --bos prepend or both")
    if form is not None and args.bos == "prepend":
        raise UsageError("a phantom sink stands in for <bos> on the run without it: it needs --bos none or both")
    mode = args.phantom_mode or "dump"
    value = args.phantom_value
    sink_file = None
    if args.sink_logits is not None:
        sink_file = read_sink_file(args.sink_logits)
        if sink_file.values is not None and value is not None:
            raise UsageError(f"{args.sink_logits} holds fitted sink values, which the phantom writes: drop "
                             "--phantom-value")
    if form is not None and value is None and (sink_file is None or sink_file.values is None):
        value = "bos" if mode == "bias" else "zero"
    if mode == "bias" and value == "zero":
        raise UsageError("--phantom-mode bias adds m times a value and rescales nothing: with --phantom-value zero "
                         "it changes nothing (use bos)")
    plan = SinkPlan(args.sink_value == "zero", form, value, mode,
                    None if args.sink_layers is None else tuple(args.sink_layers),
                    None if args.sink_heads is None else tuple(tuple(int(x) for x in h.split(".")) for h in args.sink_heads),
                    sink_file)
    if (plan.layers is not None or plan.heads is not None) and not plan.any:
        raise UsageError("--sink-layers and --sink-heads choose where a sink intervention acts: give --sink-value "
                         "zero or a phantom sink")
    if plan.layers is not None and plan.heads is not None:
        raise UsageError("give --sink-layers or --sink-heads, not both")
    if plan.any:
        if args.bos_position is not None:
            raise UsageError("the sink interventions act on <bos> first or no <bos>: drop --bos-position")
        if args.keys == "all":
            raise UsageError("the sink interventions score key 0 and the sink only: they cannot be combined with "
                             "--keys all")
        if args.shard is not None or args.ray is not None:
            raise UsageError("the sink interventions run in one process: drop --shard / --ray")
    return plan


# The default windows (`prompts.default_corpus`) hold 64 content tokens; past
# that, without --prompts, the default is long natural text (`context.long_text`).
DEFAULT_WINDOW_TOKENS = 64
DEFAULT_LONG_PROMPTS = 8


def sinks_prompts(args) -> list[str]:
    """--prompts, or without it the default windows up to 64 tokens and long
    natural text past them (said on stderr, with where each text came from in
    the JSON's `prompt_sources`)."""
    if args.prompts is not None or args.max_tokens <= DEFAULT_WINDOW_TOKENS:
        from sinkmech.corpora import prompt_documents

        prompts = prompts_arg(args)
        args.prompt_documents = prompt_documents(args.prompts, len(prompts))
        return prompts
    from sinkmech.context.long_text import long_prompts_for

    texts = long_prompts_for(args.n_prompts or DEFAULT_LONG_PROMPTS, args.max_tokens)
    print(f"note: --max-tokens {args.max_tokens} is past the default windows ({DEFAULT_WINDOW_TOKENS} tokens): "
          f"scoring {len(texts)} long texts of installed documents (topics {', '.join(dict.fromkeys(t.topic for t in texts))}; "
          "sinkmech.context.long_text)", file=sys.stderr)
    args.prompt_sources = [t.to_dict() for t in texts]
    return [t.text for t in texts]


def cmd_sinks(args) -> None:
    attention = check_attention_arg(args)
    if args.keys == "all" and attention == "fused":
        raise UsageError("--keys all reads every key's column of each layer's pattern: run it with --attention "
                         "pattern (or auto)")
    if args.ray is not None and args.findings is not None:
        raise UsageError("--findings is not written by --ray runs: merge, then run sinks --findings")
    check_bos_position(args)  # the flags alone decide these: before torch is imported
    plan = check_sink_flags(args)
    if plan.any and attention == "fused":
        raise UsageError("the sink interventions act on each layer's attention pattern: run them with --attention "
                         "pattern (or auto)")
    if args.max_tokens > DEFAULT_WINDOW_TOKENS:  # past the windows: a length the model may not hold (up to
        # them, a prompt longer than a small model's context is cut the same in both conditions: `context_limit`)
        check_context(args.model, args.max_tokens + (args.bos != "none"))
    prompts = sinks_prompts(args)  # bad prompt files fail before the slow model load
    if plan.sink_file is not None:
        plan.sink_file.refuse_fitted(prompts)  # held-out prompts only, before the model loads

    def task(settings: dict) -> SinksTask:
        return SinksTask.from_args(args, prompts, settings, conditions=tuple(conditions(args.bos)),
                                   batch_size=args.batch_size, attention=attention)

    if sharded(args, prompts, "sinks", task, merged_sinks, **sinks_settings(args)):
        return
    from sinkmech.plots.sinks import sink_heatmap
    from sinkmech.measures.key_sinks import key_sink_scores
    from sinkmech.prompts import tokenize
    from sinkmech.measures.sinks import paired_contrasts, sink_scores

    model = load_model_arg(args, n_ctx=max(2048, args.max_tokens + 1))
    bos_id = bos_token_arg(model, args)
    specs = plan.specs(model)
    results, keys, batches = {}, {}, {}
    for i, bos in enumerate(conditions(args.bos)):
        batches[bos] = batch = tokenize(model, prompts, bos=bos, max_tokens=args.max_tokens, bos_token_id=bos_id)
        if i == 0:  # both conditions hold the same content tokens: say it once
            warn_short(batch, args.max_tokens)
        moved = args.bos_position if bos == "prepend" else None
        check_moved_bos(batch, moved)
        if plan.sink_file is not None and bos == "none":
            plan.sink_file.refuse_fitted_tokens(batch.content())
        results[bos] = sink_scores(model, batch, max_tokens=args.max_tokens, loss=True, bos_position=moved,
                                   options=run_options(args), attention=attention,
                                   sink=specs.get(bos))
    results = with_documents(results, getattr(args, "prompt_documents", None))
    for bos, batch in batches.items():
        if args.keys == "all":
            keys[bos] = key_sink_scores(model, batch, top_k=args.top_keys, min_queries=args.min_queries,
                                        min_excess=args.min_excess, options=run_options(args))
    print_sinks_table(results, args.eps, args.top)
    if keys:
        print_flagged(keys)
    def findings_out() -> None:
        label = args.model if "/" not in args.model else Path(args.model).stem
        tag = "bos_" + re.sub(r"[^A-Za-z0-9]+", "_", args.bos_token).strip("_") if args.bos_token else "bos_default"
        if args.bos_position is not None:  # a run of its own: never overwrites the <bos>-first numbers
            tag += f"_at_{args.bos_position}"
        tag += plan.tag()
        prefix = f"{label}.sinks.{tag}"
        values = {c: {k: v for k, v in r.summary(args.eps).items()
                      if k in ("sink_rate", "sink_rate_ci", "loss_ci", "interval")}
                  | {"loss": r.loss, "mean_score": float(r.scores.mean()), "n_prompts": r.n_prompts}
                  | ({} if r.phantom_mass is None else {"mean_phantom_mass": float(r.phantom_mass.mean())})
                  for c, r in results.items()}
        if args.bos_position is not None:
            values["prepend"]["bos_position"] = args.bos_position
            values["prepend"]["bos_sink_rate"] = {e: float(results["prepend"].prompt_bos_sink_rate(e).mean())
                                                  for e in args.eps}
        if set(results) == {"prepend", "none"}:  # without minus with, paired by prompt
            values["contrasts"] = paired_contrasts(results["prepend"], results["none"], args.eps)
        if bos_id is not None:
            values["first_token_id"] = bos_id
        record(args.findings, flatten(prefix, values), replace_prefix=prefix)
        print(f"recorded findings in {args.findings}", file=sys.stderr)

    def png_out() -> None:
        print(f"wrote {sink_heatmap(results, args.png, model_name=args.model)}", file=sys.stderr)

    def payload() -> dict:
        out = sinks_payload(results, args.eps, keys)
        if getattr(args, "prompt_sources", None):
            out["prompt_sources"] = args.prompt_sources[: out["n_prompts"]]
        return out

    write_results(args, payload, png_out,
                  extra=[("--findings", findings_out)] if args.findings is not None else [])
