"""Hook names, forward passes and per-head interventions shared by the analyses.

Hooks are attached only through `model.hooks(...)` so they are always removed.
Intervention hooks return modified copies; they never edit an activation in place.
"""

from __future__ import annotations

from contextlib import contextmanager
from collections.abc import Callable, Iterator, Sequence

import torch
from jaxtyping import Bool, Float
from torch import Tensor
from sinkmech.loading.backend import Model, forward
from transformer_lens.utilities import get_act_name

Hook = tuple[str, Callable]


def act_name(name: str, layer: int | None = None) -> str:
    """TransformerLens hook name, e.g. act_name("pattern", 3)."""
    return get_act_name(name, layer)


def check_layer(model: Model, layer: int, what: str = "layer") -> None:
    """The one layer-range check: `what` names the argument in the error."""
    if not 0 <= layer < model.cfg.n_layers:
        raise ValueError(f"{what} {layer} out of range: the model has {model.cfg.n_layers} layers")


def check_head(model: Model, layer: int, head: int) -> None:
    check_layer(model, layer)
    if not 0 <= head < model.cfg.n_heads:
        raise ValueError(f"head {head} out of range: the model has {model.cfg.n_heads} heads per layer")


def head_label(layer: int, head: int) -> str:
    """The one printed name of a head: `L{layer}.H{head}`, e.g. "L12.H3"."""
    return f"L{layer}.H{head}"


def parse_head(text: str, model: Model | None = None) -> tuple[int, int]:
    """'L.H' -> (L, H), checked against the model when given."""
    try:
        layer, head = (int(x) for x in text.split("."))
    except ValueError:
        raise ValueError(f"a head is written LAYER.HEAD, e.g. 12.3; got {text!r}") from None
    if model is not None:
        check_head(model, layer, head)
    return layer, head


@contextmanager
def right_padding(model: Model) -> Iterator[None]:
    """Make TransformerLens treat our right-padded batches as plain causal input
    (a left-padding tokenizer would make it build its own attention mask)."""
    tok = model.tokenizer
    old = getattr(tok, "padding_side", None)
    if tok is not None:
        tok.padding_side = "right"
    try:
        yield
    finally:
        if tok is not None and old is not None:
            tok.padding_side = old


def run(
    model: Model,
    tokens: Tensor,
    fwd_hooks: Sequence[Hook] = (),
    **kwargs,
) -> Tensor:
    """One forward pass with hooks that are removed afterwards, no grad
    (`start_at_layer` / `stop_at_layer` as `sinkmech.loading.backend.forward` takes them)."""
    with torch.no_grad(), right_padding(model):
        return forward(model, tokens, fwd_hooks=fwd_hooks, **kwargs)


def kv_head_index(model: Model) -> Tensor:
    """For each query head, the key/value head it reads (grouped-query attention)."""
    n_kv = model.cfg.n_key_value_heads or model.cfg.n_heads
    return torch.arange(model.cfg.n_heads) // (model.cfg.n_heads // n_kv)


# Per-head interventions. `queries` (bool [batch, query_pos]) limits an
# intervention to some query positions; None means all of them.


def _select(queries: Tensor | None, like: Tensor) -> Tensor:
    if queries is None:
        return torch.ones(like.shape[0], like.shape[-2], dtype=torch.bool, device=like.device)
    return queries.to(like.device)


def mask_first_hook(head: int, queries: Bool[Tensor, "batch query_pos"] | None = None) -> Callable:
    """On `attn_scores`: the head cannot attend to key 0 (rows renormalise in the
    softmax). Query 0 keeps its only key: a fully masked row has no softmax."""

    def hook(scores: Float[Tensor, "batch head_index query_pos key_pos"], hook):
        sel = _select(queries, scores).clone()
        sel[:, 0] = False
        out = scores.clone()
        col = out[:, head, :, 0]
        out[:, head, :, 0] = torch.where(sel, torch.finfo(out.dtype).min, col)
        return out

    return hook


def all_to_first_hook(head: int, queries: Bool[Tensor, "batch query_pos"] | None = None) -> Callable:
    """On `pattern`: the head puts all of its attention on key 0 (fully dormant)."""

    def hook(pattern: Float[Tensor, "batch head_index query_pos key_pos"], hook):
        sel = _select(queries, pattern)
        out = pattern.clone()
        onehot = torch.zeros_like(out[:, head])
        onehot[..., 0] = 1.0
        out[:, head] = torch.where(sel[..., None], onehot, out[:, head])
        return out

    return hook


