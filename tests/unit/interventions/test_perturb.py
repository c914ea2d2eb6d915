"""Perturbation spread: zero perturbations, causality, swaps, entropy."""

from __future__ import annotations

import pytest
import torch

from helpers.tiny import TINY_BOS
from sinkmech.hooks import act_name
from sinkmech.interventions.perturb import EmbeddingNoise, TokenSwap, perturbation_spread
from sinkmech.options import RunOptions


@pytest.fixture(scope="module")
def rows(tiny_tokens):
    r = tiny_tokens[:4, :10].tolist()
    r[1] = r[1][:7]
    return r


def spread(model, rows, pert, **kw):
    return perturbation_spread(model, rows, perturbation=pert,
                               options=RunOptions(batch_size=3, progress=False, bos_token_id=TINY_BOS), **kw)


def test_zero_perturbation_gives_zero_change(tiny_model, rows):
    for pert in (EmbeddingNoise(0.0, 2), TokenSwap([rows[0][3]], [rows[0][3]], position=3)):
        r = spread(tiny_model, rows if isinstance(pert, EmbeddingNoise) else rows[:1], pert)
        assert torch.nan_to_num(r.change).abs().max() == 0.0
        assert r.per_layer()["spread_fraction"].abs().max() == 0.0


def test_noise_has_the_asked_norm_and_respects_causality(tiny_model, rows):
    r = spread(tiny_model, rows, EmbeddingNoise(0.3, 2))
    assert r.change.shape == (2, 4, 3, 10)
    # Layer 0 is the embedding: only the noised position moves, by exactly 0.3.
    assert torch.allclose(r.change[:, :, 0, 2], torch.full((2, 4), 0.3), atol=1e-5)
    assert torch.nan_to_num(r.change[:, :, 0, 3:]).abs().max() < 1e-6
    # Earlier positions never see a later change; later ones do after a layer.
    assert torch.nan_to_num(r.change[:, :, :, :2]).abs().max() < 1e-6
    assert (r.change[:, :, 1:, 3:].nan_to_num() > 0).any()
    assert r.change[:, 1, :, 7:].isnan().all()  # padding of the short prompt
    s = r.per_layer()
    assert s["mean_change"].shape == (2, 3) and (s["mean_change"][:, 0] == 0).all()


def test_token_swap_finds_the_token_and_checks_length(tiny_model, rows):
    old, new = rows[0][4], 7 if rows[0][4] != 7 else 8
    r = spread(tiny_model, rows[:1], TokenSwap([old], [new]))
    first = rows[0].index(old)
    assert int(r.last_changed[0]) == first
    assert r.change[:, 0, 0, first].min() > 0
    with pytest.raises(ValueError, match="must keep the length"):
        spread(tiny_model, rows[:1], TokenSwap([old], [new, new]))
    with pytest.raises(ValueError, match="does not hold"):
        spread(tiny_model, rows[:1], TokenSwap([old], [new], position=first + 1 if rows[0][first + 1] != old else first + 2))
    with pytest.raises(ValueError, match="out of range"):
        spread(tiny_model, rows, EmbeddingNoise(0.1, 7))


def test_entropy_matches_the_cached_patterns(tiny_model, rows):
    r = spread(tiny_model, rows[:1], EmbeddingNoise(0.1, 1))
    for c, tokens in enumerate(([TINY_BOS] + rows[0], rows[0])):
        _, cache = tiny_model.run_with_cache(torch.tensor([tokens]))
        off = 1 - c
        for l in range(2):
            a = cache[act_name("pattern", l)][0, :, off:]
            h = -(a * a.clamp(min=1e-30).log()).sum(-1).mean(-1)
            assert torch.allclose(r.entropy[c, l], h, atol=1e-5)
    d = r.to_dict()
    assert set(d["per_layer"]) == {"prepend", "none"} and len(r.to_dataframe()) == 2 * 3 * 10


def test_uniform_head_has_normalised_entropy_one_in_both_conditions(rows):
    # W_Q = 0: every score is 0, so every row is uniform over its causal keys.
    # Raw entropy differs (the <bos> run has one more key per query: log(t+2) vs
    # log(t+1)); normalised entropy H / log(n_keys) is exactly 1 in both.
    from helpers.tiny import make_tiny

    model = make_tiny(3)
    with torch.no_grad():
        for b in model.blocks:
            b.attn.W_Q.zero_()
    r = spread(model, rows, EmbeddingNoise(0.1, 1))
    assert torch.allclose(r.normalized_entropy, torch.ones_like(r.normalized_entropy), atol=1e-5)
    assert (r.entropy[0] - r.entropy[1]).min() > 0.05  # the bias the normalisation removes
    assert set(r.to_dict()["normalized_entropy"]) == {"prepend", "none"}
