"""bos/no-bos activation patching: alignment, exactness of the batched sweep, errors."""

from __future__ import annotations

import pytest
import torch
from transformer_lens.patching import generic_activation_patch

from jaxtyping import TypeCheckError

from helpers.reference import loop_patch
from helpers.tiny import TINY_BOS, make_tiny
from helpers.tolerance import SMOLLM2_FORWARD, TINY_FORWARD, assert_normwise, kl_atol
from sinkmech.hooks import act_name
from sinkmech.interventions.metrics import KL, LogitDiff, resolve_metric
from sinkmech.prompts import check_bos
from sinkmech.interventions.patching import (
    bos_pair, patch, patch_attn_out, patch_head_k, patch_head_out, patch_head_q, patch_head_v, patch_mlp_out, patch_resid_mid,
    patch_resid_post, patch_resid_pre,
)
from sinkmech.options import QUIET, RunOptions


@pytest.fixture(scope="module")
def pair(tiny_model, tiny_tokens):
    rows = tiny_tokens.tolist()
    rows[2] = rows[2][:7]  # one shorter prompt: padding must never leak
    return bos_pair(tiny_model, rows, bos_token_id=TINY_BOS)


def test_bos_pair_maps_content_positions(pair):
    assert pair.with_bos.tokens.shape[1] == pair.without_bos.tokens.shape[1] + 1
    pos_b, pos_n = pair.content_positions("prepend"), pair.content_positions("none")
    assert torch.equal(pos_b, pos_n + 1)
    m = pair.content_mask
    assert torch.equal(pair.with_bos.tokens[:, pos_b][m], pair.without_bos.tokens[:, pos_n][m])
    assert (pair.with_bos.tokens[:, 0] == TINY_BOS).all()
    assert int(m[2].sum()) == 7


def test_patching_a_run_into_itself_changes_nothing(tiny_model, pair):
    for bos in ("prepend", "none"):
        r = patch_resid_pre(tiny_model, pair, per_position=False, source=bos, target=bos, options=QUIET)
        # the source's logits (a cached pass) and the target's (a plain pass, unembedded apart):
        # one distribution computed twice, so the KL is zero up to its float32 bound
        assert abs(r.baseline) <= kl_atol(tiny_model.cfg.d_vocab)  # float32 can put it just below zero
        assert r.values.abs().max() <= kl_atol(tiny_model.cfg.d_vocab)


def test_layer0_patch_at_mapped_positions_reproduces_the_target_run(tiny_model, pair):
    # With rotary embeddings resid_pre 0 is the token embedding alone, the same in
    # both runs at mapped positions: patching it must leave the target's output.
    for source in ("prepend", "none"):
        r = patch_resid_pre(tiny_model, pair, per_position=False, source=source, layers=[0], options=QUIET)
        assert r.baseline > 1e-3
        assert abs(float(r.values[0]) - r.baseline) < 1e-6
    # An off-by-one map would patch the wrong tokens and change the output.
    src = pair.with_bos
    _, cache = tiny_model.run_with_cache(src.tokens, names_filter=act_name("resid_pre", 0))
    wrong = cache[act_name("resid_pre", 0)][:, : pair.n_content]  # positions j, not j + 1

    def hook(x, hook):
        return wrong.clone()

    ref = tiny_model(src.tokens)[:, 1:]
    bad = tiny_model.run_with_hooks(pair.without_bos.tokens, fwd_hooks=[(act_name("resid_pre", 0), hook)])
    off = float(KL().bind(ref.detach(), pair.content_mask)(bad.detach()[None])[0])
    assert abs(off - r.baseline) > 1e-3


def test_last_layer_patch_reproduces_the_source_run(tiny_model, pair):
    last = tiny_model.cfg.n_layers - 1
    for source in ("prepend", "none"):
        r = patch_resid_post(tiny_model, pair, per_position=False, source=source, layers=[last], options=QUIET)
        assert r.baseline > 1e-3
        assert float(r.values[0]) < 1e-6
        assert float(r.restored()[0]) == pytest.approx(1.0, abs=1e-5)


