"""Analyses take a TokenBatch (or BosPair) first; prompt-taking forms tokenize once
and give the same numbers."""

from __future__ import annotations

import pytest
import torch

from helpers.tiny import TINY_RUN, TINY_BOS
from sinkmech.interventions.ablation import ablation_setup, head_ablations
from sinkmech.interventions.attribution import attribute_ablations
from sinkmech.interventions.patching import bos_pair
from sinkmech.interventions.perturb import EmbeddingNoise, TokenSwap, corpus_swaps, perturbation_spread
from sinkmech.prompts import as_batch, tokenize
from sinkmech.theory.sensitivity import rank_collapse, sensitivity
from sinkmech.measures.sinks import sink_scores
from sinkmech.options import QUIET, RunOptions
from sinkmech.interventions.metrics import LogitDiff


@pytest.fixture(scope="module")
def rows(tiny_tokens):
    r = tiny_tokens[:4, :9].tolist()
    r[1] = r[1][:6]
    return r


def test_as_batch_passes_a_batch_through_and_checks_its_bos(tiny_model, rows):
    batch = tokenize(tiny_model, rows, bos="none")
    assert as_batch(tiny_model, batch) is batch and as_batch(tiny_model, batch, bos="none") is batch
    with pytest.raises(ValueError, match="built with bos='none'"):
        as_batch(tiny_model, batch, bos="prepend")
    with pytest.raises(ValueError, match="bos must be given"):
        as_batch(tiny_model, rows)
    made = as_batch(tiny_model, rows, default="prepend", bos_token_id=TINY_BOS)
    assert made.bos == "prepend" and made.content() == rows


def test_sink_scores_on_a_batch_equal_the_prompt_form(tiny_model, rows):
    for bos in ("prepend", "none"):
        batch = tokenize(tiny_model, rows, bos=bos, max_tokens=64, bos_token_id=TINY_BOS)
        a = sink_scores(tiny_model, rows, bos=bos,
                        options=RunOptions(batch_size=3, progress=False, bos_token_id=TINY_BOS))
        b = sink_scores(tiny_model, batch, options=RunOptions(batch_size=2, progress=False))
        c = sink_scores(tiny_model, batch, options=QUIET)
        for r in (b, c):
            assert r.bos == bos and torch.equal(a.lengths, r.lengths)
            assert torch.allclose(a.scores, r.scores, atol=1e-6)
            assert torch.allclose(a.value_norm_rest, r.value_norm_rest, atol=1e-5)
        assert a.max_tokens == b.max_tokens == 9  # the longest content scored, not what was asked
        assert a.max_tokens_requested == 64 and b.max_tokens_requested is None
    with pytest.raises(ValueError, match="built with"):
        sink_scores(tiny_model, batch, bos="prepend", options=QUIET)


def test_ablations_on_a_batch_equal_the_prompt_form(tiny_model, rows):
    batch = tokenize(tiny_model, rows, bos="none")
    kw = dict(mode="zero", layers=[1], options=QUIET)
    a = head_ablations(tiny_model, rows, bos="none", **kw)
    b = head_ablations(tiny_model, batch, **kw)
    assert b.bos == "none" and torch.allclose(a.effects, b.effects, atol=1e-6)
    c = attribute_ablations(tiny_model, batch, mode="mean", metric=LogitDiff(3, 4))
    d = attribute_ablations(tiny_model, rows, mode="mean", bos="none", metric=LogitDiff(3, 4))
    assert torch.allclose(c.effects, d.effects, atol=1e-6)


def test_ablation_setup_is_the_clean_run(tiny_model, rows):
    s = ablation_setup(tiny_model, rows, mode="mean", options=RunOptions(bos_token_id=TINY_BOS))
    assert s.batch.bos == "prepend" and s.layers == (0, 1) and s.heads == (0, 1, 2, 3)
    ref = tiny_model(s.batch.tokens)[:, 1:]
    assert torch.allclose(s.reference.full(), ref, atol=1e-5)  # held as the last residual, unembedded on demand
    assert s.baseline == 0.0  # KL of the clean run against itself
    # mean head outputs: z averaged over real positions only
    _, cache = tiny_model.run_with_cache(s.batch.tokens)
    z = cache["z", 1][s.batch.mask]  # [real positions, head, d_head]
    assert torch.allclose(s.means[1], z.mean(0), atol=1e-5)
    r = s.result(torch.zeros(2, 4), "sweep")
    assert (r.mode, r.n_prompts, r.baseline) == ("mean", 4, 0.0)


def test_sensitivity_and_rank_collapse_on_a_batch(tiny_model, rows):
    batch = tokenize(tiny_model, rows, bos="none")
    assert torch.allclose(rank_collapse(tiny_model, batch), rank_collapse(tiny_model, rows, bos="none"))
    one = tokenize(tiny_model, rows[:1], bos="prepend", max_tokens=4, bos_token_id=TINY_BOS)
    a = sensitivity(tiny_model, one)
    b = sensitivity(tiny_model, rows[:1], bos="prepend", max_tokens=4, options=RunOptions(bos_token_id=TINY_BOS))
    assert a.bos == "prepend" and torch.allclose(a.jacobian, b.jacobian) and torch.allclose(a.path_weight, b.path_weight)


def test_perturbation_on_a_batch_or_pair_equals_the_prompt_form(tiny_model, rows):
    kw = dict(perturbation=EmbeddingNoise(0.2, 1),
              options=RunOptions(batch_size=3, progress=False, bos_token_id=TINY_BOS))
    a = perturbation_spread(tiny_model, rows, **kw)
    b = perturbation_spread(tiny_model, bos_pair(tiny_model, rows, bos_token_id=TINY_BOS), **kw)
    c = perturbation_spread(tiny_model, tokenize(tiny_model, rows, bos="prepend", bos_token_id=TINY_BOS), **kw)
    for r in (b, c):
        assert torch.equal(a.change.isnan(), r.change.isnan())
        assert torch.allclose(a.change.nan_to_num(), r.change.nan_to_num(), atol=1e-6)
        assert torch.allclose(a.entropy, r.entropy, atol=1e-6)


def test_per_prompt_swaps_in_one_batch_equal_one_prompt_at_a_time(tiny_model, rows):
    # Batching (one tokenization, then slices) must not mix the prompts.
    swaps = corpus_swaps(rows, 2)
    together = perturbation_spread(tiny_model, rows, perturbation=swaps,
                                   options=RunOptions(batch_size=3, progress=False, bos_token_id=TINY_BOS))
    for i, (row, swap) in enumerate(zip(rows, swaps)):
        alone = perturbation_spread(tiny_model, [row], perturbation=swap, options=TINY_RUN)
        n = len(row)
        assert torch.allclose(together.change[:, i, :, :n], alone.change[:, 0, :, :n], atol=1e-5)
        assert int(together.last_changed[i]) == int(alone.last_changed[0]) == 2
    assert isinstance(swaps[0], TokenSwap)
