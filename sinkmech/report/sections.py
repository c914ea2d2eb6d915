"""The report's default page: each section computes its numbers, draws its
figures and returns a `Section` (HTML, summary.json entry, circuitsvis views),
in the page's order: the sinks themselves (sink scores and rates per head and
layer, Gu et al. 2025 as used by Barbero et al. 2025; first-token value and
residual norms, the sink as a no-op; circuitsvis views of chosen heads); what
intervening does (the perturbation spread, Barbero et al. 2025 Fig. 2; dormant
heads, Sec. 3.2 and Guo et al. 2024; sink ablation and patching); and how the
sink works past the first-token score (`sinkmech.report.beyond`). `SECTIONS`
is the page's order.
"""

from __future__ import annotations

import html
from collections.abc import Callable

import numpy as np
import torch

from sinkmech import render
from sinkmech.dormant.discover import discover_heads
from sinkmech.dormant.labels import mode_meaning
from sinkmech.interventions.ablation import head_ablations
from sinkmech.interventions.patching import bos_pair, patch_resid_pre
from sinkmech.interventions.recipes import SPREAD_THRESHOLD, swap_then_spread
from sinkmech.measures.attention import head_attention
from sinkmech.measures.sinks import paired_contrasts
from sinkmech.plots.core import layer_lines
from sinkmech.plots.heads import band_heatmaps, head_norm_bars, mode_sweep
from sinkmech.plots.patching import patching_heatmaps
from sinkmech.plots.perturb import spread_heatmaps
from sinkmech.plots.sinks import sink_heatmap, sink_rate_lines
from sinkmech.prompts import CONDITION_LABELS, CONDITIONS, DEFAULT_EPS
from sinkmech.report.beyond import BEYOND
from sinkmech.report.context import ReportContext, Section, figure_html, head_label, table_html
from sinkmech.stats import effect_text, interval_description
from sinkmech.options import QUIET


def sink_section(ctx: ReportContext) -> Section:
    """Sink scores and sink rates per head, with and without `<bos>`."""
    res = ctx.sinks()
    name = ctx.model.cfg.model_name
    figs = ctx.figure("sink_heatmap", lambda p: sink_heatmap(res, p, model_name=name))
    per_layer_rate = {c: r.per_layer_sink_rate(DEFAULT_EPS[0]).tolist() for c, r in res.items()}
    rate_figs = ctx.figure("sink_rate_per_layer",
                           lambda p: sink_rate_lines(per_layer_rate, p, eps=DEFAULT_EPS[0], model_name=name))
    ci = {c: {e: res[c].sink_rate_ci(e) for e in DEFAULT_EPS} for c in CONDITIONS}
    rows = [[f"sink rate (alpha_0 > {e:g}), % [95 % interval]"]
            + [f"{ci[c][e][0]:.1f} [{ci[c][e][1]:.1f}, {ci[c][e][2]:.1f}]" for c in CONDITIONS] for e in DEFAULT_EPS]
    contrasts = paired_contrasts(res["prepend"], res["none"], DEFAULT_EPS)
    intervals = interval_description(res["prepend"].documents, res["prepend"].n_prompts)
    gaps = [f"eps {e}: {effect_text(v[0], v[1:], fmt='+.1f', unit=' points')}" for e, v in contrasts["sink_rate_gap"].items()]
    if "loss_gap" in contrasts:
        g = contrasts["loss_gap"]
        gaps.append(f"loss {effect_text(g[0], g[1:], fmt='+.3f', unit=' nats')}")
    rows.append(["mean alpha_0 over heads"] + [float(res[c].scores.mean()) for c in CONDITIONS])
    rows.append(["alpha_0 of uniform attention"] + [res[c].uniform_score() for c in CONDITIONS])
    learned = all(res[c].learned_sink_scores is not None for c in CONDITIONS)  # gpt-oss: docs/learned_sinks.md
    if learned:
        rows.append(["mean learned-sink mass over heads (the softmax's share on the learned sink logit)"]
                    + [float(res[c].learned_sink_scores.mean()) for c in CONDITIONS])
    top = {c: [[head_label(l, h), s] for l, h, s in res[c].top_heads(5)] for c in CONDITIONS}
    body = (
        f"<p>{res['prepend'].n_prompts} prompts, {res['prepend'].token_count()}. alpha_0 of a head is "
        "its mean attention on position 0 over all queries; the sink rate is the % of (prompt, head) pairs "
        "with alpha_0 above epsilon.</p>"
        + table_html(["", *(CONDITION_LABELS[c] for c in CONDITIONS)], rows)
        + f"<p>Without minus with &lt;bos&gt;, paired by prompt ({html.escape(intervals)}): "
        + html.escape("; ".join(gaps)) + ".</p>"
        + "<p>Strongest sink heads (mean alpha_0): " + html.escape("; ".join(
            f"{CONDITION_LABELS[c]}: " + ", ".join(f"{n} ({s:.2f})" for n, s in top[c]) for c in CONDITIONS))
        + "</p>"
        + figure_html(figs, "Mean first-token score per head", ctx.out)
        + figure_html(rate_figs, f"Per-layer sink rate at epsilon {DEFAULT_EPS[0]:g}", ctx.out)
    )
    summary = {
        "n_prompts": res["prepend"].n_prompts,
        "max_tokens": res["prepend"].max_tokens,
        "max_tokens_requested": ctx.max_tokens,
        "context_limit": res["prepend"].context_limit,
        "content_lengths": res["prepend"].content_lengths.tolist(),
        "sink_rate": {c: {f"{e:g}": res[c].sink_rate(e) for e in DEFAULT_EPS} for c in CONDITIONS},
        "sink_rate_ci": {c: {f"{e:g}": ci[c][e] for e in DEFAULT_EPS} for c in CONDITIONS},
        "contrasts": contrasts,
        "sink_rate_per_layer": {f"{DEFAULT_EPS[0]:g}": per_layer_rate},
        "per_layer_score": {c: res[c].per_layer().tolist() for c in CONDITIONS},
        "uniform_score": {c: res[c].uniform_score() for c in CONDITIONS},
        "top_heads": top,
        **({"learned_sink_per_layer": {c: res[c].learned_sink_scores.mean((0, 2)).tolist() for c in CONDITIONS}}
           if learned else {}),
    }
    return Section("sinks", "Sink scores with and without <bos>", body, tuple(figs + rate_figs), summary)


