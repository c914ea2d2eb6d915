"""The model seam: the little sinkmech needs from a model, for both TransformerLens lines.

TransformerLens 3.x gives a `HookedTransformer`; TransformerLens 4.x removed it
and gives a `TransformerBridge` around a Hugging Face model. The installed
TransformerLens decides which (`CAPABILITIES`, `sinkmech.loading.capabilities`);
every analysis, the report and the CLI go through this module and never ask
which one it is: where the two differ in what they can do (train, re-index a
cache, load any architecture), they ask `CAPABILITIES`. What they use:

- hooks by name (`blocks.{l}.attn.hook_pattern`, `hook_z`, `hook_v`,
  `hook_resid_pre`, ...), attached through `model.hooks(...)`;
- `cfg` fields: n_layers, n_heads, n_key_value_heads, d_model, d_head,
  d_vocab, n_ctx, device, model_name, positional_embedding_type;
- weights `W_O` [layer head_index d_head d_model] and `W_V` (key/value heads
  not expanded), `b_V` (zeros when the model has no value bias), the attention
  scale of each layer;
- the model's own readout of the last block's output: final norm, unembedding
  and whatever the architecture adds after it (`unembed`);
- learned sink logits, for models whose softmax has them (`learned_sinks`);
- a forward pass that starts at a layer from a residual stream and stops
  after one (`forward`);
- a tokenizer; sinkmech always places `<bos>` itself (see `sinkmech.prompts`).

The Bridge runs the Hugging Face model's own (eager) attention, without
TransformerLens 4's compatibility mode: its hook names are already the
legacy ones, and its logits are transformers' own. HookedTransformer folds
and centres weights, so raw logits differ between backends by a constant per
position: compare log-probabilities, never raw logits.
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from sinkmech.loading.capabilities import CAPABILITIES, Capabilities

BACKEND = CAPABILITIES.backend
IS_BRIDGE = BACKEND == "TransformerBridge"  # the seam's own branches below; callers ask CAPABILITIES
if IS_BRIDGE:  # TransformerLens 4.x removed HookedTransformer
    from transformer_lens.model_bridge import TransformerBridge as Model
else:
    from transformer_lens import HookedTransformer as Model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

__all__ = ["Model", "CAPABILITIES", "Capabilities", "BACKEND", "IS_BRIDGE", "DTYPES", "model_from_config", "forward", "writable_hooks", "unembed", "learned_sinks", "has_learned_sinks", "learned_sink_note",
           "NO_LEARNED_SINKS", "W_O", "W_V", "b_V", "attn_scale",
           "versions", "version_text", "move"]


def model_from_config(**fields) -> Model:
    """A freshly initialised HookedTransformer from HookedTransformerConfig fields
    (`CAPABILITIES.from_config`: what `sinkmech.train` builds); a RuntimeError
    naming the backend where the installed TransformerLens has no such models."""
    if not CAPABILITIES.from_config:
        raise RuntimeError(f"models built from a config are TransformerLens 3.x HookedTransformers; this environment "
                           f"has {CAPABILITIES.described}: install transformer-lens<4")
    from transformer_lens import HookedTransformerConfig

    return Model(HookedTransformerConfig(**fields))


class _Stopped(Exception):
    """Raised by the hook that ends a Bridge forward pass after the last block."""

    def __init__(self, resid: Tensor) -> None:
        self.resid = resid


def forward(
    model: Model,
    input: Tensor,
    *,
    start_at_layer: int | None = None,
    stop_at_layer: int | None = None,
    fwd_hooks: Sequence[tuple[str, Callable]] = (),
) -> Tensor:
    """One forward pass with hooks (removed afterwards), as HookedTransformer runs it.

    Args:
        input: tokens [batch pos], or with `start_at_layer` the residual
            stream entering that layer [batch pos d_model].
        start_at_layer: the first block to run.
        stop_at_layer: stop before this block and return the residual stream
            entering it; n_layers returns the last block's output (no final
            norm, no unembedding: a 262k vocabulary is never computed for it).
    Returns:
        Logits [batch pos d_vocab], or the residual stream when stopped early.
    """
    hooks = writable_hooks(model, fwd_hooks)
    kwargs = {}
    if start_at_layer is not None:
        kwargs["start_at_layer"] = start_at_layer
    L = model.cfg.n_layers
    if IS_BRIDGE and stop_at_layer is not None and stop_at_layer >= L:
        # The Bridge only stops *before* a block; after the last one it would
        # run the final norm and the unembedding. A hook ends the pass there.
        def stop(resid, hook):
            raise _Stopped(resid)

        hooks.append((f"blocks.{L - 1}.hook_resid_post", stop))
        try:
            with model.hooks(fwd_hooks=hooks):
                model(input, **kwargs)
        except _Stopped as done:
            return done.resid
        raise RuntimeError("the forward pass ended without reaching the last block's output")
    if stop_at_layer is not None:
        kwargs["stop_at_layer"] = stop_at_layer
    with model.hooks(fwd_hooks=hooks):
        return model(input, **kwargs)


def writable_hooks(model: Model, fwd_hooks: Sequence[tuple[str, Callable]]) -> list[tuple[str, Callable]]:
    """Hooks that write where HookedTransformer's would.

    On the Bridge `blocks.{l}.hook_resid_mid` is an alias of the MLP-side norm's
    input (`ln2.hook_in`): reading it gives the residual stream between
    attention and MLP, but a value returned there reaches only the MLP, not the
    residual stream that flows on. A hook on it becomes a hook on
    `hook_attn_out` (the tensor the block adds to its input: after Gemma's
    post-attention norm too) that sees resid_pre + attn_out and writes back
    the change, with resid_pre kept by a hook on `hook_resid_pre`. Other hooks
    pass unchanged.
    """
    if not IS_BRIDGE:
        return list(fwd_hooks)
    out = []
    for name, fn in fwd_hooks:
        parts = name.split(".")
        if len(parts) == 3 and parts[0] == "blocks" and parts[2] == "hook_resid_mid":
            out += _resid_mid_writer(int(parts[1]), fn)
        else:
            out.append((name, fn))
    return out


def _resid_mid_writer(layer: int, fn: Callable) -> list[tuple[str, Callable]]:
    held: dict[str, Tensor] = {}

    def keep_pre(resid: Tensor, hook) -> None:
        held["pre"] = resid

    def write(attn_out: Tensor, hook) -> Tensor:
        pre = held.pop("pre")
        mid = pre + attn_out
        new = fn(mid, hook)
        if new is None:
            return attn_out
        # entries the hook left alone keep attn_out exactly (no pre + out - pre rounding)
        return torch.where(new == mid, attn_out, new - pre)

    return [(f"blocks.{layer}.hook_resid_pre", keep_pre), (f"blocks.{layer}.hook_attn_out", write)]


# One logits buffer per device and dtype for `unembed(..., scratch=True)`: a
# fresh 270 MB tensor per chunk of rows is memory the kernel maps and zeroes
# every time (Gemma 3's 262k vocabulary, 256 rows, 2 threads: 0.45 s a chunk
# against 0.37 s in a reused buffer, with the in-place log-softmax of
# sinkmech.measures.loss.next_token_nll; scripts/bench_unembed.py). It keeps the
# largest chunk asked for.
_SCRATCH: dict[tuple[torch.device, torch.dtype], Tensor] = {}


def _scratch(n: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    buf = _SCRATCH.get((device, dtype))
    if buf is None or buf.numel() < n:
        _SCRATCH.pop((device, dtype), None)  # free the smaller one first
        buf = _SCRATCH[(device, dtype)] = torch.empty(n, device=device, dtype=dtype)
    return buf[:n]


def unembed(model: Model, resid: Tensor, scratch: bool = False) -> Tensor:
    """Logits from the last block's output [*rows d_model] -> [*rows d_vocab], by
    the model's own code: everything its forward pass does after the last block.
    With `scratch`, TransformerLens 3.9 writes them into a buffer that the next
    `scratch` call overwrites: for a caller that reduces them at once (and may
    overwrite them; not contiguous where W_U is stored by vocabulary rows); the
    Bridge always returns a new tensor.

    On the Bridge that is the final norm the Hugging Face model calls, then the
    causal LM's own forward from its base model's output on: the unembedding and
    whatever the architecture adds (Gemma's soft-cap, Granite's division by
    `logits_scaling`, Cohere's `logit_scale`, ...), never a copy of it (see
    `_model_readout`). On TransformerLens 3.9 it is HookedTransformer's own final
    norm, unembedding and output soft-cap (`cfg.output_logits_soft_cap`).
    """
    if IS_BRIDGE:
        return _model_readout(model, resid)
    if getattr(model, "ln_final", None) is not None:
        resid = model.ln_final(resid)
    # TransformerLens 3.9's Unembed.forward copies W_U.T into a new contiguous
    # tensor on every call (113 MB for SmolLM2, 670 MB for Gemma 3); the
    # sweeps unembed a few positions at a time, so that copy was 3/4 of a
    # report's ablation section. The same product, on the weights in place.
    # A bias of zeros (a tied embedding's: SmolLM2, Gemma 3) is left out: addmm
    # writes the broadcast bias into the logits before the product, one more pass
    # over them (a third of the product's time for a few hundred rows).
    u = model.unembed
    bias = u.b_U if bool(u.b_U.any()) else None
    if scratch:  # the same product, into the reused buffer
        rows = resid.reshape(-1, resid.shape[-1])
        n_rows, d_vocab = rows.shape[0], u.W_U.shape[1]
        buf = _scratch(n_rows * d_vocab, resid.device, resid.dtype)
        if u.W_U.T.is_contiguous():
            # W_U stored by vocabulary rows (as sinkmech's loaders keep it): the product
            # [d_vocab, rows] = W_U.T @ rows.T, returned transposed
            out = buf.view(d_vocab, n_rows)
            logits = (torch.mm(u.W_U.T, rows.T, out=out) if bias is None
                      else torch.addmm(bias[:, None], u.W_U.T, rows.T, out=out)).T
        else:
            out = buf.view(n_rows, d_vocab)
            logits = torch.mm(rows, u.W_U, out=out) if bias is None else torch.addmm(bias, rows, u.W_U, out=out)
        logits = logits.view(*resid.shape[:-1], d_vocab)
    else:
        logits = torch.nn.functional.linear(resid, u.W_U.T, bias)
    cap = getattr(model.cfg, "output_logits_soft_cap", None)
    if cap is not None and cap > 0:
        logits = cap * torch.tanh(logits / cap)
    return logits


class _Hidden:
    """What the stand-in base model returns: the hidden states (first item, and
    `last_hidden_state`); any other output a causal LM's forward reads (caches,
    attentions, router logits) is None."""

    def __init__(self, hidden: Tensor) -> None:
        self.last_hidden_state = hidden

    def __getitem__(self, i):
        return (self.last_hidden_state,)[i]

    def __getattr__(self, name: str):
        return None


class _GivenOutput(torch.nn.Module):
    """Stands in for a causal LM's base model (its embeddings, blocks and final
    norm) and returns the hidden states it was given, so that the causal LM's own
    forward runs only what comes after them."""

    def __init__(self, hidden: Tensor) -> None:
        super().__init__()
        self.hidden = hidden

    def forward(self, *args, **kwargs) -> _Hidden:
        return _Hidden(self.hidden)


def _model_readout(model: Model, resid: Tensor) -> Tensor:
    """The Bridge's logits from the last block's output: the model's final norm
    (the module its base model calls last; the Bridge's `ln_final` wraps it),
    then the Hugging Face causal LM's own forward with its base model replaced,
    for this call, by one that returns the normed residual. Rows are flattened
    into one sequence (the readout acts on each position alone)."""
    hf = model.original_model
    prefix = hf.base_model_prefix
    base = getattr(hf, prefix)
    shape = resid.shape
    if getattr(model, "ln_final", None) is not None:
        resid = model.ln_final(resid)
    hidden = resid.reshape(1, -1, shape[-1])
    ids = torch.zeros(hidden.shape[:2], dtype=torch.long, device=hidden.device)
    setattr(hf, prefix, _GivenOutput(hidden))
    try:
        logits = hf(input_ids=ids, use_cache=False).logits
    finally:
        setattr(hf, prefix, base)
    return logits.reshape(*shape[:-1], logits.shape[-1])


def learned_sinks(model: Model) -> Tensor | None:
    """Learned sink logits [layer head_index], or None for a model without them.

    gpt-oss adds one learned logit per head to every softmax row as an extra
    column with no value: the row's weights over the real keys then sum to
    1 minus the sink's share (both backends drop that column from
    `hook_pattern`). A layer without sinks in a model with some reads -inf (no share).
    """
    if IS_BRIDGE:
        found = [getattr(getattr(b.attn, "original_component", None), "sinks", None) for b in model.blocks]
    elif getattr(model.cfg, "use_attention_sinks", False):
        found = [getattr(b.attn, "sinks", None) for b in model.blocks]
    else:
        return None
    if all(s is None for s in found):
        return None
    H = model.cfg.n_heads
    return torch.stack([torch.full((H,), float("-inf")) if s is None else s.detach().float().cpu().reshape(H)
                        for s in found])


def has_learned_sinks(model: Model) -> bool:
    """Whether the model's softmax has learned sink logits (`learned_sinks`)."""
    return learned_sinks(model) is not None


