"""Tiny models with hand-set heads, shared by the patching / ablation tests."""

from __future__ import annotations

import torch
from transformer_lens import HookedTransformer

from conftest import TINY_BOS, make_tiny


def plant_sink_head(model: HookedTransformer, layer: int = 0, head: int = 0, strength: float = 12.0) -> HookedTransformer:
    """Make `head` of `layer` (0 only: its input is the raw embedding) a sink head
    whose value at `<bos>` is zero.

    The query is a constant in the lowest-frequency rotary pair (dims 3 and 7 of
    d_head 8: it barely rotates over 64 positions); the key in that pair is the
    projection of the normed input on the normed `<bos>` embedding u, so only
    `<bos>` gets a large logit. Values are projected orthogonally to u, so the
    head reads exactly 0 from `<bos>`: a true no-op sink.
    """
    assert layer == 0
    attn = model.blocks[layer].attn
    d_head = model.cfg.d_head
    low = d_head // 2 - 1  # lowest-frequency rotary pair (GPT-NeoX layout: low, low + d_head/2)
    with torch.no_grad():
        u = model.blocks[layer].ln1(model.W_E[TINY_BOS][None, None])[0, 0]
        unit = u / u.norm()
        attn.W_Q[head] = 0.0
        attn.b_Q[head] = 0.0
        attn.b_Q[head, low] = strength
        attn.W_K[head] = 0.0
        attn.b_K[head] = 0.0
        attn.W_K[head, :, low] = strength * u / u.norm() ** 2
        proj = torch.eye(u.shape[0]) - torch.outer(unit, unit)
        attn.W_V[head] = proj @ attn.W_V[head]
        attn.b_V[head] = 0.0
    return model


def planted_model(seed: int = 1) -> HookedTransformer:
    return plant_sink_head(make_tiny(seed, n_layers=2, n_heads=4, d_head=8))
