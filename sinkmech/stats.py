"""Intervals and tests over the independent units of a study: prompts, the
documents prompts were cut from, or training seeds.

One interval type, `Interval`, whatever made it:

- Student t (`t_interval` for a mean; `ratio_t_interval` and
  `ratio_difference_t_interval` for ratios of sums through their
  linearisation), with a two-sided p-value against 0: the one t interval of
  the package (`t_from_se` builds every one of them).
- The bootstrap of a ratio of sums (`ratio_interval`; a mean is the ratio to
  a count of one per prompt): the percentile interval on more than
  `SMALL_SAMPLE` units, BCa (bias-corrected and accelerated, Efron 1987) on
  `SMALL_SAMPLE` or fewer, where the percentile interval under-covers. Prompts
  cut from the same document are not independent: given each prompt's
  document (`groups`), whole documents are resampled (a cluster bootstrap)
  and the interval says how many documents it rests on (`n_units`, `unit`).

`prompt_curve` and `ratio_with_ci` are the list forms ([value, lo, hi]) the
older results keep. Paired contrasts stay paired: the same seed and units
draw the same resamples. `sign_flip_test` is the paired permutation test
(every sign pattern up to 16 units, else random ones), whose Monte Carlo floor
1 / (B + 1) is reported as a bound ("< 1/(B+1)"), never as a value; `holm` is
Holm's step-down correction over a family the caller states.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor

N_BOOT = 1000
LEVEL = 0.95
# At or below this many independent units a percentile bootstrap under-covers: BCa instead.
SMALL_SAMPLE = 16
Unit = Literal["prompt", "document", "seed", "model"]


@dataclass(frozen=True)
class Interval:
    """An estimate with its interval over `n_units` independent `unit`s.

    `method`: "t" (Student t), "percentile" or "bca" (bootstrap). `p`, `se`,
    `df`: the t test's two-sided p-value against 0, standard error and
    degrees of freedom (None for a bootstrap)."""

    value: float
    lo: float
    hi: float
    level: float
    method: str
    n_units: int
    unit: Unit = "prompt"
    p: float | None = None
    se: float | None = None
    df: int | None = None

    @property
    def ci(self) -> list[float]:
        return [self.lo, self.hi]

    @property
    def excludes_zero(self) -> bool:
        return not self.lo <= 0.0 <= self.hi

    def as_list(self) -> list[float]:
        """[value, lo, hi]."""
        return [self.value, self.lo, self.hi]

    def to_dict(self) -> dict:
        return {"value": self.value, "ci": self.ci, "p": self.p, "se": self.se, "df": self.df, "method": self.method,
                "level": self.level, "n": self.n_units, "unit": self.unit}


# Bootstrap resamples


def resamples(n_units: int, *, n_boot: int = N_BOOT, seed: int = 0) -> Tensor:
    """[n_boot, n_units] unit indices drawn with replacement."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n_units, (n_boot, n_units), generator=g)


def resample_counts(n_units: int, *, n_boot: int = N_BOOT, seed: int = 0) -> Tensor:
    """[n_boot, n_units] float64: how often each unit is drawn in each
    resample (the same draws as `resamples`, as counts): a sum over a
    resample's units is `counts @ per_unit`."""
    idx = resamples(n_units, n_boot=n_boot, seed=seed)
    counts = torch.zeros(n_boot, n_units, dtype=torch.float64)
    return counts.scatter_add_(1, idx, torch.ones_like(idx, dtype=torch.float64))


def group_index(groups: Sequence) -> tuple[Int[Tensor, " prompt"], int]:
    """Each prompt's document as an index 0..D-1 (in order of first
    appearance), and D, the number of documents."""
    seen: dict = {}
    index = [seen.setdefault(g, len(seen)) for g in groups]
    return torch.tensor(index, dtype=torch.long), len(seen)