def test_loss_metric_is_each_runs_content_target_loss_and_the_last_layer_restores_it(tiny_model, pair):
    """--metric loss: the unpatched target run's and the source run's own next-token losses on
    the content targets (`content_loss`, the one definition, computed another way: the float32
    forward bound of the tiny model on values of a few nats), and patching the last layer's
    output moves the target run's loss onto the source run's."""
    from helpers.tolerance import TINY_D_MLP, forward_rtol

    from sinkmech.measures.loss import content_loss

    last = tiny_model.cfg.n_layers - 1
    for source, target in (("prepend", "none"), ("none", "prepend")):
        r = patch_resid_post(tiny_model, pair, per_position=False, source=source, layers=[last], metric="loss",
                             options=QUIET)
        want_target, want_source = content_loss(tiny_model, pair.run(target)), content_loss(tiny_model, pair.run(source))
        tol = forward_rtol(TINY_D_MLP) * 4  # nats: losses of ~ln(50) = 3.9
        assert r.metric == "loss" and abs(want_target - want_source) > 1e-3  # the two runs differ
        assert r.baseline == pytest.approx(want_target, abs=tol) and r.source_value == pytest.approx(want_source, abs=tol)
        assert float(r.values[0]) == pytest.approx(want_source, abs=tol)
        assert float(r.restored()[0]) == pytest.approx(1.0, abs=1e-3)
    with pytest.raises(ValueError, match="content tokens"):
        resolve_metric("loss")


CASES = {
    None: [("resid_pre", "layer_pos", [1]), ("resid_mid", "layer_pos", [0]), ("resid_post", "layer"), ("attn_out", "layer_pos", [1]),
           ("mlp_out", "layer"), ("z", "head_pos", [1])],
    2: [("resid_pre", "layer"), ("z", "head"), ("q", "head"), ("k", "head"), ("v", "head")],
}


@pytest.mark.parametrize("kv", [None, 2])
def test_sweep_equals_one_run_with_hooks_per_cell(kv, tiny_tokens):
    model = make_tiny(3, n_kv=kv)
    rows = tiny_tokens[:3, :6].tolist()
    rows[1] = rows[1][:4]
    pair = bos_pair(model, rows, bos_token_id=TINY_BOS)
    for i, (act, by, *layers) in enumerate(CASES[kv]):
        source = ("prepend", "none")[i % 2]
        kw = dict(act=act, by=by, source=source, layers=layers[0] if layers else None)
        fast = patch(model, pair, options=RunOptions(batch_size=7, progress=False), **kw)  # several passes per layer
        slow = loop_patch(model, pair, **kw)
        assert fast.values.shape == slow.values.shape
        assert fast.values.abs().max() > 0
        assert_normwise(fast.values, slow.values, TINY_FORWARD, f"{act} {by} {source}")  # restarted vs whole passes
    if kv:
        k = patch(model, pair, act="k", by="head", options=QUIET)
        assert k.values.shape == (2, kv)


def test_sweep_equals_transformer_lens_generic_activation_patch(tiny_model, pair):
    """TransformerLens' own per-cell loop, given our position map as its setter."""
    src, tgt = pair.with_bos, pair.without_bos
    _, clean_cache = tiny_model.run_with_cache(src.tokens)
    bound = KL().bind(tiny_model(src.tokens)[:, 1:], pair.content_mask)

    def setter(corrupted, index, clean):
        corrupted[:, index[1]] = clean[:, index[1] + 1]
        return corrupted

    theirs = generic_activation_patch(
        tiny_model, tgt.tokens, clean_cache, lambda logits: bound(logits[None])[0], setter, "resid_pre",
        index_axis_names=("layer", "pos"),
    )
    ours = patch_resid_pre(tiny_model, pair, source="prepend", options=QUIET)
    assert_normwise(ours.values, theirs, TINY_FORWARD)  # TransformerLens' one pass per cell: the forward bound


