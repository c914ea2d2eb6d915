"""The small models trained from scratch and their loss: `build_model` (a
HookedTransformer for a `TrainConfig`, built through the model seam's
`model_from_config`, with the `mask_self` hook and the
frozen zero positions of `positional="none"`), the packing hooks, and the
next-token loss of a packed window."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from sinkmech.hooks import act_name
from sinkmech.loading.backend import Model, model_from_config
from sinkmech.train.config import Packing, TrainConfig
from sinkmech.train.data import same_document


def build_model(cfg: TrainConfig, device: str | None = None) -> Model:
    """A freshly initialised HookedTransformer for `cfg` (no tokenizer; d_vocab =
    content tokens + `<bos>` + pad)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = model_from_config(
        n_layers=cfg.n_layers,
        d_model=cfg.d_model,
        n_heads=cfg.n_heads,
        d_head=cfg.d_model // cfg.n_heads,
        d_mlp=cfg.d_mlp or 4 * cfg.d_model,
        n_ctx=cfg.context_length,
        d_vocab=cfg.vocab + 2,
        act_fn="gelu",
        normalization_type="LN",
        positional_embedding_type="standard" if cfg.positional == "none" else cfg.positional,
        default_prepend_bos=False,
        model_name=f"{cfg.data}-{cfg.run_name}",
        seed=cfg.seed,
        device=device,
    )
    if cfg.mask_self:
        for layer in range(cfg.n_layers):
            model.add_hook(act_name("attn_scores", layer), mask_self_hook, is_permanent=True)
    if cfg.positional == "none":
        with torch.no_grad():
            model.pos_embed.W_pos.zero_()
        model.pos_embed.W_pos.requires_grad_(False)
    return model


def mask_self_hook(scores: Float[Tensor, "batch head_index query_pos key_pos"], hook):
    """On `attn_scores`: -inf on every query's own key, for queries >= 1 (query
    0 sees only itself). Returns a new tensor (never edits the activation)."""
    n = scores.shape[-1]
    diag = torch.eye(n, dtype=torch.bool, device=scores.device)
    diag[0, 0] = False
    return scores.masked_fill(diag, float("-inf"))


def intra_doc_hook(allowed: Bool[Tensor, "batch query_pos key_pos"]) -> Callable:
    """On `attn_scores`: -inf where query and key are in different documents.
    Returns a new tensor (never edits the activation)."""

    def hook(scores: Float[Tensor, "batch head_index query_pos key_pos"], hook):
        return scores.masked_fill(~allowed[:, None].to(scores.device), float("-inf"))

    return hook


def packing_hooks(tokens: Tensor, *, packing: Packing, bos_id: int, fixed_bos: bool) -> list:
    """The forward hooks a packing recipe needs on `tokens` (none for causal)."""
    if packing == "causal":
        return []
    allowed = same_document(tokens.cpu(), bos_id=bos_id, fixed_bos=fixed_bos)
    return [(lambda name: name.endswith("attn_scores"), intra_doc_hook(allowed))]


def packed_token_losses(
    model: Model,
    inputs: Int[Tensor, "batch pos"],
    targets: Int[Tensor, "batch pos"],
    *,
    packing: Packing,
    bos_id: int,
    fixed_bos: bool,
) -> Float[Tensor, "batch pos"]:
    """Next-token cross-entropy (nats) at every position of a packed training
    window, against explicit `targets`, under the run's packing (intra-document
    masking when asked); with gradients. Not `sinkmech.measures.loss.token_losses`, which
    scores a prompt's own next tokens without gradients."""
    device = model.cfg.device
    hooks = packing_hooks(inputs, packing=packing, bos_id=bos_id, fixed_bos=fixed_bos)
    with model.hooks(fwd_hooks=hooks):
        logits = model(inputs.to(device), return_type="logits")
    flat = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1).to(device), reduction="none")
    return flat.reshape(targets.shape)
