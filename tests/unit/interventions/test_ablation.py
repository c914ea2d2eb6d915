"""Per-head sink ablations: a planted sink head, exact sweep == loop, attribution."""

from __future__ import annotations

import pytest
import torch
from jaxtyping import TypeCheckError

from helpers.tiny import TINY_RUN, TINY_BOS, make_tiny
from helpers.planted import planted_model
from helpers.tolerance import SAME_TERMS, SMOLLM2_FORWARD, TINY_FORWARD, assert_normwise
from helpers.reference import loop_ablations
from sinkmech.interventions.ablation import MODES, check_mode, head_ablations, pair_ablations
from sinkmech.interventions.attribution import attribute_ablations, pearson
from sinkmech.interventions.metrics import LogitDiff
from sinkmech.measures.sinks import sink_scores
from sinkmech.options import QUIET, RunOptions


@pytest.fixture(scope="module")
def planted():
    return planted_model()


@pytest.fixture(scope="module")
def tokens(tiny_tokens):
    return tiny_tokens[:4, :10]


def test_planted_head_is_a_sink_and_mask_first_finds_it(planted, tokens):
    scores = sink_scores(planted, tokens, bos="prepend", options=TINY_RUN).mean_scores()
    assert scores[0, 0] > 0.99
    r = head_ablations(planted, tokens, mode="mask_first", options=TINY_RUN)
    assert r.effects.shape == (2, 4)
    assert r.top_heads(1)[0][:2] == (0, 0)
    assert r.effects[0, 0] > 2 * r.effects.flatten()[1:].max()


def test_all_to_first_equals_zero_when_the_first_value_is_zero(planted, tokens):
    kw = dict(options=TINY_RUN)
    dormant = head_ablations(planted, tokens, mode="all_to_first", **kw).effects
    zero = head_ablations(planted, tokens, mode="zero", **kw).effects
    assert abs(float(dormant[0, 0] - zero[0, 0])) < TINY_FORWARD  # two hooks, one output: the forward bound
    # ...and only there: heads with a non-zero first value differ.
    assert (dormant.flatten()[1:] - zero.flatten()[1:]).abs().max() > 1e-3


@pytest.mark.parametrize("kv", [None, 2])
def test_sweep_equals_loop_for_every_mode(kv, tokens):
    model = make_tiny(4, n_kv=kv)
    rows = tokens[:3, :7].tolist()
    rows[2] = rows[2][:5]
    for mode in MODES:
        kw = dict(mode=mode, bos=("prepend", "none")[len(mode) % 2])
        fast = head_ablations(model, rows, options=RunOptions(batch_size=7, progress=False, bos_token_id=TINY_BOS),
                              **kw)  # 7 rows: several passes per layer, a copy split across none
        slow = loop_ablations(model, rows, options=RunOptions(bos_token_id=TINY_BOS), **kw)
        assert fast.effects.abs().max() > 0
        # the sweep restarts stacked copies at the layer, the loop runs whole passes: the forward bound, normwise
        assert_normwise(fast.effects, slow.effects, TINY_FORWARD, mode)


def test_attribution_tracks_the_exact_sweep(tokens):
    model = make_tiny(2, n_layers=3)
    kw = dict(options=TINY_RUN)
    for mode in ("mask_first", "mean"):
        exact = head_ablations(model, tokens, mode=mode, **kw)
        approx = attribute_ablations(model, tokens, mode=mode, samples=32, **kw)
        assert approx.method == "attribution" and approx.effects.shape == exact.effects.shape
        assert pearson(exact.effects, approx.effects) > 0.7
    # First-order for a metric with a gradient: exact for a linear change of z.
    exact = head_ablations(model, tokens, mode="zero", metric=LogitDiff(3, 4), **kw)
    approx = attribute_ablations(model, tokens, mode="zero", metric=LogitDiff(3, 4), **kw)
    assert approx.baseline == pytest.approx(exact.baseline, abs=TINY_FORWARD)  # one clean run, computed twice
    assert pearson(exact.effects, approx.effects) > 0.7


