"""Intervals over prompts: the percentile bootstrap every quoted effect carries,
and Student t intervals where few prompts carry an effect.

Prompts are the unit of resampling (queries and heads of one prompt are not
independent). `prompt_curve` gives a mean over prompts with its interval, per
column; `bootstrap_ratio_ci` the interval of a ratio of sums (a mean over
targets or queries whose count varies by prompt). Both draw the same
resamples for the same number of prompts and seed, so paired contrasts
(without minus with `<bos>`, on the same prompts) stay paired.

A percentile bootstrap under-covers on a dozen prompts, so the no-op check
uses t intervals on per-prompt values instead (`t_interval`; a ratio of sums
through its linearisation, `ratio_t_interval`), with two-sided p-values and
Holm's step-down correction across every interval one run reports
(`holm`). `resample_counts` draws many bootstrap resamples as counts per
prompt, so a statistic that is a sum over prompts is one matrix product
(`n_boot` of 20,000 or more, where a Bonferroni level is read off the tails).
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float
from torch import Tensor

N_BOOT = 1000
LEVEL = 0.95


def resamples(n_prompts: int, *, n_boot: int = N_BOOT, seed: int = 0) -> Tensor:
    """[n_boot, n_prompts] prompt indices drawn with replacement."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n_prompts, (n_boot, n_prompts), generator=g)


def percentile_interval(values: Tensor, level: float = LEVEL, *, dim: int = 0, n_tests: int = 1,
                        ignore_nan: bool = False) -> Tensor:
    """[lo, hi] stacked along a new first axis: the percentile interval of
    bootstrap `values` along `dim` at `level`, Bonferroni-corrected for
    `n_tests` intervals read together (each at 1 - (1 - level) / n_tests);
    resamples that gave NaN are left out with `ignore_nan`. The one percentile
    rule of the package."""
    if not 0.0 < level < 1.0 or n_tests < 1:
        raise ValueError(f"need 0 < level < 1 and n_tests >= 1, got {level}, {n_tests}")
    alpha = (1 - level) / n_tests
    q = torch.tensor([alpha / 2, 1 - alpha / 2], dtype=values.dtype)
    return (torch.nanquantile if ignore_nan else torch.quantile)(values, q, dim=dim)



def prompt_curve(x: Float[Tensor, "prompt column"], *, n_boot: int = N_BOOT, level: float = LEVEL,
                 seed: int = 0) -> list[list[float]]:
    """Per column: [mean over prompts, lo, hi], a percentile bootstrap interval
    over prompts (prompts without a value dropped)."""
    x = x.double()
    x = x[~x.isnan().any(1)]
    if len(x) == 0:
        return []
    means = x[resamples(len(x), n_boot=n_boot, seed=seed)].mean(1)  # [boot, column]
    q = percentile_interval(means, level)
    return [[float(m), float(lo), float(hi)] for m, lo, hi in zip(x.mean(0), q[0], q[1])]


def bootstrap_ratio_ci(
    num: Float[Tensor, " prompt"], den: Float[Tensor, " prompt"], resample: Tensor, level: float = LEVEL
) -> tuple[float, float] | None:
    """Percentile interval of sum(num) / sum(den) over resamples of the prompts
    (`resample`: [n_boot, prompt] indices); resamples with sum(den) = 0 are
    dropped. None when every den is 0."""
    if float(den.sum()) == 0:
        return None
    d, q = num.double()[resample].sum(1), den.double()[resample].sum(1)
    ratio = (d / q)[q > 0]
    if len(ratio) == 0:  # no resample with a positive denominator: no ratio to bound
        return None
    lo, hi = percentile_interval(ratio, level).tolist()
    return (lo, hi)


def ratio_with_ci(num: Float[Tensor, " prompt"], den: Float[Tensor, " prompt"], *, n_boot: int = N_BOOT,
                  level: float = LEVEL, seed: int = 0) -> list[float] | None:
    """[sum(num) / sum(den), lo, hi] with the bootstrap interval over prompts; None when den sums to 0."""
    ci = bootstrap_ratio_ci(num, den, resamples(len(num), n_boot=n_boot, seed=seed), level)
    if ci is None:
        return None
    return [float(num.double().sum() / den.double().sum()), *ci]


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


