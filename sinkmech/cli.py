"""The `sinkmech` command: one subcommand per analysis."""

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


# sinkmech heads ------------------------------------------------------------


def add_heads_parser(sub) -> None:
    p = sub.add_parser("heads", help="dormant (if-else) head detector: profiles, triggers, labels, no-op check")
    _add_common(p)
    p.add_argument("--bos", choices=["prepend", "none"], default="prepend")
    p.add_argument("--top", type=int, default=20, help="rows of the if-else table")
    p.add_argument("--head", default=None, help="print one head's full profile, e.g. 20.4")
    p.add_argument("--high", type=float, default=0.8, help="a query is dormant at first-token attention >= HIGH")
    p.add_argument("--low", type=float, default=0.2, help="a query is active at first-token attention <= LOW")
    p.add_argument("--min-lift", type=float, default=3.0, help="if_else needs a trigger with at least this lift")
    p.add_argument("--min-count", type=int, default=5, help="... on at least this many active queries")
    p.add_argument("--noop", type=int, default=3, help="run the no-op check on this many top if-else heads, or top candidates when none passes (0: off)")
    p.add_argument("--noop-prompts", type=int, default=32, help="prompts used by the no-op check")
    p.set_defaults(func=cmd_heads)


def _fmt(x, spec: str = ".3f") -> str:
    return "   n/a" if x is None else format(x, spec)


def _trigger_text(triggers: list, n: int = 3) -> str:
    return ", ".join(f"{t['token']!r}@{t['where']} x{t['lift']:.1f} (n={t['count']})" for t in triggers[:n]) or "-"


def print_heads_table(scan, top: int) -> None:
    counts = {m: sum(row.count(m) for row in scan.modes) for m in ("sink", "active", "if_else", "mixed")}
    print(f"\n{scan.n_layers * scan.n_heads} heads over {scan.n_prompts} prompts ({scan.n_queries} queries): "
          + ", ".join(f"{v} {k}" for k, v in counts.items()))
    ranked = scan.if_else_heads()
    if ranked:
        print(f"top if-else heads ({len(ranked)} found)")
    else:
        print("no head passes the if_else rule; the closest candidates (score = fulfilment of the rule):")
        ranked = scan.ranked()
    print(f"{'head':>7} {'mode':>8} {'score':>6} {'a0':>6} {'dorm':>6} {'act':>6} {'v_first':>8} {'v_act':>8} {'out d/a':>8}  triggers")
    for l, h in ranked[:top]:
        e = scan.head_summary(l, h)
        ratio = (e["output_norm_dormant"] / e["output_norm_active"]
                 if e["output_norm_dormant"] is not None and e["output_norm_active"] else None)
        print(f"{f'{l}.{h}':>7} {e['mode']:>8} {_fmt(e['if_else_score'], '.2f'):>6} {_fmt(e['first_token_attention'], '.2f'):>6} "
              f"{_fmt(e['dormant_fraction'], '.2f'):>6} {_fmt(e['active_fraction'], '.2f'):>6} {_fmt(e['value_norm_first'], '.2f'):>8} "
              f"{_fmt(e['value_norm_active'], '.2f'):>8} {_fmt(ratio, '.2f'):>8}  {_trigger_text(e['triggers'])}")


def print_head_profile(scan, layer: int, head: int) -> None:
    e = scan.profile(layer, head)
    print(f"\nhead {layer}.{head}: {e['mode']} (if_else score {_fmt(e['if_else_score'], '.2f')})")
    for why in e["evidence"]:
        print(f"  - {why}")
    for k in ("first_token_attention", "dormant_fraction", "active_fraction", "bimodality", "value_norm_first",
              "value_norm_rest", "value_norm_active", "value_norm_dormant", "output_norm_active", "output_norm_dormant"):
        print(f"  {k:<22} {_fmt(e[k])}")
    print("  first-token attention histogram (fraction of queries per bin)")
    n = len(e["histogram"])
    for i, frac in enumerate(e["histogram"]):
        print(f"    [{i / n:.2f}, {(i + 1) / n:.2f}) {frac:6.3f} {'#' * round(60 * frac)}")
    print("  active rate by query position: " + " ".join(_fmt(x, ".2f") for x in e["active_by_position"][1:]))
    b = e["bands"]
    print(f"  q/k norm bands ({'rotary chunks, fastest first' if b['rotary'] else 'no rotary embedding: plain norms'})")
    cols = ("q_dormant", "q_active", "k_first", "k_rest", "logit_first_dormant", "logit_first_active", "logit_key_active")
    print(f"    {'band':>10} {'freq':>8} " + " ".join(f"{c:>12}" for c in cols))
    for i, label in enumerate(b["labels"]):
        print(f"    {label:>10} {b['frequencies'][i]:8.4f} " + " ".join(f"{_fmt(b[c][i], '.3f'):>12}" for c in cols))
    print("  triggers" + ("" if e["triggers"] else f": none on >= {scan.thresholds.min_count} active queries"))
    for t in e["triggers"]:
        rate = "" if t["active_rate"] is None else f", active {t['active_rate']:.2f} of the time"
        print(f"    {t['token']!r:>14} @{t['where']:<8} n={t['count']:<5} lift {t['lift']:.2f} (expected {t['expected']:.1f}{rate})")


