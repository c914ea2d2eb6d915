"""One definition of each quantity: every path that reports alpha_0, a sink
rate or a masked next-token loss gives the same numbers, and they equal a
brute-force computation from the full attention pattern / full logits.
"""

from __future__ import annotations

import math

import pytest
import torch

from sinkmech.dormant.scan import scan_heads
from sinkmech.context.length import sinks_vs_length
from sinkmech.hooks import act_name, cached_run
from sinkmech.measures.loss import content_loss, masked_loss, target_mask
from sinkmech.measures.massive import reset_massive_dims
from sinkmech.prompts import tokenize
from sinkmech.measures.sinks import check_eps, first_key_score, sink_scores
from sinkmech.context.stream import stream_perplexity
from sinkmech.measures.value_weighted import value_weighted_first
from helpers.tiny import TINY_BOS
from sinkmech.options import QUIET, RunOptions
from sinkmech.dormant.labels import Thresholds


@pytest.fixture(scope="module", params=["prepend", "none"])
def ragged(request, tiny_model, tiny_tokens):
    rows = [tiny_tokens[i, : 12 - i].tolist() for i in range(5)]  # 12 .. 8 content tokens: padding inside
    return tokenize(tiny_model, rows, bos=request.param, max_tokens=12, bos_token_id=TINY_BOS)


def brute_alpha0(model, batch):
    """[prompt, layer, head]: mean over the real queries t = 0 .. T-1 of A[t, 0], by loops."""
    L = model.cfg.n_layers
    _, cache = cached_run(model, batch.tokens, [act_name("pattern", l) for l in range(L)])
    out = torch.zeros(len(batch), L, model.cfg.n_heads)
    for p in range(len(batch)):
        T = int(batch.lengths[p])
        for l in range(L):
            out[p, l] = cache[act_name("pattern", l)][p, :, :T, 0].float().mean(-1)
    return out


@torch.no_grad()
def brute_loss(model, batch):
    """Mean next-token loss over content targets 1 .. n-1, from the full logits."""
    logits = model(batch.tokens).float()
    lp = torch.log_softmax(logits, -1)
    total, n = 0.0, 0
    for p in range(len(batch)):
        T = int(batch.lengths[p])
        for t in range(batch.offset, T - 1):  # position t predicts t + 1: content targets 1 .. n-1
            total -= float(lp[p, t, batch.tokens[p, t + 1]])
            n += 1
    return total / n


def test_alpha0_is_one_definition_on_every_path(tiny_model, ragged):
    want = brute_alpha0(tiny_model, ragged)
    paths = {
        "sinks.sink_scores": sink_scores(tiny_model, ragged, options=RunOptions(batch_size=2, progress=False)).scores,
        "massive clean": reset_massive_dims(tiny_model, ragged, dims=(0,), from_layer=0,
                                            options=RunOptions(batch_size=3, progress=False)).scores_clean,
        "value_weighted.attn_first": value_weighted_first(tiny_model, ragged,
                                                          options=RunOptions(batch_size=4, progress=False)).attn_first,
    }
    for name, got in paths.items():
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5, msg=f"{name} is not alpha_0")
    assert (want > 0).all() and (want <= 1 + 1e-6).all()


def test_first_key_score_ignores_padding_queries():
    pattern = torch.zeros(2, 1, 4, 4)
    pattern[..., 0] = 1.0  # every query on key 0 ...
    pattern[1, :, 2:, 0] = 99.0  # ... except padding queries of prompt 1, which must not count
    got = first_key_score(pattern, torch.tensor([4, 2]))
    torch.testing.assert_close(got, torch.ones(2, 1))


def test_masked_loss_is_one_definition_on_every_path(tiny_model, ragged):
    want = brute_loss(tiny_model, ragged)
    paths = {
        "sink_scores(loss=True)": sink_scores(tiny_model, ragged, loss=True,
                                              options=RunOptions(batch_size=2, progress=False)).loss,
        "content_loss": content_loss(tiny_model, ragged, options=RunOptions(batch_size=3)),
        "massive clean": reset_massive_dims(tiny_model, ragged, dims=(0,), from_layer=0,
                                            options=RunOptions(batch_size=4, progress=False)).loss_clean,
    }
    for name, got in paths.items():
        assert got == pytest.approx(want, rel=1e-5), name


