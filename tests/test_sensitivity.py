"""Sensitivity (Jacobian vs finite differences), path weights (vs path enumeration), collapse."""

from __future__ import annotations

import itertools

import pytest
import torch

from conftest import TINY_BOS, make_tiny
from sinkmech.hooks import act_name
from sinkmech.sensitivity import (
    attention_patterns, jacobian_norms, mixing_matrices, path_weights, rank_collapse, representational_collapse, sensitivity,
)


def test_jacobian_matches_finite_differences(tiny_model, tiny_tokens):
    tokens = tiny_tokens[0, :5]
    jac = jacobian_norms(tiny_model, tokens)
    _, cache = tiny_model.run_with_cache(tokens[None], names_filter=act_name("resid_pre", 0))
    h0 = cache[act_name("resid_pre", 0)][0].double()
    f = lambda x: tiny_model(x[None].float(), start_at_layer=0, stop_at_layer=2)[0].double()  # noqa: E731
    eps = 1e-2
    with torch.no_grad():
        for i in (2,):
            cols = []
            for k in range(h0.shape[1]):
                d = torch.zeros_like(h0)
                d[i, k] = eps
                cols.append((f(h0 + d) - f(h0 - d)) / (2 * eps))  # [pos, d_model]
            fd = torch.stack(cols, -1).pow(2).sum((1, 2)).sqrt()  # per output position
            assert torch.allclose(jac[:, i].double(), fd, rtol=2e-2, atol=1e-3)
    assert jac.triu(1).abs().max() == 0  # causal


def test_path_weights_equal_brute_force_path_enumeration(tiny_tokens):
    model = make_tiny(5, n_layers=3)
    tokens = tiny_tokens[1, :5]
    pats = attention_patterns(model, tokens, 3)
    mix = mixing_matrices(pats)
    assert torch.allclose(mix.sum(-1), torch.ones(3, 5), atol=1e-5)  # rows stay stochastic
    fast = path_weights(pats)
    T = 5
    brute = torch.zeros(T, T)
    for i, j in itertools.product(range(T), range(T)):
        for mid in itertools.product(range(T), repeat=2):  # positions after layers 0 and 1
            path = (i, *mid, j)
            w = 1.0
            for l in range(3):
                w *= float(mix[l, path[l + 1], path[l]])
            brute[j, i] += w
    assert torch.allclose(fast, brute, atol=1e-5)


def test_sensitivity_side_by_side(tiny_model, tiny_tokens):
    s = sensitivity(tiny_model, tiny_tokens[:1], bos="prepend", max_tokens=4, bos_token_id=TINY_BOS)
    assert s.jacobian.shape == s.path_weight.shape == (5, 5)
    assert len(s.to_dataframe()) == 15
    with pytest.raises(ValueError, match="n_layers"):
        sensitivity(tiny_model, tiny_tokens[:1], bos="none", n_layers=3)


def test_rank_collapse_against_its_formula(tiny_model, tiny_tokens):
    rc = rank_collapse(tiny_model, tiny_tokens[:2, :6], bos="none")
    assert rc.shape == (2, 3)
    _, cache = tiny_model.run_with_cache(tiny_tokens[:1, :6])
    X = cache[act_name("resid_pre", 1)][0]
    assert float(rc[0, 1]) == pytest.approx(float((X - X.mean(0)).norm() / X.norm()), rel=1e-4)


def test_repeated_tokens_collapse_fully_without_bos(tiny_model):
    # Identical tokens carry identical values: without <bos> every position holds
    # the same vector, so n and n+1 repeats give the same last representation.
    none = representational_collapse(tiny_model, token=5, lengths=[2, 4], bos="none")
    with_bos = representational_collapse(tiny_model, token=5, lengths=[2, 4], bos="prepend", bos_token_id=TINY_BOS)
    assert none.shape == (2, 3)
    assert none.max() < 1e-4 and with_bos[:, 1:].min() > 1e-3
