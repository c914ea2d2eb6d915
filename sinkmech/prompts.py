"""Tokenization with an explicit `<bos>` choice (the corpora and prompt files: `sinkmech.corpora`).

Both conditions of the paper's comparison score the same content tokens: a
prompt is cut to `max_tokens` content tokens first, then `<bos>` is prepended
or not. Batches are right-padded; `lengths` says how many positions are real,
and no analysis may read past them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from collections.abc import Callable, Sequence
from typing import Literal, Union

import torch
from jaxtyping import Int
from torch import Tensor

from sinkmech.corpora import load_prompts

Bos = Literal["prepend", "none"]
# The paper's two conditions, in the order every result lists them.
CONDITIONS: tuple[Bos, ...] = ("prepend", "none")
BOS_CHOICES: tuple[str, ...] = CONDITIONS
CONDITION_LABELS = {"prepend": "with <bos>", "none": "without <bos>"}
DEFAULT_EPS = (0.3, 0.8)  # Gu et al. 2025's threshold, and the paper's Table 1
TokenStr = Callable[[int], str]
PromptSource = Union[str, os.PathLike, Sequence[str], Sequence[Sequence[int]], Tensor, None]


def token_text(model) -> TokenStr:
    """Token id -> display string: the tokenizer's, or `[id]` without one (raw: escape it before HTML)."""
    tok = model.tokenizer
    if tok is None:
        return lambda i: f"[{int(i)}]"
    return lambda i: tok.decode([int(i)])


def check_bos(bos: str) -> Bos:
    if bos not in BOS_CHOICES:
        raise ValueError(f"bos must be one of {BOS_CHOICES}, got {bos!r}")
    return bos  # type: ignore[return-value]


