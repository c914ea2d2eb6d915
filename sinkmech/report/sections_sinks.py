"""Report sections on the sinks themselves: sink scores and sink rates per head
and layer (Gu et al. 2025, as used by Barbero et al. 2025), first-token value
and residual norms (Barbero et al. 2025, Sec. 3: the sink as a no-op), and
circuitsvis views of chosen heads.
"""

from __future__ import annotations

import html

from sinkmech import render
from sinkmech.plots.core import layer_lines
from sinkmech.plots.heads import head_norm_bars
from sinkmech.plots.sinks import sink_heatmap, sink_rate_lines
from sinkmech.measures.attention import head_attention
from sinkmech.prompts import CONDITION_LABELS, CONDITIONS, DEFAULT_EPS
from sinkmech.report.context import ReportContext, Section, figure_html, head_label, table_html
from sinkmech.sinks import paired_contrasts
from sinkmech.stats import effect_text


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
        + "<p>Without minus with &lt;bos&gt;, paired by prompt (95 % bootstrap intervals over prompts): "
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
    kw = dict(max_tokens=ctx.view_tokens, bos_token_id=ctx.bos_token_id, token_str=ctx.token_str)
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
