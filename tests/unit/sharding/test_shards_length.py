"""The evaluation-length sweep in two sharded stages (sinkmech.sharding.length):
shards of 1, 2 and 3, each stage merged in any order, give the one-pass
`sinks_vs_length`: the same per-prompt rows, the same chosen heads, the same
sweep (the mask_first costs to float32 rounding: each shard's KL is its own mean)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
import torch
from helpers.tiny import TINY_BOS, make_tiny
from helpers.tolerance import SAME_TERMS, kl_atol

from sinkmech.context.length import (
    check_sweep, choose_heads, length_costs, length_scores, long_prompt_texts, plan_lengths, sinks_vs_length, truncate,
)
from sinkmech.sharding.length import (
    costs_partial, length_heads, length_result, prompt_rows, row_key, scores_partial, scores_result, scores_shard,
    sweep_settings,
)
from sinkmech.sharding.measures import SINK_ROWS
from sinkmech.prompts import tokenize
from sinkmech.sharding.format import PartialError, detach, merge, shard_span
from sinkmech.options import QUIET, RunOptions

N_PROMPTS = 7
LENGTHS = (4, 16, 24, 32, 64)  # 32: beyond the shortest prompt (30), which only shard 3 of 3 holds; 64: the context
OPTIONS = {"top_k": 2, "eps": (0.3, 0.8), "uniform_multiples": (2.0, 4.0), "fixed_head": None}
KL_BOUND = kl_atol(50)  # the tiny model's 50-word vocabulary


@pytest.fixture(scope="module")
def model():
    return make_tiny(4)


@pytest.fixture(scope="module")
def corpus():
    """7 prompts of 40 content tokens but the last (30)."""
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(2, 50, (N_PROMPTS, 40), generator=g)
    return [row.tolist() for row in ids[:-1]] + [ids[-1, :30].tolist()]


def batch_of(model, corpus, idx):
    return tokenize(model, [corpus[i] for i in idx], bos="prepend", max_tokens=40, bos_token_id=TINY_BOS)


def stage1(model, corpus, span, shard, batch_size, options):
    """What a stage-1 shard runs: the scores at every length its own prompts allow."""
    lengths, eps, multiples = check_sweep(model.cfg.n_layers, model.cfg.n_heads, lengths=LENGTHS, **options)
    batch = batch_of(model, corpus, span)
    done, _ = plan_lengths(lengths, model.cfg.n_ctx, int(batch.lengths.min()) - batch.offset)
    scores = length_scores(model, batch, done, options=RunOptions(batch_size=batch_size, progress=False))
    sweep = sweep_settings(lengths=lengths, top_k=options["top_k"], eps=eps, uniform_multiples=multiples,
                           fixed_head=options["fixed_head"])
    return scores_partial(scores, batch, {"run": "test", **sweep}, cfg=model.cfg, prompt_index=span, shard=shard,
                          n_prompts_total=N_PROMPTS)


def stage2(model, corpus, merged_scores, span, shard):
    """What a stage-2 shard runs: the chosen heads' costs on its prompts, its stage-1 rows attached."""
    heads = length_heads(merged_scores)
    rows = prompt_rows(merged_scores)
    scores = scores_shard(merged_scores.settings, [rows[i] for i in span], prompt_index=span, shard=shard,
                          n_prompts_total=N_PROMPTS)
    batch = batch_of(model, corpus, span)
    return costs_partial(length_costs(model, batch, heads, options=QUIET), heads, batch, {"run": "test"},
                         scores=scores, prompt_index=span, shard=shard, n_prompts_total=N_PROMPTS)


def run_sharded(model, corpus, n, batch_size=1, options=OPTIONS):
    spans = [shard_span(N_PROMPTS, i, n) for i in range(1, n + 1)]
    return [stage1(model, corpus, s, (i, n), batch_size, options) for i, s in enumerate(spans, 1)], spans


def same_sweep(got, one, cost_atol):
    """Every field equal; the costs (KL divergences, nats) within `cost_atol` (0: exactly)."""
    for name in ("lengths", "eps", "skipped", "bos", "n_prompts", "model_name", "uniform_multiples", "fixed_layer",
                 "fixed_head", "fixed_chosen_at"):
        assert getattr(got, name) == getattr(one, name), name
    for name in ("sink_rate", "mean_score", "uniform_score", "top_layer", "top_head", "top_score", "relative_rate",
                 "fixed_score"):
        assert torch.equal(getattr(got, name), getattr(one, name)), name
    for name in ("mask_first_cost", "fixed_cost"):
        torch.testing.assert_close(getattr(got, name), getattr(one, name), rtol=0, atol=cost_atol, msg=name)


