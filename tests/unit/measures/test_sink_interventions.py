"""`sink_scores(..., sink=...)`: the value-less `<bos>` and the phantom sink in the
sink-score pass (loss, phantom mass, JSON keys), against the interventions run
by hand (tests/unit/interventions/test_phantom.py checks the interventions)."""

from __future__ import annotations

import pytest
import torch

from helpers.tiny import TINY_BOS, TINY_RUN
from sinkmech.hooks import act_name
from sinkmech.interventions.phantom import PhantomSink, ValuelessBos, paired_mass
from sinkmech.measures.loss import masked_row_losses, target_mask
from sinkmech.measures.sinks import sink_scores
from sinkmech.prompts import tokenize


@pytest.fixture(scope="module")
def rows(tiny_tokens):
    r = tiny_tokens[:5].tolist()
    r[3] = r[3][:8]  # ragged: padding must never enter
    return r


def scored(model, rows, bos, **kw):
    return sink_scores(model, rows, bos=bos, loss=True, options=TINY_RUN.replace(batch_size=2), **kw)


def test_paired_phantom_with_bos_value_scores_the_with_bos_loss(tiny_model, rows):
    """On the rotary tiny model the paired phantom with <bos>'s value is the run
    with <bos>: the same per-prompt loss on the same content targets; its mass
    per head is the paired mass averaged over each prompt's queries."""
    first = scored(tiny_model, rows, "prepend")
    got = scored(tiny_model, rows, "none", sink=PhantomSink("paired", "bos"))
    assert torch.allclose(got.prompt_loss, first.prompt_loss, rtol=1e-5)
    assert torch.equal(got.prompt_targets(), first.prompt_targets())
    none = tokenize(tiny_model, rows, bos="none")
    mass = paired_mass(tiny_model, none, TINY_BOS)
    want = mass.sum(-1) / none.lengths[:, None, None]
    assert torch.allclose(got.phantom_mass, want, atol=1e-6)
    d = got.summary()
    assert d["sink"] == {"kind": "phantom", "form": "paired", "value": "bos", "mode": "dump", "layers": None,
                         "heads": None}
    assert torch.allclose(torch.tensor(d["phantom_mass"]), want.mean(0), atol=1e-6)
    assert "phantom_mass" not in first.summary() and "sink" not in first.summary()
    # the mass without the value: not the with-<bos> loss
    assert not torch.allclose(scored(tiny_model, rows, "none", sink=PhantomSink("paired")).prompt_loss,
                              first.prompt_loss, rtol=1e-3)


def test_logits_phantom_mass_follows_the_logit(tiny_model, rows):
    """A large sink logit takes nearly every row's mass, -inf takes none (and
    leaves the run without <bos> as it is)."""
    L, H = tiny_model.cfg.n_layers, tiny_model.cfg.n_heads
    big = scored(tiny_model, rows, "none", sink=PhantomSink("logits", logits=torch.full((L, H), 30.0)))
    assert float(big.phantom_mass.min()) > 0.999
    off = scored(tiny_model, rows, "none", sink=PhantomSink("logits", logits=torch.full((L, H), float("-inf"))))
    plain = scored(tiny_model, rows, "none")
    assert float(off.phantom_mass.abs().max()) == 0.0 and torch.equal(off.prompt_loss, plain.prompt_loss)


def test_valueless_bos_loss_is_the_zeroed_value_run(tiny_model, rows):
    """The value-less <bos> in the sink pass scores the loss of zeroing v at
    position 0 by hand; attention on <bos> in layer 0 (before any value moved) is unchanged."""
    batch = tokenize(tiny_model, rows, bos="prepend", bos_token_id=TINY_BOS)

    def zero_v(v, hook):
        v = v.clone()
        v[:, 0] = 0.0
        return v

    L = tiny_model.cfg.n_layers
    by_hand = masked_row_losses(tiny_model, batch.tokens, target_mask(batch), [(act_name("v", l), zero_v) for l in range(L)])
    got = scored(tiny_model, rows, "prepend", sink=ValuelessBos())
    assert torch.allclose(got.prompt_loss, by_hand, rtol=1e-5)
    first = scored(tiny_model, rows, "prepend")
    assert torch.allclose(got.scores[:, 0], first.scores[:, 0], atol=1e-6)
    assert not torch.allclose(got.prompt_loss, first.prompt_loss, rtol=1e-3)
    assert got.summary()["sink"]["kind"] == "valueless_bos" and got.phantom_mass is None


def test_sink_interventions_refuse_the_wrong_condition(tiny_model, rows):
    with pytest.raises(ValueError, match="bos='prepend'"):
        scored(tiny_model, rows, "none", sink=ValuelessBos())
    with pytest.raises(ValueError, match="without bos_position"):
        scored(tiny_model, rows, "prepend", sink=ValuelessBos(), bos_position=2)
    with pytest.raises(ValueError, match="bos='none'"):
        scored(tiny_model, rows, "prepend", sink=PhantomSink("paired"))
    with pytest.raises(ValueError, match="do not fit"):
        scored(tiny_model, rows, "none", sink=PhantomSink("logits", logits=torch.zeros(3, 3)))
    with pytest.raises(ValueError, match="out of range"):
        scored(tiny_model, rows, "prepend", sink=ValuelessBos(layers=(7,)))
    with pytest.raises(ValueError, match="attention='pattern'"):
        scored(tiny_model, rows, "prepend", sink=ValuelessBos(), attention="fused")
