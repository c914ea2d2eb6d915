"""How attention runs when the T x T pattern is not to be held: the two
backends' own routes to a forward pass whose attention never builds it.

- The Bridge (TransformerLens 4): its attention components re-derive the
  Hugging Face attention step by step so that `hook_pattern` sees the whole
  pattern. `attention_interface(model, name)` sends each one through the
  Hugging Face module's own forward instead (projections, QK-norm, rotary
  embeddings: the model's code), which calls transformers' attention interface
  under `name` with the model's own soft-cap, sliding window and learned sink
  logits as arguments. Masks: an implementation name transformers has no mask
  function for gets the 2D padding mask (or None), never a T x T one.
- TransformerLens 3.9: `HookedTransformer`'s attention always computes the
  scores of every query against every key in one tensor
  (`AbstractAttention.calculate_attention_scores`, then the softmax over it),
  so no kernel can be put in its place without re-deriving its forward by
  hand. `forward_chunks` runs the queries a chunk at a time through the
  model's own key-value cache (the path its text generation takes): each layer
  then holds a chunk x T block of the pattern, never T x T.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
from jaxtyping import Float, Int
from torch import Tensor

from sinkmech.loading.backend import IS_BRIDGE, Model


@contextmanager
def attention_interface(model: Model, name: str) -> Iterator[None]:
    """Within the block, the Bridge's attention runs through the Hugging Face
    module's own forward and transformers' attention function registered as
    `name` (`transformers.AttentionInterface.register`). Hooks on the
    projections (`hook_q`, `hook_k`, `hook_v`), `hook_z` and the residual
    stream still fire; `hook_pattern` and `hook_attn_scores` do not (there is
    no pattern). Restored on exit."""
    if not IS_BRIDGE:
        raise RuntimeError("attention_interface routes the TransformerBridge's attention; TransformerLens 3.9 runs "
                           "its own (use forward_chunks)")
    from transformer_lens.model_bridge.generalized_components.attention import AttentionBridge

    hf = model.original_model
    bridges = [b.attn for b in model.blocks]
    if not all(isinstance(a, AttentionBridge) for a in bridges):
        raise RuntimeError(f"{model.cfg.model_name}: an attention component is not an AttentionBridge: its "
                           "attention cannot be routed through transformers' interface")
    configs = {id(c): c for c in _configs(hf, bridges)}.values()
    before = [(c, c._attn_implementation) for c in configs]
    try:
        for c in configs:
            c._attn_implementation = name
        for a in bridges:
            # object.__setattr__: a bridge passes attribute writes on to the module it wraps
            object.__setattr__(a, "forward", _delegate(a, AttentionBridge.forward))
        yield
    finally:
        for a in bridges:
            a.__dict__.pop("forward", None)
        for c, old in before:
            c._attn_implementation = old


def _delegate(bridge, forward: Callable) -> Callable:
    def run(*args, **kwargs):
        return forward(bridge, *args, **kwargs)

    return run


def _configs(hf, bridges) -> list:
    """Every config object the model's masks and attention modules read."""
    found = [hf.config, getattr(hf.config, "text_config", None)]
    found += [getattr(a.original_component, "config", None) for a in bridges]
    base = getattr(hf, hf.base_model_prefix, None)
    found.append(getattr(base, "config", None))
    return [c for c in found if c is not None and hasattr(c, "_attn_implementation")]


def forward_chunks(
    model: Model,
    tokens: Int[Tensor, "batch pos"],
    hooks: Callable[[int], Sequence[tuple[str, Callable]]],
    *,
    chunk: int,
) -> Iterator[tuple[int, Float[Tensor, "batch chunk d_model"]]]:
    """TransformerLens 3.9: one no-grad forward pass of right-padded `tokens`,
    `chunk` query positions at a time through the model's own key-value cache.

    Args:
        hooks: `hooks(start)` gives the forward hooks for the chunk whose first
            position is `start` (each hook sees that chunk's positions only:
            `hook_pattern` a [batch head_index chunk key_pos] block over the
            keys 0 .. start + chunk - 1).
        chunk: query positions per step.

    Yields:
        (start, the last block's output at positions start .. start + chunk - 1).
    """
    if IS_BRIDGE:
        raise RuntimeError("forward_chunks runs TransformerLens 3.9's key-value cache; the Bridge routes its "
                           "attention through transformers' interface (use attention_interface)")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
    from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache

    from sinkmech.hooks import right_padding

    n_batch, n_pos = tokens.shape
    if n_pos > model.cfg.n_ctx:
        raise ValueError(f"{n_pos} positions do not fit the model's context of {model.cfg.n_ctx} (load it with a "
                         "larger n_ctx)")
    cache = TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, n_batch)
    # Right padding: every real query's keys are real, so an all-ones mask is the
    # causal mask the unchunked pass uses (the cache needs a mask to extend).
    ones = torch.ones_like(tokens)
    with torch.no_grad(), right_padding(model):
        for start in range(0, n_pos, chunk):
            stop = min(n_pos, start + chunk)
            with model.hooks(fwd_hooks=list(hooks(start))):
                out = model(tokens[:, start:stop], past_kv_cache=cache, attention_mask=ones[:, start:stop],
                            stop_at_layer=model.cfg.n_layers)
            yield start, out


def layer_windows(model: Model) -> list[int | None]:
    """Each layer's own sliding window (query t sees keys j with t - j < window;
    None: every earlier key), as the model's config states it."""
    L = model.cfg.n_layers
    if IS_BRIDGE:
        config = model.original_model.config
        config = getattr(config, "text_config", None) or config
        window = getattr(config, "sliding_window", None)
        types = getattr(config, "layer_types", None) or ["sliding_attention" if window else "full_attention"] * L
        return [window if t == "sliding_attention" and window else None for t in types]
    types = getattr(model.cfg, "attn_types", None) or ["global"] * L
    return [model.cfg.window_size if t == "local" else None for t in types]