def resample_counts(n_prompts: int, *, n_boot: int = N_BOOT, seed: int = 0) -> Tensor:
    """[n_boot, n_prompts] float64: how often each prompt is drawn in each
    resample (the same draws as `resamples`, as counts): a sum over a
    resample's prompts is `counts @ per_prompt`."""
    idx = resamples(n_prompts, n_boot=n_boot, seed=seed)
    counts = torch.zeros(n_boot, n_prompts, dtype=torch.float64)
    return counts.scatter_add_(1, idx, torch.ones_like(idx, dtype=torch.float64))


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


def _t_result(estimate: float, se: float, df: int, level: float) -> dict:
    if se == 0.0:
        p = 1.0 if estimate == 0.0 else 0.0
        return {"value": estimate, "ci": [estimate, estimate], "p": p, "se": 0.0, "df": df, "method": "t"}
    q = t_quantile((1 + level) / 2, df)
    p = min(1.0, 2 * t_sf(abs(estimate) / se, df))
    return {"value": estimate, "ci": [estimate - q * se, estimate + q * se], "p": p, "se": se, "df": df, "method": "t"}


def t_interval(x: Float[Tensor, " prompt"], *, level: float = LEVEL, scale: float = 1.0) -> dict | None:
    """Mean of per-prompt values x with its Student t interval and two-sided
    p-value against 0: {"value", "ci": [lo, hi], "p", "se", "df", "method"};
    `scale` multiplies value, interval and se (n for a total over the prompts).
    None with fewer than 2 prompts."""
    x = x.double()
    n = len(x)
    if n < 2:
        return None
    se = float(x.std(unbiased=True)) / math.sqrt(n)
    return _t_result(float(x.mean()) * scale, se * abs(scale), n - 1, level)


def ratio_t_interval(num: Float[Tensor, " prompt"], den: Float[Tensor, " prompt"], *,
                     level: float = LEVEL) -> dict | None:
    """sum(num) / sum(den) with a Student t interval over prompts through the
    ratio's linearisation (per-prompt residuals num - R den; the classical
    ratio-estimator variance), and its two-sided p-value against 0 (as
    `t_interval`). None when den sums to 0 or fewer than 2 prompts."""
    num, den = num.double(), den.double()
    n, total = len(num), float(den.sum())
    if n < 2 or total == 0.0:
        return None
    r = float(num.sum()) / total
    resid = num - r * den
    se = math.sqrt(float((resid ** 2).sum()) * n / (n - 1)) / total
    return _t_result(r, se, n - 1, level)


def ratio_difference_t_interval(num: Float[Tensor, " prompt"], den: Float[Tensor, " prompt"],
                                num2: Float[Tensor, " prompt"], den2: Float[Tensor, " prompt"], *,
                                level: float = LEVEL) -> dict | None:
    """sum(num) / sum(den) - sum(num2) / sum(den2) on the same prompts, with a
    Student t interval through both ratios' linearisation (paired by prompt),
    as `t_interval`. None when a den sums to 0 or fewer than 2 prompts."""
    num, den, num2, den2 = num.double(), den.double(), num2.double(), den2.double()
    n, t1, t2 = len(num), float(den.sum()), float(den2.sum())
    if n < 2 or t1 == 0.0 or t2 == 0.0:
        return None
    r1, r2 = float(num.sum()) / t1, float(num2.sum()) / t2
    resid = (num - r1 * den) / t1 - (num2 - r2 * den2) / t2
    se = math.sqrt(float((resid ** 2).sum()) * n / (n - 1))
    return _t_result(r1 - r2, se, n - 1, level)


def holm(p_values: list[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (None stays None; the family is the rest)."""
    idx = sorted((i for i, p in enumerate(p_values) if p is not None), key=lambda i: p_values[i])
    m, out, running = len(idx), [None] * len(p_values), 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        out[i] = running
    return out
