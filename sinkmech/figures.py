"""Static matplotlib figures for write-ups (PNG and SVG).

Every figure has a title, axis labels and a colour bar, and is sized to stay
readable at a paper's column width.
"""

from __future__ import annotations

import os
from pathlib import Path
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
import numpy as np  # noqa: E402


def save(fig, path: str | os.PathLike) -> Path:
    """Write `fig` to `path` (its suffix picks PNG or SVG) and close it."""
    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise ValueError(f"figure path must end in .png, .svg or .pdf, got {path}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=200, bbox_inches="tight")
    except OSError as e:
        raise OSError(f"cannot write figure to {path}: {e.strerror or e}") from e
    finally:
        plt.close(fig)
    return path


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


def sink_heatmap(results: dict, path: str | os.PathLike, *, model_name: str = "") -> Path:
    """Layer x head heatmap of mean first-token score, one panel per `<bos>` condition.

    Args:
        results: condition name ("prepend" / "none") -> SinkScores.
    """
    labels = {"prepend": "with <bos>", "none": "without <bos>"}
    panels = [
        (f"{labels.get(k, k)} (rate>0.3: {r.sink_rate(0.3):.0f}%)", r.mean_scores().numpy())
        for k, r in results.items()
    ]
    fig = heatmap_panels(
        panels,
        title=f"First-token attention score per head{' — ' + model_name if model_name else ''}",
        xlabel="head",
        ylabel="layer",
        cbar_label="mean first-token score $\\alpha_0$",
        vmin=0.0,
        vmax=1.0,
    )
    return save(fig, path)


# Per-layer and per-position figures from plain arrays --------------------------

from collections.abc import Mapping  # noqa: E402

from numpy.typing import ArrayLike  # noqa: E402

COLUMN_WIDTH = 3.4  # inches: one column of a two-column paper
CONDITION_LABELS = {"prepend": "with <bos>", "none": "without <bos>"}


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


def plain_log_axis(ax) -> None:
    """Log y axis with tick labels written 0.2, 3, 40 (not 2x10^-1), all one size."""
    from matplotlib.ticker import FuncFormatter, LogLocator

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
