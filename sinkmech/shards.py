"""Each corpus-level analysis as a `Partial` and back (see `sinkmech.partial`).

`X_partial(result, ...)` turns the result of one shard into a part; `X_result(part)`
turns a merged part back into today's result. The one-pass result is
`X_result(X_partial(one_pass))`: the tests check that shards of 1, 2 and 3,
merged in any order, give it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from sinkmech.partial import Partial
from sinkmech.sinks import SinkScores

SINK_ROWS = ("scores", "value_norm_first", "value_norm_rest", "resid_norm_first", "resid_norm_rest", "lengths")


def shard_part(kind: str, settings: dict, *, prompt_index: Sequence[int], shard: tuple[int, int],
               n_prompts_total: int, rows: dict, sums: dict, labels: dict | None = None) -> Partial:
    """A `Partial` for shard `shard` = (I, N) holding `prompt_index` (global, in order)."""
    index = np.asarray(list(prompt_index), dtype=np.int64)
    if len(index) and np.any(np.diff(index) <= 0):
        raise ValueError("prompt_index must increase")
    return Partial(kind=kind, settings=settings, n_shards=shard[1], shards=(shard[0],),
                   n_prompts_total=n_prompts_total, prompt_index=index, rows=rows,
                   sums={k: np.asarray(v, dtype=np.float64) for k, v in sums.items()}, labels=labels or {})


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
        sums[f"{c}.loss_sum"] = [0.0 if r.loss_sum is None else r.loss_sum]
        sums[f"{c}.loss_count"] = [float(r.loss_count)]
        sums[f"{c}.context_cut"] = [0.0 if r.context_limit is None else 1.0]
    settings = {**settings, "conditions": list(results), "model_name": first.model_name, "n_layers": first.n_layers,
                "n_heads": first.n_heads, "max_tokens_requested": first.max_tokens_requested, "n_ctx": n_ctx,
                "loss": first.loss is not None}
    n_total = len(prompt_index) if n_prompts_total is None else n_prompts_total
    return shard_part("sinks", settings, prompt_index=prompt_index, shard=shard, n_prompts_total=n_total,
                      rows=rows, sums=sums)


def sinks_result(part: Partial) -> dict[str, SinkScores]:
    """A (merged) sinks part back as `{condition: SinkScores}`."""
    s = part.settings
    out = {}
    for c in s["conditions"]:
        t = {k: torch.from_numpy(np.ascontiguousarray(part.rows[f"{c}.{k}"])) for k in SINK_ROWS}
        offset = 1 if c == "prepend" else 0
        loss_sum, loss_count = float(part.sums[f"{c}.loss_sum"][0]), int(part.sums[f"{c}.loss_count"][0])
        out[c] = SinkScores(
            **t, bos=c, max_tokens=int(t["lengths"].max()) - offset, model_name=s["model_name"],
            loss=(loss_sum / loss_count if loss_count else None) if s["loss"] else None,
            max_tokens_requested=s["max_tokens_requested"],
            context_limit=s["n_ctx"] if part.sums[f"{c}.context_cut"][0] > 0 else None,
            loss_sum=loss_sum if s["loss"] else None, loss_count=loss_count,
        )
    return out