def learned_sink_note(model: Model, what: str) -> str | None:
    """One line a command prints about a model with learned sink logits: that it
    has them and what `what` (the command's own words) did with them; None for
    any other model."""
    if not has_learned_sinks(model):
        return None
    return f"note: {model.cfg.model_name or 'the model'} has learned sink logits (gpt-oss-style): {what}"


NO_LEARNED_SINKS = ("has no learned sink logits (only gpt-oss-style models, whose softmax has a learned "
                    "per-head sink column, do)")


def W_O(model: Model, layer: int | None = None) -> Tensor:
    """Output weights [layer head_index d_head d_model] (one layer: [head_index d_head d_model])."""
    w = model.W_O
    return w if layer is None else w[layer]


def W_V(model: Model, layer: int | None = None) -> Tensor:
    """Value weights [layer kv_head d_model d_head]: key/value heads not expanded
    (grouped-query attention; `sinkmech.hooks.expand_kv` maps query heads to them)."""
    if IS_BRIDGE:
        w = model.W_V
    else:
        w = torch.stack([b.attn._W_V if model.cfg.n_key_value_heads else b.attn.W_V for b in model.blocks])
    return w if layer is None else w[layer]


def b_V(model: Model, layer: int | None = None) -> Tensor:
    """Value biases [layer kv_head d_head]: zeros for a model without them."""
    if IS_BRIDGE:
        try:
            b = model.b_V
        except AttributeError:  # bias-free value projections (Llama, Gemma, ...)
            w = W_V(model)
            b = torch.zeros(w.shape[0], w.shape[1], w.shape[-1], dtype=w.dtype, device=w.device)
    else:
        b = torch.stack([bl.attn._b_V if model.cfg.n_key_value_heads else bl.attn.b_V for bl in model.blocks])
    return b if layer is None else b[layer]