def norms_section(ctx: ReportContext) -> Section:
    """First-token value norms and residual norms against the other positions."""
    res = ctx.sinks()
    resid = {}
    ratio = {}
    for c, r in res.items():
        label = CONDITION_LABELS[c]
        resid[f"position 0, {label}"] = r.resid_norm_first.mean(0).tolist()
        resid[f"other positions, {label}"] = r.resid_norm_rest.mean(0).tolist()
        ratio[c] = r.value_norm_ratio().tolist()
    resid_figs = ctx.figure("resid_norm", lambda p: layer_lines(
        resid, p, title="Residual-stream norm after each layer", ylabel="mean ||resid||", logy=True))
    ratio_figs = ctx.figure("value_norm_ratio", lambda p: layer_lines(
        ratio, p, title="Value norm at position 0 / elsewhere", ylabel="ratio (mean over heads)", logy=True))
    chosen = ctx.chosen_heads()
    heads = [hd for group in chosen.values() for hd in group]
    r = res["prepend"]
    first = [float(r.value_norm_first[:, l, h].mean()) for l, h in heads]
    rest = [float(r.value_norm_rest[:, l, h].mean()) for l, h in heads]
    bar_figs = ctx.figure("head_value_norms", lambda p: head_norm_bars(
        [head_label(*hd) for hd in heads], {"first token (<bos>)": first, "other tokens": rest}, p,
        title="Value-vector norm of the chosen heads (with <bos>)"))
    summary = {
        "value_norm_ratio_per_layer": ratio,
        "resid_norm_first": {c: res[c].resid_norm_first.mean(0).tolist() for c in CONDITIONS},
        "resid_norm_rest": {c: res[c].resid_norm_rest.mean(0).tolist() for c in CONDITIONS},
        "max_resid_ratio_with_bos": float(r.resid_norm_ratio().max()),
        "max_resid_ratio": {c: float(res[c].resid_norm_ratio().max()) for c in CONDITIONS},
        "max_resid_ratio_layer": {c: int(res[c].resid_norm_ratio().argmax()) for c in CONDITIONS},
        "head_value_norms": {head_label(*hd): {"first": f, "rest": s} for hd, f, s in zip(heads, first, rest)},
    }
    body = (
        f"<p>With &lt;bos&gt;, the residual norm at position 0 reaches {summary['max_resid_ratio_with_bos']:.1f}x "
        "that of the other positions (massive activation), while its value vectors are small: attending to it "
        "writes little (the sink as a no-op).</p>"
        + figure_html(resid_figs, "Residual norm per layer, position 0 vs the rest", ctx.out)
        + figure_html(ratio_figs, "First-token value norm relative to the other positions", ctx.out)
        + figure_html(bar_figs, "Value norms of the heads shown below", ctx.out)
    )
    return Section("norms", "First-token norms", body, tuple(resid_figs + ratio_figs + bar_figs), summary)


