"""Sliding-window attention with and without the sink (Xiao et al. 2024,
"Efficient streaming language models with attention sinks", Sec. 3.2).

Query t may attend to the last `window` keys (t - W, t] plus the first `keep`
keys 0 .. keep-1 (keep = 0: plain window attention; keep >= 1 keeps the sink).
The restriction is a hook on every layer's `attn_scores` that sets disallowed
keys to -inf before the softmax; the model's own causal mask and local/global
layers still apply. Perplexity is computed over the same scored tokens in
every setting: the next-token losses of query positions scored_from .. T-2
(default scored_from = W + max(keep), after the window has filled), from the
final residual stream unembedded in chunks (no logits held whole).

Positions, the choice stated: by default every key keeps its original
position (the rotary angle of key k is k's), which is what a mask over one full
forward pass gives. StreamingLLM instead re-assigns positions inside its
rolling cache: the kept first keys and the window are numbered 0 .. keep + W -
1, the query last. With `reindex=True` this is reproduced in the same single
pass, for rotary models: once the cache is full (t >= keep + W), a window key
is at the same distance t - j from the query either way, and only the kept
first keys move, to distance keep + W - 1 - s; their scores are recomputed
with the query rotated back by t - (keep + W - 1) positions. Every token is
still processed as the query it was, with its own window, so this equals a
token-by-token run with StreamingLLM's cache (keys cached before the rotary,
evicted from the middle; see tests/unit/context/test_stream.py).

Keeping k first keys also gives a query k more keys than the window alone, so
every keep > 0 comes with its control: a plain window of W + k keys
(`control_ppl`), the same number of keys without the first ones.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float
from torch import Tensor
from tqdm.auto import tqdm

from sinkmech.context import check_fits, first_scored
from sinkmech.loading.backend import CAPABILITIES, Model
from sinkmech.hooks import act_name
from sinkmech.measures.loss import masked_loss
from sinkmech.prompts import Bos, TokenBatch, tokenize
from sinkmech.results import Result
from sinkmech.options import RunOptions


def window_mask(n_pos: int, window: int, keep: int, device=None) -> Bool[Tensor, "query_pos key_pos"]:
    """True where query t may attend key k: t - window < k <= t, or k < keep."""
    t = torch.arange(n_pos, device=device)[:, None]
    k = torch.arange(n_pos, device=device)[None, :]
    return (k <= t) & ((k > t - window) | (k < keep))


def window_hook(window: int, keep: int) -> Callable:
    """On `attn_scores`: disallowed keys get -inf (every row keeps its own key)."""

    cache: dict[tuple, Tensor] = {}  # one mask per (length, device), shared by all layers

    def hook(scores: Float[Tensor, "batch head_index query_pos key_pos"], hook):
        key = (scores.shape[-1], scores.device)
        if key not in cache:
            cache[key] = ~window_mask(scores.shape[-1], window, keep, scores.device)
        return scores.masked_fill(cache[key], float("-inf"))

    return hook


def check_reindex(model: Model) -> None:
    """`reindex` needs what it recomputes: rotary positions on a backend that can
    re-index the cache (`CAPABILITIES.can_reindex_cache`: a TL 3.x HookedTransformer's
    rotary tables and its own score function), with no length-dependent query
    scaling (log-n attention, dynamic NTK)."""
    cfg = model.cfg
    if not CAPABILITIES.can_reindex_cache:
        raise ValueError("reindex is implemented on TransformerLens 3.x HookedTransformers, not the TL 4 bridge")
    if cfg.positional_embedding_type != "rotary":
        raise ValueError(f"reindex re-assigns rotary positions; this model's positions are "
                         f"{cfg.positional_embedding_type!r}")
    if getattr(cfg, "use_logn_attn", False) or getattr(cfg, "use_dynamic_ntk_rope", False):
        raise ValueError("reindex does not handle log-n attention or dynamic NTK rotary scaling")


def reindex_hooks(model: Model, window: int, keep: int) -> list[tuple[str, Callable]]:
    """Hooks for every layer: the sliding window of `window_hook`, with the first
    `keep` keys at StreamingLLM's cache positions (see the module docstring).

    Query t >= keep + window sees key s < keep at distance keep + window - 1 - s
    instead of t - s: its score is q_t rotated back by t - (keep + window - 1)
    positions (rotary: R(-d) x = x cos(d theta) - flip(x) sin(d theta)), dotted
    with the rotated key s by the attention module's own score function
    (scale, grouped keys, soft cap)."""
    check_reindex(model)
    P = keep + window - 1  # the query's position in a full cache
    mask = window_hook(window, keep)
    hooks = []
    for l in range(model.cfg.n_layers):
        attn, seen = model.blocks[l].attn, {}

        def keep_q(q, hook, seen=seen):
            seen["q"] = q
            return q

        def keep_k(k, hook, seen=seen):
            seen["k"] = k
            return k

        def scores_hook(scores: Float[Tensor, "batch head_index query_pos key_pos"], hook, attn=attn, seen=seen):
            T = scores.shape[-1]
            if keep > 0 and T > P + 1:
                q = seen.pop("q")[:, P + 1:]  # [batch, query_pos, head_index, d_head], already rotated
                d = torch.arange(P + 1, T, device=q.device) - P  # positions to rotate back
                r = attn.cfg.rotary_dim
                cos, sin = attn.rotary_cos[d][None, :, None, :], attn.rotary_sin[d][None, :, None, :]
                x = q[..., :r]
                q = torch.cat([x * cos - attn.rotate_every_two(x) * sin, q[..., r:]], dim=-1)
                moved = attn.calculate_attention_scores(q, seen.pop("k")[:, :keep])  # [batch, head, query, keep]
                scores = scores.clone()
                scores[:, :, P + 1:, :keep] = moved.to(scores.dtype)
            return mask(scores, hook)

        hooks += [(act_name("rot_q", l), keep_q), (act_name("rot_k", l), keep_k),
                  (act_name("attn_scores", l), scores_hook)]
    return hooks


def long_text(n_words: int) -> str:
    """The first `n_words` words of the Python documentation (`pydoc_data.topics`,
    no download): one long text for streaming and long-context evaluation."""
    from pydoc_data.topics import topics

    words = re.sub(r"\s+", " ", " ".join(topics[k] for k in sorted(topics))).split(" ")
    if n_words > len(words):
        raise ValueError(f"the corpus has {len(words)} words, fewer than {n_words}")
    return " ".join(words[:n_words])


def long_tokens(model: Model, n_tokens: int, *, bos: Bos = "prepend", bos_token_id: int | None = None) -> TokenBatch:
    """One row of exactly `n_tokens` content tokens from `long_text`."""
    check_fits(n_tokens, model.cfg.n_ctx, bos == "prepend")
    batch = tokenize(model, [long_text(n_tokens)], bos=bos, max_tokens=n_tokens, bos_token_id=bos_token_id)
    if int(batch.lengths[0]) - batch.offset < n_tokens:
        raise ValueError(f"the text gave fewer than {n_tokens} tokens")
    return batch


@dataclass(frozen=True)
class StreamResult(Result):
    """Perplexity under full attention and under each sliding-window setting."""

    model: str
    window: int
    n_tokens: int  # positions of the sequence, <bos> included
    scored_from: int
    n_scored: int
    full_ppl: float
    keep: tuple[int, ...]
    ppl: tuple[float, ...]
    control_ppl: tuple[float | None, ...] = ()  # per keep: a plain window of window + keep keys (None for keep 0)
    reindex: bool = False  # the kept first keys at StreamingLLM's cache positions

    def positions(self) -> str:
        if self.reindex:
            return ("reindexed as in StreamingLLM's cache: the kept first keys at positions 0 .. keep-1, the window "
                    "after them, the query last (distances within the window unchanged)")
        return "original (keys keep their own positions; StreamingLLM's cache re-indexing is not applied)"

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "window": self.window,
            "n_tokens": self.n_tokens,
            "scored_from": self.scored_from,
            "full_ppl": self.full_ppl,
            "positions": self.positions(),
            "reindex": self.reindex,
            "results": [{"keep": k, "ppl": p, "control_window": self.window + k if k else None, "control_ppl": c}
                        for k, p, c in zip(self.keep, self.ppl, self.control_ppl or (None,) * len(self.keep))],
        }

    def to_dataframe(self):
        """Long format: one row per setting (keep = None: full attention)."""
        import pandas as pd

        rows = [{"keep": None, "window": None, "ppl": self.full_ppl}]
        rows += [{"keep": k, "window": self.window, "ppl": p} for k, p in zip(self.keep, self.ppl)]
        return pd.DataFrame(rows)


def _ppl(model: Model, tokens: Tensor, mask: Tensor, hooks) -> float:
    total, n = masked_loss(model, tokens, mask, hooks)
    return math.exp(total / n)


def stream_perplexity(
    model: Model,
    batch: TokenBatch,
    *,
    window: int,
    keep: Sequence[int] = (0, 1, 4),
    scored_from: int | None = None,
    reindex: bool = False,
    options: RunOptions = RunOptions(),
) -> StreamResult:
    """Perplexity of one long sequence under sliding-window attention, keeping
    the first `keep` keys or not, and under full attention.

    Args:
        model: a HookedTransformer or a TransformerBridge (`sinkmech.loading.backend`).
        batch: a TokenBatch of exactly one sequence (e.g. `long_tokens`).
        window: keys (t - window, t] visible to query t.
        keep: numbers of leading keys kept visible (0 = none), one run each.
        scored_from: first query position whose next-token loss counts
            (default window + max(keep)); the same tokens in every setting.
        reindex: number the kept first keys as StreamingLLM's cache does
            (rotary models; the W + k control has no first keys, so it is
            the same either way).
        options: a progress bar over the settings.

    Returns:
        StreamResult (`to_dict()` is the `sinkmech stream --json` contract).
    """
    if len(batch) != 1:
        raise ValueError(f"stream_perplexity runs one sequence; the batch holds {len(batch)}")
    T = int(batch.lengths[0])
    check_fits(T - max(batch.offset, 0), model.cfg.n_ctx, batch.offset > 0)
    scored_from = first_scored(window, keep, T, batch.offset, scored_from)
    keep = tuple(int(k) for k in keep)
    if reindex:
        check_reindex(model)
    tokens = batch.tokens[:, :T]
    pos = torch.arange(T, device=tokens.device)
    mask = ((pos >= scored_from) & (pos < T - 1))[None, :]
    L = model.cfg.n_layers
    full = _ppl(model, tokens, mask, [])
    ppls = []
    for k in tqdm(keep, desc=f"stream (window={window})", disable=not options.progress, unit="setting"):
        if reindex and k > 0:
            hooks = reindex_hooks(model, window, k)
        else:
            hooks = [(act_name("attn_scores", l), window_hook(window, k)) for l in range(L)]
        ppls.append(_ppl(model, tokens, mask, hooks))
    controls = []  # the W + k control: as many keys as keep k gives, none of them the first
    for k in keep:
        if k == 0:
            controls.append(None)
            continue
        hook = window_hook(window + k, 0)
        controls.append(_ppl(model, tokens, mask, [(act_name("attn_scores", l), hook) for l in range(L)]))
    return StreamResult(
        model=model.cfg.model_name, window=window, n_tokens=T, scored_from=scored_from,
        n_scored=int(mask.sum()), full_ppl=full, keep=keep, ppl=tuple(ppls), control_ppl=tuple(controls),
        reindex=reindex,
    )