def drop_sink_hook(head: int, queries: Bool[Tensor, "batch query_pos"] | None = None) -> Callable:
    """On `pattern`: the head's learned sink logit removed (gpt-oss): each row,
    whose weights over the real keys sum to 1 minus the sink's share, is
    renormalised over the real keys. That is the softmax with the sink logit at
    -inf, exactly: every real weight is exp(s_j) / (Z + exp(sink)), and dividing
    by their sum leaves exp(s_j) / Z."""

    def hook(pattern: Float[Tensor, "batch head_index query_pos key_pos"], hook):
        sel = _select(queries, pattern)
        out = pattern.clone()
        rows = out[:, head]
        out[:, head] = torch.where(sel[..., None], rows / rows.sum(-1, keepdim=True), rows)
        return out

    return hook


def zero_head_hook(head: int, queries: Bool[Tensor, "batch query_pos"] | None = None) -> Callable:
    """On `z`: the head's output is zeroed."""

    def hook(z: Float[Tensor, "batch pos head_index d_head"], hook):
        sel = _select(queries, z.transpose(1, 2))
        out = z.clone()
        out[:, :, head] = torch.where(sel[..., None], 0.0, out[:, :, head])
        return out

    return hook


def mean_head_hook(
    head: int, mean: Float[Tensor, " d_head"], queries: Bool[Tensor, "batch query_pos"] | None = None
) -> Callable:
    """On `z`: the head's output is replaced by a fixed vector (its corpus mean)."""

    def hook(z: Float[Tensor, "batch pos head_index d_head"], hook):
        sel = _select(queries, z.transpose(1, 2))
        out = z.clone()
        out[:, :, head] = torch.where(sel[..., None], mean.to(z), out[:, :, head])
        return out

    return hook


def row_queries(rows: slice, n_rows: int, n_pos: int, device=None) -> Bool[Tensor, "batch query_pos"]:
    """A `queries` mask selecting every query of the rows `rows` of a stacked batch
    (one copy of the prompts among several run in one forward pass)."""
    sel = torch.zeros(n_rows, n_pos, dtype=torch.bool, device=device)
    sel[rows] = True
    return sel


# One copy each of what several analyses need from a forward pass.


def expand_kv(model: Model, x: Float[Tensor, "... kv_head d"]) -> Float[Tensor, "... head_index d"]:
    """Per-key/value-head tensor (axis -2) -> per-query-head (grouped-query
    attention: query head h reads key/value head `kv_head_index(model)[h]`).
    Already per-query-head tensors pass through."""
    if x.shape[-2] == model.cfg.n_heads:
        return x
    return x[..., kv_head_index(model).to(x.device), :]


def cached_run(
    model: Model,
    tokens: Tensor,
    names: Sequence[str],
    fwd_hooks: Sequence[Hook] = (),
    **kwargs,
) -> tuple[Tensor | None, dict[str, Tensor]]:
    """One no-grad forward pass caching only `names` (with extra hooks, removed
    afterwards). Returns (logits, {name: activation}); logits is None when the
    pass stops early (`stop_at_layer`)."""
    cache: dict[str, Tensor] = {}

    def keep(name: str) -> Callable:
        def hook(x, hook):  # after `fwd_hooks` on the same point: it sees their result
            cache[name] = x
        return hook

    wanted = list(dict.fromkeys(names))
    out = run(model, tokens, [*fwd_hooks, *((n, keep(n)) for n in wanted)], **kwargs)
    missing = [n for n in wanted if n not in cache]
    if missing:
        raise RuntimeError(f"hooks never ran: {missing[:3]} (the pass stopped before them, or the model has no such hook)")
    return (out if kwargs.get("stop_at_layer") is None else None), cache


def residual_stack(
    model: Model, tokens: Tensor, fwd_hooks: Sequence[Hook] = ()
) -> Float[Tensor, "batch resid_layer pos d_model"]:
    """The residual stream entering every layer, then the last layer's output
    (resid_layer 0 = embeddings, n_layers = output of the last layer)."""
    L = model.cfg.n_layers
    names = [act_name("resid_pre", l) for l in range(L)] + [act_name("resid_post", L - 1)]
    _, cache = cached_run(model, tokens, names, fwd_hooks, stop_at_layer=L)
    return torch.stack([cache[n] for n in names], dim=1)
