"""Planted heads: tiny attention-only models whose layer-0 heads are set by hand
to be an if-else head, a sink head, a previous-token head, or one of the nulls
a dormant-head detector must not call if-else (a head whose mode follows
position, one whose mode follows its prompt). The detector is proven on them
(`sinkmech.studies.calibration` chooses the default cut on them; the tests
plant and find them). Dormant heads: Barbero et al. 2025, Sec. 3.2; Guo et
al. 2024.
"""

from __future__ import annotations

import torch

from sinkmech.loading.backend import Model

BOS = 1  # the planted models' <bos> id (they have no tokenizer)

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
    from sinkmech.loading.backend import CAPABILITIES

    if not CAPABILITIES.from_config:
        raise ValueError("planted heads are set in a HookedTransformer's weights: this TransformerLens builds no model "
                         "from a config (use TransformerLens 3.x)")
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
        W_E[BOS] = 0.0
        W_E[BOS, X_BOS] = 1.0
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


def prompt_marker_corpus(n: int, seed: int, *, length: int = 20, marked_rate: float = 0.3,
                         other_rate: float = 0.08) -> torch.Tensor:
    """Prompts for the prompt-following null: one in five opens with MARKER and
    holds TRIGGER at `marked_rate` of its positions, the others at `other_rate`
    (TRIGGER shares the marked prompts without being what the head reads)."""
    g = torch.Generator().manual_seed(seed)
    c = torch.randint(2, 50, (n, length), generator=g)
    c[(c == TRIGGER) | (c == MARKER)] = 2
    marked = torch.arange(n) % 5 == 0
    c[torch.rand(c.shape, generator=g) < torch.where(marked, marked_rate, other_rate)[:, None]] = TRIGGER
    c[marked, 0] = MARKER
    return c
