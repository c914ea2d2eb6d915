"""`sinkmech heads`: the dormant (if-else) head detector's table, profiles and no-op check."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

from sinkmech.cli.common import (
    BOS_HELP, UsageError, add_attention, add_bos_token, add_common, bos_token_arg, finite_float, fraction, head_spec,
    load_model_arg, count_or_all, non_negative_int, output_file, positive_int, run_options, write_results,
)
from sinkmech.dormant.first_look import FULL_NOOP_PROMPTS, NOOP_MAX_HEADS, NOOP_PROMPTS, first_look_note
from sinkmech.cli.heads_tables import print_contrast, print_head_profile, print_heads_table, print_noop
from sinkmech.cli.shard import BosTokenTask, add_shard_flags, base_settings, model_settings, run_command_on_ray, shard_run
from sinkmech.sharding.resume import already_done, prompts_sha256
from sinkmech.findings import flatten, record
from sinkmech.sharding.format import write_partial
from sinkmech.options import RunOptions


def add_heads_parser(sub) -> None:
    p = sub.add_parser("heads", help="dormant (if-else) head detector: profiles, triggers, labels, no-op check")
    add_common(p)
    add_bos_token(p)
    p.add_argument("--bos", choices=["prepend", "none"], default="prepend", help=BOS_HELP)
    p.add_argument("--top", type=positive_int, default=20, help="rows of the if-else table")
    p.add_argument("--head", type=head_spec, default=None, help="print one head's full profile, e.g. 20.4")
    p.add_argument("--high", type=fraction, default=0.5, help="a query is dormant at first-token attention >= HIGH "
                   "(with learned sink logits, gpt-oss: key 0 plus the learned sink's share) "
                   "(default calibrated on planted heads and nulls: docs/dormant_calibration.md)")
    p.add_argument("--low", type=fraction, default=0.2, help="a query is active at first-token attention <= LOW")
    p.add_argument("--min-lift", type=finite_float, default=3.0, help="if_else needs a trigger with at least this lift")
    p.add_argument("--min-count", type=positive_int, default=5, help="... on at least this many active queries")
    p.add_argument("--min-prompts", type=positive_int, default=3, help="... in at least this many distinct prompts; the trigger is "
                   "chosen on the even-numbered prompts and must pass these on the odd-numbered ones")
    p.add_argument("--noop", type=non_negative_int, default=3, help="run the no-op check on every if-else head plus this many top "
                   "candidates (0: off)")
    p.add_argument("--noop-max-heads", type=count_or_all, default=NOOP_MAX_HEADS, metavar="N|all",
                   help=f"check at most N of those heads, the if-else heads first (default {NOOP_MAX_HEADS}, a first "
                        "look; 'all': every one, as the findings do; the run says what the whole check would take)")
    p.add_argument("--noop-prompts", type=positive_int, default=None, help="prompts used by the no-op check, held out from "
                   f"the scan (the last ones of the corpus; default {NOOP_PROMPTS}, a first look in about a minute on "
                   f"2 CPU cores, or half the prompts of a corpus of {NOOP_PROMPTS} or fewer; the findings check "
                   f"{FULL_NOOP_PROMPTS}, and the run says what that would take)")
    p.add_argument("--contrast", nargs="?", const=PYTHON_SOURCE, default=None, metavar="PROMPTS_B",
                   help="heads whose mode differs between --prompts (default: Python-docs prose) and PROMPTS_B "
                   f"(a prompt file; alone or '{PYTHON_SOURCE}': windows of the standard library's .py files), "
                   "chosen on the even prompts of each and confirmed on the odd ones; no no-op check")
    p.add_argument("--n-prompts", type=positive_int, default=None, help="use the first N prompts of each corpus (default: all)")
    p.add_argument("--findings", type=output_file, default=None,
                   help="merge the quotable numbers into this findings file: under <model>.heads (mode counts, "
                   "if_else heads with their validated lifts, the threshold sweep, no-op effects with intervals) or, "
                   "with --contrast, <model>.contrast")
    add_shard_flags(p, ray=True)
    add_attention(p, needs_pattern="reads every query's whole attention row (the keys a head attends when active, its trigger tokens)")
    p.set_defaults(func=cmd_heads)


PYTHON_SOURCE = "python-source"


def contrast_corpora(args) -> tuple[list, list]:
    """--prompts and --contrast's corpus, read and checked before any model loads."""
    from sinkmech.corpora import load_prompts, python_source_corpus

    a = load_prompts(args.prompts)
    b = python_source_corpus() if args.contrast == PYTHON_SOURCE else load_prompts(args.contrast)
    if args.n_prompts is not None:
        a, b = a[: args.n_prompts], b[: args.n_prompts]
    if min(len(a), len(b)) < 4:
        raise UsageError(f"--contrast needs >= 4 prompts in each corpus, got {len(a)} and {len(b)}")
    if a == b:
        raise UsageError("--contrast compares two corpora, and both hold the same prompts: give PROMPTS_B another "
                         "corpus than --prompts (a within-corpus contrast is the null contrast the run already reports)")
    return a, b


