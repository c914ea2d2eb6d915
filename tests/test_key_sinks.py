"""Scores of every key position: streamed result equals the brute force from the full pattern."""

from __future__ import annotations

import math

import pytest
import torch

from sinkmech.hooks import act_name, cached_run
from sinkmech.key_sinks import key_sink_scores
from sinkmech.prompts import tokenize
from tests.conftest import TINY_BOS


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
    res = key_sink_scores(tiny_model, ragged, top_k=4, min_queries=3, batch_size=4, progress=False)
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
    a = key_sink_scores(tiny_model, ragged, top_k=3, min_queries=2, batch_size=1, progress=False)
    b = key_sink_scores(tiny_model, ragged, top_k=3, min_queries=2, batch_size=6, progress=False)
    assert torch.allclose(a.top_scores, b.top_scores, atol=1e-6)
    assert torch.allclose(a.by_position, b.by_position, atol=1e-6, equal_nan=True)


def test_planted_secondary_sink_is_flagged(tiny_model, ragged):
    """Head 1 of layer 0 is pushed to key 3 (scores +30); only that head is flagged there."""

    def plant(scores, hook):
        out = scores.clone()
        out[:, 1, :, 3] += 30.0
        return out

    with tiny_model.hooks(fwd_hooks=[(act_name("attn_scores", 0), plant)]):
        res = key_sink_scores(tiny_model, ragged, top_k=2, min_queries=3, progress=False)
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
    res = key_sink_scores(tiny_model, ragged, top_k=2, progress=False)
    df = res.to_dataframe()
    assert len(df) == tiny_model.cfg.n_layers * tiny_model.cfg.n_heads * 2
    assert '"key_scores"' in res.to_json()
