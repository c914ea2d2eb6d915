"""The long-context study's figure (`sinkmech.studies.long_context`): next-token
loss and sink rate against position, with and without `<bos>`, at the longest
length; and representational collapse against the number of repeats."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from matplotlib.ticker import FuncFormatter, NullFormatter

from sinkmech.plots.core import COLUMN_WIDTH, plt, save
from sinkmech.prompts import CONDITION_LABELS, CONDITIONS


def _interval(entry: dict | None) -> tuple[float, float, float]:
    if entry is None:
        return np.nan, np.nan, np.nan
    lo, hi = entry["ci"]
    return entry["value"], entry["value"] - lo, hi - entry["value"]


def long_context_figure(result: dict, path: str | os.PathLike, *, eps: str = "0.3") -> Path:
    """Three panels from `LongContextResult.to_dict()`: loss by position bucket
    (with and without `<bos>`, and without it with each learned sink), sink
    rate (eps) by bucket over all heads and over the global layers' heads, and
    the last layer's collapse distance against repeats; 95 % t intervals."""
    T = max(result["lengths"], key=int)
    runs = result["lengths"][T]
    fig, axes = plt.subplots(1, 3, figsize=(3 * COLUMN_WIDTH, 2.8))
    colours = {"prepend": "tab:blue", "none": "tab:red"}
    for bos in CONDITIONS:
        buckets = runs[bos]["buckets"]
        mids = [np.sqrt(int(k.split("-")[0]) * int(k.split("-")[1])) for k in buckets]
        loss = np.array([_interval(b["loss"]) for b in buckets.values()])
        axes[0].errorbar(mids, loss[:, 0], yerr=loss[:, 1:].T, marker="o", capsize=3, color=colours[bos],
                         label=CONDITION_LABELS[bos])
        for key, style, what in (("sink_rate", "-", "all heads"), ("sink_rate_global_layers", "--", "global layers")):
            rate = np.array([_interval(b[key][eps]) for b in buckets.values()])
            axes[1].errorbar(mids, rate[:, 0], yerr=rate[:, 1:].T, marker="o", capsize=3, linestyle=style,
                             color=colours[bos], label=f"{CONDITION_LABELS[bos]}, {what}")
        collapse = result["collapse"].get(bos)
        if collapse:
            ks = [int(k) for k in collapse]
            d = np.array([_interval(v) for v in collapse.values()])
            axes[2].errorbar(ks, d[:, 0], yerr=d[:, 1:].T, marker="o", capsize=3, color=colours[bos],
                             label=CONDITION_LABELS[bos])
    learned = [c for c in runs if c not in CONDITIONS]  # none_learned_<variant>: no <bos>, a learned sink in every row
    for i, label in enumerate(learned):
        buckets = runs[label]["buckets"]
        mids = [np.sqrt(int(k.split("-")[0]) * int(k.split("-")[1])) for k in buckets]
        loss = np.array([_interval(b["loss"]) for b in buckets.values()])
        axes[0].errorbar(mids, loss[:, 0], yerr=loss[:, 1:].T, marker="s", capsize=3, linestyle=":",
                         color=("tab:green", "tab:purple", "tab:olive")[i % 3],
                         label="no <bos>, fitted sinks (" + label.removeprefix("none_learned_").replace("_", " + ") + ")")
    axes[0].set(xlabel="position (content tokens)", ylabel="next-token loss (nats)", title=f"loss, T = {int(T):,}")
    axes[1].set(xlabel="position (content tokens)", ylabel=f"heads, key-0 attention > {eps} (%)",
                title="sink rate by position")
    axes[2].set(xlabel="repeats of the last token", ylabel="||h(k) - h(k+1)||, last layer",
                title="collapse in length")
    for ax in axes:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.tick_params(labelsize=7)
    for ax in axes[::2]:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, frameon=False)
    if not any(result["collapse"].values()):  # collapse_repeats left empty: nothing measured there
        axes[2].text(0.5, 0.5, "not measured\n(no collapse_repeats)", ha="center", va="center",
                     transform=axes[2].transAxes, fontsize=8, color="0.4")
    axes[1].set_ylim(-5, 150)  # room above the curves for the legend
    axes[1].set_yticks(range(0, 101, 20))
    axes[1].legend(fontsize=6, frameon=False, loc="upper center", ncol=2, columnspacing=0.8, handlelength=1.5)
    axes[2].set_yscale("log")
    axes[2].yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axes[2].yaxis.set_minor_formatter(NullFormatter())
    fig.suptitle(f"{result['model']}: long context ({result['config']['n_prompts']} long texts, 95 % t intervals)",
                 y=1.02)
    fig.tight_layout()
    return save(fig, path)


def long_context_figures(result: dict, folder: str | os.PathLike) -> list[Path]:
    """The study's figure (`long_context_figure`) as long_context_<model>.png and .svg in `folder`."""
    stem = Path(folder) / f"long_context_{result.get('model', 'model')}"
    return [long_context_figure(result, stem.with_suffix(suffix)) for suffix in (".png", ".svg")]
