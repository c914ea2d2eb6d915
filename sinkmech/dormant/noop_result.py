"""The no-op check's records (`NoopResult`, `NoopCheck`) and the statistics that
fill them: query masks and matched controls, per-prompt sums to t intervals with
Holm's correction, and where active queries look. The passes: `sinkmech.dormant.noop`.
"""

from __future__ import annotations

import string
import unicodedata
from dataclasses import asdict, dataclass, field

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from sinkmech.loading.backend import Model
from sinkmech.prompts import Bos, token_text
from sinkmech.results import Result
from sinkmech.stats import holm, ratio_t_interval, t_interval, ratio_difference_t_interval


INTERVENTIONS = ("move_to_first", "zero_out", "mean_ablate")
MODES = ("dormant", "active")
LOOKS = ("first", "self", "previous", "second_position", "same_token", "punctuation", "rest")


@dataclass(frozen=True)
class NoopResult:
    """Loss changes (intervened - clean, nats) of intervening on one head: the
    `per_query_*` fields move it onto the first token, the `zero_*` fields
    zero its output (each on its dormant and on its active queries, t
    intervals over prompts); `checks` holds every intervention in full."""

    layer: int
    head: int
    n_dormant: int  # queries forced in the dormant condition
    n_active: int
    delta_loss_dormant: float  # mean over all predicted tokens
    delta_loss_active: float
    per_query_dormant: float | None  # summed loss change / forced queries
    per_query_active: float | None
    per_query_dormant_ci: tuple[float, float] | None = None  # t interval over prompts (NoopCheck.ci_level)
    per_query_active_ci: tuple[float, float] | None = None
    n_prompts_dormant: int = 0  # prompts with at least one forced query
    n_prompts_active: int = 0
    zero_dormant: float | None = None  # zero-out, summed loss change / zeroed queries
    zero_active: float | None = None
    zero_dormant_ci: tuple[float, float] | None = None
    zero_active_ci: tuple[float, float] | None = None
    # "<intervention>_<mode>" -> n_queries, n_prompts, total, per_query (each value, ci, p, p_adjusted,
    # detectable, detectable_adjusted), matched_control (n_queries, per_query, difference)
    checks: dict = field(default_factory=dict)
    active_looks: dict | None = None  # share of the active queries' attention per place (LOOKS), n_queries

    def effects(self) -> dict[str, tuple[float | None, tuple[float, float] | None]]:
        """(per-query effect, interval) of move to first and zero out, by `<intervention>_<mode>`."""
        return {"move_to_first_dormant": (self.per_query_dormant, self.per_query_dormant_ci),
                "move_to_first_active": (self.per_query_active, self.per_query_active_ci),
                "zero_out_dormant": (self.zero_dormant, self.zero_dormant_ci),
                "zero_out_active": (self.zero_active, self.zero_active_ci)}

    def detectable(self) -> dict[str, bool | None]:
        """Per effect: does its interval exclude zero (None: no interval)."""
        return {k: None if ci is None else not ci[0] <= 0.0 <= ci[1] for k, (_, ci) in self.effects().items()}

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("per_query_dormant_ci", "per_query_active_ci", "zero_dormant_ci", "zero_active_ci"):
            d[k] = None if d[k] is None else list(d[k])
        d["detectable"] = self.detectable()
        return d


@dataclass(frozen=True)
class NoopCheck(Result):
    results: tuple[NoopResult, ...]
    loss_clean: float  # mean next-token loss of the clean run
    n_tokens: int  # predicted tokens the means run over
    bos: Bos
    high: float
    low: float
    ci_level: float = 0.95
    n_boot: int = 0  # no bootstrap: the intervals are t intervals over prompts
    prompt_indices: tuple[int, ...] | None = None  # which prompts of the corpus it ran on, when known
    n_intervals: int = 0  # the Holm family: every interval the check reports

    def to_dataframe(self):
        import pandas as pd

        return pd.DataFrame([r.to_dict() for r in self.results])

    def to_dict(self) -> dict:
        return {"loss_clean": self.loss_clean, "n_tokens": self.n_tokens, "bos": self.bos,
                "high": self.high, "low": self.low, "ci_level": self.ci_level, "n_boot": self.n_boot,
                "interval": "Student t over prompts (per-query means: the ratio's linearisation)",
                "correction": f"Holm over the {self.n_intervals} intervals of this check (p_adjusted)",
                "n_intervals": self.n_intervals,
                "prompt_indices": None if self.prompt_indices is None else list(self.prompt_indices),
                "heads": [r.to_dict() for r in self.results]}


def force_mask(first: Float[Tensor, "batch query_pos"], valid: Bool[Tensor, "batch query_pos"], *,
               high: float, low: float) -> tuple[Tensor, Tensor]:
    """(dormant, active) query masks from first-token attention."""
    return (first >= high) & valid, (first <= low) & valid


