"""Sinks vs evaluation length: each length equals sinks.py and ablation.py called directly."""

from __future__ import annotations

import pytest
import torch

from sinkmech.eval_length import sinks_vs_length, truncate
from sinkmech.interventions.ablation import head_ablations
from sinkmech.prompts import tokenize
from sinkmech.sinks import sink_scores
from tests.conftest import TINY_BOS


@pytest.fixture(scope="module")
def long_batch(tiny_model):
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(2, 50, (3, 40), generator=g)
    rows = [ids[0].tolist(), ids[1].tolist(), ids[2, :35].tolist()]  # the shortest has 35 content tokens
    return tokenize(tiny_model, rows, bos="prepend", max_tokens=40, bos_token_id=TINY_BOS)


def test_sweep_equals_direct_calls(tiny_model, long_batch):
    res = sinks_vs_length(tiny_model, long_batch, lengths=(8, 16, 32, 36, 64), top_k=2, eps=(0.3,), progress=False)
    assert res.lengths == (8, 16, 32)
    skipped = dict(res.skipped)
    assert "context" in skipped[64]  # 65 positions > n_ctx 64
    assert "35 content tokens" in skipped[36]
    for i, T in enumerate(res.lengths):
        sub = truncate(long_batch, T)
        assert sub.tokens.shape[1] == T + 1
        ss = sink_scores(tiny_model, sub, progress=False)
        assert abs(float(res.sink_rate[i, 0]) - ss.sink_rate(0.3)) < 1e-6
        assert abs(float(res.uniform_score[i]) - ss.uniform_score()) < 1e-6  # stored as float32
        for r, (l, h, s) in enumerate(ss.top_heads(2)):
            assert (int(res.top_layer[i, r]), int(res.top_head[i, r])) == (l, h)
            abl = head_ablations(tiny_model, sub, mode="mask_first", layers=[l], heads=[h], progress=False)
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
