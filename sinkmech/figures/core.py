"""Static matplotlib figures for write-ups (PNG and SVG), drawn from results or plain arrays.

Every figure has a title, axis labels and a colour bar, and is sized to stay
readable at a paper's column width. Sinks and layers: first-token score per
head and sink rate per layer (Gu et al. 2025 / Barbero et al. 2025), norms and
perturbation spread per layer (Barbero et al. 2025, Fig. 2). Heads: value and
output norms (Barbero et al. 2025 Sec. 3; Sandoval-Segura et al. 2025),
query/key norm bands per rotary chunk (Barbero et al. 2024) and patching /
ablation heatmaps. Nothing here runs a model.
"""

from __future__ import annotations

import os
from pathlib import Path
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator  # noqa: E402
from numpy.typing import ArrayLike  # noqa: E402

from sinkmech.files import cannot  # noqa: E402
from sinkmech.prompts import CONDITION_LABELS  # noqa: E402

COLUMN_WIDTH = 3.4  # inches: one column of a two-column paper


def save(fig, path: str | os.PathLike) -> Path:
    """Write `fig` to `path` (its suffix picks PNG or SVG) and close it."""
    path = Path(path)
    try:
        if path.suffix.lower() not in (".png", ".svg", ".pdf"):
            raise ValueError(f"figure path must end in .png, .svg or .pdf, got {path}")
        with cannot("write figure to", path):
            path.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path, dpi=200, bbox_inches="tight")
    finally:
        plt.close(fig)
    return path


def shared_limits(panels: Sequence[tuple[str, ArrayLike]], signed: bool = False) -> dict:
    """vmin/vmax for one colour scale over all panels (heatmap_panels autoscales
    each otherwise): [min, max] when signed, else [0, max]."""
    vals = np.concatenate([np.asarray(a, dtype=float).ravel() for _, a in panels])
    vals = vals[np.isfinite(vals)]
    hi = float(vals.max()) if vals.size else 1.0
    lo = float(vals.min()) if vals.size else 0.0
    return {"vmin": lo, "vmax": hi} if signed else {"vmin": 0.0, "vmax": max(hi, 1e-12)}


def heatmap_grid(values: ArrayLike) -> np.ndarray:
    """A 2-D array for a heatmap from a result of 1-3 axes: [n] -> [n, 1], [a, b, c] -> mean over c."""
    v = np.asarray(values, dtype=np.float32)
    if v.ndim == 1:
        return v[:, None]
    if v.ndim == 3:
        return v.mean(-1)
    return v