@pytest.mark.parametrize("n", [pytest.param(1, marks=pytest.mark.slow), 2, pytest.param(3, marks=pytest.mark.slow)])
def test_two_stage_shards_merged_in_any_order_equal_the_one_pass_sweep(model, corpus, n):
    # batch_size 1: every prompt is its own forward pass in both runs, so the rows are bitwise equal
    whole = batch_of(model, corpus, range(N_PROMPTS))
    one = sinks_vs_length(model, whole, lengths=LENGTHS, options=RunOptions(batch_size=1, progress=False), **OPTIONS)
    assert one.lengths == (4, 16, 24) and dict(one.skipped)[32] == "the shortest prompt has 30 content tokens"
    assert float(one.mask_first_cost.min()) > 1e-4  # the ablations do something to compare
    direct = length_scores(model, whole, one.lengths, options=RunOptions(batch_size=1, progress=False))
    parts, spans = run_sharded(model, corpus, n)
    merged = None
    for perm in itertools.permutations(parts):
        m = merge(perm)
        m.check_complete()
        scores, skipped = scores_result(m)
        assert tuple(scores) == one.lengths and skipped == one.skipped
        for T, ss in scores.items():  # per-prompt rows: exact
            for k in SINK_ROWS:
                assert torch.equal(getattr(ss, k), getattr(direct[T], k)), (n, T, k)
        assert length_heads(m) == choose_heads(direct, OPTIONS["top_k"])  # identical heads, scores included
        merged = m
    costs = [stage2(model, corpus, merged, s, (i, n)) for i, s in enumerate(spans, 1)]
    for perm in itertools.permutations(costs):
        got = length_result(merge(perm))
        # one shard: the one-pass sweep, bitwise; more: passes of the shard's prompts (a KL's float32 bound)
        same_sweep(got, one, cost_atol=0 if n == 1 else KL_BOUND)
        assert got.to_dict()["results"][0]["top_heads"][0]["layer"] == int(one.top_layer[0, 0])
    # the merged sums are the shards' sums (float64), each shard's KL mean times its content positions
    m = merge(costs)
    for T in one.lengths:
        want = sum(float(head_cost) * len(s) * T for s, part in zip(spans, costs)
                   for head_cost in part.sums[row_key(T, "cost_sum")] / part.sums[row_key(T, "weight")][0])
        np.testing.assert_allclose(m.sums[row_key(T, "cost_sum")].sum(), want, rtol=SAME_TERMS)
        assert m.sums[row_key(T, "weight")][0] == N_PROMPTS * T


def test_a_shard_too_short_for_a_length_stores_it_as_nan(model, corpus):
    parts, _ = run_sharded(model, corpus, 3)
    assert np.isnan(parts[2].rows[row_key(32, "scores")]).all()  # holds the 30-token prompt
    assert not np.isnan(parts[0].rows[row_key(32, "scores")]).any()
    assert row_key(64, "scores") not in parts[0].rows  # beyond the context: never measured


def test_batched_shards_agree_with_the_batched_one_pass_sweep(model, corpus):
    """Batches of 8 (the default): no prompt is padded at any length, so the rows agree to float32 rounding
    (the tiny model's forward bound; the costs, KL divergences, to a KL's bound)."""
    one = sinks_vs_length(model, batch_of(model, corpus, range(N_PROMPTS)), lengths=LENGTHS, options=QUIET, **OPTIONS)
    parts, spans = run_sharded(model, corpus, 2, batch_size=8)
    merged = merge(parts)
    got = length_result(merge([stage2(model, corpus, merged, s, (i, 2)) for i, s in enumerate(spans, 1)]))
    assert torch.equal(got.top_layer, one.top_layer) and torch.equal(got.top_head, one.top_head)
    torch.testing.assert_close(got.sink_rate, one.sink_rate)
    torch.testing.assert_close(got.mask_first_cost, one.mask_first_cost, rtol=0, atol=KL_BOUND)


def test_a_named_fixed_head_and_a_stage2_split_other_than_stage1s(model, corpus):
    """The fixed head named by the caller; stage 1 in 3 shards, stage 2 in 2."""
    options = {**OPTIONS, "top_k": 1, "fixed_head": (1, 2)}
    one = sinks_vs_length(model, batch_of(model, corpus, range(N_PROMPTS)), lengths=LENGTHS,
                          options=RunOptions(batch_size=1, progress=False), **options)
    parts, _ = run_sharded(model, corpus, 3, options=options)
    merged = merge(parts)
    spans = [shard_span(N_PROMPTS, i, 2) for i in (1, 2)]
    got = length_result(merge([stage2(model, corpus, merged, s, (i, 2)) for i, s in enumerate(spans, 1)]))
    assert (got.fixed_layer, got.fixed_head, got.fixed_chosen_at) == (1, 2, None)
    same_sweep(got, one, cost_atol=KL_BOUND)


def test_stage2_parts_of_other_heads_are_refused(model, corpus):
    parts, spans = run_sharded(model, corpus, 2)
    merged = merge(parts)
    costs = [stage2(model, corpus, merged, s, (i, 2)) for i, s in enumerate(spans, 1)]
    heads = dict(costs[1].settings["heads"], fixed=[0, 0])
    odd = replace(costs[1], settings={**costs[1].settings, "heads": heads})
    with pytest.raises(PartialError, match=r"differ in setting 'heads.fixed'"):
        merge([costs[0], odd])
    # heads that the attached scores do not choose (both parts changed alike)
    both = [replace(p, settings={**p.settings, "heads": heads}) for p in costs]
    with pytest.raises(ValueError, match="not the ones their stage-1 scores choose"):
        length_result(merge(both))
    assert detach(merge(costs), "scores").kind == "length_scores"


def test_shards_of_the_long_texts_tokenize_row_for_row_as_the_whole_list(monkeypatch):
    """`long_prompts` tokenizes each text alone: a shard's rows, cut to any measured length, are the
    whole corpus' rows (the batch pads to its own widest row, which the cut removes)."""
    from helpers.tiny import WordTokenizer, toy_tokenizer

    model = make_tiny(5)
    toy_tokenizer(monkeypatch, model, WordTokenizer())
    texts, n_tokens = long_prompt_texts(model, 6, 100)
    assert n_tokens == model.cfg.n_ctx - 1 and len(texts) == 6
    whole = tokenize(model, texts, bos="prepend", max_tokens=n_tokens)
    shortest = int(whole.lengths.min()) - 1
    for span in (range(0, 2), range(2, 6)):
        part = tokenize(model, [texts[i] for i in span], bos="prepend", max_tokens=n_tokens)
        for T in (2, shortest):
            assert torch.equal(truncate(part, T).tokens, truncate(whole, T).tokens[span.start:span.stop])