def cluster_counts(groups: Sequence, *, n_boot: int = N_BOOT, seed: int = 0) -> Tensor:
    """[n_boot, n_prompts] float64: the cluster bootstrap's weight of each
    prompt, i.e. how often its document was drawn when the D documents are
    resampled with replacement (`resample_counts(D)`). With every prompt its
    own document this is `resample_counts(n_prompts)`."""
    index, n_docs = group_index(groups)
    return resample_counts(n_docs, n_boot=n_boot, seed=seed)[:, index]


def percentile_interval(values: Tensor, level: float = LEVEL, *, dim: int = 0, n_tests: int = 1,
                        ignore_nan: bool = False) -> Tensor:
    """[lo, hi] stacked along a new first axis: the percentile interval of
    bootstrap `values` along `dim` at `level`, Bonferroni-corrected for
    `n_tests` intervals read together (each at 1 - (1 - level) / n_tests);
    resamples that gave NaN are left out with `ignore_nan`. The one percentile
    rule of the package."""
    _check_level(level)
    if n_tests < 1:
        raise ValueError(f"need n_tests >= 1, got {n_tests}")
    alpha = (1 - level) / n_tests
    q = torch.tensor([alpha / 2, 1 - alpha / 2], dtype=values.dtype)
    return (torch.nanquantile if ignore_nan else torch.quantile)(values, q, dim=dim)


def _check_level(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"need 0 < level < 1, got {level}")


def bootstrap_method(n_units: int) -> str:
    """The bootstrap interval used on `n_units` independent units: "bca" at
    `SMALL_SAMPLE` or fewer, else "percentile"."""
    return "bca" if n_units <= SMALL_SAMPLE else "percentile"


def _bootstrap_columns(num: Float[Tensor, "unit column"], den: Float[Tensor, "unit column"], *, level: float,
                       n_boot: int, seed: int, method: str) -> tuple[Tensor, Tensor, Tensor]:
    """(value, lo, hi) [column] of sum(num) / sum(den) per column, resampling
    the units (resamples whose denominator is not positive are left out; NaN
    where none is left)."""
    n = num.shape[0]
    value = num.sum(0) / den.sum(0)
    counts = resample_counts(n, n_boot=n_boot, seed=seed)
    top, bottom = counts @ num, counts @ den
    boot = torch.where(bottom > 0, top / bottom, torch.tensor(float("nan"), dtype=num.dtype))  # [boot, column]
    if method == "percentile":
        lo, hi = percentile_interval(boot, level, ignore_nan=True)
        return value, lo, hi
    # BCa (Efron 1987; Efron & Tibshirani 1993, ch. 14): bias from the share of
    # resamples below the estimate, acceleration from the leave-one-unit-out jackknife.
    normal = NormalDist()
    alpha = (1 - level) / 2
    lo, hi = torch.full_like(value, float("nan")), torch.full_like(value, float("nan"))
    for c in range(num.shape[1]):
        b = boot[:, c][~boot[:, c].isnan()]
        if len(b) == 0 or not math.isfinite(float(value[c])):
            continue
        below = (float((b < value[c]).sum()) + 0.5 * float((b == value[c]).sum())) / len(b)
        z0 = normal.inv_cdf(min(max(below, 1 / (len(b) + 1)), len(b) / (len(b) + 1)))
        rest_num, rest_den = num[:, c].sum() - num[:, c], den[:, c].sum() - den[:, c]
        jack = (rest_num / rest_den)[rest_den > 0]
        d = jack.mean() - jack
        spread = float((d ** 2).sum())
        a = float((d ** 3).sum()) / (6 * spread ** 1.5) if spread > 0 else 0.0
        q = []
        for z in (normal.inv_cdf(alpha), normal.inv_cdf(1 - alpha)):
            shifted = z0 + (z0 + z) / (1 - a * (z0 + z))
            q.append(normal.cdf(shifted))
        lo[c], hi[c] = torch.quantile(b, torch.tensor(q, dtype=b.dtype))
    return value, lo, hi


def unit_sums(x: Tensor, groups: Sequence | None) -> Tensor:
    """Sums of `x` [prompt, ...] per unit: per document with `groups`, else per prompt."""
    if groups is None:
        return x
    if len(groups) != x.shape[0]:
        raise ValueError(f"groups names {len(groups)} documents for {x.shape[0]} prompts")
    index, n_docs = group_index(groups)
    return torch.zeros(n_docs, *x.shape[1:], dtype=x.dtype).index_add_(0, index, x)


