"""The value-less `<bos>` and the phantom sink, checked as exact identities.

`<bos>` at position 0 is one constant key and value; a phantom sink with m = 0
is the run without `<bos>`; the paired phantom with `<bos>`'s own value is the
run with `<bos>` on every model without absolute positions (planted null: GPT-2's
learned positions, and u = 0); gpt-oss's own learned sinks, dropped and given
back through the logits form, are its unmodified run.

Tolerance of the identities (TOL, relative to the largest |entry| of the
residual stream): the two runs compute the same numbers in a different order,
the with-`<bos>` softmax normalising over n + 1 keys where the phantom
normalises over n and multiplies by 1 - m, then adds m v_0 after the value sum;
each layer adds a few float32 roundings (eps 1.19e-7) that the d_model-term
sums after it carry forward. Measured: at most 4 eps over two layers, on both
TransformerLens lines; TOL allows 64 eps, and every planted null misses it by
more than 10^4.
"""

from __future__ import annotations

import pytest
import torch
from jaxtyping import TypeCheckError

from helpers.backends import loads_folder, needs
from helpers.tiny import TINY_BOS, make_tiny
from helpers.tiny_hf import BOS, save_tiny
from sinkmech.hooks import act_name, cached_run, drop_sink_hook, residual_stack
from sinkmech.interventions.phantom import (
    PhantomSink, ValuelessBos, bos_state, head_selection, logit_mass, paired_mass, phantom_hooks, valueless_bos_hooks,
)
from sinkmech.loading.backend import learned_sinks
from sinkmech.loading.models import load_model
from sinkmech.measures.loss import token_losses
from sinkmech.prompts import tokenize

TOL = 64 * torch.finfo(torch.float32).eps
ROTARY = ("llama", "gemma3", "gpt_neox", "mistral", "qwen3_moe", "gpt_oss")


@pytest.fixture(scope="module", params=["tiny", *(pytest.param(a, marks=loads_folder(a)) for a in ROTARY)])
def rotary(request, tmp_path_factory):
    """(model, <bos> id): the suite's tiny model and tiny random Hugging Face models
    without absolute positions (sliding windows, a mixture of experts, learned sinks)."""
    if request.param == "tiny":
        return make_tiny(3), TINY_BOS
    folder = save_tiny(tmp_path_factory.mktemp(request.param), request.param, seed=3, n_kv=2)
    return load_model(str(folder), device="cpu"), BOS


def ragged(seed: int = 0, n: int = 4) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(3, 50, (n, 12), generator=g).tolist()
    rows[1] = rows[1][:7]  # padding must never enter
    return rows


