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

from sinkmech.dormant.triggers import Trigger, TriggerRule, chosen_trigger

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
      output_norm_dormant / output_norm_active <= `max_output_ratio`, and the
      one trigger chosen on the selection prompts is validated on the disjoint
      validation prompts (lift >= `min_lift` on >= `min_count` active queries
      in >= `min_prompts` prompts, Poisson p <= `alpha` / heads; see
      `sinkmech.dormant.triggers`);
    - else `sink` when dormant_fraction >= `sink_min_dormant`;
    - else `active` when dormant_fraction <= `active_max_dormant`: the head
      *rarely* puts >= `high` on the first token. It says nothing about how
      far below `high` it stays (`active_fraction` does);
    - else `mixed`.
    `MODE_MEANING` spells this out for readers of the JSON.
    """

    high: float = 0.5  # calibrated: docs/dormant_calibration.md
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
    alpha: float = 0.05  # family-wise level of the trigger validation (Bonferroni over heads)

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
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha must lie in (0, 1), got {self.alpha}")
        if self.min_lift < 1.0 or self.min_count < 1 or self.max_output_ratio <= 0 or self.min_prompts < 1:
            raise ValueError("need min_lift >= 1, min_count >= 1, min_prompts >= 1 and max_output_ratio > 0")

    def trigger_rule(self, n_tests: int) -> TriggerRule:
        """The trigger validation rule at this family-wise level over `n_tests` heads (Bonferroni)."""
        return TriggerRule(self.min_lift, self.min_count, self.min_prompts, self.alpha / n_tests)


def mode_meaning(th: Thresholds) -> dict[str, str]:
    """What each label means at these thresholds, in words (for JSON and reports)."""
    return {
        "sink": f"dormant (first-token attention >= {th.high:g}) on >= {th.sink_min_dormant:g} of queries, "
                "and not if_else",
        "active": f"dormant on <= {th.active_max_dormant:g} of queries: rarely puts >= {th.high:g} on the first "
                  f"token (not necessarily <= {th.low:g}: see active_fraction)",
        "if_else": f"dormant on >= {th.if_else_min_dormant:g}, active (<= {th.low:g}) on >= {th.if_else_min_active:g}, "
                   f"between on <= {th.if_else_max_between:g} of queries, resting output <= {th.max_output_ratio:g} x the "
                   "active one, and a trigger chosen on the selection prompts validated on the held-out ones",
        "mixed": f"dormant on between {th.active_max_dormant:g} and {th.sink_min_dormant:g} of queries, not if_else",
        "insufficient": f"fewer than {th.min_queries} queries per head: no label",
    }


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
            top = chosen_trigger(triggers[l][h], th.min_lift)
            trig = (f"trigger {top.token!r}@{top.where} chosen on the selection prompts (lift {top.lift:.1f}, "
                    f"n={top.count} in {top.n_prompts} prompts), validation prompts: lift {_lift(top.validated_lift)} "
                    f"(n={top.count_validated} in {top.prompts_validated} prompts, p={_p(top.p_validated)})"
                    f"{'' if top.validated else ', not validated'}" if top
                    else f"no trigger on >= {th.min_count} active queries in >= {th.min_prompts} selection prompts")
            ratio_txt = "n/a" if math.isnan(r) else f"{r:.2f}"
            checks = [
                (d >= th.if_else_min_dormant, f"dormant {d:.2f} {'>=' if d >= th.if_else_min_dormant else '<'} {th.if_else_min_dormant}"),
                (a >= th.if_else_min_active, f"active {a:.3f} {'>=' if a >= th.if_else_min_active else '<'} {th.if_else_min_active}"),
                (between <= th.if_else_max_between, f"between {between:.2f} {'<=' if between <= th.if_else_max_between else '>'} {th.if_else_max_between}"),
                (top is not None and top.validated, trig),
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


def _p(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1g}"


def _failed(checks: list[tuple[bool, str]]) -> str:
    return "; ".join(t for ok, t in checks if not ok)
