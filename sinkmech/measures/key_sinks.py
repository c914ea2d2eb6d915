"""Sink scores at every key position: secondary sinks.

Gu et al. 2025 ("When attention sink emerges", Sec. 3) define the score of key
k as alpha_k = mean over query positions t >= k of A[t, k]; Barbero et al. 2025
use only alpha_0. Here every key is scored, to find heads whose strongest key
is not the first token (a delimiter, a newline, a repeated token).

Guard: the last keys of a prompt have few queries after them (the last one has
a single query, so its alpha is one attention weight, often large). A key k of
a prompt of length n is scored only when n - k >= `min_queries`; key 0 always
is. Two aggregates, both streamed (reduced inside the pattern hook; memory is
flat in the number of prompts):
  - per head, the top (prompt, key position) entries by alpha_k over all
    prompts: these carry the prompt's token text;
  - per head, alpha_k averaged over the prompts that score key k (`by_position`);
    a head is *flagged* when the argmax of this average is not position 0.

Against the uniform share: a query t that spreads its attention evenly gives
each of its t + 1 keys 1/(t + 1), so under uniform attention key k of a prompt
of length n still gets u_k = mean over t in [k, n) of 1/(t + 1): the earliest
keys get the most (u_0 = H_n / n), and the raw argmax calls uniform attention a
first-token sink. The relative scores compare each key with its own share:
`excess` = alpha_k - u_k (0 under uniform attention, at most 1 - u_k) and
`ratio` = alpha_k / u_k (1 under uniform attention), both averaged over the
same prompts as `by_position`. A head has a *relative* sink at the key of
largest excess when that excess exceeds `min_excess`; it is
`relative_flagged` when that key is not position 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from sinkmech.loading.backend import Model
from sinkmech.hooks import act_name
from sinkmech.prompts import Bos, TokenBatch, token_text
from sinkmech.results import Result
from sinkmech.options import RunOptions
from sinkmech.readers import Reader


@dataclass(frozen=True)
class KeySinks(Result):
    """Per-head scores of every key position for one `<bos>` condition."""

    top_scores: Float[Tensor, "layer head_index k"]
    top_prompt: Int[Tensor, "layer head_index k"]
    top_position: Int[Tensor, "layer head_index k"]
    top_token_id: Int[Tensor, "layer head_index k"]
    top_token: tuple[tuple[tuple[str, ...], ...], ...]  # [layer][head][k]
    by_position: Float[Tensor, "layer head_index key_pos"]  # NaN where no prompt scores the key
    n_scored: Int[Tensor, " key_pos"]  # prompts scoring each key position
    off_first_rate: Float[Tensor, "layer head_index"]  # share of prompts whose strongest key is not 0
    bos: Bos
    min_queries: int
    n_prompts: int
    model_name: str = ""
    # the uniform share u_k averaged over the prompts scoring key k (NaN where none does)
    uniform_by_position: Float[Tensor, " key_pos"] | None = None
    # share of prompts whose key of largest excess (> min_excess) is not position 0
    off_first_rate_relative: Float[Tensor, "layer head_index"] | None = None
    min_excess: float = 0.1

    @property
    def excess_by_position(self) -> Float[Tensor, "layer head_index key_pos"]:
        """alpha_k - u_k averaged over the prompts scoring key k: 0 under uniform attention."""
        return self.by_position - self.uniform_by_position

    @property
    def ratio_by_position(self) -> Float[Tensor, "layer head_index key_pos"]:
        """alpha_k / u_k (prompt-averaged numerator and denominator): 1 under uniform attention."""
        return self.by_position / self.uniform_by_position

    @property
    def max_excess(self) -> Float[Tensor, "layer head_index"]:
        """The largest excess over the uniform share, over key positions."""
        return torch.nan_to_num(self.excess_by_position, nan=float("-inf")).amax(-1)

    @property
    def strongest_relative_position(self) -> Int[Tensor, "layer head_index"]:
        """Argmax over key positions of the excess over the uniform share."""
        return torch.nan_to_num(self.excess_by_position, nan=float("-inf")).argmax(-1)

    @property
    def relative_flagged(self) -> torch.Tensor:
        """Bool [layer, head_index]: the key of largest excess is not position 0 and
        its excess exceeds `min_excess`."""
        return (self.strongest_relative_position != 0) & (self.max_excess > self.min_excess)

    def relative_flagged_heads(self) -> list[tuple[int, int, int]]:
        """(layer, head, key of largest excess) of every relatively flagged head."""
        pos = self.strongest_relative_position
        return [(int(l), int(h), int(pos[l, h])) for l, h in self.relative_flagged.nonzero().tolist()]

    @property
    def strongest_position(self) -> Int[Tensor, "layer head_index"]:
        """Argmax over key positions of the prompt-averaged alpha_k."""
        return torch.nan_to_num(self.by_position, nan=-1.0).argmax(-1)

    @property
    def flagged(self) -> torch.Tensor:
        """Bool [layer, head_index]: the strongest key (on average) is not position 0."""
        return self.strongest_position != 0

    def flagged_heads(self) -> list[tuple[int, int, int]]:
        """(layer, head, strongest position) of every flagged head."""
        pos = self.strongest_position
        return [(int(l), int(h), int(pos[l, h])) for l, h in self.flagged.nonzero().tolist()]

    def to_dataframe(self):
        """Long format: one row per (layer, head, rank) of the top keys."""
        import pandas as pd

        L, H, K = self.top_scores.shape
        rows = []
        for l in range(L):
            for h in range(H):
                for r in range(K):
                    rows.append(
                        {
                            "bos": self.bos, "layer": l, "head": h, "rank": r,
                            "prompt": int(self.top_prompt[l, h, r]),
                            "position": int(self.top_position[l, h, r]),
                            "token": self.top_token[l][h][r],
                            "score": float(self.top_scores[l, h, r]),
                            "flagged": bool(self.flagged[l, h]),
                        }
                    )
        return pd.DataFrame(rows)

    def to_dict(self) -> dict:
        """JSON-ready: `key_scores[layer][head]` is a list of
        {"prompt", "position", "token", "score"} for the top keys."""
        L, H, K = self.top_scores.shape
        key_scores = [
            [
                [
                    {
                        "prompt": int(self.top_prompt[l, h, r]),
                        "position": int(self.top_position[l, h, r]),
                        "token": self.top_token[l][h][r],
                        "score": float(self.top_scores[l, h, r]),
                    }
                    for r in range(K)
                    if torch.isfinite(self.top_scores[l, h, r])  # fewer scored keys than top_k
                ]
                for h in range(H)
            ]
            for l in range(L)
        ]
        by_pos = torch.nan_to_num(self.by_position, nan=0.0)
        return {
            "model": self.model_name,
            "bos": self.bos,
            "min_queries": self.min_queries,
            "n_prompts": self.n_prompts,
            "key_scores": key_scores,
            "by_position": by_pos.tolist(),
            "n_scored": self.n_scored.tolist(),
            "strongest_position": self.strongest_position.tolist(),
            "off_first_rate": self.off_first_rate.tolist(),
            "flagged": [list(x) for x in self.flagged_heads()],
            # against each key's uniform share (None where no prompt scores the key)
            "min_excess": self.min_excess,
            "uniform_by_position": _none_for_nan(self.uniform_by_position),
            "excess_by_position": _none_for_nan(self.excess_by_position),
            "ratio_by_position": _none_for_nan(self.ratio_by_position),
            "max_excess": self.max_excess.tolist(),
            "strongest_relative_position": self.strongest_relative_position.tolist(),
            "off_first_rate_relative": self.off_first_rate_relative.tolist(),
            "relative_flagged": [list(x) for x in self.relative_flagged_heads()],
        }


def _none_for_nan(x: Tensor):
    """`x.tolist()` with None where x is NaN (JSON null; equal to itself, unlike NaN)."""
    def walk(v):
        return [walk(u) for u in v] if isinstance(v, list) else (None if v != v else v)

    return walk(x.tolist())


def key_alpha(
    pattern: Float[Tensor, "batch head_index query_pos key_pos"],
    lengths: Int[Tensor, " batch"],
    min_queries: int,
) -> Float[Tensor, "batch head_index key_pos"]:
    """alpha_k per (prompt, head, key): mean of A[t, k] over real queries t >= k;
    NaN where the key is padding or has fewer than `min_queries` queries."""
    T = pattern.shape[-1]
    pos = torch.arange(T, device=pattern.device)
    valid_q = (pos[None, :] < lengths[:, None]).to(pattern.dtype)  # [batch, query]
    total = torch.einsum("bhqk,bq->bhk", pattern, valid_q)  # causal: A[t, k] = 0 for t < k
    n_q = (lengths[:, None] - pos[None, :]).clamp(min=1)  # [batch, key]
    alpha = total.float() / n_q[:, None, :].float()
    ok = ((lengths[:, None] - pos[None, :]) >= min_queries) | (pos[None, :] == 0)
    ok &= pos[None, :] < lengths[:, None]
    return alpha.masked_fill(~ok[:, None, :], float("nan"))


def uniform_share(lengths: Int[Tensor, " batch"], T: int, min_queries: int) -> Float[Tensor, "batch key_pos"]:
    """u_k per (prompt, key): alpha_k of uniform attention (query t gives each of
    its t + 1 keys 1/(t + 1)), i.e. mean over real queries t >= k of 1/(t + 1);
    NaN where `key_alpha` is NaN."""
    pos = torch.arange(T, device=lengths.device)
    share = (1.0 / (pos + 1).double())[None, :] * (pos[None, :] < lengths[:, None])  # [batch, query]
    after = share.flip(-1).cumsum(-1).flip(-1)  # sum over queries t >= k
    n_q = (lengths[:, None] - pos[None, :]).clamp(min=1)
    u = (after / n_q).float()
    ok = (((lengths[:, None] - pos[None, :]) >= min_queries) | (pos[None, :] == 0)) & (pos[None, :] < lengths[:, None])
    return u.masked_fill(~ok, float("nan"))


def key_sink_scores(
    model: Model,
    batch: TokenBatch,
    *,
    top_k: int = 5,
    min_queries: int = 8,
    min_excess: float = 0.1,
    options: RunOptions = RunOptions(),
    reader: Reader | None = None,
) -> KeySinks:
    """Score every key position of every head, streamed.

    Args:
        model: a HookedTransformer or a TransformerBridge (`sinkmech.loading.backend`).
        batch: right-padded tokens (one `<bos>` condition).
        top_k: (prompt, position) entries kept per head.
        min_queries: a key k of a prompt of length n is scored only when
            n - k >= min_queries (key 0 always is).
        min_excess: a head's key of largest excess over its uniform share is a
            relative sink only above this (attention share, in [0, 1)).
        options: batch size (default 16 prompts per forward pass), progress bar.
        reader: `key_sink_reader(model, batch, ...)` at these settings, filled by
            another pass it rode (`sinkmech.readers`); then no pass of its own runs.

    Returns:
        KeySinks: top keys [layer, head_index, k], prompt-averaged alpha by
        key position [layer, head_index, key_pos] and the uniform share by key
        position [key_pos], flagged heads (raw and relative).
    """
    settings = dict(top_k=top_k, min_queries=min_queries, min_excess=min_excess)
    reader = key_sink_reader(model, batch, **settings) if reader is None else reader.filled(batch, **settings)
    rows, sums = reader.read(model, options)
    return key_sinks_from_sums(rows, sums, top_k=top_k, min_queries=min_queries, min_excess=min_excess,
                               bos=batch.bos, model_name=model.cfg.model_name, decode=token_text(model))


def key_sink_sums(
    model: Model,
    batch: TokenBatch,
    *,
    top_k: int = 5,
    min_queries: int = 8,
    min_excess: float = 0.1,
    options: RunOptions = RunOptions(),
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """What `key_sink_scores` aggregates, in a form that adds over shards of the
    prompts: per prompt, each head's top_k keys (the corpus' top keys are among
    them); float64 sums over prompts of alpha_k and of the uniform share u_k by
    key position, of the scored prompts per position, of the prompts whose
    strongest key is not 0 and of those whose key of largest excess over u_k
    (> `min_excess`) is not 0.

    Returns:
        rows: "top_scores" [prompt, layer, head_index, k] (-inf past the
        prompt's scored keys), "top_position", "top_token_id" (int64, same
        axes); sums: "by_position_sum" [layer, head_index, key_pos],
        "uniform_sum" [key_pos], "n_scored" [key_pos], "off_first" and
        "off_first_relative" [layer, head_index], float64.
    """
    return key_sink_reader(model, batch, top_k=top_k, min_queries=min_queries, min_excess=min_excess).read(
        model, options)


def key_sink_reader(model: Model, batch: TokenBatch, *, top_k: int = 5, min_queries: int = 8,
                    min_excess: float = 0.1) -> Reader:
    """What `key_sink_sums` reads from each chunk of its passes (`sinkmech.readers`)."""
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if min_queries < 1:
        raise ValueError(f"min_queries must be >= 1, got {min_queries}")
    if not 0.0 <= min_excess < 1.0:
        raise ValueError(f"min_excess must lie in [0, 1), got {min_excess}")
    cfg = model.cfg
    P, L, H, T = len(batch), cfg.n_layers, cfg.n_heads, batch.tokens.shape[1]
    top_v = torch.full((P, L, H, top_k), float("-inf"))
    top_pos = torch.zeros(P, L, H, top_k, dtype=torch.long)
    pos_sum = torch.zeros(L, H, T, dtype=torch.float64)
    pos_cnt = torch.zeros(T, dtype=torch.float64)
    off_first = torch.zeros(L, H, dtype=torch.float64)
    off_first_rel = torch.zeros(L, H, dtype=torch.float64)
    unif_sum = torch.zeros(T, dtype=torch.float64)

    def hooks(rows: slice, part: TokenBatch) -> list:
        t = part.tokens.shape[1]
        lengths = part.lengths
        unif = uniform_share(lengths.cpu(), t, min_queries)  # [b, t]
        unif_sum[:t] += torch.nan_to_num(unif.double(), nan=0.0).sum(0)

        def hook(pattern, hook):
            l = hook.layer()
            alpha = key_alpha(pattern, lengths, min_queries).cpu()  # [b, H, t]
            pos_sum[l, :, :t] += torch.nan_to_num(alpha, nan=0.0).double().sum(0)
            off_first[l] += (torch.nan_to_num(alpha, nan=-1.0).argmax(-1) != 0).double().sum(0)
            best, where = torch.nan_to_num(alpha - unif[:, None, :], nan=float("-inf")).max(-1)  # [b, H]
            off_first_rel[l] += ((where != 0) & (best > min_excess)).double().sum(0)
            k = min(top_k, t)
            v, j = torch.nan_to_num(alpha, nan=float("-inf")).topk(k, dim=-1)  # [b, H, k]
            top_v[rows, l, :, :k], top_pos[rows, l, :, :k] = v, j
            if l == 0:
                pos_cnt[:t] += (~torch.isnan(alpha[:, 0])).double().sum(0)

        return [(act_name("pattern", l), hook) for l in range(L)]

    def finish() -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        ids = batch.tokens.cpu().gather(1, top_pos.reshape(P, -1)).reshape(top_pos.shape)
        return ({"top_scores": top_v, "top_position": top_pos, "top_token_id": ids},
                {"by_position_sum": pos_sum, "uniform_sum": unif_sum, "n_scored": pos_cnt, "off_first": off_first,
                 "off_first_relative": off_first_rel})

    return Reader(batch, hooks, finish, desc=f"key sinks (bos={batch.bos})",
                  settings=dict(top_k=top_k, min_queries=min_queries, min_excess=min_excess))


def key_sinks_from_sums(
    rows: dict[str, Tensor],
    sums: dict[str, Tensor],
    *,
    top_k: int,
    min_queries: int,
    min_excess: float = 0.1,
    bos: Bos,
    model_name: str = "",
    decode: Callable[[int], str],
) -> KeySinks:
    """`KeySinks` from `key_sink_sums` (of one pass, or of merged shards: the
    rows of every prompt in corpus order, the sums added). `decode` gives a
    token id's text."""
    top_v = rows["top_scores"]
    P, L, H, K = top_v.shape
    # every prompt's top keys, prompt by prompt: the corpus' top_k among them
    cand_v = top_v.permute(1, 2, 0, 3).reshape(L, H, P * K)
    v, j = cand_v.topk(min(top_k, P * K), dim=-1)
    prompt = j // K

    def pick(name: str) -> Tensor:
        return rows[name].permute(1, 2, 0, 3).reshape(L, H, P * K).gather(-1, j)

    ids = pick("top_token_id")
    top_token = tuple(tuple(tuple(decode(int(i)) for i in row) for row in layer) for layer in ids)
    pos_cnt = sums["n_scored"]
    by_position = (sums["by_position_sum"] / pos_cnt.clamp(min=1)).float()
    by_position[:, :, pos_cnt == 0] = float("nan")
    uniform_by_position = (sums["uniform_sum"] / pos_cnt.clamp(min=1)).float()
    uniform_by_position[pos_cnt == 0] = float("nan")
    return KeySinks(
        top_scores=v, top_prompt=prompt, top_position=pick("top_position"), top_token_id=ids, top_token=top_token,
        by_position=by_position, n_scored=pos_cnt.long(), off_first_rate=(sums["off_first"] / P).float(),
        bos=bos, min_queries=min_queries, n_prompts=P, model_name=model_name,
        uniform_by_position=uniform_by_position, off_first_rate_relative=(sums["off_first_relative"] / P).float(),
        min_excess=min_excess,
    )
