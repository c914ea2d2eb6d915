"""Perturbation spread: the relative change of the residual stream, layer x
position, after a small input change (Barbero et al. 2025, Fig. 2)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike

from sinkmech.plots.core import heatmap_panels, save
from sinkmech.prompts import CONDITION_LABELS


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
