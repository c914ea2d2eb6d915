"""The evaluation-length sweep (`sinkmech.context.length`) as two kinds of `Partial`.

The sweep's top heads per length are chosen on the whole corpus before their
ablations run, so a sharded sweep has two stages, each mergeable exactly:

1. "length_scores": per length T, the sink scores of each of the shard's prompts
   cut to T (`SinkScores` rows, exact), and each prompt's content tokens (the
   merged corpus' shortest prompt decides which lengths are measured). From the
   merged parts `length_heads` chooses the heads as `sinks_vs_length` does.
2. "length": per length, the mask_first KL of each chosen head on the shard, a
   mean over its content positions kept as a float64 sum with that count (as
   `sinkmech.sharding.interventions.ablate_partial` keeps it). A stage-2 part carries the chosen
   heads in its settings and its shard's stage-1 part attached (`attach`, under
   "scores"), so the merged stage-2 parts alone give the `LengthSweep`.

The one-pass sweep is the merge of one shard, through the same steps
(`length_scores`, `choose_heads`, `length_costs`, `length_sweep`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from sinkmech.context.length import (
    ChosenHeads, LengthSweep, choose_heads, fits_context, length_sweep, plan_lengths, truncate,
)
from sinkmech.interventions.ablation import HeadAblation, ablation_weight
from sinkmech.sharding.measures import SINK_ROWS
from sinkmech.prompts import TokenBatch
from sinkmech.sharding.format import Partial, attach, detach, shard_part
from sinkmech.measures.sinks import SinkScores

SCORES, COSTS = "length_scores", "length"  # the two part kinds
ATTACHED = "scores"  # where a stage-2 part carries its shard's stage-1 part


def row_key(T: int, name: str) -> str:
    return f"T{T}.{name}"


# Stage 1: the sink scores by length, per prompt.

def sweep_settings(*, lengths: Sequence[int], top_k: int, eps: Sequence[float], uniform_multiples: Sequence[float],
                   fixed_head: tuple[int, int] | None) -> dict:
    """The sweep's options (checked by `check_sweep`) as a part's settings: every
    part of one sweep must share them."""
    return {"lengths": [int(T) for T in lengths], "top_k": int(top_k), "eps": [float(e) for e in eps],
            "uniform_multiples": [float(m) for m in uniform_multiples],
            "fixed_head": None if fixed_head is None else [int(x) for x in fixed_head]}


def scores_partial(scores: dict[int, SinkScores], batch: TokenBatch, settings: dict, *, cfg,
                   prompt_index: Sequence[int], shard: tuple[int, int] = (1, 1),
                   n_prompts_total: int | None = None) -> Partial:
    """Stage 1 of one shard (the prompts of `batch`) as a part.

    Args:
        scores: `length_scores` of `batch` at the lengths its prompts can be cut to.
        settings: the run's settings, the sweep's among them (`sweep_settings`).
            A length that fits the context but not the shard's shortest prompt
            is stored as NaN rows: the merged corpus' shortest prompt is no
            longer, so the merged sweep skips it too.
        cfg: the model's config (context, layers, heads, name).
    """
    lengths = settings["lengths"]
    P = len(batch)
    rows = {"content_lengths": (batch.lengths - batch.offset).cpu().numpy().astype(np.int64)}
    for T in (T for T in lengths if fits_context(T, cfg.n_ctx)):
        ss = scores.get(T)
        for k in SINK_ROWS:
            if ss is not None:
                rows[row_key(T, k)] = getattr(ss, k).cpu().numpy()
            elif k == "lengths":
                rows[row_key(T, k)] = np.zeros(P, dtype=np.int64)
            else:
                shape = (P, cfg.n_layers, cfg.n_heads) if k.startswith("value") or k == "scores" else (P, cfg.n_layers)
                rows[row_key(T, k)] = np.full(shape, np.nan, dtype=np.float32)
    settings = {**settings, "bos": batch.bos, "n_ctx": cfg.n_ctx, "model_name": cfg.model_name,
                "n_layers": cfg.n_layers, "n_heads": cfg.n_heads}
    return shard_part(SCORES, settings, prompt_index=prompt_index, shard=shard, rows=rows, sums={},
                      n_prompts_total=n_prompts_total)


def scores_result(part: Partial) -> tuple[dict[int, SinkScores], tuple[tuple[int, str], ...]]:
    """A (merged) stage-1 part back as (length -> `SinkScores`, the lengths skipped
    and why), the lengths planned on the part's shortest prompt."""
    s = part.settings
    shortest = int(part.rows["content_lengths"].min())
    done, skipped = plan_lengths(s["lengths"], s["n_ctx"], shortest)
    scores = {}
    for T in done:
        t = {k: torch.from_numpy(np.ascontiguousarray(part.rows[row_key(T, k)])) for k in SINK_ROWS}
        scores[T] = SinkScores(**t, bos=s["bos"], max_tokens=T, model_name=s["model_name"])
    return scores, skipped