def test_results_and_subgrid(planted, tokens):
    r = head_ablations(planted, tokens, mode="zero", layers=[1], heads=[0, 3], options=TINY_RUN)
    full = head_ablations(planted, tokens, mode="zero", options=TINY_RUN)
    assert_normwise(r.effects, full.effects[1:, [0, 3]], TINY_FORWARD)  # a sub-grid: other copies share its passes
    d = r.to_dict()
    assert {"mode", "metric", "n_layers", "n_heads", "effects"} <= set(d) and d["layers"] == [1]
    assert list(r.to_dataframe()["head"]) == [0, 3]


@pytest.mark.parametrize("mode", ["mask_first", "mean"])
def test_listed_pairs_equal_one_head_each(planted, tokens, mode):
    """pair_ablations: heads of several layers (one listed twice, two sharing a layer) from one clean
    run and one sweep, each what head_ablations gives for that head alone; the planted sink is found."""
    pairs = [(1, 3), (0, 0), (1, 0), (0, 0)]
    got = pair_ablations(planted, tokens, pairs, mode=mode, options=TINY_RUN)
    assert [(r.layers, r.heads) for r in got] == [((l,), (h,)) for l, h in pairs]
    for r, (l, h) in zip(got, pairs):
        one = head_ablations(planted, tokens, mode=mode, layers=[l], heads=[h], options=TINY_RUN)
        assert r.effects.shape == (1, 1) and r.mode == mode and r.baseline == one.baseline
        # other heads' copies share the pass: the forward bound
        assert abs(float(r.effects[0, 0]) - float(one.effects[0, 0])) < TINY_FORWARD * max(1.0, float(one.effects.abs()))
    if mode == "mask_first":
        assert float(got[1].effects[0, 0]) > 2 * max(float(got[0].effects[0, 0]), float(got[2].effects[0, 0]))


def test_one_clean_pass_gives_the_reference_and_the_restarts_bitwise(tokens):
    """clean_pass caches the clean run once: its content logits are reference_logits' and its residual
    stream a pass caching every resid_pre gives, bit for bit (the same pass's tensors), so a sweep given
    them computes the same."""
    from sinkmech.hooks import act_name, cached_run
    from sinkmech.interventions.sweep import clean_pass, reference_logits

    model = make_tiny(4, n_kv=2)
    batch = tokens[:3, :9]
    logits, starts = clean_pass(model, batch, 1, 8)
    want = reference_logits(model, batch, 1, 8)
    assert torch.equal(logits.full(), want.full())
    names = [act_name("resid_pre", l) for l in range(model.cfg.n_layers)]
    _, cache = cached_run(model, batch, names, stop_at_layer=model.cfg.n_layers)
    assert len(starts) == model.cfg.n_layers and all(torch.equal(a, cache[n]) for a, n in zip(starts, names))


def test_bad_ablation_inputs(planted, tokens):
    with pytest.raises(ValueError, match="mode must be one of"):
        check_mode("knockout")
    with pytest.raises((ValueError, TypeCheckError)):
        head_ablations(planted, tokens, mode="knockout", options=RunOptions(bos_token_id=TINY_BOS))
    with pytest.raises(ValueError, match="layer 2 out of range"):
        head_ablations(planted, tokens, mode="zero", layers=[2], options=RunOptions(bos_token_id=TINY_BOS))
    with pytest.raises(ValueError, match="head 4 out of range"):
        head_ablations(planted, tokens, mode="zero", heads=[4], options=RunOptions(bos_token_id=TINY_BOS))
    with pytest.raises(ValueError, match="needs its answers"):
        head_ablations(planted, tokens, mode="zero", metric="logit_diff", options=RunOptions(bos_token_id=TINY_BOS))
    with pytest.raises(ValueError, match="samples"):
        attribute_ablations(planted, tokens, mode="zero", samples=0, options=RunOptions(bos_token_id=TINY_BOS))


