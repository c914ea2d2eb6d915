"""`sinkmech compare`: the paper's Table 2 and Figure 2 on real models, side by
side (Barbero et al. 2025): sink rates, loss and perturbation spread with and
without `<bos>`, and the dormant-head scan, for each model; one folder out
(compare.json, compare.md, figures), written whole or not at all."""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from sinkmech.cli.common import (
    add_attention,
    Distinct, FlagValueError, UsageError, count_or_all, model_name, non_negative_int, output_file, output_folder, positive_int,
    prompts_arg, run_options,
)
from sinkmech.dormant.first_look import FULL_NOOP_PROMPTS, NOOP_MAX_HEADS, NOOP_PROMPTS
from sinkmech.files import check_output_dir, json_text, staged_dir, write_text
from sinkmech.findings import flatten, record, report_findings

if TYPE_CHECKING:  # annotations only: the module is imported when the command runs
    from sinkmech.studies.compare import ModelComparison

DEFAULT_MODELS = ["smollm2", "gemma3-270m"]
CONFOUNDS = ("Confounds: the default models are 4-bit GGUF checkpoints (Gemma 3 270M Q4_K_M, SmolLM2-135M-Instruct "
             "Q4_1) dequantized to float32, so quantization error is in every number; the two differ in far more than "
             "the `<bos>` recipe (size, depth, data, tokenizer, architecture); and SmolLM2-Instruct's first token "
             "`<|im_start|>` opens every chat turn, so \"with `<bos>`\" also means \"a chat turn begins\".")


def add_compare_parser(sub) -> None:
    p = sub.add_parser("compare", help="Table 2 / Figure 2 of the paper on several models: sinks, loss, spread, dormant heads")
    p.add_argument("--models", type=model_name, nargs="+", action=Distinct, default=None,
                   help="models to compare (default: smollm2 gemma3-270m)")
    p.add_argument("--out", type=output_folder, required=True,
                   help="output folder (compare.json, compare.md, figures; missing folders are created)")
    p.add_argument("--prompts", default=None, help="prompt file (.txt, .json, .jsonl); default: 170 windows of the Python docs")
    p.add_argument("--n-prompts", type=positive_int, default=170, help="prompts for sink rates and loss (default 170)")
    p.add_argument("--max-tokens", type=positive_int, default=64, help="content tokens per prompt (default 64)")
    p.add_argument("--spread-prompts", type=positive_int, default=16, help="prompts for the one-token swap (default 16)")
    p.add_argument("--spread-tokens", type=positive_int, default=48, help="content tokens per prompt for the swap (default 48)")
    p.add_argument("--dormant-prompts", type=non_negative_int, default=64, help="prompts for the dormant-head scan (0: skip it)")
    p.add_argument("--noop-prompts", type=non_negative_int, default=NOOP_PROMPTS,
                   help=f"prompts held out from the scan for the no-op check of the top candidates (default "
                        f"{NOOP_PROMPTS}, a first look; the findings check {FULL_NOOP_PROMPTS}; 0: the scan only, the "
                        "no-op check left to `sinkmech heads`)")
    p.add_argument("--noop-max-heads", type=count_or_all, default=NOOP_MAX_HEADS, metavar="N|all",
                   help=f"check at most N of those heads, the if-else heads first (default {NOOP_MAX_HEADS}, a first "
                        "look; 'all': every one; the run says what the whole check would take)")
    p.add_argument("--batch-size", type=positive_int, default=16, help="prompts per forward pass")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier comparison in --out (as a whole)")
    p.add_argument("--report", type=Path, default=None, metavar="DIR",
                   help="also write the first model's report page (`sinkmech report` with its defaults and this "
                        "command's --prompts, --n-prompts, --max-tokens, --batch-size, --dormant-prompts (as its "
                        "scan prompts), --noop-prompts and --noop-max-heads) into DIR, reusing this command's model load, sink passes "
                        "and dormant-head discovery; --overwrite and --findings apply to it too")
    p.add_argument("--findings", type=output_file, default=None,
                   help="merge the quotable numbers into this findings file (e.g. figures/findings.json)")
    add_attention(p, needs_pattern="runs the dormant-head scan and the ablations, which read and edit whole attention patterns")
    p.set_defaults(func=cmd_compare)


