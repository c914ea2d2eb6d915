"""Per-query records of a head scan, and what they allow after the pass: the
labels at any cut of the threshold sweep, and the labels' uncertainty (a
bootstrap over prompts).

A label that hangs on one cut (`high` 0.5, `low` 0.2) says little unless a
reader can see whether it survives another; a fraction measured on a few dozen
prompts says little without its interval. The scan keeps only what these need,
so that a partial result of a shard stays small (`sinkmech.sharding.dormant`): per
query, how many of the sweep's `low` cuts its first-token attention is under
and, for an active query, its most attended key (one int32, zero elsewhere);
per prompt and head, the counts and sums the bootstrap resamples at the scan's
own cut; over all prompts, the counts and output sums at every cut.
Definitions: `sinkmech.dormant.labels`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from sinkmech.dormant.labels import MODES, HeadStats, Mode, Thresholds, classify
from sinkmech.dormant.triggers import TriggerCounter, chosen_trigger, judge_by_prompt
from sinkmech.hooks import head_label
from sinkmech.stats import percentile_interval, resamples

# (high, low) cuts of the sweep: the default 0.5 / 0.2 (docs/dormant_calibration.md) and stricter and looser ones
SWEEP_HIGH = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4)
SWEEP_LOW = (0.2, 0.1, 0.05)
# per prompt and head at the scan's cut (the bootstrap's resampling units): queries
# dormant / active, output norm summed over them, and the first-token attention's raw moments
PROMPT_SUMS = ("d", "a", "od", "oa", "m1", "m2", "m3", "m4")
LEVELS = 8  # key_level = key * LEVELS + level: room for 7 low cuts


def cuts(th: Thresholds) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(highs ascending, lows descending): the sweep's cuts and the scan's own."""
    highs = tuple(sorted(set(SWEEP_HIGH) | {th.high}))
    lows = tuple(sorted(set(SWEEP_LOW) | {th.low}, reverse=True))
    if len(lows) >= LEVELS:
        raise ValueError(f"at most {LEVELS - 1} low cuts")
    return highs, lows


@dataclass(frozen=True)
class QueryRecords:
    """What the sweep, the bootstrap and a contrast need of every query (CPU tensors).

    `key_level[p, l, h, t]` = key * LEVELS + level: `level` counts the `lows`
    (descending) that the query's first-token attention is <= (so it is active
    at lows[j] when level > j), `key` is its most attended key other than the
    first, kept where it is active at lows[0] (0 elsewhere). `per_prompt` holds
    `PROMPT_SUMS` at the scan's cut [prompt, layer, head_index]; `cut_sums` the
    counts and output-norm sums over all prompts at every cut: "n_dormant",
    "out_dormant" [high, layer, head_index], "n_active", "out_active" [low, ...].
    """

    key_level: Int[Tensor, "prompt layer head_index pos"]
    per_prompt: dict[str, Float[Tensor, "prompt layer head_index"]]
    cut_sums: dict[str, Float[Tensor, "cut layer head_index"]]
    highs: tuple[float, ...]
    lows: tuple[float, ...]
    cut: tuple[float, float]  # the scan's (high, low)
    tokens: Int[Tensor, "prompt pos"]
    valid: Bool[Tensor, "prompt pos"]  # real queries (query 0 and padding excluded)

    def active(self, low: float) -> Bool[Tensor, "prompt layer head_index pos"]:
        """Queries whose first-token attention is <= `low` (one of `lows`)."""
        return (self.key_level % LEVELS) > self._index(self.lows, low, "low")

    @property
    def key(self) -> Int[Tensor, "prompt layer head_index pos"]:
        return self.key_level // LEVELS

    @staticmethod
    def _index(values: tuple[float, ...], x: float, name: str) -> int:
        if x not in values:
            raise ValueError(f"the records hold the {name} cuts {values}, not {x}")
        return values.index(x)

    def fractions(self, high: float, low: float) -> tuple[Tensor, Tensor]:
        """Per prompt and head: (dormant, active) query counts [prompt, layer, head], at the scan's cut."""
        if (high, low) != self.cut:
            raise ValueError(f"per-prompt counts are kept at the scan's cut {self.cut} only, not {(high, low)}")
        return self.per_prompt["d"], self.per_prompt["a"]


