"""The report's sections beyond the paper, after its interventions: how the
sink works past the first-token score (secondary sinks at any key, Gu et al.
2025 Sec. 3; massive activations, Sun et al. 2024; value-weighted attention,
Kobayashi et al. 2020; sliding windows with and without the sink, Xiao et al.
2024; sinks against the evaluation length). They run at sizes quick enough for
the default report (`ReportContext.beyond_prompts`, `stream_*`, `length_*`:
together about a minute).
"""

from __future__ import annotations

import html
from collections.abc import Callable

from sinkmech.context.length import long_prompts, sinks_vs_length
from sinkmech.context.stream import long_tokens, stream_perplexity
from sinkmech.measures.key_sinks import key_sink_scores
from sinkmech.measures.massive import RESETS, massive_dims, reset_massive_dims
from sinkmech.measures.sinks import format_eps
from sinkmech.measures.value_weighted import value_weighted_first
from sinkmech.plots import mechanisms
from sinkmech.prompts import CONDITION_LABELS, CONDITIONS, DEFAULT_EPS, TokenBatch, tokenize
from sinkmech.report.context import ReportContext, Section, figure_html, head_label, table_html


STREAM_KEEP = (0, 1, 4)  # first keys kept beside the window: none, the sink, StreamingLLM's 4
MAX_LISTED = 8  # flagged heads listed on the page
LENGTH_TOP_HEADS = 1  # strongest sink heads whose mask_first cost is measured at each length


def _batch(ctx: ReportContext, bos: str) -> TokenBatch:
    """The first `beyond_prompts` prompts, `max_tokens` content tokens each."""
    return tokenize(ctx.model, ctx.first(ctx.beyond_prompts), bos=bos, max_tokens=ctx.max_tokens,
                    bos_token_id=ctx.options.bos_token_id)


def key_sinks_section(ctx: ReportContext) -> Section:
    """Heads whose strongest key (alpha_k averaged over prompts) is not position 0."""
    name = ctx.model.cfg.model_name
    res = {c: key_sink_scores(ctx.model, _batch(ctx, c), options=ctx.options, reader=ctx.ridden("key_sinks", c))
           for c in CONDITIONS}
    figs = ctx.figure("strongest_key", lambda p: mechanisms.strongest_key_heatmap(res, p, model_name=name))
    summary: dict = {"n_prompts": res["prepend"].n_prompts, "min_queries": res["prepend"].min_queries}
    rows = []
    for c, r in res.items():
        flagged = []
        for l, h, pos in r.flagged_heads():
            top = [{"position": int(r.top_position[l, h, i]), "token": r.top_token[l][h][i],
                    "score": float(r.top_scores[l, h, i])} for i in range(min(3, r.top_scores.shape[-1]))
                   if float(r.top_scores[l, h, i]) > float("-inf")]  # fewer scored keys than top_k
            flagged.append({"head": head_label(l, h), "position": pos, "alpha": float(r.by_position[l, h, pos]),
                            "alpha_0": float(r.by_position[l, h, 0]), "top_keys": top})
        flagged.sort(key=lambda f: f["alpha"] - f["alpha_0"], reverse=True)
        summary[c] = {
            "n_flagged": len(flagged),
            "flagged": flagged,
            "strongest_position": r.strongest_position.tolist(),
            "off_first_rate": float(r.off_first_rate.mean()),
            # against each key's uniform share (query t gives each key 1/(t+1)): see sinkmech.measures.key_sinks
            "min_excess": r.min_excess,
            "n_relative_flagged": len(r.relative_flagged_heads()),
            "relative_flagged": [{"head": head_label(l, h), "position": pos,
                                  "excess": float(r.excess_by_position[l, h, pos]),
                                  "excess_0": float(r.excess_by_position[l, h, 0])}
                                 for l, h, pos in r.relative_flagged_heads()],
            "off_first_rate_relative": float(r.off_first_rate_relative.mean()),
        }
        rows += [[CONDITION_LABELS[c], f["head"], f["position"], f["alpha"], f["alpha_0"],
                  ", ".join(f"{t['token']!r} @{t['position']}" for t in f["top_keys"])] for f in flagged[:MAX_LISTED]]
    n_heads = ctx.model.cfg.n_layers * ctx.model.cfg.n_heads
    body = (
        f"<p>{summary['n_prompts']} prompts, {ctx.max_tokens} content tokens each. Every key k is scored by "
        "alpha_k, the mean attention it gets from the queries after it (keys with fewer than "
        f"{summary['min_queries']} queries after them are not scored, except position 0). A head is flagged when "
        "its strongest key, averaged over prompts, is not position 0: "
        + ", ".join(f"{summary[c]['n_flagged']} of {n_heads} heads {html.escape(CONDITION_LABELS[c])}" for c in CONDITIONS)
        + ". On average over heads, the strongest key of a single prompt is off position 0 in "
        + ", ".join(f"{100 * summary[c]['off_first_rate']:.0f}% of prompts {html.escape(CONDITION_LABELS[c])}"
                    for c in CONDITIONS)
        + ". Raw alpha_k favours early keys even under uniform attention (a query t gives each key 1/(t+1)); "
        f"measured against each key's uniform share, the key of largest excess (> {summary['prepend']['min_excess']:g}) "
        "is off position 0 in "
        + ", ".join(f"{summary[c]['n_relative_flagged']} of {n_heads} heads {html.escape(CONDITION_LABELS[c])}"
                    for c in CONDITIONS)
        + ". A strongest key near the end of the prompt marks a local head (recent keys, few queries after "
        "them) rather than a secondary sink; one in the middle, with the same token in its top keys, is a "
        "secondary sink.</p>"
    )
    if rows:
        body += table_html(["condition", "head", "strongest position", "alpha there", "alpha_0", "top keys (token @position)"],
                           rows)
    body += figure_html(figs, "Strongest key position per head (0 = first token)", ctx.out)
    return Section("key_sinks", "Secondary sinks: the strongest key of each head", body, tuple(figs), summary)


