"""Intervals over prompts: the percentile bootstrap every quoted effect carries.

Prompts are the unit of resampling (queries and heads of one prompt are not
independent). `prompt_curve` gives a mean over prompts with its interval, per
column; `bootstrap_ratio_ci` the interval of a ratio of sums (a mean over
targets or queries whose count varies by prompt). Both draw the same
resamples for the same number of prompts and seed, so paired contrasts
(without minus with `<bos>`, on the same prompts) stay paired.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

N_BOOT = 1000
LEVEL = 0.95


def resamples(n_prompts: int, *, n_boot: int = N_BOOT, seed: int = 0) -> Tensor:
    """[n_boot, n_prompts] prompt indices drawn with replacement."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n_prompts, (n_boot, n_prompts), generator=g)


def _bounds(values: Tensor, level: float, dim: int = 0) -> Tensor:
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=values.dtype)
    return torch.quantile(values, q, dim=dim)


def prompt_curve(x: Float[Tensor, "prompt column"], *, n_boot: int = N_BOOT, level: float = LEVEL,
                 seed: int = 0) -> list[list[float]]:
    """Per column: [mean over prompts, lo, hi], a percentile bootstrap interval
    over prompts (prompts without a value dropped)."""
    x = x.double()
    x = x[~x.isnan().any(1)]
    if len(x) == 0:
        return []
    means = x[resamples(len(x), n_boot=n_boot, seed=seed)].mean(1)  # [boot, column]
    q = _bounds(means, level)
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
    lo, hi = _bounds(ratio, level).tolist()
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