@dataclass(frozen=True)
class TokenBatch:
    """Right-padded tokens with explicit `<bos>` handling.

    `tokens[i, :lengths[i]]` is real; position `offset + j` holds content token j.
    """

    tokens: Int[Tensor, "batch pos"]
    lengths: Int[Tensor, " batch"]
    bos: Bos
    bos_token_id: int | None
    # The model's context (n_ctx) when it, not max_tokens, cut some prompt.
    context_limit: int | None = None

    @property
    def offset(self) -> int:
        return 1 if self.bos == "prepend" else 0

    @property
    def max_content(self) -> int:
        """The longest prompt's content tokens: what `max_tokens` came to."""
        return int(self.lengths.max()) - self.offset

    def used(self, requested: int | None) -> dict:
        """What was scored, for a JSON record: `max_tokens` is the longest
        content actually used, `max_tokens_requested` what was asked,
        `content_lengths` each prompt's content tokens, and `context_limit`
        the model's context where it cut a prompt (else null)."""
        return {
            "max_tokens": self.max_content,
            "max_tokens_requested": requested,
            "content_lengths": (self.lengths - self.offset).tolist(),
            "context_limit": self.context_limit,
        }

    @property
    def mask(self) -> Tensor:
        """Bool [batch, pos]: True on real positions."""
        pos = torch.arange(self.tokens.shape[1], device=self.tokens.device)
        return pos[None, :] < self.lengths[:, None]

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def content(self) -> list[list[int]]:
        """Each prompt's content token ids: no `<bos>`, no padding."""
        return [row[self.offset : n].tolist() for row, n in zip(self.tokens.cpu(), self.lengths.cpu())]

    def batches(self, batch_size: int) -> list[tuple[slice, "TokenBatch"]]:
        """The prompts in chunks of `batch_size` for streamed forward passes:
        `(rows, part)` pairs, `rows` the chunk's place in this batch and `part`
        trimmed to its longest prompt. Checks `batch_size` and that there are prompts."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if len(self) == 0:
            raise ValueError("the batch holds no prompts")
        spans = [slice(s, min(s + batch_size, len(self))) for s in range(0, len(self), batch_size)]
        return [(rows, self.slice(rows.start, rows.stop)) for rows in spans]

    def slice(self, start: int, stop: int) -> "TokenBatch":
        """Rows start:stop, trimmed to their longest real length."""
        lengths = self.lengths[start:stop]
        width = int(lengths.max())
        return TokenBatch(self.tokens[start:stop, :width], lengths, self.bos, self.bos_token_id, self.context_limit)


def tokenize(
    model,
    prompts: PromptSource,
    *,
    bos: Bos,
    max_tokens: int = 64,
    bos_token_id: int | None = None,
    pad_token_id: int | None = None,
    min_tokens: int = 2,
) -> TokenBatch:
    """Cut each prompt to `max_tokens` content tokens, then prepend `<bos>` or not.

    Args:
        model: a HookedTransformer (its tokenizer is used for strings).
        prompts: see `sinkmech.corpora.load_prompts`.
        bos: "prepend" or "none"; never taken from the model's defaults.
            "prepend" refuses prompts whose first token is already `<bos>`
            (ValueError); "none" takes the tokens exactly as given.
        max_tokens: content tokens kept per prompt (shorter prompts keep
            their own length: see `TokenBatch.lengths`). A prompt longer than
            the model's context is cut to n_ctx - 1 content tokens in either
            condition (room for `<bos>`, so both see the same content), and
            `TokenBatch.context_limit` records n_ctx.
        min_tokens: fewer content tokens than this is an error.
        bos_token_id: overrides the tokenizer's `<bos>` id.
    """
    from sinkmech.loading.models import bos_token_id as model_bos

    check_bos(bos)
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    items = load_prompts(prompts)
    room = model.cfg.n_ctx - 1
    keep = min(max_tokens, room)
    cut_by_context = False
    content: list[list[int]] = []
    for i, p in enumerate(items):
        if isinstance(p, str) and not p.strip():
            raise ValueError(f"prompt {i} is empty")
    for i, p in enumerate(items):
        if isinstance(p, str):
            if model.tokenizer is None:
                raise ValueError("the model has no tokenizer: pass token ids instead of strings")
            ids = model.tokenizer(p, add_special_tokens=False)["input_ids"]
        else:
            ids = list(p)
        if len(ids) < min_tokens:
            preview = p[:40] if isinstance(p, str) else p[:8]
            raise ValueError(
                f"prompt {i} ({preview!r}) has {len(ids)} content token(s); at least {min_tokens} are needed "
                "(a one-token prompt attends only to itself and scores 1 on every head)"
            )
        cut_by_context |= len(ids) > keep and keep < max_tokens
        content.append(ids[:keep])
    if bos == "prepend":
        bos_id = bos_token_id if bos_token_id is not None else model_bos(model)
        # The classic double-<bos> bug: tokens that carry their own <bos> (e.g.
        # from model.to_tokens) would get a second one. Refuse rather than guess.
        doubled = [i for i, ids in enumerate(content) if ids[0] == bos_id]
        if doubled:
            more = f" (and {len(doubled) - 1} more)" if len(doubled) > 1 else ""
            raise ValueError(
                f"prompt {doubled[0]}{more} already starts with <bos> (id {bos_id}), and bos='prepend' would put a "
                "second one before it: pass the content tokens without their <bos>, or bos='none' to score the "
                "tokens exactly as given"
            )
        rows = [[bos_id] + ids for ids in content]
    else:
        bos_id = bos_token_id
        rows = content
    width = max(len(r) for r in rows)
    vocab = model.cfg.d_vocab
    if any(t < 0 or t >= vocab for r in rows for t in r):
        raise ValueError(f"token ids must lie in [0, {vocab})")
    if pad_token_id is None:
        tok = model.tokenizer
        pad_token_id = getattr(tok, "pad_token_id", None) if tok is not None else None
        pad_token_id = 0 if pad_token_id is None else pad_token_id
    tokens = torch.full((len(rows), width), int(pad_token_id), dtype=torch.long)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    limit = model.cfg.n_ctx if cut_by_context else None
    return TokenBatch(tokens.to(model.cfg.device), lengths.to(model.cfg.device), bos, bos_id, limit)


def as_batch(
    model,
    source: PromptSource | TokenBatch,
    *,
    bos: Bos | None = None,
    default: Bos | None = None,
    max_tokens: int | None = 64,
    bos_token_id: int | None = None,
) -> TokenBatch:
    """The one place an analysis turns its input into tokens.

    A TokenBatch passes through untouched: its `<bos>` condition must match
    `bos` when `bos` is given, it must hold prompts, and it may not be wider
    than a `max_tokens` given (never cut silently: tokenize with the
    `max_tokens` you want); `bos_token_id` is then unused. Anything else is
    tokenized once with `tokenize` (default `max_tokens` 64).

    Args:
        source: a ready TokenBatch, or prompts (see `sinkmech.corpora.load_prompts`).
        bos: the condition; None keeps a TokenBatch's own.
        default: the condition for prompts when `bos` is None (an analysis'
            documented default); without one, prompts need an explicit `bos`.
    """
    if isinstance(source, TokenBatch):
        if len(source) == 0:
            raise ValueError("the TokenBatch is empty")
        if bos is not None and check_bos(bos) != source.bos:
            raise ValueError(f"bos={bos!r} does not match the TokenBatch, which was built with bos={source.bos!r}")
        if max_tokens is not None and max_tokens < source.max_content:
            raise ValueError(f"the TokenBatch holds {source.max_content} content tokens per prompt, more than "
                             f"max_tokens={max_tokens}: tokenize with the max_tokens you want")
        return source
    bos = bos if bos is not None else default
    if bos is None:
        raise ValueError("bos must be given ('prepend' or 'none') to tokenize prompts")
    max_tokens = 64 if max_tokens is None else max_tokens
    return tokenize(model, source, bos=check_bos(bos), max_tokens=max_tokens, bos_token_id=bos_token_id)