def cmd_contrast(args, a: list, b: list) -> None:
    """`heads --contrast`: two scans, one contrast."""
    from sinkmech.dormant.scan import scan_heads
    from sinkmech.hooks import head_label

    from sinkmech.dormant.contrast import contrast_heads

    names = ("prose" if args.prompts is None else str(args.prompts),
             "python-source" if args.contrast == PYTHON_SOURCE else str(args.contrast))
    model = load_model_arg(args)
    bos_id = bos_token_arg(model, args)
    kw = dict(bos=args.bos, max_tokens=args.max_tokens, thresholds=thresholds_arg(args), sweep=False, n_boot=0,
              options=run_options(args, bos_token_id=bos_id))
    scans = [scan_heads(model, corpus, **kw) for corpus in (a, b)]
    contrast = contrast_heads(*scans, name_a=names[0], name_b=names[1])
    print_contrast(contrast)
    if args.findings is not None:
        c = contrast.to_dict()
        c.pop("diff_all")  # every head's difference: in the JSON, not a quotable number
        c["heads"] = {head_label(h["layer"], h["head"]): h for h in c.pop("heads")}
        c["null_contrasts"] = {n["name"].replace(" ", "_"): n for n in c["null_contrasts"]}
        # without power the rule's confirmations say nothing: none is quoted
        c["confirmed_heads"] = [head_label(h.layer, h.head) for h in contrast.confirmed()] if contrast.powered else []
        c["domain_specific_heads"] = ([head_label(h.layer, h.head) for h in contrast.domain_specific()]
                                      if contrast.powered else [])
        record(args.findings, flatten(f"{args.model}.contrast", c), replace_prefix=f"{args.model}.contrast")
        print(f"recorded findings in {args.findings}", file=sys.stderr)

    def payload() -> dict:
        return {"model": args.model, "bos": args.bos, "contrast": contrast.to_dict()}

    def png_out() -> None:
        from sinkmech.plots.heads import contrast_figure

        path = contrast_figure(contrast.to_dict(), args.png, model=args.model)
        print(f"wrote {path}", file=sys.stderr)

    write_results(args, payload, png_out)


