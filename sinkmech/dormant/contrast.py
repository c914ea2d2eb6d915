"""Domain-dormant heads: heads whose mode differs between two corpora
(Guo et al. 2024 found heads dormant on prose and active on code).

Two scans (`scan_heads`, one per corpus) keep every query's first-token
attention. A head's contrast is the difference of its dormant fractions,
corpus A minus corpus B. What chooses never judges: heads are chosen on the
even-numbered prompts of both corpora (|difference| >= `min_diff`) and
confirmed on the odd-numbered ones, where the difference must keep its sign,
reach `min_diff` / 2, and carry a bootstrap interval (prompts resampled within
each corpus) that excludes zero at the Bonferroni level `level` over the
chosen heads.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from sinkmech.dormant.result import HeadScan
from sinkmech.results import Result


@dataclass(frozen=True)
class ContrastHead:
    """One head chosen on the selection halves, with its numbers on the held-out halves."""

    layer: int
    head: int
    dormant_a: float  # dormant fraction on all of corpus A
    dormant_b: float
    mode_a: str  # the scans' labels
    mode_b: str
    diff_selected: float  # dormant fraction A - B, selection halves
    diff_validated: float  # the same, held-out halves
    diff_validated_ci: tuple[float, float]
    confirmed: bool

    def to_dict(self) -> dict:
        d = asdict(self)
        d["diff_validated_ci"] = list(self.diff_validated_ci)
        return d


@dataclass(frozen=True)
class HeadContrast(Result):
    """Heads whose dormant fraction differs between corpus A and corpus B."""

    heads: tuple[ContrastHead, ...]  # chosen on the selection halves, largest |difference| first
    name_a: str
    name_b: str
    n_prompts_a: int
    n_prompts_b: int
    high: float
    low: float
    min_diff: float
    level: float  # family-wise; each interval is at level 1 - (1 - level) / len(heads)
    mode_counts_a: dict
    mode_counts_b: dict

    def confirmed(self) -> list[ContrastHead]:
        return [h for h in self.heads if h.confirmed]

    def to_dict(self) -> dict:
        return {"name_a": self.name_a, "name_b": self.name_b, "n_prompts_a": self.n_prompts_a,
                "n_prompts_b": self.n_prompts_b, "high": self.high, "low": self.low, "min_diff": self.min_diff,
                "level": self.level, "mode_counts_a": self.mode_counts_a, "mode_counts_b": self.mode_counts_b,
                "selected_on": "even-numbered prompts of each corpus", "validated_on": "odd-numbered prompts",
                "n_chosen": len(self.heads), "n_confirmed": len(self.confirmed()),
                "heads": [h.to_dict() for h in self.heads]}

    def to_dataframe(self):
        """Long format: one row per chosen head."""
        import pandas as pd

        return pd.DataFrame([{**h.to_dict(), "name_a": self.name_a, "name_b": self.name_b} for h in self.heads])


def _per_prompt(scan: HeadScan) -> tuple[Tensor, Tensor]:
    """(dormant queries [prompt, layer, head], queries [prompt]) from the scan's records."""
    rec = scan.records
    if rec is None:
        raise ValueError("the scan has no per-query records (a merged shard?): run scan_heads on the corpus itself")
    dorm, _ = rec.fractions(scan.thresholds.high, scan.thresholds.low)
    return dorm, rec.valid.sum(-1).double()


def contrast_heads(scan_a: HeadScan, scan_b: HeadScan, *, name_a: str = "A", name_b: str = "B",
                   min_diff: float = 0.2, level: float = 0.95, n_boot: int = 1000, seed: int = 0) -> HeadContrast:
    """Heads whose dormant fraction differs between the corpora of `scan_a`
    and `scan_b` (same model, same thresholds), chosen on one half of each
    corpus and confirmed on the other (see the module docstring).

    Returns:
        HeadContrast, its heads ordered by |selection difference|.
    """
    if (scan_a.n_layers, scan_a.n_heads) != (scan_b.n_layers, scan_b.n_heads):
        raise ValueError("the two scans come from different models")
    if (scan_a.thresholds.high, scan_a.thresholds.low) != (scan_b.thresholds.high, scan_b.thresholds.low):
        raise ValueError("the two scans used different high / low thresholds")
    if min(scan_a.n_prompts, scan_b.n_prompts) < 4:
        raise ValueError("a contrast needs >= 4 prompts per corpus (two per half)")
    if not 0.0 < min_diff <= 1.0 or not 0.0 < level < 1.0:
        raise ValueError(f"need 0 < min_diff <= 1 and 0 < level < 1, got {min_diff}, {level}")
    da, na = _per_prompt(scan_a)
    db, nb = _per_prompt(scan_b)
    half_a, half_b = torch.arange(len(na)) % 2, torch.arange(len(nb)) % 2

    def frac(d: Tensor, n: Tensor, rows: Tensor) -> Tensor:
        return d[rows].sum(0) / n[rows].sum()

    sel = frac(da, na, half_a == 0) - frac(db, nb, half_b == 0)
    val = frac(da, na, half_a == 1) - frac(db, nb, half_b == 1)
    chosen = [(int(l), int(h)) for l, h in (sel.abs() >= min_diff).nonzero().tolist()]
    chosen.sort(key=lambda lh: -float(sel[lh].abs()))
    g = torch.Generator().manual_seed(seed)
    rows_a, rows_b = (half_a == 1).nonzero()[:, 0], (half_b == 1).nonzero()[:, 0]
    ia = rows_a[torch.randint(0, len(rows_a), (n_boot, len(rows_a)), generator=g)]
    ib = rows_b[torch.randint(0, len(rows_b), (n_boot, len(rows_b)), generator=g)]
    boot = da[ia].sum(1) / na[ia].sum(1)[:, None, None] - db[ib].sum(1) / nb[ib].sum(1)[:, None, None]
    alpha = (1 - level) / max(1, len(chosen))
    q = torch.tensor([alpha / 2, 1 - alpha / 2], dtype=boot.dtype)
    ci = torch.quantile(boot, q, dim=0)  # [2, layer, head]
    out = []
    for l, h in chosen:
        s, v, lo, hi = float(sel[l, h]), float(val[l, h]), float(ci[0, l, h]), float(ci[1, l, h])
        ok = (s > 0) == (v > 0) and abs(v) >= min_diff / 2 and not lo <= 0.0 <= hi
        out.append(ContrastHead(l, h, float(scan_a.dormant_fraction[l, h]), float(scan_b.dormant_fraction[l, h]),
                                scan_a.mode(l, h), scan_b.mode(l, h), s, v, (lo, hi), ok))
    return HeadContrast(tuple(out), name_a, name_b, scan_a.n_prompts, scan_b.n_prompts, scan_a.thresholds.high,
                        scan_a.thresholds.low, min_diff, level, scan_a.mode_counts(), scan_b.mode_counts())