def head_views_section(ctx: ReportContext) -> Section:
    """circuitsvis views of the top sink heads and the least sink-like heads."""
    prompts = ctx.prompt_list()[: max(1, ctx.view_prompts)]
    kw = dict(max_tokens=ctx.view_tokens, token_str=ctx.token_str, options=ctx.options)
    views, summary = [], {}
    for group, heads in ctx.chosen_heads().items():
        atts = [head_attention(ctx.model, p, heads, **kw) for p in prompts]
        views += [render.attention_view(atts[0]), render.first_token_view(atts[0])]
        summary[group] = {
            head_label(*hd): {c: float(ctx.sinks()[c].mean_scores()[hd]) for c in CONDITIONS} for hd in heads
        }
        if group == "most prompt-dependent heads":  # where a head wakes up: its trigger candidates
            views += [render.activity_view(atts, hd) for hd in heads]
    body = (
        f"<p>Three groups of {ctx.n_heads} heads, ranked by alpha_0 with &lt;bos&gt;: the strongest sinks, the "
        "least sink-like, and the most prompt-dependent (largest spread of alpha_0 across prompts: candidates "
        f"for dormant/active switching). Views use the first prompt cut to {ctx.view_tokens} tokens; the "
        f"activity views use {len(prompts)} prompts.</p>"
    )
    return Section("head_views", "Heads up close", body, (), summary, tuple(views))


ABLATION_ROWS = 512  # rows per batched forward of the ablation sweep: 2.7x faster than 128 on SmolLM2, 4 x 16 tokens


