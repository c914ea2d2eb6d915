"""Sensitivity (Jacobian vs finite differences), path weights (vs path enumeration), collapse."""

from __future__ import annotations

import itertools

import pytest
import torch

from helpers.tiny import TINY_BOS, make_tiny
from sinkmech.loading.backend import forward
from sinkmech.hooks import act_name
from sinkmech.theory.sensitivity import (
    attention_patterns, jacobian_norms, mixing_matrices, path_weights, rank_collapse, repeat_collapse,
    representational_collapse, sensitivity, spearman,
)
from sinkmech.options import RunOptions


def test_jacobian_matches_finite_differences(tiny_model, tiny_tokens):
    tokens = tiny_tokens[0, :5]
    jac = jacobian_norms(tiny_model, tokens)
    _, cache = tiny_model.run_with_cache(tokens[None], names_filter=act_name("resid_pre", 0))
    h0 = cache[act_name("resid_pre", 0)][0].double()
    # the last block's output, as jacobian_norms differentiates it (backend.forward stops there on both backends)
    f = lambda x: forward(tiny_model, x[None].float(), start_at_layer=0, stop_at_layer=2)[0].double()  # noqa: E731
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
    # parameters are frozen only during the Jacobian (no per-cotangent weight gradients)
    assert all(p.requires_grad for p in tiny_model.parameters())


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
    s = sensitivity(tiny_model, tiny_tokens[:1], bos="prepend", max_tokens=4, options=RunOptions(bos_token_id=TINY_BOS))
    assert s.jacobian.shape == s.path_weight.shape == (5, 5)
    assert len(s.to_dataframe()) == 15
    with pytest.raises(ValueError, match="n_layers"):
        sensitivity(tiny_model, tiny_tokens[:1], bos="none", n_layers=3)


def test_rank_collapse_against_its_formula(tiny_model, tiny_tokens):
    rc_all = rank_collapse(tiny_model, tiny_tokens[:2, :6], bos="none", exclude_first=False)
    rc = rank_collapse(tiny_model, tiny_tokens[:2, :6], bos="none")
    assert rc.shape == rc_all.shape == (2, 3)
    _, cache = tiny_model.run_with_cache(tiny_tokens[:1, :6])
    X = cache[act_name("resid_pre", 1)][0]
    assert float(rc_all[0, 1]) == pytest.approx(float((X - X.mean(0)).norm() / X.norm()), rel=1e-4)
    X = X[1:]  # default: the sink position left out
    assert float(rc[0, 1]) == pytest.approx(float((X - X.mean(0)).norm() / X.norm()), rel=1e-4)


def test_rank_collapse_is_not_decided_by_a_huge_first_token():
    # Planted massive activation: the <bos> embedding 1000x the others. The content
    # tokens are identical, so at the embeddings they are fully collapsed (0); with
    # position 0 in X the ratio reads sqrt(1 - 1/T) ~ 1 anyway (the old definition's bias).
    model = make_tiny(1)
    with torch.no_grad():
        model.W_E[TINY_BOS] *= 1000.0
    rows = [[5] * 6, [7] * 4]
    rc_all = rank_collapse(model, rows, bos="prepend", options=RunOptions(bos_token_id=TINY_BOS), exclude_first=False)
    rc = rank_collapse(model, rows, bos="prepend", options=RunOptions(bos_token_id=TINY_BOS))
    for p, T in enumerate((7, 5)):
        # exact at the embeddings; after a layer the content rows (norm ~5 against
        # ~800) add a term of order (T-1) b.c / (T |b|^2): below 1e-2 here.
        assert float(rc_all[p, 0]) == pytest.approx((1 - 1 / T) ** 0.5, rel=2e-3)
        assert rc_all[p, 1:] == pytest.approx(torch.full((2,), (1 - 1 / T) ** 0.5), rel=1.5e-2)
    assert rc[:, 0].abs().max() < 1e-5


def test_repeat_collapse_matches_brute_force(tiny_model, tiny_tokens):
    rows = [tiny_tokens[0, :5].tolist(), tiny_tokens[1, :3].tolist()]
    repeats = [0, 2, 5]
    for bos in ("prepend", "none"):
        got = repeat_collapse(tiny_model, rows, repeats=repeats, bos=bos, options=RunOptions(bos_token_id=TINY_BOS))
        assert got.shape == (2, 3, 3)
        for p, row in enumerate(rows):
            for r, k in enumerate(repeats):
                last = []
                for n in (k, k + 1):
                    seq = ([TINY_BOS] if bos == "prepend" else []) + row + [row[-1]] * n
                    _, cache = tiny_model.run_with_cache(torch.tensor([seq]))
                    last.append(torch.stack([cache[act_name("resid_pre", 0)][0, -1], cache[act_name("resid_pre", 1)][0, -1],
                                             cache[act_name("resid_post", 1)][0, -1]]))
                assert torch.allclose(got[p, r], (last[0] - last[1]).norm(dim=-1), atol=1e-4)
        # a real prefix: the repeats do change the last representation, unlike all-identical sequences
        assert got[:, :, -1].min() > 1e-4
    with pytest.raises(ValueError, match="repeats"):
        repeat_collapse(tiny_model, rows, repeats=[-1], bos="none")


def test_spearman_rank_correlation():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    assert spearman(x, x ** 3) == pytest.approx(1.0)
    assert spearman(x, -x.exp()) == pytest.approx(-1.0)
    # ties get average ranks (scipy's definition), by hand: ranks [0,1.5,1.5,3] vs [0,2,1,3] -> 4.5 / sqrt(4.5 * 5)
    assert spearman(torch.tensor([1.0, 2, 2, 3]), torch.tensor([1.0, 3, 2, 4])) == pytest.approx(0.9486832980505138)
    assert spearman(torch.ones(4), x[:4]) != spearman(torch.ones(4), x[:4])  # NaN for a constant sample


def test_repeated_tokens_collapse_fully_without_bos(tiny_model):
    # Identical tokens carry identical values: without <bos> every position holds
    # the same vector, so n and n+1 repeats give the same last representation.
    none = representational_collapse(tiny_model, token=5, lengths=[2, 4], bos="none")
    with_bos = representational_collapse(tiny_model, token=5, lengths=[2, 4], bos="prepend",
                                         options=RunOptions(bos_token_id=TINY_BOS))
    assert none.shape == (2, 3)
    assert none.max() < 1e-4 and with_bos[:, 1:].min() > 1e-3
