"""Next-token loss on content targets, comparable with and without `<bos>`
(the loss column of Barbero et al. 2025, Table 2).

Both conditions score the same targets: content tokens 1 .. n-1 of each prompt,
each predicted from the content token before it (at position offset + j - 1).
The `<bos>` position predicts content token 0, which the no-`<bos>` run cannot
predict at all, so it never counts. Logits are never held whole: the final
residual stream is unembedded a few hundred rows at a time, which keeps memory
flat for a 262k-token vocabulary (Gemma 3). The same content targets wherever
`<bos>` sits (first, nowhere, or after K content tokens), target by target:
`laid_out` and `target_nll`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from sinkmech.loading.backend import Model, unembed
from sinkmech.hooks import Hook, act_name, cached_run
from sinkmech.prompts import TokenBatch
from sinkmech.options import QUIET, RunOptions

# (prompt, position) rows unembedded at once: 256 x 262k vocabulary floats is
# about 270 MB (Gemma 3). Far fewer rows re-read the whole unembedding for
# little work: 16 rows at a time made one 513-token sequence 11x slower.
UNEMBED_ROWS = 256


def target_mask(batch: TokenBatch) -> Bool[Tensor, "batch pos"]:
    """True at the positions whose next token is a scored target: positions
    offset .. length - 2 (they predict content tokens 1 .. n - 1)."""
    pos = torch.arange(batch.tokens.shape[1], device=batch.tokens.device)
    return (pos[None, :] >= batch.offset) & (pos[None, :] < batch.lengths[:, None] - 1)


def next_token_nll(model: Model, resid: Float[Tensor, "*rows d_model"], targets: Int[Tensor, "*rows"]
                   ) -> Float[Tensor, "*rows"]:
    """-log p(target | last block's output), float32: the one place a residual
    row becomes a next-token loss (final norm, unembedding, log-softmax)."""
    with torch.no_grad():
        # ours to overwrite: the reused buffer, a float32 copy of it, or the Bridge's new tensor
        logits = unembed(model, resid, scratch=True).float()
        # the log-softmax at the target, in place: log sum exp(x - m) + m - x_target
        peak = logits.amax(-1, keepdim=True)
        at_target = logits.gather(-1, targets[..., None])
        log_sum = logits.sub_(peak).exp_().sum(-1, keepdim=True).log_()
    return (log_sum + peak - at_target)[..., 0]


def nll_chunks(model: Model, resid: Tensor, tokens: Tensor, chunk: int | None, needed: Tensor | None = None):
    """Next-token losses, a few positions at a time: yields `(a, b, nll)` with
    nll [batch, b - a] for positions a .. b-1 predicting a+1 .. b. `chunk`
    positions per step (default: UNEMBED_ROWS rows over the batch); with
    `needed`, a step where it is all False is skipped."""
    last = resid.shape[1] - 1
    step = chunk or max(1, UNEMBED_ROWS // max(1, resid.shape[0]))
    for a in range(0, last, step):
        b = min(a + step, last)
        if needed is not None and not needed[:, a:b].any():
            continue
        yield a, b, next_token_nll(model, resid[:, a:b], tokens[:, a + 1 : b + 1])


def resid_row_losses(
    model: Model,
    resid: Float[Tensor, "batch pos d_model"],
    tokens: Int[Tensor, "batch pos"],
    mask: Bool[Tensor, "batch pos"],
    *,
    chunk: int | None = None,
) -> Float[Tensor, " batch"]:
    """Each row's summed next-token loss (nats, float64) at its masked positions,
    from the last block's residual output."""
    total = torch.zeros(resid.shape[0], dtype=torch.float64)
    for a, b, nll in nll_chunks(model, resid, tokens, chunk, mask):
        total += torch.where(mask[:, a:b], nll.double(), 0.0).sum(1).cpu()
    return total


def resid_token_losses(
    model: Model,
    resid: Float[Tensor, "batch pos d_model"],
    tokens: Int[Tensor, "batch pos"],
    mask: Bool[Tensor, "batch pos"],
    *,
    chunk: int | None = None,
) -> tuple[float, int]:
    """Sum of next-token losses (nats) at the masked positions, from the last
    block's residual output, and how many positions were scored."""
    return float(resid_row_losses(model, resid, tokens, mask, chunk=chunk).sum()), int(mask[:, :-1].sum())


def masked_row_losses(
    model: Model,
    tokens: Int[Tensor, "batch pos"],
    mask: Bool[Tensor, "batch pos"],
    fwd_hooks: Sequence[Hook] = (),
    *,
    chunk: int | None = None,
) -> Float[Tensor, " batch"]:
    """The one masked loss, per row: one forward pass to the last block's output
    (with `fwd_hooks` attached, e.g. an intervention or hooks that read the
    same pass), then each row's summed next-token loss (nats, float64) at the
    positions where `mask` is True (position p predicts token p + 1, e.g.
    `target_mask(batch)`)."""
    L = model.cfg.n_layers
    name = act_name("resid_post", L - 1)
    _, cache = cached_run(model, tokens, [name], fwd_hooks, stop_at_layer=L)
    return resid_row_losses(model, cache[name], tokens, mask, chunk=chunk)


def masked_loss(
    model: Model,
    tokens: Int[Tensor, "batch pos"],
    mask: Bool[Tensor, "batch pos"],
    fwd_hooks: Sequence[Hook] = (),
    *,
    chunk: int | None = None,
) -> tuple[float, int]:
    """`masked_row_losses` summed over the rows: (sum of losses, number of scored positions).

    Args:
        tokens: right-padded token ids.
        mask: True at the positions whose next token is scored (position p
            predicts token p + 1), e.g. `target_mask(batch)`.
        fwd_hooks: (hook name, function) pairs, removed afterwards.
    """
    return float(masked_row_losses(model, tokens, mask, fwd_hooks, chunk=chunk).sum()), int(mask[:, :-1].sum())


NO_TARGETS = "no content targets to score: every prompt needs at least 2 content tokens"


def content_loss(
    model: Model,
    batch: TokenBatch,
    *,
    hooks: Callable[[slice, TokenBatch], Sequence[Hook]] | None = None,
    desc: str = "content loss",
    options: RunOptions = QUIET,
) -> float:
    """Mean next-token loss (nats) over content targets 1 .. n-1 of every prompt.

    Args:
        batch: right-padded tokens, with or without `<bos>`.
        hooks: `hooks(rows, part)` gives the forward hooks of one chunk (the
            prompts `rows` of `batch`): an intervention, or hooks that read
            other quantities from the same pass.
        desc: the label of the progress bar over the chunks.
        options: batch size (default 16 prompts per forward pass); progress
            bar (default none).

    Returns:
        The mean over all scored targets (the same targets in both conditions).
    """
    total, n = 0.0, 0
    for rows, part in tqdm(batch.batches(options.batch(16)), desc=desc, disable=not options.progress, unit="batch"):
        t, k = masked_loss(model, part.tokens, target_mask(part), hooks(rows, part) if hooks else ())
        total, n = total + t, n + k
    if n == 0:
        raise ValueError(NO_TARGETS)
    return total / n


def token_losses(
    model: Model,
    tokens: Int[Tensor, "batch pos"],
    fwd_hooks: list | tuple = (),
    *,
    chunk: int | None = None,
) -> Float[Tensor, "batch pos_minus_1"]:
    """Next-token loss (nats) at every position, as TransformerLens's
    `return_type="loss", loss_per_token=True` gives it, but unembedded a few
    rows at a time so the full logits are never held."""
    L = model.cfg.n_layers
    name = act_name("resid_post", L - 1)
    _, cache = cached_run(model, tokens, [name], fwd_hooks, stop_at_layer=L)
    out = torch.empty(tokens.shape[0], tokens.shape[1] - 1)
    for a, b, nll in nll_chunks(model, cache[name], tokens, chunk):
        out[:, a:b] = nll.cpu()
    return out


# Content targets wherever `<bos>` sits: first, nowhere, or after K content tokens


def laid_out(rows: Sequence[Sequence[int]], layout: str | int, bos_id: int, width: int, pad: int
             ) -> tuple[TokenBatch, Tensor]:
    """Tokens of `rows` (content ids) in `layout`, right-padded, and each
    position's content index ([batch pos]; -1 for `<bos>`, -2 for padding)."""
    tokens, index = [], []
    for r in rows:
        ids, idx = list(r), list(range(len(r)))
        if layout == "prepend":
            ids, idx = [bos_id] + ids, [-1] + idx
        elif layout != "none":
            K = int(layout)
            ids, idx = ids[:K] + [bos_id] + ids[K:], idx[:K] + [-1] + idx[K:]
        tokens.append(ids)
        index.append(idx)
    n = max(map(len, tokens))
    t = torch.full((len(rows), n), pad, dtype=torch.long)
    c = torch.full((len(rows), n), -2, dtype=torch.long)
    for i, (ids, idx) in enumerate(zip(tokens, index)):
        t[i, : len(ids)], c[i, : len(idx)] = torch.tensor(ids), torch.tensor(idx)
    lengths = torch.tensor([len(x) for x in tokens])
    bos = "none" if layout == "none" else "prepend"
    return TokenBatch(t, lengths, bos, bos_id if bos == "prepend" else None), c


def target_nll(model: Model, rows: Sequence[Sequence[int]], layout: str | int, bos_id: int, *, pad: int = 0,
               from_bos: bool = False, fwd_hooks: Sequence = (), options: RunOptions = RunOptions()) -> Tensor:
    """[prompt, content]: each content target's next-token loss with the content in
    `layout` (`content_nll`; NaN where not scored)."""
    width = max(map(len, rows))
    out = torch.full((len(rows), width), float("nan"), dtype=torch.float64)
    L = model.cfg.n_layers
    name = act_name("resid_post", L - 1)
    step = options.batch(8)
    for s in range(0, len(rows), step):
        batch, idx = laid_out(rows[s : s + step], layout, bos_id, width, pad)
        batch = TokenBatch(batch.tokens.to(model.cfg.device), batch.lengths, batch.bos, batch.bos_token_id)
        _, cache = cached_run(model, batch.tokens, [name], fwd_hooks, stop_at_layer=L)
        out[s : s + step] = content_nll(model, cache[name], batch.tokens, idx, width, from_bos=from_bos)
    return out


def content_nll(model: Model, resid: Tensor, tokens: Tensor, index: Tensor, width: int, *,
                from_bos: bool = False) -> Tensor:
    """[batch, width]: the next-token loss of content token j predicted from the content
    token before it (NaN where no content token predicts it: content token 0, and
    a token whose predecessor is `<bos>`; with `from_bos`, a token `<bos>` predicts
    counts too).

    Args:
        resid: the last block's output [batch pos d_model].
        index: each position's content index (`laid_out`; -1 for `<bos>`, -2 for padding).
    """
    out = torch.full((tokens.shape[0], width), float("nan"), dtype=torch.float64)
    idx = index.cpu()
    for a, b, nll in nll_chunks(model, resid, tokens, None):
        pred, tgt = idx[:, a:b], idx[:, a + 1 : b + 1]
        ok = ((pred >= 0) | (from_bos & (pred == -1))) & (tgt >= 1)
        r, p = ok.nonzero(as_tuple=True)
        out[r, tgt[r, p]] = nll.detach().double().cpu()[r, p]
    return out