def test_stream_full_perplexity_is_the_masked_loss(tiny_model, tiny_tokens):
    batch = tokenize(tiny_model, [tiny_tokens[0].tolist()], bos="prepend", bos_token_id=TINY_BOS)
    res = stream_perplexity(tiny_model, batch, window=3, keep=(0,), options=QUIET)
    T = int(batch.lengths[0])
    mask = torch.zeros(1, T, dtype=torch.bool)
    mask[0, res.scored_from: T - 1] = True
    total, n = masked_loss(tiny_model, batch.tokens[:, :T], mask)
    with torch.no_grad():
        lp = torch.log_softmax(tiny_model(batch.tokens[:, :T]).float(), -1)
    brute = -sum(float(lp[0, t, batch.tokens[0, t + 1]]) for t in range(res.scored_from, T - 1))
    assert n == res.n_scored == T - 1 - res.scored_from
    assert total == pytest.approx(brute, rel=1e-5)
    assert res.full_ppl == pytest.approx(math.exp(brute / n), rel=1e-5)


def test_masked_loss_with_an_intervention_hook_changes_the_loss(tiny_model, ragged):
    mask = target_mask(ragged)
    clean, n = masked_loss(tiny_model, ragged.tokens, mask)
    zero = [(act_name("resid_post", 0), lambda x, hook: torch.zeros_like(x))]
    hooked, m = masked_loss(tiny_model, ragged.tokens, mask, zero)
    assert n == m == int(mask.sum())
    assert hooked != pytest.approx(clean)


@pytest.mark.parametrize("eps", [1.0, -0.1, 1.5])
def test_every_sink_rate_refuses_the_same_bad_eps(tiny_model, ragged, eps):
    ss = sink_scores(tiny_model, ragged, options=QUIET)
    mi = reset_massive_dims(tiny_model, ragged, dims=(0,), from_layer=0, options=QUIET)
    calls = [lambda: check_eps(eps), lambda: ss.sink_rate(eps), lambda: ss.per_layer_sink_rate(eps),
             lambda: mi.sink_rate(eps), lambda: mi.sink_rate(eps, "reset"),
             lambda: sinks_vs_length(tiny_model, ragged, lengths=(4,), top_k=1, eps=(eps,), options=QUIET)]
    for call in calls:
        with pytest.raises(ValueError, match=r"epsilon must lie in \[0, 1\)"):
            call()


def test_sink_rates_agree_across_results(tiny_model, ragged):
    ss = sink_scores(tiny_model, ragged, options=QUIET)
    mi = reset_massive_dims(tiny_model, ragged, dims=(0,), from_layer=0, options=QUIET)
    for eps in (0.0, 0.2, "0.3", 0.8):
        assert ss.sink_rate(eps) == pytest.approx(mi.sink_rate(eps, "clean"))
        assert ss.sink_rate(eps) == pytest.approx(100.0 * float((brute_alpha0(tiny_model, ragged) > float(eps)).float().mean()))


def test_scan_first_key_attention_leaves_out_query_0(tiny_model, tiny_tokens):
    """Equal lengths T: the scan's pooled mean over queries t >= 1 is
    mean_p (T alpha_0 - 1) / (T - 1), alpha_0 counting query 0's A[0, 0] = 1."""
    batch = tokenize(tiny_model, tiny_tokens.tolist(), bos="prepend", max_tokens=12, bos_token_id=TINY_BOS)
    T = int(batch.lengths[0])
    assert (batch.lengths == T).all()
    alpha0 = sink_scores(tiny_model, batch, options=QUIET).scores
    scan = scan_heads(tiny_model, batch, thresholds=Thresholds(min_queries=1), options=QUIET)
    want = ((T * alpha0 - 1) / (T - 1)).mean(0)
    torch.testing.assert_close(scan.first_key_attention_excl_q0, want, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(scan.first_key_attention_excl_q0, alpha0.mean(0), atol=1e-3)