def rel_gap(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    """Largest |a - b| on real positions ([batch layer pos d]), relative to the largest |b|."""
    m = mask[:, None, :, None]
    return float(((a - b).abs() * m).amax() / (b.abs() * m).amax())


def runs(model, bos_id: int, rows):
    none = tokenize(model, rows, bos="none", max_tokens=12)
    first = tokenize(model, rows, bos="prepend", max_tokens=12, bos_token_id=bos_id)
    return none, first


def test_bos_is_one_constant_key_and_value(rotary):
    """<bos> at position 0 attends only to itself: its residual at every layer, its
    keys and its values are the same in every prompt, and `bos_state`'s."""
    model, bos_id = rotary
    _, first = runs(model, bos_id, ragged())
    L = model.cfg.n_layers
    names = [act_name("resid_pre", l) for l in range(L)] + [act_name(n, l) for l in range(L) for n in ("k", "v")]
    _, cache = cached_run(model, first.tokens, names)
    state = bos_state(model, bos_id)
    for n in names:
        at0 = cache[n][:, 0].float()
        scale = float(at0.abs().max())
        assert float((at0 - at0[:1]).abs().max()) <= TOL * scale, n  # every prompt's <bos> is the first's
    for l in range(L):
        resid = cache[act_name("resid_pre", l)][:, 0].float()
        assert float((resid - state.resid[l]).abs().max()) <= TOL * float(resid.abs().max())
    v = cache[act_name("v", 1)][:, 0].float()
    from sinkmech.hooks import expand_kv

    assert float((expand_kv(model, v) - state.values[1]).abs().max()) <= TOL * float(v.abs().max())


def test_zero_mass_is_the_run_without_bos(rotary):
    """m = 0: every row keeps its weights and no value is added, bit for bit."""
    model, bos_id = rotary
    none, _ = runs(model, bos_id, ragged(1))
    plain = residual_stack(model, none.tokens)
    zero = torch.zeros(len(none), model.cfg.n_layers, model.cfg.n_heads, none.tokens.shape[1])
    for spec in (PhantomSink("paired", "zero"), PhantomSink("paired", "bos")):
        hooks = phantom_hooks(model, spec, mass=zero, bos_value=bos_state(model, bos_id).values)
        assert torch.equal(residual_stack(model, none.tokens, hooks), plain)
    never = PhantomSink("logits", logits=torch.full((model.cfg.n_layers, model.cfg.n_heads), float("-inf")))
    assert torch.equal(residual_stack(model, none.tokens, phantom_hooks(model, never)), plain)


def test_paired_phantom_with_bos_value_is_the_with_bos_run(rotary):
    """Paired m and u = <bos>'s value on the run without <bos> give the run with
    it, at every layer and content position, and the same next-token losses; the
    planted null (u = 0: the mass without the value) does not."""
    model, bos_id = rotary
    none, first = runs(model, bos_id, ragged(2))
    mass = paired_mass(model, none, bos_id)
    values = bos_state(model, bos_id).values
    want = residual_stack(model, first.tokens)[:, :, 1:]
    got = residual_stack(model, none.tokens, phantom_hooks(model, PhantomSink("paired", "bos"), mass=mass,
                                                           bos_value=values))
    assert rel_gap(got, want, none.mask) <= TOL
    nll = token_losses(model, none.tokens, phantom_hooks(model, PhantomSink("paired", "bos"), mass=mass,
                                                         bos_value=values))
    ref = token_losses(model, first.tokens)[:, 1:]  # position j + 1 with <bos> predicts what j predicts without
    real = none.mask[:, 1:]
    assert float(((nll - ref).abs() * real).max()) <= 1e-4
    mass_only = residual_stack(model, none.tokens, phantom_hooks(model, PhantomSink("paired", "zero"), mass=mass))
    assert rel_gap(mass_only, want, none.mask) > 1e4 * TOL
    assert rel_gap(residual_stack(model, none.tokens), want, none.mask) > 1e4 * TOL


@needs("any_architecture", why="TransformerLens 3.9 does not load a GPT-2 folder")
def test_absolute_positions_break_the_identity(tmp_path):
    """The planted null: GPT-2 adds a learned embedding per absolute position, so
    the content tokens sit at other positions without <bos> and the paired
    phantom cannot give the with-<bos> run back."""
    model = load_model(str(save_tiny(tmp_path / "gpt2", "gpt2", seed=3)), device="cpu")
    none, first = runs(model, BOS, ragged(2))
    got = residual_stack(model, none.tokens, phantom_hooks(model, PhantomSink("paired", "bos"),
                                                           mass=paired_mass(model, none, BOS),
                                                           bos_value=bos_state(model, BOS).values))
    assert rel_gap(got, residual_stack(model, first.tokens)[:, :, 1:], none.mask) > 1e4 * TOL


@pytest.mark.parametrize("arch", [pytest.param("gpt_oss", marks=loads_folder("gpt_oss"))])
def test_gpt_oss_sinks_dropped_and_given_back_through_logits_is_its_own_run(arch, tmp_path):
    """gpt-oss's softmax has a learned logit per head: dropping it (`drop_sink`, every
    head) and giving the same logits back through the logits form is its
    unmodified run; dropping it alone is not (the planted null)."""
    model = load_model(str(save_tiny(tmp_path / arch, arch, seed=3)), device="cpu")
    logits = learned_sinks(model)
    none, _ = runs(model, BOS, ragged(3))
    L, H = model.cfg.n_layers, model.cfg.n_heads
    drop = [(act_name("pattern", l), drop_sink_hook(h)) for l in range(L) for h in range(H)]
    plain = residual_stack(model, none.tokens)
    back = residual_stack(model, none.tokens, drop + phantom_hooks(model, PhantomSink("logits", logits=logits)))
    assert rel_gap(back, plain, none.mask) <= TOL
    assert rel_gap(residual_stack(model, none.tokens, drop), plain, none.mask) > 1e4 * TOL


def test_logit_mass_is_the_share_of_an_extra_softmax_column():
    """e^b / (e^b + sum e^s), by brute force: the softmax over the row plus one column."""
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 3, 5, 5, generator=g)
    scores = scores.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    b = torch.tensor([0.0, 2.0, float("-inf")])
    full = torch.cat([scores, b[None, :, None, None].expand(2, 3, 5, 1)], -1).softmax(-1)
    assert torch.allclose(logit_mass(scores, b), full[..., -1], atol=1e-7)
    assert float(logit_mass(scores, b)[:, 2].abs().max()) == 0.0