def spread_section(ctx: ReportContext) -> Section:
    """One token swapped at an early position, with and without `<bos>`: how far the
    change spreads over layers and later positions, and how smooth attention is."""
    swapped = swap_then_spread(ctx.model, ctx.first(ctx.spread_prompts), max_tokens=ctx.max_tokens,
                               options=ctx.options.replace(progress=False))
    res, pos, swaps, rows = swapped.spread, swapped.position, swapped.swaps, swapped.rows
    change, entropy, norm_entropy = res.change, res.entropy, res.normalized_entropy
    news = [int(s.replacement[0]) for s in swaps]
    per, mean = res.per_layer(), res.mean_change()
    figs = ctx.figure("perturbation_spread", lambda p: spread_heatmaps(
        {c: mean[i].numpy() for i, c in enumerate(CONDITIONS)}, p, perturbed_pos=pos,
        title=f"Relative residual change after a token swap at position {pos} (mean of {len(rows)} prompts)"))
    line_figs = ctx.figure("perturbation_per_layer", lambda p: layer_lines(
        {c: per["mean_change"][i].numpy() for i, c in enumerate(CONDITIONS)}, p,
        title="Change at later positions (layer 0 = embeddings)", ylabel="mean ||h'-h|| / ||h||"))
    ent = {c: entropy[i].mean(-1).numpy() for i, c in enumerate(CONDITIONS)}
    norm_ent = {c: norm_entropy[i].nanmean(-1).numpy() for i, c in enumerate(CONDITIONS)}
    ent_figs = ctx.figure("attention_entropy", lambda p: layer_lines(
        norm_ent, p, title="Normalised attention entropy of content queries",
        ylabel="H / log(n_keys) (1 = uniform)"))
    last = {c: float(per["mean_change"][i, -1]) for i, c in enumerate(CONDITIONS)}
    frac = {c: float(per["spread_fraction"][i, -1]) for i, c in enumerate(CONDITIONS)}
    mean_ent = {c: float(entropy[i].mean()) for i, c in enumerate(CONDITIONS)}
    mean_norm = {c: float(norm_entropy[i].nanmean()) for i, c in enumerate(CONDITIONS)}
    swap_text = [[ctx.token_text(r[pos]), ctx.token_text(n)] for r, n in zip(rows, news)]
    later = res.later()
    summary = {
        "n_prompts": len(rows), "max_tokens": max(map(len, rows)), "position": pos, "threshold": SPREAD_THRESHOLD, "swaps": swap_text,
        "swap_ids": [[r[pos], n] for r, n in zip(rows, news)],
        "last_layer_mean_change": last, "last_layer_spread_fraction": frac, "mean_entropy": mean_ent,
        "mean_normalized_entropy": mean_norm, "normalized_entropy_per_layer": {c: v.tolist() for c, v in norm_ent.items()},
        "per_layer": {c: {k: v[i].tolist() for k, v in per.items()} for i, c in enumerate(CONDITIONS)},
        "entropy_per_layer": {c: v.tolist() for c, v in ent.items()},
        "last_layer_change_per_prompt": {c: [float(change[i, p, -1][later[p]].mean()) for p in range(len(rows))]
                                         for i, c in enumerate(CONDITIONS)},
    }
    rows_html = [["mean change at later positions, last layer"] + [last[c] for c in CONDITIONS],
                 [f"later positions changed by > {SPREAD_THRESHOLD:g}, last layer"] + [f"{100 * frac[c]:.0f}%" for c in CONDITIONS],
                 ["mean normalised attention entropy H / log(n_keys)"] + [mean_norm[c] for c in CONDITIONS],
                 ["mean raw attention entropy (nats; the <bos> run has one more key)"] + [mean_ent[c] for c in CONDITIONS]]
    body = (
        f"<p>{len(rows)} prompts of up to {ctx.max_tokens} content tokens; in each, the token at content position {pos} "
        "is swapped for another token of the corpus (one token for one, so every other position keeps its place) and "
        "the relative change of the residual stream ||h'&minus;h|| / ||h|| is measured at every layer and position, "
        "with and without &lt;bos&gt; (Barbero et al. 2025, Fig. 2). Swaps: "
        + html.escape(", ".join(f"{a!r} -> {b!r}" for a, b in swap_text)) + ".</p>"
        + table_html(["", *(CONDITION_LABELS[c] for c in CONDITIONS)], rows_html)
        + f"<p>Here the last-layer change without &lt;bos&gt; is {last['none'] / max(last['prepend'], 1e-12):.2f}x the "
        f"change with it, and attention is {'smoother' if mean_norm['none'] > mean_norm['prepend'] else 'sharper'} without "
        f"&lt;bos&gt; (normalised entropy {mean_norm['none']:.3f} vs {mean_norm['prepend']:.3f}; the paper reports wider "
        "spread and smoother maps without the sink). Entropy is compared normalised, H / log(n_keys) per query "
        "(queries with one key left out): the &lt;bos&gt; run has one more key per query, which alone raises the raw "
        f"entropy of a uniform head (raw: {mean_ent['none']:.3f} vs {mean_ent['prepend']:.3f} nats).</p>"
        + figure_html(figs, "Relative change of the residual stream, layer x content position", ctx.out)
        + figure_html(line_figs, "Mean change over the positions after the swap", ctx.out)
        + figure_html(ent_figs, "Normalised attention entropy H / log(n_keys) per layer (smoother maps = higher; "
                      "1 = uniform)", ctx.out)
    )
    return Section("perturbation", "Perturbation spread with and without <bos>", body,
                   tuple(figs + line_figs + ent_figs), summary)


def _ratio(a, b) -> float | None:
    return a / b if a is not None and b else None


def _triggers(entry: dict, n: int = 3) -> str:
    return ", ".join(f"{t['token']!r}@{t['where']} x{t['lift']:.1f} ({t['n_prompts']}p)"
                     for t in entry["triggers"][:n]) or "none"


def _validation(t: dict | None) -> str:
    if t is None:
        return "no trigger"
    f = lambda x: "n/a" if x is None else f"x{x:.1f}"  # noqa: E731
    return f"{f(t['lift'])} / {f(t['validated_lift'])} ({'validated' if t['validated'] else 'not validated'})"


