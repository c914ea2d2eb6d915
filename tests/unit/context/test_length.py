"""Sinks vs evaluation length: each length equals sinks.py and ablation.py called directly."""

from __future__ import annotations

import pytest
import torch

from sinkmech.context.length import sinks_vs_length, truncate
from sinkmech.interventions.ablation import head_ablations
from sinkmech.prompts import tokenize
from sinkmech.measures.sinks import sink_scores
from helpers.tiny import TINY_BOS
from helpers.backends import needs
from sinkmech.options import QUIET


@pytest.fixture(scope="module")
def long_batch(tiny_model):
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(2, 50, (3, 40), generator=g)
    rows = [ids[0].tolist(), ids[1].tolist(), ids[2, :35].tolist()]  # the shortest has 35 content tokens
    return tokenize(tiny_model, rows, bos="prepend", max_tokens=40, bos_token_id=TINY_BOS)


def test_sweep_equals_direct_calls(tiny_model, long_batch):
    res = sinks_vs_length(tiny_model, long_batch, lengths=(8, 16, 32, 36, 64), top_k=2, eps=(0.3,), options=QUIET)
    assert res.lengths == (8, 16, 32)
    skipped = dict(res.skipped)
    assert "context" in skipped[64]  # 65 positions > n_ctx 64
    assert "35 content tokens" in skipped[36]
    for i, T in enumerate(res.lengths):
        sub = truncate(long_batch, T)
        assert sub.tokens.shape[1] == T + 1
        ss = sink_scores(tiny_model, sub, options=QUIET)
        assert abs(float(res.sink_rate[i, 0]) - ss.sink_rate(0.3)) < 1e-6
        assert abs(float(res.uniform_score[i]) - ss.uniform_score()) < 1e-6  # stored as float32
        for r, (l, h, s) in enumerate(ss.top_heads(2)):
            assert (int(res.top_layer[i, r]), int(res.top_head[i, r])) == (l, h)
            abl = head_ablations(tiny_model, sub, mode="mask_first", layers=[l], heads=[h], options=QUIET)
            assert abs(float(res.mask_first_cost[i, r]) - float(abl.effects[0, 0])) < 1e-6
    assert res.uniform_score[0] > res.uniform_score[-1]  # the uniform baseline H_T / T falls with T
    d = res.to_dict()
    assert [r["length"] for r in d["results"]] == [8, 16, 32]
    assert {s["length"] for s in d["skipped"]} == {36, 64}
    assert len(res.to_dataframe()) == 3 * 2


def test_sweep_bad_input(tiny_model, long_batch):
    with pytest.raises(ValueError, match="lengths"):
        sinks_vs_length(tiny_model, long_batch, lengths=(1,))
    with pytest.raises(ValueError, match="top_k"):
        sinks_vs_length(tiny_model, long_batch, top_k=0)


def test_relative_rate_and_fixed_head_equal_direct_calls(tiny_model, long_batch):
    """The baseline-relative rate is the share of (prompt, head) pairs with alpha_0 > m x H_T / T,
    counted by hand from sink_scores; the fixed head is the top head at the shortest length,
    tracked (score and mask_first cost) at every length, even where it is not a top head."""
    res = sinks_vs_length(tiny_model, long_batch, lengths=(4, 16, 32), top_k=1, eps=(0.3,),
                          uniform_multiples=(1.0, 2.0, 4.0), options=QUIET)
    first = sink_scores(tiny_model, truncate(long_batch, 4), options=QUIET)
    (l0, h0, _), = first.top_heads(1)
    assert (res.fixed_layer, res.fixed_head, res.fixed_chosen_at) == (l0, h0, 4)
    d = res.to_dict()
    assert d["fixed_head"]["label"] == f"L{l0}.H{h0}" and d["fixed_head"]["chosen_at_length"] == 4
    for i, T in enumerate(res.lengths):
        sub = truncate(long_batch, T)
        ss = sink_scores(tiny_model, sub, options=QUIET)
        u = sum(1 / (t + 1) for t in range(T + 1)) / (T + 1)  # T content tokens + <bos>
        for j, m in enumerate((1.0, 2.0, 4.0)):
            want = 100.0 * sum(float(a) > m * u for a in ss.scores.flatten()) / ss.scores.numel()
            assert abs(float(res.relative_rate[i, j]) - want) < 1e-4
            assert abs(d["results"][i]["relative_threshold"][repr(m)] - m * u) < 1e-6
            # alpha_0 <= 1: a threshold m x H_T / T >= 1 cannot be passed and is written as null
            assert (d["results"][i]["relative_sink_rate"][repr(m)] is None) == (m * u >= 1)
        assert abs(float(res.fixed_score[i]) - float(ss.mean_scores()[l0, h0])) < 1e-6
        abl = head_ablations(tiny_model, sub, mode="mask_first", layers=[l0], heads=[h0], options=QUIET)
        assert abs(float(res.fixed_cost[i]) - float(abl.effects[0, 0])) < 1e-6
        assert d["results"][i]["fixed_head"]["score_over_uniform"] == pytest.approx(float(res.fixed_score[i]) / u, rel=1e-5)
    assert d["results"][0]["relative_sink_rate"]["4.0"] is None  # 4 x H_5 / 5 = 1.83


