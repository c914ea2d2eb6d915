"""Massive-activation dimensions: vectorised stats equal a per-dimension loop; a planted dim is found."""

from __future__ import annotations

import pytest
import torch
from jaxtyping import TypeCheckError

from sinkmech.hooks import act_name, residual_stack
from sinkmech.measures.loss import content_loss
from sinkmech.measures.massive import massive_dims, reset_massive_dims
from sinkmech.prompts import tokenize
from sinkmech.measures.sinks import sink_scores
from helpers.tiny import TINY_BOS
from helpers.tolerance import TINY_FORWARD
from sinkmech.options import QUIET, RunOptions


@pytest.fixture(scope="module")
def ragged(tiny_model, tiny_tokens):
    rows = [tiny_tokens[i, : 12 - i].tolist() for i in range(len(tiny_tokens))]
    return tokenize(tiny_model, rows, bos="prepend", max_tokens=12, bos_token_id=TINY_BOS)


def test_massive_dims_equal_per_dimension_loop(tiny_model, ragged):
    res = massive_dims(tiny_model, ragged, top_k=3, threshold=1.0, options=RunOptions(batch_size=4, progress=False))
    stack = residual_stack(tiny_model, ragged.tokens)  # [batch, resid_layer, pos, d_model]
    P, R, _, D = stack.shape
    for r in range(R):
        for d in range(D):
            first = sum(abs(float(stack[p, r, 0, d])) for p in range(P)) / P
            med = 0.0
            for p in range(P):
                vals = sorted(abs(float(stack[p, r, t, d])) for t in range(1, int(ragged.lengths[p])))
                med += vals[(len(vals) - 1) // 2]  # the lower middle value, as torch.median
            assert abs(float(res.first_abs[r, d]) - first) < 1e-4
            assert abs(float(res.median_abs[r, d]) - med / P) < 1e-4
        n0 = sum(float(stack[p, r, 0].norm()) for p in range(P))
        nr = sum(float(stack[p, r, 1 : int(ragged.lengths[p])].norm(dim=-1).mean()) for p in range(P))
        assert abs(float(res.norm_ratio[r]) - n0 / nr) < 1e-4


def test_planted_massive_dim_is_found(tiny_model, ragged):
    """A huge value written into dim 5 of position 0 from resid_pre 1 on: exactly dim 5 (Sun et al.'s
    criterion: > 100 and >= 1000x the hidden state's median), onset at layer 1, nearly all of the norm;
    a second, smaller planted dim (> 100 but far below 1000x the median) is not massive."""

    def plant(resid, hook):
        out = resid.clone()
        out[:, 0, 5] += 5000.0
        out[:, 0, 7] += 150.0
        return out

    with tiny_model.hooks(fwd_hooks=[(act_name("resid_pre", 1), plant)]):
        res = massive_dims(tiny_model, ragged, top_k=2, threshold=10.0, options=QUIET)
    assert res.onset_layer == 1
    assert float(res.hidden_median[1]) < 4.0 and 150 / float(res.hidden_median[1]) < 1000 < 5000 / 4.0
    assert res.massive_dims == (5,)
    assert int(res.top_dims[2, 0]) == 5  # carried forward by the residual stream
    d = res.to_dict()
    assert d["massive_dims"] == [5] and d["massive_dim_share"]["5"] > 0.99
    assert torch.allclose(res.sq_share[1].sum(), torch.tensor(1.0), atol=1e-4)
    assert float(res.first_mean[1, 5]) > 4900


def test_reset_undoes_a_planted_dim(tiny_model, ragged):
    def plant(resid, hook):
        out = resid.clone()
        out[:, 0, 5] += 500.0
        return out

    clean = reset_massive_dims(tiny_model, ragged, dims=[5], from_layer=1, options=QUIET)
    # the clean arm equals sinks.py and loss.py
    ss = sink_scores(tiny_model, ragged, options=QUIET)
    # other passes over the same prompts: the forward bound (probabilities; losses of ~ln 50 nats)
    assert torch.allclose(clean.scores_clean, ss.scores, atol=TINY_FORWARD, rtol=0)
    assert abs(clean.loss_clean - content_loss(tiny_model, ragged)) < TINY_FORWARD * 4
    assert clean.loss_reset != clean.loss_clean
    with tiny_model.hooks(fwd_hooks=[(act_name("resid_pre", 1), plant)]):
        planted = reset_massive_dims(tiny_model, ragged, dims=[5], from_layer=1, options=QUIET)
    # the plant runs before the reset hook at resid_pre 1, so resetting removes it exactly
    assert abs(planted.loss_reset - clean.loss_reset) < TINY_FORWARD * 4
    assert torch.allclose(planted.scores_reset, clean.scores_reset, atol=TINY_FORWARD, rtol=0)
    assert abs(planted.loss_clean - clean.loss_clean) > 1e-3


def test_massive_bad_input(tiny_model, ragged):
    with pytest.raises((ValueError, TypeCheckError), match="dims"):
        reset_massive_dims(tiny_model, ragged, dims=[999], from_layer=0)
    with pytest.raises(ValueError, match="from_layer"):
        reset_massive_dims(tiny_model, ragged, dims=[1], from_layer=2)
    with pytest.raises(ValueError, match="top_k"):
        massive_dims(tiny_model, ragged, top_k=0)
    one = tokenize(tiny_model, [[3]], bos="none", min_tokens=1)
    with pytest.raises(ValueError, match="at least 2"):
        massive_dims(tiny_model, one)


def test_sun_mean_reset_is_a_no_op_when_the_first_token_is_fixed(tiny_model, ragged):
    """Position 0 sees only itself: with <bos> always first its residual is the same in every prompt, so
    Sun et al.'s set-to-mean changes nothing, while removing the dims (others_mean) does."""
    md = massive_dims(tiny_model, ragged, top_k=2, threshold=1.0, options=QUIET)
    dims = tuple(int(d) for d in md.top_dims[1])
    sun = reset_massive_dims(tiny_model, ragged, dims=dims, from_layer=1, mode="sun_mean", first_mean=md.first_mean,
                             options=QUIET)
    others = reset_massive_dims(tiny_model, ragged, dims=dims, from_layer=1, options=QUIET)
    assert abs(sun.loss_reset - sun.loss_clean) < TINY_FORWARD * 4  # set to its own mean: nothing moves
    assert torch.allclose(sun.scores_reset, sun.scores_clean, atol=TINY_FORWARD, rtol=0)
    assert abs(others.loss_reset - others.loss_clean) > 1e-4
    assert sun.to_dict()["mode"] == "sun_mean" and others.mode == "others_mean"
    with pytest.raises(ValueError, match="first_mean"):
        reset_massive_dims(tiny_model, ragged, dims=dims, from_layer=1, mode="sun_mean")
    with pytest.raises(ValueError, match="mode"):
        reset_massive_dims(tiny_model, ragged, dims=dims, from_layer=1, mode="zero")
    # a second reset of the same batch takes the first's clean run over: what it would have run, exactly
    shared = reset_massive_dims(tiny_model, ragged, dims=dims, from_layer=1, clean=sun, options=QUIET)
    assert shared.loss_clean == others.loss_clean and torch.equal(shared.scores_clean, others.scores_clean)
    assert shared.loss_reset == others.loss_reset and torch.equal(shared.scores_reset, others.scores_reset)
    with pytest.raises(ValueError, match="not of this batch"):
        reset_massive_dims(tiny_model, ragged.slice(0, 1), dims=dims, from_layer=1, clean=sun)
