"""Figures of the sink-or-`<bos>` decomposition (`sinkmech.studies.decomposition`)
and of fitted sink logits (`sinkmech fit-sinks`): the loss of each condition
against `<bos>` first as bars with their intervals, the share of the `<bos>` cost
the phantom sink recovers by layer, and each head's learned sink mass against
its attention on `<bos>`. Each draws a JSON section it is handed; nothing here
runs a model.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from sinkmech.plots.core import COLUMN_WIDTH, legend_below, plt, save

# How each condition is named on a figure, in the order the bars are drawn.
LABELS = {
    "valueless_bos": "value-less <bos>",
    "phantom_bos_value": "phantom, <bos> value",
    "phantom": "phantom, zero value",
    "bias": "bias only",
    "none": "no <bos>",
}


def _label(name: str) -> str:
    if name in LABELS:
        return LABELS[name]
    if name.startswith("learned_"):
        return "learned logits" + (", value" if "value" in name else "") + f" ({name[8:]})"
    if name.startswith("bos_at_"):
        return f"<bos> at {name[7:]}"
    return name


def _suffix(model_name: str) -> str:
    return f" ({model_name})" if model_name else ""


def decomposition_bars(section: Mapping, path: str | os.PathLike, *, model_name: str = "") -> Path:
    """One bar per condition: its loss minus `<bos>` first's (nats per content
    target, paired by prompt), with the 95 % interval over prompts."""
    conds = section["conditions"]
    names = [n for n in (*LABELS, *sorted(conds)) if n in conds and n != "bos"]
    names = list(dict.fromkeys(names))
    vals = np.array([conds[n]["vs_bos"]["loss"] for n in names], dtype=float)
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH * 1.4, 0.28 * len(names) + 1.0), constrained_layout=True)
    y = np.arange(len(names))[::-1]
    colors = ["#4c72b0" if n.startswith(("phantom", "bias", "none", "learned")) else "#dd8452" for n in names]
    ax.barh(y, vals[:, 0], color=colors, height=0.6)
    ax.errorbar(vals[:, 0], y, xerr=[vals[:, 0] - vals[:, 1], vals[:, 2] - vals[:, 0]], fmt="none", ecolor="black",
                elinewidth=0.8, capsize=2)
    ax.axvline(0, color="grey", linewidth=0.8)
    ax.set_yticks(y)
    ax.set_yticklabels([_label(n) for n in names], fontsize=7)
    ax.set_xlabel("loss minus <bos> first (nats per content target)", fontsize=8)
    ax.set_title(f"What removing <bos> costs, taken apart{_suffix(model_name)}", fontsize=9)
    ax.tick_params(labelsize=7)
    ax.grid(axis="x", alpha=0.3, linewidth=0.5)
    return save(fig, path)


def recovery_by_layer(section: Mapping, path: str | os.PathLike, *, model_name: str = "") -> Path:
    """Per layer, the share of the `<bos>` cost recovered by the phantom sink in that
    layer alone, and in every layer but that one (paired mass; `<bos>`'s value and
    zero value), with 95 % intervals over prompts."""
    layers = section.get("layers") or {}
    if not layers:
        raise ValueError("no per-layer runs in this section: run the study's 'layers' part")
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH * 1.4, 2.6), constrained_layout=True)
    styles = {"bos": ("#4c72b0", "<bos> value"), "zero": ("#dd8452", "zero value")}
    for value, curves in layers.items():
        color, text = styles.get(value, ("grey", value))
        for kind, ls, what in (("one", "-", "this layer alone"), ("all_but", "--", "all layers but this one")):
            pts = [(l, v) for l, v in enumerate(curves[kind]) if v is not None]
            if not pts:
                continue
            x = np.array([p[0] for p in pts])
            v = np.array([p[1] for p in pts], dtype=float)
            ax.plot(x, v[:, 0], ls, color=color, marker="o", markersize=2.5, linewidth=1, label=f"{text}, {what}")
            ax.fill_between(x, v[:, 1], v[:, 2], color=color, alpha=0.15, linewidth=0)
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.axhline(1, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("layer", fontsize=8)
    ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))  # layers are whole numbers
    ax.set_ylabel("share of the <bos> cost recovered", fontsize=8)
    ax.set_title(f"Where the phantom sink matters{_suffix(model_name)}", fontsize=9)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3, linewidth=0.5)
    legend_below(fig, ax)
    return save(fig, path)


def learned_mass_scatter(fitted: Mapping, path: str | os.PathLike, *, model_name: str = "") -> Path:
    """One dot per head with a fitted sink: its learned sink mass (x) against its
    attention on `<bos>` with `<bos>` first (y), both mean over the held-out content
    queries (`sinkmech fit-sinks`'s JSON, with its evaluation)."""
    e = fitted.get("evaluation")
    if not e:
        raise ValueError("the fitted sinks were not scored on held-out prompts: no masses to draw")
    learned, bos = np.asarray(e["learned_mass"], dtype=float), np.asarray(e["bos_mass"], dtype=float)
    heads = fitted.get("heads") or [[l, h] for l in range(learned.shape[0]) for h in range(learned.shape[1])]
    x = np.array([learned[l, h] for l, h in heads])
    y = np.array([bos[l, h] for l, h in heads])
    layer = np.array([l for l, _ in heads])
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH, 3.0), constrained_layout=True)
    sc = ax.scatter(x, y, c=layer, cmap="viridis", s=12, vmin=0, vmax=max(learned.shape[0] - 1, 1), edgecolors="none")
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=0.8, label="learned = <bos>")
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_aspect("equal")
    ax.set_xlabel("learned sink mass (no <bos>)", fontsize=8)
    ax.set_ylabel("attention on <bos> (<bos> first)", fontsize=8)
    ax.set_title(f"Fitted sinks ({fitted.get('variant', '')}){_suffix(model_name)}", fontsize=9)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3, linewidth=0.5)
    ax.legend(fontsize=7, frameon=False, loc="upper left")
    cbar = fig.colorbar(sc, ax=ax, shrink=0.9)
    cbar.set_label("layer", fontsize=8)
    cbar.ax.tick_params(labelsize=7)
    return save(fig, path)


def decomposition_figures(study: Mapping, folder: str | os.PathLike) -> list[Path]:
    """Every figure of a decomposition JSON (`Decomposition.to_dict()`), PNG and SVG,
    into `folder`: decomposition_<model> (bars) and decomposition_layers_<model>."""
    folder = Path(folder)
    out = []
    for name, section in study["models"].items():
        for suffix in (".png", ".svg"):
            out.append(decomposition_bars(section, folder / f"decomposition_{name}{suffix}", model_name=name))
            if section.get("layers"):
                out.append(recovery_by_layer(section, folder / f"decomposition_layers_{name}{suffix}", model_name=name))
    return out