def test_logit_diff_and_callable_metrics(tiny_model, pair):
    ld = patch_head_out(tiny_model, pair, metric=LogitDiff(3, 4), layers=[1], options=QUIET)
    loop = loop_patch(tiny_model, pair, act="z", by="head", metric=resolve_metric("logit_diff", (3, 4)), layers=[1])
    assert_normwise(ld.values, loop.values, TINY_FORWARD)
    assert ld.source_value != ld.baseline

    def last_logit(logits, reference, mask):
        return logits[..., 5].mean()

    c = patch_head_out(tiny_model, pair, metric=last_logit, layers=[0], options=QUIET)
    c2 = loop_patch(tiny_model, pair, act="z", by="head", metric=last_logit, layers=[0])
    assert c.metric == "last_logit"
    assert_normwise(c.values, c2.values, TINY_FORWARD)


def test_result_tables(tiny_model, pair):
    r = patch_head_out(tiny_model, pair, per_position=True, layers=[1], options=QUIET)
    assert r.values.shape == (1, 4, pair.n_content) and r.axes == ("layer", "head_index", "pos")
    df = r.to_dataframe()
    assert len(df) == r.values.numel() and set(df["layer"]) == {1}
    import json

    assert json.loads(r.to_json())["layers"] == [1]


def test_bad_patch_inputs(tiny_model, pair):
    with pytest.raises(ValueError, match="patched by"):
        patch(tiny_model, pair, act="z", by="layer_pos")
    with pytest.raises((ValueError, TypeCheckError)):  # beartype checks the Literal first under pytest
        patch(tiny_model, pair, act="embed", by="layer")
    with pytest.raises(ValueError, match="out of range"):
        patch(tiny_model, pair, act="resid_pre", by="layer", layers=[2])
    with pytest.raises(ValueError, match="bos must be"):
        check_bos("both")
    with pytest.raises(ValueError, match="answers"):
        patch(tiny_model, pair, act="resid_pre", by="layer", metric="logit_diff")
    with pytest.raises((ValueError, TypeCheckError)):
        patch(tiny_model, pair, act="resid_pre", by="layer", metric="mse")
    with pytest.raises(ValueError, match="metric must be"):
        resolve_metric("mse")


@pytest.mark.slow
def test_sweep_equals_loop_on_smollm2(smollm2):
    from sinkmech.corpora import default_corpus

    pair = bos_pair(smollm2, default_corpus(2), max_tokens=6)
    for kw in (dict(act="v", by="head", source="none", layers=[28]),):
        fast = patch(smollm2, pair, options=QUIET, **kw)
        slow = loop_patch(smollm2, pair, **kw)
        assert fast.values.abs().max() > 0
        assert_normwise(fast.values, slow.values, SMOLLM2_FORWARD, str(kw))


FRONT_ENDS = [
    (patch_resid_pre, {}, "resid_pre", "layer_pos"),
    (patch_resid_pre, {"per_position": False}, "resid_pre", "layer"),
    (patch_resid_mid, {}, "resid_mid", "layer_pos"),
    (patch_resid_post, {"per_position": False}, "resid_post", "layer"),
    (patch_attn_out, {}, "attn_out", "layer_pos"),
    (patch_attn_out, {"per_position": False}, "attn_out", "layer"),
    (patch_mlp_out, {}, "mlp_out", "layer_pos"),
    (patch_mlp_out, {"per_position": False}, "mlp_out", "layer"),
    (patch_head_out, {}, "z", "head"),
    (patch_head_out, {"per_position": True}, "z", "head_pos"),
    (patch_head_q, {}, "q", "head"),
    (patch_head_k, {}, "k", "head"),
    (patch_head_v, {}, "v", "head"),
]


@pytest.mark.parametrize("front, extra, act, by", FRONT_ENDS, ids=[f"{f.__name__}-{b}" for f, _, _, b in FRONT_ENDS])
def test_each_front_end_is_patch_with_its_act_and_by(front, extra, act, by, tiny_model, pair):
    kw = dict(source="none", layers=[1], options=QUIET)
    named = front(tiny_model, pair, **extra, **kw)
    generic = patch(tiny_model, pair, act=act, by=by, **kw)
    assert (named.act, named.axes) == (act, generic.axes)
    assert torch.equal(named.values, generic.values)
    assert (named.values - named.baseline).abs().max() > 1e-5  # the patch does something at layer 1