def record_queries(first: Float[Tensor, "batch head_index pos"], key_index: Int[Tensor, "batch head_index pos"],
                   out: Float[Tensor, "batch head_index pos"], valid_q: Bool[Tensor, "batch pos"],
                   th: Thresholds) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]:
    """One layer of one batch as records: key_level [batch, head, pos], the
    per-prompt sums at the scan's cut [batch, head] and the cut sums [cut, head]."""
    highs, lows = cuts(th)
    v = valid_q[:, None, :]
    level = sum(((first <= low) & v).long() for low in lows)
    key_level = torch.where(level > 0, key_index.long(), 0) * LEVELS + level
    dorm, act = (first >= th.high) & v, (first <= th.low) & v
    f, o = first.double() * v, out.double()
    per = {"d": dorm.sum(-1).double(), "a": act.sum(-1).double(), "od": (o * dorm).sum(-1), "oa": (o * act).sum(-1),
           **{f"m{i}": (f ** i).sum(-1) for i in (1, 2, 3, 4)}}
    at = {"dormant": [(first >= h) & v for h in highs], "active": [(first <= low) & v for low in lows]}
    sums = {}
    for mode, masks in at.items():
        sums[f"n_{mode}"] = torch.stack([m.double().sum((0, 2)) for m in masks])
        sums[f"out_{mode}"] = torch.stack([(o * m).sum((0, 2)) for m in masks])
    return key_level, per, sums


def stats_at(rec: QueryRecords, high: float, low: float) -> HeadStats:
    """The label inputs at one cut, over all prompts."""
    i, j = rec._index(rec.highs, high, "high"), rec._index(rec.lows, low, "low")
    n = float(rec.valid.sum())
    nd, na = rec.cut_sums["n_dormant"][i], rec.cut_sums["n_active"][j]
    return HeadStats((nd / n).float(), (na / n).float(), (rec.cut_sums["out_dormant"][i] / nd).float(),
                     (rec.cut_sums["out_active"][j] / na).float())


def triggers_at(rec: QueryRecords, th: Thresholds, heads: list[tuple[int, int]], *, decode, top_k: int = 5) -> dict:
    """The triggers of `heads` at the thresholds `th`, counted from the
    records exactly as `scan_heads` streams them (selection / validation
    halves by prompt parity; Bonferroni over every head of the model)."""
    if not heads:
        return {}
    N, L, H, P = rec.key_level.shape
    ls, hs = torch.tensor([l for l, _ in heads]), torch.tensor([h for _, h in heads])
    active = rec.active(th.low)[:, ls, hs] & rec.valid[:, None, :]  # [prompt, k, pos]
    counter = TriggerCounter(1, len(heads), int(rec.tokens.max()) + 1, P, "cpu")
    ids = torch.arange(N)
    counter.add_tokens(rec.tokens, rec.valid, ids)
    counter.add_layer(0, rec.tokens, active, rec.key[:, ls, hs], ids)
    found, _ = counter.finalize(decode=decode, min_count=th.min_count, top_k=top_k,
                                min_prompts=th.min_prompts, min_lift=th.min_lift, alpha=th.alpha, n_tests=L * H)
    found = judge_by_prompt(found, rec.tokens, rec.valid, active[:, None], rec.key[:, ls, hs][:, None],
                            rule=th.trigger_rule(L * H))
    return {lh: found[0][i] for i, lh in enumerate(heads)}


def could_be_if_else(stats: HeadStats, th: Thresholds) -> list[tuple[int, int]]:
    """Heads that pass every if_else criterion but the trigger (only these need one)."""
    d, a = stats.dormant_fraction, stats.active_fraction
    ratio = stats.output_norm_dormant / stats.output_norm_active
    ok = ((d >= th.if_else_min_dormant) & (a >= th.if_else_min_active) & ((1 - d - a) <= th.if_else_max_between)
          & (ratio <= th.max_output_ratio))
    return [(int(l), int(h)) for l, h in ok.nonzero().tolist()]


def modes_at(rec: QueryRecords, th: Thresholds, *, decode, counted: dict | None = None
             ) -> tuple[tuple[tuple[Mode, ...], ...], dict]:
    """Every head's mode at the thresholds `th`, from the records alone, and
    the triggers of the heads that needed one. `counted`: `triggers_at` at
    this low cut for at least those heads (they do not depend on the high
    cut), else counted here."""
    stats = stats_at(rec, th.high, th.low)
    L, H = stats.dormant_fraction.shape
    need = could_be_if_else(stats, th)
    trig = {lh: counted[lh] for lh in need} if counted is not None else triggers_at(rec, th, need, decode=decode)
    triggers = [[list(trig.get((l, h), ())) for h in range(H)] for l in range(L)]
    best = torch.tensor([[max((t.lift for t in triggers[l][h]), default=0.0) for h in range(H)] for l in range(L)])
    n_queries = int(rec.valid.sum())
    return classify(stats, triggers, best, th, n_queries=n_queries).modes, trig


def sweep_cuts(highs=SWEEP_HIGH, lows=SWEEP_LOW) -> list[tuple[float, float]]:
    """The (high, low) cuts of the threshold sweep: every pair with low < high."""
    return [(high, low) for high in highs for low in lows if low < high]