def noop_split(n_prompts: int, asked: int | None) -> int:
    """The no-op check's prompt count: `asked` (--noop-prompts) when given, else
    NOOP_PROMPTS, or half the corpus when it has NOOP_PROMPTS prompts or fewer
    (said on stderr), so that a small corpus runs without a flag."""
    if asked is not None:
        return asked
    if n_prompts > NOOP_PROMPTS:
        return NOOP_PROMPTS
    half = max(n_prompts // 2, 1)
    print(f"note: {n_prompts} prompts: the scan takes the first {n_prompts - half} and the no-op check the last "
          f"{half} (set --noop-prompts to choose)", file=sys.stderr)
    return half


def cmd_heads(args) -> None:
    from sinkmech.corpora import load_prompts, split_corpus

    # the flags and the prompt files alone decide these: refused before torch is imported
    if not args.low < args.high:  # each is in [0, 1] by its type
        raise UsageError(f"need 0 <= --low < --high <= 1, got --low {args.low} --high {args.high}")
    if args.contrast is not None:
        if args.head or getattr(args, "shard", None) or getattr(args, "ray", None):
            raise UsageError("--contrast runs two whole scans: not with --head, --shard or --ray")
    elif args.findings is not None and (args.head or getattr(args, "shard", None) or getattr(args, "ray", None)):
        raise UsageError("--findings records a whole scan: not with --head, --shard or --ray")
    if args.contrast is not None:
        return cmd_contrast(args, *contrast_corpora(args))
    prompts = load_prompts(args.prompts)
    if args.n_prompts is not None:
        prompts = prompts[: args.n_prompts]
    args.noop_prompts = noop_split(len(prompts), args.noop_prompts)
    n_noop = args.noop_prompts if (args.noop > 0 or args.head) else 0
    try:  # the no-op check runs on prompts held out from the scan
        scan_rows, noop_rows = split_corpus(len(prompts), None, n_noop)
    except ValueError as e:
        raise UsageError(f"{e}; lower --noop-prompts or give more prompts") from None
    scanned = prompts[: len(scan_rows)]
    extra = {"bos": args.bos, "noop": args.noop, "noop_prompts": args.noop_prompts, "prompts_file": args.prompts,
             "noop_max_heads": args.noop_max_heads}
    if args.ray is not None:
        if args.head:
            raise UsageError("--head is not run on Ray: run it on the merged result")
        settings = base_settings(args, scanned, **extra)
        return merged_heads(run_command_on_ray(args, scanned, heads_task(args, scanned, settings), "heads", settings),
                            args)
    shard = shard_run(args, scanned, **extra)
    if shard is not None:
        if args.head:
            raise UsageError("--head prints one head of the whole scan: run it on the merged result, not a shard")
        if args.resume and already_done(args.json, shard, "heads"):
            print(f"shard {shard.i}/{shard.n} is already in {args.json}: skipped (--resume)", file=sys.stderr)
            return
        return heads_shard(args, scanned, shard)
    model = load_model_arg(args)
    from sinkmech.dormant.scan import scan_heads
    from sinkmech.hooks import parse_head
    from sinkmech.loading.backend import learned_sink_note

    if note := learned_sink_note(model, "a query is dormant when key 0 plus the learned sink's share >= --high; the "
                                        "no-op check's move_to_first puts all of a head's attention on key 0"):
        print(note, file=sys.stderr)
    bos_id = bos_token_arg(model, args)
    target = parse_head(args.head, model) if args.head else None
    scan = scan_heads(model, scanned, bos=args.bos, max_tokens=args.max_tokens, thresholds=thresholds_arg(args),
                      options=run_options(args, bos_token_id=bos_id))
    heads_output(args, model, prompts, scan, bos_id, target, noop_rows)


@dataclass(frozen=True, kw_only=True)
class HeadsTask(BosTokenTask):
    """The head scan's running sums on one shard (`--shard`, or a Ray worker's)."""

    bos: str
    batch_size: int
    thresholds: dict

    def run(self, state, shard: int, n_shards: int, index: range, prompts: list):
        from sinkmech.dormant.labels import Thresholds
        from sinkmech.dormant.scan import accumulate
        from sinkmech.prompts import tokenize
        from sinkmech.sharding.dormant import heads_partial

        model, bos_id = state
        batch = tokenize(model, prompts, bos=self.bos, max_tokens=self.max_tokens, bos_token_id=bos_id)
        # every shard counts positions up to the longest a prompt can be, so the parts add up
        n_pos = min(self.max_tokens, model.cfg.n_ctx - 1) + batch.offset
        acc = accumulate(model, batch, Thresholds(**self.thresholds), first_prompt=index.start, n_pos=n_pos,
                         options=RunOptions(batch_size=self.batch_size, progress=False))
        return heads_partial(acc, batch, {**self.settings, **model_settings(model), "bos_token_id": bos_id},
                             **self.where(shard, n_shards, index))


THRESHOLD_FLAGS = ("high", "low", "min_lift", "min_count", "min_prompts")  # the Thresholds fields the flags set


def thresholds_arg(args):
    """The `Thresholds` the flags ask for (the other fields at their defaults)."""
    from sinkmech.dormant.labels import Thresholds

    return Thresholds(**{k: getattr(args, k) for k in THRESHOLD_FLAGS})


def heads_task(args, prompts, settings: dict) -> HeadsTask:
    th = {k: getattr(args, k) for k in THRESHOLD_FLAGS}
    return HeadsTask.from_args(args, prompts, settings, bos=args.bos, batch_size=args.batch_size, thresholds=th)


def heads_shard(args, prompts, shard) -> None:
    """`heads --shard I/N`: the scan's running sums on shard I, written as a part."""
    task = heads_task(args, prompts, shard.settings)
    part = task.run(task.load(), shard.i, shard.n, shard.index, [prompts[i] for i in shard.index])
    print(f"wrote {write_partial(args.json, part)}", file=sys.stderr)


def merged_heads(part, args) -> None:
    """`sinkmech merge` for heads parts: loads the model the parts were run on (its
    token texts and band layout; the no-op check, when asked, runs on it, on the
    prompts after the scanned ones, --batch-size prompts a pass: batched as the
    unsharded run batches them, it makes the same passes), then prints and writes
    what `heads` writes. A merged scan has no per-query records: no threshold
    sweep, no bootstrap."""
    from sinkmech.loading import models
    from sinkmech.corpora import load_prompts, split_corpus
    from sinkmech.sharding.dormant import heads_result

    from sinkmech.sharding.resume import model_sha256

    s = part.settings
    if model_sha256(s["model"]) != s["model_sha256"]:
        raise UsageError(f"the model {s['model']!r} is not the file the parts were run on (its sha256 differs)")
    prompts = load_prompts(s["prompts_file"]) if s["noop"] > 0 else None
    noop_rows = range(0)
    if prompts is not None:
        scan_rows, noop_rows = split_corpus(len(prompts), None, s["noop_prompts"])
        if prompts_sha256(prompts[: len(scan_rows)]) != s["prompts_sha256"]:
            raise UsageError(f"the no-op check needs the parts' prompts, and {s['prompts_file']} has changed since")
    model = models.load_model(s["model"])
    scan = heads_result(part, model)
    th = s["thresholds"]
    run = argparse.Namespace(**{**vars(args), "model": s["model"], "prompts": s["prompts_file"], "bos": s["bos"],
                                "noop": s["noop"],
                                "noop_max_heads": s.get("noop_max_heads"), "high": th["high"],
                                "low": th["low"], "noop_prompts": s["noop_prompts"], "max_tokens": s["max_tokens"],
                                "batch_size": args.batch_size})
    heads_output(run, model, prompts, scan, s["bos_token_id"], None, noop_rows)


def heads_output(args, model, prompts, scan, bos_id, target, noop_rows: range) -> None:
    """The table, the no-op check (on `noop_rows` of `prompts`, held out from the
    scan) and the outputs of `heads` (one scan, sharded or not)."""
    from sinkmech.corpora import prompt_documents
    from sinkmech.dormant.noop import noop_check, noop_heads, with_primary
    from sinkmech.plots.core import heatmap_panels, save

    every = [target] if target else noop_heads(scan, args.noop)
    check_heads = every[: args.noop_max_heads] if args.noop_max_heads is not None else every
    check = None
    if check_heads and len(noop_rows):
        t0 = time.perf_counter()
        documents = prompt_documents(args.prompts, noop_rows.stop)  # windows of one document are not independent
        check = noop_check(model, prompts[noop_rows.start:noop_rows.stop], check_heads, bos=args.bos,
                           max_tokens=args.max_tokens, thresholds=scan.thresholds,
                           documents=None if documents is None else documents[noop_rows.start:],
                           options=run_options(args, bos_token_id=bos_id)).at_prompts(noop_rows)
        # the primary family: the if-else heads (or the one head asked for); other candidates are secondary
        check = with_primary(check, [target] if target else scan.if_else_heads())
        note = first_look_note(len(check_heads), len(every), len(noop_rows), time.perf_counter() - t0)
        if note is not None:
            print(note, file=sys.stderr)
    if not target:  # --head L.H prints just that head's profile
        print_heads_table(scan, args.top)
    if target:
        print_head_profile(scan, *target)
    if check is not None:
        print(f"(no-op check on prompts {noop_rows.start}-{noop_rows.stop - 1}, held out from the scan on prompts "
              f"0-{scan.n_prompts - 1})")
        print_noop(check)

    def payload() -> dict:
        out = scan.to_dict()
        if target:
            out["profile"] = scan.profile(*target)
        out["noop"] = check.to_dict() if check is not None else None
        out["prompt_split"] = {"scan_prompts": list(range(scan.n_prompts)), "noop_prompts": list(noop_rows)}
        return out

    def png_out() -> None:
        fig = heatmap_panels(
            [("dormant fraction", scan.dormant_fraction.numpy()), ("active fraction", scan.active_fraction.numpy()),
             ("if-else score", scan.if_else_score.numpy())],
            title=f"Dormant-head profile per head — {args.model} (bos={args.bos})",
            xlabel="head", ylabel="layer", cbar_label="fraction of queries / score", vmin=0.0, vmax=1.0)
        print(f"wrote {save(fig, args.png)}", file=sys.stderr)

    write_results(args, payload, png_out)
    if getattr(args, "findings", None) is not None and not target:
        record(args.findings, flatten(f"{args.model}.heads", heads_findings(scan, check)),
               replace_prefix=f"{args.model}.heads")
        print(f"recorded findings in {args.findings}", file=sys.stderr)


def heads_findings(scan, check) -> dict:
    """The quotable numbers of a scan and its no-op check (nested; see `sinkmech.findings.flatten`)."""
    from sinkmech.hooks import head_label

    found = scan.if_else_heads()
    out = {
        "n_prompts": scan.n_prompts, "n_selection_prompts": len(scan.trigger_split()[0]),
        "n_validation_prompts": len(scan.trigger_split()[1]), "high": scan.thresholds.high, "low": scan.thresholds.low,
        "mode_counts": scan.mode_counts(), "n_if_else": len(found),
        "if_else_heads": [head_label(*hd) for hd in found],
        "if_else": {head_label(l, h): {"validated_lift": scan.top_trigger(l, h).validated_lift,
                                  "trigger": scan.top_trigger(l, h).token,
                                  "trigger_test": scan.top_trigger(l, h).trigger_test,
                                  "trigger_p": scan.top_trigger(l, h).trigger_p,
                                  "trigger_p_perm": scan.top_trigger(l, h).trigger_p_perm,
                                  "trigger_coverage": scan.top_trigger(l, h).coverage,
                                  "trigger_coverage_beyond_chance": scan.top_trigger(l, h).coverage_beyond_chance,
                                  "dormant_fraction": float(scan.dormant_fraction[l, h]),
                                  "active_fraction": float(scan.active_fraction[l, h])} for l, h in found},
        "sweep": {f"{r['high']:g}_{r['low']:g}": {"high": r["high"], "low": r["low"], **r["mode_counts"],
                                                   "if_else_heads": list(r["if_else_heads"])}
                  for r in scan.sweep or ()},
    }
    if check is not None:
        def effect(e: dict | None) -> dict | None:
            return None if e is None else {k: e.get(k) for k in ("value", "ci", "p", "p_adjusted", "detectable",
                                                                  "detectable_adjusted", "role")}

        family = check.primary_family or {}
        out["noop"] = {"n_prompts": len(check.prompt_indices or ()), "n_intervals": check.n_intervals,
                       "primary_family": {"size": family.get("size"), "test": family.get("test"),
                                          "tests": {f"{t['head']}.{t['intervention']}": {
                                              k: t[k] for k in ("value", "ci", "p", "p_adjusted", "detectable_adjusted")}
                                              for t in family.get("tests", ())}}, **{
            head_label(r.layer, r.head): {
                **{k: {"n_queries": e["n_queries"], "n_prompts": e["n_prompts"], "per_query": effect(e["per_query"]),
                       "total": effect(e["total"]),
                       "control_per_query": None if e["matched_control"] is None
                       else effect(e["matched_control"]["per_query"]),
                       "minus_control": None if e["matched_control"] is None
                       else effect(e["matched_control"]["difference"]),
                       **({"minus_mean_ablate": effect(e["minus_mean_ablate"])} if "minus_mean_ablate" in e else {})}
                   for k, e in r.checks.items()},
                "active_looks": r.active_looks}
            for r in check.results}}
        out["candidates"] = {}
        for r in check.results:
            l, h = r.layer, r.head
            t = scan.top_trigger(l, h)
            out["candidates"][head_label(l, h)] = {
                "mode": scan.mode(l, h), "dormant_fraction": float(scan.dormant_fraction[l, h]),
                "active_fraction": float(scan.active_fraction[l, h]),
                **({} if t is None else {"trigger": t.token, "trigger_where": t.where, "validated_lift": t.validated_lift,
                                         "trigger_p": t.trigger_p, "p_validated": t.p_validated})}
    return out


# What `sinkmech heads` prints: the if-else table with its threshold sweep, one head's
# profile, the no-op check and the contrast of two corpora.