def heatmap_panels(
    panels: Sequence[tuple[str, np.ndarray]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    cbar_label: str,
    vmin: float | None = None,
    vmax: float | None = None,
    cmap: str = "viridis",
    diverging: bool = False,
):
    """One heatmap per panel sharing a colour scale; rows are the y axis.

    Args:
        panels: (panel title, 2-D array [rows, cols]) pairs.
        diverging: centre the colour scale on 0 (for signed effects).
    """
    if not panels:
        raise ValueError("no panels to draw")
    arrays = [np.asarray(a, dtype=float) for _, a in panels]
    for (name, _), a in zip(panels, arrays):
        if a.ndim != 2 or a.size == 0:
            raise ValueError(f"panel {name!r} must be a non-empty 2-D array, got shape {a.shape}")
    finite = np.concatenate([a[np.isfinite(a)] for a in arrays]) if arrays else np.array([0.0])
    if diverging:
        lim = float(np.abs(finite).max()) if finite.size else 1.0
        vmin, vmax, cmap = -lim, lim, "RdBu_r"
    rows, cols = arrays[0].shape
    width = min(3.2 * len(panels), 3.2 * len(panels) * max(cols / 12, 0.6)) + 0.8
    height = max(2.4, min(6.5, 0.16 * rows + 1.2))
    fig, axes = plt.subplots(1, len(panels), figsize=(width, height), squeeze=False, constrained_layout=True)
    im = None
    for ax, (name, _), a in zip(axes[0], panels, arrays):
        im = ax.imshow(a, aspect="auto", origin="upper", cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        step = max(1, rows // 10)
        ax.set_yticks(range(0, rows, step))
        cstep = max(1, cols // 12)
        ax.set_xticks(range(0, cols, cstep))
    cbar = fig.colorbar(im, ax=axes[0].tolist(), shrink=0.9)
    cbar.set_label(cbar_label, fontsize=8)
    cbar.ax.tick_params(labelsize=7)
    fig.suptitle(title, fontsize=10)
    return fig


def plain_log_axis(ax) -> None:
    """Log y axis with tick labels written 0.2, 3, 40 (not 2x10^-1), all one size."""
    ax.set_yscale("log")
    fmt = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(fmt)
    ax.yaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
    ax.yaxis.set_minor_formatter(fmt)
    ax.tick_params(axis="y", which="both", labelsize=7)


def legend_below(fig, ax) -> None:
    """Legend under the axes, so it never hides data."""
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=len(labels) if len(labels) <= 2 else 2, fontsize=7, frameon=False)


# Sinks, layers and positions -------------------------------------------------


def sink_heatmap(results: dict, path: str | os.PathLike, *, model_name: str = "") -> Path:
    """Layer x head heatmap of mean first-token score, one panel per `<bos>` condition.

    Args:
        results: condition name ("prepend" / "none") -> SinkScores.
    """
    panels = [
        (f"{CONDITION_LABELS.get(k, k)}\nrate>0.3: {r.sink_rate(0.3):.0f}%; uniform: {r.uniform_score():.2f}",
         r.mean_scores().numpy())
        for k, r in results.items()
    ]
    first = next(iter(results.values()))
    fig = heatmap_panels(
        panels,
        title=f"First-token attention score per head{' — ' + model_name if model_name else ''} "
              f"\n{first.n_prompts} prompts, {first.token_count()}",
        xlabel="head",
        ylabel="layer",
        cbar_label="mean first-token score $\\alpha_0$",
        vmin=0.0,
        vmax=1.0,
    )
    return save(fig, path)


def _series(series, what: str) -> list[tuple[str, np.ndarray]]:
    if not series:
        raise ValueError(f"no {what} to draw: the result is empty")
    out = []
    for name, values in series.items():
        a = np.asarray(values, dtype=float)
        if a.ndim != 1 or a.size == 0:
            raise ValueError(f"{what} {name!r} must be a non-empty 1-D array, got shape {a.shape}")
        out.append((CONDITION_LABELS.get(name, name), a))
    return out


def layer_lines(
    series: Mapping[str, ArrayLike],
    path: str | os.PathLike,
    *,
    title: str,
    ylabel: str,
    logy: bool = False,
    ylim: tuple[float, float] | None = None,
) -> Path:
    """One line per series over layers (column width).

    Args:
        series: name -> values [layer] (condition keys "prepend"/"none" get readable labels).
    """
    lines = _series(series, "series")
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH, 2.5), constrained_layout=True)
    for (name, a), marker in zip(lines, "os^vDx*"):
        ax.plot(np.arange(a.size), a, marker=marker, markersize=3, linewidth=1.2, label=name)
    if logy:
        plain_log_axis(ax)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layers are whole numbers
    ax.set_xlabel("layer", fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3, linewidth=0.5)
    legend_below(fig, ax)
    return save(fig, path)


def sink_rate_lines(rates: Mapping[str, ArrayLike], path: str | os.PathLike, *, eps: float, model_name: str = "") -> Path:
    """Per-layer sink rate (% of heads x prompts with alpha_0 > eps), with and without `<bos>`.

    Args:
        rates: condition ("prepend"/"none") -> sink rate in percent [layer].
    """
    for name, values in (rates or {}).items():
        a = np.asarray(values, dtype=float)
        if a.size and ((a < 0) | (a > 100)).any():
            raise ValueError(f"sink rates are percentages in [0, 100]; {name!r} has {a.min():.3g}..{a.max():.3g}")
    return layer_lines(
        rates,
        path,
        title=f"Sink rate per layer ($\\epsilon$={eps:g}){' — ' + model_name if model_name else ''}",
        ylabel=f"% heads with $\\alpha_0$ > {eps:g}",
        ylim=(-3.0, 103.0),
    )


def spread_heatmaps(
    panels: Mapping[str, ArrayLike],
    path: str | os.PathLike,
    *,
    perturbed_pos: int | None = None,
    log: bool = True,
    floor: float = 1e-4,
    title: str = "Perturbation spread",
) -> Path:
    """Relative change of the residual stream, layer x position, one panel per condition.

    Args:
        panels: condition -> ||h' - h|| / ||h|| [layer, pos]; columns are content
            positions, aligned across conditions.
        perturbed_pos: column of the perturbed token (drawn as a dashed line).
        log: colour by log10 (changes span orders of magnitude); values below
            `floor` (e.g. the exact zeros before the perturbation) show as `floor`.
    """
    if not panels:
        raise ValueError("no perturbation-spread panels to draw: the result is empty")
    arrays = []
    for name, a in panels.items():
        a = np.asarray(a, dtype=float)
        if a.ndim != 2 or a.size == 0:
            raise ValueError(f"panel {name!r} must be a non-empty [layer, pos] array, got shape {a.shape}")
        if (a[np.isfinite(a)] < 0).any():
            raise ValueError(f"panel {name!r} has negative values: a relative change is a norm ratio >= 0")
        arrays.append((CONDITION_LABELS.get(name, name), np.log10(np.maximum(a, floor)) if log else a))
    vmax = max(float(np.nanmax(a)) for _, a in arrays)
    fig = heatmap_panels(
        arrays,
        title=title,
        xlabel="position",
        ylabel="layer",
        cbar_label="$\\log_{10}$ ||h'−h|| / ||h||" if log else "||h'−h|| / ||h||",
        vmin=np.log10(floor) if log else 0.0,
        vmax=vmax if vmax > (np.log10(floor) if log else 0.0) else None,
        cmap="magma",
    )
    if perturbed_pos is not None:
        for ax in fig.axes[: len(arrays)]:
            ax.axvline(perturbed_pos, color="cyan", linestyle="--", linewidth=0.8)
    return save(fig, path)


# Heads ------------------------------------------------------------------------


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


def patching_heatmaps(
    panels: Mapping[str, ArrayLike],
    path: str | os.PathLike,
    *,
    title: str = "Activation patching",
    xlabel: str = "head",
    ylabel: str = "layer",
    cbar_label: str = "patching effect",
    diverging: bool = True,
) -> Path:
    """Patching (or ablation) effects, one [layer, head] panel per condition,
    on a colour scale centred at 0.

    Args:
        panels: condition -> effect [layer, head] (or [layer, pos] with xlabel="position").
    """
    if not panels:
        raise ValueError("no patching panels to draw: the result is empty")
    fig = heatmap_panels(
        [(CONDITION_LABELS.get(k, k), np.asarray(v, dtype=float)) for k, v in panels.items()],
        title=title,
        xlabel=xlabel,
        ylabel=ylabel,
        cbar_label=cbar_label,
        diverging=diverging,
    )
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