def threshold_sweep(rec: QueryRecords, th: Thresholds, *, decode, highs=SWEEP_HIGH, lows=SWEEP_LOW,
                    on_cut: Callable[[], object] | None = None) -> list[dict]:
    """Mode counts and if_else heads at every (high, low) cut with low < high,
    every other threshold as in `th`. One row per cut; `on_cut` is called
    after each (a progress bar's step)."""
    cuts = sweep_cuts(highs, lows)
    # a head's triggers depend on the low cut alone (its active queries): counted once per low
    # for every head that needs one at any of its high cuts
    by_low = {}
    for low in dict.fromkeys(low for _, low in cuts):
        at_low = [replace(th, high=high, low=low) for high, l in cuts if l == low]
        need = {lh for cut in at_low for lh in could_be_if_else(stats_at(rec, cut.high, low), cut)}
        by_low[low] = triggers_at(rec, at_low[0], sorted(need), decode=decode)
    rows = []
    for high, low in cuts:
        cut = replace(th, high=high, low=low)
        modes, trig = modes_at(rec, cut, decode=decode, counted=by_low[low])
        if_else = [(l, h) for l, row in enumerate(modes) for h, m in enumerate(row) if m == "if_else"]
        rows.append({
            "high": high, "low": low,
            "mode_counts": {m: sum(r.count(m) for r in modes) for m in MODES},
            "if_else_heads": [head_label(l, h) for l, h in if_else],
            "triggers": {head_label(l, h): chosen_trigger(trig[(l, h)], cut.min_lift).token for l, h in if_else},
        })
        if on_cut is not None:
            on_cut()
    return rows


@dataclass(frozen=True)
class Uncertainty:
    """Bootstrap over prompts (resampled with replacement) of each head's
    continuous scores, and how often its label comes out the same."""

    dormant_fraction_ci: Float[Tensor, "layer head_index 2"]
    active_fraction_ci: Float[Tensor, "layer head_index 2"]
    bimodality_ci: Float[Tensor, "layer head_index 2"]
    label_agreement: Float[Tensor, "layer head_index"]  # share of resamples giving the scan's label
    n_boot: int
    level: float


def bootstrap_labels(rec: QueryRecords, th: Thresholds, modes, trigger_ok: Bool[Tensor, "layer head_index"], *,
                     n_boot: int = 200, level: float = 0.95, seed: int = 0) -> Uncertainty:
    """Resample prompts `n_boot` times; relabel each head with the scan's
    rules at the scan's thresholds, its trigger verdict held fixed
    (`trigger_ok`: re-validating on resamples of the validation prompts would
    reuse them). Percentile intervals at `level`."""
    if (th.high, th.low) != rec.cut:
        raise ValueError(f"the records hold per-prompt sums at the cut {rec.cut}, not {(th.high, th.low)}")
    N = rec.key_level.shape[0]
    n = rec.valid.sum(-1).double()[:, None, None].expand(-1, *rec.key_level.shape[1:3])
    per = {"n": n, **rec.per_prompt}  # per-prompt sums [prompt, layer, head]
    idx = resamples(N, n_boot=n_boot, seed=seed)
    code = {m: i for i, m in enumerate(MODES)}
    scan_code = torch.tensor([[code[m] for m in row] for row in modes])
    d_s, a_s, b_s, agree = [], [], [], torch.zeros(scan_code.shape, dtype=torch.float64)
    for b in range(n_boot):
        s = {k: x[idx[b]].sum(0) for k, x in per.items()}
        n = s["n"]
        d, a = s["d"] / n, s["a"] / n
        mean = s["m1"] / n
        var = (s["m2"] / n - mean ** 2).clamp(min=0)
        m3 = s["m3"] / n - 3 * mean * s["m2"] / n + 2 * mean ** 3
        m4 = s["m4"] / n - 4 * mean * s["m3"] / n + 6 * mean ** 2 * s["m2"] / n - 3 * mean ** 4
        bim = torch.where(var > 1e-12, (m3 ** 2 / var ** 3 + 1) / (m4 / var ** 2).clamp(min=1e-12), float("nan"))
        ratio = (s["od"] / s["d"]) / (s["oa"] / s["a"])
        shape = ((d >= th.if_else_min_dormant) & (a >= th.if_else_min_active) & ((1 - d - a) <= th.if_else_max_between)
                 & (ratio <= th.max_output_ratio))
        mode = torch.full(d.shape, code["mixed"])
        mode = torch.where(d <= th.active_max_dormant, code["active"], mode)
        mode = torch.where(d >= th.sink_min_dormant, code["sink"], mode)
        mode = torch.where(shape & trigger_ok, code["if_else"], mode)
        mode = torch.where(scan_code == code["insufficient"], code["insufficient"], mode)
        agree += (mode == scan_code).double()
        d_s.append(d)
        a_s.append(a)
        b_s.append(bim)

    def ci(xs: list[Tensor]) -> Tensor:
        return percentile_interval(torch.stack(xs), level, ignore_nan=True).permute(1, 2, 0).float()

    return Uncertainty(ci(d_s), ci(a_s), ci(b_s), (agree / n_boot).float(), n_boot, level)