def test_uniform_attention_is_no_sink_at_any_length_against_the_uniform_share(tiny_model, long_batch):
    """The null: a uniform head scores alpha_0 = H_T / T exactly, so at m = 1.5 no pair passes at any
    length, while the fixed eps 0.2 calls every head a sink at T = 8 (H_9 / 9 = 0.31) and none at 32 (0.12)."""
    from sinkmech.hooks import act_name

    def uniform(scores, hook):
        T = scores.shape[-1]  # the causal mask built here: the TL 4 bridge hooks the scores before its own
        future = torch.ones(T, T, dtype=torch.bool, device=scores.device).triu(1)
        return torch.zeros_like(scores).masked_fill(future, float("-inf"))

    hooks = [(act_name("attn_scores", l), uniform) for l in range(tiny_model.cfg.n_layers)]
    with tiny_model.hooks(fwd_hooks=hooks):
        res = sinks_vs_length(tiny_model, long_batch, lengths=(8, 32), top_k=1, eps=(0.2,),
                              uniform_multiples=(1.5,), options=QUIET)
    assert (res.relative_rate == 0).all()
    assert res.sink_rate[:, 0].tolist() == [100.0, 0.0]


def test_a_named_fixed_head_is_tracked(tiny_model, long_batch):
    res = sinks_vs_length(tiny_model, long_batch, lengths=(8, 16), top_k=1, fixed_head=(1, 2), options=QUIET)
    assert (res.fixed_layer, res.fixed_head, res.fixed_chosen_at) == (1, 2, None)
    assert res.to_dict()["fixed_head"]["rule"] == "named by the caller"
    with pytest.raises(ValueError, match="fixed_head"):
        sinks_vs_length(tiny_model, long_batch, fixed_head=(9, 0))
    with pytest.raises(ValueError, match="uniform_multiples"):
        sinks_vs_length(tiny_model, long_batch, uniform_multiples=(0.0,))


@needs("from_config", why="builds a HookedTransformer with a 128-position context")
def test_lengths_past_64_content_tokens_run():
    """Regression: the per-length mask_first ablation got a TokenBatch of T > 64 content
    tokens and refused it against its default max_tokens (64); a ready TokenBatch is now
    checked only against a max_tokens the caller gives. Needs a context above 64."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_heads=2, d_head=8, n_ctx=128, d_vocab=50, act_fn="gelu",
                                  positional_embedding_type="rotary", device="cpu", seed=0)
    model = HookedTransformer(cfg).eval()
    ids = torch.randint(2, 50, (2, 100), generator=torch.Generator().manual_seed(0))
    batch = tokenize(model, ids, bos="prepend", max_tokens=100, bos_token_id=TINY_BOS)
    res = sinks_vs_length(model, batch, lengths=(32, 80), top_k=1, options=QUIET)
    assert res.lengths == (32, 80) and torch.isfinite(res.fixed_cost).all()
    with pytest.raises(ValueError, match="more than max_tokens=64"):  # a max_tokens given is still checked
        head_ablations(model, truncate(batch, 80), mode="mask_first", max_tokens=64, options=QUIET)