def massive_section(ctx: ReportContext) -> Section:
    """Massive residual dimensions at position 0, and the cost of resetting them."""
    name = ctx.model.cfg.model_name
    batch = _batch(ctx, "prepend")
    md = massive_dims(ctx.model, batch, options=ctx.options, reader=ctx.ridden("massive"))
    figs = ctx.figure("massive_dims", lambda p: mechanisms.massive_figure(md, p, model_name=name))
    summary = {"n_prompts": len(batch), **md.to_dict()}
    body = (
        f"<p>{len(batch)} prompts with &lt;bos&gt;, up to {batch.max_content} content tokens. For each residual layer "
        "(0 = embeddings), the first token's norm against the mean norm of the other positions, and per dimension "
        "|h_0[d]| against the median |h_t[d]| of the other positions. ")
    if md.onset_layer is None:
        body += (f"No layer passes the norm ratio threshold {md.threshold:g} (largest ratio "
                 f"{float(md.norm_ratio.max()):.1f}): no massive activation, so nothing is reset.</p>")
    else:
        dims = md.massive_dims
        body += (f"The ratio first exceeds {md.threshold:g} at residual layer {md.onset_layer}; there, by Sun et al.'s "
                 f"criterion (|h_0[d]| &gt; {md.sun_min_abs:g} and &gt;= {md.sun_min_ratio:g} x the hidden state's median "
                 f"magnitude, {float(md.hidden_median[md.onset_layer]):.3g}) the massive dimensions are "
                 + (", ".join(f"{d} ({100 * float(md.sq_share[md.onset_layer, d]):.1f}% of the squared norm)"
                              for d in dims) if dims else "none") + ". ")
        if dims and md.onset_layer < ctx.model.cfg.n_layers:
            part = batch.slice(0, max(1, len(batch) // 2))  # more passes: half the prompts keep the cost down
            resets = []
            for mode in RESETS:  # one clean run of `part` for both resets
                resets.append(reset_massive_dims(ctx.model, part, dims=dims, from_layer=md.onset_layer, mode=mode,
                                                 first_mean=md.first_mean, clean=resets[0] if resets else None,
                                                 options=ctx.options))
            summary["reset"] = {**resets[0].to_dict(), "n_prompts": len(part)}  # others_mean, as before
            summary["resets"] = {r.mode: {**r.to_dict(), "n_prompts": len(part)} for r in resets}
            e = format_eps(DEFAULT_EPS[0])
            body += (f"On the first {len(part)} prompts, at every layer from the onset on, two resets of them at "
                     "position 0: " + "; ".join(
                         f"<i>{r.mode}</i> ({html.escape(RESETS[r.mode])}) moves the content loss from "
                         f"{r.loss_clean:.3f} to {r.loss_reset:.3f} nats and the sink rate (alpha_0 &gt; {e}) from "
                         f"{r.sink_rate(DEFAULT_EPS[0]):.1f}% to {r.sink_rate(DEFAULT_EPS[0], 'reset'):.1f}%"
                         for r in resets) + ".</p>")
            rows = [[c if c == "clean" else f"reset ({r.mode})", l] + [f"{r.sink_rate(x, c):.1f}" for x in DEFAULT_EPS]
                    for i, r in enumerate(resets) for c, l in (("clean", r.loss_clean), ("reset", r.loss_reset))
                    if c == "reset" or i == 0]
            body += table_html(["run", "content loss (nats)", *(f"sink rate % (eps {x:g})" for x in DEFAULT_EPS)], rows)
        elif not dims:
            body += "No dimension passes Sun et al.'s criterion, so nothing is reset.</p>"
        else:
            body += "The onset is after the last layer, so there is no later layer to reset them in.</p>"
    body += figure_html(figs, "First-token norm ratio and massive dimensions per residual layer", ctx.out)
    return Section("massive", "Massive activations", body, tuple(figs), summary)


def value_weighted_section(ctx: ReportContext) -> Section:
    """Attention on the first token against its share of the value-weighted output."""
    name = ctx.model.cfg.model_name
    batch = _batch(ctx, "prepend")
    vw = value_weighted_first(ctx.model, batch, options=ctx.options, reader=ctx.ridden("value_weighted"))
    figs = ctx.figure("value_weighted", lambda p: mechanisms.value_weighted_scatter(vw, p, model_name=name))
    attn, out = vw.mean_attn_first(), vw.mean_output_first()
    eps = DEFAULT_EPS[0]
    sink = attn > eps
    order = attn.flatten().argsort(descending=True)[:5].tolist()
    H = attn.shape[1]
    top = [[head_label(i // H, i % H), float(attn.flatten()[i]), float(out.flatten()[i])] for i in order]
    summary = {
        "n_prompts": len(batch), "vector": vw.vector,
        "attn_first_per_layer": attn.mean(-1).tolist(), "output_first_per_layer": out.mean(-1).tolist(),
        "n_sink_heads": int(sink.sum()),
        "sink_heads_attn_first": float(attn[sink].mean()) if sink.any() else None,
        "sink_heads_output_first": float(out[sink].mean()) if sink.any() else None,
        "top_heads": top,
    }
    body = (
        f"<p>{len(batch)} prompts with &lt;bos&gt;, {ctx.max_tokens} content tokens each. For each head, the mean "
        "attention on the first token (alpha_0) next to the first token's share of the head's value-weighted "
        "output, sum_t ||A[t,0] v_0 W_O|| / sum_t sum_k ||A[t,k] v_k W_O|| (Kobayashi et al. 2020). ")
    if sink.any():
        body += (f"The {summary['n_sink_heads']} heads with alpha_0 &gt; {eps:g} put {summary['sink_heads_attn_first']:.2f} "
                 f"of their attention on the first token on average, but only {summary['sink_heads_output_first']:.2f} "
                 "of their output comes from it.</p>")
    else:
        body += f"No head has alpha_0 &gt; {eps:g}.</p>"
    body += table_html(["head (top alpha_0)", "alpha_0", "output share from the first token"], top)
    body += figure_html(figs, "Attention weight vs value-weighted output on the first token, one dot per head", ctx.out)
    return Section("value_weighted", "Value-weighted attention on the first token", body, tuple(figs), summary)


def _long_sequence(ctx: ReportContext, n_tokens: int) -> TokenBatch:
    """One long row with `<bos>`: the Python docs text, or, for a model without
    a tokenizer, the report's prompts (token ids) laid end to end."""
    if ctx.model.tokenizer is not None:
        return long_tokens(ctx.model, n_tokens, bos="prepend", bos_token_id=ctx.options.bos_token_id)
    ids = [t for p in ctx.prompt_list() for t in p]
    return tokenize(ctx.model, [ids], bos="prepend", max_tokens=n_tokens, bos_token_id=ctx.options.bos_token_id)


def stream_section(ctx: ReportContext) -> Section:
    """Perplexity of one long text under sliding-window attention, with and without the first keys."""
    name = ctx.model.cfg.model_name
    n = min(ctx.stream_tokens, ctx.model.cfg.n_ctx - 1)
    seq = _long_sequence(ctx, n)
    n = int(seq.lengths[0]) - 1
    window = min(ctx.stream_window, max(1, (n - 1) // 2))
    res = stream_perplexity(ctx.model, seq, window=window, keep=STREAM_KEEP, options=ctx.options)
    figs = ctx.figure("stream", lambda p: mechanisms.stream_bars(res, p, model_name=name))
    summary = {**res.to_dict(), "n_scored": res.n_scored}
    rows = [["full attention", f"{res.full_ppl:.2f}"]] + [
        ["last %d keys%s" % (window, "" if k == 0 else f" + first {k}"), f"{p:.2f}"] for k, p in zip(res.keep, res.ppl)]
    ppl = dict(zip(res.keep, res.ppl))
    body = (
        f"<p>One text of {n} tokens after &lt;bos&gt; (StreamingLLM, Xiao et al. 2024): each query sees only the "
        f"last {window} keys, plus the first k keys (position 0 is &lt;bos&gt;). Perplexity is over the same "
        f"{res.n_scored} tokens (positions {res.scored_from} on) in every setting. Dropping every early key gives "
        f"{ppl[0]:.1f}; keeping &lt;bos&gt; alone gives {ppl[1]:.1f}, against {res.full_ppl:.1f} with full attention.</p>"
        + table_html(["attention", "perplexity"], rows)
        + figure_html(figs, "Perplexity under sliding-window attention, per number of kept first keys", ctx.out)
    )
    return Section("streaming", "Streaming: sliding-window attention with and without the sink", body, tuple(figs), summary)


def length_section(ctx: ReportContext) -> Section:
    """Sink rate, mean alpha_0 and the top heads' mask_first cost against the evaluation length."""
    name = ctx.model.cfg.model_name
    longest = min(ctx.length_tokens, ctx.model.cfg.n_ctx - 1)
    lengths = sorted({longest >> i for i in range(ctx.length_steps)} - {0, 1})
    if ctx.model.tokenizer is not None:
        batch = long_prompts(ctx.model, ctx.length_prompts, longest, bos="prepend",
                             bos_token_id=ctx.options.bos_token_id)
    else:
        batch = tokenize(ctx.model, ctx.first(ctx.length_prompts), bos="prepend", max_tokens=longest,
                         bos_token_id=ctx.options.bos_token_id)
    # one head's mask_first cost per length: each costs a clean and an ablated pass
    sweep = sinks_vs_length(ctx.model, batch, lengths=lengths, top_k=LENGTH_TOP_HEADS, options=ctx.options)
    summary = sweep.to_dict()
    body = (
        f"<p>{len(batch)} texts with &lt;bos&gt;, cut to {', '.join(map(str, lengths))} content tokens. Per "
        "length: the sink rate, the mean alpha_0 against that of uniform attention (H_T / T, which falls with T), and the "
        "KL cost (content positions) of masking the first key for the strongest sink head at that length.</p>")
    if sweep.skipped:
        body += "<p>Skipped: " + html.escape("; ".join(f"{T} ({why})" for T, why in sweep.skipped)) + ".</p>"
    figs: list[str] = []
    if sweep.lengths:
        figs = ctx.figure("sinks_vs_length", lambda p: mechanisms.length_lines(sweep, p, model_name=name))
        rows = [[T] + [f"{float(sweep.sink_rate[i, j]):.1f}" for j in range(len(sweep.eps))]
                + [float(sweep.mean_score[i]), float(sweep.uniform_score[i]),
                   f"{head_label(int(sweep.top_layer[i, 0]), int(sweep.top_head[i, 0]))} ({float(sweep.mask_first_cost[i, 0]):.4f})"]
                for i, T in enumerate(sweep.lengths)]
        body += table_html(["length", *(f"sink rate % (eps {e:g})" for e in sweep.eps), "mean alpha_0",
                            "uniform alpha_0", "strongest head (mask_first KL)"], rows)
        body += figure_html(figs, "Sink rate and mean first-token score per evaluation length", ctx.out)
    return Section("length", "Sinks vs evaluation length", body, tuple(figs), summary)


BEYOND: list[Callable[[ReportContext], Section]] = [
    key_sinks_section, massive_section, value_weighted_section, stream_section, length_section,
]
