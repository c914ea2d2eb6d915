"""Tiny models with hand-set heads: a sink head (patching / ablation tests), and
the library's planted dormant heads (`sinkmech.dormant.planted`) behind the
backend check that skips a test where they cannot be built."""

from __future__ import annotations

import torch

from sinkmech.loading.backend import Model

from helpers.tiny import TINY_BOS, make_tiny
from helpers.backends import require


def plant_sink_head(model: Model, layer: int = 0, head: int = 0, strength: float = 12.0) -> Model:
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


def planted_model(seed: int = 1) -> Model:
    require("from_config", why="the planted sink head is set in a HookedTransformer's weights")
    return plant_sink_head(make_tiny(seed, n_layers=2, n_heads=4, d_head=8))


def planted_dormant_model(kinds: dict[int, str], seed: int = 0, cut: int = 10) -> Model:
    """`sinkmech.dormant.planted.planted_dormant_model`, skipping the test on a
    backend that builds no model from a config."""
    from sinkmech.dormant import planted

    require("from_config", why="planted heads are set in a HookedTransformer's weights")
    return planted.planted_dormant_model(kinds, seed=seed, cut=cut)


def sampled_corpus(model: Model, n: int, length: int, bos_id: int = TINY_BOS, seed: int = 0) -> list[list[int]]:
    """`n` sequences of `length` content tokens sampled from `model` itself with
    `<bos>` first (temperature 1, ids below 2, `<bos>` and padding, never drawn):
    a corpus on which the with-`<bos>` run is the model's own distribution, so
    removing `<bos>` costs loss in expectation (a planted `<bos>` cost)."""
    from sinkmech.hooks import run

    g = torch.Generator().manual_seed(seed)
    tokens = torch.full((n, 1), bos_id, dtype=torch.long)
    for _ in range(length):
        logits = run(model, tokens)[:, -1].float()
        logits[:, :2] = float("-inf")
        nxt = torch.multinomial(logits.softmax(-1), 1, generator=g)
        tokens = torch.cat([tokens, nxt], 1)
    return tokens[:, 1:].tolist()
