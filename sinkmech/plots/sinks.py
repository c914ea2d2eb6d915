"""First-token score per head and sink rate per layer, with and without `<bos>`
(Gu et al. 2025 / Barbero et al. 2025)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike

from sinkmech.plots.core import heatmap_panels, layer_lines, save
from sinkmech.prompts import CONDITION_LABELS


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
    # learned sink logits (gpt-oss): the sink's own share beside alpha_0, on the same scale
    panels += [(f"{CONDITION_LABELS.get(k, k)}\nlearned sink mass: mean {float(r.learned_sink_scores.mean()):.2f}",
                r.learned_sink_scores.mean(0).numpy())
               for k, r in results.items() if r.learned_sink_scores is not None]
    learned = len(panels) > len(results)
    first = next(iter(results.values()))
    fig = heatmap_panels(
        panels,
        title=f"First-token attention score per head{' — ' + model_name if model_name else ''} "
              f"\n{first.n_prompts} prompts, {first.token_count()}",
        xlabel="head",
        ylabel="layer",
        cbar_label="mean $\\alpha_0$ / learned sink mass" if learned else "mean first-token score $\\alpha_0$",
        vmin=0.0,
        vmax=1.0,
    )
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
