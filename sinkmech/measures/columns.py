"""What one forward pass gives the sink measures, per query, for every layer:
each query's attention on chosen keys (key 0 for alpha_0, Gu et al. 2025; a
moved `<bos>`), the learned sink's share, value and residual norms at every
position, and next-token losses, with StreamingLLM's window when asked
(Xiao et al. 2024). Fused (`sinkmech.measures.fused`), no T x T pattern is
ever held; from the pattern, each layer's whole pattern is read in its hook.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import einops
import torch
from jaxtyping import Float
from torch import Tensor

from sinkmech.hooks import act_name, cached_run, expand_kv
from sinkmech.loading.attention import attention_interface, forward_chunks, layer_windows
from sinkmech.loading.backend import IS_BRIDGE, has_learned_sinks
from sinkmech.measures.definitions import check_rows, query_mean
from sinkmech.measures import fused
from sinkmech.measures.fused import Attention, Sees, StandIn, recording, register, resolve_attention, visible
from sinkmech.measures.loss import UNEMBED_ROWS, next_token_nll


@dataclass(frozen=True)
class AttentionColumns:
    """What one forward pass gives the sink measures, per layer, with no T x T
    tensor: each query's attention on the chosen keys, the learned sink's share,
    value and residual norms at every position, and the next-token losses."""

    weights: Float[Tensor, "layer batch head_index key query_pos"]
    value_norm: Float[Tensor, "layer batch head_index pos"]
    resid_norm: Float[Tensor, "layer batch pos"]
    sink: Float[Tensor, "layer batch head_index query_pos"] | None = None
    # position p's next-token loss (nats, predicting token p + 1) where the loss mask is True, NaN elsewhere
    token_loss: Float[Tensor, "batch pos"] | None = None

    def first_key_stats(self, lengths: Tensor, bos_position: int | None = None) -> dict[str, Tensor]:
        """What `SinkScores` holds per prompt, from these columns, through the one
        mean over queries (`definitions.query_mean`): alpha_0 ("scores") [batch
        layer head_index], the moved `<bos>` key's score (keys[1], from
        `bos_position` on), the learned sink's mass, value norms at position 0
        and over the rest, residual norms [batch layer] likewise."""
        L = self.weights.shape[0]
        rest = (torch.arange(self.weights.shape[-1])[None, :] < lengths[:, None]).float()
        rest[:, 0] = 0.0
        n_rest = (lengths.float() - 1).clamp(min=1)
        per_layer = [{
            "scores": query_mean(self.weights[l, :, :, 0], lengths),
            **({} if bos_position is None else
               {"bos_scores": query_mean(self.weights[l, :, :, 1], lengths, start=bos_position)}),
            **({} if self.sink is None else {"learned_sink_scores": query_mean(self.sink[l], lengths)}),
            "value_norm_first": self.value_norm[l, ..., 0],
            "value_norm_rest": einops.einsum(self.value_norm[l], rest, "b h p, b p -> b h") / n_rest[:, None],
            "resid_norm_first": self.resid_norm[l, :, 0],
            "resid_norm_rest": (self.resid_norm[l] * rest).sum(-1) / n_rest,
        } for l in range(L)]
        return {k: torch.stack([d[k] for d in per_layer], dim=1) for k in per_layer[0]}

    @property
    def row_loss(self) -> Float[Tensor, " batch"] | None:
        """Each row's summed next-token loss over its scored positions (nats, float64)."""
        return None if self.token_loss is None else self.token_loss.double().nan_to_num(0.0).sum(1)


