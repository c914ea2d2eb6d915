"""Figures for the training experiments: sink signals against training step
and against context length (Barbero et al. 2025, Table 2 and the context-length study)."""

from __future__ import annotations

import os
from pathlib import Path
from collections.abc import Mapping, Sequence

from sinkmech.plots.core import plt, save
from sinkmech.hooks import head_label
from sinkmech.prompts import CONDITION_LABELS, CONDITIONS

COLORS = {"prepend": "tab:blue", "none": "tab:orange"}
COND_STYLE = {c: (CONDITION_LABELS[c], COLORS[c]) for c in CONDITIONS}


def training_curves(logs: Mapping[str, dict], path: str | os.PathLike, *, title: str = "",
                    per_row: int = 5) -> Path:
    """One column per run: validation loss, first-token scores (max and mean
    head, against the uniform baseline) and sink rates, each against step.
    More than `per_row` runs wrap onto further bands of three rows, so each
    panel stays readable.

    Args:
        logs: run name -> the log written by `sinkmech.train.run.train`.
    """
    if not logs:
        raise ValueError("no training logs to plot")
    n = len(logs)
    cols = min(n, per_row)
    bands = -(-n // cols)
    fig, grid = plt.subplots(3 * bands, cols, figsize=(3.6 * cols + 0.6, 8.0 * bands), squeeze=False,
                             constrained_layout=True)
    for i in range(n, bands * cols):  # the last band's empty columns
        for k in range(3):
            grid[3 * (bands - 1) + k, i % cols].set_visible(False)
    for i, (name, log) in enumerate(logs.items()):
        axes, col = grid[3 * (i // cols):3 * (i // cols) + 3], i % cols
        evals = log["evals"]
        steps = [e["step"] for e in evals]
        ax = axes[0, col]
        ax.plot(range(1, len(log["train_loss"]) + 1), log["train_loss"], color="0.75", lw=0.8, label="train")
        for cond, (label, color) in COND_STYLE.items():
            ax.plot(steps, [e["val_loss"][cond] for e in evals], "o-", ms=3, color=color, label=f"val {label}")
        ax.set_title(name, fontsize=9)
        ax.set_ylabel("loss (nats/token)", fontsize=8)
        last = min(e["val_loss"][c] for e in evals for c in COND_STYLE)
        ax.set_ylim(last - 0.2, max(log["train_loss"][min(len(log["train_loss"]) - 1, 10):] + [last + 0.5]))
        ax = axes[1, col]
        for cond, (label, color) in COND_STYLE.items():
            c = [e["conditions"][cond] for e in evals]
            ax.plot(steps, [x["max_head_score"] for x in c], "o-", ms=3, color=color, label=f"max head, {label}")
            ax.plot(steps, [x["mean_head_score"] for x in c], "s--", ms=2, color=color, alpha=0.7, label=f"mean head, {label}")
            ax.plot(steps, [x["uniform_score"] for x in c], ":", color="k" if cond == "prepend" else "0.5", lw=1,
                    label=f"uniform, {label}")
        top = max(x["max_head_score"] for e in evals for x in e["conditions"].values())
        ax.set_ylim(0, min(1.0, max(0.25, 1.15 * top)))  # zoomed: sinks at CPU scale are weak
        ax.set_ylabel("first-token score $\\alpha_0$", fontsize=8)
        ax = axes[2, col]
        for cond, (label, color) in COND_STYLE.items():
            for eps, style in (("0.3", "o-"), ("0.8", "^--")):
                ax.plot(steps, [e["conditions"][cond]["sink_rate"][eps] for e in evals], style, ms=3, color=color,
                        label=f"$\\epsilon$={eps}, {label}")
        ax.set_ylim(-2, 102)
        ax.set_ylabel("sink rate (% of heads)", fontsize=8)
        ax.set_xlabel("training step", fontsize=8)
        for ax in axes[:, col]:
            ax.tick_params(labelsize=7)
    for ax in grid[:3, 0]:  # one legend per row of the first band
        ax.legend(fontsize=6)
    fig.suptitle(title or "Sink signals during training", fontsize=10)
    return save(fig, path)


def context_length_plot(rows: Sequence[dict], path: str | os.PathLike, *, title: str = "") -> Path:
    """Final sink rate and first-token scores against training context length.

    Args:
        rows: one per (context_length, inference condition) with keys
            `context_length`, `inference_bos`, `sink_rate`, `max_head_score`,
            `mean_head_score`, `uniform_score`.
    """
    if not rows:
        raise ValueError("no rows to plot")
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.6), constrained_layout=True)
    for bos, (label, color) in (("prepend", COND_STYLE["prepend"]), ("none", COND_STYLE["none"])):
        sel = sorted((r for r in rows if r["inference_bos"] == (bos == "prepend")), key=lambda r: r["context_length"])
        if not sel:
            continue
        x = [r["context_length"] for r in sel]
        for eps, style in (("0.3", "o-"), ("0.8", "^--")):
            axes[0].plot(x, [r["sink_rate"][eps] for r in sel], style, color=color, label=f"$\\epsilon$={eps}, {label}")
        axes[1].plot(x, [r["max_head_score"] for r in sel], "o-", color=color, label=f"max head, {label}")
        axes[1].plot(x, [r["mean_head_score"] for r in sel], "s--", color=color, alpha=0.7, label=f"mean head, {label}")
        axes[1].plot(x, [r["uniform_score"] for r in sel], ":", color="k" if bos == "prepend" else "0.5",
                     label=f"uniform, {label}")
    axes[0].set_ylabel("final sink rate (% of heads)")
    axes[0].set_ylim(-2, 102)
    axes[1].set_ylabel("final first-token score $\\alpha_0$")
    top = max(r["max_head_score"] for r in rows)
    axes[1].set_ylim(0, min(1.0, max(0.25, 1.15 * top)))  # zoomed: sinks at CPU scale are weak
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("training context length (tokens)")
        ax.legend(fontsize=7)
    fig.suptitle(title or "Sinks against training context length", fontsize=10)
    return save(fig, path)


def emergence_plot(em: Mapping, path: str | os.PathLike, *, title: str = "") -> Path:
    """The sink forming over training (Guo et al. 2024's mutual reinforcement):
    first-token score, value norms, residual norms and the split validation
    loss against step, with the step where the score first exceeds 0.3 (and
    the step from which it stays above) marked.

    Args:
        em: `sinkmech.train.emergence.Emergence.to_dict()` (or its JSON).
    """
    steps = em["steps"]
    if not steps:
        raise ValueError("no evaluations to plot")
    cross = em["cross_step"].get("0.3")
    fig, axes = plt.subplots(2, 2, figsize=(10.0, 6.4), sharex=True, constrained_layout=True)
    ax = axes[0, 0]
    ax.plot(steps, em["first_token_score"], "o-", ms=3, color=COND_STYLE["prepend"][1], label="with <bos>")
    ax.plot(steps, em["first_token_score_no_bos"], "s--", ms=2, color=COND_STYLE["none"][1],
            label="<bos> removed at inference")
    ax.axhline(em["uniform_score"], color="k", ls=":", lw=1, label="uniform attention")
    ax.axhline(0.3, color="0.6", ls="-", lw=0.8)
    ax.set_ylim(0, 1)
    ax.set_ylabel(f"first-token score $\\alpha_0$ ({head_label(em['layer'], em['head'])})")
    ax = axes[0, 1]
    ax.plot(steps, em["bos_value_norm"], "o-", ms=3, color="tab:purple", label="value norm at <bos>")
    ax.plot(steps, em["other_value_norm"], "s--", ms=2, color="tab:purple", alpha=0.6, label="value norm, other tokens")
    ax.set_ylabel("value-vector norm")
    ax = axes[1, 0]
    ax.plot(steps, em["bos_resid_norm"], "o-", ms=3, color="tab:green", label="residual norm at <bos>")
    ax.plot(steps, em["other_resid_norm"], "s--", ms=2, color="tab:green", alpha=0.6, label="residual norm, other tokens")
    ax.set_ylabel(f"resid_post norm (layer {em['layer']})")
    ax = axes[1, 1]
    if em.get("loss_post_trigger") is not None:
        ax.plot(steps, em["loss_post_trigger"], "o-", ms=3, color="tab:red", label="post-trigger positions (copies)")
        ax.plot(steps, em["loss_rest"], "s--", ms=2, color="tab:gray", label="other positions (bigram)")
    ax.set_ylabel("validation loss with <bos> (nats)")
    stable = em.get("stable_step", {}).get("0.3")
    for ax in axes.flat:
        if cross is not None:
            ax.axvline(cross, color="tab:blue", ls="--", lw=1, alpha=0.7,
                       label=f"$\\alpha_0$ > 0.3 first at step {cross}" if ax is axes[0, 0] else None)
        if stable is not None and stable != cross:
            ax.axvline(stable, color="tab:blue", ls=":", lw=1.2, alpha=0.9,
                       label=f"$\\alpha_0$ > 0.3 from step {stable} on" if ax is axes[0, 0] else None)
        ax.tick_params(labelsize=8)
        ax.legend(fontsize=7)
    for ax in axes[1]:
        ax.set_xlabel("training step")
    fig.suptitle(title or f"Sink emergence ({em['run']})", fontsize=10)
    return save(fig, path)


def depth_plot(rows: Sequence[dict], path: str | os.PathLike, *, title: str = "") -> Path:
    """Sink rate (eps 0.3, with and without `<bos>` at inference), max alpha_0
    and the loss gap without `<bos>`, against depth: one marker per seed, a
    line through the seed means, one color per positional embedding."""
    if not rows:
        raise ValueError("no depth rows to plot")
    positionals = list(dict.fromkeys(r["positional"] for r in rows))
    colors = dict(zip(positionals, ("tab:purple", "tab:green", "tab:red")))
    fig, axes = plt.subplots(1, 3, figsize=(13.5, 4.0), constrained_layout=True)
    for pos in positionals:
        mine = [r for r in rows if r["positional"] == pos]
        depths = sorted({r["n_layers"] for r in mine})
        pairs = [(r, t) for r in mine if r["inference_bos"]
                 for t in mine if not t["inference_bos"] and t["seed"] == r["seed"] and t["n_layers"] == r["n_layers"]]
        panels = (
            (axes[0], "sink rate % (alpha_0 > 0.3)", lambda r, t: r["sink_rate"]["0.3"], "-", "with <bos>"),
            (axes[0], None, lambda r, t: t["sink_rate"]["0.3"], "--", "without <bos>"),
            (axes[1], "max head alpha_0", lambda r, t: r["max_head_score"], "-", "with <bos>"),
            (axes[1], None, lambda r, t: t["max_head_score"], "--", "without <bos>"),
            (axes[2], "loss without <bos> - with (nats)", lambda r, t: t["val_loss"] - r["val_loss"], "-", ""),
        )
        for ax, ylabel, get, ls, label in panels:
            xs = [r["n_layers"] for r, _ in pairs]
            ys = [get(r, t) for r, t in pairs]
            ax.scatter(xs, ys, s=14, color=colors[pos], alpha=0.5, marker="o" if ls == "-" else "x")
            means = [sum(y for x, y in zip(xs, ys) if x == d) / max(1, xs.count(d)) for d in depths]
            ax.plot(depths, means, ls, color=colors[pos], label=f"{pos} {label}".strip())
            if ylabel:
                ax.set_ylabel(ylabel, fontsize=9)
            ax.set_xlabel("layers", fontsize=9)
            ax.set_xticks(sorted({r["n_layers"] for r in rows}))
    axes[0].set_ylim(-5, 105)
    axes[1].axhline(rows[0]["uniform_score"], color="0.5", lw=0.8, ls=":", label="uniform")
    axes[2].axhline(0.0, color="0.5", lw=0.8)
    for ax in axes:
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return save(fig, path)


def context_length_seeds_plot(flat: Mapping, path: str | os.PathLike, *, title: str = "") -> Path:
    """Max alpha_0 (with and without `<bos>`; scored on the shortest context's
    tokens, and dashed at each model's own training length where the findings
    hold it) and the loss gap without `<bos>` against training context: the
    mean over seeds with its 95 % t interval, read from the findings
    (`train.context_length_seeds.T<T>.<series>.{mean,lo,hi}`)."""
    base = "train.context_length_seeds"
    if f"{base}.lengths" not in flat:
        raise ValueError("no context-length intervals over seeds in the findings")
    lengths = [int(t) for t in str(flat[f"{base}.lengths"]).split(",")]
    robust = {int(t) for t in str(flat.get(f"{base}.robust_lengths", "")).split(",") if t}
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), constrained_layout=True)
    alpha = [("prepend.max_head_score", "with <bos>, on the shortest context's tokens", "tab:blue", "o-"),
             ("none.max_head_score", "without <bos>, on the shortest context's tokens", "tab:orange", "o-")]
    if all(f"{base}.T{T}.own_length.prepend.max_head_score.mean" in flat for T in lengths):
        # every model also scored at its own training length (T - 1 tokens)
        alpha += [("own_length.prepend.max_head_score", "with <bos>, at its own T", "tab:blue", "s--"),
                  ("own_length.none.max_head_score", "without <bos>, at its own T", "tab:orange", "s--")]
    for ax, series in ((axes[0], alpha), (axes[1], (("loss_gap", "loss without <bos> - with", "tab:red", "o-"),))):
        for key, label, color, style in series:
            mean = [flat[f"{base}.T{T}.{key}.mean"] for T in lengths]
            lo = [flat[f"{base}.T{T}.{key}.lo"] for T in lengths]
            hi = [flat[f"{base}.T{T}.{key}.hi"] for T in lengths]
            ax.fill_between(lengths, lo, hi, color=color, alpha=0.15 if style == "o-" else 0.07)
            ax.plot(lengths, mean, style, color=color, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [f"{T}{'' if T in robust else ' (not robust)'}" for T in lengths], fontsize=8)
        ax.set_xlabel("training context length T", fontsize=9)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("max head alpha_0", fontsize=9)
    axes[0].set_ylim(-0.1, 1.1)
    axes[1].set_ylabel("nats/token", fontsize=9)
    axes[1].axhline(0.0, color="0.5", lw=0.8)
    if title:
        fig.suptitle(title, fontsize=10)
    return save(fig, path)
