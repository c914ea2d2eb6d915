"""Shards of 1, 2 and 3, merged in any order, equal the one-pass result for the
mechanism analyses and patching: per-prompt rows bitwise (every forward pass
holds one prompt in both runs), float64 sums to 1e-9 relative, and the
labels drawn from them (onset, massive dims, top keys) identical."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from helpers.tiny import make_tiny

from sinkmech.sharding.format import merge, shard_span
from sinkmech.prompts import tokenize
from sinkmech.options import QUIET, RunOptions

N_PROMPTS = 10
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def model():
    return make_tiny(3)


@pytest.fixture(scope="module")
def ragged():
    """10 prompts of 5 to 19 content tokens (ids in [2, 50): none is <bos>)."""
    g = torch.Generator().manual_seed(0)
    return [torch.randint(2, 50, (int(n),), generator=g).tolist() for n in torch.randint(5, 20, (N_PROMPTS,), generator=g)]


def batch_of(model, prompts, idx, bos="prepend"):
    return tokenize(model, [prompts[i] for i in idx], bos=bos, max_tokens=MAX_TOKENS, bos_token_id=1)


def merged_shards(make_part, n: int):
    """Every order of the n shards' parts, merged (and checked complete)."""
    spans = [shard_span(N_PROMPTS, i, n) for i in range(1, n + 1)]
    parts = [make_part(span, (i, n)) for i, span in enumerate(spans, 1)]
    for perm in itertools.permutations(parts):
        m = merge(perm)
        m.check_complete()
        yield m


def assert_sums_close(got, want, rel=1e-9):
    assert set(got.sums) == set(want.sums)
    for k in want.sums:
        np.testing.assert_allclose(got.sums[k], want.sums[k], rtol=rel, atol=0, err_msg=k)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_value_weighted_shards_equal_the_one_pass_result(model, ragged, n):
    from sinkmech.sharding.measures import value_weighted_partial, value_weighted_result
    from sinkmech.measures.value_weighted import value_weighted_first

    def run(idx):
        return value_weighted_first(model, batch_of(model, ragged, idx),
                                    options=RunOptions(batch_size=1, progress=False))

    one = run(range(N_PROMPTS))
    for m in merged_shards(lambda span, sh: value_weighted_partial(run(span), {}, prompt_index=span, shard=sh,
                                                                   n_prompts_total=N_PROMPTS), n):
        got = value_weighted_result(m)
        for k in ("attn_first", "output_first", "lengths"):
            assert torch.equal(getattr(got, k), getattr(one, k)), k
        assert got.to_dict() == one.to_dict()


