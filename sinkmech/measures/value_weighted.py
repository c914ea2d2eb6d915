"""Value-weighted attention on the first token (Kobayashi et al. 2020,
"Attention is not only a weight", Sec. 3: the norm ||alpha_ij f(x_j)||).

A sink head puts most attention weight on key 0 but, because the sink's value
is small, little of its *output* comes from it. Per (prompt, layer, head):
  - `attn_first`: alpha_0, the mean over real queries of A[t, 0] (as sinks.py);
  - `output_first`: the share of the head's value-weighted output that comes
    from key 0, summed over queries before dividing:
        sum_t ||A[t, 0] f(x_0)|| / sum_t sum_k ||A[t, k] f(x_k)||.
Since ||A f|| = A ||f||, this is sum_t A[t,0] n_0 / sum_t sum_k A[t,k] n_k with
n_k = ||f(x_k)||. `vector="output"` (default, Kobayashi's f) uses
f(x_k) = v_k W_O, the head's contribution to the residual stream (without the
shared bias b_O); `vector="value"` uses f(x_k) = v_k. Streamed: each layer is
reduced inside its hooks; padding never enters a sum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor

from sinkmech.loading.backend import W_O, Model
from sinkmech.hooks import act_name, expand_kv
from sinkmech.prompts import Bos, TokenBatch
from sinkmech.measures.sinks import first_key_score
from sinkmech.results import Result
from sinkmech.options import RunOptions
from sinkmech.readers import Reader

VectorKind = Literal["output", "value"]
VECTORS: tuple[str, ...] = ("output", "value")


@dataclass(frozen=True)
class ValueWeighted(Result):
    """First-token attention weight next to its share of the value-weighted output."""

    attn_first: Float[Tensor, "prompt layer head_index"]
    output_first: Float[Tensor, "prompt layer head_index"]
    lengths: Int[Tensor, " prompt"]
    vector: VectorKind
    bos: Bos
    model_name: str = ""

    def mean_attn_first(self) -> Float[Tensor, "layer head_index"]:
        return einops.reduce(self.attn_first, "prompt layer head_index -> layer head_index", "mean")

    def mean_output_first(self) -> Float[Tensor, "layer head_index"]:
        return einops.reduce(self.output_first, "prompt layer head_index -> layer head_index", "mean")

    def to_dataframe(self):
        """Long format: one row per (prompt, layer, head)."""
        import pandas as pd

        P, L, H = self.attn_first.shape
        p, l, h = torch.meshgrid(torch.arange(P), torch.arange(L), torch.arange(H), indexing="ij")
        return pd.DataFrame(
            {
                "bos": self.bos, "vector": self.vector,
                "prompt": p.flatten().numpy(), "layer": l.flatten().numpy(), "head": h.flatten().numpy(),
                "attn_first": self.attn_first.flatten().numpy(),
                "output_first": self.output_first.flatten().numpy(),
            }
        )

    def to_dict(self) -> dict:
        """Means over prompts, [layer][head]."""
        return {
            "model": self.model_name,
            "bos": self.bos,
            "vector": self.vector,
            "n_prompts": int(self.attn_first.shape[0]),
            "attn_first": self.mean_attn_first().tolist(),
            "output_first": self.mean_output_first().tolist(),
        }


def vector_norms(
    model: Model, v: Float[Tensor, "batch pos kv_head d_head"], layer: int, vector: VectorKind
) -> Float[Tensor, "batch pos head_index"]:
    """||f(x_k)|| per key and query head: ||v_k W_O|| ("output") or ||v_k|| ("value")."""
    v = expand_kv(model, v)
    if vector == "value":
        return v.float().norm(dim=-1)
    out = einops.einsum(v.float(), W_O(model, layer).float(), "b p h d, h d m -> b p h m")
    return out.norm(dim=-1)


def value_weighted_first(
    model: Model,
    batch: TokenBatch,
    *,
    vector: VectorKind = "output",
    options: RunOptions = RunOptions(),
    reader: Reader | None = None,
) -> ValueWeighted:
    """alpha_0 and the first token's share of the value-weighted output, per head.

    Args:
        model: a HookedTransformer or TransformerBridge (grouped-query attention included).
        batch: right-padded tokens (one `<bos>` condition).
        vector: "output" (||v W_O||, Kobayashi's f) or "value" (||v||).
        options: batch size (default 16 prompts per forward pass), progress bar.
        reader: `value_weighted_reader(model, batch, vector=...)` filled by another
            pass it rode (`sinkmech.readers`); then no pass of its own runs.

    Returns:
        ValueWeighted with [prompt, layer, head_index] tensors.
    """
    reader = (value_weighted_reader(model, batch, vector=vector) if reader is None
              else reader.filled(batch, vector=vector))
    return reader.read(model, options)


def value_weighted_reader(model: Model, batch: TokenBatch, *, vector: VectorKind = "output") -> Reader:
    """What `value_weighted_first` reads from each chunk of its passes (`sinkmech.readers`)."""
    if vector not in VECTORS:
        raise ValueError(f"vector must be one of {VECTORS}, got {vector!r}")
    cfg = model.cfg
    P, L, H = len(batch), cfg.n_layers, cfg.n_heads
    attn_first, output_first = torch.zeros(P, L, H), torch.zeros(P, L, H)

    def hooks(rows: slice, part: TokenBatch) -> list:
        valid = part.mask.float()  # [batch, pos]
        norms: dict[int, Tensor] = {}

        def v_hook(v, hook):
            # The v hook fires before the pattern hook of the same layer.
            norms[hook.layer()] = vector_norms(model, v, hook.layer(), vector) * valid[:, :, None]

        def pattern_hook(pattern, hook):
            l = hook.layer()
            n = norms.pop(l)  # [batch, key, head]
            p = pattern.float() * valid[:, None, :, None]  # padding queries out
            first = einops.einsum(p[..., 0], n[:, 0], "b h q, b h -> b h")
            total = einops.einsum(p, n, "b h q k, b k h -> b h")
            output_first[rows, l] = (first / total.clamp(min=1e-30)).cpu()
            attn_first[rows, l] = first_key_score(pattern, part.lengths).cpu()

        return [h for l in range(L) for h in ((act_name("v", l), v_hook), (act_name("pattern", l), pattern_hook))]

    def finish() -> ValueWeighted:
        return ValueWeighted(attn_first=attn_first, output_first=output_first, lengths=batch.lengths.cpu(),
                             vector=vector, bos=batch.bos, model_name=cfg.model_name)

    return Reader(batch, hooks, finish, desc=f"value-weighted (bos={batch.bos})", settings={"vector": vector})
