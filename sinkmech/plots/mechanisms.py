"""Figures of how the sink works, past the first-token score: secondary
sinks at any key (Gu et al. 2025, Sec. 3), massive activations (Sun et al.
2024), value-weighted attention (Kobayashi et al. 2020), streaming with and
without the sink (Xiao et al. 2024) and sinks against the evaluation length.

Each figure is drawn from a result it is handed (or plain arrays); nothing
here runs a model. Every figure has a title, axis labels and a legend or
colour bar, and stays readable at a paper's column width.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from matplotlib.ticker import MaxNLocator, NullLocator

from sinkmech.plots.core import COLUMN_WIDTH, heatmap_panels, legend_below, plain_log_axis, plt, save
from sinkmech.prompts import CONDITION_LABELS


def _suffix(model_name: str) -> str:
    return f" — {model_name}" if model_name else ""


# Secondary sinks ----------------------------------------------------------------


def strongest_key_heatmap(results: Mapping, path: str | os.PathLike, *, model_name: str = "") -> Path:
    """Layer x head heatmap of each head's strongest key position (prompt-averaged
    alpha_k), one panel per `<bos>` condition; 0 (dark) is the first token.

    Args:
        results: condition ("prepend" / "none") -> KeySinks.
    """
    if not results:
        raise ValueError("no key-sink results to draw")
    panels = []
    for c, r in results.items():
        n_flag = int(r.flagged.sum())
        panels.append((f"{CONDITION_LABELS.get(c, c)}\n{n_flag} head{'' if n_flag == 1 else 's'} off position 0",
                       r.strongest_position.numpy().astype(float)))
    vmax = max(1.0, max(float(a.max()) for _, a in panels))
    fig = heatmap_panels(panels, title=f"Strongest key position per head{_suffix(model_name)}",
                         xlabel="head", ylabel="layer", cbar_label="key position (0 = first token)",
                         vmin=0.0, vmax=vmax, cmap="magma")
    return save(fig, path)


# Massive activations ------------------------------------------------------------


def massive_figure(result, path: str | os.PathLike, *, model_name: str = "") -> Path:
    """Two panels over residual layers (0 = embeddings): the first token's norm
    ratio ||h_0|| / mean_t ||h_t|| with the onset threshold, and |h_0[d]| /
    median_t |h_t[d]| of the massive dimensions (the top dimensions at the onset
    layer, or at the layer of largest norm ratio when there is no onset).

    Args:
        result: a MassiveDims.
    """
    ratio = result.norm_ratio.numpy()
    layers = np.arange(ratio.size)
    dims = result.massive_dims or tuple(int(d) for d in result.top_dims[int(ratio.argmax())])
    dim_ratio = result.dim_ratio.numpy()
    fig, axes = plt.subplots(1, 2, figsize=(2 * COLUMN_WIDTH, 2.6), constrained_layout=True)
    ax = axes[0]
    ax.plot(layers, ratio, marker="o", markersize=3, linewidth=1.2, label="position 0 / other positions")
    ax.axhline(result.threshold, color="grey", linestyle="--", linewidth=0.8, label=f"threshold {result.threshold:g}")
    if result.onset_layer is not None:
        ax.axvline(result.onset_layer, color="C3", linestyle=":", linewidth=1.0, label=f"onset (layer {result.onset_layer})")
    ax.set_title("Residual norm of the first token", fontsize=9)
    ax.set_ylabel("||h_0|| / mean ||h_t||", fontsize=8)
    ax.legend(fontsize=7, frameon=False, loc="best")
    ax = axes[1]
    for d, marker in zip(dims, "os^vDx*+"):
        ax.plot(layers, np.maximum(dim_ratio[:, d], 1e-3), marker=marker, markersize=3, linewidth=1.0, label=f"dim {d}")
    ax.set_title("Massive dimensions" if result.massive_dims else "Top dimensions (no onset)", fontsize=9)
    ax.set_ylabel("|h_0[d]| / median |h_t[d]|", fontsize=8)
    ax.legend(fontsize=7, frameon=False, ncols=2, loc="best")
    for ax in axes:
        plain_log_axis(ax)
        ax.set_xlabel("residual layer (0 = embeddings)", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3, linewidth=0.5)
    fig.suptitle(f"Massive activations at position 0 ({CONDITION_LABELS.get(result.bos, result.bos)}){_suffix(model_name)}",
                 fontsize=10)
    return save(fig, path)


# Value-weighted attention ------------------------------------------------------------


def value_weighted_scatter(result, path: str | os.PathLike, *, model_name: str = "") -> Path:
    """One dot per head: attention weight on the first token (x) against the
    first token's share of the head's value-weighted output (y); the diagonal
    is where the two agree. Sink heads sit low and to the right.

    Args:
        result: a ValueWeighted.
    """
    attn = result.mean_attn_first().numpy()
    out = result.mean_output_first().numpy()
    L = attn.shape[0]
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH, 3.0), constrained_layout=True)
    sc = ax.scatter(attn.ravel(), out.ravel(), c=np.repeat(np.arange(L), attn.shape[1]), cmap="viridis",
                    s=10, vmin=0, vmax=max(L - 1, 1), edgecolors="none")
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=0.8, label="output share = attention")
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_aspect("equal")
    what = "||A v W_O||" if result.vector == "output" else "||A v||"
    ax.set_xlabel("attention on the first token $\\alpha_0$", fontsize=8)
    ax.set_ylabel(f"first token's share of {what}", fontsize=8)
    ax.set_title(f"Attention vs value-weighted output{_suffix(model_name)}", fontsize=9)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3, linewidth=0.5)
    ax.legend(fontsize=7, frameon=False, loc="upper left")
    cbar = fig.colorbar(sc, ax=ax, shrink=0.9)
    cbar.set_label("layer", fontsize=8)
    cbar.ax.tick_params(labelsize=7)
    cbar.ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    return save(fig, path)


# Streaming --------------------------------------------------------------------


def stream_bars(result, path: str | os.PathLike, *, model_name: str = "") -> Path:
    """Perplexity per number of kept first keys under sliding-window attention,
    with full attention as a dashed line (log scale when the settings differ by
    more than 10x: dropping the sink can cost orders of magnitude).

    Args:
        result: a StreamResult.
    """
    if not result.keep:
        raise ValueError("no streaming settings to draw")
    labels = ["window only" if k == 0 else f"window + {k} first" for k in result.keep]
    ppl = np.asarray(result.ppl, dtype=float)
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH, 2.6), constrained_layout=True)
    x = np.arange(len(ppl))
    colors = ["C3" if k == 0 else "C0" for k in result.keep]
    bars = ax.bar(x, ppl, color=colors, width=0.6)
    for b, v in zip(bars, ppl):
        ax.annotate(f"{v:.3g}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=7,
                    xytext=(0, 1), textcoords="offset points")
    ax.axhline(result.full_ppl, color="k", linestyle="--", linewidth=0.9, label=f"full attention ({result.full_ppl:.3g})")
    ax.set_xticks(x, labels, fontsize=7)
    top, low = max(float(ppl.max()), result.full_ppl), min(float(ppl.min()), result.full_ppl)
    if top / max(low, 1e-12) > 10:  # a log scale only when the settings differ by orders of magnitude
        plain_log_axis(ax)
        ax.set_ylim(low / 1.5, top * 3)
    else:
        ax.set_ylim(0, top * 1.15)
        ax.tick_params(axis="y", labelsize=7)
    ax.set_xlabel(f"attention: last {result.window} keys + first k keys", fontsize=8)
    ax.set_ylabel("perplexity", fontsize=8)
    ax.set_title(f"Sliding window with and without the sink{_suffix(model_name)}", fontsize=9)
    ax.grid(axis="y", alpha=0.3, linewidth=0.5)
    legend_below(fig, ax)
    return save(fig, path)


# Sinks against the evaluation length --------------------------------------------------


def length_lines(result, path: str | os.PathLike, *, model_name: str = "") -> Path:
    """Two panels over the evaluation length: the sink rate at each epsilon, and
    the mean alpha_0 against that of uniform attention.

    Args:
        result: a LengthSweep with at least one measured length.
    """
    if not result.lengths:
        raise ValueError("no measured lengths to draw (every length was skipped)")
    T = np.asarray(result.lengths, dtype=float)
    fig, axes = plt.subplots(1, 2, figsize=(2 * COLUMN_WIDTH, 2.6), constrained_layout=True)
    ax = axes[0]
    for j, (e, marker) in enumerate(zip(result.eps, "os^vD")):
        ax.plot(T, result.sink_rate[:, j].numpy(), marker=marker, markersize=4, linewidth=1.2, label=f"$\\epsilon$ = {e:g}")
    ax.set_ylim(-3, 103)
    ax.set_ylabel("sink rate (% prompt x head)", fontsize=8)
    ax.set_title("Sink rate", fontsize=9)
    ax = axes[1]
    ax.plot(T, result.mean_score.numpy(), marker="o", markersize=4, linewidth=1.2, label="mean over heads")
    ax.plot(T, result.uniform_score.numpy(), color="grey", linestyle="--", linewidth=0.9, label="uniform attention")
    ax.set_ylabel("first-token score $\\alpha_0$", fontsize=8)
    ax.set_title("Mean first-token score", fontsize=9)
    plain_log_axis(ax)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(T, [f"{int(t)}" for t in T])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("evaluation length (content tokens)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3, linewidth=0.5)
        ax.legend(fontsize=7, frameon=False)
    fig.suptitle(f"Sinks vs evaluation length ({CONDITION_LABELS.get(result.bos, result.bos)}, "
                 f"{result.n_prompts} prompts){_suffix(model_name)}", fontsize=10)
    return save(fig, path)

