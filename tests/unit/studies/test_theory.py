"""The bound's ranking test: the Hutchinson estimate against the exact Jacobian,
the distance null on planted signals, and the intervals."""

from __future__ import annotations

import pytest
import torch

from helpers.tiny import TINY_RUN, TINY_BOS
from sinkmech.studies.theory import (
    bound_ranking,
    distance_shuffled_spearman,
    pair_mask,
    sign_flip_p,
    t_interval,
    validate_estimator,
)
from sinkmech.stats import t_quantile
from sinkmech.theory.sensitivity import jacobian_norms, jacobian_norms_hutchinson, spearman
from sinkmech.options import QUIET


@pytest.fixture(scope="module")
def seq(tiny_tokens):
    return torch.cat([torch.tensor([TINY_BOS]), tiny_tokens[0, :9]])


def test_hutchinson_converges_to_the_exact_jacobian_norms(tiny_model, seq):
    exact = jacobian_norms(tiny_model, seq)
    T = len(seq)
    mask = pair_mask(T, 0, "all")
    est = jacobian_norms_hutchinson(tiny_model, seq, n_probes=512, chunk_size=4096)
    rel = (est[mask] - exact[mask]).abs() / exact[mask]
    assert rel.median() < 0.02 and rel.max() < 0.1
    assert spearman(est[mask], exact[mask]) > 0.99
    assert est.triu(1).abs().max() == 0  # causal: nothing above the diagonal
    few = jacobian_norms_hutchinson(tiny_model, seq, n_probes=4)
    assert spearman(few[mask], exact[mask]) > 0.85


def test_hutchinson_squares_are_unbiased(tiny_model, seq):
    """Averaged over independent probe seeds, the squared estimate meets ||J||_F^2."""
    exact = jacobian_norms(tiny_model, seq).pow(2)
    mean = torch.stack([jacobian_norms_hutchinson(tiny_model, seq, n_probes=8, seed=s, chunk_size=1024).pow(2)
                        for s in range(12)]).mean(0)
    mask = pair_mask(len(seq), 0, "all")
    assert ((mean[mask] - exact[mask]).abs() / exact[mask]).median() < 0.05
    with pytest.raises(ValueError, match="n_probes"):
        jacobian_norms_hutchinson(tiny_model, seq, n_probes=0)


def test_t_quantiles_and_interval():
    # Student's t table (two-sided 95 %): df 1 -> 12.706, 3 -> 3.182, 31 -> 2.040
    for df, want in ((1, 12.706), (3, 3.182), (31, 2.040)):
        assert t_quantile(0.975, df) == pytest.approx(want, abs=2e-3)
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    out = t_interval(x)
    half = 3.182 * float(x.std()) / 2
    assert out["mean"] == 2.5 and out["ci"] == pytest.approx([2.5 - half, 2.5 + half], abs=1e-3)


def test_sign_flip_p_exact_and_null():
    assert sign_flip_p(torch.ones(4)) == pytest.approx(2 / 16)  # only all-plus and all-minus reach |mean| = 1
    g = torch.Generator().manual_seed(0)
    assert sign_flip_p(torch.randn(40, generator=g)) > 0.05
    assert sign_flip_p(torch.randn(40, generator=g) + 3.0) < 1e-3


def test_distance_null_finds_path_information_and_not_distance_alone():
    """Planted: sensitivity = the path weight (information beyond distance) is
    far above the null; sensitivity that follows distance only is not."""
    T = 24
    g = torch.Generator().manual_seed(1)
    j, i = torch.meshgrid(torch.arange(T), torch.arange(T), indexing="ij")
    dist = (j - i).clamp(min=0).float()
    paths = torch.exp(-0.1 * dist) * torch.exp(1.0 * torch.randn(T, T, generator=g))
    mask = pair_mask(T, 0, "all")
    informed = distance_shuffled_spearman(paths, paths, mask, n_shuffles=50)
    assert spearman(paths[mask], paths[mask]) - informed > 0.3
    by_distance = torch.exp(-0.1 * dist)
    observed = spearman(by_distance[mask], paths[mask])
    assert abs(observed - distance_shuffled_spearman(by_distance, paths, mask, n_shuffles=50)) < 0.02


def test_pair_sets():
    m = pair_mask(4, 1, "content")
    assert not m[:, 0].any() and m[3, 1] and not m[1, 2]
    assert pair_mask(4, 0, "off_diagonal").sum() == 6 and pair_mask(4, 0, "all").sum() == 10
    with pytest.raises(ValueError, match="pair set"):
        pair_mask(4, 0, "diagonal")


def test_bound_ranking_estimators_agree_and_report(tiny_model, tiny_tokens):
    rows = tiny_tokens[:2, :5].tolist()
    exact = bound_ranking(tiny_model, rows, estimator="exact", n_shuffles=2, chunk_size=1024,
                          options=TINY_RUN)
    est = bound_ranking(tiny_model, rows, estimator="hutchinson", n_probes=128, n_shuffles=2,
                        chunk_size=1024, options=TINY_RUN)
    for c in ("prepend", "none"):
        for s in ("all", "content", "off_diagonal"):
            assert torch.allclose(exact.rho[c][s], est.rho[c][s], atol=0.08)
    d = est.to_dict()
    assert (d["n_prompts"], d["n_tokens"], d["estimator"], d["n_probes"]) == (2, 5, "hutchinson", 128)
    assert exact.to_dict()["n_probes"] is None
    cell = d["content"]["none_minus_prepend"]
    assert cell["mean"] == pytest.approx(float((est.rho["none"]["content"] - est.rho["prepend"]["content"]).mean()))
    assert 0 < cell["sign_flip_p"] <= 1 and len(cell["ci"]) == 2
    check = validate_estimator(tiny_model, rows[:1], max_tokens=5, n_probes=64, chunk_size=1024, options=TINY_RUN)
    assert check["n_entries"] == 15 + 21 and check["relative_error"]["median"] < 0.1


def test_smollm2_hutchinson_matches_exact(smollm2):
    """A few SmolLM2 prompts: per-entry relative error and the ranking it yields."""
    from sinkmech.prompts import default_corpus

    check = validate_estimator(smollm2, default_corpus()[130:132], max_tokens=4, n_probes=32, options=QUIET)
    assert check["relative_error"]["median"] < 0.15
    assert check["spearman_estimate_vs_exact"]["min"] > 0.9
    assert check["bound_spearman_abs_difference_max"] < 0.1
