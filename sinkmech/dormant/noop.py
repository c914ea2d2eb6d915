"""The no-op check of a dormant head (Guo et al. 2024; Barbero et al. 2025, Sec. 3.2).

Force the head to put all of its attention on the first token, once on the
queries where it was dormant anyway and once on the queries where it was
active, and compare next-token loss with the clean run. For a true if-else
head the first costs almost nothing (its resting mode is an approximate
no-op) and the second clearly more. Because dormant queries usually far
outnumber active ones, the cost is also given per forced query, with a
bootstrap confidence interval over prompts (prompts resampled with
replacement; the per-query cost is summed loss change / forced queries of the
resample), since queries of one prompt are not independent.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Sequence

import torch
from jaxtyping import Bool, Float
from torch import Tensor
from tqdm.auto import tqdm

from sinkmech.backend import Model
from sinkmech.dormant.scan import as_token_batch
from sinkmech.hooks import act_name, all_to_first_hook, check_head
from sinkmech.loss import token_losses
from sinkmech.prompts import Bos, PromptSource, TokenBatch


@dataclass(frozen=True)
class NoopResult:
    """Loss changes (intervened - clean, nats) of forcing one head onto the first token."""

    layer: int
    head: int
    n_dormant: int  # queries forced in the dormant condition
    n_active: int
    delta_loss_dormant: float  # mean over all predicted tokens
    delta_loss_active: float
    per_query_dormant: float | None  # summed loss change / forced queries
    per_query_active: float | None
    per_query_dormant_ci: tuple[float, float] | None = None  # bootstrap interval over prompts (NoopCheck.ci_level)
    per_query_active_ci: tuple[float, float] | None = None
    n_prompts_dormant: int = 0  # prompts with at least one forced query
    n_prompts_active: int = 0

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("per_query_dormant_ci", "per_query_active_ci"):
            d[k] = None if d[k] is None else list(d[k])
        return d


@dataclass(frozen=True)
class NoopCheck:
    results: tuple[NoopResult, ...]
    loss_clean: float  # mean next-token loss of the clean run
    n_tokens: int  # predicted tokens the means run over
    bos: Bos
    high: float
    low: float
    ci_level: float = 0.95
    n_boot: int = 1000

    def to_dataframe(self):
        import pandas as pd

        return pd.DataFrame([r.to_dict() for r in self.results])

    def to_json(self) -> str:
        return json.dumps({"loss_clean": self.loss_clean, "n_tokens": self.n_tokens, "bos": self.bos,
                           "high": self.high, "low": self.low, "ci_level": self.ci_level, "n_boot": self.n_boot,
                           "heads": [r.to_dict() for r in self.results]})


def noop_heads(scan, n_candidates: int) -> list[tuple[int, int]]:
    """The heads a no-op check should cover: every head the scan (a HeadScan)
    labels if_else, then the `n_candidates` best-ranked heads that are not
    (the closest candidates); [] for 0."""
    if n_candidates < 1:
        return []
    found = scan.if_else_heads()
    return found + [hd for hd in scan.ranked() if hd not in found][:n_candidates]


def noop_check(
    model: Model,
    tokens: TokenBatch | PromptSource,
    heads: Sequence[tuple[int, int]],
    *,
    bos: Bos | None = None,
    max_tokens: int | None = None,
    batch_size: int = 16,
    bos_token_id: int | None = None,
    high: float = 0.8,
    low: float = 0.2,
    ci_level: float = 0.95,
    n_boot: int = 1000,
    seed: int = 0,
    progress: bool = True,
) -> NoopCheck:
    """Loss change of forcing each head onto the first token on its dormant
    (first-token attention >= high) and on its active (<= low) queries.

    Args:
        model: a HookedTransformer or a TransformerBridge (`sinkmech.backend`).
        tokens: a `TokenBatch`, or prompts (`sinkmech.prompts.load_prompts`)
            tokenized once with `bos` (default "prepend"), `max_tokens`
            (default 64) and `bos_token_id`; see `scan.as_token_batch`.
        heads: (layer, head) pairs, e.g. `scan.if_else_heads()`.
        high, low: the query-mode thresholds (use the scan's).
        ci_level, n_boot, seed: the bootstrap interval of the per-query costs
            (percentile interval over `n_boot` resamples of the prompts).

    Returns:
        NoopCheck with one NoopResult per head, in the given order.
    """
    if not 0.0 <= low < high <= 1.0:
        raise ValueError(f"thresholds out of order: need 0 <= low < high <= 1, got low={low}, high={high}")
    if not 0.0 < ci_level < 1.0 or n_boot < 1:
        raise ValueError(f"need 0 < ci_level < 1 and n_boot >= 1, got {ci_level}, {n_boot}")
    for layer, head in heads:
        check_head(model, layer, head)
    batch, _ = as_token_batch(model, tokens, bos=bos, max_tokens=max_tokens, bos_token_id=bos_token_id)
    heads = [(int(l), int(h)) for l, h in heads]
    sums = {lh: {"n_dormant": 0, "n_active": 0, "dormant": 0.0, "active": 0.0} for lh in heads}
    # per prompt: summed loss change and forced queries, for the bootstrap
    per_prompt = {lh: {m: (torch.zeros(len(batch)), torch.zeros(len(batch))) for m in ("dormant", "active")} for lh in heads}
    loss_sum, n_tokens = 0.0, 0
    layers = sorted({l for l, _ in heads})
    for rows, part in tqdm(batch.batches(batch_size), desc="no-op check", disable=not progress, unit="batch"):
        first: dict[int, Tensor] = {}

        def keep(pattern, hook):
            first[hook.layer()] = pattern[..., 0].clone()  # [batch, head, query]

        clean = _loss(model, part.tokens, [(act_name("pattern", l), keep) for l in layers])
        valid_loss = torch.arange(clean.shape[1], device=clean.device)[None, :] < (part.lengths[:, None] - 1)
        loss_sum += float(clean[valid_loss].sum())
        n_tokens += int(valid_loss.sum())
        valid_q = part.mask.clone()
        valid_q[:, 0] = False
        for lh in heads:
            layer, head = lh
            dormant, active = force_mask(first[layer][:, head], valid_q, high=high, low=low)
            for mode, queries in (("dormant", dormant), ("active", active)):
                n = int(queries.sum())
                if n == 0:
                    continue
                hooked = _loss(model, part.tokens, [(act_name("pattern", layer), all_to_first_hook(head, queries))])
                delta = torch.where(valid_loss, hooked - clean, torch.zeros_like(clean)).sum(1)
                sums[lh][mode] += float(delta.sum())
                sums[lh]["n_" + mode] += n
                d_sum, q_sum = per_prompt[lh][mode]
                d_sum[rows] += delta.float().cpu()
                q_sum[rows] += queries.sum(1).float().cpu()
    if n_tokens == 0:
        raise ValueError("no next-token predictions: every prompt has a single token")
    g = torch.Generator().manual_seed(seed)
    resample = torch.randint(0, len(batch), (n_boot, len(batch)), generator=g)
    ci = {lh: {m: bootstrap_ratio_ci(*per_prompt[lh][m], resample, ci_level) for m in ("dormant", "active")}
          for lh in heads}
    results = tuple(
        NoopResult(
            layer=l, head=h, n_dormant=s["n_dormant"], n_active=s["n_active"],
            delta_loss_dormant=s["dormant"] / n_tokens, delta_loss_active=s["active"] / n_tokens,
            per_query_dormant=s["dormant"] / s["n_dormant"] if s["n_dormant"] else None,
            per_query_active=s["active"] / s["n_active"] if s["n_active"] else None,
            per_query_dormant_ci=ci[(l, h)]["dormant"], per_query_active_ci=ci[(l, h)]["active"],
            n_prompts_dormant=int((per_prompt[(l, h)]["dormant"][1] > 0).sum()),
            n_prompts_active=int((per_prompt[(l, h)]["active"][1] > 0).sum()),
        )
        for (l, h), s in sums.items()
    )
    return NoopCheck(results, loss_sum / n_tokens, n_tokens, batch.bos, high, low, ci_level, n_boot)


def bootstrap_ratio_ci(
    delta: Float[Tensor, " prompt"], queries: Float[Tensor, " prompt"], resample: Tensor, level: float
) -> tuple[float, float] | None:
    """Percentile interval of sum(delta) / sum(queries) over resamples of the
    prompts (`resample`: [n_boot, prompt] indices); resamples without a forced
    query are dropped. None when no prompt has a forced query."""
    if float(queries.sum()) == 0:
        return None
    d, q = delta.double()[resample].sum(1), queries.double()[resample].sum(1)
    ratio = (d / q)[q > 0]
    lo, hi = torch.quantile(ratio, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=ratio.dtype)).tolist()
    return (lo, hi)


def _loss(model: Model, tokens: Tensor, hooks: list) -> Float[Tensor, "batch pos_minus_1"]:
    # unembedded in chunks: Gemma's 262k vocabulary makes full logits ~1 GB a batch
    return token_losses(model, tokens, hooks).to(tokens.device)


def force_mask(first: Float[Tensor, "batch query_pos"], valid: Bool[Tensor, "batch query_pos"], *,
               high: float, low: float) -> tuple[Tensor, Tensor]:
    """(dormant, active) query masks from first-token attention."""
    return (first >= high) & valid, (first <= low) & valid
