"""Tiny models with hand-set heads: a sink head (patching / ablation tests) and
the dormant-head detector's planted if-else, sink, previous-token and
positional-null heads."""

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


TRIGGER = 7
N_CTX = 32
LATE = 9  # a token that only occurs late in the sequence
MARKER = 11  # the "prompt" head's prompt marker
X_BOS, X_TRIG, X_CONST, X_POS = 0, 1, 2, 3  # residual dims of the planted model
X_RAND = X_POS + N_CTX


def planted_dormant_model(kinds: dict[int, str], seed: int = 0, cut: int = 10) -> Model:
    """Attention-only 2-layer model with hand-set layer-0 heads (others random).

    Residual = one-hot "is <bos>", "is trigger", a constant 1 on every
    non-<bos> token, a one-hot position, and 10 random features. Logits are
    written in units of the attention scale, so 15 means 15 after scaling.

    kinds: head -> "if_else" (sink logit +15, -15 when the query token is
    TRIGGER; previous-token logit +8; the value at <bos> is 0), "sink"
    (always +15 on <bos>), "prev" (previous token +15), "position" (the
    positional null: sink before position `cut`, previous token from there
    on, whatever the tokens; the value at <bos> is 0 as in "if_else", so
    only the trigger rule can tell the two apart), "prompt" (activity follows
    the prompt: every query from a MARKER token on attends to it, logit +30
    against the sink's +15, so whole prompts are active or dormant whatever
    the query token; the value at <bos> is 0).
    """
    require("from_config", why="planted heads are set in a HookedTransformer's weights")
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=2, d_model=X_RAND + 10, n_heads=4, d_head=N_CTX + 2, n_ctx=N_CTX, d_vocab=50,
        attn_only=True, normalization_type=None, positional_embedding_type="standard", seed=seed, device="cpu",
    )
    model = HookedTransformer(cfg)
    g = torch.Generator().manual_seed(seed)
    pos = torch.arange(N_CTX)
    with torch.no_grad():
        W_E = torch.zeros(cfg.d_vocab, cfg.d_model)
        W_E[:, X_CONST] = 1.0
        W_E[:, X_RAND:] = torch.randn(cfg.d_vocab, 10, generator=g)
        W_E[TINY_BOS] = 0.0
        W_E[TINY_BOS, X_BOS] = 1.0
        W_E[TRIGGER, X_TRIG] = 1.0
        if "prompt" in kinds.values():
            W_E[MARKER, X_TRIG] = -1.0  # a key only the "prompt" head reads (the if_else head rests on it)
        model.embed.W_E.copy_(W_E)
        model.pos_embed.W_pos.copy_(torch.zeros(N_CTX, cfg.d_model).index_put_((pos, X_POS + pos), torch.tensor(1.0)))
        attn = model.blocks[0].attn
        s = attn.attn_scale
        for h, kind in kinds.items():
            for w in (attn.W_Q, attn.W_K):
                w[h].zero_()
            attn.W_K[h, X_BOS, 0] = 1.0  # head dim 0: "is <bos>" key
            p = pos[1:-1]
            attn.W_K[h, X_POS + p - 1, p] = 1.0  # head dim p: "I am at position p - 1"
            if kind in ("if_else", "position"):
                attn.W_V[h, X_BOS].zero_()
                attn.W_V[h, X_POS].zero_()
            if kind == "if_else":
                attn.W_Q[h, X_CONST, 0] = 15.0 * s
                attn.W_Q[h, X_TRIG, 0] = -30.0 * s
                attn.W_Q[h, X_POS + p, p] = 8.0 * s
            elif kind == "sink":
                attn.W_Q[h, X_CONST, 0] = 15.0 * s
            elif kind == "prev":
                attn.W_Q[h, X_POS + p, p] = 15.0 * s
            elif kind == "prompt":
                attn.W_V[h, X_BOS].zero_()
                attn.W_Q[h, X_CONST, 0] = 15.0 * s
                attn.W_Q[h, X_CONST, cfg.d_head - 1] = 30.0 * s
                attn.W_K[h, X_TRIG, cfg.d_head - 1] = -1.0
            elif kind == "position":
                attn.W_Q[h, X_POS + pos[:cut], 0] = 15.0 * s
                attn.W_Q[h, X_POS + p, p] = 8.0 * s
    model.eval()
    return model


def planted_corpus(n: int = 64, length: int = 20, seed: int = 0) -> torch.Tensor:
    """Random content tokens in [2, 50) with TRIGGER at 10 % of positions."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(2, 50, (n, length), generator=g)
    tokens[tokens == TRIGGER] = 2
    tokens[torch.rand(n, length, generator=g) < 0.1] = TRIGGER
    return tokens


def trigger_corpus(n: int, seed: int, trigger_rate: float, g: torch.Generator) -> torch.Tensor:
    """`planted_corpus(n, seed=seed)` with TRIGGER at `trigger_rate` of the
    positions instead, placed by `g` (a corpus for a contrast: 0.0 is prose
    that never wakes the planted if-else head)."""
    tokens = planted_corpus(n=n, seed=seed)
    tokens[tokens == TRIGGER] = 2
    tokens[torch.rand(tokens.shape, generator=g) < trigger_rate] = TRIGGER
    return tokens


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