def dormant_section(ctx: ReportContext) -> Section:
    """Dormant (if-else) heads: labels, the best candidates' norms, bands and no-op check."""
    model = ctx.model
    items, n_scan, n_noop = ctx.scan_split()  # the no-op prompts are held out from the scan
    disc = discover_heads(model, items, scan_prompts=n_scan, noop_prompts=n_noop,
                          n_candidates=ctx.n_heads, max_heads=ctx.noop_max_heads, max_tokens=ctx.max_tokens,
                          memo=ctx.discoveries(), options=ctx.options, scan_sums=ctx.ridden("scan"))
    scan, noop = disc.scan, disc.noop
    found = scan.if_else_heads()
    ranked = found or scan.ranked()
    shown = ranked[: max(6, ctx.n_heads)]
    cands = ranked[: ctx.n_heads]
    entries = {head_label(*hd): scan.head_summary(*hd) for hd in shown}
    counts = scan.mode_counts()
    table = table_html(
        ["head", "mode", "if-else score", "dormant frac.", "active frac.", "||v|| first token", "||v|| read when active",
         "output norm dormant / active", "top triggers (token@where x lift, prompts)",
         "chosen trigger: lift on selection / held-out prompts"],
        [[name, e["mode"], e["if_else_score"], e["dormant_fraction"], e["active_fraction"], e["value_norm_first"],
          e["value_norm_active"], _ratio(e["output_norm_dormant"], e["output_norm_active"]), _triggers(e),
          _validation(e["trigger"])]
         for name, e in entries.items()])
    th = scan.thresholds
    noop_results = noop.results if noop is not None else ()
    def cell(e: dict | None) -> str:  # per-query effect; a primary test says whether it survives Holm over its family
        if e is None:
            return "n/a"
        if e.get("p_adjusted") is None:
            return effect_text(e["value"], e["ci"]) + " (secondary)"
        return effect_text(e["value"], e["ci"]) + (" (primary: holds after Holm)" if e["detectable_adjusted"]
                                                   else " (primary: not after Holm)")

    checks = [f"{i}_{m}" for i in ("move_to_first", "zero_out", "mean_ablate") for m in ("dormant", "active")]
    noop_table = table_html(
        ["head", "mode", "dormant queries", "active queries",
         *(f"active minus matched control ({i.replace('_', ' ')})" for i in ("move_to_first", "zero_out", "mean_ablate")),
         *(c.replace("_", " ") for c in checks), "active queries look at"],
        [[head_label(r.layer, r.head), scan.mode(r.layer, r.head), r.n_dormant, r.n_active,
          *(cell((r.checks[f"{i}_active"]["matched_control"] or {}).get("difference"))
            for i in ("move_to_first", "zero_out", "mean_ablate")),
          *(cell(r.checks[c]["per_query"]) for c in checks),
          ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in (r.active_looks or {}).items() if k != "n_queries")
          or "n/a"]
         for r in noop_results])
    sweep_figs = ctx.figure("dormant_sweep", lambda p: mode_sweep(
        scan.sweep, p, title=f"Head modes at other (high, low) cuts ({scan.n_prompts} prompts)")) if scan.sweep else []
    sweep_table = table_html(["high", "low", "sink", "active", "mixed", "if_else", "if_else heads"],
                             [[r["high"], r["low"], *(r["mode_counts"][m] for m in ("sink", "active", "mixed", "if_else")),
                               ", ".join(r["if_else_heads"]) or "-"] for r in scan.sweep or ()])
    names = [head_label(*hd) for hd in cands]
    get = lambda t: [float(t[hd]) for hd in cands]  # noqa: E731
    bar_figs = ctx.figure("dormant_norms", lambda p: head_norm_bars(
        names, {"first token (<bos>)": get(scan.value_norm_first), "read by active queries": get(scan.value_norm_active)}, p,
        output_norms={"dormant queries": get(scan.output_norm_dormant), "active queries": get(scan.output_norm_active)},
        title="Value and output norms of the dormant-head candidates"))
    best = cands[0]
    b = {k: v[best] for k, v in scan.bands.items()}
    band_figs = ctx.figure("dormant_bands", lambda p: band_heatmaps(
        torch.stack([b["q_dormant"], b["q_active"]]).numpy(), torch.stack([b["k_first"], b["k_rest"]]).numpy(), p,
        heads=["q: dormant, k: position 0", "q: active, k: other positions"],
        title=f"{head_label(*best)}: query/key norm per rotary chunk"))
    verdict = (f"{len(found)} heads pass the if-else rule; the table shows the best." if found else
               "No head passes the if-else rule on these prompts: the table shows the closest candidates "
               "(ranked by how much of the rule they fulfil), not confirmed if-else heads.")
    summary = {
        "n_prompts": scan.n_prompts, "max_tokens": scan.max_tokens, "n_queries": scan.n_queries, "mode_counts": counts,
        "if_else_heads": [head_label(*hd) for hd in found], "candidates": entries,
        "sweep": list(scan.sweep or ()),
        "trigger_selected_on": scan.trigger_split()[0], "trigger_validated_on": scan.trigger_split()[1],
        "noop": None if noop is None else {
            "n_prompts": len(disc.noop_prompts), "prompt_indices": list(disc.noop_prompts),
            "loss_clean": noop.loss_clean, "ci_level": noop.ci_level,
            "heads_covered": [head_label(*hd) for hd in disc.noop_covers], "seconds": round(disc.noop_seconds, 2),
            "heads": {head_label(r.layer, r.head): r.to_dict() for r in noop.results}},
    }
    body = (
        "<p>The labels hang on the cut, so the threshold sweep comes first: every head relabelled at other (high, low) "
        "cuts, every other threshold as below, so a reader sees whether a label survives another cut.</p>" + sweep_table
        + (figure_html(sweep_figs, "Mode counts over the (high, low) cuts", ctx.out) if sweep_figs else "")
        + f"<p>Every head profiled over {scan.n_prompts} prompts x {ctx.max_tokens} tokens with &lt;bos&gt; "
        f"({scan.n_queries} queries). A query is dormant when its attention on position 0 is >= {th.high:g}, active "
        f"at <= {th.low:g}. Labels: " + html.escape(", ".join(f"{v} {k}" for k, v in counts.items())) + f". {verdict}</p>"
        + table + f"<p>Triggers are chosen on the even-numbered prompts ({len(scan.trigger_split()[0])}) and judged on the "
        f"odd-numbered ones ({len(scan.trigger_split()[1])}): the if-else label needs the chosen trigger to reach lift "
        f"{th.min_lift:g} there on >= {th.min_count} active queries in >= {th.min_prompts} prompts, and its excess over "
        "each prompt's own activity must pass a one-sided t test with the prompt as the unit at "
        f"p <= {th.alpha:g} / {scan.n_layers * scan.n_heads} heads (last column). What each label means: "
        + html.escape("; ".join(f"{k}: {v}" for k, v in mode_meaning(th).items())) + ".</p>"
        + (f"<p>No-op check on {len(disc.noop_prompts)} prompts held out from the scan (prompts "
           f"{disc.noop_prompts[0]}-{disc.noop_prompts[-1]}; the scan used 0-{disc.scan_prompts[-1]}), "
           + (f"for every if-else head and the {ctx.n_heads} closest candidates besides. "
              if len(noop_results) >= len(disc.noop_covers) else
              f"for the first {len(noop_results)} of the {len(disc.noop_covers)} heads it covers (every if-else head, "
              f"then the {ctx.n_heads} closest candidates): a first look (--noop-max-heads all checks every one). ")
           + "Three interventions, each on the head's dormant and "
           "on its active queries: <i>move to first</i> puts all of its attention on the first token (on dormant "
           "queries, already >= high there, it can only change a little), <i>zero out</i> (Guo et al.) sets its "
           "output to 0, <i>mean ablate</i> sets it to its mean output over these prompts (zero is off the "
           "distribution later layers saw). Next-token loss change in nats per intervened query, with a "
           f"{100 * noop.ci_level:.0f}% {html.escape(noop.interval)}; an interval that holds zero reads "
           f"\"no detectable effect\". Holm's correction runs over the primary family only, stated before the numbers "
           f"({noop.n_intervals} tests: for each if-else head and intervention, the cost on its active queries minus "
           "that on as many matched controls); every other interval is secondary and unadjusted "
           f"(clean loss {noop.loss_clean:.3f}). The matched "
           "control zeroes as many of the head's dormant queries at the nearest positions; the last column is where "
           "the active queries' attention goes. Totals per mode are in summary.json.</p>" + noop_table
           if noop is not None else "<p>No no-op check: none asked for (no-op prompts 0, the default: "
                                    "<code>--noop-prompts 8</code> adds a first look, <code>sinkmech heads</code> runs "
                                    "the check), or too few prompts to hold some out from the scan.</p>")
        + figure_html(bar_figs, "Value norms and head-output norms of the candidates "
                      "(no bar: the head never was in that mode)", ctx.out)
        + figure_html(band_figs, f"Norm bands of {head_label(*best)}", ctx.out)
    )
    return Section("dormant", "Dormant (if-else) heads", body, tuple(bar_figs + band_figs + sweep_figs), summary)


