"""What every static figure shares: saving (PNG, SVG, PDF), heatmap panels with
shared colour limits, plain log axes, legends below the plot and lines over
layers. Every figure has a title, axis labels and a colour bar or legend, and
is sized to stay readable at a paper's column width (`COLUMN_WIDTH`). Nothing
here runs a model.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

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


# Lines over layers -----------------------------------------------------------


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
