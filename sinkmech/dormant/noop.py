"""The no-op check of a dormant head (Guo et al. 2024; Barbero et al. 2025, Sec. 3.2).

Two interventions, each on the queries where the head was dormant and,
separately, on those where it was active, against the clean run's
next-token loss:
- *move to first*: the head puts all of its attention on the first token;
  on dormant queries (already >= `high` there) this can only change a little
  by construction;
- *zero out* (Guo et al.'s ablation): the head's output z is set to 0. If
  resting is a no-op, zeroing a resting head costs nothing either.
For a true if-else head both cost ~nothing on dormant queries and clearly more
on active ones. Dormant queries usually far outnumber active ones, so each
cost is given per intervened query, with a bootstrap interval over prompts
(prompts resampled with replacement; per-query cost = summed loss change /
intervened queries of the resample), since queries of one prompt are not
independent. Run it on prompts that did not choose the head or its trigger
(`sinkmech.dormant.discover`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import torch
from jaxtyping import Bool, Float
from torch import Tensor
from tqdm.auto import tqdm

from sinkmech.backend import Model
from sinkmech.hooks import act_name, all_to_first_hook, cached_run, check_head, run, zero_head_hook
from sinkmech.loss import UNEMBED_ROWS, next_token_nll, nll_chunks, token_losses
from sinkmech.prompts import Bos, PromptSource, TokenBatch, as_batch
from sinkmech.results import Result
from sinkmech.stats import bootstrap_ratio_ci, resamples


INTERVENTIONS = ("move_to_first", "zero_out")
METHODS = ("restart", "full")


@dataclass(frozen=True)
class NoopResult:
    """Loss changes (intervened - clean, nats) of intervening on one head: the
    `per_query_*` fields move it onto the first token, the `zero_*` fields
    zero its output (each on its dormant and on its active queries)."""

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
    zero_dormant: float | None = None  # zero-out, summed loss change / zeroed queries
    zero_active: float | None = None
    zero_dormant_ci: tuple[float, float] | None = None
    zero_active_ci: tuple[float, float] | None = None

    def effects(self) -> dict[str, tuple[float | None, tuple[float, float] | None]]:
        """(per-query effect, interval) by `<intervention>_<mode>`."""
        return {"move_to_first_dormant": (self.per_query_dormant, self.per_query_dormant_ci),
                "move_to_first_active": (self.per_query_active, self.per_query_active_ci),
                "zero_out_dormant": (self.zero_dormant, self.zero_dormant_ci),
                "zero_out_active": (self.zero_active, self.zero_active_ci)}

    def detectable(self) -> dict[str, bool | None]:
        """Per effect: does its interval exclude zero (None: no interval)."""
        return {k: None if ci is None else not ci[0] <= 0.0 <= ci[1] for k, (_, ci) in self.effects().items()}

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("per_query_dormant_ci", "per_query_active_ci", "zero_dormant_ci", "zero_active_ci"):
            d[k] = None if d[k] is None else list(d[k])
        d["detectable"] = self.detectable()
        return d


@dataclass(frozen=True)
class NoopCheck(Result):
    results: tuple[NoopResult, ...]
    loss_clean: float  # mean next-token loss of the clean run
    n_tokens: int  # predicted tokens the means run over
    bos: Bos
    high: float
    low: float
    ci_level: float = 0.95
    n_boot: int = 1000
    prompt_indices: tuple[int, ...] | None = None  # which prompts of the corpus it ran on, when known

    def to_dataframe(self):
        import pandas as pd

        return pd.DataFrame([r.to_dict() for r in self.results])

    def to_dict(self) -> dict:
        return {"loss_clean": self.loss_clean, "n_tokens": self.n_tokens, "bos": self.bos,
                "high": self.high, "low": self.low, "ci_level": self.ci_level, "n_boot": self.n_boot,
                "prompt_indices": None if self.prompt_indices is None else list(self.prompt_indices),
                "heads": [r.to_dict() for r in self.results]}


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
    prompt_indices: Sequence[int] | None = None,
    method: str = "restart",
    progress: bool = True,
) -> NoopCheck:
    """Loss change of forcing each head onto the first token on its dormant
    (first-token attention >= high) and on its active (<= low) queries.

    Args:
        model: a HookedTransformer or a TransformerBridge (`sinkmech.backend`).
        tokens: a `TokenBatch`, or prompts (`sinkmech.prompts.load_prompts`)
            tokenized once with `bos` (default "prepend"), `max_tokens`
            (default 64) and `bos_token_id`; see `sinkmech.prompts.as_batch`.
        heads: (layer, head) pairs, e.g. `scan.if_else_heads()`.
        high, low: the query-mode thresholds (use the scan's).
        ci_level, n_boot, seed: the bootstrap interval of the per-query costs
            (percentile interval over `n_boot` resamples of the prompts).
        prompt_indices: where these prompts sit in a larger corpus (recorded
            only, so a reader can check they are disjoint from the scan's).
        method: "restart" (default) restarts each intervened pass at the
            head's layer from the clean residual and unembeds only the
            positions it can change; "full", the reference, runs a whole
            forward pass per intervention and scores every position. Equal up
            to float rounding (tests; `scripts/bench_noop.py` times both).

    Returns:
        NoopCheck with one NoopResult per head, in the given order.
    """
    if not 0.0 <= low < high <= 1.0:
        raise ValueError(f"thresholds out of order: need 0 <= low < high <= 1, got low={low}, high={high}")
    if not 0.0 < ci_level < 1.0 or n_boot < 1:
        raise ValueError(f"need 0 < ci_level < 1 and n_boot >= 1, got {ci_level}, {n_boot}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    change = _loss_change if method == "restart" else _full_loss_change
    for layer, head in heads:
        check_head(model, layer, head)
    batch = as_batch(model, tokens, bos=bos, default="prepend", max_tokens=max_tokens, bos_token_id=bos_token_id)
    heads = [(int(l), int(h)) for l, h in heads]
    sums = {lh: {"n_dormant": 0, "n_active": 0, "dormant": 0.0, "active": 0.0} for lh in heads}
    # per prompt: summed loss change and intervened queries, for the bootstrap
    keys = [(i, m) for i in INTERVENTIONS for m in ("dormant", "active")]
    per_prompt = {lh: {k: (torch.zeros(len(batch)), torch.zeros(len(batch))) for k in keys} for lh in heads}
    loss_sum, n_tokens = 0.0, 0
    layers = sorted({l for l, _ in heads})
    for rows, part in tqdm(batch.batches(batch_size), desc="no-op check", disable=not progress, unit="batch"):
        first: dict[int, Tensor] = {}

        def keep(pattern, hook):
            first[hook.layer()] = pattern[..., 0].clone()  # [batch, head, query]

        clean, starts = _clean_run(model, part.tokens, layers, [(act_name("pattern", l), keep) for l in layers])
        valid_loss = torch.arange(clean.shape[1])[None, :] < (part.lengths.cpu()[:, None] - 1)
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
                for how, hook in (("move_to_first", (act_name("pattern", layer), all_to_first_hook(head, queries))),
                                  ("zero_out", (act_name("z", layer), zero_head_hook(head, queries)))):
                    delta = change(model, part.tokens, starts[layer], layer, hook, queries, clean, valid_loss)
                    if how == "move_to_first":
                        sums[lh][mode] += float(delta.sum())
                        sums[lh]["n_" + mode] += n
                    d_sum, q_sum = per_prompt[lh][(how, mode)]
                    d_sum[rows] += delta.float().cpu()
                    q_sum[rows] += queries.sum(1).float().cpu()
    if n_tokens == 0:
        raise ValueError("no next-token predictions: every prompt has a single token")
    resample = resamples(len(batch), n_boot=n_boot, seed=seed)
    ci = {lh: {k: bootstrap_ratio_ci(*per_prompt[lh][k], resample, ci_level) for k in keys} for lh in heads}

    def ratio(lh, k) -> float | None:
        d, q = per_prompt[lh][k]
        return float(d.double().sum() / q.double().sum()) if float(q.sum()) > 0 else None

    results = tuple(
        NoopResult(
            layer=l, head=h, n_dormant=s["n_dormant"], n_active=s["n_active"],
            delta_loss_dormant=s["dormant"] / n_tokens, delta_loss_active=s["active"] / n_tokens,
            per_query_dormant=s["dormant"] / s["n_dormant"] if s["n_dormant"] else None,
            per_query_active=s["active"] / s["n_active"] if s["n_active"] else None,
            per_query_dormant_ci=ci[(l, h)][("move_to_first", "dormant")],
            per_query_active_ci=ci[(l, h)][("move_to_first", "active")],
            n_prompts_dormant=int((per_prompt[(l, h)][("move_to_first", "dormant")][1] > 0).sum()),
            n_prompts_active=int((per_prompt[(l, h)][("move_to_first", "active")][1] > 0).sum()),
            zero_dormant=ratio((l, h), ("zero_out", "dormant")), zero_active=ratio((l, h), ("zero_out", "active")),
            zero_dormant_ci=ci[(l, h)][("zero_out", "dormant")], zero_active_ci=ci[(l, h)][("zero_out", "active")],
        )
        for (l, h), s in sums.items()
    )
    return NoopCheck(results, loss_sum / n_tokens, n_tokens, batch.bos, high, low, ci_level, n_boot,
                     None if prompt_indices is None else tuple(int(i) for i in prompt_indices))


def _clean_run(model: Model, tokens: Tensor, layers: Sequence[int], fwd_hooks: list
               ) -> tuple[Float[Tensor, "batch pos_minus_1"], dict[int, Tensor]]:
    """The clean run's next-token losses at every position, and the residual
    stream entering each of `layers` (where an intervention's pass restarts)."""
    names = {l: act_name("resid_pre", l) for l in layers}
    last = act_name("resid_post", model.cfg.n_layers - 1)
    _, cache = cached_run(model, tokens, [*names.values(), last], fwd_hooks, stop_at_layer=model.cfg.n_layers)
    clean = torch.zeros(tokens.shape[0], tokens.shape[1] - 1)
    for a, b, nll in nll_chunks(model, cache[last], tokens, None):
        clean[:, a:b] = nll.float().cpu()
    return clean, {l: cache[n] for l, n in names.items()}


def _loss_change(model: Model, tokens: Tensor, start: Tensor, layer: int, hook, queries: Bool[Tensor, "batch pos"],
                 clean: Tensor, valid: Tensor) -> Float[Tensor, " batch"]:
    """Summed next-token loss change (intervened - clean) per prompt, over the
    `valid` positions. The pass restarts at `layer` from the clean residual
    (nothing before it can change), and only the positions at or after a
    prompt's first intervened query are unembedded: causal attention leaves
    the earlier ones exactly as in the clean run, so their change is 0."""
    resid = run(model, start, [hook], start_at_layer=layer, stop_at_layer=model.cfg.n_layers)
    n_pred = clean.shape[1]
    pos = torch.arange(n_pred, device=queries.device)
    has = queries.any(1)
    first_q = torch.where(has, queries.float().argmax(1), torch.full_like(has, n_pred, dtype=torch.long))
    changed = (pos[None, :] >= first_q[:, None]) & valid.to(queries.device)  # [batch, pos_minus_1]
    b, p = changed.nonzero(as_tuple=True)
    delta = torch.zeros(tokens.shape[0], dtype=torch.float64)
    for a in range(0, len(b), UNEMBED_ROWS):
        rb, rp = b[a : a + UNEMBED_ROWS], p[a : a + UNEMBED_ROWS]
        nll = next_token_nll(model, resid[rb, rp], tokens[rb, rp + 1]).cpu()
        delta.index_add_(0, rb.cpu(), (nll - clean[rb.cpu(), rp.cpu()]).double())
    return delta


def _full_loss_change(model: Model, tokens: Tensor, start: Tensor, layer: int, hook, queries: Tensor,
                      clean: Tensor, valid: Tensor) -> Float[Tensor, " batch"]:
    """The reference for `_loss_change`: a whole forward pass with the hook, every
    position scored (`start` and `queries` unused)."""
    hooked = token_losses(model, tokens, [hook])
    return torch.where(valid, hooked - clean, torch.zeros_like(clean)).sum(1).double()


def force_mask(first: Float[Tensor, "batch query_pos"], valid: Bool[Tensor, "batch query_pos"], *,
               high: float, low: float) -> tuple[Tensor, Tensor]:
    """(dormant, active) query masks from first-token attention."""
    return (first >= high) & valid, (first <= low) & valid