def print_noop(check) -> None:
    print(f"\nno-op check (force onto the first token; clean loss {check.loss_clean:.3f} over {check.n_tokens} tokens)")
    print(f"{'head':>7} {'n_dorm':>7} {'n_act':>6} {'dloss dorm':>11} {'dloss act':>10} {'per-q dorm':>11} {'per-q act':>10}")
    for r in check.results:
        print(f"{f'{r.layer}.{r.head}':>7} {r.n_dormant:>7} {r.n_active:>6} {r.delta_loss_dormant:>11.5f} "
              f"{r.delta_loss_active:>10.5f} {_fmt(r.per_query_dormant, '.5f'):>11} {_fmt(r.per_query_active, '.5f'):>10}")


def cmd_heads(args) -> None:
    from sinkmech.dormant import scan_heads
    from sinkmech.hooks import parse_head
    from sinkmech.models import load_model
    from sinkmech.noop import noop_check
    from sinkmech.prompts import load_prompts

    if args.top < 1 or args.noop < 0 or args.noop_prompts < 1:
        raise ValueError("--top and --noop-prompts must be >= 1, --noop >= 0")
    model = load_model(args.model)
    target = parse_head(args.head, model) if args.head else None
    prompts = load_prompts(args.prompts)
    scan = scan_heads(model, prompts, bos=args.bos, max_tokens=args.max_tokens, batch_size=args.batch_size,
                      high=args.high, low=args.low, min_lift=args.min_lift, min_count=args.min_count)
    print_heads_table(scan, args.top)
    # with no if_else head, check the closest candidates: the evidence a reader needs
    check_heads = [target] if target else (scan.if_else_heads() or scan.ranked())[: args.noop]
    check = None
    if check_heads and (args.noop > 0 or target):
        check = noop_check(model, prompts[: args.noop_prompts], check_heads, bos=args.bos, max_tokens=args.max_tokens,
                           batch_size=args.batch_size, high=args.high, low=args.low)
    if target:
        print_head_profile(scan, *target)
    if check is not None:
        print_noop(check)
    if args.json:
        payload = json.loads(scan.to_json())
        if target:
            payload["profile"] = scan.profile(*target)
        payload["noop"] = json.loads(check.to_json()) if check is not None else None
        _write_json(args.json, payload)
    if args.png:
        from sinkmech.figures import heatmap_panels, save

        fig = heatmap_panels(
            [("dormant fraction", scan.dormant_fraction.numpy()), ("active fraction", scan.active_fraction.numpy()),
             ("if-else score", scan.if_else_score.numpy())],
            title=f"Dormant-head profile per head — {args.model} (bos={args.bos})",
            xlabel="head", ylabel="layer", cbar_label="fraction of queries / score", vmin=0.0, vmax=1.0)
        print(f"wrote {save(fig, args.png)}")
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
    from sinkmech.report import build_report

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
    from sinkmech.train import TrainConfig, train
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
# shared by patch / ablate / perturb ----------------------------------------


def _prompts_arg(args):
    """--prompts, cut to the first --n-prompts when given."""
    from sinkmech.prompts import load_prompts

    if args.n_prompts is None:
        return args.prompts
    if args.n_prompts < 1:
        raise ValueError(f"--n-prompts must be >= 1, got {args.n_prompts}")
    return load_prompts(args.prompts)[: args.n_prompts]


def _add_intervention_common(p) -> None:
    _add_common(p)
    p.add_argument("--n-prompts", type=int, default=None, help="use only the first N prompts")


def _add_metric(p) -> None:
    p.add_argument("--metric", choices=["kl", "logit_diff"], default="kl", help="kl: mean KL over content positions (default)")
    p.add_argument("--answers", nargs=2, metavar=("CORRECT", "INCORRECT"), default=None, help="tokens (strings) for --metric logit_diff")


