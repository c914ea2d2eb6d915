"""Scores of every key position: streamed result equals the brute force from the full pattern."""

from __future__ import annotations

import math

import pytest
import torch

from sinkmech.hooks import act_name, cached_run
from sinkmech.measures.key_sinks import key_sink_scores
from sinkmech.prompts import tokenize
from helpers.tiny import TINY_BOS
from sinkmech.options import QUIET, RunOptions


@pytest.fixture(scope="module")
def ragged(tiny_model, tiny_tokens):
    rows = [tiny_tokens[i, : 12 - i].tolist() for i in range(len(tiny_tokens))]  # lengths 12 .. 7
    return tokenize(tiny_model, rows, bos="prepend", max_tokens=12, bos_token_id=TINY_BOS)


def brute_alpha(model, batch, min_queries):
    """{(layer, head): {(prompt, key): alpha_k}} by explicit loops over the full pattern."""
    L = model.cfg.n_layers
    _, cache = cached_run(model, batch.tokens, [act_name("pattern", l) for l in range(L)])
    out = {}
    for l in range(L):
        pat = cache[act_name("pattern", l)]
        for h in range(model.cfg.n_heads):
            d = {}
            for p in range(len(batch)):
                n = int(batch.lengths[p])
                for k in range(n):
                    if k > 0 and n - k < min_queries:
                        continue
                    d[(p, k)] = sum(float(pat[p, h, t, k]) for t in range(k, n)) / (n - k)
            out[(l, h)] = d
    return out


def test_key_sinks_equal_brute_force(tiny_model, ragged):
    res = key_sink_scores(tiny_model, ragged, top_k=4, min_queries=3, options=RunOptions(batch_size=4, progress=False))
    brute = brute_alpha(tiny_model, ragged, 3)
    for (l, h), d in brute.items():
        want = sorted(d.values(), reverse=True)[:4]
        assert torch.allclose(res.top_scores[l, h], torch.tensor(want), atol=1e-5)
        for r in range(4):
            p, k = int(res.top_prompt[l, h, r]), int(res.top_position[l, h, r])
            assert math.isclose(d[(p, k)], float(res.top_scores[l, h, r]), abs_tol=1e-5)
            assert int(res.top_token_id[l, h, r]) == int(ragged.tokens[p, k])
        for k in range(ragged.tokens.shape[1]):
            vals = [v for (p, kk), v in d.items() if kk == k]
            if vals:
                assert math.isclose(float(res.by_position[l, h, k]), sum(vals) / len(vals), abs_tol=1e-5)
            else:
                assert math.isnan(float(res.by_position[l, h, k]))
    # the guard: the last key of each prompt (1 query) is never scored
    assert all((p, int(ragged.lengths[p]) - 1) not in brute[(0, 0)] for p in range(len(ragged)))


def test_key_sinks_batching_does_not_matter(tiny_model, ragged):
    a = key_sink_scores(tiny_model, ragged, top_k=3, min_queries=2, options=RunOptions(batch_size=1, progress=False))
    b = key_sink_scores(tiny_model, ragged, top_k=3, min_queries=2, options=RunOptions(batch_size=6, progress=False))
    assert torch.allclose(a.top_scores, b.top_scores, atol=1e-6)
    assert torch.allclose(a.by_position, b.by_position, atol=1e-6, equal_nan=True)


def test_planted_secondary_sink_is_flagged(tiny_model, ragged):
    """Head 1 of layer 0 is pushed to key 3 (scores +30); only that head is flagged there."""

    def plant(scores, hook):
        out = scores.clone()
        out[:, 1, :, 3] += 30.0
        return out

    with tiny_model.hooks(fwd_hooks=[(act_name("attn_scores", 0), plant)]):
        res = key_sink_scores(tiny_model, ragged, top_k=2, min_queries=3, options=QUIET)
    assert int(res.strongest_position[0, 1]) == 3
    assert (0, 1, 3) in res.flagged_heads()
    assert (res.top_position[0, 1] == 3).all()
    assert float(res.off_first_rate[0, 1]) == 1.0
    d = res.to_dict()
    assert d["key_scores"][0][1][0]["position"] == 3
    assert set(d["key_scores"][0][1][0]) == {"prompt", "position", "token", "score"}
    assert tiny_model.hook_dict[act_name("attn_scores", 0)].fwd_hooks == []


def test_key_sinks_bad_options(tiny_model, ragged):
    with pytest.raises(ValueError, match="top_k"):
        key_sink_scores(tiny_model, ragged, top_k=0)
    with pytest.raises(ValueError, match="min_queries"):
        key_sink_scores(tiny_model, ragged, min_queries=0)