def unit_means(x: Float[Tensor, " prompt"], groups: Sequence | None = None) -> Float[Tensor, " unit"]:
    """Per-unit means of per-prompt values (NaNs dropped): the mean of each
    document's prompts with `groups` (documents in order of first appearance;
    one with no value gives NaN), else `x` itself. A t interval or sign-flip
    test over these treats documents, not the windows cut from them, as the
    independent units."""
    x = torch.as_tensor(x, dtype=torch.float64).flatten()
    if groups is None:
        return x
    keep = ~x.isnan()
    num = unit_sums(torch.where(keep, x, torch.zeros_like(x)), groups)
    return num / unit_sums(keep.double(), groups)


def ratio_interval(num: Float[Tensor, " prompt"], den: Float[Tensor, " prompt"] | None = None, *,
                   groups: Sequence | None = None, level: float = LEVEL, n_boot: int = N_BOOT, seed: int = 0,
                   method: Literal["auto", "percentile", "bca"] = "auto", unit: Unit | None = None
                   ) -> Interval | None:
    """sum(num) / sum(den) (the mean of `num` without `den`) with its bootstrap
    interval over the independent units: prompts, or, with `groups` (each
    prompt's document), documents resampled whole (a cluster bootstrap).
    `method` "auto": BCa on `SMALL_SAMPLE` units or fewer, else percentile.
    None when den sums to 0 or no resample has a positive denominator."""
    _check_level(level)
    num = num.double().flatten()
    den = torch.ones_like(num) if den is None else den.double().flatten()
    nu, de = unit_sums(num, groups), unit_sums(den, groups)
    if float(de.sum()) == 0:
        return None
    how = bootstrap_method(len(nu)) if method == "auto" else method
    value, lo, hi = (float(v[0]) for v in _bootstrap_columns(nu[:, None], de[:, None], level=level, n_boot=n_boot,
                                                              seed=seed, method=how))
    if math.isnan(lo) or math.isnan(hi):
        return None
    return Interval(value, lo, hi, level, how, len(nu), unit or ("document" if groups is not None else "prompt"))


def prompt_curve(x: Float[Tensor, "prompt column"], *, n_boot: int = N_BOOT, level: float = LEVEL, seed: int = 0,
                 groups: Sequence | None = None) -> list[list[float]]:
    """Per column: [mean over prompts, lo, hi], a bootstrap interval over the
    prompts (or, with `groups`, their documents; `bootstrap_method` says
    which interval); prompts without a value in some column are dropped."""
    _check_level(level)
    x = x.double()
    keep = ~x.isnan().any(1)
    x = x[keep]
    if len(x) == 0:
        return []
    if groups is not None:
        groups = [g for g, k in zip(groups, keep.tolist()) if k]
    nu = unit_sums(x, groups)
    de = unit_sums(torch.ones(len(x), 1, dtype=torch.float64), groups).expand_as(nu)
    value, lo, hi = _bootstrap_columns(nu, de.contiguous(), level=level, n_boot=n_boot, seed=seed,
                                       method=bootstrap_method(len(nu)))
    return [[float(m), float(a), float(b)] for m, a, b in zip(value, lo, hi)]


def ratio_with_ci(num: Float[Tensor, " prompt"], den: Float[Tensor, " prompt"], *, n_boot: int = N_BOOT,
                  level: float = LEVEL, seed: int = 0, groups: Sequence | None = None) -> list[float] | None:
    """[sum(num) / sum(den), lo, hi] with the bootstrap interval of
    `ratio_interval`; None when den sums to 0 (or has no positive resample)."""
    iv = ratio_interval(num, den, groups=groups, level=level, n_boot=n_boot, seed=seed)
    return None if iv is None else iv.as_list()


def n_documents(groups: Sequence | None, n_prompts: int) -> int:
    """How many independent units a number over `n_prompts` rests on: the
    distinct documents of `groups`, or the prompts themselves."""
    return n_prompts if groups is None else len(set(groups))


