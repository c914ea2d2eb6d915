"""Query/key norm bands: the 2-norm of q and k per rotary frequency chunk.

Rotary embeddings rotate q and k in d_head/2 two-dimensional planes, one per
frequency; the rotation leaves each plane's norm unchanged, so the mean norm
of a chunk says how much a head uses that frequency (Barbero et al. 2024,
"Round and round we go"; Barbero et al. 2025, Section 3.2 on dormant heads).
The per-chunk share of the q.k logit says which bands carry the sink mode and
which the trigger mode.

Chunk i pairs dims (i, i + rotary_dim/2) in TransformerLens' default
rotate-half layout and (2i, 2i+1) when `cfg.rotary_adjacent_pairs`; it turns
at angle base^(-2i/rotary_dim) per position, so chunk 0 is the fastest.
Dims past `rotary_dim` (partial rotary) form one extra, unrotated band.
Non-rotary models get one band: the plain q/k norm.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor
from sinkmech.loading.backend import Model


@dataclass(frozen=True)
class BandLayout:
    """How a head's d_head dims split into norm bands."""

    index: Int[Tensor, "band 2"] | None  # the two dims of each rotary chunk
    rotary_dim: int
    d_head: int
    rotary: bool
    frequencies: Float[Tensor, " band"]  # radians per position; 0 for unrotated bands

    @property
    def n_bands(self) -> int:
        return len(self.frequencies)

    def labels(self) -> list[str]:
        if not self.rotary:
            return ["all"]
        names = [f"chunk{i}" for i in range(self.rotary_dim // 2)]
        return names + (["unrotated"] if self.rotary_dim < self.d_head else [])


def band_layout(model: Model) -> BandLayout:
    """The chunk layout of the model's q/k vectors (see the module docstring)."""
    cfg = model.cfg
    if cfg.positional_embedding_type != "rotary":
        return BandLayout(None, 0, cfg.d_head, False, torch.zeros(1))
    rd = int(cfg.rotary_dim or cfg.d_head)
    half = rd // 2
    i = torch.arange(half)
    if getattr(cfg, "rotary_adjacent_pairs", False):
        index = torch.stack([2 * i, 2 * i + 1], dim=-1)
    else:
        index = torch.stack([i, i + half], dim=-1)
    base = float(getattr(cfg, "rotary_base", 10000))
    freqs = base ** (-2.0 * i.double() / rd)
    if rd < cfg.d_head:
        freqs = torch.cat([freqs, torch.zeros(1, dtype=freqs.dtype)])
    return BandLayout(index, rd, cfg.d_head, True, freqs.float())


def band_products(
    layout: BandLayout, a: Float[Tensor, "*a d_head"], b: Float[Tensor, "*b d_head"]
) -> Float[Tensor, "*ab band"]:
    """Per-band dot products a_i . b_i (broadcasting over leading axes).
    With a = b this is the squared band norm."""
    prod = a * b
    if not layout.rotary:
        return prod.sum(-1, keepdim=True)
    idx = layout.index.to(prod.device)
    bands = prod[..., idx[:, 0]] + prod[..., idx[:, 1]]
    if layout.rotary_dim < layout.d_head:
        bands = torch.cat([bands, prod[..., layout.rotary_dim :].sum(-1, keepdim=True)], dim=-1)
    return bands


def band_norms(layout: BandLayout, x: Float[Tensor, "*shape d_head"]) -> Float[Tensor, "*shape band"]:
    """2-norm of each band of x."""
    return band_products(layout, x, x).clamp(min=0).sqrt()