def _answers(model, args):
    if args.answers is None:
        return None
    ids = []
    for text in args.answers:
        toks = model.tokenizer(text, add_special_tokens=False)["input_ids"] if model.tokenizer is not None else []
        if len(toks) != 1:
            raise ValueError(f"answer {text!r} must be exactly one token, got {len(toks)}")
        ids.append(toks[0])
    return tuple(ids)


def _limits(panels, signed: bool = False) -> dict:
    """One colour scale for all panels (heatmap_panels autoscales each otherwise)."""
    import numpy as np

    vals = np.concatenate([np.asarray(a, dtype=float).ravel() for _, a in panels])
    vals = vals[np.isfinite(vals)]
    hi = float(vals.max()) if vals.size else 1.0
    lo = float(vals.min()) if vals.size else 0.0
    return {"vmin": lo, "vmax": hi} if signed else {"vmin": 0.0, "vmax": max(hi, 1e-12)}


def _grid(values):
    """A 2-D array for a heatmap from a result tensor of 1-3 axes."""
    v = values.float()
    if v.ndim == 1:
        return v[:, None].numpy()
    if v.ndim == 3:
        return v.mean(-1).numpy()
    return v.numpy()


# sinkmech patch ------------------------------------------------------------

BOS_LABEL = {"prepend": "<bos> run", "none": "no-<bos> run"}


