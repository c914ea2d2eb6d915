"""Patching and ablation effects per [layer, head] (or [layer, pos]) on a colour
scale centred at 0 (Barbero et al. 2025, Sec. 3)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike

from sinkmech.plots.core import heatmap_panels, save
from sinkmech.prompts import CONDITION_LABELS


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