@pytest.mark.parametrize("n", [1, 2, 3])
def test_massive_shards_equal_the_one_pass_result(model, ragged, n):
    """A planted massive dimension (d 5 of position 0 from layer 1 on), found the
    same way by the merged shards: same sums, onset, top and massive dims."""
    from sinkmech.hooks import act_name
    from sinkmech.measures.massive import massive_dims, massive_sums
    from sinkmech.sharding.measures import massive_partial, massive_result

    def plant(resid, hook):
        out = resid.clone()
        out[:, 0, 5] = 5000.0
        return out

    opts = {"top_k": 2, "threshold": 10.0, "sun_min_abs": 100.0, "sun_min_ratio": 1000.0}

    def part(idx, sh):
        batch = batch_of(model, ragged, idx)
        return massive_partial(massive_sums(model, batch,
                                            options=RunOptions(batch_size=1, progress=False)), batch, {**opts},
                               prompt_index=idx, shard=sh, n_prompts_total=N_PROMPTS)

    with model.hooks(fwd_hooks=[(act_name("resid_pre", 1), plant)]):
        one = massive_dims(model, batch_of(model, ragged, range(N_PROMPTS)),
                           options=RunOptions(batch_size=1, progress=False), **opts)
        one_part = part(range(N_PROMPTS), (1, 1))
        merged = list(merged_shards(part, n))
    assert one.massive_dims == (5,) and one.onset_layer == 1
    for m in merged:
        assert_sums_close(m, one_part)
        got = massive_result(m, **opts, model_name=model.cfg.model_name)
        assert got.onset_layer == one.onset_layer and got.massive_dims == one.massive_dims
        assert torch.equal(got.top_dims, one.top_dims)
        for k in ("first_abs", "median_abs", "norm_ratio", "sq_share", "hidden_median", "first_mean"):
            torch.testing.assert_close(getattr(got, k), getattr(one, k), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("noise", [False, True])
@pytest.mark.parametrize("n", [pytest.param(1, marks=pytest.mark.slow), 2, 3])  # 1: the fast suite keeps 2 and 3
def test_perturbation_spread_shards_equal_the_one_pass_result(model, ragged, n, noise):
    """The noise of each prompt is the one the whole corpus' run draws for it."""
    from sinkmech.interventions.perturb import EmbeddingNoise, TokenSwap, perturbation_spread
    from sinkmech.sharding.interventions import spread_partial, spread_result

    prompts = [[7, 8, *p] for p in ragged]  # every prompt holds the swapped token at content position 0
    pert = EmbeddingNoise(0.5, 2, seed=3) if noise else TokenSwap([7], [9])

    def run(idx, **kw):
        return perturbation_spread(model, [prompts[i] for i in idx], perturbation=pert, max_tokens=MAX_TOKENS,
                                   options=RunOptions(batch_size=1, progress=False, bos_token_id=1), **kw)

    one = run(range(N_PROMPTS))
    want = spread_partial(one, {}, width=MAX_TOKENS, prompt_index=range(N_PROMPTS))
    for m in merged_shards(lambda span, sh: spread_partial(
            run(span, first_prompt=span.start, n_prompts_total=N_PROMPTS), {}, width=MAX_TOKENS, prompt_index=span,
            shard=sh, n_prompts_total=N_PROMPTS), n):
        assert_sums_close(m, want)
        got = spread_result(m)
        assert torch.equal(got.change.isnan(), one.change.isnan())
        assert torch.equal(torch.nan_to_num(got.change), torch.nan_to_num(one.change))
        assert torch.equal(got.last_changed, one.last_changed) and got.kind == one.kind
        torch.testing.assert_close(got.entropy, one.entropy, rtol=1e-6, atol=0)
        torch.testing.assert_close(got.normalized_entropy, one.normalized_entropy, rtol=1e-6, atol=0)
        assert got.per_layer()["spread_fraction"].equal(one.per_layer()["spread_fraction"])


def test_a_shard_draws_the_corpus_noise_not_its_own(model, ragged):
    """The null: without its place in the corpus, shard 2 of 2 draws other noise
    and its spread differs from the one-pass rows."""
    from sinkmech.interventions.perturb import EmbeddingNoise, perturbation_spread

    kw = dict(perturbation=EmbeddingNoise(0.5, 2, seed=3), max_tokens=MAX_TOKENS,
              options=RunOptions(batch_size=1, progress=False, bos_token_id=1))
    one = perturbation_spread(model, ragged, **kw)
    span = shard_span(N_PROMPTS, 2, 2)
    placed = perturbation_spread(model, ragged[span.start:], first_prompt=span.start, n_prompts_total=N_PROMPTS, **kw)
    alone = perturbation_spread(model, ragged[span.start:], **kw)
    rows = one.change[:, span.start:, :, : placed.change.shape[-1]]
    assert torch.equal(torch.nan_to_num(placed.change), torch.nan_to_num(rows))
    assert not torch.allclose(torch.nan_to_num(alone.change), torch.nan_to_num(rows))


@pytest.mark.parametrize(("act", "by", "metric"), [("resid_pre", "layer_pos", "kl"), ("z", "head", "kl"),
                                                    ("resid_pre", "layer", "logit_diff")])
def test_patch_shards_merged_in_any_order_equal_the_one_pass_result(model, ragged, act, by, metric):
    """Each cell is a float32 mean over the shard's content positions (KL) or
    prompts: weighted back into sums, the parts merge to the one-pass values
    to float32 rounding. The shards' prompts are shorter than the corpus'
    longest in some shards: their missing positions count as unpatched."""
    from sinkmech.interventions.metrics import LogitDiff
    from sinkmech.interventions.patching import bos_pair, patch
    from sinkmech.sharding.interventions import patch_partial, patch_result

    kw = {"act": act, "by": by, "metric": LogitDiff(3, 4) if metric == "logit_diff" else metric, "options": QUIET}

    def run(idx):
        pair = bos_pair(model, [ragged[i] for i in idx], max_tokens=24, bos_token_id=1)
        return {"prepend": patch(model, pair, **kw)}, pair

    one = run(range(N_PROMPTS))[0]["prepend"]
    assert one.values.abs().max() > 1e-3
    assert max(map(len, ragged[3:6])) < max(map(len, ragged)) <= 24  # shard 2 of 3 lacks the last positions
    for n in (1, 2, 3):
        for m in merged_shards(lambda span, sh: patch_partial(*run(span), {}, width=24, prompt_index=span,
                                                              shard=sh, n_prompts_total=N_PROMPTS), n):
            got = patch_result(m)["prepend"]
            assert got.values.shape == one.values.shape and got.axes == one.axes
            torch.testing.assert_close(got.values, one.values, rtol=1e-5, atol=1e-6)
            assert got.baseline == pytest.approx(one.baseline, rel=1e-5, abs=1e-7)
            assert got.source_value == pytest.approx(one.source_value, rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("bos", ["prepend", "none"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_key_sinks_shards_equal_the_one_pass_result(model, ragged, n, bos):
    """Same top keys (global prompt index, position, token text, score), same
    prompt-averaged alpha by position (sums to 1e-9) and same flagged heads."""
    from sinkmech.measures.key_sinks import key_sink_scores, key_sink_sums
    from sinkmech.prompts import token_text
    from sinkmech.sharding.measures import key_sinks_partial, key_sinks_result

    def part(idx, sh):
        batch = batch_of(model, ragged, idx, bos)
        rows, sums = key_sink_sums(model, batch, top_k=3, min_queries=2,
                                   options=RunOptions(batch_size=1, progress=False))
        return key_sinks_partial(rows, sums, batch, {}, width=MAX_TOKENS + 1, decode=token_text(model),
                                 prompt_index=idx, shard=sh, n_prompts_total=N_PROMPTS)

    one = key_sink_scores(model, batch_of(model, ragged, range(N_PROMPTS), bos), top_k=3, min_queries=2,
                          options=RunOptions(batch_size=1, progress=False))
    want = part(range(N_PROMPTS), (1, 1))
    assert one.top_prompt.unique().numel() > 1  # the top keys come from several prompts (and shards)
    for m in merged_shards(part, n):
        assert_sums_close(m, want)
        got = key_sinks_result(m, top_k=3, min_queries=2, model_name=one.model_name)
        assert got.to_dict() == one.to_dict()
        for k in ("top_scores", "top_prompt", "top_position", "top_token_id", "n_scored"):
            assert torch.equal(getattr(got, k), getattr(one, k)), k
        assert torch.equal(got.by_position.isnan(), one.by_position.isnan())