def test_valueless_bos_equals_a_zero_value_vector(tiny_model):
    """Every head: the same run as zeroing v at position 0 (brute force on hook_v);
    one head: its own output recomputed by hand with v_0 = 0, the others untouched;
    and the run is not the plain one (the planted effect)."""
    model = tiny_model
    first = tokenize(model, ragged(4), bos="prepend", max_tokens=12, bos_token_id=TINY_BOS)
    L = model.cfg.n_layers

    def zero_v(v, hook):
        v = v.clone()
        v[:, 0] = 0.0
        return v

    brute = residual_stack(model, first.tokens, [(act_name("v", l), zero_v) for l in range(L)])
    got = residual_stack(model, first.tokens, valueless_bos_hooks(model, ValuelessBos()))
    assert rel_gap(got, brute, first.mask) <= TOL
    assert rel_gap(residual_stack(model, first.tokens), brute, first.mask) > 1e4 * TOL
    # one head (layer 1, head 2): its z by hand, every other head's z unchanged
    names = [act_name(n, 1) for n in ("pattern", "v", "z")]
    _, clean = cached_run(model, first.tokens, names)
    _, cut = cached_run(model, first.tokens, [act_name("z", 1)], valueless_bos_hooks(model, ValuelessBos(heads=((1, 2),))))
    v = clean[names[1]].clone()
    v[:, 0] = 0.0
    by_hand = torch.einsum("bqk,bkd->bqd", clean[names[0]][:, 2], v[:, :, 2])
    z = cut[act_name("z", 1)]
    assert torch.allclose(z[:, :, 2], by_hand, atol=1e-6)
    assert torch.equal(z[:, :, [0, 1, 3]], clean[names[2]][:, :, [0, 1, 3]])


def test_bias_mode_adds_the_value_and_rescales_nothing(tiny_model):
    """In one layer: the attention pattern is the no-<bos> run's and each head's
    output gains exactly m u; the recorded mass is the paired mass."""
    model = tiny_model
    none = tokenize(model, ragged(5), bos="none", max_tokens=12)
    mass = paired_mass(model, none, TINY_BOS)
    values = bos_state(model, TINY_BOS).values
    seen = {}
    spec = PhantomSink("paired", "bos", "bias", layers=(0,))
    hooks = phantom_hooks(model, spec, mass=mass, bos_value=values, record=lambda l, m: seen.setdefault(l, m))
    names = [act_name("pattern", 0), act_name("z", 0)]
    _, clean = cached_run(model, none.tokens, names)
    _, biased = cached_run(model, none.tokens, names, hooks)
    assert torch.equal(biased[names[0]], clean[names[0]])
    added = torch.einsum("bhq,hd->bqhd", mass[:, 0], values[0])
    assert torch.allclose(biased[names[1]] - clean[names[1]], added, atol=1e-6)
    assert set(seen) == {0} and torch.equal(seen[0], mass[:, 0])


def test_specs_refuse_what_they_cannot_do(tiny_model):
    with pytest.raises((ValueError, TypeCheckError)):  # beartype checks the Literal first under pytest
        PhantomSink("learned")
    with pytest.raises(ValueError, match="logits form needs"):
        PhantomSink("logits")
    with pytest.raises(ValueError, match="logits form needs"):
        PhantomSink("paired", logits=torch.zeros(2, 4))
    with pytest.raises(ValueError, match="changes nothing"):
        PhantomSink("paired", "zero", "bias")
    with pytest.raises(ValueError, match="do not fit"):
        PhantomSink("logits", logits=torch.zeros(3, 4)).check(tiny_model)
    with pytest.raises(ValueError, match="do not fit"):
        PhantomSink("paired", torch.zeros(2, 4, 3)).check(tiny_model)
    with pytest.raises(ValueError, match="out of range"):
        head_selection(tiny_model, layers=[5])
    with pytest.raises(ValueError, match="not both"):
        head_selection(tiny_model, layers=[0], heads=[(0, 1)])
    with pytest.raises(ValueError, match="paired mass"):
        phantom_hooks(tiny_model, PhantomSink("paired"))
    assert int(head_selection(tiny_model, layers=[1]).sum()) == tiny_model.cfg.n_heads


def test_a_planted_no_op_sink_loses_nothing_with_its_value():
    """The planted null: a sink head whose value at <bos> is exactly zero (planted_model's
    L0.H0). Zeroing <bos>'s value in that head changes nothing; in another head it does."""
    from helpers.planted import planted_model

    model = planted_model()
    first = tokenize(model, ragged(6), bos="prepend", max_tokens=12, bos_token_id=TINY_BOS)
    plain = residual_stack(model, first.tokens)
    sink = residual_stack(model, first.tokens, valueless_bos_hooks(model, ValuelessBos(heads=((0, 0),))))
    other = residual_stack(model, first.tokens, valueless_bos_hooks(model, ValuelessBos(heads=((0, 1),))))
    assert rel_gap(sink, plain, first.mask) <= TOL
    assert rel_gap(other, plain, first.mask) > 1e4 * TOL
