"""Active and dormant attention of a model trained on bigram-backcopy data
(Guo et al. 2024, "Active-dormant attention heads"; Barbero et al. 2025, Sec. 3.2).

After a trigger the next token is a copy of the token just before the trigger,
so a query at a trigger needs the previous key (the copy source); every other
query needs no attention at all. Per head, the mean attention on the first key
and on the previous key, on trigger queries and on the others: an if-else head
puts the first on the previous key and the second on the sink.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from sinkmech.hooks import act_name


@dataclass(frozen=True)
class ModeAttention:
    """Mean attention per (layer, head) on trigger queries and on the others."""

    trigger_first: Float[Tensor, "layer head_index"]  # on key 0 (<bos> when prepended)
    trigger_prev: Float[Tensor, "layer head_index"]  # on key q-1, the copy source
    other_first: Float[Tensor, "layer head_index"]
    other_prev: Float[Tensor, "layer head_index"]
    n_trigger: int  # queries counted
    n_other: int

    def to_dict(self) -> dict:
        return {k: (v.tolist() if isinstance(v, Tensor) else v) for k, v in self.__dict__.items()}


@torch.no_grad()
def mode_attention(
    model: HookedTransformer, tokens: Int[Tensor, "batch pos"], *, n_triggers: int
) -> ModeAttention:
    """Per-head attention on the first key and on the previous key, split by
    whether the query token is a trigger (ids < `n_triggers`).

    Args:
        model: a model trained on bigram-backcopy data.
        tokens: whole prompts, `<bos>` included if wanted (no padding); queries
            at positions >= 2 are counted, so the previous key is never key 0.
    """
    if tokens.shape[1] < 3:
        raise ValueError(f"need prompts of at least 3 tokens, got {tokens.shape[1]}")
    L, H = model.cfg.n_layers, model.cfg.n_heads
    q = torch.arange(2, tokens.shape[1])
    trig = (tokens[:, q] < n_triggers).to(model.cfg.device)  # [batch, query]
    if not trig.any() or trig.all():
        raise ValueError("the prompts need both trigger and non-trigger queries")
    out = {k: torch.zeros(L, H) for k in ("trigger_first", "trigger_prev", "other_first", "other_prev")}

    def hook(pattern: Float[Tensor, "batch head_index query_pos key_pos"], hook):
        first = pattern[:, :, q, 0]  # [batch, head, query]
        prev = pattern[:, :, q, q - 1]
        for mode, mask in (("trigger", trig), ("other", ~trig)):
            m = mask[:, None, :].float()
            out[f"{mode}_first"][hook.layer()] = ((first * m).sum((0, 2)) / m.sum((0, 2))).cpu()
            out[f"{mode}_prev"][hook.layer()] = ((prev * m).sum((0, 2)) / m.sum((0, 2))).cpu()

    model.run_with_hooks(tokens.to(model.cfg.device), fwd_hooks=[(act_name("pattern", l), hook) for l in range(L)],
                         stop_at_layer=L)
    return ModeAttention(**out, n_trigger=int(trig.sum()), n_other=int((~trig).sum()))
