"""Sink scores without the T x T pattern: the fused path.

A row of the attention pattern is softmax(s_t), so the attention of query t on
key j is exp(s_tj - lse_t), with lse_t the log-sum-exp of the row's scores
(its learned sink logit included, where the model has one). A fused kernel
(PyTorch's CPU flash attention, CUDA's memory-efficient attention) returns the
head's output and lse_t without ever holding the pattern; the attention on a
chosen key (key 0 for alpha_0, Gu et al. 2025; the moved `<bos>`) is then one
dot product per query, and the learned sink's share exp(sink - lse_t). Memory
is O(T) per head. Where the kernel cannot take the model's attention
(soft-capped scores, sliding windows) the same quantities come from query
chunks: a chunk of rows at a time against the keys it can see.

`fused_attention` is a transformers attention function (registered under
`FUSED`): a model whose attention runs through transformers' interface runs
its own projections, QK-norm and rotary embeddings, and hands it the queries,
keys and values with its soft-cap, window and sink logits. It records what the
sink measures need into the active `Recorder`. A whole forward pass of a
sinkmech model on either backend is `sinkmech.measures.columns`.

Imports only torch and jaxtyping (transformers when registering), so
scripts/bench_long.py runs it where sinkmech's other dependencies are absent.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

import torch
from jaxtyping import Float
from torch import Tensor

Attention = Literal["fused", "pattern", "auto"]
ATTENTION_MODES = ("fused", "pattern", "auto")
# `auto`: the fused path from this many positions (<bos> included) on. Below it
# the pattern's memory is small and the pattern path is as fast
# (scripts/bench_long.py; docs/benchmarks.md).
FUSED_FROM = 512
CHUNK = 512  # query rows per step where the kernel cannot be used (a chunk x T block at most)
CUDA_CHUNK = 4096  # on a GPU: fewer, larger steps (each one a few kernel launches)
FUSED = "sinkmech_fused"  # the name transformers' attention interface knows `fused_attention` by


def check_attention(attention: str) -> Attention:
    """`attention` as one of ATTENTION_MODES, or a ValueError naming them."""
    if attention not in ATTENTION_MODES:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION_MODES)}, got {attention!r}")
    return attention  # type: ignore[return-value]


def resolve_attention(attention: str, n_positions: int) -> Literal["fused", "pattern"]:
    """"fused" or "pattern" for a pass over `n_positions` positions (`auto`:
    fused from FUSED_FROM positions on)."""
    attention = check_attention(attention)
    if attention == "auto":
        return "fused" if n_positions >= FUSED_FROM else "pattern"
    return attention


# The kernel


def attend(
    q: Float[Tensor, "batch head_index query_pos d_head"],
    k: Float[Tensor, "batch head_index key_pos d_head"],
    v: Float[Tensor, "batch head_index key_pos d_head"],
    *,
    scaling: float,
    softcap: float | None = None,
    window: int | None = None,
    sinks: Float[Tensor, " head_index"] | None = None,
    chunk: int | None = None,
    stream: tuple[int, int] | None = None,
) -> tuple[Float[Tensor, "batch head_index query_pos d_head"], Float[Tensor, "batch head_index query_pos"]]:
    """Causal attention of every query on keys 0 .. t (each key head already
    repeated to its query heads), without the pattern.

    Args:
        scaling: what the scores q . k are multiplied by.
        softcap: scores become softcap * tanh(scores / softcap) (Gemma 2).
        window: query t sees keys j with t - j < window (transformers' sliding window).
        sinks: a learned logit per head that joins every row's softmax with no value (gpt-oss).
        chunk: query rows per step where the fused kernel cannot be used (default `CHUNK`).
        stream: (W, keep): StreamingLLM's restriction on top of the model's own
            (Xiao et al. 2024): query t also sees only keys t - W < j <= t and
            the first `keep` keys (`sinkmech.context.stream.window_mask`).

    Returns:
        The head outputs (q's dtype) and each row's log-sum-exp in float32:
        the attention on key j is exp(s_tj - lse_t), the learned sink's
        share exp(sink - lse_t).
    """
    chunk = chunk or CHUNK
    sees = Sees(window, *(stream or (None, 0)))
    if softcap is None and sees == Sees():
        found = _fused_kernel(q, k, v, scaling)
        out, lse = found if found is not None else _chunked(q, k, v, scaling, None, sees, chunk)
    else:
        out, lse = _chunked(q, k, v, scaling, softcap, sees, chunk)
    if sinks is not None:  # the sink's column joins the softmax: every real weight shrinks by exp(lse - total)
        total = torch.logaddexp(lse, sinks.detach().float().to(lse.device)[None, :, None])
        out = out * torch.exp(lse - total)[..., None].to(out.dtype)
        lse = total
    return out, lse


def _fused_kernel(q: Tensor, k: Tensor, v: Tensor, scaling: float) -> tuple[Tensor, Tensor] | None:
    """(output, log-sum-exp) from PyTorch's fused causal attention, or None where
    no kernel that returns the log-sum-exp takes these inputs."""
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, scale=scaling)
        return out, lse.float()
    if q.device.type == "cuda":
        try:
            found = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, True,
                                                                          scale=scaling)
        except (RuntimeError, TypeError):  # a head size or dtype (or a signature) the kernel does not take
            return None
        return found[0], found[1][..., : q.shape[-2]].float()
    return None


def _chunked(q: Tensor, k: Tensor, v: Tensor, scaling: float, softcap: float | None, sees: Sees,
             chunk: int) -> tuple[Tensor, Tensor]:
    """The same as the fused kernel, a chunk of query rows at a time against
    the keys they can see (with a window: the first keys kept and the last
    chunk + window): through the fused kernel with the chunk's mask where it
    takes one, else the eager attention's own steps in float32 from the scores on."""
    n_pos = q.shape[-2]
    if q.device.type == "cuda":
        chunk = max(chunk, CUDA_CHUNK)
    elif sees.span is not None:  # a chunk computes chunk x (chunk + window) scores for chunk x window useful ones
        chunk = min(chunk, max(sees.span // 2, 64))
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    for a in range(0, n_pos, chunk):
        b = min(n_pos, a + chunk)
        keys = sees.keys(a, b)
        first, contiguous = int(keys[0]), len(keys) == b - int(keys[0])
        keys = keys.to(q.device)
        seen = visible(torch.arange(a, b, device=q.device), keys, sees)  # built where it is used
        kk, vv = (x[..., first:b, :] if contiguous else x[..., keys, :] for x in (k, v))
        if softcap is None and q.device.type == "cpu":
            bias = torch.zeros(seen.shape, dtype=q.dtype, device=q.device).masked_fill(~seen, float("-inf"))
            o, l = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q[..., a:b, :], kk, vv, 0.0, False, attn_mask=bias, scale=scaling)
            out[..., a:b, :], lse[..., a:b] = o, l.float()
            continue
        scores = key_scores(q[..., a:b, :], kk, scaling, softcap).masked_fill(~seen, float("-inf"))
        lse[..., a:b] = scores.logsumexp(-1)
        weights = torch.exp(scores - lse[..., a:b, None])
        out[..., a:b, :] = weights.to(v.dtype) @ vv
    return out, lse


def key_scores(q: Tensor, k: Tensor, scaling: float, softcap: float | None) -> Tensor:
    """The attention scores of queries `q` on keys `k` [... query key], float32,
    soft-capped where the model caps them."""
    scores = (q @ k.transpose(-1, -2)).float() * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    return scores


@dataclass(frozen=True)
class Sees:
    """Which keys query t sees: j <= t, within the model's own sliding window
    (t - j < window), and under StreamingLLM's restriction within its window
    (t - j < stream) or among the first `keep` keys."""

    window: int | None = None
    stream: int | None = None
    keep: int = 0

    @property
    def span(self) -> int | None:
        """The widest gap t - j a query sees, the first keys apart (None: all of them)."""
        spans = [w for w in (self.window, self.stream) if w is not None]
        return min(spans) if spans else None

    def keys(self, a: int, b: int) -> Tensor:
        """The keys some query of a .. b-1 can see: the first `keep` (when a
        stream window keeps them) and the last b - a + span - 1."""
        lo = 0 if self.span is None else max(0, a - self.span + 1)
        first = min(self.keep, lo) if self.stream is not None else 0
        return torch.cat([torch.arange(first), torch.arange(lo, b)])


def visible(queries: Tensor, keys: Tensor, sees: Sees | int | None = None) -> Tensor:
    """[query key] bool: whether query t sees key j (`Sees`; an int: the model's window alone)."""
    if not isinstance(sees, Sees):
        sees = Sees(window=sees)
    gap = queries[:, None] - keys[None, :]
    seen = gap >= 0
    if sees.window is not None:
        seen &= gap < sees.window
    if sees.stream is not None:
        seen &= (gap < sees.stream) | (keys[None, :] < sees.keep)
    return seen


def key_weight(
    q: Float[Tensor, "batch head_index query_pos d_head"],
    k: Float[Tensor, "batch head_index key_pos d_head"],
    lse: Float[Tensor, "batch head_index query_pos"],
    key: int,
    *,
    scaling: float,
    softcap: float | None = None,
    window: int | None = None,
    stream: tuple[int, int] | None = None,
) -> Float[Tensor, "batch head_index query_pos"]:
    """Every query's attention on key position `key`: exp(s_t,key - lse_t), 0
    for the queries that cannot see it (before it, or past a window; `stream` as `attend` takes it)."""
    scores = key_scores(q, k[..., key : key + 1, :], scaling, softcap)[..., 0]  # [batch head query]
    sees = Sees(window, *(stream or (None, 0)))
    seen = visible(torch.arange(q.shape[-2], device=q.device), torch.tensor([key], device=q.device), sees)[:, 0]
    return torch.where(seen, torch.exp(scores - lse), 0.0)


# A sink standing in for the first key where StreamingLLM's window drops it


@dataclass(frozen=True)
class StandIn:
    """Sink logits (and values) as a column of every chosen row's softmax: in
    those rows a column of logit b joins the softmax (mass m = e^b / (e^b +
    sum_j e^{s_tj}) = sigmoid(b - lse_t); every real weight shrinks by 1 - m)
    and writes m u: the phantom sink of `sinkmech.interventions.phantom` (the
    `logits` form) on the fused path. The rows (`where`): "dropped", those
    where StreamingLLM's window (`stream` with keep 0) drops a key 0 the
    model's own attention would see (the sink in the first key's place);
    "every", every row (the run without `<bos>`, as `sinks --sink-logits`).

    Attributes:
        logits: b per (layer, head) [layer head_index]; -inf: no sink at that head.
        values: u per (layer, head) [layer head_index d_head], or None (writes nothing).
        where: "dropped" or "every".
    """

    logits: Float[Tensor, "layer head_index"]
    values: Float[Tensor, "layer head_index d_head"] | None = None
    where: Literal["dropped", "every"] = "dropped"

    def __post_init__(self) -> None:
        if self.where not in ("dropped", "every"):
            raise ValueError(f"a stand-in sink acts where the stream drops key 0 ('dropped') or in every row "
                             f"('every'), got {self.where!r}")

    def check_stream(self, stream: tuple[int, int] | None) -> None:
        """ValueError unless `stream` suits `where` ("dropped" needs a window that keeps no first key)."""
        if self.where == "dropped" and (stream is None or stream[1] != 0):
            raise ValueError("a stand-in sink replaces the first key where a stream window drops it: give a stream "
                             "that keeps no first key (W, 0), or where='every'")

    def rows(self, queries: Tensor, window: int | None, stream: tuple[int, int] | None) -> Tensor:
        """[query] bool: the chosen rows: every one, or those that see key 0
        under the model's own window but not under the stream's."""
        if self.where == "every":
            return torch.ones(len(queries), dtype=torch.bool, device=queries.device)
        key0 = torch.zeros(1, dtype=torch.long, device=queries.device)
        own = visible(queries, key0, Sees(window))[:, 0]
        return own & ~visible(queries, key0, Sees(window, *stream))[:, 0]

    def mass(self, layer: int, lse: Float[Tensor, "batch head_index query_pos"],
             rows: Tensor) -> Float[Tensor, "batch head_index query_pos"]:
        """m in the chosen rows (0 elsewhere), from the rows' log-sum-exp over the real keys."""
        b = self.logits[layer].float().to(lse.device)[None, :, None]
        return torch.where(rows.to(lse.device)[None, None, :], torch.sigmoid(b - lse.float()), 0.0)

    def write(self, layer: int, mass: Float[Tensor, "batch head_index query_pos"]) -> Tensor | None:
        """m u [batch head_index query_pos d_head] (None without values)."""
        if self.values is None:
            return None
        return mass[..., None] * self.values[layer].float().to(mass.device)[None, :, None, :]

    def apply(self, layer: int, out: Float[Tensor, "batch head_index query_pos d_head"],
              lse: Float[Tensor, "batch head_index query_pos"], rows: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """A head's fused output and log-sum-exp with the stand-in in `rows`:
        (out (1 - m) + m u, the log-sum-exp with b's column, m)."""
        mass = self.mass(layer, lse, rows)
        out = out * (1.0 - mass)[..., None].to(out.dtype)
        written = self.write(layer, mass)
        if written is not None:
            out = out + written.to(out.dtype)
        b = self.logits[layer].float().to(lse.device)[None, :, None]
        lse = torch.where(rows.to(lse.device)[None, None, :], torch.logaddexp(lse.float(), b), lse)
        return out, lse, mass


# What a forward pass records


@dataclass
class Recorder:
    """Per layer, what the sink measures read off attention, collected by
    `fused_attention` during one forward pass (`recording`).

    Attributes:
        keys: key positions whose attention every query's is recorded (0, a moved `<bos>`).
        weights: layer -> [batch head_index key query_pos]: query t's attention on keys[key].
        sink: layer -> [batch head_index query_pos]: the learned sink's share (models with sink logits).
        value_norm: layer -> [batch head_index key_pos]: each key's value-vector norm, per query head.
        stream: (W, keep): StreamingLLM's window for the pass (`attend`), or None.
        stand_in: the sink standing in for key 0 where the stream drops it (`StandIn`), or None.
    """

    keys: tuple[int, ...] = (0,)
    stream: tuple[int, int] | None = None
    stand_in: StandIn | None = None
    weights: dict[int, Tensor] = field(default_factory=dict)
    sink: dict[int, Tensor] = field(default_factory=dict)
    value_norm: dict[int, Tensor] = field(default_factory=dict)

    def record(self, layer: int, q: Tensor, k: Tensor, v: Tensor, lse: Tensor, *, scaling: float,
               softcap: float | None, window: int | None, sinks: Tensor | None) -> None:
        """Layer `layer`'s share: each query's attention on `keys`, the sink's share, the value norms."""
        if not torch.isfinite(lse).all():
            raise FloatingPointError(f"layer {layer}: NaN or inf in the attention scores")
        self.weights[layer] = torch.stack([key_weight(q, k, lse, key, scaling=scaling, softcap=softcap,
                                                      window=window, stream=self.stream)
                                         for key in self.keys], dim=2).cpu()
        if sinks is not None:
            self.sink[layer] = torch.exp(sinks.detach().float().to(lse.device)[None, :, None] - lse).cpu()
        self.value_norm[layer] = v.float().norm(dim=-1).cpu()


_ACTIVE: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar("sinkmech_recorder", default=None)


@contextmanager
def recording(keys: Sequence[int] = (0,), stream: tuple[int, int] | None = None,
              stand_in: StandIn | None = None) -> Iterator[Recorder]:
    """`fused_attention` records into the Recorder this yields while the block
    runs (and attends under `stream`, StreamingLLM's (W, keep), when given,
    with `stand_in` in key 0's place where the stream drops it)."""
    if stream is not None and (stream[0] < 1 or stream[1] < 0):
        raise ValueError(f"a stream window is (W >= 1, keep >= 0), got {stream}")
    if stand_in is not None:
        stand_in.check_stream(stream)
    rec = Recorder(keys=tuple(int(k) for k in keys), stream=None if stream is None else (int(stream[0]), int(stream[1])),
                   stand_in=stand_in)
    token = _ACTIVE.set(rec)
    try:
        yield rec
    finally:
        _ACTIVE.reset(token)


def fused_attention(module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, *,
                    scaling: float | None = None, dropout: float = 0.0, **arch) -> tuple[Tensor, None]:
    """A transformers attention function (`ALL_ATTENTION_FUNCTIONS`): query
    [batch head_index pos d_head], key and value [batch kv_head pos d_head]
    -> the output [batch pos head_index d_head] and no weights. Causal, with
    what the architecture passes among `arch`: its soft-cap (`softcap`),
    sliding window (`sliding_window`) and learned sink logits (`s_aux`); the
    rest of what transformers passes (position ids, cache arguments) is not
    read."""
    sliding_window, softcap, s_aux = arch.get("sliding_window"), arch.get("softcap"), arch.get("s_aux")
    if dropout:
        raise ValueError("fused_attention runs without attention dropout (put the model in eval mode)")
    check_right_padded(attention_mask)
    repeat = query.shape[1] // key.shape[1]  # grouped-query attention: head h reads key head h // repeat
    key, value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
    scaling = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
    rec = _ACTIVE.get()
    out, lse = attend(query, key, value, scaling=scaling, softcap=softcap, window=sliding_window, sinks=s_aux,
                      stream=None if rec is None else rec.stream)
    if rec is not None and rec.stand_in is not None:
        if s_aux is not None:
            raise ValueError("this model has learned sinks of its own: a stand-in sink would add a second one")
        rows = rec.stand_in.rows(torch.arange(query.shape[-2], device=query.device), sliding_window, rec.stream)
        out, lse, mass = rec.stand_in.apply(module.layer_idx, out, lse, rows)
        rec.sink[module.layer_idx] = mass.cpu()
    if rec is not None:
        rec.record(module.layer_idx, query, key, value, lse, scaling=scaling, softcap=softcap,
                   window=sliding_window, sinks=s_aux)
    return out.transpose(1, 2).contiguous(), None


def check_right_padded(attention_mask: Tensor | None) -> None:
    """A 2D padding mask is ignored when every row is real tokens then padding
    (a real query never sees a padding key); anything else is refused."""
    if attention_mask is None:
        return
    if attention_mask.dim() != 2:
        raise ValueError(f"fused_attention takes a 2D padding mask, got one of shape {tuple(attention_mask.shape)}")
    real = attention_mask.bool()
    if (real[:, 1:] & ~real[:, :-1]).any():
        raise ValueError("fused_attention takes right-padded batches only (a padding token before a real one)")


def register() -> str:
    """Register `fused_attention` with transformers' attention interface; returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(FUSED, fused_attention)
    return FUSED
