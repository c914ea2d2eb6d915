"""Each corpus-level analysis as a `Partial` and back (see `sinkmech.sharding.parts`).

`X_partial(result, ...)` turns the result of one shard into a part; `X_result(part)`
turns a merged part back into today's result. The one-pass result is
`X_result(X_partial(one_pass))`: the tests check that shards of 1, 2 and 3,
merged in any order, give it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from sinkmech.interventions.ablation import ablation_weight
from sinkmech.sharding.parts import Partial
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


def batch_rows(batch) -> tuple[dict, dict, dict]:
    """What a part keeps of its `TokenBatch` for the JSON's record of what was
    scored (`TokenBatch.used`): rows, sums and settings."""
    return ({"content_lengths": (batch.lengths - batch.offset).cpu().numpy()},
            {"context_cut": [0.0 if batch.context_limit is None else 1.0]},
            {"context_limit": batch.context_limit})


def used(part: Partial, requested: int | None) -> dict:
    """`TokenBatch.used(requested)` of the merged prompts."""
    lengths = part.rows["content_lengths"]
    cut = part.sums["context_cut"][0] > 0
    return {"max_tokens": int(lengths.max()), "max_tokens_requested": requested,
            "content_lengths": [int(x) for x in lengths], "context_limit": part.settings["context_limit"] if cut else None}


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
            prompt_loss=(torch.from_numpy(np.ascontiguousarray(part.rows[f"{c}.prompt_loss"]))
                         if f"{c}.prompt_loss" in part.rows else None),
            learned_sink_scores=(torch.from_numpy(np.ascontiguousarray(part.rows[f"{c}.learned_sink_scores"]))
                                 if f"{c}.learned_sink_scores" in part.rows else None),
        )
    return out


# heads: the scan's running sums (moments, histograms, per-position rates, band
# norms, trigger counts by the parity of each prompt's global index) are all
# additive; labels and triggers are drawn from the merged sums. Every part keeps
# the same position width (`n_pos`), cut to the corpus' longest prompt at the end.

HEAD_STATE = ("sums", "hist", "pos", "pos_total", "band", "cut_sums")


def _tensors(obj, names=None, prefix: str = "") -> dict[str, torch.Tensor]:
    out = {}
    for k in names or vars(obj):
        v = getattr(obj, k)
        if isinstance(v, torch.Tensor):
            out[prefix + k] = v
        elif isinstance(v, dict) and all(isinstance(x, torch.Tensor) for x in v.values()):
            out.update({f"{prefix}{k}.{kk}": x for kk, x in v.items()})
    return out


def scan_state(acc) -> dict[str, torch.Tensor]:
    """The additive tensors of a head-scan accumulator (`sinkmech.dormant.scan`), by name."""
    return {**_tensors(acc, HEAD_STATE), **_tensors(acc.triggers, prefix="triggers.")}


def heads_partial(acc, batch, settings: dict, *, prompt_index: Sequence[int], shard: tuple[int, int] = (1, 1),
                  n_prompts_total: int | None = None) -> Partial:
    """A head-scan accumulator (`sinkmech.dormant.scan.accumulate`) of one shard as a part."""
    sums = {k: v.detach().cpu().numpy() for k, v in scan_state(acc).items()}
    sums = {k: v if v.dtype == np.float32 else v.astype(np.float64) for k, v in sums.items()}
    sums["n_prompts"] = np.array([float(acc.n_prompts)])
    cfg = acc.model.cfg
    settings = {**settings, "model_name": cfg.model_name, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
                "d_vocab": cfg.d_vocab, "bos": batch.bos, "n_bins": acc.n_bins, "n_pos": int(acc.pos_total.shape[0]),
                "thresholds": dict(vars(acc.th))}
    n_total = len(prompt_index) if n_prompts_total is None else n_prompts_total
    # what the threshold sweep and the bootstrap read (sinkmech.dormant.queries): rows, one per prompt
    width = acc.key_level.shape[-1]
    tokens = torch.zeros(len(batch), width, dtype=torch.long)
    tokens[:, : batch.tokens.shape[1]] = batch.tokens.cpu()
    rows = {"lengths": batch.lengths.cpu().numpy(), "tokens": tokens.numpy(), "key_level": acc.key_level.numpy(),
            **{f"per_prompt.{k}": v.numpy() for k, v in acc.per_prompt.items()}}
    part = shard_part("heads", settings, prompt_index=prompt_index, shard=shard, n_prompts_total=n_total,
                      rows=rows, sums={})
    return Partial(**{**part.__dict__, "sums": sums})


def heads_result(part: Partial, model, *, top_triggers: int = 5):
    """A (merged) heads part back as a `HeadScan`: the model gives the token texts
    and the band layout (it must be the model the parts were run on)."""
    from sinkmech.dormant.labels import Thresholds
    from sinkmech.dormant.scan import _Accumulator
    from sinkmech.prompts import TokenBatch, token_text

    s = part.settings
    th = Thresholds(**s["thresholds"])
    lengths = torch.from_numpy(part.rows["lengths"])
    width = int(lengths.max())
    tokens = (torch.from_numpy(part.rows["tokens"])[:, :width] if "tokens" in part.rows
              else torch.zeros(len(lengths), width, dtype=torch.long))
    batch = TokenBatch(tokens, lengths, s["bos"], None)
    acc = _Accumulator(model, batch, th, s["n_bins"])
    if "key_level" in part.rows:  # per-query records: the merged scan has its sweep and bootstrap too
        acc.key_level = torch.from_numpy(np.ascontiguousarray(part.rows["key_level"]))[..., :width]
        acc.per_prompt = {k: torch.from_numpy(np.ascontiguousarray(part.rows[f"per_prompt.{k}"])) for k in acc.per_prompt}
        acc.recorded = True
    state = scan_state(acc)
    if set(state) != set(part.sums) - {"n_prompts"}:
        raise ValueError("the heads part holds other statistics than this sinkmech's scan: it cannot be merged")
    for name, t in state.items():
        src = torch.from_numpy(np.ascontiguousarray(part.sums[name]))
        keep = tuple(slice(0, n) for n in t.shape)
        rest = src.clone()
        rest[keep] = 0  # beyond the longest prompt nothing may have been counted
        if src.dim() != t.dim() or src[keep].shape != t.shape or bool(rest.any()):
            raise ValueError(f"the heads part's {name} does not fit the model or the prompts' lengths")
        t.copy_(src[keep].to(t.dtype))
    acc.n_prompts = int(part.sums["n_prompts"][0])
    return acc.finish(th, decode=token_text(model), top_triggers=top_triggers, max_tokens=width - batch.offset)


# ablate: each head's effect is a mean over the shard's content positions (KL)
# or prompts (logit difference); the part keeps it as a weighted sum.

def ablate_partial(result, batch, settings: dict, *, prompt_index: Sequence[int], shard: tuple[int, int] = (1, 1),
                   n_prompts_total: int | None = None) -> Partial:
    """A `HeadAblation` of one shard (the prompts of `batch`) as a part."""
    w = ablation_weight(result.metric, batch)
    settings = {**settings, "mode": result.mode, "metric": result.metric, "bos": result.bos, "method": result.method,
                "layers": list(result.layers), "heads": list(result.heads)}
    n_total = len(prompt_index) if n_prompts_total is None else n_prompts_total
    return shard_part("ablate", settings, prompt_index=prompt_index, shard=shard, n_prompts_total=n_total,
                      rows={"lengths": batch.lengths.cpu().numpy()},
                      sums={"effects_sum": result.effects.double().cpu().numpy() * w,
                            "baseline_sum": [result.baseline * w], "weight": [w]})


def ablate_result(part: Partial):
    """A (merged) ablate part back as a `HeadAblation`."""
    from sinkmech.interventions.ablation import HeadAblation

    s, w = part.settings, float(part.sums["weight"][0])
    effects = torch.from_numpy(part.sums["effects_sum"] / w).float()
    return HeadAblation(effects=effects, mode=s["mode"], metric=s["metric"], bos=s["bos"],
                        baseline=float(part.sums["baseline_sum"][0] / w), method=s["method"],
                        layers=tuple(s["layers"]), heads=tuple(s["heads"]), n_prompts=len(part.prompt_index))


# patch: like ablate, each cell's metric is a mean over the shard's content
# positions (KL) or prompts (logit difference), kept as a weighted sum. A
# per-position cell that a shard lacks (no prompt of it that long) patches
# padding only: its value there is the shard's unpatched baseline.

def patch_partial(results: dict, pair, settings: dict, *, width: int, prompt_index: Sequence[int],
                  shard: tuple[int, int] = (1, 1), n_prompts_total: int | None = None) -> Partial:
    """`{source: PatchResult}` of one shard (the prompts of the `BosPair` `pair`) as a part.

    Args:
        width: content positions every part pads a per-position result to (the
            run's max tokens): the merged values are cut to the longest prompt.
    """
    first = next(iter(results.values()))
    batch = pair.without_bos
    w = float(batch.lengths.sum()) if first.metric == "kl" else float(len(batch))
    rows, sums, more = batch_rows(batch)
    sums["weight"] = [w]
    for source, r in results.items():
        if r.positions is not None:
            raise ValueError("a patch of chosen positions (positions=) scores another set of positions: not merged")
        values = r.values.double()
        if "pos" in r.axes:
            if values.shape[-1] > width:
                raise ValueError(f"the patch has {values.shape[-1]} content positions, more than width={width}")
            padded = torch.full((*values.shape[:-1], width), r.baseline, dtype=torch.float64)
            padded[..., : values.shape[-1]] = values
            values = padded
        sums.update({f"{source}.values_sum": values.numpy() * w, f"{source}.baseline_sum": [r.baseline * w],
                     f"{source}.source_value_sum": [r.source_value * w]})
    settings = {**settings, **more, "act": first.act, "axes": list(first.axes), "metric": first.metric,
                "layers": list(first.layers), "targets": {k: r.target for k, r in results.items()}, "width": width}
    n_total = len(prompt_index) if n_prompts_total is None else n_prompts_total
    return shard_part("patch", settings, prompt_index=prompt_index, shard=shard, n_prompts_total=n_total,
                      rows=rows, sums=sums)


def patch_result(part: Partial) -> dict:
    """A (merged) patch part back as `{source: PatchResult}`."""
    from sinkmech.interventions.patching import PatchResult

    s, w = part.settings, float(part.sums["weight"][0])
    out = {}
    for source, target in s["targets"].items():
        values = torch.from_numpy(part.sums[f"{source}.values_sum"] / w).float()
        if "pos" in s["axes"]:
            values = values[..., : int(part.rows["content_lengths"].max())].contiguous()
        out[source] = PatchResult(values=values, axes=tuple(s["axes"]), act=s["act"], source=source, target=target,
                                  metric=s["metric"], baseline=float(part.sums[f"{source}.baseline_sum"][0] / w),
                                  source_value=float(part.sums[f"{source}.source_value_sum"][0] / w),
                                  layers=tuple(s["layers"]))
    return out
