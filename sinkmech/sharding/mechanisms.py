"""The mechanism analyses as `Partial`s and back (see `sinkmech.sharding.parts`):
value-weighted attention, massive dimensions, perturbation spread, key sinks.

As in `sinkmech.sharding.sinks`: `X_partial(result or sums, ...)` turns one shard's
run into a part, `X_result(part)` turns a merged part back into today's
result; the one-pass result is the merge of one shard. Per-prompt values are
rows (exact); everything averaged over prompts is kept as float64 sums.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from sinkmech.sharding.parts import Partial
from sinkmech.prompts import TokenBatch
from sinkmech.sharding.sinks import batch_rows, shard_part


def _numpy(d: dict) -> dict:
    return {k: v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v) for k, v in d.items()}


def _torch(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def _part(kind: str, settings: dict, prompt_index, shard, n_prompts_total, rows: dict, sums: dict) -> Partial:
    index = list(prompt_index)
    return shard_part(kind, settings, prompt_index=index, shard=shard,
                      n_prompts_total=len(index) if n_prompts_total is None else n_prompts_total, rows=rows, sums=sums)


# value-weighted attention: every statistic is per prompt.

def value_weighted_partial(result, settings: dict, *, prompt_index: Sequence[int], shard: tuple[int, int] = (1, 1),
                           n_prompts_total: int | None = None) -> Partial:
    """A `ValueWeighted` (`sinkmech.measures.value_weighted`) of one shard as a part."""
    rows = _numpy({"attn_first": result.attn_first, "output_first": result.output_first, "lengths": result.lengths})
    settings = {**settings, "vector": result.vector, "bos": result.bos, "model_name": result.model_name}
    return _part("value_weighted", settings, prompt_index, shard, n_prompts_total, rows, {})


def value_weighted_result(part: Partial):
    """A (merged) value-weighted part back as a `ValueWeighted`."""
    from sinkmech.measures.value_weighted import ValueWeighted

    s = part.settings
    return ValueWeighted(attn_first=_torch(part.rows["attn_first"]), output_first=_torch(part.rows["output_first"]),
                         lengths=_torch(part.rows["lengths"]), vector=s["vector"], bos=s["bos"],
                         model_name=s["model_name"])


# massive dimensions: float64 sums over prompts (`sinkmech.measures.massive.massive_sums`).

def massive_partial(sums: dict, batch: TokenBatch, settings: dict, *, prompt_index: Sequence[int],
                    shard: tuple[int, int] = (1, 1), n_prompts_total: int | None = None) -> Partial:
    """The `massive_sums` of one shard (the prompts of `batch`) as a part. The
    options that turn sums into a result (top_k, threshold, Sun et al.'s
    criterion) belong in `settings`: every part must share them."""
    rows, extra, more = batch_rows(batch)
    return _part("massive", {**settings, **more, "bos": batch.bos}, prompt_index, shard, n_prompts_total, rows,
                 {**_numpy(sums), **extra})


def massive_result(part: Partial, *, top_k: int, threshold: float, sun_min_abs: float, sun_min_ratio: float,
                   model_name: str = ""):
    """A (merged) massive part back as `MassiveDims`."""
    from sinkmech.measures.massive import MASSIVE_SUMS, massive_from_sums

    sums = {k: _torch(part.sums[k]) for k in (*MASSIVE_SUMS, "n_prompts")}
    return massive_from_sums(sums, top_k=top_k, threshold=threshold, sun_min_abs=sun_min_abs,
                             sun_min_ratio=sun_min_ratio, bos=part.settings["bos"], model_name=model_name)


# perturbation spread: the change per (prompt, layer, position) is a row, padded
# to `width` content positions; the entropies are float64 sums.

def spread_partial(result, settings: dict, *, width: int, prompt_index: Sequence[int],
                   shard: tuple[int, int] = (1, 1), n_prompts_total: int | None = None) -> Partial:
    """A `PerturbationSpread` of one shard as a part.

    Args:
        width: content positions every part pads its rows to (the run's max
            tokens): the merged rows are cut to the longest prompt.
    """
    from sinkmech.interventions.perturb import ENTROPY_SUMS, per_prompt_kind

    change = result.change.permute(1, 0, 2, 3)  # [prompt, bos, resid_layer, pos]
    if change.shape[-1] > width:
        raise ValueError(f"the spread has {change.shape[-1]} content positions, more than width={width}")
    padded = torch.full((*change.shape[:3], width), float("nan"))
    padded[..., : change.shape[-1]] = change
    if result.sums is None:
        raise ValueError("the spread carries no entropy sums: it cannot be merged")
    # one swap per prompt: the kind lists the shard's swap positions; rebuilt from the merged rows
    kind = None if result.kind == per_prompt_kind(result.last_changed.tolist()) else result.kind
    settings = {**settings, "kind": kind, "threshold": result.threshold, "conditions": list(result.conditions),
                "width": width}
    return _part("perturb", settings, prompt_index, shard, n_prompts_total,
                 {"change": padded.numpy(), "last_changed": result.last_changed.numpy()},
                 {k: result.sums[k].double().numpy() for k in ENTROPY_SUMS})


def spread_result(part: Partial):
    """A (merged) perturb part back as a `PerturbationSpread`."""
    from sinkmech.interventions.perturb import ENTROPY_SUMS, per_prompt_kind, spread_from_sums

    change = _torch(part.rows["change"])  # [prompt, bos, resid_layer, width]
    real = ~change[:, 0, 0].isnan()  # [prompt, width]
    n = int(real.any(0).nonzero().max()) + 1 if real.any() else 0
    change = change[..., :n].permute(1, 0, 2, 3).contiguous()
    s, last = part.settings, _torch(part.rows["last_changed"])
    return spread_from_sums(change, {k: _torch(part.sums[k]) for k in ENTROPY_SUMS}, last,
                            kind=s["kind"] if s["kind"] is not None else per_prompt_kind(last.tolist()),
                            threshold=s["threshold"])


# key sinks: each prompt's top keys per head are rows (the corpus' top keys are
# among them); alpha_k by key position and the counts are float64 sums, padded
# to `width` positions; the token texts of the top keys are labels.

PER_HEAD = ("off_first", "off_first_relative")  # [layer, head_index] sums: not padded by key position


def key_sinks_partial(rows: dict, sums: dict, batch: TokenBatch, settings: dict, *, width: int, decode,
                      prompt_index: Sequence[int], shard: tuple[int, int] = (1, 1),
                      n_prompts_total: int | None = None) -> Partial:
    """`key_sink_sums` of one shard (the prompts of `batch`) as a part.

    Args:
        width: key positions every part pads its sums to (the run's max tokens
            plus the `<bos>` offset): the merged sums are cut to the longest prompt.
        decode: token id -> text (the labels of the top keys).
    """
    T = sums["n_scored"].shape[0]
    if T > width:
        raise ValueError(f"the key sums have {T} positions, more than width={width}")
    padded = {k: torch.nn.functional.pad(v, (0, width - T)) for k, v in sums.items() if k not in PER_HEAD}
    ids = sorted({int(i) for i in rows["top_token_id"].flatten().tolist()})
    settings = {**settings, "bos": batch.bos, "width": width}
    return Partial(**{**_part("key_sinks", settings, prompt_index, shard, n_prompts_total,
                              {**_numpy(rows), "lengths": batch.lengths.cpu().numpy()},
                              {**_numpy(padded), **{k: sums[k].numpy() for k in PER_HEAD}}).__dict__,
                      "labels": {str(i): decode(i) for i in ids}})


def key_sinks_result(part: Partial, *, top_k: int, min_queries: int, min_excess: float = 0.1, model_name: str = ""):
    """A (merged) key-sinks part back as `KeySinks`."""
    from sinkmech.measures.key_sinks import key_sinks_from_sums

    T = int(part.rows["lengths"].max())
    sums = {k: _torch(v[..., :T] if k not in PER_HEAD else v) for k, v in part.sums.items()}
    rows = {k: _torch(part.rows[k]) for k in ("top_scores", "top_position", "top_token_id")}
    return key_sinks_from_sums(rows, sums, top_k=top_k, min_queries=min_queries, min_excess=min_excess,
                               bos=part.settings["bos"],
                               model_name=model_name, decode=lambda i: part.labels[str(i)])
