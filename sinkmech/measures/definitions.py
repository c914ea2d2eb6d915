"""The one definition of each sink quantity, on one layer's attention pattern.

alpha_0 on the first key (Gu et al. 2025), the sink-rate threshold check, the
row-sum check, a learned sink logit's share (gpt-oss), and `<bos>` moved to
position K with the attention on its key and the loss targets that stay the same.
"""

from __future__ import annotations

import einops
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from sinkmech.prompts import TokenBatch

# Every analysis that scores the first key or applies a sink-rate threshold calls these.


def check_eps(eps: float | str) -> float:
    """A sink-rate threshold as a float; `ValueError` unless 0 <= eps < 1
    (alpha_0 lies in [1/T, 1], so eps = 1 could never be exceeded)."""
    value = float(eps)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"epsilon must lie in [0, 1), got {eps}")
    return value


def sink_rate(scores: Float[Tensor, "..."], eps: float | str) -> float:
    """Percent of the scores (alpha_0 of (prompt, head) pairs) strictly above `eps`."""
    return 100.0 * (scores > check_eps(eps)).float().mean().item()


def query_mean(
    column: Float[Tensor, "batch head_index query_pos"], lengths: Int[Tensor, " batch"], start: int = 0,
    stop: int | None = None,
) -> Float[Tensor, "batch head_index"]:
    """The one mean over queries behind every score here: per prompt and head,
    the mean of `column` (one value per query: its attention on a key, a
    learned sink's share) over the real queries t = start .. T-1 (and t < stop
    when given); padding queries never count. Float32 sums, as the pattern's
    own dtype gives them; NaN for a prompt with no such query."""
    pos = torch.arange(column.shape[-1], device=column.device)
    n = lengths.to(column.device)
    end = n if stop is None else n.clamp(max=stop)
    valid = ((pos[None, :] >= start) & (pos[None, :] < end[:, None])).float()  # [batch, query_pos]
    total = einops.einsum(column.float(), valid, "b h q, b q -> b h")
    return total / (end - start)[:, None].float()


def first_key_score(
    pattern: Float[Tensor, "batch head_index query_pos key_pos"], lengths: Int[Tensor, " batch"]
) -> Float[Tensor, "batch head_index"]:
    """alpha_0 (Gu et al. 2025): per prompt and head, the mean over all real
    query positions t = 0 .. T-1 of the attention A[t, 0] on the first key.
    Query 0 counts (it can only attend to key 0); padding queries never do.

    Args:
        pattern: a layer's attention pattern over right-padded prompts (or the
            column of key 0 alone, [batch head_index query_pos 1]: the fused path).
        lengths: real positions per prompt (`<bos>` included when prepended).

    Returns:
        alpha_0 in float32, in [1/T, 1] for a prompt of T positions (in (0, 1]
        for a model with learned sink logits: the sink takes its share of query 0 too).
    """
    return query_mean(pattern[..., 0], lengths)


def check_rows(pattern: Float[Tensor, "batch head_index query_pos key_pos"], valid: Float[Tensor, "batch query_pos"],
               layer: int, *, learned: bool = False, phantom: bool = False) -> None:
    """`FloatingPointError` unless every real query's attention row is finite and
    sums to 1 (TransformerLens turns NaN scores into zero rows), or, with learned
    sink logits, to a share in (0, 1] (the rest is on the sink), or, with a
    phantom sink (`sinkmech.interventions.phantom`), to a share in [0, 1]. The
    tolerance admits bfloat16 rounding (eps 8e-3) and no zero row but a phantom's."""
    tol = max(1e-3, 8 * torch.finfo(pattern.dtype).eps)
    sums = pattern.float().sum(-1)  # [batch, head, query]
    real = valid[:, None, :].expand_as(sums) > 0
    if phantom:
        bad = ~torch.isfinite(sums) | (sums < -tol) | (sums > 1.0 + tol)
        what = "attention rows do not sum to a share in [0, 1] beside the phantom sink"
    elif learned:
        bad = ~torch.isfinite(sums) | (sums <= 0) | (sums > 1.0 + tol)
        what = "attention rows do not sum to a share in (0, 1] beside the learned sink"
    else:
        bad = ~((sums - 1.0).abs() <= tol)
        what = "attention rows do not sum to 1"
    if (bad & real).any():
        raise FloatingPointError(f"layer {layer}: {what} (NaN or inf in the attention scores)")


