"""The sink scores and the measures beside them as parts (`sinkmech.sharding.format`):
`SinkScores` (`sinkmech.measures.sinks`), value-weighted attention, massive dimensions and
key sinks.

`X_partial(result or sums, ...)` turns one shard's run into a part; `X_result(part)`
turns a merged part back into the result. The one-pass result is the merge of one
shard: the tests check that shards of 1, 2 and 3, merged in any order, give it.
Per-prompt values are rows (exact); everything averaged over prompts is kept as
float64 sums.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from sinkmech.prompts import TokenBatch
from sinkmech.sharding.format import Partial, batch_rows, row_fields, shard_part
from sinkmech.measures.sinks import SinkScores

SINK_ROWS = row_fields(SinkScores)  # its per-prompt tensors: scores, norms, lengths


def _numpy(d: dict) -> dict:
    return {k: v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v) for k, v in d.items()}


def _torch(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


# sinks: every statistic is per prompt except the loss (a sum over targets).

def sinks_partial(results: dict[str, SinkScores], settings: dict, *, prompt_index: Sequence[int],
                  shard: tuple[int, int] = (1, 1), n_prompts_total: int | None = None, n_ctx: int) -> Partial:
    """`{condition: SinkScores}` of one shard (the `sinkmech sinks` run) as a part.

    Args:
        settings: what the run's parts must share (the CLI's run settings).
        prompt_index: the global index of each of the shard's prompts.
        n_ctx: the model's context (a shard that cut a prompt to it says so).
    """
    first = next(iter(results.values()))
    rows, sums = {}, {}
    for c, r in results.items():
        if r.loss_sum is None and r.loss is not None:
            raise ValueError("the SinkScores carries a loss without its sum: it cannot be merged")
        for k in SINK_ROWS:
            rows[f"{c}.{k}"] = getattr(r, k).cpu().numpy()
        if r.prompt_loss is not None:
            rows[f"{c}.prompt_loss"] = r.prompt_loss.double().cpu().numpy()
        if r.learned_sink_scores is not None:
            rows[f"{c}.learned_sink_scores"] = r.learned_sink_scores.cpu().numpy()
        if r.bos_scores is not None:  # <bos> moved to position K (`bos_position`, a setting every part shares)
            rows[f"{c}.bos_scores"] = r.bos_scores.cpu().numpy()
        sums[f"{c}.loss_sum"] = [0.0 if r.loss_sum is None else r.loss_sum]
        sums[f"{c}.loss_count"] = [float(r.loss_count)]
        sums[f"{c}.context_cut"] = [0.0 if r.context_limit is None else 1.0]
    moved = {c: r.bos_position for c, r in results.items() if r.bos_position is not None}
    settings = {**settings, **({"bos_positions": moved} if moved else {}),
                "conditions": list(results), "model_name": first.model_name, "n_layers": first.n_layers,
                "n_heads": first.n_heads, "max_tokens_requested": first.max_tokens_requested, "n_ctx": n_ctx,
                "loss": first.loss is not None, "attention_path": first.attention}
    return shard_part("sinks", settings, prompt_index=prompt_index, shard=shard, n_prompts_total=n_prompts_total,
                      rows=rows, sums=sums)


def sinks_result(part: Partial) -> dict[str, SinkScores]:
    """A (merged) sinks part back as `{condition: SinkScores}`."""
    s = part.settings
    out = {}
    for c in s["conditions"]:
        t = {k: _torch(part.rows[f"{c}.{k}"]) for k in SINK_ROWS}
        offset = 1 if c == "prepend" else 0
        loss_sum, loss_count = float(part.sums[f"{c}.loss_sum"][0]), int(part.sums[f"{c}.loss_count"][0])
        out[c] = SinkScores(
            **t, bos=c, max_tokens=int(t["lengths"].max()) - offset, model_name=s["model_name"],
            loss=(loss_sum / loss_count if loss_count else None) if s["loss"] else None,
            max_tokens_requested=s["max_tokens_requested"],
            context_limit=s["n_ctx"] if part.sums[f"{c}.context_cut"][0] > 0 else None,
            loss_sum=loss_sum if s["loss"] else None, loss_count=loss_count,
            prompt_loss=_torch(part.rows[f"{c}.prompt_loss"]) if f"{c}.prompt_loss" in part.rows else None,
            learned_sink_scores=(_torch(part.rows[f"{c}.learned_sink_scores"])
                                 if f"{c}.learned_sink_scores" in part.rows else None),
            bos_position=s.get("bos_positions", {}).get(c),
            bos_scores=_torch(part.rows[f"{c}.bos_scores"]) if f"{c}.bos_scores" in part.rows else None,
            attention=s.get("attention_path"),
        )
    return out


# value-weighted attention: every statistic is per prompt.

def value_weighted_partial(result, settings: dict, *, prompt_index: Sequence[int], shard: tuple[int, int] = (1, 1),
                           n_prompts_total: int | None = None) -> Partial:
    """A `ValueWeighted` (`sinkmech.measures.value_weighted`) of one shard as a part."""
    from sinkmech.measures.value_weighted import ValueWeighted

    rows = _numpy({k: getattr(result, k) for k in row_fields(ValueWeighted)})
    settings = {**settings, "vector": result.vector, "bos": result.bos, "model_name": result.model_name}
    return shard_part("value_weighted", settings, prompt_index=prompt_index, shard=shard,
                      n_prompts_total=n_prompts_total, rows=rows, sums={})


def value_weighted_result(part: Partial):
    """A (merged) value-weighted part back as a `ValueWeighted`."""
    from sinkmech.measures.value_weighted import ValueWeighted

    s = part.settings
    return ValueWeighted(**{k: _torch(part.rows[k]) for k in row_fields(ValueWeighted)}, vector=s["vector"],
                         bos=s["bos"], model_name=s["model_name"])


# massive dimensions: float64 sums over prompts (`sinkmech.measures.massive.massive_sums`).

def massive_partial(sums: dict, batch: TokenBatch, settings: dict, *, prompt_index: Sequence[int],
                    shard: tuple[int, int] = (1, 1), n_prompts_total: int | None = None) -> Partial:
    """The `massive_sums` of one shard (the prompts of `batch`) as a part. The
    options that turn sums into a result (top_k, threshold, Sun et al.'s
    criterion) belong in `settings`: every part must share them."""
    rows, extra, more = batch_rows(batch)
    return shard_part("massive", {**settings, **more, "bos": batch.bos}, prompt_index=prompt_index, shard=shard,
                      n_prompts_total=n_prompts_total, rows=rows, sums={**_numpy(sums), **extra})


def massive_result(part: Partial, *, top_k: int, threshold: float, sun_min_abs: float, sun_min_ratio: float,
                   model_name: str = ""):
    """A (merged) massive part back as `MassiveDims`."""
    from sinkmech.measures.massive import MASSIVE_SUMS, massive_from_sums

    sums = {k: _torch(part.sums[k]) for k in (*MASSIVE_SUMS, "n_prompts")}
    return massive_from_sums(sums, top_k=top_k, threshold=threshold, sun_min_abs=sun_min_abs,
                             sun_min_ratio=sun_min_ratio, bos=part.settings["bos"], model_name=model_name)


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
    return shard_part("key_sinks", settings, prompt_index=prompt_index, shard=shard, n_prompts_total=n_prompts_total,
                      rows={**_numpy(rows), "lengths": batch.lengths.cpu().numpy()},
                      sums={**_numpy(padded), **{k: sums[k].numpy() for k in PER_HEAD}},
                      labels={str(i): decode(i) for i in ids})


def key_sinks_result(part: Partial, *, top_k: int, min_queries: int, min_excess: float = 0.1, model_name: str = ""):
    """A (merged) key-sinks part back as `KeySinks`."""
    from sinkmech.measures.key_sinks import key_sinks_from_sums

    T = int(part.rows["lengths"].max())
    sums = {k: _torch(v[..., :T] if k not in PER_HEAD else v) for k, v in part.sums.items()}
    rows = {k: _torch(part.rows[k]) for k in ("top_scores", "top_position", "top_token_id")}
    return key_sinks_from_sums(rows, sums, top_k=top_k, min_queries=min_queries, min_excess=min_excess,
                               bos=part.settings["bos"],
                               model_name=model_name, decode=lambda i: part.labels[str(i)])