def markdown(results: list[ModelComparison]) -> str:
    from sinkmech.prompts import CONDITIONS, CONDITION_LABELS
    from sinkmech.stats import effect_text

    eps = list(results[0].conditions[CONDITIONS[0]].sink_rate)
    head = ["model", "`<bos>`"] + [f"sink rate % (eps {e})" for e in eps] + [
        "mean alpha_0", "uniform alpha_0", "loss (nats)", "spread after a 1-token swap"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def with_ci(v: float, ci, fmt: str) -> str:
        return f"{v:{fmt}}" if not ci else f"{v:{fmt}} [{ci[1]:{fmt}}, {ci[2]:{fmt}}]"

    for r in results:
        for c in CONDITIONS:
            row = r.conditions[c]
            cells = [r.model, CONDITION_LABELS[c]] + [with_ci(row.sink_rate[e], row.sink_rate_ci.get(e), ".1f")
                                                     for e in eps] + [
                f"{row.mean_score:.3f}", f"{row.uniform_score:.3f}", with_ci(row.loss, row.loss_ci, ".2f"),
                f"{row.spread:.3f}"]
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Brackets: {results[0].interval or '95 % bootstrap intervals over prompts'}."]
    for r in results:
        gap, rates = r.contrasts.get("loss_gap"), r.contrasts.get("sink_rate_gap", {})
        parts = [f"loss {effect_text(gap[0], gap[1:], fmt='+.2f', unit=' nats')}"] if gap else []
        parts += [f"sink rate (eps {e}) {effect_text(v[0], v[1:], fmt='+.1f', unit=' points')}" for e, v in rates.items()]
        if parts:
            lines.append(f"- {r.model}, without minus with `<bos>` (paired by prompt): " + "; ".join(parts))
    first = results[0]
    lines += ["", f"{first.n_prompts} prompts x {first.max_tokens} content tokens for sink rates and loss (the same "
              "content targets 1..n-1 in both conditions); spread: mean relative residual change ||h'-h||/||h|| of "
              f"the positions after a one-token swap at content position {first.spread_position}, averaged over "
              f"layers, {first.spread_prompts} prompts. The models differ in depth, so that one average does not "
              "compare them: `spread_by_depth.png` and `reach_by_depth.png` give the curves over fractional depth "
              f"with 95 % bootstrap intervals over the {first.spread_prompts} swapped prompts' documents where they have "
              "them (reach: the share of later positions changed by > 0.1)."]
    for r in results:
        f = r.findings()
        for c in CONDITIONS:
            cur = {d: v for d, v in f[c]["curve_at_depth"].items() if v["reach"]}
            if cur:
                lines.append(f"- {r.model}, {CONDITION_LABELS[c]}: reach at fractional depth " + ", ".join(
                    f"{d}: {v['reach'][0]:.2f} [{v['reach'][1]:.2f}, {v['reach'][2]:.2f}]" for d, v in cur.items()))
        gap = {d: v for d, v in f["gap_at_depth"].items() if v.get("mean_change")}
        if gap:
            def cell(v, k):
                m, lo, hi = v[k]
                return f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]" + ("" if v[f"{k}_detectable"] else " (no detectable effect)")
            lines.append(f"- {r.model}, without minus with `<bos>` (paired by prompt), relative change / reach at "
                         "fractional depth " + "; ".join(f"{d}: {cell(v, 'mean_change')} / {cell(v, 'reach')}"
                                                          for d, v in gap.items()))
    for r in results:
        d = r.dormant
        if d is None:
            continue
        lines += ["", f"**{r.model}, dormant heads** ({d.n_prompts} prompts, with `<bos>`): "
                  + ", ".join(f"{n} {m}" for m, n in d.mode_counts.items())
                  + (f"; if-else heads: {', '.join(d.if_else_heads)}" if d.if_else_heads else "; no head passes the if-else rule")
                  + (f". No-op check of {len(d.noop)} of the {len(d.noop_covers) or len(d.noop)} heads it covers "
                     "(every if-else head, then the closest candidates) on "
                     f"{len(d.noop_prompts)} prompts held out from the scan: loss change per "
                     "intervened query, nats, with 95 % t intervals over prompts (an interval holding 0: no "
                     "detectable effect; Holm's correction over the primary family, active minus matched control per "
                     "if-else head and intervention (`compare.json`, `checks`: `role` and `p_adjusted`); other "
                     "intervals unadjusted):"
                     if d.noop_prompts else ". No no-op check here (`sinkmech heads` runs it).")]
        for name, n in d.noop.items():
            c = d.candidates.get(name, {})
            trig = c.get("trigger")
            t = ("no trigger" if trig is None else f"trigger {trig['token']!r} (validated lift "
                 + ("n/a" if trig["validated_lift"] is None else f"x{trig['validated_lift']:.1f}")
                 + ("" if trig["validated"] else ", not validated") + ")")
            e = lambda v, ci: effect_text(n[v], n[ci])  # noqa: E731
            lines.append(f"- {name} ({c.get('mode', '?')}; {t}): move to first, dormant "
                         f"{e('per_query_dormant', 'per_query_dormant_ci')} ({n['n_dormant']} queries), active "
                         f"{e('per_query_active', 'per_query_active_ci')} ({n['n_active']} queries); zero out, dormant "
                         f"{e('zero_dormant', 'zero_dormant_ci')}, active {e('zero_active', 'zero_active_ci')}")
        if d.sweep:
            lines += ["", "if_else heads at other (high, low) cuts: " + "; ".join(
                f"{r['high']:g}/{r['low']:g}: {', '.join(r['if_else_heads']) or 'none'}" for r in d.sweep)]
    lines += ["", CONFOUNDS]
    return "\n".join(lines) + "\n"


