"""Value-weighted first-token share (Kobayashi et al. 2020) against brute force, MHA and GQA."""

from __future__ import annotations

import pytest
import torch
from jaxtyping import TypeCheckError

from sinkmech.hooks import act_name, cached_run, kv_head_index
from sinkmech.prompts import tokenize
from sinkmech.measures.value_weighted import value_weighted_first
from helpers.tiny import TINY_BOS, make_tiny
from sinkmech.options import QUIET, RunOptions


def brute(model, batch, vector):
    L, H = model.cfg.n_layers, model.cfg.n_heads
    names = [act_name(n, l) for l in range(L) for n in ("pattern", "v")]
    _, cache = cached_run(model, batch.tokens, names)
    kv = kv_head_index(model)
    attn = torch.zeros(len(batch), L, H)
    share = torch.zeros(len(batch), L, H)
    for l in range(L):
        pat, v = cache[act_name("pattern", l)], cache[act_name("v", l)]
        for p in range(len(batch)):
            n = int(batch.lengths[p])
            for h in range(H):
                f = v[p, :n, kv[h]]
                if vector == "output":
                    f = f @ model.W_O[l, h]
                num = sum((pat[p, h, t, 0] * f[0]).norm() for t in range(n))
                den = sum((pat[p, h, t, k] * f[k]).norm() for t in range(n) for k in range(t + 1))
                share[p, l, h] = num / den
                attn[p, l, h] = pat[p, h, :n, 0].sum() / n
    return attn, share


@pytest.mark.parametrize("n_kv", [None, 2])
@pytest.mark.parametrize("vector", ["output", "value"])
def test_value_weighted_equals_brute_force(tiny_tokens, n_kv, vector):
    model = make_tiny(n_kv=n_kv)
    rows = [tiny_tokens[i, : 12 - i].tolist() for i in range(4)]
    batch = tokenize(model, rows, bos="prepend", max_tokens=12, bos_token_id=TINY_BOS)
    res = value_weighted_first(model, batch, vector=vector, options=RunOptions(batch_size=3, progress=False))
    attn, share = brute(model, batch, vector)
    assert torch.allclose(res.attn_first, attn, atol=1e-5)
    assert torch.allclose(res.output_first, share, atol=1e-5)
    assert ((res.output_first > 0) & (res.output_first <= 1 + 1e-6)).all()


def test_small_sink_value_lowers_output_share(tiny_model, tiny_tokens):
    """Shrinking the first token's value vectors leaves alpha_0 unchanged and cuts its output share."""
    batch = tokenize(tiny_model, tiny_tokens, bos="prepend", bos_token_id=TINY_BOS)

    def shrink(v, hook):
        out = v.clone()
        out[:, 0] *= 0.01
        return out

    clean = value_weighted_first(tiny_model, batch, options=QUIET)
    with tiny_model.hooks(fwd_hooks=[(act_name("v", 0), shrink)]):
        small = value_weighted_first(tiny_model, batch, options=QUIET)
    assert torch.allclose(clean.attn_first[:, 0], small.attn_first[:, 0])
    assert (small.output_first[:, 0] < clean.output_first[:, 0]).all()


def test_value_weighted_bad_vector(tiny_model, tiny_tokens):
    batch = tokenize(tiny_model, tiny_tokens, bos="none")
    with pytest.raises((ValueError, TypeCheckError)):  # beartype checks the Literal first under pytest
        value_weighted_first(tiny_model, batch, vector="weights")
    d = value_weighted_first(tiny_model, batch, options=QUIET).to_dict()
    assert set(d) == {"model", "bos", "vector", "n_prompts", "attn_first", "output_first"}
