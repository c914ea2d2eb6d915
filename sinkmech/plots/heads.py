"""Chosen heads up close: value and output norms (Barbero et al. 2025 Sec. 3;
Sandoval-Segura et al. 2025) and query/key norm bands per rotary chunk
(Barbero et al. 2024)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.ticker import MaxNLocator
from numpy.typing import ArrayLike

from sinkmech.plots.core import COLUMN_WIDTH, plain_log_axis, plt, save


def _groups(groups: Mapping[str, ArrayLike], n: int, what: str) -> list[tuple[str, np.ndarray]]:
    if not groups:
        raise ValueError(f"no {what} to draw: the result is empty")
    out = []
    for name, values in groups.items():
        a = np.asarray(values, dtype=float)
        if a.shape != (n,):
            raise ValueError(f"{what} {name!r} has {a.size} values for {n} heads")
        out.append((name, a))
    return out


def head_norm_bars(
    heads: Sequence[str],
    value_norms: Mapping[str, ArrayLike],
    path: str | os.PathLike,
    *,
    output_norms: Mapping[str, ArrayLike] | None = None,
    logy: bool = True,
    title: str = "Norms of chosen heads",
) -> Path:
    """Grouped bars per head: value norms (e.g. first token vs the rest) and,
    optionally, output norms (e.g. dormant vs active queries) in a second panel.

    Args:
        heads: head labels, e.g. ["L12.H3", ...].
        value_norms: group name -> one value-vector norm per head.
        output_norms: group name -> one head-output norm per head.
        logy: log scale (the ratios of interest are ~3-13x).
    """
    if len(heads) == 0:
        raise ValueError("no heads to draw: pass at least one head label")
    panels = [("value-vector norm", _groups(value_norms, len(heads), "value norms"))]
    if output_norms is not None:
        panels.append(("head output norm", _groups(output_norms, len(heads), "output norms")))
    for _, groups in panels:
        for name, a in groups:
            if (a < 0).any() or (logy and (a <= 0).any()):
                raise ValueError(f"norms must be {'> 0 on a log scale' if logy else '>= 0'}; {name!r} has {a.min():.3g}")
    width = max(COLUMN_WIDTH, 0.45 * len(heads) + 1.2) * len(panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(min(width, 7.0), 2.6), squeeze=False, constrained_layout=True)
    x = np.arange(len(heads))
    for ax, (ylabel, groups) in zip(axes[0], panels):
        w = 0.8 / len(groups)
        for i, (name, a) in enumerate(groups):
            ax.bar(x + (i - (len(groups) - 1) / 2) * w, a, width=w, label=name)
        ax.set_xticks(x, list(heads), rotation=45 if len(heads) > 4 else 0, ha="right" if len(heads) > 4 else "center")
        ax.tick_params(labelsize=7)
        if logy:
            plain_log_axis(ax)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.set_xlabel("head", fontsize=8)
        ax.grid(axis="y", alpha=0.3, linewidth=0.5)
        ax.legend(fontsize=7, frameon=False, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=len(groups))
    fig.suptitle(title, fontsize=10)
    return save(fig, path)


def band_heatmaps(
    query_bands: ArrayLike,
    key_bands: ArrayLike,
    path: str | os.PathLike,
    *,
    heads: Sequence[str],
    title: str = "Query/key norm per rotary frequency chunk",
) -> Path:
    """Query and key norm bands, head x frequency chunk, each with its own colour bar.

    Args:
        query_bands: mean 2-norm of each 2-D rotary chunk of the queries [head, chunk].
        key_bands: the same for the keys [head, chunk].
        heads: row labels, one per head.
    Chunk 0 rotates fastest (highest frequency); the last chunks are the
    low-frequency bands that carry the sink logit.
    """
    arrays = []
    for name, a in (("queries", query_bands), ("keys", key_bands)):
        a = np.asarray(a, dtype=float)
        if a.ndim != 2 or a.size == 0:
            raise ValueError(f"{name} bands must be a non-empty [head, chunk] array, got shape {a.shape}")
        if a.shape[0] != len(heads):
            raise ValueError(f"{name} bands have {a.shape[0]} rows for {len(heads)} head labels")
        arrays.append((name, a))
    if arrays[0][1].shape != arrays[1][1].shape:
        raise ValueError(f"query bands {arrays[0][1].shape} and key bands {arrays[1][1].shape} differ in shape")
    rows, chunks = arrays[0][1].shape
    fig, axes = plt.subplots(1, 2, figsize=(7.0, max(2.2, 0.22 * rows + 1.3)), constrained_layout=True)
    for ax, (name, a) in zip(axes, arrays):
        im = ax.imshow(a, aspect="auto", cmap="viridis", interpolation="nearest")
        ax.set_title(name, fontsize=9)
        ax.set_yticks(range(rows), list(heads))
        ax.set_xticks(range(0, chunks, max(1, chunks // 8)))
        ax.set_xlabel("rotary chunk (0 = highest frequency)", fontsize=8)
        ax.tick_params(labelsize=7)
        cbar = fig.colorbar(im, ax=ax, shrink=0.9)
        cbar.set_label(f"mean ||{name[0]}|| per chunk", fontsize=8)
        cbar.ax.tick_params(labelsize=7)
    fig.suptitle(title, fontsize=10)
    return save(fig, path)


def mode_sweep(rows: Sequence[Mapping], path: str | os.PathLike, *, title: str = "Head modes at other cuts") -> Path:
    """The threshold sweep of a head scan (`HeadScan.sweep`): left, if_else
    heads against `high`, one line per `low`; right, sink / active / mixed
    heads against `high` at the default `low` 0.2 (else the largest swept).

    Args:
        rows: dicts with `high`, `low` and `mode_counts`.
    """
    if not rows:
        raise ValueError("no sweep rows to draw")
    lows = sorted({r["low"] for r in rows}, reverse=True)
    fig, axes = plt.subplots(1, 2, figsize=(7.0, 2.8), constrained_layout=True)
    for low in lows:
        sel = sorted((r for r in rows if r["low"] == low), key=lambda r: r["high"])
        axes[0].plot([r["high"] for r in sel], [r["mode_counts"]["if_else"] for r in sel], marker="o", label=f"low {low:g}")
    axes[0].set(xlabel="high (a query is dormant at >= high)", ylabel="if_else heads")
    axes[0].yaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].legend(fontsize=7)
    base = 0.2 if 0.2 in lows else lows[0]
    sel = sorted((r for r in rows if r["low"] == base), key=lambda r: r["high"])
    for mode in ("sink", "active", "mixed"):
        axes[1].plot([r["high"] for r in sel], [r["mode_counts"][mode] for r in sel], marker="o", label=mode)
    axes[1].set(xlabel="high", ylabel="heads", title=f"low {base:g}")
    axes[1].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    return save(fig, path)


def contrast_distribution(diffs: Sequence[float], marked: Mapping[str, float], shift: Mapping | None,
                          path: str | os.PathLike, *, title: str = "Difference of dormant fractions, every head") -> Path:
    """A head contrast over the whole population: the histogram of every head's
    difference of dormant fractions (corpus A - B), the population's median
    with its interval shaded, and the confirmed heads marked by a line each,
    named with their difference; names of nearby lines go to staggered rows,
    never on top of one another.

    Args:
        diffs: one difference per head.
        marked: head label -> its difference (the confirmed heads).
        shift: `HeadContrast.population_shift` (`median`, `ci`), or None.
    """
    d = np.asarray(diffs, dtype=float)
    if d.size == 0:
        raise ValueError("no head differences to draw")
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH * 1.6, 2.6 + 0.15 * max(0, len(marked) - 4)),
                           constrained_layout=True)
    ax.hist(d, bins=np.linspace(min(-0.05, d.min()), max(0.05, d.max()), 41), color="0.6", label=f"{d.size} heads")
    if shift is not None:
        ax.axvspan(*shift["ci"], color="tab:blue", alpha=0.25, linewidth=0)
        ax.axvline(shift["median"], color="tab:blue", label=f"median {shift['median']:+.3f}")
    ax.axvline(0.0, color="black", linewidth=0.6)
    heads = sorted(marked.items(), key=lambda kv: kv[1])
    for i, (_, x) in enumerate(heads):
        ax.axvline(x, color="tab:red", linewidth=0.8, alpha=0.7, label="confirmed" if i == 0 else None)
    ax.set(xlabel="dormant fraction, A - B (all prompts)", ylabel="heads")
    ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside: the names go on top
    fig.suptitle(title, fontsize=9)
    if heads:
        _name_lines(fig, ax, heads)
    return save(fig, path)


def contrast_figure(contrast: Mapping, path: str | os.PathLike, *, model: str) -> Path:
    """`contrast_distribution` of a head contrast as its JSON holds it
    (`HeadContrast.to_dict()`: every head's difference `diff_all` [layer][head],
    the heads with `confirmed`, the `population_shift`), so a written contrast
    can be drawn again."""
    diff = contrast["diff_all"]
    marked = {f"L{h['layer']}.H{h['head']}": float(diff[h["layer"]][h["head"]])
              for h in contrast["heads"] if h["confirmed"]}
    return contrast_distribution([v for row in diff for v in row], marked, contrast["population_shift"], path,
                                 title=f"Dormant fraction, {contrast['name_a']} - {contrast['name_b']}: every head "
                                       f"({model})")


def _name_lines(fig, ax, heads: Sequence[tuple[str, float]], *, fontsize: float = 6.0) -> list:
    """Each (name, x) written beside its line at the top of `ax` (to its left where
    it would run past the right edge); a name that would run into another in a row
    goes down a row (rows spaced by the text's height), so no two names overlap.
    Returns the texts."""
    texts = [ax.annotate(f"{name} {x:+.3f}", (x, 0.985), xycoords=("data", "axes fraction"), xytext=(1.5, 0),
                         textcoords="offset points", fontsize=fontsize, va="top", ha="left", color="tab:red",
                         bbox=dict(boxstyle="square,pad=0.1", facecolor="white", edgecolor="none", alpha=0.8))
             for name, x in heads]
    fig.canvas.draw()  # lay out, so the names' extents are the drawn ones
    renderer = fig.canvas.get_renderer()
    to_axes = ax.transAxes.inverted()
    spans = []
    for t in texts:
        b = to_axes.transform(t.get_window_extent(renderer))
        left, right, width = b[0, 0], b[1, 0], b[1, 0] - b[0, 0]
        if right > 1.0:  # past the right edge: the name goes left of its line
            t.set_horizontalalignment("right")
            t.xyann = (-1.5, 0)
            line = to_axes.transform(ax.transData.transform((t.xy[0], 0)))[0]
            left, right = line - width - (left - line), line
        spans.append((left, right, t))
    height = max(t.get_window_extent(renderer).height for t in texts) / ax.get_window_extent(renderer).height * 1.15
    row_ends: list[float] = []  # right end, in axes fraction, of the last name in each row
    for left, right, t in sorted(spans, key=lambda s: s[0]):
        row = next((r for r, end in enumerate(row_ends) if left > end + 0.01), len(row_ends))
        if row == len(row_ends):
            row_ends.append(right)
        row_ends[row] = right
        t.xy = (t.xy[0], 0.985 - row * height)
    return texts