def matched_control(mode: Bool[Tensor, "batch pos"], other: Bool[Tensor, "batch pos"],
                    valid: Bool[Tensor, "batch pos"]) -> Bool[Tensor, "batch pos"]:
    """As many queries as `mode` holds in each prompt, from `other` at the
    nearest unused position (ties: the earlier), then from the valid queries
    in neither mask where `other` runs out; fewer where both run out."""
    out = torch.zeros_like(mode)
    between = valid & ~mode & ~other
    for b in range(mode.shape[0]):
        pools = [other[b].nonzero()[:, 0].tolist(), between[b].nonzero()[:, 0].tolist()]
        for p in mode[b].nonzero()[:, 0].tolist():
            pool = next((x for x in pools if x), None)
            if pool is None:
                break
            j = min(range(len(pool)), key=lambda i: (abs(pool[i] - p), pool[i]))
            out[b, pool.pop(j)] = True
    return out


def _summarise(sums: dict, controls: bool, level: float) -> dict:
    """Per `<intervention>_<mode>`: counts, total and per-query effect with t
    intervals, and the matched control with the difference from it."""
    out = {}
    for how in INTERVENTIONS:
        for mode in MODES:
            d, q = sums[(how, mode, "mode")]
            n = len(d)
            entry = {"n_queries": int(q.sum()), "n_prompts": int((q > 0).sum()),
                     "total": _effect(t_interval(d, level=level, scale=float(n)) if q.sum() > 0 else None),
                     "per_query": _effect(ratio_t_interval(d, q, level=level)), "matched_control": None}
            if controls:
                dc, qc = sums[(how, mode, "control")]
                entry["matched_control"] = {
                    "n_queries": int(qc.sum()), "n_prompts": int((qc > 0).sum()),
                    "drawn_from": "the other mode at the nearest unused position in the same prompt, then between queries",
                    "per_query": _effect(ratio_t_interval(dc, qc, level=level)),
                    "difference": _effect(ratio_difference_t_interval(d, q, dc, qc, level=level)),
                }
            out[f"{how}_{mode}"] = entry
    return out


def _effect(t: dict | None) -> dict | None:
    if t is None:
        return None
    lo, hi = t["ci"]
    return {"value": t["value"], "ci": [lo, hi], "p": t["p"], "detectable": not lo <= 0.0 <= hi,
            "p_adjusted": None, "detectable_adjusted": None}


def _holm_in_place(checks: dict, alpha: float) -> int:
    """Holm over every interval in `checks` (all heads): fills p_adjusted and
    detectable_adjusted; returns the family's size."""
    effects = []
    for c in checks.values():
        for entry in c.values():
            effects += [entry["total"], entry["per_query"]]
            if entry["matched_control"] is not None:
                effects += [entry["matched_control"]["per_query"], entry["matched_control"]["difference"]]
    effects = [e for e in effects if e is not None]
    for e, p in zip(effects, holm([e["p"] for e in effects])):
        e["p_adjusted"], e["detectable_adjusted"] = p, p < alpha
    return len(effects)


def _punctuation(model: Model, tokens: Tensor) -> Tensor:
    """[d_vocab-like] bool: token ids of `tokens` whose text is punctuation only (no tokenizer: none)."""
    ids = torch.unique(tokens.cpu())
    mask = torch.zeros(int(ids.max()) + 1, dtype=torch.bool)
    if getattr(model, "tokenizer", None) is None:
        return mask
    text = token_text(model)
    for i in ids.tolist():
        t = text(i).strip()
        mask[i] = bool(t) and all(ch in string.punctuation or unicodedata.category(ch).startswith("P") for ch in t)
    return mask


def _looks(pattern: Float[Tensor, "batch query_pos key_pos"], tokens: Int[Tensor, "batch pos"],
           active: Bool[Tensor, "batch query_pos"], punct: Tensor) -> Tensor:
    """Attention mass of the `active` queries on each place of `LOOKS` (each key
    in the first place it fits), summed, then their count: [len(LOOKS) + 1]."""
    B, P, _ = pattern.shape
    q = torch.arange(P)[:, None].expand(P, P)
    k = torch.arange(P)[None, :].expand(P, P)
    same = tokens[:, :, None] == tokens[:, None, :]  # [batch, query, key]
    is_punct = punct[tokens.clamp(max=len(punct) - 1)][:, None, :].expand(B, P, P)
    places = [(k == 0).expand(B, P, P), (k == q).expand(B, P, P), (k == q - 1).expand(B, P, P),
              (k == 1).expand(B, P, P), same & (k < q), is_punct]
    taken = torch.zeros(B, P, P, dtype=torch.bool)
    out = torch.zeros(len(LOOKS) + 1, dtype=torch.float64)
    w = pattern * active[:, :, None]
    for i, m in enumerate(places):
        m = m & ~taken
        out[i] = float((w * m).sum())
        taken |= m
    out[len(places)] = float((w * ~taken).sum())
    out[-1] = float(active.sum())
    return out