def add_patch_parser(sub) -> None:
    p = sub.add_parser("patch", help="activation patching between the <bos> and no-<bos> runs")
    _add_intervention_common(p)
    p.add_argument("--act", choices=["resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "z", "q", "k", "v"], default="resid_pre")
    p.add_argument("--by", choices=["layer_pos", "layer", "head", "head_pos"], default=None, help="default: layer_pos for residual activations, head for z/q/k/v")
    p.add_argument("--source", choices=["prepend", "none", "both"], default="both", help="run the activations come from (patched into the other)")
    p.add_argument("--layers", type=int, nargs="+", default=None)
    _add_metric(p)
    p.set_defaults(func=cmd_patch)


def cmd_patch(args) -> None:
    from sinkmech.figures import heatmap_panels, save
    from sinkmech.models import load_model
    from sinkmech.patching import HEAD_ACTS, bos_pair, patch

    model = load_model(args.model)
    by = args.by or ("head" if args.act in HEAD_ACTS else "layer_pos")
    pair = bos_pair(model, _prompts_arg(args), max_tokens=args.max_tokens)
    results = {}
    for source in _conditions(args.source):
        r = patch(model, pair, act=args.act, by=by, source=source, metric=args.metric,
                  answers=_answers(model, args), layers=args.layers, max_rows=max(args.batch_size, 1) * 8)
        results[source] = r
        print(f"{BOS_LABEL[source]} -> {BOS_LABEL[r.target]}: unpatched {r.metric} {r.baseline:.4f}, "
              f"patched min {float(r.values.min()):.4f} max {float(r.values.max()):.4f}")
    if args.json:
        _write_json(args.json, {
            "model": args.model, "act": args.act, "by": by, "metric": args.metric,
            "n_layers": model.cfg.n_layers, "n_heads": model.cfg.n_heads, "n_prompts": len(pair.with_bos),
            "max_tokens": args.max_tokens, "results": {k: json.loads(r.to_json()) for k, r in results.items()},
        })
    if args.png:
        first = next(iter(results.values()))
        panels = [(f"{BOS_LABEL[k]} into {BOS_LABEL[r.target]}", _grid(r.values)) for k, r in results.items()]
        xlabel = {"layer_pos": "content position", "layer": "", "head": "head", "head_pos": "head (mean over positions)"}[by]
        fig = heatmap_panels(panels, title=f"Patching {args.act} across <bos> / no-<bos> — {args.model}",
                             xlabel=xlabel, ylabel="layer", cbar_label=f"{first.metric} vs source run", **_limits(panels, args.metric != "kl"))
        print(f"wrote {save(fig, args.png)}")


# sinkmech ablate -----------------------------------------------------------


def add_ablate_parser(sub) -> None:
    p = sub.add_parser("ablate", help="per-head sink ablations over every (layer, head)")
    _add_intervention_common(p)
    p.add_argument("--mode", choices=["mask_first", "all_to_first", "zero", "mean"], required=True)
    p.add_argument("--bos", choices=["prepend", "none"], default="prepend")
    p.add_argument("--attribution", action="store_true", help="also estimate by attribution patching and print its correlation")
    p.add_argument("--top", type=int, default=10)
    _add_metric(p)
    p.set_defaults(func=cmd_ablate)


def cmd_ablate(args) -> None:
    from sinkmech.ablation import head_ablations
    from sinkmech.attribution import attribute_ablations, pearson
    from sinkmech.figures import heatmap_panels, save
    from sinkmech.models import load_model

    model = load_model(args.model)
    kw = dict(mode=args.mode, bos=args.bos, metric=args.metric, answers=_answers(model, args), max_tokens=args.max_tokens)
    prompts = _prompts_arg(args)
    exact = head_ablations(model, prompts, max_rows=max(args.batch_size, 1) * 8, **kw)
    print(f"{args.mode} ablation (bos={args.bos}), {exact.metric}; clean run {exact.baseline:.4f}")
    for layer, head, value in exact.top_heads(args.top):
        print(f"  L{layer}.H{head}  {value:.4f}")
    payload = {"model": args.model, **exact.to_dict()}
    panels = [("exact", exact.effects.numpy())]
    if args.attribution:
        approx = attribute_ablations(model, prompts, **kw)
        r = pearson(exact.effects, approx.effects)
        print(f"attribution patching: Pearson r = {r:.3f} with the exact effects")
        payload["attribution"] = {"effects": approx.effects.tolist(), "pearson": r}
        panels.append((f"attribution (r = {r:.2f})", approx.effects.numpy()))
    if args.json:
        _write_json(args.json, payload)
    if args.png:
        fig = heatmap_panels(panels, title=f"Per-head {args.mode} ablation (bos={args.bos}) — {args.model}",
                             xlabel="head", ylabel="layer", cbar_label=f"{exact.metric} vs clean run", **_limits(panels, args.metric != "kl"))
        print(f"wrote {save(fig, args.png)}")


# sinkmech perturb ----------------------------------------------------------


def add_perturb_parser(sub) -> None:
    p = sub.add_parser("perturb", help="how far a small input change spreads, with and without <bos>")
    _add_intervention_common(p)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--swap", nargs=2, metavar=("ORIGINAL", "REPLACEMENT"), help="swap a token string (same tokenized length)")
    g.add_argument("--noise", type=float, metavar="SCALE", help="add noise of this relative norm to one input embedding")
    p.add_argument("--position", type=int, default=None, help="content position (required with --noise)")
    p.add_argument("--threshold", type=float, default=0.1, help="relative change counted as reached")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_perturb)


def cmd_perturb(args) -> None:
    from sinkmech.figures import heatmap_panels, save
    from sinkmech.models import load_model
    from sinkmech.perturb import EmbeddingNoise, TokenSwap, perturbation_spread

    if args.noise is not None and args.position is None:
        raise ValueError("--noise needs --position")
    model = load_model(args.model)
    pert = TokenSwap(*args.swap, position=args.position) if args.swap else EmbeddingNoise(args.noise, args.position, args.seed)
    r = perturbation_spread(model, _prompts_arg(args), perturbation=pert, max_tokens=args.max_tokens,
                            threshold=args.threshold, batch_size=args.batch_size)
    s = r.per_layer()
    print(f"{r.kind}: over later positions, mean relative change / fraction > {args.threshold}")
    print(f"{'layer':>6} {'<bos>':>16} {'no <bos>':>16}")
    for l in range(s["mean_change"].shape[1]):
        print(f"{l:>6} " + " ".join(f"{float(s['mean_change'][c, l]):>7.3f} / {float(s['spread_fraction'][c, l]):>5.2f}" for c in range(2)))
    ent = r.entropy.mean((1, 2))
    print(f"mean attention entropy: with <bos> {float(ent[0]):.3f} nats, without {float(ent[1]):.3f} nats")
    if args.json:
        _write_json(args.json, {"model": args.model, **r.to_dict()})
    if args.png:
        import numpy as np

        mean = r.mean_change()
        panels = [(f"with <bos>" if c == "prepend" else "without <bos>", np.nan_to_num(mean[i].numpy())) for i, c in enumerate(r.conditions)]
        fig = heatmap_panels(panels, title=f"Relative residual change, {r.kind} — {args.model}", xlabel="content position",
                             ylabel="layer (0 = embeddings)", cbar_label="||h' - h|| / ||h||", **_limits(panels))
        print(f"wrote {save(fig, args.png)}")


# entry point -----------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sinkmech", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_sinks_parser(sub)
    add_heads_parser(sub)
    add_report_parser(sub)
    add_train_parser(sub)
    add_patch_parser(sub)
    add_ablate_parser(sub)
    add_perturb_parser(sub)
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