def default_models() -> list[str]:
    """DEFAULT_MODELS, each checked by the --models type (argparse checks only the
    names given), so that a missing one fails before the first model loads."""
    try:
        return [model_name(n) for n in DEFAULT_MODELS]
    except FlagValueError as e:
        raise UsageError(f"--models (default) {e}") from None


def write_report(args, model, name: str, prompts, shared) -> None:
    """The report page of `model` (`sinkmech report`'s defaults), its sink scores
    and its dormant-head scan and no-op check taken from compare's passes on
    the same prompts and settings (`shared`: the comparison's SharedPasses)."""
    from sinkmech.report.context import ReportContext
    from sinkmech.report.page import build_report

    print(f"report on {name} ...", flush=True)
    report = build_report(model, args.report, model_label=name, prompts=prompts, n_prompts=args.n_prompts,
                          max_tokens=args.max_tokens, options=run_options(args), overwrite=args.overwrite,
                          scan_prompts=args.dormant_prompts or ReportContext.scan_prompts,
                          noop_prompts=args.noop_prompts, noop_max_heads=args.noop_max_heads, shared=shared)
    if args.findings is not None:
        label = name if "/" not in name else Path(name).stem
        record(args.findings, report_findings(label, report.summary), replace_prefix=f"{label}.report")
    print(f"wrote {report.index}", flush=True)


def compare_config(args):
    """The flags as a `CompareConfig` (checked here, before torch loads)."""
    from sinkmech.studies.configs import CompareConfig

    names = args.models if args.models is not None else default_models()
    return CompareConfig(models=tuple(names), prompts=None if args.prompts is None else str(args.prompts),
                         n_prompts=args.n_prompts, max_tokens=args.max_tokens, spread_prompts=args.spread_prompts,
                         spread_tokens=args.spread_tokens, dormant_prompts=args.dormant_prompts,
                         noop_prompts=args.noop_prompts, noop_max_heads=args.noop_max_heads)


def cmd_compare(args) -> None:
    config = compare_config(args)
    prompts = prompts_arg(args)  # a bad prompt file fails before torch is imported
    check_output_dir(args.out, overwrite=args.overwrite, what="comparison folder")  # before any model loads
    if args.report is not None:
        if args.report.resolve() == args.out.resolve():
            raise UsageError("--report must name a folder other than --out")
        check_output_dir(args.report, overwrite=args.overwrite, what="report folder")
    from sinkmech.loading.models import each_model
    from sinkmech.studies.compare import Comparison, compare_model

    from sinkmech.corpora import prompt_documents

    options = run_options(args)
    documents = prompt_documents(config.prompts, len(prompts))  # the default windows: intervals over documents
    results, t0 = [], time.perf_counter()
    for i, (name, model) in enumerate(each_model(config.models, device=args.device, dtype=args.dtype)):
        result = compare_model(model, prompts, config=config, name=name, documents=documents, options=options)
        if i == 0 and args.report is not None:
            write_report(args, model, name, prompts, result.shared)
        results.append(replace(result, shared=None))  # the kept passes go with the model
        del model
    write_comparison(args, Comparison(tuple(results), config, time.perf_counter() - t0))


def write_comparison(args, comparison) -> None:
    """compare.json (the study's result), compare.md and the figures into --out,
    whole or not at all; the findings into --findings."""
    from sinkmech.plots.compare import depth_curves, first_token_score_panels, spread_panels
    from sinkmech.prompts import CONDITIONS

    results = list(comparison.models)
    with staged_dir(args.out, overwrite=args.overwrite, what="comparison folder") as tmp:
        write_text(tmp / "compare.json", json_text(comparison.to_dict()))
        write_text(tmp / "compare.md", markdown(results))
        for suffix in (".png", ".svg"):
            first_token_score_panels({r.model: {c: r.conditions[c].per_layer_score for c in CONDITIONS} for r in results},
                                     tmp / f"first_token_score{suffix}",
                                     uniform={r.model: r.conditions["prepend"].uniform_score for r in results})
            spread_panels({r.model: {c: r.conditions[c].per_layer_spread for c in CONDITIONS} for r in results},
                          tmp / f"spread{suffix}", position=results[0].spread_position)
            for what, label in (("reach", "share of later positions changed > 0.1"),
                                ("spread", "mean ||h'-h|| / ||h|| after the swap")):
                depth_curves({r.model: {c: (r.conditions[c].depth, getattr(r.conditions[c], f"{what}_curve"))
                                        for c in CONDITIONS} for r in results},
                             tmp / f"{what}_by_depth{suffix}", ylabel=label,
                             title=f"One-token swap: {what} over fractional depth (95 % interval over prompts)")
    if args.findings is not None:
        for r in results:
            record(args.findings, flatten(f"{r.model}.compare", r.findings()), replace_prefix=f"{r.model}.compare")
        print(f"recorded findings in {args.findings}")
    print(markdown(results))
    for note in comparison.notes(all_heads="all"):
        print(note, file=sys.stderr)
    print(f"wrote {args.out}/compare.json, compare.md, first_token_score.png, spread.png "
          f"in {comparison.seconds:.0f} s")
