"""Sensitivity, its path-weight bound, and collapse (Barbero et al. 2025, Sec. 3-4).

Sensitivity of output position j to input position i: the Frobenius norm of
the Jacobian d h_j^(L) / d h_i^(0) (h^(0): the residual stream entering layer
0), by autograd (`sinkmech.theory.jacobian`). The paper bounds it by a constant^L
times the sum over all paths i -> j of products of per-layer mixing weights, where layer l mixes with
M^(l) = (sum_h A^(l,h) + I) / (n_heads + 1); the sum over paths is the matrix
product M^(L-1) ... M^(0); `sensitivity_study` tests the bound's ranking (Spearman
correlation of the two over the causal pairs). Rank collapse at layer l: ||X - 1 mean(X)||_F / ||X||_F
over the real token vectors, by default without position 0 (the sink's residual
is ~100x the others' and alone keeps the ratio near 1). Representational
collapse (the paper's setting): a real prefix whose last token is repeated k
times; the distance between the last-token representations of prefix + k and
prefix + (k + 1) repeats, as k grows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from sinkmech.loading.backend import Model
from sinkmech.hooks import act_name, cached_run, residual_stack
from sinkmech.theory.jacobian import (  # noqa: F401  (re-exported: sinkmech.theory.sensitivity is where callers look)
    _check_layers,
    jacobian_norms,
    jacobian_norms_hutchinson,
)
from sinkmech.prompts import CONDITIONS, Bos, PromptSource, TokenBatch, as_batch, check_bos, tokenize
from sinkmech.results import Result
from sinkmech.options import RunOptions


def spearman(x: Tensor, y: Tensor) -> float:
    """Spearman rank correlation of two equally long 1-D samples (average ranks
    for ties); NaN when either is constant or they hold fewer than 2 values."""
    x, y = x.flatten().double(), y.flatten().double()
    if x.shape != y.shape:
        raise ValueError(f"spearman needs equally long samples, got {x.numel()} and {y.numel()}")
    if x.numel() < 2:
        return float("nan")
    rx, ry = _ranks(x), _ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = (rx.norm() * ry.norm()).item()
    return float((rx @ ry).item() / den) if den > 0 else float("nan")


def _ranks(x: Tensor) -> Tensor:
    """Ranks 0..n-1, ties given their average rank."""
    order = x.argsort(stable=True)
    ranks = torch.empty_like(x)
    ranks[order] = torch.arange(x.numel(), dtype=x.dtype)
    uniq, inv = torch.unique(x, return_inverse=True)
    if uniq.numel() < x.numel():
        sums = torch.zeros(uniq.numel(), dtype=x.dtype).index_add_(0, inv, ranks)
        counts = torch.zeros(uniq.numel(), dtype=x.dtype).index_add_(0, inv, torch.ones_like(x))
        ranks = (sums / counts)[inv]
    return ranks


def attention_patterns(model: Model, tokens: Int[Tensor, " pos"], n_layers: int) -> Float[Tensor, "layer head_index query_pos key_pos"]:
    """The attention patterns of the first `n_layers` layers on one sequence."""
    names = [act_name("pattern", l) for l in range(n_layers)]
    _, cache = cached_run(model, tokens[None], names, stop_at_layer=n_layers)
    return torch.stack([cache[n][0] for n in names])


def mixing_matrices(patterns: Float[Tensor, "layer head_index query_pos key_pos"]) -> Float[Tensor, "layer query_pos key_pos"]:
    """M^(l) = (sum_h A^(l,h) + I) / (n_heads + 1): row j says how layer l mixes into j."""
    H, T = patterns.shape[1], patterns.shape[-1]
    return (patterns.sum(1) + torch.eye(T, dtype=patterns.dtype, device=patterns.device)) / (H + 1)


def path_weights(patterns: Float[Tensor, "layer head_index query_pos key_pos"]) -> Float[Tensor, "query_pos key_pos"]:
    """Sum over all paths i -> j through the layers of the products of mixing
    weights: M^(L-1) @ ... @ M^(0), entry [j, i]."""
    mix = mixing_matrices(patterns)
    out = torch.eye(mix.shape[-1], dtype=mix.dtype, device=mix.device)
    for m in mix:
        out = m @ out
    return out


@dataclass(frozen=True)
class Sensitivity(Result):
    """Jacobian norms and path weights side by side for one sequence, [j, i]."""

    jacobian: Float[Tensor, "query_pos key_pos"]
    path_weight: Float[Tensor, "query_pos key_pos"]
    bos: Bos
    n_layers: int

    def to_dataframe(self):
        import pandas as pd

        T = self.jacobian.shape[0]
        j, i = torch.tril_indices(T, T)
        return pd.DataFrame({"bos": self.bos, "out_pos": j.numpy(), "in_pos": i.numpy(),
                             "jacobian": self.jacobian[j, i].numpy(), "path_weight": self.path_weight[j, i].numpy()})

    def rank_correlation(self, *, exclude_self: bool = False) -> float:
        """Spearman correlation of Jacobian norm and path weight over the causal
        pairs i <= j (`exclude_self`: only i < j)."""
        T = self.jacobian.shape[0]
        j, i = torch.tril_indices(T, T, offset=-1 if exclude_self else 0)
        return spearman(self.jacobian[j, i], self.path_weight[j, i])

    def to_dict(self) -> dict:
        return {"bos": self.bos, "n_layers": self.n_layers, "jacobian": self.jacobian.tolist(),
                "path_weight": self.path_weight.tolist(), "spearman": self.rank_correlation()}


def sensitivity(
    model: Model,
    tokens: PromptSource | TokenBatch,
    *,
    bos: Bos | None = None,
    max_tokens: int | None = None,
    n_layers: int | None = None,
    options: RunOptions = RunOptions(),
) -> Sensitivity:
    """Jacobian norms (autograd) and path weights (attention patterns) for the
    first prompt of `tokens` (a TokenBatch, or prompts tokenized with `bos`, cut
    to `max_tokens` content tokens: keep it short, the Jacobian has
    (T d_model)^2 entries)."""
    L = _check_layers(model, n_layers)
    if max_tokens is None and not isinstance(tokens, TokenBatch):  # a TokenBatch is checked only when given
        max_tokens = 16
    batch = as_batch(model, tokens, bos=bos, max_tokens=max_tokens, bos_token_id=options.bos_token_id)
    tokens = batch.tokens[0, : int(batch.lengths[0])]
    jac = jacobian_norms(model, tokens, n_layers=L)
    paths = path_weights(attention_patterns(model, tokens, L))
    return Sensitivity(jac.float().cpu(), paths.float().cpu(), batch.bos, L)


def rank_collapse(
    model: Model,
    tokens: PromptSource | TokenBatch,
    *,
    bos: Bos | None = None,
    max_tokens: int | None = None,
    exclude_first: bool = True,
    options: RunOptions = RunOptions(),
) -> Float[Tensor, "prompt resid_layer"]:
    """||X - 1 mean(X)||_F / ||X||_F over each prompt's real token vectors at
    every layer (0 = embeddings, n_layers = last output); 0 = fully collapsed.

    Args:
        tokens: a TokenBatch, or prompts tokenized with `bos` (then required).
        exclude_first: leave position 0 (the sink: `<bos>`, or the first
            content token without it) out of X. Its residual norm is ~100x the
            others', so with it X - 1 mean(X) is dominated by that one row and
            the ratio stays ~1 whatever the other tokens do. False gives the
            measure over all tokens (reported beside it, not instead).
    """
    if max_tokens is None and not isinstance(tokens, TokenBatch):  # a TokenBatch is checked only when given
        max_tokens = 64
    batch = as_batch(model, tokens, bos=bos, max_tokens=max_tokens, bos_token_id=options.bos_token_id)
    mask = batch.mask.clone()
    if exclude_first:
        mask[:, 0] = False
        if int(mask.sum(1).min()) < 1:
            raise ValueError("exclude_first leaves a prompt with no token: give prompts of at least 2 tokens")
    return collapse_ratio(residual_stack(model, batch.tokens), mask).cpu()


def collapse_ratio(h: Float[Tensor, "batch resid_layer pos d_model"],
                   mask: Tensor) -> Float[Tensor, "batch resid_layer"]:
    """Rank collapse, the one definition: ||X - 1 mean(X)||_F / ||X||_F over the
    token vectors X of each prompt and layer that `mask` [batch pos] keeps (float32)."""
    h = h.float()
    w = mask.to(h.device).float()[:, None, :, None]
    mean = (h * w).sum(2, keepdim=True) / w.sum(2, keepdim=True)
    return ((h - mean) * w).pow(2).sum((2, 3)).sqrt() / (h * w).pow(2).sum((2, 3)).sqrt()


def representational_collapse(
    model: Model,
    *,
    token: int,
    lengths: Sequence[int],
    bos: Bos,
    options: RunOptions = RunOptions(),
) -> Float[Tensor, "length resid_layer"]:
    """||h_last(n tokens) - h_last(n + 1 tokens)|| for `token` repeated n times,
    per n in `lengths` and per layer (0 = embeddings, n_layers = last output).

    A degenerate setting: without `<bos>` a rotary model gives exactly 0 at
    every length (identical tokens, identical values). The paper's measure is
    `repeat_collapse` (a real prefix, its last token repeated)."""
    check_bos(bos)
    if not 0 <= token < model.cfg.d_vocab:
        raise ValueError(f"token {token} out of range [0, {model.cfg.d_vocab})")
    if not lengths or min(lengths) < 1:
        raise ValueError(f"lengths must be positive, got {list(lengths)}")
    out = []
    for n in lengths:
        seqs = [[token] * n, [token] * (n + 1)]
        batch = tokenize(model, seqs, bos=bos, max_tokens=n + 1, bos_token_id=options.bos_token_id, min_tokens=1)
        h = residual_stack(model, batch.tokens)
        last = batch.lengths - 1
        out.append((h[0, :, last[0]] - h[1, :, last[1]]).norm(dim=-1).float().cpu())
    return torch.stack(out)


def repeat_collapse(
    model: Model,
    tokens: PromptSource | TokenBatch,
    *,
    repeats: Sequence[int],
    bos: Bos | None = None,
    max_tokens: int | None = None,
    options: RunOptions = RunOptions(),
) -> Float[Tensor, "prompt repeat resid_layer"]:
    """Representational collapse in the paper's setting: each prompt's content
    tokens are a prefix whose last token t is repeated k more times;
    ||h_last(prefix + t*k) - h_last(prefix + t*(k+1))|| per prompt, k in
    `repeats` and layer (0 = embeddings, n_layers = last output). It shrinks
    toward 0 as k grows if representations collapse.

    Args:
        tokens: prompts tokenized with `bos` (cut to `max_tokens` content
            tokens), or a TokenBatch whose content tokens are the prefixes.
        repeats: the k values (>= 0; k = 0 compares the prefix with one repeat).

    Returns:
        [prompt, repeat, resid_layer].
    """
    if not repeats or min(repeats) < 0:
        raise ValueError(f"repeats must be >= 0, got {list(repeats)}")
    if max_tokens is None and not isinstance(tokens, TokenBatch):  # a TokenBatch is checked only when given
        max_tokens = 32
    batch = as_batch(model, tokens, bos=bos, max_tokens=max_tokens, bos_token_id=options.bos_token_id)
    prefixes = batch.content()
    bos_id = batch.bos_token_id if batch.bos == "prepend" else None
    longest = max(map(len, prefixes)) + max(repeats) + 1
    out = []
    for k in repeats:
        seqs = [p + [p[-1]] * k for p in prefixes] + [p + [p[-1]] * (k + 1) for p in prefixes]
        b = tokenize(model, seqs, bos=batch.bos, max_tokens=longest, bos_token_id=bos_id, min_tokens=1)
        h = residual_stack(model, b.tokens)  # [2P, resid_layer, pos, d_model]
        last = (b.lengths - 1).to(h.device)
        h_last = h[torch.arange(len(seqs), device=h.device), :, last]  # [2P, resid_layer, d_model]
        P = len(prefixes)
        out.append((h_last[:P] - h_last[P:]).norm(dim=-1).float().cpu())
    return torch.stack(out, 1)


@dataclass(frozen=True)
class SensitivityStudy(Result):
    """The path bound tested on a few prompts, with and without `<bos>`.

    `spearman[c, p]`: Spearman correlation, over the causal pairs i <= j of
    prompt p in condition `conditions[c]`, between ||d h_j^(L) / d h_i^(0)||
    and the path weight; `spearman_off_diagonal` the same over i < j only
    (the residual's own i = j term dominates both sides). `rank_collapse`
    [c, p, resid_layer] without the sink position, `rank_collapse_all` with it.
    """

    spearman: Float[Tensor, "bos prompt"]
    spearman_off_diagonal: Float[Tensor, "bos prompt"]
    rank_collapse: Float[Tensor, "bos prompt resid_layer"]
    rank_collapse_all: Float[Tensor, "bos prompt resid_layer"]
    conditions: tuple[str, ...]
    max_tokens: int
    n_layers: int

    def to_dataframe(self):
        """Long format: one row per (bos, prompt, resid_layer); the Spearman
        correlations repeat along resid_layer."""
        import pandas as pd

        C, P, R = self.rank_collapse.shape
        c, p, r = (g.flatten().numpy() for g in torch.meshgrid(torch.arange(C), torch.arange(P), torch.arange(R), indexing="ij"))
        return pd.DataFrame({
            "bos": [self.conditions[i] for i in c], "prompt": p, "resid_layer": r,
            "spearman": self.spearman[c, p].numpy(), "spearman_off_diagonal": self.spearman_off_diagonal[c, p].numpy(),
            "rank_collapse": self.rank_collapse[c, p, r].numpy(), "rank_collapse_all": self.rank_collapse_all[c, p, r].numpy(),
        })

    def to_dict(self) -> dict:
        per = lambda t: {c: t[i].tolist() for i, c in enumerate(self.conditions)}  # noqa: E731
        mean = lambda t: {c: float(t[i].nanmean()) for i, c in enumerate(self.conditions)}  # noqa: E731
        return {
            "max_tokens": self.max_tokens, "n_layers": self.n_layers, "n_prompts": self.spearman.shape[1],
            "spearman_mean": mean(self.spearman), "spearman": per(self.spearman),
            "spearman_off_diagonal_mean": mean(self.spearman_off_diagonal),
            "spearman_off_diagonal": per(self.spearman_off_diagonal),
            "rank_collapse_without_first": per(self.rank_collapse.mean(1)),
            "rank_collapse_with_first": per(self.rank_collapse_all.mean(1)),
        }


def sensitivity_study(
    model: Model,
    tokens: PromptSource,
    *,
    max_tokens: int = 16,
    n_layers: int | None = None,
    chunk_size: int = 64,
    options: RunOptions = RunOptions(),
) -> SensitivityStudy:
    """Jacobian norms vs path weights (rank correlation) and rank collapse for
    every prompt of `tokens`, cut to `max_tokens` content tokens (keep both
    small: one Jacobian per prompt and condition), with and without `<bos>`.
    `chunk_size`: backward passes vmapped at once; memory grows with it. `options`:
    a progress bar, and the `<bos>` id for a model whose tokenizer lacks one."""
    L = _check_layers(model, n_layers)
    plain = tokenize(model, tokens, bos="none", max_tokens=max_tokens, bos_token_id=options.bos_token_id)
    rows = plain.content()
    rho = torch.full((len(CONDITIONS), len(rows)), float("nan"))
    rho_off = rho.clone()
    rc, rc_all = [], []
    steps = [(c, p) for c in range(len(CONDITIONS)) for p in range(len(rows))]
    for c, p in tqdm(steps, desc="sensitivity", disable=not options.progress, unit="prompt"):
        batch = tokenize(model, [rows[p]], bos=CONDITIONS[c], max_tokens=max_tokens, bos_token_id=options.bos_token_id)
        seq = batch.tokens[0, : int(batch.lengths[0])]
        s = Sensitivity(jacobian_norms(model, seq, n_layers=L, chunk_size=chunk_size).float().cpu(),
                        path_weights(attention_patterns(model, seq, L)).float().cpu(), batch.bos, L)
        rho[c, p], rho_off[c, p] = s.rank_correlation(), s.rank_correlation(exclude_self=True)
    for bos in CONDITIONS:
        batch = tokenize(model, rows, bos=bos, max_tokens=max_tokens, bos_token_id=options.bos_token_id)
        rc.append(rank_collapse(model, batch))
        rc_all.append(rank_collapse(model, batch, exclude_first=False))
    return SensitivityStudy(rho, rho_off, torch.stack(rc), torch.stack(rc_all), CONDITIONS, max_tokens, L)