def test_key_sinks_dataframe_and_json(tiny_model, ragged):
    res = key_sink_scores(tiny_model, ragged, top_k=2, options=QUIET)
    df = res.to_dataframe()
    assert len(df) == tiny_model.cfg.n_layers * tiny_model.cfg.n_heads * 2
    assert '"key_scores"' in res.to_json()


def _uniform(scores, hook):
    """Every query spreads its attention evenly over its keys 0..t."""
    T = scores.shape[-1]  # the causal mask built here: the TL 4 bridge hooks the scores before its own
    future = torch.ones(T, T, dtype=torch.bool, device=scores.device).triu(1)
    return torch.zeros_like(scores).masked_fill(future, float("-inf"))


def test_uniform_share_is_alpha_of_uniform_attention(ragged):
    """u_k equals key_alpha of an explicit uniform pattern, and the brute-force mean of 1/(t+1)."""
    from sinkmech.measures.key_sinks import key_alpha, uniform_share

    T = ragged.tokens.shape[1]
    pattern = torch.zeros(len(ragged), 1, T, T)
    for p, n in enumerate(ragged.lengths.tolist()):
        for t in range(n):
            pattern[p, 0, t, : t + 1] = 1.0 / (t + 1)
    u = uniform_share(ragged.lengths, T, 3)
    assert torch.allclose(u, key_alpha(pattern, ragged.lengths, 3)[:, 0], atol=1e-6, equal_nan=True)
    n = int(ragged.lengths[0])
    assert math.isclose(float(u[0, 2]), sum(1 / (t + 1) for t in range(2, n)) / (n - 2), rel_tol=1e-6)
    assert math.isclose(float(u[0, 0]), sum(1 / (t + 1) for t in range(n)) / n, rel_tol=1e-6)  # H_n / n


def test_uniform_attention_is_no_sink_against_the_uniform_share(tiny_model, ragged):
    """The null: with uniform attention the raw argmax still names position 0 in every head
    (the earliest key gets the largest uniform share), but no key of any head exceeds its
    uniform share: excess 0, ratio 1, nothing flagged, no prompt off position 0."""
    with tiny_model.hooks(fwd_hooks=[(act_name("attn_scores", l), _uniform) for l in range(tiny_model.cfg.n_layers)]):
        res = key_sink_scores(tiny_model, ragged, top_k=2, min_queries=3, options=QUIET)
    assert (res.strongest_position == 0).all()  # the raw score's bias
    scored = ~torch.isnan(res.uniform_by_position)
    assert res.excess_by_position[..., scored].abs().max() < 1e-5
    assert torch.allclose(res.ratio_by_position[..., scored], torch.ones(1), atol=1e-4)
    assert (res.max_excess < 1e-5).all() and not res.relative_flagged.any()
    assert (res.off_first_rate_relative == 0).all()


def test_planted_secondary_sink_is_flagged_against_the_uniform_share(tiny_model, ragged):
    """Head (0, 1) pushed to key 3 and head (0, 0) to key 0: the first is flagged relative to
    uniform at key 3 with an excess of about 1 - u_3; the second has its largest excess at
    position 0 (a first-token sink, not flagged)."""

    def plant(scores, hook):
        out = _uniform(scores, hook)
        out[:, 1, :, 3] += 30.0
        out[:, 0, :, 0] += 30.0
        return out

    with tiny_model.hooks(fwd_hooks=[(act_name("attn_scores", 0), plant)]):
        res = key_sink_scores(tiny_model, ragged, top_k=2, min_queries=3, options=QUIET)
    assert (0, 1, 3) in res.relative_flagged_heads()
    assert math.isclose(float(res.max_excess[0, 1]), 1 - float(res.uniform_by_position[3]), abs_tol=1e-3)
    assert int(res.strongest_relative_position[0, 0]) == 0 and not bool(res.relative_flagged[0, 0])
    assert float(res.max_excess[0, 0]) > 0.5
    assert float(res.off_first_rate_relative[0, 1]) == 1.0 and float(res.off_first_rate_relative[0, 0]) == 0.0
    d = res.to_dict()
    assert [0, 1, 3] in d["relative_flagged"] and "key_scores" in d and "flagged" in d  # old keys kept
    assert math.isclose(d["excess_by_position"][0][1][3], float(res.max_excess[0, 1]), abs_tol=1e-6)
    with pytest.raises(ValueError, match="min_excess"):
        key_sink_scores(tiny_model, ragged, min_excess=1.0)