def test_layer0_attn_out_patch_equals_resid_mid_patch(tiny_model, pair):
    # resid_mid 0 = resid_pre 0 + attn_out 0, and resid_pre 0 (the token embedding:
    # rotary adds no positional vector) is the same in both runs at mapped positions,
    # so patching attn_out 0 sets resid_mid 0 to the source's: both patches agree.
    for source in ("prepend", "none"):
        kw = dict(source=source, layers=[0], options=QUIET)
        attn = patch_attn_out(tiny_model, pair, **kw)
        mid = patch_resid_mid(tiny_model, pair, **kw)
        assert attn.values.abs().max() > 1e-4
        assert_normwise(attn.values, mid.values, TINY_FORWARD)  # one patched sum, reached by two hooks


def test_layer0_q_k_v_are_the_same_at_mapped_positions(tiny_model, pair):
    # Before rotary, layer-0 queries, keys and values depend on the token alone:
    # patching any head's q, k or v at layer 0 leaves the target run as it was.
    for front in (patch_head_q, patch_head_k, patch_head_v):
        r = front(tiny_model, pair, source="prepend", layers=[0], options=QUIET)
        assert r.baseline > 1e-3
        assert (r.values - r.baseline).abs().max() < 1e-5, front.__name__
    # ...while at layer 1 they carry the runs' difference.
    assert (patch_head_v(tiny_model, pair, source="prepend", layers=[1],
                         options=QUIET).values - r.baseline).abs().max() > 1e-4


def test_bos_pair_tokenizes_once_and_prepends_to_the_same_ids(tiny_model, tiny_tokens):
    p = bos_pair(tiny_model, tiny_tokens[:3].tolist(), max_tokens=5, bos_token_id=TINY_BOS)
    assert p.without_bos.content() == tiny_tokens[:3, :5].tolist() == p.with_bos.content()
    assert (p.with_bos.tokens[:, 0] == TINY_BOS).all() and p.with_bos.bos_token_id == TINY_BOS


def test_patch_only_some_content_positions(tiny_model, pair):
    """positions=: only those content positions are patched (together), and the
    metric is taken from the first of them on; sweep equals loop equals a hand hook."""
    n = pair.n_content
    kw = dict(per_position=False, source="prepend", options=QUIET, positions=range(1, n))
    r = patch_resid_pre(tiny_model, pair, **kw)
    assert r.positions == tuple(range(1, n)) and r.to_json()
    loop = loop_patch(tiny_model, pair, act="resid_pre", by="layer", source="prepend", positions=range(1, n))
    assert_normwise(r.values, loop.values, TINY_FORWARD)
    # by hand at layer 1: the <bos> run's content positions 1.. written into the no-<bos> run at 1..
    name = act_name("resid_pre", 1)
    _, cache = tiny_model.run_with_cache(pair.with_bos.tokens, names_filter=name)

    def hook(x, hook):
        x = x.clone()
        x[:, 1:] = cache[name][:, 2:]
        return x

    ref = tiny_model(pair.with_bos.tokens)[:, 1:]
    out = tiny_model.run_with_hooks(pair.without_bos.tokens, fwd_hooks=[(name, hook)])
    scored = pair.content_mask.clone()
    scored[:, 0] = False
    want = float(KL().bind(ref.detach(), scored)(out.detach()[None])[0])
    assert float(r.values[1]) == pytest.approx(want, abs=1e-5)
    # the last layer's resid_post at 1.. restores every scored output; position 0 (the
    # target's own sink) is untouched, so the old all-positions patch differs
    last = tiny_model.cfg.n_layers - 1
    post = patch_resid_post(tiny_model, pair, layers=[last], **kw)
    assert float(post.restored()[0]) == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(ValueError, match="positions"):
        patch_resid_pre(tiny_model, pair, per_position=True, positions=[1], options=QUIET)
    with pytest.raises(ValueError, match="content positions"):
        patch_resid_pre(tiny_model, pair, per_position=False, positions=[n], options=QUIET)
