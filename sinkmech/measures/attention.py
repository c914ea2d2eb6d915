"""Attention patterns of chosen heads on one prompt, with and without `<bos>`.

The raw material of the per-head views (`sinkmech.render`): what the sink
score of Gu et al. 2025 / Barbero et al. 2025 averages, kept per query and key,
for both conditions so the two can be compared token by token.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence
from typing import Literal

import torch
from jaxtyping import Float
from torch import Tensor

from sinkmech.loading.backend import Model, has_learned_sinks
from sinkmech.hooks import act_name, check_head, head_label, parse_head, run
from sinkmech.prompts import CONDITIONS, TokenStr, token_text, tokenize
from sinkmech.results import Result
from sinkmech.options import RunOptions

HeadSpec = tuple[int, int] | str


@dataclass(frozen=True)
class HeadAttention(Result):
    """Attention patterns of chosen heads on one prompt, with and without `<bos>`.

    `without_bos[:, i, j]` and `with_bos[:, i + 1, j + 1]` concern the same
    content tokens i, j.
    """

    heads: tuple[tuple[int, int], ...]
    with_bos: Float[Tensor, "head query_pos key_pos"]
    without_bos: Float[Tensor, "head content_query content_key"]
    tokens_with_bos: tuple[str, ...]
    tokens_without_bos: tuple[str, ...]

    def head_names(self) -> list[str]:
        return [head_label(l, h) for l, h in self.heads]

    def first_token(self, bos: Literal["prepend", "none"]) -> Float[Tensor, "head pos"]:
        """Attention each query puts on position 0 (`<bos>`, or the first content token)."""
        if bos not in ("prepend", "none"):
            raise ValueError(f"bos must be 'prepend' or 'none', got {bos!r}")
        return (self.with_bos if bos == "prepend" else self.without_bos)[:, :, 0]

    def index(self, head: HeadSpec) -> int:
        key = parse_head(head) if isinstance(head, str) else tuple(head)
        if key not in self.heads:
            raise ValueError(f"head {head_label(*key)} was not computed; have {self.head_names()}")
        return self.heads.index(key)

    def to_dataframe(self):
        """Long format: one row per (bos, head, query, key) with key <= query."""
        import pandas as pd

        rows = []
        for bos, pat in (("prepend", self.with_bos), ("none", self.without_bos)):
            q, k = torch.tril_indices(pat.shape[1], pat.shape[2])
            for i, (l, h) in enumerate(self.heads):
                rows.append(pd.DataFrame({"bos": bos, "layer": l, "head": h, "query": q.numpy(),
                                          "key": k.numpy(), "attention": pat[i, q, k].numpy()}))
        return pd.concat(rows, ignore_index=True)

    def to_dict(self) -> dict:
        return {
            "heads": self.head_names(),
            "tokens_with_bos": list(self.tokens_with_bos),
            "tokens_without_bos": list(self.tokens_without_bos),
            "first_token_with_bos": self.first_token("prepend").tolist(),
            "first_token_without_bos": self.first_token("none").tolist(),
        }


def head_attention(
    model: Model,
    prompt: str | Sequence[int],
    heads: Sequence[HeadSpec],
    *,
    max_tokens: int = 32,
    token_str: TokenStr | None = None,
    options: RunOptions = RunOptions(),
) -> HeadAttention:
    """Attention patterns of `heads` on `prompt`, with and without `<bos>`.

    Args:
        model: a HookedTransformer or a TransformerBridge (`sinkmech.loading.backend`).
        prompt: a string, or a list of token ids (models without tokenizer).
        heads: "L.H" strings or (layer, head) pairs.
        max_tokens: content tokens kept.
        token_str: token id -> display string (default: the tokenizer's).
        options: the `<bos>` id for a model whose tokenizer lacks one.

    Returns:
        HeadAttention with [head, query_pos, key_pos] patterns.
    """
    if not heads:
        raise ValueError("no heads given: pass at least one 'L.H' head")
    parsed = []
    for h in heads:
        l, hd = parse_head(h) if isinstance(h, str) else (int(h[0]), int(h[1]))
        check_head(model, l, hd)
        parsed.append((l, hd))
    token_str = token_str or token_text(model)
    patterns, labels = {}, {}
    for bos in CONDITIONS:
        batch = tokenize(model, [prompt], bos=bos, max_tokens=max_tokens, bos_token_id=options.bos_token_id)
        found: dict[int, Tensor] = {}

        def keep(pattern, hook):
            found[hook.layer()] = pattern[0].detach().clone().float().cpu()

        layers = sorted({l for l, _ in parsed})
        run(model, batch.tokens, [(act_name("pattern", l), keep) for l in layers], stop_at_layer=max(layers) + 1)
        patterns[bos] = torch.stack([found[l][h] for l, h in parsed])
        labels[bos] = tuple(token_str(int(t)) for t in batch.tokens[0].tolist())
    return HeadAttention(tuple(parsed), patterns["prepend"], patterns["none"], labels["prepend"], labels["none"])


def sink_mass(model: Model, pattern: Float[Tensor, "batch head_index query_pos key_pos"]
              ) -> Float[Tensor, "batch head_index query_pos"]:
    """Each query's attention on its sinks: key 0, plus, for a model with learned
    sink logits (gpt-oss), the learned sink's share (1 - the row's sum over the
    real keys). For any other model exactly `pattern[..., 0]`. What `heads`
    compares with its dormant cut `high` (and its active cut `low`)."""
    first = pattern[..., 0]
    if not has_learned_sinks(model):
        return first
    return first + (1.0 - pattern.sum(-1))