def attention_columns(model, tokens: Tensor, *, keys: Sequence[int] = (0,), loss_mask: Tensor | None = None,
                      chunk: int | None = None, stream: tuple[int, int] | None = None,
                      attention: Attention = "fused", stand_in: StandIn | None = None) -> AttentionColumns:
    """One no-grad forward pass of right-padded `tokens` [batch pos]. Fused, it
    never holds a T x T pattern: on the Bridge through transformers' attention
    interface and `fused_attention`; on TransformerLens 3.9 in query chunks
    through its own key-value cache (`sinkmech.loading.attention`). With the
    pattern, each layer's whole pattern is read in its hook (the reference).

    Args:
        model: a HookedTransformer or a TransformerBridge.
        keys: key positions whose attention every query's is returned.
        loss_mask: True at the positions whose next token is scored: their
            next-token losses as `sinkmech.measures.loss.masked_row_losses` computes them.
        chunk: query positions per step on TransformerLens 3.9 (default `CHUNK`).
        stream: (W, keep): every layer under StreamingLLM's sliding window of W
            keys with the first `keep` kept (`sinkmech.context.stream`), or None.
        attention: "fused", "pattern", or "auto" (`resolve_attention` on the length).
        stand_in: sink logits (and values) in the rows `StandIn.where` names (where
            `stream`, keeping no first key, drops key 0, or every row;
            `sinkmech.measures.fused.StandIn`); its mass is then the columns' `sink`.
    """
    if stream is not None and (stream[0] < 1 or stream[1] < 0):
        raise ValueError(f"a stream window is (W >= 1, keep >= 0), got {stream}")
    if stand_in is not None:
        stand_in.check_stream(stream)
        if has_learned_sinks(model):
            raise ValueError("this model has learned sinks of its own: a stand-in sink would add a second one")
        L, H = model.cfg.n_layers, model.cfg.n_heads
        if tuple(stand_in.logits.shape) != (L, H) or (
                stand_in.values is not None and tuple(stand_in.values.shape) != (L, H, model.cfg.d_head)):
            raise ValueError(f"stand-in sink logits {list(stand_in.logits.shape)} (values "
                             f"{None if stand_in.values is None else list(stand_in.values.shape)}) do not fit this "
                             f"model: {L} layers x {H} heads, d_head {model.cfg.d_head}")
    if resolve_attention(attention, int(tokens.shape[1])) == "pattern":
        run = _pattern_columns
    else:
        run = _bridge_columns if IS_BRIDGE else _chunked_columns
    return run(model, tokens, tuple(keys), loss_mask, chunk or fused.CHUNK, stream, stand_in)