def learned_sink_score(
    pattern: Float[Tensor, "batch head_index query_pos key_pos"], lengths: Int[Tensor, " batch"]
) -> Float[Tensor, "batch head_index"]:
    """The learned sink's mass (gpt-oss): per prompt and head, the mean over all
    real queries of 1 - the row's sum over the real keys, the share the softmax
    gave the learned sink logit. In [0, 1); alpha_0 + this mass <= 1 per query."""
    return query_mean(1.0 - pattern.float().sum(-1), lengths)


# `<bos>` moved into the sequence (`sink_scores(..., bos_position=K)`)


def move_bos(batch: TokenBatch, position: int) -> TokenBatch:
    """`<bos>` moved from position 0 to `position` K: K content tokens, then
    `<bos>`, then the rest (same lengths, same padding). The result keeps
    bos="prepend"; score its loss with `moved_bos_targets`, not `target_mask`."""
    if isinstance(position, bool) or not isinstance(position, int) or position < 1:
        raise ValueError(f"bos_position must be an integer >= 1, got {position!r}")
    if batch.bos != "prepend":
        raise ValueError("bos_position moves the prepended <bos>: it needs bos='prepend'")
    short = int((batch.lengths - 1).min())
    if position >= short:
        raise ValueError(f"bos_position {position} is at or beyond the content length: the shortest prompt has "
                         f"{short} content tokens (bos_position must be below it)")
    tokens = batch.tokens.clone()
    tokens[:, :position] = batch.tokens[:, 1 : position + 1]
    tokens[:, position] = batch.tokens[:, 0]
    return TokenBatch(tokens, batch.lengths, batch.bos, batch.bos_token_id, batch.context_limit)


def moved_bos_targets(batch: TokenBatch, position: int) -> Bool[Tensor, "batch pos"]:
    """The loss mask for `<bos>` at `position` K: content targets 1 .. n-1 except
    content token K. Position p predicts token p + 1; the content token before
    `<bos>` (position K-1) would predict `<bos>`, which is never a target, and
    `<bos>` itself (position K) would predict content token K from the `<bos>`
    position, which no other condition asks of it: both are left out, so compare
    with other conditions on the same targets (`skip_target_mask`)."""
    pos = torch.arange(batch.tokens.shape[1], device=batch.tokens.device)
    return (pos[None, :] < batch.lengths[:, None] - 1) & (pos[None, :] != position - 1) & (pos[None, :] != position)


def skip_target_mask(batch: TokenBatch, content_index: int) -> Bool[Tensor, "batch pos"]:
    """`target_mask` of an unmoved batch (`<bos>` first or none) without content
    token `content_index`: the targets of `moved_bos_targets` at K = content_index."""
    pos = torch.arange(batch.tokens.shape[1], device=batch.tokens.device)
    scored = (pos[None, :] >= batch.offset) & (pos[None, :] < batch.lengths[:, None] - 1)
    return scored & (pos[None, :] != batch.offset + content_index - 1)


def moved_key_score(
    pattern: Float[Tensor, "batch head_index query_pos key_pos"], lengths: Int[Tensor, " batch"], position: int
) -> Float[Tensor, "batch head_index"]:
    """Per prompt and head: the mean over the real queries t = K .. T-1 (those
    that can see key K) of the attention A[t, K] on key `position` K."""
    return query_mean(pattern[..., position], lengths, start=position)
