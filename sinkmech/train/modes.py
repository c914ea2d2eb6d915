"""Where attention goes in a trained model (Guo et al. 2024, "Active-dormant
attention heads"; Barbero et al. 2025, Sec. 3.2).

On bigram-backcopy data the token after a trigger is a copy of the token just
before the trigger, so a query at a trigger needs the previous key (the copy
source); every other query needs no attention at all. Per head and query
class (trigger queries, the others; on text every query is "all"), the mean
attention on five disjoint groups of keys, which sum to 1:

- `first`: key 0 (`<bos>` when it is prepended);
- `self`: key q, the query's own token;
- `prev`: key q-1 (for a trigger query this *is* the copy source);
- `copy`: any other key holding the token the query must predict (an
  induction-style copy source; on bigram-backcopy non-trigger queries this is
  chance);
- `rest`: everything else;

and the normalised entropy of the attention row (entropy / log(keys visible):
0 for one key, 1 for uniform). An if-else head puts trigger queries on `prev`
and the others on `first`; a head whose non-trigger queries sit on `self` uses
its own token as the no-op instead of a sink.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from sinkmech.hooks import act_name
from sinkmech.loading.backend import Model

GROUPS = ("first", "self", "prev", "copy", "rest")
STATS = (*GROUPS, "entropy")
FIRST_QUERY = 2  # queries from position 2 on: the previous key is never key 0


@dataclass(frozen=True)
class AttentionBreakdown:
    """Per query class, per statistic, a [layer][head] table of means over queries."""

    classes: dict[str, dict[str, Float[Tensor, "layer head_index"]]]  # class -> stat -> [L, H]
    counts: dict[str, int]  # class -> queries counted

    def to_dict(self) -> dict:
        """{"<class>": {"first"|"self"|"prev"|"copy"|"rest"|"entropy": [[...]]},
        "counts": {"<class>": n}}."""
        out: dict = {c: {k: v.tolist() for k, v in stats.items()} for c, stats in self.classes.items()}
        out["counts"] = dict(self.counts)
        return out


@torch.no_grad()
def attention_breakdown(
    model: Model,
    tokens: Int[Tensor, "batch pos"],
    classes: dict[str, Bool[Tensor, "batch pos"]],
) -> AttentionBreakdown:
    """Mean attention per (layer, head) on the five key groups, and the
    normalised entropy, for each query class.

    Args:
        model: any HookedTransformer.
        tokens: whole prompts, `<bos>` included if wanted (no padding).
        classes: name -> [batch, pos] mask of the queries in the class. Only
            queries in 2..pos-2 are counted (a previous key that is not key 0,
            and a next token to define the copy source); a class with no such
            query is left out.
    """
    P = tokens.shape[1]
    if P < FIRST_QUERY + 2:
        raise ValueError(f"need prompts of at least {FIRST_QUERY + 2} tokens, got {P}")
    L, H = model.cfg.n_layers, model.cfg.n_heads
    q = torch.arange(FIRST_QUERY, P - 1)
    masks = {c: m[:, q].float() for c, m in classes.items() if m[:, q].any()}
    if not masks:
        raise ValueError("no query class has a query in positions 2..pos-2")
    # Keys holding the token to predict, other than key 0, q and q-1: [batch, query, key].
    target = tokens[:, q + 1]
    keys = torch.arange(P)
    copy = (tokens[:, None, :] == target[:, :, None]) & (keys[None, None, :] <= q[None, :, None])
    copy &= (keys[None, None, :] != 0) & (keys[None, None, :] != q[None, :, None])
    copy &= keys[None, None, :] != (q - 1)[None, :, None]
    copy = copy.float()
    log_keys = torch.log((q + 1).float())  # keys visible to query q
    out = {c: {k: torch.zeros(L, H) for k in STATS} for c in masks}

    def hook(pattern: Float[Tensor, "batch head_index query_pos key_pos"], hook):
        p = pattern[:, :, q].float().cpu()  # [batch, head, query, key]
        parts = {
            "first": p[..., 0],
            "self": p[:, :, torch.arange(len(q)), q],
            "prev": p[:, :, torch.arange(len(q)), q - 1],
            "copy": (p * copy[:, None]).sum(-1),
        }
        parts["rest"] = 1.0 - parts["first"] - parts["self"] - parts["prev"] - parts["copy"]
        ent = -(p * torch.log(p.clamp(min=1e-12))).sum(-1) / log_keys
        parts["entropy"] = ent
        for c, m in masks.items():
            w = m[:, None, :]
            for k, v in parts.items():
                out[c][k][hook.layer()] = (v * w).sum((0, 2)) / w.sum((0, 2))

    model.run_with_hooks(tokens.to(model.cfg.device), fwd_hooks=[(act_name("pattern", l), hook) for l in range(L)],
                         stop_at_layer=L)
    return AttentionBreakdown(classes=out, counts={c: int(m.sum()) for c, m in masks.items()})


def trigger_classes(tokens: Int[Tensor, "batch pos"], *, n_triggers: int) -> dict[str, Bool[Tensor, "batch pos"]]:
    """Bigram-backcopy query classes: a trigger token (ids < n_triggers) or not."""
    trig = tokens < n_triggers
    return {"trigger": trig, "other": ~trig}


@dataclass(frozen=True)
class ModeAttention:
    """Mean attention per (layer, head) on trigger queries and on the others
    (the `AttentionBreakdown` of the two classes, flattened to
    `<class>_<stat>`, e.g. `trigger_prev`, `other_first`, `other_entropy`)."""

    tables: dict[str, Float[Tensor, "layer head_index"]]
    n_trigger: int  # queries counted
    n_other: int

    def __getattr__(self, name: str):
        tables = self.__dict__.get("tables", {})
        if name in tables:
            return tables[name]
        raise AttributeError(name)

    def to_dict(self) -> dict:
        return {**{k: v.tolist() for k, v in self.tables.items()}, "n_trigger": self.n_trigger,
                "n_other": self.n_other}


@torch.no_grad()
def mode_attention(
    model: Model, tokens: Int[Tensor, "batch pos"], *, n_triggers: int
) -> ModeAttention:
    """Per-head attention on the first key, self, the previous key (the copy
    source of a trigger query), other copies of the next token and the rest,
    with the normalised entropy, split by whether the query token is a
    trigger (ids < `n_triggers`).

    Args:
        model: a model trained on bigram-backcopy data.
        tokens: whole prompts, `<bos>` included if wanted (no padding); queries
            at positions 2..pos-2 are counted.
    """
    if tokens.shape[1] < FIRST_QUERY + 2:
        raise ValueError(f"need prompts of at least {FIRST_QUERY + 2} tokens, got {tokens.shape[1]}")
    classes = trigger_classes(tokens, n_triggers=n_triggers)
    inner = slice(FIRST_QUERY, tokens.shape[1] - 1)
    trig = classes["trigger"][:, inner]
    if not trig.any() or trig.all():
        raise ValueError("the prompts need both trigger and non-trigger queries")
    b = attention_breakdown(model, tokens, classes)
    tables = {f"{c}_{k}": v for c, stats in b.classes.items() for k, v in stats.items()}
    return ModeAttention(tables=tables, n_trigger=b.counts["trigger"], n_other=b.counts["other"])