def attn_scale(model: Model, layer: int) -> float:
    """What attention scores are divided by in `layer` (sqrt(d_head) unless the
    architecture says otherwise, e.g. Gemma's query_pre_attn_scalar)."""
    attn = model.blocks[layer].attn
    if IS_BRIDGE:
        hf = getattr(attn, "original_component", None)
        scaling = getattr(hf, "scaling", None)
        if scaling:
            return float(1.0 / scaling)
        return float(model.cfg.attn_scale)
    return float(attn.attn_scale)


def move(model: Model, device: str | torch.device | None = None, dtype: torch.dtype | None = None) -> Model:
    """The model on `device` in `dtype` (each only when given and different)."""
    if device is not None and str(model.cfg.device) != str(device):
        if IS_BRIDGE:
            model.to(device)
        else:
            model.to(device, print_details=False)
    if dtype is not None and next(model.parameters()).dtype != dtype:
        model.to(dtype)
        if hasattr(model.cfg, "dtype"):
            model.cfg.dtype = dtype
    return model


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def versions(device: str | None = None) -> dict[str, str]:
    """sinkmech, TransformerLens, torch, the backend and the default device."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return {
        "sinkmech": _version("sinkmech"),
        "transformer_lens": _version("transformer-lens"),
        "torch": torch.__version__,
        "backend": BACKEND,
        "device": device,
        "python": sys.version.split()[0],
    }


def version_text() -> str:
    """What `sinkmech --version` prints."""
    v = versions()
    return (f"sinkmech {v['sinkmech']} (TransformerLens {v['transformer_lens']}, torch {v['torch']}, "
            f"backend {v['backend']}, device {v['device']})")