def _token_losses(model, resid: Tensor, tokens: Tensor, mask: Tensor, start: int, out: Tensor) -> None:
    """Next-token losses of the positions start .. start + len(resid) - 1 that
    `mask` scores (position p predicts token p + 1), into `out` [batch pos],
    through the one readout `sinkmech.measures.loss.next_token_nll`, a few
    hundred rows at a time."""
    stop = min(start + resid.shape[1], tokens.shape[1] - 1)
    step = max(1, UNEMBED_ROWS // tokens.shape[0])
    for a in range(start, stop, step):
        b = min(a + step, stop)
        scored = mask[:, a:b].cpu()
        if scored.any():
            nll = next_token_nll(model, resid[:, a - start : b - start], tokens[:, a + 1 : b + 1])
            out[:, a:b] = torch.where(scored, nll.float().cpu(), out[:, a:b])


def _bridge_columns(model, tokens, keys, loss_mask, chunk, stream, stand_in) -> AttentionColumns:
    L = model.cfg.n_layers
    resid = torch.zeros(L, *tokens.shape)

    def resid_hook(x, hook):
        resid[hook.layer()] = x.float().norm(dim=-1).cpu()

    hooks = [(act_name("resid_post", l), resid_hook) for l in range(L)]
    last = act_name("resid_post", L - 1)
    token_loss = None
    with attention_interface(model, register()), recording(keys, stream, stand_in) as rec:
        _, cache = cached_run(model, tokens, [last], hooks, stop_at_layer=L)
    if loss_mask is not None:
        token_loss = torch.full(tokens.shape, float("nan"))
        _token_losses(model, cache[last], tokens, loss_mask, 0, token_loss)
    if sorted(rec.weights) != list(range(L)):
        raise RuntimeError(f"the fused attention ran in layers {sorted(rec.weights)} of {L}: some layer's attention "
                           "does not go through transformers' attention interface")
    return AttentionColumns(
        weights=torch.stack([rec.weights[l] for l in range(L)]),
        value_norm=torch.stack([rec.value_norm[l] for l in range(L)]),
        resid_norm=resid,
        sink=torch.stack([rec.sink[l] for l in range(L)]) if rec.sink else None,
        token_loss=token_loss,
    )


def _column_buffers(model, tokens, keys, stand_in=None) -> dict[str, Tensor | None]:
    L, H, (B, T) = model.cfg.n_layers, model.cfg.n_heads, tokens.shape
    sink = has_learned_sinks(model) or stand_in is not None
    return {"weights": torch.zeros(L, B, H, len(keys), T), "value_norm": torch.zeros(L, B, H, T),
            "resid_norm": torch.zeros(L, B, T), "sink": torch.zeros(L, B, H, T) if sink else None}


def _column_hooks(model, keys, stream, out: dict, stand_in: StandIn | None = None):
    """`hooks(start)`: the hooks that read the pattern block of the queries
    start .. (a chunk, or the whole pass from 0) into the buffers `out`, with
    StreamingLLM's window on the scores when `stream` is given, and the
    stand-in sink where it drops key 0 (its mass from the masked scores'
    log-sum-exp, the row rescaled on the pattern, m u added to the head's output)."""
    L = model.cfg.n_layers
    sees = None if stream is None else Sees(stream=stream[0], keep=stream[1])
    weights, value_norm, resid, sink = out["weights"], out["value_norm"], out["resid_norm"], out["sink"]
    windows = layer_windows(model) if stand_in is not None else None

    def hooks(start: int):
        held: dict[int, Tensor] = {}

        def scores_hook(scores, hook):  # StreamingLLM's window on the [query key] block
            if sees is not None:
                seen = visible(torch.arange(start, start + scores.shape[-2]), torch.arange(scores.shape[-1]), sees)
                scores = scores.masked_fill(~seen.to(scores.device), float("-inf"))
            if stand_in is not None:
                l = hook.layer()
                rows = stand_in.rows(torch.arange(start, start + scores.shape[-2]), windows[l], stream)
                held[l] = stand_in.mass(l, scores.float().logsumexp(-1), rows.to(scores.device))
            return scores

        def pattern_hook(pattern, hook):  # [batch head_index query key_pos]: keys 0 .. the block's last query
            l, stop = hook.layer(), start + pattern.shape[-2]
            if stand_in is not None:
                pattern = pattern * (1.0 - held[l]).to(pattern.dtype)[..., None]
            check_rows(pattern, torch.ones(pattern.shape[0], stop - start), l, learned=sink is not None)
            for i, key in enumerate(keys):
                if key < pattern.shape[-1]:  # a later key gets no attention from these queries
                    weights[l, :, :, i, start:stop] = pattern[..., key].float().cpu()
            if sink is not None:
                sink[l, :, :, start:stop] = (1.0 - pattern.float().sum(-1)).cpu()
            return pattern if stand_in is not None else None

        def z_hook(z, hook):  # [batch query head_index d_head]: the stand-in's m u
            written = stand_in.write(hook.layer(), held.pop(hook.layer()))
            return z + written.transpose(1, 2).to(z.dtype)

        def value_hook(v, hook):
            norms = expand_kv(model, v).float().norm(dim=-1)  # [batch, query, head_index]
            value_norm[hook.layer(), :, :, start : start + norms.shape[1]] = norms.transpose(1, 2).cpu()

        def resid_hook(x, hook):
            resid[hook.layer(), :, start : start + x.shape[1]] = x.float().norm(dim=-1).cpu()

        per_layer = ([(act_name("attn_scores", l), scores_hook) for l in range(L)]
                     if sees is not None or stand_in is not None else [])
        per_layer += ([(act_name("z", l), z_hook) for l in range(L)]
                      if stand_in is not None and stand_in.values is not None else [])
        return per_layer + [h for l in range(L) for h in ((act_name("pattern", l), pattern_hook),
                                                          (act_name("v", l), value_hook),
                                                          (act_name("resid_post", l), resid_hook))]

    return hooks


def _chunked_columns(model, tokens, keys, loss_mask, chunk, stream, stand_in) -> AttentionColumns:
    out = _column_buffers(model, tokens, keys, stand_in)
    hooks = _column_hooks(model, keys, stream, out, stand_in)
    token_loss = None if loss_mask is None else torch.full(tokens.shape, float("nan"))
    for start, last in forward_chunks(model, tokens, hooks, chunk=chunk):
        if token_loss is not None:
            _token_losses(model, last, tokens, loss_mask, start, token_loss)
    return AttentionColumns(**out, token_loss=token_loss)


def _pattern_columns(model, tokens, keys, loss_mask, chunk, stream, stand_in) -> AttentionColumns:
    """The same quantities read off each layer's whole pattern in its hook (the pattern path)."""

    L = model.cfg.n_layers
    out = _column_buffers(model, tokens, keys, stand_in)
    last = act_name("resid_post", L - 1)
    _, cache = cached_run(model, tokens, [last], _column_hooks(model, keys, stream, out, stand_in)(0), stop_at_layer=L)
    token_loss = None
    if loss_mask is not None:
        token_loss = torch.full(tokens.shape, float("nan"))
        _token_losses(model, cache[last], tokens, loss_mask, 0, token_loss)
    return AttentionColumns(**out, token_loss=token_loss)
