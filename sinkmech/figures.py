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
