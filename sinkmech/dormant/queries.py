"""Per-query records of a head scan, and what they allow after the pass: the
labels at any other thresholds (the threshold sweep), and the labels'
uncertainty (a bootstrap over prompts).

A label that hangs on one cut (`high` 0.8, `low` 0.2) says little unless a
reader can see whether it survives another; a fraction measured on a few dozen
prompts says little without its interval. Both need the per-query first-token
attention, which the scan keeps here (float32 and int32: 12 bytes per
(prompt, layer, head, position)). Definitions: `sinkmech.dormant.labels`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from sinkmech.dormant.labels import MODES, HeadStats, Mode, Thresholds, classify
from sinkmech.dormant.triggers import TriggerCounter, chosen_trigger

# (high, low) cuts of the sweep: the default 0.8 / 0.2 and looser and stricter ones
SWEEP_HIGH = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4)
SWEEP_LOW = (0.2, 0.1, 0.05)


@dataclass(frozen=True)
class QueryRecords:
    """What every head did on every query of the scan (CPU tensors)."""

    first: Float[Tensor, "prompt layer head_index pos"]  # attention on the first token
    key: Int[Tensor, "prompt layer head_index pos"]  # most attended key other than the first
    out: Float[Tensor, "prompt layer head_index pos"]  # head output norm ||z W_O||
    tokens: Int[Tensor, "prompt pos"]
    valid: Bool[Tensor, "prompt pos"]  # real queries (query 0 and padding excluded)

    def fractions(self, high: float, low: float) -> tuple[Tensor, Tensor]:
        """Per prompt and head: (dormant, active) query counts [prompt, layer, head]."""
        v = self.valid[:, None, None, :]
        return ((self.first >= high) & v).sum(-1).double(), ((self.first <= low) & v).sum(-1).double()


def stats_at(rec: QueryRecords, high: float, low: float, rows: Tensor | None = None) -> HeadStats:
    """The label inputs at one cut, over all prompts (or `rows`)."""
    first, out, valid = rec.first, rec.out, rec.valid
    if rows is not None:
        first, out, valid = first[rows], out[rows], valid[rows]
    v = valid[:, None, None, :]
    dorm, act = (first >= high) & v, (first <= low) & v
    n = float(valid.sum())
    nd, na = dorm.sum((0, 3)).double(), act.sum((0, 3)).double()
    return HeadStats((nd / n).float(), (na / n).float(), ((out * dorm).sum((0, 3)) / nd).float(),
                     ((out * act).sum((0, 3)) / na).float())


def triggers_at(rec: QueryRecords, th: Thresholds, heads: list[tuple[int, int]], *, decode, top_k: int = 5) -> dict:
    """The triggers of `heads` at the thresholds `th`, counted from the
    records exactly as `scan_heads` streams them (selection / validation
    halves by prompt parity; Bonferroni over every head of the model)."""
    if not heads:
        return {}
    N, L, H, P = rec.first.shape
    ls, hs = torch.tensor([l for l, _ in heads]), torch.tensor([h for _, h in heads])
    first = rec.first[:, ls, hs]  # [prompt, k, pos]
    active = (first <= th.low) & rec.valid[:, None, :]
    counter = TriggerCounter(1, len(heads), int(rec.tokens.max()) + 1, P, "cpu")
    ids = torch.arange(N)
    counter.add_tokens(rec.tokens, rec.valid, ids)
    counter.add_layer(0, rec.tokens, active, rec.key[:, ls, hs].long(), ids)
    found, _ = counter.finalize(decode=decode, min_count=th.min_count, top_k=top_k,
                                min_prompts=th.min_prompts, min_lift=th.min_lift, alpha=th.alpha, n_tests=L * H)
    return {lh: found[0][i] for i, lh in enumerate(heads)}


def could_be_if_else(stats: HeadStats, th: Thresholds) -> list[tuple[int, int]]:
    """Heads that pass every if_else criterion but the trigger (only these need one)."""
    d, a = stats.dormant_fraction, stats.active_fraction
    ratio = stats.output_norm_dormant / stats.output_norm_active
    ok = ((d >= th.if_else_min_dormant) & (a >= th.if_else_min_active) & ((1 - d - a) <= th.if_else_max_between)
          & (ratio <= th.max_output_ratio))
    return [(int(l), int(h)) for l, h in ok.nonzero().tolist()]


def modes_at(rec: QueryRecords, th: Thresholds, *, decode) -> tuple[tuple[tuple[Mode, ...], ...], dict]:
    """Every head's mode at the thresholds `th`, from the records alone, and
    the triggers of the heads that needed one."""
    stats = stats_at(rec, th.high, th.low)
    L, H = stats.dormant_fraction.shape
    trig = triggers_at(rec, th, could_be_if_else(stats, th), decode=decode)
    triggers = [[list(trig.get((l, h), ())) for h in range(H)] for l in range(L)]
    best = torch.tensor([[max((t.lift for t in triggers[l][h]), default=0.0) for h in range(H)] for l in range(L)])
    n_queries = int(rec.valid.sum())
    return classify(stats, triggers, best, th, n_queries=n_queries).modes, trig


def threshold_sweep(rec: QueryRecords, th: Thresholds, *, decode, highs=SWEEP_HIGH, lows=SWEEP_LOW) -> list[dict]:
    """Mode counts and if_else heads at every (high, low) cut with low < high,
    every other threshold as in `th`. One row per cut."""
    rows = []
    for high in highs:
        for low in lows:
            if not low < high:
                continue
            cut = replace(th, high=high, low=low)
            modes, trig = modes_at(rec, cut, decode=decode)
            if_else = [(l, h) for l, row in enumerate(modes) for h, m in enumerate(row) if m == "if_else"]
            rows.append({
                "high": high, "low": low,
                "mode_counts": {m: sum(r.count(m) for r in modes) for m in MODES},
                "if_else_heads": [f"L{l}.H{h}" for l, h in if_else],
                "triggers": {f"L{l}.H{h}": chosen_trigger(trig[(l, h)], cut.min_lift).token for l, h in if_else},
            })
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
    N = rec.first.shape[0]
    v = rec.valid[:, None, None, :]
    f = rec.first.double() * v
    dorm, act = (rec.first >= th.high) & v, (rec.first <= th.low) & v
    per = {  # per-prompt sums [prompt, layer, head]
        "n": v.sum(-1).double().expand(-1, *rec.first.shape[1:3]),
        "d": dorm.sum(-1).double(), "a": act.sum(-1).double(),
        "od": (rec.out.double() * dorm).sum(-1), "oa": (rec.out.double() * act).sum(-1),
        **{f"m{i}": (f ** i).sum(-1) for i in (1, 2, 3, 4)},
    }
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, N, (n_boot, N), generator=g)
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
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)

    def ci(xs: list[Tensor]) -> Tensor:
        return torch.nanquantile(torch.stack(xs), q, dim=0).permute(1, 2, 0).float()

    return Uncertainty(ci(d_s), ci(a_s), ci(b_s), (agree / n_boot).float(), n_boot, level)