def ablation_section(ctx: ReportContext) -> Section:
    """Every head's sink switched off alone (mask_first), and the residual stream of
    the `<bos>` run patched into the no-`<bos>` run, layer by layer."""
    model = ctx.model
    prompts, T = ctx.first(ctx.ablation_prompts), min(ctx.ablation_tokens, ctx.max_tokens)
    abl = head_ablations(model, prompts, mode="mask_first", bos="prepend", max_tokens=T,
                         options=ctx.options.replace(batch_size=ABLATION_ROWS))
    pair = bos_pair(model, prompts, max_tokens=T, bos_token_id=ctx.options.bos_token_id)
    # Content positions 1..n-1 only: content position 0 is the no-<bos> run's own sink; overwriting it
    # with the <bos> run's (ordinary) first content token would measure destroying that sink.
    pr = patch_resid_pre(model, pair, per_position=False, source="prepend", options=QUIET,
                         positions=range(1, pair.n_content))
    heat = ctx.figure("ablation_mask_first", lambda p: patching_heatmaps(
        {"mask_first, with <bos>": abl.effects.numpy()}, p, diverging=False, cbar_label="KL(clean || ablated), nats",
        title="Sink of one head masked: effect on the output"))
    n_layers = len(pr.layers)
    curve = ctx.figure("patch_resid_pre", lambda p: layer_lines(
        {"resid_pre patched at this layer": pr.values.clamp(min=1e-6).numpy(),
         "unpatched no-<bos> run": np.full(n_layers, max(pr.baseline, 1e-6))}, p, logy=True,
        title="<bos> run's resid_pre patched into the no-<bos> run\n(content positions 1..n-1; its position 0 kept)",
        ylabel="KL to the <bos> run (nats)"))
    top = abl.top_heads(5)
    restored = pr.restored()
    summary = {
        "n_prompts": abl.n_prompts, "max_tokens": pair.n_content, "mode": abl.mode, "metric": abl.metric,
        "effects": abl.effects.tolist(), "top_heads": [[head_label(l, h), e] for l, h, e in top],
        "patch_resid_pre": {"baseline": pr.baseline, "values": pr.values.tolist(), "restored": restored.tolist(),
                            "patched_content_positions": [1, pair.n_content - 1],
                            "definition": "resid_pre of the <bos> run at content positions 1..n-1 written into the "
                                          "no-<bos> run at the same content positions; the no-<bos> run keeps its own "
                                          "position 0 (its sink); KL over content positions 1..n-1"},
    }
    best = int(torch.nan_to_num(restored, nan=-1e9).argmax())
    body = (
        f"<p>{abl.n_prompts} prompts x {T} tokens, with &lt;bos&gt;. Each head in turn cannot attend to position 0 "
        "(mask_first: its row renormalises over the other keys), one head at a time; the effect is the mean KL "
        "between the clean and ablated next-token distributions over content positions. Largest effects: "
        + html.escape(", ".join(f"{head_label(l, h)} ({e:.3g})" for l, h, e in top)) + ".</p>"
        + figure_html(heat, "mask_first ablation effect per head", ctx.out)
        + f"<p>Removing &lt;bos&gt; moves the output at content positions 1..{pair.n_content - 1} by KL "
        f"{pr.baseline:.3g} nats. Patching the &lt;bos&gt; run's residual stream at content positions "
        f"1..{pair.n_content - 1} into the no-&lt;bos&gt; run before layer l closes the fraction "
        f"1 &minus; KL/{pr.baseline:.3g} of that gap; best at layer {pr.layers[best]}: "
        f"{float(restored[best]):.2f}. Content position 0 is not patched: without &lt;bos&gt; it is that run's own "
        "sink, and overwriting it with the &lt;bos&gt; run's ordinary first content token would measure the damage "
        "of destroying the sink, not the restoration. Negative values: the patch makes the no-&lt;bos&gt; run "
        "further from the &lt;bos&gt; run.</p>"
        + figure_html(curve, f"Restoration curve: resid_pre of content positions 1..{pair.n_content - 1} patched "
                      "per layer (the no-<bos> run keeps its position 0, its sink)", ctx.out)
    )
    return Section("ablation", "Sink ablation and patching", body, tuple(heat + curve), summary)


SECTIONS: list[Callable[[ReportContext], Section]] = [
    sink_section, norms_section, head_views_section, spread_section, dormant_section, ablation_section,
    *BEYOND,
]