def length_heads(part: Partial) -> ChosenHeads:
    """The heads a (merged, complete) stage-1 part chooses, as `sinks_vs_length` chooses them."""
    s = part.settings
    fixed = None if s["fixed_head"] is None else tuple(s["fixed_head"])
    return choose_heads(scores_result(part)[0], s["top_k"], fixed)


def prompt_rows(part: Partial) -> list[dict[str, np.ndarray]]:
    """Each prompt's rows of a stage-1 part, in prompt order: what a stage-2 shard
    is sent of stage 1 (a Ray worker gets its own prompts' rows only)."""
    return [{k: np.asarray(v[j]) for k, v in part.rows.items()} for j in range(len(part.prompt_index))]


def scores_shard(settings: dict, rows: Sequence[dict[str, np.ndarray]], *, prompt_index: Sequence[int],
                 shard: tuple[int, int], n_prompts_total: int) -> Partial:
    """The stage-1 part of shard `shard` = (I, N), rebuilt from its prompts' `prompt_rows`
    and the merged stage-1 part's `settings` (stage 2's split may differ from stage 1's)."""
    if len(rows) != len(prompt_index):
        raise ValueError(f"{len(rows)} prompts' stage-1 rows for {len(prompt_index)} prompts")
    stacked = {k: np.stack([r[k] for r in rows]) for k in rows[0]} if rows else {}
    return shard_part(SCORES, settings, prompt_index=prompt_index, shard=shard, n_prompts_total=n_prompts_total,
                      rows=stacked, sums={})


# Stage 2: the chosen heads' mask_first costs, as sums over content positions.

def costs_partial(costs: dict[int, list[HeadAblation]], heads: ChosenHeads, batch: TokenBatch, settings: dict, *,
                  scores: Partial, prompt_index: Sequence[int], shard: tuple[int, int] = (1, 1),
                  n_prompts_total: int | None = None) -> Partial:
    """Stage 2 of one shard (the prompts of `batch`) as a part, `scores` (the shard's
    stage-1 part) attached.

    Args:
        costs: `length_costs(model, batch, heads)`: per length, one single-head
            mask_first ablation for each head of `heads.measured`.
    """
    if tuple(costs) != heads.lengths:
        raise ValueError(f"costs at lengths {tuple(costs)}, heads chosen at {heads.lengths}")
    sums = {}
    for i, (T, results) in enumerate(costs.items()):
        if len(results) != len(heads.measured(i)):
            raise ValueError(f"length {T}: {len(results)} costs for {len(heads.measured(i))} heads")
        w = ablation_weight(results[0].metric, truncate(batch, T))  # KL: a mean over the shard's content positions
        sums[row_key(T, "cost_sum")] = [float(r.effects[0, 0]) * w for r in results]
        sums[row_key(T, "weight")] = [w]
    part = shard_part(COSTS, {**settings, "heads": heads.to_dict()}, prompt_index=prompt_index, shard=shard,
                      rows={}, sums=sums, n_prompts_total=n_prompts_total)
    return attach(part, ATTACHED, scores)


def length_result(part: Partial) -> LengthSweep:
    """A (merged, complete) stage-2 part back as the `LengthSweep` that `sinks_vs_length`
    returns on the whole corpus. Its heads must be the ones its attached stage-1
    rows choose (`ValueError` otherwise)."""
    scores_part = detach(part, ATTACHED)
    scores, skipped = scores_result(scores_part)
    heads = ChosenHeads.from_dict(part.settings["heads"])
    if heads != length_heads(scores_part):
        raise ValueError("the stage-2 parts' heads are not the ones their stage-1 scores choose: "
                         "run stage 2 again on the merged stage-1 parts")
    costs = {T: (part.sums[row_key(T, "cost_sum")] / part.sums[row_key(T, "weight")][0]).tolist()
             for T in heads.lengths}
    s = scores_part.settings
    return length_sweep(scores, heads, costs, skipped=skipped, eps=tuple(s["eps"]),
                        uniform_multiples=tuple(s["uniform_multiples"]), bos=s["bos"],
                        n_prompts=len(part.prompt_index), model_name=s["model_name"])