@pytest.mark.slow
def test_ablation_sweep_equals_loop_on_smollm2(smollm2):
    from sinkmech.corpora import default_corpus

    kw = dict(mode="mask_first", max_tokens=8, layers=[1, 29], heads=[8])
    fast = head_ablations(smollm2, default_corpus(2), options=QUIET, **kw)
    slow = loop_ablations(smollm2, default_corpus(2), **kw)
    assert fast.effects.abs().max() > 0
    assert_normwise(fast.effects, slow.effects, SMOLLM2_FORWARD)  # SmolLM2's forward bound (helpers/tolerance.py)


@pytest.mark.parametrize(("metric", "answers"), [("kl", None), ("logit_diff", (3, 4)),
                                                 ("logit_diff", (torch.tensor([3, 5, 6]), torch.tensor([4, 4, 2])))])
def test_one_prompt_groups_equal_the_whole_batch_and_merge_bitwise(tokens, metric, answers):
    """prompt_batch=1 gives the whole-batch effects (float32 rounding apart), weighted as the metric
    averages (prompts of unequal length: KL over content positions), and any split of the prompts,
    combined by those weights, reproduces it to the float32 rounding of the parts' means (what
    sharded ablate runs rely on; the forward passes themselves are the same ones)."""
    from sinkmech.interventions.ablation import ablation_weight
    from sinkmech.prompts import as_batch

    model = make_tiny(4, n_layers=2)
    rows = tokens[:3, :9].tolist()
    rows[1] = rows[1][:4]
    kw = dict(mode="zero", bos="prepend", metric="kl" if answers is None else LogitDiff(*answers),
              options=TINY_RUN)
    whole = head_ablations(model, rows, **kw)
    grouped = head_ablations(model, rows, prompt_batch=1, **kw)
    assert whole.effects.abs().max() > 1e-3
    assert_normwise(grouped.effects, whole.effects, TINY_FORWARD)  # passes of 1 prompt against 3: the forward bound
    assert grouped.baseline == pytest.approx(whole.baseline, abs=TINY_FORWARD) and grouped.n_prompts == 3
    batch = as_batch(model, rows, bos="prepend", bos_token_id=TINY_BOS)

    def cut(t, s):
        return t[s] if isinstance(t, torch.Tensor) else t

    parts = []
    for s in (slice(0, 1), slice(1, 3)):
        ans = None if answers is None else (cut(answers[0], s), cut(answers[1], s))
        part = batch.slice(s.start, s.stop)
        part_kw = {**kw, "metric": "kl" if ans is None else LogitDiff(*ans)}
        parts.append((head_ablations(model, part, prompt_batch=1, **part_kw), ablation_weight(metric, part)))
    merged = sum(r.effects.double() * w for r, w in parts) / sum(w for _, w in parts)
    if metric == "kl":  # the prompts differ in length: a plain mean of the parts is another number
        plain = (parts[0][0].effects.double() + parts[1][0].effects.double()) / 2
        assert (plain - grouped.effects.double()).abs().max() > 1e-3
    # the same passes, their float32 means combined in float64 in another order
    assert torch.allclose(merged, grouped.effects.double(), rtol=SAME_TERMS, atol=SAME_TERMS * 0.1)


def test_prompt_batch_refuses_what_it_cannot_combine(planted, tokens):
    kw = dict(prompt_batch=1, options=TINY_RUN)
    with pytest.raises(ValueError, match="mean ablation needs every prompt"):
        head_ablations(planted, tokens, mode="mean", **kw)
    with pytest.raises(ValueError, match="callable metric"):
        head_ablations(planted, tokens, mode="zero", metric=lambda logits, ref, mask: logits.sum(), **kw)
    with pytest.raises(ValueError, match="prompt_batch must be a positive integer"):
        head_ablations(planted, tokens, mode="zero", **{**kw, "prompt_batch": 0})