def interval_description(groups: Sequence | None, n_prompts: int, level: float = LEVEL) -> str:
    """What a result's bootstrap intervals resample, in words: the documents
    `groups` names (a cluster bootstrap) or the prompts themselves."""
    n = n_documents(groups, n_prompts)
    unit = f"the {n} documents the {n_prompts} prompts were cut from" if groups is not None else f"the {n} prompts"
    return f"{100 * level:g} % {bootstrap_method(n)} bootstrap over {unit}"


def excludes_zero(value: list[float] | None) -> bool | None:
    """Whether a [mean, lo, hi] interval excludes zero (None without one)."""
    return None if value is None else bool(value[1] > 0 or value[2] < 0)


def effect_text(value: float | None, ci, *, fmt: str = "+.4f", unit: str = "") -> str:
    """`+0.4245 [+0.2200, +0.8000]`, or `no detectable effect (...)` when the
    interval holds zero; "n/a" without a value."""
    if value is None:
        return "n/a"
    if ci is None:
        return f"{value:{fmt}}{unit} (no interval)"
    text = f"{value:{fmt}}{unit} [{ci[0]:{fmt}}, {ci[1]:{fmt}}]"
    return f"no detectable effect ({text})" if ci[0] <= 0.0 <= ci[1] else text


# Student t


