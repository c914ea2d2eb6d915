"""Labels for head profiles: sink / active / if_else / mixed, with the evidence.

The rules and their thresholds are documented in `Thresholds` below
(dormant heads: Barbero et al. 2025, Sec. 3.2; Guo et al. 2024).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from jaxtyping import Float
from torch import Tensor

from sinkmech.dormant.triggers import Trigger

Mode = Literal["sink", "active", "if_else", "mixed", "insufficient"]
# "insufficient": too few queries for any label (see Thresholds.min_queries).
MODES: tuple[Mode, ...] = ("sink", "active", "if_else", "mixed", "insufficient")


@dataclass(frozen=True)
class Thresholds:
    """Mode thresholds (per query) and label thresholds (per head).

    A query is dormant when its first-token attention is >= `high`, active
    when <= `low`, "between" otherwise. A head is
    - `if_else` when dormant_fraction >= `if_else_min_dormant`, active_fraction
      >= `if_else_min_active`, between fraction <= `if_else_max_between`,
      one of its triggers (the top few per place, ranked by evidence; see
      `sinkmech.dormant.triggers`) has lift >= `min_lift` on >= `min_count` active queries
      in >= `min_prompts` distinct prompts, and replicates (lift >= `min_lift`
      on the even and on the odd prompts separately), and
      output_norm_dormant / output_norm_active <= `max_output_ratio`;
    - else `sink` when dormant_fraction >= `sink_min_dormant`;
    - else `active` when dormant_fraction <= `active_max_dormant`;
    - else `mixed`.
    """

    high: float = 0.8
    low: float = 0.2
    sink_min_dormant: float = 0.9
    active_max_dormant: float = 0.1
    if_else_min_dormant: float = 0.5
    if_else_min_active: float = 0.01
    if_else_max_between: float = 0.25
    min_lift: float = 3.0
    min_count: int = 5
    max_output_ratio: float = 0.5
    min_prompts: int = 3
    # Below this many queries per head no label is given: the if_else rule alone
    # needs min_count active queries at an active fraction of if_else_min_active.
    min_queries: int = 500

    def __post_init__(self) -> None:
        if not 0.0 <= self.low < self.high <= 1.0:
            raise ValueError(f"thresholds out of order: need 0 <= low < high <= 1, got low={self.low}, high={self.high}")
        fractions = ("sink_min_dormant", "active_max_dormant", "if_else_min_dormant", "if_else_min_active", "if_else_max_between")
        for name in fractions:
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {getattr(self, name)}")
        if self.active_max_dormant >= self.sink_min_dormant:
            raise ValueError(
                f"thresholds out of order: active_max_dormant ({self.active_max_dormant}) must be "
                f"< sink_min_dormant ({self.sink_min_dormant})"
            )
        if self.min_lift < 1.0 or self.min_count < 1 or self.max_output_ratio <= 0 or self.min_prompts < 1:
            raise ValueError("need min_lift >= 1, min_count >= 1, min_prompts >= 1 and max_output_ratio > 0")


@dataclass(frozen=True)
class HeadStats:
    """What the labels read from a scan: per-head fractions of query modes and
    output norms (NaN where a mode never occurred)."""

    dormant_fraction: Float[Tensor, "layer head_index"]
    active_fraction: Float[Tensor, "layer head_index"]
    output_norm_dormant: Float[Tensor, "layer head_index"]
    output_norm_active: Float[Tensor, "layer head_index"]


@dataclass(frozen=True)
class Labels:
    """Every head's mode, the evidence for it, and its if_else score."""

    modes: tuple[tuple[Mode, ...], ...]  # [layer][head]
    evidence: tuple[tuple[tuple[str, ...], ...], ...]  # [layer][head] -> reasons
    if_else_score: Float[Tensor, "layer head_index"]


