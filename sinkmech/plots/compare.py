"""Figures of the two-model comparison (Barbero et al. 2025, Table 2 and
Figure 2 on real models): one panel per model, with and without `<bos>`.
Drawn from plain per-layer arrays; nothing here runs a model."""

from __future__ import annotations

import os
from pathlib import Path
from collections.abc import Mapping

import numpy as np
from matplotlib.ticker import MaxNLocator
from numpy.typing import ArrayLike

from sinkmech.plots.core import COLUMN_WIDTH, plt, save
from sinkmech.prompts import CONDITION_LABELS, CONDITIONS


def _panels(
    per_model: Mapping[str, Mapping[str, ArrayLike]],
    path: str | os.PathLike,
    *,
    title: str,
    ylabel: str,
    baselines: Mapping[str, float] | None = None,
    xlabel: str = "layer",
    sharey: bool = True,
) -> Path:
    if not per_model:
        raise ValueError("no models to draw")
    n = len(per_model)
    fig, axes = plt.subplots(1, n, figsize=(COLUMN_WIDTH * n * 0.8, 2.6), constrained_layout=True,
                             sharey=sharey, squeeze=False)
    for ax, (model, series) in zip(axes[0], per_model.items()):
        for cond, marker in zip(CONDITIONS, "os"):
            if cond not in series:
                continue
            a = np.asarray(series[cond], dtype=float)
            ax.plot(np.arange(a.size), a, marker=marker, markersize=3, linewidth=1.2, label=CONDITION_LABELS[cond])
        if baselines and model in baselines:
            ax.axhline(baselines[model], color="grey", linestyle="--", linewidth=0.8, label="uniform attention")
        ax.set_title(model, fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3, linewidth=0.5)
    axes[0][0].set_ylabel(ylabel, fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels), fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=9)
    return save(fig, path)


def first_token_score_panels(
    per_model: Mapping[str, Mapping[str, ArrayLike]],
    path: str | os.PathLike,
    *,
    uniform: Mapping[str, float] | None = None,
) -> Path:
    """Mean first-token score alpha_0 per layer, with and without `<bos>`, one panel per model.

    Args:
        per_model: model name -> {"prepend": [layer], "none": [layer]}.
        uniform: model name -> alpha_0 of uniform attention (dashed line).
    """
    return _panels(per_model, path, title="First-token score per layer (mean over heads and prompts)",
                   ylabel="alpha_0", baselines=uniform)


def spread_panels(per_model: Mapping[str, Mapping[str, ArrayLike]], path: str | os.PathLike, *, position: int) -> Path:
    """Relative residual change at the positions after a one-token swap, per
    layer (0 = embeddings), with and without `<bos>`, one panel per model."""
    return _panels(per_model, path, title=f"Perturbation spread: one token swapped at content position {position}",
                   ylabel="mean ||h'-h|| / ||h|| after the swap", xlabel="layer (0 = embeddings)", sharey=False)


def depth_curves(per_model: Mapping[str, Mapping[str, tuple]], path: str | os.PathLike, *, ylabel: str,
                 title: str) -> Path:
    """Curves over fractional depth (0 = embeddings, 1 = last layer), one line
    per model and condition, with a shaded 95 % interval over prompts, so
    models of different depth compare point by point.

    Args:
        per_model: model -> {condition: (depth [layer], curve [layer] of [mean, lo, hi])}.
    """
    if not per_model:
        raise ValueError("no models to draw")
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH * 1.4, 2.8), constrained_layout=True)
    for model, series in per_model.items():
        for cond, style in zip(CONDITIONS, ("-", "--")):
            if cond not in series or not len(series[cond][1]):
                continue
            depth, curve = np.asarray(series[cond][0], dtype=float), np.asarray(series[cond][1], dtype=float)
            line, = ax.plot(depth, curve[:, 0], style, linewidth=1.2, label=f"{model}, {CONDITION_LABELS[cond]}")
            ax.fill_between(depth, curve[:, 1], curve[:, 2], color=line.get_color(), alpha=0.15, linewidth=0)
    ax.set_xlabel("fractional depth (residual layer / layers)", fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3, linewidth=0.5)
    ax.legend(fontsize=6)
    ax.set_title(title, fontsize=9)
    return save(fig, path)