def _betainc(a: float | int, b: float | int, x: float | int) -> float:
    """The regularised incomplete beta I_x(a, b) (continued fraction, Numerical Recipes 6.4)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _betainc(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 500):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * f


def t_sf(t: float, df: float | int) -> float:
    """P(T >= t) for Student's t with `df` degrees of freedom."""
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * _betainc(df / 2, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


@functools.lru_cache(maxsize=256)
def t_quantile(p: float, df: float | int) -> float:
    """The `p` quantile of Student's t (bisection on `t_sf`), 0 < p < 1."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"need 0 < p < 1, got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_sf(hi, df) > 1.0 - p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_sf(mid, df) > 1.0 - p else (lo, mid)
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2


def t_from_se(estimate: float, se: float, df: int, *, level: float = LEVEL, n_units: int | None = None,
              unit: Unit = "prompt") -> Interval:
    """The Student t interval estimate +- t_{(1+level)/2, df} se, with the
    two-sided p-value of estimate / se against 0: every t interval of the
    package is made here. `n_units` defaults to df + 1."""
    _check_level(level)
    n = df + 1 if n_units is None else n_units
    if se == 0.0:
        p = 1.0 if estimate == 0.0 else 0.0
        return Interval(estimate, estimate, estimate, level, "t", n, unit, p, 0.0, df)
    q = t_quantile((1 + level) / 2, df)
    p = min(1.0, 2 * t_sf(abs(estimate) / se, df))
    return Interval(estimate, estimate - q * se, estimate + q * se, level, "t", n, unit, p, se, df)


def t_interval(x: Float[Tensor, " unit"] | Sequence[float], *, level: float = LEVEL, scale: float = 1.0,
               unit: Unit = "prompt") -> Interval | None:
    """The mean of per-unit values x (NaNs dropped) with its Student t
    interval and two-sided p-value against 0; `scale` multiplies value,
    interval and se (n for a total over the units). None below 2 values."""
    x = torch.as_tensor(x, dtype=torch.float64).flatten()
    x = x[~x.isnan()]
    n = len(x)
    if n < 2:
        return None
    se = float(x.std(unbiased=True)) / math.sqrt(n)
    return t_from_se(float(x.mean()) * scale, se * abs(scale), n - 1, level=level, unit=unit)


def ratio_t_interval(num: Float[Tensor, " prompt"], den: Float[Tensor, " prompt"], *,
                     level: float = LEVEL, groups: Sequence | None = None) -> Interval | None:
    """sum(num) / sum(den) with a Student t interval over prompts through the
    ratio's linearisation (per-unit residuals num - R den; the classical
    ratio-estimator variance), and its two-sided p-value against 0. With
    `groups` (each prompt's document) the units are documents: num and den are
    summed per document first (the cluster form). None when den sums to 0 or
    fewer than 2 units."""
    num, den = unit_sums(num.double(), groups), unit_sums(den.double(), groups)
    n, total = len(num), float(den.sum())
    if n < 2 or total == 0.0:
        return None
    r = float(num.sum()) / total
    resid = num - r * den
    se = math.sqrt(float((resid ** 2).sum()) * n / (n - 1)) / total
    return t_from_se(r, se, n - 1, level=level, unit="document" if groups is not None else "prompt")


def ratio_difference_t_interval(num: Float[Tensor, " prompt"], den: Float[Tensor, " prompt"],
                                num2: Float[Tensor, " prompt"], den2: Float[Tensor, " prompt"], *,
                                level: float = LEVEL, groups: Sequence | None = None) -> Interval | None:
    """sum(num) / sum(den) - sum(num2) / sum(den2) on the same prompts, with a
    Student t interval through both ratios' linearisation (paired by prompt,
    or with `groups` by document), as `ratio_t_interval`. None when a den sums
    to 0 or fewer than 2 units."""
    num, den, num2, den2 = (unit_sums(x.double(), groups) for x in (num, den, num2, den2))
    n, t1, t2 = len(num), float(den.sum()), float(den2.sum())
    if n < 2 or t1 == 0.0 or t2 == 0.0:
        return None
    r1, r2 = float(num.sum()) / t1, float(num2.sum()) / t2
    resid = (num - r1 * den) / t1 - (num2 - r2 * den2) / t2
    se = math.sqrt(float((resid ** 2).sum()) * n / (n - 1))
    return t_from_se(r1 - r2, se, n - 1, level=level, unit="document" if groups is not None else "prompt")


# Tests


@dataclass(frozen=True)
class SignFlip:
    """A paired sign-flip permutation test of mean(x) = 0 (two-sided).

    `exact`: every sign pattern was counted (p is the permutation p-value
    itself); otherwise `n_flips` random patterns, p = (hits + 1) / (n_flips + 1),
    whose smallest value, `floor` = 1 / (n_flips + 1), only bounds p: a test
    `at_floor` reads "p < floor" (`text`)."""

    p: float
    n_units: int
    exact: bool
    n_flips: int
    floor: float
    at_floor: bool

    def text(self, fmt: str = ".2g") -> str:
        return f"< {self.floor:{fmt}}" if self.at_floor else f"= {self.p:{fmt}}"

    def to_dict(self) -> dict:
        return {"p": self.p, "n": self.n_units, "exact": self.exact, "n_flips": self.n_flips, "floor": self.floor,
                "at_floor": self.at_floor}


def sign_flip_test(x: Float[Tensor, " unit"], *, n_flips: int = 20000, seed: int = 0) -> SignFlip | None:
    """Two-sided sign-flip permutation test of a paired mean difference:
    every sign pattern for up to 16 units, else `n_flips` random ones (the
    observed pattern counted). NaNs dropped; None without a value."""
    x = torch.as_tensor(x, dtype=torch.float64).flatten()
    x = x[~x.isnan()]
    n = len(x)
    if n == 0:
        return None
    observed = abs(float(x.mean())) - 1e-12
    if n <= 16:
        codes = torch.arange(2 ** n)
        signs = ((codes[:, None] >> torch.arange(n)) & 1).double() * 2 - 1
        p = float(((signs * x).mean(1).abs() >= observed).double().mean())
        return SignFlip(p, n, True, 2 ** n, 2 / 2 ** n, False)
    g = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (n_flips, n), generator=g).double() * 2 - 1
    hits = int(((signs * x).mean(1).abs() >= observed).sum())
    return SignFlip((hits + 1) / (n_flips + 1), n, False, n_flips, 1 / (n_flips + 1), hits == 0)


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values over the family `p_values` (None
    stays None and is not counted in the family)."""
    idx = sorted((i for i, p in enumerate(p_values) if p is not None), key=lambda i: p_values[i])
    m, out, running = len(idx), [None] * len(p_values), 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        out[i] = running
    return out
