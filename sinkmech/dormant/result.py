"""The result of a dormant-head scan (`sinkmech.dormant.scan.scan_heads`):
per-(layer, head) profiles, labels and triggers, with their JSON and table forms.

Definitions: Barbero et al. 2025, Sec. 3.2; Guo et al. 2024 ("Active-dormant
attention heads"); the labels are documented in `sinkmech.dormant.labels.Thresholds`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from sinkmech.dormant.labels import MODES, Mode, Thresholds, mode_meaning
from sinkmech.dormant.queries import QueryRecords, Uncertainty
from sinkmech.dormant.triggers import Trigger, chosen_trigger, split_prompts
from sinkmech.prompts import Bos
from sinkmech.results import Result


def trigger_text(triggers: Sequence[Trigger | Mapping], n: int = 3, *, sep: str = ", ") -> str:
    """`'tok'@where x<lift> (n=<count>, <p> prompts)` for the first `n` triggers
    (objects or their `to_dict()`), joined by `sep`; "" when there is none."""
    def one(t) -> str:
        d = t if isinstance(t, Mapping) else t.to_dict()
        return f"{d['token']!r}@{d['where']} x{d['lift']:.1f} (n={d['count']}, {d.get('n_prompts', 0)} prompts)"

    return sep.join(one(t) for t in list(triggers)[:n])


@dataclass(frozen=True)
class HeadScan(Result):
    """Per-(layer, head) profiles over a corpus. NaN where a mode never occurred."""

    # mean of A[t, 0] over real queries t >= 1, pooled over prompts: query 0 (which can
    # only attend to itself) is left out, so this is not alpha_0 (`sinkmech.measures.sinks.first_key_score`)
    first_key_attention_excl_q0: Float[Tensor, "layer head_index"]
    dormant_fraction: Float[Tensor, "layer head_index"]
    active_fraction: Float[Tensor, "layer head_index"]
    bimodality: Float[Tensor, "layer head_index"]  # Sarle's coefficient; > 5/9 hints bimodal
    histogram: Float[Tensor, "layer head_index bin"]  # fraction of queries per first-token bin
    attention_by_position: Float[Tensor, "layer head_index pos"]
    active_by_position: Float[Tensor, "layer head_index pos"]
    value_norm_first: Float[Tensor, "layer head_index"]
    value_norm_rest: Float[Tensor, "layer head_index"]
    value_norm_active: Float[Tensor, "layer head_index"]  # attention-weighted, active queries
    value_norm_dormant: Float[Tensor, "layer head_index"]
    output_norm_active: Float[Tensor, "layer head_index"]  # ||z W_O||
    output_norm_dormant: Float[Tensor, "layer head_index"]
    bands: dict[str, Float[Tensor, "layer head_index band"]]  # see `scan_heads`
    band_labels: tuple[str, ...]
    band_frequencies: Float[Tensor, " band"]
    rotary: bool
    best_lift: Float[Tensor, "layer head_index"]
    if_else_score: Float[Tensor, "layer head_index"]
    modes: tuple[tuple[Mode, ...], ...]  # [layer][head]
    evidence: tuple[tuple[tuple[str, ...], ...], ...]
    triggers: tuple[tuple[tuple[Trigger, ...], ...], ...]
    thresholds: Thresholds
    n_prompts: int
    n_queries: int
    bos: Bos
    max_tokens: int
    model_name: str = ""
    uncertainty: Uncertainty | None = None  # bootstrap over prompts (sinkmech.dormant.queries)
    sweep: tuple[dict, ...] | None = None  # labels at other (high, low) cuts
    records: QueryRecords | None = None  # per-query records (not written to JSON)

    @property
    def n_layers(self) -> int:
        return self.first_key_attention_excl_q0.shape[0]

    @property
    def n_heads(self) -> int:
        return self.first_key_attention_excl_q0.shape[1]

    def mode(self, layer: int, head: int) -> Mode:
        return self.modes[layer][head]

    def mode_counts(self) -> dict[Mode, int]:
        """How many heads carry each label, in `MODES` order."""
        return {m: sum(row.count(m) for row in self.modes) for m in MODES}

    def trigger_text(self, layer: int, head: int, n: int = 3) -> str:
        """The head's top `n` triggers on one line (see `trigger_text`)."""
        return trigger_text(self.triggers[layer][head], n)

    def if_else_heads(self) -> list[tuple[int, int]]:
        """Heads labelled if_else, best score first."""
        return [lh for lh in self.ranked() if self.mode(*lh) == "if_else"]

    def ranked(self) -> list[tuple[int, int]]:
        """All heads by if_else_score, then best trigger lift."""
        key = self.if_else_score.flatten() * 1e6 + self.best_lift.flatten().clamp(max=1e5)
        order = torch.argsort(key, descending=True, stable=True)
        return [(int(i) // self.n_heads, int(i) % self.n_heads) for i in order]

    def top_trigger(self, layer: int, head: int) -> Trigger | None:
        """The trigger the if_else rule judges (`triggers.chosen_trigger`), or None."""
        return chosen_trigger(self.triggers[layer][head], self.thresholds.min_lift)

    def trigger_split(self) -> tuple[list[int], list[int]]:
        """(selection, validation) prompt indices of the triggers: disjoint."""
        return split_prompts(self.n_prompts)

    def head_summary(self, layer: int, head: int) -> dict:
        """The JSON entry of one head (the `heads` contract plus evidence).
        `trigger_selected_on` / `trigger_validated_on`: the prompt indices that
        chose the head's trigger and those that judged it (disjoint);
        `validated_lift`: the chosen trigger's lift on the latter (None: no
        trigger); `trigger_test` / `trigger_p`: the test that judged it there
        ("prompt_t": prompts as units) and its p-value (`trigger_p_perm`: the permutation test over prompts
        beside it, secondary); `trigger_coverage`: the share of the head's active queries on the validation prompts
        that have the trigger at its place (`share`) and that share beyond what the head would do if it
        ignored tokens (`beyond_chance`); `uncertainty`: bootstrap intervals over prompts."""
        def num(x: Tensor) -> float | None:
            v = float(x)
            return None if math.isnan(v) else v

        l, h = layer, head
        top = self.top_trigger(l, h)
        selected, validated = self.trigger_split()
        u = self.uncertainty
        return {
            "layer": l,
            "head": h,
            "mode": self.modes[l][h],
            "if_else_score": num(self.if_else_score[l, h]),
            "first_key_attention_excl_q0": num(self.first_key_attention_excl_q0[l, h]),
            "dormant_fraction": num(self.dormant_fraction[l, h]),
            "active_fraction": num(self.active_fraction[l, h]),
            "bimodality": num(self.bimodality[l, h]),
            "value_norm_first": num(self.value_norm_first[l, h]),
            "value_norm_rest": num(self.value_norm_rest[l, h]),
            "value_norm_active": num(self.value_norm_active[l, h]),
            "value_norm_dormant": num(self.value_norm_dormant[l, h]),
            "output_norm_active": num(self.output_norm_active[l, h]),
            "output_norm_dormant": num(self.output_norm_dormant[l, h]),
            "triggers": [t.to_dict() for t in self.triggers[l][h]],
            "trigger": None if top is None else top.to_dict(),
            "trigger_selected_on": selected,
            "trigger_validated_on": validated,
            "validated_lift": None if top is None else top.validated_lift,
            "trigger_test": None if top is None else top.trigger_test,
            "trigger_p": None if top is None else top.trigger_p,
            "trigger_p_perm": None if top is None else top.trigger_p_perm,
            "trigger_coverage": None if top is None or top.coverage is None else {
                "share": top.coverage, "beyond_chance": top.coverage_beyond_chance,
                "n_active": top.n_active_validated, "on": "validation prompts"},
            "uncertainty": None if u is None else {
                "dormant_fraction_ci": u.dormant_fraction_ci[l, h].tolist(),
                "active_fraction_ci": u.active_fraction_ci[l, h].tolist(),
                "bimodality_ci": u.bimodality_ci[l, h].tolist(),
                "label_agreement": num(u.label_agreement[l, h]),
            },
            "evidence": list(self.evidence[l][h]),
        }

    def profile(self, layer: int, head: int) -> dict:
        """Everything about one head: summary, histogram, per-position rates, bands."""
        l, h = layer, head
        out = self.head_summary(l, h)
        out["histogram"] = self.histogram[l, h].tolist()
        out["attention_by_position"] = self.attention_by_position[l, h].tolist()
        out["active_by_position"] = self.active_by_position[l, h].tolist()
        out["bands"] = {
            "rotary": self.rotary,
            "labels": list(self.band_labels),
            "frequencies": self.band_frequencies.tolist(),
            **{k: v[l, h].tolist() for k, v in self.bands.items()},
        }
        return out

    def to_dataframe(self):
        """Long format: one row per (layer, head)."""
        import pandas as pd

        rows = [self.head_summary(l, h) for l in range(self.n_layers) for h in range(self.n_heads)]
        for r in rows:
            r["triggers"] = trigger_text(r["triggers"], 3, sep="; ")
            top = r.pop("trigger")
            r["trigger_validated"] = None if top is None else top["validated"]
            cov = r.pop("trigger_coverage") or {}
            r["trigger_coverage"], r["trigger_coverage_beyond_chance"] = cov.get("share"), cov.get("beyond_chance")
            r.pop("trigger_selected_on")
            r.pop("trigger_validated_on")
            u = r.pop("uncertainty") or {}
            for k, ci in u.items():
                if k.endswith("_ci"):
                    r[k.removesuffix("_ci") + "_lo"], r[k.removesuffix("_ci") + "_hi"] = ci
                else:
                    r[k] = ci
            r["evidence"] = "; ".join(r["evidence"])
        return pd.DataFrame(rows)

    def to_dict(self, *, profiles: bool = False) -> dict:
        """The `heads` JSON contract; `profiles` adds each head's histogram,
        per-position rates and bands. NaN (a mode that never occurred) is
        written as null by `to_json`."""
        heads = [
            self.profile(l, h) if profiles else self.head_summary(l, h)
            for l in range(self.n_layers)
            for h in range(self.n_heads)
        ]
        return {
            # the labels hang on the cut: the sweep comes first, the default cut's labels after it
            "sweep": None if self.sweep is None else list(self.sweep),
            "model": self.model_name,
            "bos": self.bos,
            "max_tokens": self.max_tokens,
            "n_prompts": self.n_prompts,
            "n_queries": self.n_queries,
            "rotary": self.rotary,
            "thresholds": vars(self.thresholds),
            "mode_counts": self.mode_counts(),
            "mode_meaning": mode_meaning(self.thresholds),
            "trigger_selected_on": self.trigger_split()[0],
            "trigger_validated_on": self.trigger_split()[1],
            "bootstrap": None if self.uncertainty is None else {"n_boot": self.uncertainty.n_boot,
                                                                 "level": self.uncertainty.level},
            "heads": heads,
        }
