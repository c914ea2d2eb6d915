"""Domain-dormant heads: heads whose mode differs between two corpora
(Guo et al. 2024 found heads dormant on prose and active on code).

Two scans (`scan_heads`, one per corpus) keep every query's first-token
attention. A head's contrast is the difference of its dormant fractions,
corpus A minus corpus B. What chooses never judges: heads are chosen on the
even-numbered prompts of both corpora (|difference| >= `min_diff`) and
confirmed on the odd-numbered ones, where the difference must keep its sign,
reach `min_diff` / 2, and carry a bootstrap interval (prompts resampled within
each corpus) that excludes zero at the Bonferroni level `level` over the
chosen heads (`n_boot` >= 20,000 resamples, so the tails hold enough draws).

Two checks against what the rule would find anyway:
- *null contrasts*: the same rule between two halves of one corpus (prompts
  0, 1, 4, 5, ... against 2, 3, 6, 7, ...: each half keeps even and odd
  prompts, which select and confirm as above), for A and for B; a confirmed
  head there is a false positive of the rule at that size;
- *population shift*: the median over all heads of the difference, with its
  interval. A confirmed head is `domain_specific` only where, on the held-out
  prompts, its difference stands out from that median in its own direction
  (the interval of difference - median, at the same Bonferroni level,
  excludes zero): 13 heads moving the same way may be one shift of the
  whole population, not 13 domain-specific heads.

The contrast has power (`power`) only where the null contrasts ran (>= 8
prompts per corpus) and confirmed no head: where the rule confirms heads between
two halves of one corpus, its confirmations between two corpora at that size
say nothing (4 against 4 prompts, the nulls of 8-prompt corpora, confirm heads
by chance: a percentile bootstrap over 2 held-out prompts).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from sinkmech.dormant.result import HeadScan
from sinkmech.hooks import head_label
from sinkmech.results import Result
from sinkmech.stats import percentile_interval, resample_counts


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
    vs_shift: float = 0.0  # diff_validated - the median over heads of the held-out differences
    vs_shift_ci: tuple[float, float] = (0.0, 0.0)
    domain_specific: bool = False  # confirmed, and stands out from the population shift in its own direction

    def to_dict(self) -> dict:
        d = asdict(self)
        d["diff_validated_ci"] = list(self.diff_validated_ci)
        d["vs_shift_ci"] = list(self.vs_shift_ci)
        return d


@dataclass(frozen=True)
class NullContrast:
    """The contrast rule between two halves of one corpus: what it confirms by chance."""

    name: str  # e.g. "prose vs prose"
    n_prompts_a: int
    n_prompts_b: int
    n_chosen: int
    n_confirmed: int
    n_domain_specific: int
    confirmed_heads: tuple[str, ...]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["confirmed_heads"] = list(self.confirmed_heads)
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
    diff_all: Float[Tensor, "layer head_index"] | None = None  # A - B on all prompts, every head
    population_shift: dict | None = None  # median over heads of diff_all, its interval (and the held-out median)
    null_contrasts: tuple[NullContrast, ...] = ()
    at_null_size: NullContrast | None = None  # the real contrast on the nulls' halves (A's first half vs B's)
    n_boot: int = 0
    # {"powered": bool | None, "reason": str}: False where the null contrasts could not run or confirmed a
    # head (the confirmations then say nothing), None where they were not asked for (nulls=False)
    power: dict | None = None

    @property
    def powered(self) -> bool:
        return bool(self.power and self.power["powered"])

    def confirmed(self) -> list[ContrastHead]:
        return [h for h in self.heads if h.confirmed]

    def domain_specific(self) -> list[ContrastHead]:
        return [h for h in self.heads if h.domain_specific]

    def to_dict(self) -> dict:
        return {"name_a": self.name_a, "name_b": self.name_b, "n_prompts_a": self.n_prompts_a,
                "n_prompts_b": self.n_prompts_b, "high": self.high, "low": self.low, "min_diff": self.min_diff,
                "level": self.level, "n_boot": self.n_boot, "mode_counts_a": self.mode_counts_a,
                "mode_counts_b": self.mode_counts_b,
                "selected_on": "even-numbered prompts of each corpus", "validated_on": "odd-numbered prompts",
                "n_chosen": len(self.heads), "n_confirmed": len(self.confirmed()),
                "n_domain_specific": len(self.domain_specific()), "power": self.power,
                "population_shift": self.population_shift,
                "null_contrasts": [n.to_dict() for n in self.null_contrasts],
                "at_null_size": None if self.at_null_size is None else self.at_null_size.to_dict(),
                "heads": [h.to_dict() for h in self.heads],
                "diff_all": None if self.diff_all is None else self.diff_all.tolist()}

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
    return dorm.double(), rec.valid.sum(-1).double()


N_BOOT = 20_000


def _boot_fractions(d: Tensor, n: Tensor, n_boot: int, seed: int) -> Tensor:
    """[n_boot, layer * head] dormant fractions over resamples of the prompts (rows of d)."""
    counts = resample_counts(len(n), n_boot=n_boot, seed=seed)  # [boot, prompt]
    return (counts @ d.reshape(len(n), -1)) / (counts @ n)[:, None]


def _rule(da: Tensor, na: Tensor, ha: Tensor, db: Tensor, nb: Tensor, hb: Tensor, *, min_diff: float,
          level: float, n_boot: int, seed: int) -> list[dict]:
    """The choose-then-confirm rule on per-prompt counts (rows split into
    selection `h == 0` and held-out `h == 1`): one dict per chosen head."""
    L, H = da.shape[1:]

    def frac(d: Tensor, n: Tensor, rows: Tensor) -> Tensor:
        return d[rows].sum(0) / n[rows].sum()

    sel = frac(da, na, ha == 0) - frac(db, nb, hb == 0)
    val = frac(da, na, ha == 1) - frac(db, nb, hb == 1)
    chosen = [(int(l), int(h)) for l, h in (sel.abs() >= min_diff).nonzero().tolist()]
    chosen.sort(key=lambda lh: -float(sel[lh].abs()))
    if not chosen:
        return []
    va, vb = ha == 1, hb == 1
    boot = _boot_fractions(da[va], na[va], n_boot, seed) - _boot_fractions(db[vb], nb[vb], n_boot, seed + 1)
    rel = boot - torch.quantile(boot, 0.5, dim=1, keepdim=True)  # each head against the population's median
    median = float(torch.quantile(val.flatten(), 0.5))
    flat = torch.tensor([l * H + h for l, h in chosen])
    ci, ci_rel = (percentile_interval(x[:, flat], level, n_tests=len(chosen)) for x in (boot, rel))  # [2, chosen]
    out = []
    for j, (l, h) in enumerate(chosen):
        s, v = float(sel[l, h]), float(val[l, h])
        lo, hi, rlo, rhi = (float(ci[0, j]), float(ci[1, j]), float(ci_rel[0, j]), float(ci_rel[1, j]))
        ok = (s > 0) == (v > 0) and abs(v) >= min_diff / 2 and not lo <= 0.0 <= hi
        stands_out = not rlo <= 0.0 <= rhi and (v - median > 0) == (v > 0)
        out.append({"layer": l, "head": h, "diff_selected": s, "diff_validated": v, "ci": (lo, hi), "confirmed": ok,
                    "vs_shift": v - median, "vs_shift_ci": (rlo, rhi), "domain_specific": ok and stands_out})
    return out


def _null(name: str, d: Tensor, n: Tensor, **kw) -> NullContrast:
    """The rule between prompts 0, 1, 4, 5, ... and 2, 3, 6, 7, ... of one corpus."""
    idx = torch.arange(len(n))
    one, two = (idx // 2) % 2 == 0, (idx // 2) % 2 == 1
    rows = _rule(d[one], n[one], idx[one] % 2, d[two], n[two], idx[two] % 2, **kw)
    return NullContrast(name, int(one.sum()), int(two.sum()), len(rows), sum(r["confirmed"] for r in rows),
                        sum(r["domain_specific"] for r in rows),
                        tuple(head_label(r["layer"], r["head"]) for r in rows if r["confirmed"]))


def contrast_heads(scan_a: HeadScan, scan_b: HeadScan, *, name_a: str = "A", name_b: str = "B",
                   min_diff: float = 0.2, level: float = 0.95, n_boot: int = N_BOOT, seed: int = 0,
                   nulls: bool = True) -> HeadContrast:
    """Heads whose dormant fraction differs between the corpora of `scan_a`
    and `scan_b` (same model, same thresholds), chosen on one half of each
    corpus and confirmed on the other, with the population shift and (with
    `nulls`, on >= 8 prompts per corpus) the null contrasts of the module
    docstring.

    Returns:
        HeadContrast, its heads ordered by |selection difference|.
    """
    if (scan_a.n_layers, scan_a.n_heads) != (scan_b.n_layers, scan_b.n_heads):
        raise ValueError("the two scans come from different models")
    if (scan_a.thresholds.high, scan_a.thresholds.low) != (scan_b.thresholds.high, scan_b.thresholds.low):
        raise ValueError("the two scans used different high / low thresholds")
    if min(scan_a.n_prompts, scan_b.n_prompts) < 4:
        raise ValueError("a contrast needs >= 4 prompts per corpus (two per half)")
    if not 0.0 < min_diff <= 1.0 or not 0.0 < level < 1.0 or n_boot < 1:
        raise ValueError(f"need 0 < min_diff <= 1, 0 < level < 1 and n_boot >= 1, got {min_diff}, {level}, {n_boot}")
    da, na = _per_prompt(scan_a)
    db, nb = _per_prompt(scan_b)
    if da.shape == db.shape and torch.equal(da, db) and torch.equal(na, nb):
        raise ValueError("the two scans hold the same per-prompt counts: one corpus twice is no contrast (its "
                         "null contrasts are the within-corpus check)")
    half_a, half_b = torch.arange(len(na)) % 2, torch.arange(len(nb)) % 2
    kw = dict(min_diff=min_diff, level=level, n_boot=n_boot, seed=seed)
    rows = _rule(da, na, half_a, db, nb, half_b, **kw)
    out = [ContrastHead(r["layer"], r["head"], float(scan_a.dormant_fraction[r["layer"], r["head"]]),
                        float(scan_b.dormant_fraction[r["layer"], r["head"]]), scan_a.mode(r["layer"], r["head"]),
                        scan_b.mode(r["layer"], r["head"]), r["diff_selected"], r["diff_validated"], r["ci"],
                        r["confirmed"], r["vs_shift"], r["vs_shift_ci"], r["domain_specific"]) for r in rows]
    L, H = da.shape[1:]
    diff_all = da.sum(0) / na.sum() - db.sum(0) / nb.sum()
    boot = torch.quantile(_boot_fractions(da, na, n_boot, seed + 2) - _boot_fractions(db, nb, n_boot, seed + 3), 0.5, dim=1)
    lo, hi = percentile_interval(boot, 0.95).tolist()
    val = (da[half_a == 1].sum(0) / na[half_a == 1].sum() - db[half_b == 1].sum(0) / nb[half_b == 1].sum())
    shift = {"median": float(torch.quantile(diff_all.flatten(), 0.5)), "ci": [lo, hi], "level": 0.95,
             "on": "all prompts", "median_validated": float(torch.quantile(val.flatten(), 0.5)),
             "n_heads_positive": int((diff_all > 0).sum()), "n_heads_negative": int((diff_all < 0).sum())}
    null_list, at_size = (), None
    if nulls and min(len(na), len(nb)) >= 8:
        null_list = (_null(f"{name_a} vs {name_a}", da, na, **kw), _null(f"{name_b} vs {name_b}", db, nb, **kw))
        one_a, one_b = (torch.arange(len(na)) // 2) % 2 == 0, (torch.arange(len(nb)) // 2) % 2 == 0
        r = _rule(da[one_a], na[one_a], half_a[one_a], db[one_b], nb[one_b], half_b[one_b], **kw)
        at_size = NullContrast(f"{name_a} vs {name_b} (the nulls' size)", int(one_a.sum()), int(one_b.sum()), len(r),
                               sum(x["confirmed"] for x in r), sum(x["domain_specific"] for x in r),
                               tuple(head_label(x["layer"], x["head"]) for x in r if x["confirmed"]))
    return HeadContrast(tuple(out), name_a, name_b, scan_a.n_prompts, scan_b.n_prompts, scan_a.thresholds.high,
                        scan_a.thresholds.low, min_diff, level, scan_a.mode_counts(), scan_b.mode_counts(),
                        diff_all.float(), shift, null_list, at_size, n_boot,
                        _power(nulls, null_list, min(len(na), len(nb))))


NULL_MIN_PROMPTS = 8  # per corpus: the null contrasts need two halves of >= 4 prompts (two per selection half)


def _power(asked: bool, null_list: tuple[NullContrast, ...], n_prompts: int) -> dict:
    """Whether the contrast's confirmations mean anything at this size (see the module docstring)."""
    if not asked:
        return {"powered": None, "reason": "not assessed: the null contrasts were not run (nulls=False)"}
    if n_prompts < NULL_MIN_PROMPTS:
        return {"powered": False, "reason": f"no power: {n_prompts} prompts in the smaller corpus, fewer than the "
                f"{NULL_MIN_PROMPTS} the null contrasts need to check the rule; give more prompts per corpus"}
    false = [(n.name, n.n_confirmed) for n in null_list if n.n_confirmed]
    if false:
        found = ", ".join(f"{k} in {name}" for name, k in false)
        return {"powered": False, "reason": f"no power: the null contrasts (halves of one corpus, {n_prompts // 2} "
                f"prompts each) confirm {found}: at this size the rule confirms heads by chance; give more prompts "
                "per corpus"}
    return {"powered": True, "reason": "the null contrasts confirm no head"}