def classify(
    stats: HeadStats,
    triggers: Sequence[Sequence[Sequence[Trigger]]],
    best_lift: Float[Tensor, "layer head_index"],
    th: Thresholds,
    n_queries: int | None = None,
) -> Labels:
    """Label every head.

    Args:
        stats: the per-head mode fractions and output norms.
        triggers: [layer][head] sequences of `Trigger`, best first.
        best_lift: each head's best trigger lift (0 if it has no trigger).
        th: the thresholds.
        n_queries: queries per head in the scan; below `th.min_queries` every
            head is labelled "insufficient" (with how many it had).

    Returns:
        Labels: modes, evidence (tuple of strings per head) and
        if_else_score [layer, head_index]. The score ranks heads by how close
        they come to the if_else rule: the product of each criterion's
        fulfilment (capped at 1) times the fraction of queries at the
        extremes (1 - between).
    """
    dorm, act = stats.dormant_fraction, stats.active_fraction
    ratio = stats.output_norm_dormant / stats.output_norm_active
    L, H = dorm.shape
    score = torch.zeros(L, H)
    modes, evidence = [], []
    for l in range(L):
        row_m, row_e = [], []
        for h in range(H):
            d, a, r, lift = float(dorm[l, h]), float(act[l, h]), float(ratio[l, h]), float(best_lift[l, h])
            between = max(0.0, 1.0 - d - a)
            lifted = [t for t in triggers[l][h] if t.lift >= th.min_lift]
            strong = [t for t in lifted if t.replicated and t.n_prompts >= th.min_prompts]
            top = (strong or lifted or list(triggers[l][h]) or [None])[0]
            trig = (f"trigger {top.token!r}@{top.where} lift {top.lift:.1f} (n={top.count} in {top.n_prompts} prompts; "
                    f"held-out halves {_lift(top.lift_even)} / {_lift(top.lift_odd)}"
                    f"{'' if top.replicated else ', not replicated'})" if top
                    else f"no trigger on >= {th.min_count} active queries in >= {th.min_prompts} prompts")
            ratio_txt = "n/a" if math.isnan(r) else f"{r:.2f}"
            checks = [
                (d >= th.if_else_min_dormant, f"dormant {d:.2f} {'>=' if d >= th.if_else_min_dormant else '<'} {th.if_else_min_dormant}"),
                (a >= th.if_else_min_active, f"active {a:.3f} {'>=' if a >= th.if_else_min_active else '<'} {th.if_else_min_active}"),
                (between <= th.if_else_max_between, f"between {between:.2f} {'<=' if between <= th.if_else_max_between else '>'} {th.if_else_max_between}"),
                (bool(strong), f"{trig} {'>=' if top.lift >= th.min_lift else '<'} {th.min_lift}" if top else trig),
                (not math.isnan(r) and r <= th.max_output_ratio,
                 f"output norm dormant/active {ratio_txt} {'<=' if r <= th.max_output_ratio else 'not <='} {th.max_output_ratio}"),
            ]
            fulfil = [
                min(1.0, d / th.if_else_min_dormant) if th.if_else_min_dormant > 0 else 1.0,
                min(1.0, a / th.if_else_min_active) if th.if_else_min_active > 0 else 1.0,
                min(1.0, lift / th.min_lift),
                0.0 if math.isnan(r) else min(1.0, th.max_output_ratio / max(r, 1e-12)),
            ]
            score[l, h] = (1.0 - between) * math.prod(fulfil)
            if n_queries is not None and n_queries < th.min_queries:
                mode = "insufficient"
                why = [f"only {n_queries} queries per head; a label needs >= {th.min_queries} (the if_else rule "
                       f"needs {th.min_count} active queries at an active fraction of {th.if_else_min_active})"]
            elif all(ok for ok, _ in checks):
                mode, why = "if_else", [t for _, t in checks]
            elif d >= th.sink_min_dormant:
                mode = "sink"
                why = [f"dormant {d:.2f} >= {th.sink_min_dormant}", f"if_else fails: {_failed(checks)}"]
            elif d <= th.active_max_dormant:
                mode = "active"
                why = [f"dormant {d:.2f} <= {th.active_max_dormant}", f"active {a:.2f}"]
            else:
                mode = "mixed"
                why = [f"{th.active_max_dormant} < dormant {d:.2f} < {th.sink_min_dormant}", f"if_else fails: {_failed(checks)}"]
            row_m.append(mode)
            row_e.append(tuple(why))
        modes.append(tuple(row_m))
        evidence.append(tuple(row_e))
    return Labels(tuple(modes), tuple(evidence), score)


def _lift(x: float | None) -> str:
    return "n/a" if x is None else f"x{x:.1f}"


def _failed(checks: list[tuple[bool, str]]) -> str:
    return "; ".join(t for ok, t in checks if not ok)
