"""Intervals over prompts (sinkmech.stats) against brute force and tables."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sinkmech.stats import bootstrap_ratio_ci, holm, percentile_interval, resample_counts, resamples, t_interval, t_quantile


def test_percentile_interval_equals_numpy_and_widens_with_the_correction():
    x = torch.randn(5000, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    lo, hi = percentile_interval(x, 0.9)
    assert lo.numpy() == pytest.approx(np.percentile(x.numpy(), 5, axis=0))
    assert hi.numpy() == pytest.approx(np.percentile(x.numpy(), 95, axis=0))
    lo4, hi4 = percentile_interval(x, 0.9, n_tests=4)  # each at 97.5 %
    assert hi4.numpy() == pytest.approx(np.percentile(x.numpy(), 98.75, axis=0))
    assert bool((lo4 < lo).all() and (hi4 > hi).all())
    x[0, 0] = float("nan")
    assert torch.isnan(percentile_interval(x, 0.9)[:, 0]).all()
    assert not torch.isnan(percentile_interval(x, 0.9, ignore_nan=True)).any()
    with pytest.raises(ValueError, match="level"):
        percentile_interval(x, 1.5)


def test_resample_counts_are_the_resamples_as_counts():
    idx, counts = resamples(7, n_boot=50, seed=3), resample_counts(7, n_boot=50, seed=3)
    assert torch.equal(counts, torch.stack([torch.bincount(r, minlength=7).double() for r in idx]))


def test_t_quantile_and_interval_match_the_table():
    # Student's t table, two-sided 95 %: df 1 -> 12.706, 3 -> 3.182, 31 -> 2.040
    for df, want in ((1, 12.706), (3, 3.182), (31, 2.040)):
        assert t_quantile(0.975, df) == pytest.approx(want, abs=2e-3)
    out = t_interval(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    half = 3.182 * float(torch.tensor([1.0, 2.0, 3.0, 4.0]).std()) / 2
    assert out["value"] == 2.5 and out["ci"] == pytest.approx([2.5 - half, 2.5 + half], abs=1e-3)
    assert t_interval(torch.tensor([1.0])) is None


def test_holm_adjusts_in_order_and_keeps_missing_values():
    # p sorted 0.01, 0.02, 0.04 -> 3 * 0.01, 2 * 0.02, max(previous, 0.04)
    assert holm([0.04, 0.01, None, 0.02]) == pytest.approx([0.04, 0.03, None, 0.04])


def test_a_ratio_without_a_positive_denominator_has_no_interval():
    resample = resamples(3, n_boot=50, seed=0)
    assert bootstrap_ratio_ci(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([-1.0, -2.0, -0.5]), resample) is None
    lo, hi = bootstrap_ratio_ci(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 3.0]), resample)
    assert lo == pytest.approx(1.0) and hi == pytest.approx(1.0)


def test_effect_text_says_no_detectable_effect_when_the_interval_holds_zero():
    from sinkmech.stats import effect_text

    assert effect_text(0.4245, (0.22, 0.80)) == "+0.4245 [+0.2200, +0.8000]"
    assert effect_text(-0.0089, (-0.104, 0.085)) == "no detectable effect (-0.0089 [-0.1040, +0.0850])"
    assert effect_text(None, None) == "n/a" and "no interval" in effect_text(0.1, None)


def test_bootstrap_ratio_interval():
    from sinkmech.stats import bootstrap_ratio_ci

    delta, queries = torch.tensor([1.0, 4.0, 0.0]), torch.tensor([1.0, 2.0, 0.0])
    # resamples holding one prompt each: ratios 1, 2 (prompt 2 forced nothing: dropped)
    resample = torch.tensor([[0, 0, 0], [1, 1, 1], [2, 2, 2]])
    assert bootstrap_ratio_ci(delta, queries, resample, 0.5) == pytest.approx((1.25, 1.75))
    assert bootstrap_ratio_ci(delta, torch.zeros(3), resample, 0.9) is None
