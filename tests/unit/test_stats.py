"""Intervals and tests over the independent units (sinkmech.stats) against
brute force, tables and simulations with a planted effect and a planted null."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
import torch

from sinkmech.stats import (
    SMALL_SAMPLE, Interval, bootstrap_method, cluster_counts, holm, percentile_interval, prompt_curve, ratio_interval,
    ratio_t_interval, ratio_with_ci, resample_counts, resamples, sign_flip_test, t_interval, t_quantile,
)


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


# Student t: one interval, checked against the table and the density


def test_t_quantile_matches_the_table_and_a_numerical_integral():
    # Student's t table, two-sided 95 %: df 1 -> 12.706, 2 -> 4.303, 3 -> 3.182, 31 -> 2.040
    for df, want in ((1, 12.706), (2, 4.303), (3, 3.182), (31, 2.040)):
        assert t_quantile(0.975, df) == pytest.approx(want, abs=2e-3)
    for df in (1, 2, 5, 10):  # the quantile leaves 2.5 % in the upper tail (Simpson's rule on [0, x])
        x = t_quantile(0.975, df)
        c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
        n = 20_000
        h = x / n
        f = [c * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(n + 1)]
        area = h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))
        assert 0.5 + area == pytest.approx(0.975, abs=1e-6), df


def test_t_interval_is_the_mean_plus_minus_t_times_se():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    out = t_interval(x)
    half = 3.182 * float(x.std()) / 2
    assert isinstance(out, Interval) and out.method == "t" and out.df == 3 and out.n_units == 4
    assert out.value == 2.5 and out.ci == pytest.approx([2.5 - half, 2.5 + half], abs=1e-3)
    assert t_interval(torch.tensor([1.0])) is None
    assert t_interval([1.0, float("nan"), 3.0]).n_units == 2  # NaN dropped
    assert t_interval([2.0, 3.0, 4.0], scale=10.0).value == pytest.approx(30.0)
    assert t_interval([1.0, 2.0], unit="seed").unit == "seed"


def test_t_interval_covers_a_planted_mean_and_finds_a_planted_effect():
    """Normal data, 8 units: the 95 % t interval covers the true mean in ~95 %
    of 2,000 replicates (binomial sd 0.5 %), and its p-value rejects a planted
    shift of 2 sd almost always while rejecting the planted null ~5 % of the time."""
    g = torch.Generator().manual_seed(1)
    draws = torch.randn(2000, 8, generator=g, dtype=torch.float64)
    ivs = [t_interval(row) for row in draws]
    cover = sum(iv.lo <= 0.0 <= iv.hi for iv in ivs) / len(ivs)
    assert 0.93 <= cover <= 0.97
    rejected_null = sum(iv.p < 0.05 for iv in ivs) / len(ivs)
    rejected_shift = sum(t_interval(row + 2.0).p < 0.05 for row in draws[:200]) / 200
    assert 0.03 <= rejected_null <= 0.07 and rejected_shift > 0.95


def test_ratio_t_interval_is_the_t_interval_of_a_mean_when_every_denominator_is_one():
    x = torch.tensor([0.3, -1.2, 2.0, 0.7, 1.1])
    a, b = ratio_t_interval(x, torch.ones(5)), t_interval(x)
    assert a.value == pytest.approx(b.value) and a.ci == pytest.approx(b.ci) and a.p == pytest.approx(b.p)


# The bootstrap: percentile above SMALL_SAMPLE units, BCa at or below; documents as units


def _bca_brute(x: np.ndarray, n_boot: int, seed: int, level: float = 0.95) -> tuple[float, float]:
    """BCa for the mean written out from Efron & Tibshirani (1993), eq. 14.9-14.15,
    loop by loop, on the same resamples as `sinkmech.stats`."""
    idx = resamples(len(x), n_boot=n_boot, seed=seed).numpy()
    boot = np.array([x[row].mean() for row in idx])
    est = x.mean()
    z0 = NormalDist().inv_cdf((np.sum(boot < est) + 0.5 * np.sum(boot == est)) / n_boot)
    jack = np.array([np.delete(x, i).mean() for i in range(len(x))])
    d = jack.mean() - jack
    a = np.sum(d ** 3) / (6 * np.sum(d ** 2) ** 1.5)
    out = []
    for z in (NormalDist().inv_cdf((1 - level) / 2), NormalDist().inv_cdf((1 + level) / 2)):
        out.append(np.quantile(boot, NormalDist().cdf(z0 + (z0 + z) / (1 - a * (z0 + z)))))
    return out[0], out[1]


def test_the_interval_method_follows_the_number_of_units():
    assert SMALL_SAMPLE == 16
    assert bootstrap_method(16) == "bca" and bootstrap_method(17) == "percentile"
    g = torch.Generator().manual_seed(0)
    small, large = torch.rand(16, generator=g), torch.rand(17, generator=g)
    assert ratio_interval(small).method == "bca" and ratio_interval(large).method == "percentile"
    # on 17 prompts: the percentile interval of the resampled means
    means = large.double()[resamples(17)].mean(1)
    assert prompt_curve(large[:, None])[0][1:] == pytest.approx(percentile_interval(means).tolist())
    # on 16: BCa, equal to the textbook formulas written out by hand
    x = torch.distributions.Exponential(1.0).sample((12,)).double()
    lo, hi = _bca_brute(x.numpy(), 1000, 0)
    iv = ratio_interval(x)
    assert (iv.lo, iv.hi) == pytest.approx((lo, hi), rel=1e-9)
    assert prompt_curve(x[:, None])[0] == pytest.approx([iv.value, iv.lo, iv.hi])
    assert ratio_interval(small, method="percentile").method == "percentile"


def test_bca_covers_a_skewed_mean_better_than_the_percentile_interval():
    """Lognormal data on 10 prompts (a skewed per-prompt loss): over 300
    replicates the percentile interval misses the true mean more often than
    BCa, which comes closer to the nominal 95 % (measured: 243 against 230 of
    300; both under-cover on so skewed a sample, which is why small samples
    are also said)."""
    g = torch.Generator().manual_seed(2)
    true = math.exp(0.5)  # mean of exp(N(0, 1))
    data = torch.randn(300, 10, generator=g, dtype=torch.float64).exp()
    bca = sum(ratio_interval(row, n_boot=500).lo <= true <= ratio_interval(row, n_boot=500).hi for row in data)
    pct = sum(ratio_interval(row, n_boot=500, method="percentile").lo <= true
              <= ratio_interval(row, n_boot=500, method="percentile").hi for row in data)
    assert bca >= pct + 6 and bca / 300 >= 0.78


def test_a_ratio_without_a_positive_denominator_has_no_interval():
    assert ratio_interval(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([-1.0, -2.0, -0.5])) is None
    assert ratio_with_ci(torch.tensor([1.0, 2.0]), torch.zeros(2)) is None
    same = ratio_interval(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 3.0]))
    assert (same.value, same.lo, same.hi) == pytest.approx((1.0, 1.0, 1.0))


def test_every_prompt_its_own_document_is_the_prompt_bootstrap():
    x = torch.rand(40, generator=torch.Generator().manual_seed(3))
    assert torch.equal(cluster_counts(list(range(40)), seed=5), resample_counts(40, seed=5))
    a, b = ratio_interval(x), ratio_interval(x, groups=[f"doc{i}" for i in range(40)])
    assert (a.lo, a.hi) == pytest.approx((b.lo, b.hi)) and b.unit == "document" and a.unit == "prompt"


def test_the_cluster_bootstrap_covers_where_windows_share_a_document():
    """Planted: 30 documents, each with its own level (sd 1), cut into 6 windows
    that add little noise of their own (sd 0.1). Resampling prompts treats 180
    near-copies as independent and under-covers the corpus mean; resampling
    documents covers it and says it rests on 30 documents."""
    g = torch.Generator().manual_seed(4)
    groups = [d for d in range(30) for _ in range(6)]
    cover = {"prompt": 0, "document": 0}
    for _ in range(200):
        level = torch.randn(30, generator=g, dtype=torch.float64)
        x = level[groups] + 0.1 * torch.randn(180, generator=g, dtype=torch.float64)
        by_prompt, by_doc = ratio_interval(x, n_boot=400), ratio_interval(x, groups=groups, n_boot=400)
        cover["prompt"] += by_prompt.lo <= 0.0 <= by_prompt.hi
        cover["document"] += by_doc.lo <= 0.0 <= by_doc.hi
    assert by_doc.n_units == 30 and by_doc.method == "percentile" and by_prompt.n_units == 180
    assert cover["prompt"] / 200 < 0.65 and cover["document"] / 200 >= 0.9
    curve = prompt_curve(x[:, None], groups=groups, n_boot=400)[0]
    assert curve == pytest.approx(ratio_interval(x, groups=groups, n_boot=400).as_list())


def test_few_documents_get_bca_over_documents():
    groups = ["a"] * 5 + ["b"] * 3 + ["c"] * 4 + ["d"] * 2 + ["e"] * 6
    x = torch.rand(20, generator=torch.Generator().manual_seed(6))
    iv = ratio_interval(x, groups=groups)
    assert iv.method == "bca" and iv.n_units == 5 and iv.unit == "document"


# Sign-flip tests and Holm


def test_sign_flip_test_exact_small_and_bounded_at_its_monte_carlo_floor():
    t = sign_flip_test(torch.ones(4))
    assert t.exact and t.p == pytest.approx(2 / 16)  # only all-plus and all-minus reach |mean| = 1
    g = torch.Generator().manual_seed(0)
    assert sign_flip_test(torch.randn(40, generator=g)).p > 0.05
    strong = sign_flip_test(torch.randn(40, generator=g) + 3.0, n_flips=999)
    assert not strong.exact and strong.at_floor and strong.p == strong.floor == pytest.approx(1 / 1000)
    assert strong.text() == "< 0.001" and sign_flip_test(torch.ones(4)).text() == "= 0.12"


def test_holm_adjusts_in_order_and_keeps_missing_values():
    # p sorted 0.01, 0.02, 0.04 -> 3 * 0.01, 2 * 0.02, max(previous, 0.04)
    assert holm([0.04, 0.01, None, 0.02]) == pytest.approx([0.04, 0.03, None, 0.04])


def test_effect_text_says_no_detectable_effect_when_the_interval_holds_zero():
    from sinkmech.stats import effect_text

    assert effect_text(0.4245, (0.22, 0.80)) == "+0.4245 [+0.2200, +0.8000]"
    assert effect_text(-0.0089, (-0.104, 0.085)) == "no detectable effect (-0.0089 [-0.1040, +0.0850])"
    assert effect_text(None, None) == "n/a" and "no interval" in effect_text(0.1, None)


def test_sink_rates_and_loss_take_documents_as_units():
    """SinkScores' intervals resample documents when given each prompt's document:
    the same point estimate, the cluster bootstrap's interval (checked against
    `prompt_curve` / `ratio_with_ci` with the same groups)."""
    from sinkmech.measures.sinks import SinkScores, paired_contrasts

    g = torch.Generator().manual_seed(7)
    P, L, H = 24, 2, 3
    groups = [i // 4 for i in range(P)]  # 6 documents of 4 windows

    def scores(shift: float) -> SinkScores:
        z = torch.zeros(P, L, H)
        return SinkScores(scores=(torch.rand(P, L, H, generator=g) + shift).clamp(0, 1), value_norm_first=z,
                          value_norm_rest=z, resid_norm_first=torch.zeros(P, L), resid_norm_rest=torch.zeros(P, L),
                          lengths=torch.full((P,), 9), bos="prepend", max_tokens=8,
                          prompt_loss=torch.rand(P, generator=g, dtype=torch.float64) * 8)

    pre, none = scores(0.0), scores(-0.2)
    by_doc = pre.sink_rate_ci(0.3, groups=groups)
    assert by_doc == pytest.approx(prompt_curve(pre.prompt_sink_rate(0.3)[:, None], groups=groups)[0])
    assert by_doc[0] == pytest.approx(pre.sink_rate_ci(0.3)[0]) and by_doc[1:] != pre.sink_rate_ci(0.3)[1:]
    assert pre.loss_ci(groups=groups) == pytest.approx(ratio_with_ci(pre.prompt_loss, pre.prompt_targets().double(),
                                                                     groups=groups))
    gap = paired_contrasts(pre, none, (0.3,), groups=groups)["loss_gap"]
    assert gap == pytest.approx(ratio_with_ci(none.prompt_loss - pre.prompt_loss, pre.prompt_targets().double(),
                                              groups=groups))


def test_ratio_t_intervals_over_documents_are_the_intervals_of_the_document_sums():
    """The cluster form: with `groups` the ratio and paired-difference t
    intervals are those of each document's sums (numerator and denominator
    summed first), labelled by document; one document per prompt is the
    prompt form."""
    from sinkmech.stats import ratio_difference_t_interval, ratio_t_interval

    g = torch.Generator().manual_seed(0)
    num, den = torch.randn(12, generator=g, dtype=torch.float64), torch.rand(12, generator=g, dtype=torch.float64) + 1
    num2, den2 = torch.randn(12, generator=g, dtype=torch.float64), torch.rand(12, generator=g, dtype=torch.float64)
    docs = ["a", "a", "b", "c", "c", "c", "d", "b", "e", "e", "f", "a"]
    index = {"a": 0, "b": 1, "c": 2, "d": 3, "e": 4, "f": 5}
    def by_doc(x):
        return torch.zeros(6, dtype=torch.float64).index_add_(0, torch.tensor([index[d] for d in docs]), x)
    got = ratio_t_interval(num, den, groups=docs)
    want = ratio_t_interval(by_doc(num), by_doc(den))
    assert got.unit == "document" and got.n_units == 6 and got.df == 5
    assert [got.value, *got.ci, got.p] == pytest.approx([want.value, *want.ci, want.p], rel=1e-12)
    got = ratio_difference_t_interval(num, den, num2, den2, groups=docs)
    want = ratio_difference_t_interval(by_doc(num), by_doc(den), by_doc(num2), by_doc(den2))
    assert got.unit == "document" and got.as_list() == pytest.approx(want.as_list(), rel=1e-12)
    own = ratio_t_interval(num, den, groups=[str(i) for i in range(12)])
    plain = ratio_t_interval(num, den)
    assert plain.unit == "prompt" and own.as_list() == pytest.approx(plain.as_list(), rel=1e-12)
