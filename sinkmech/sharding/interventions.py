"""The interventions as parts (`sinkmech.sharding.format`) and back: per-head
ablations (`HeadAblation`), activation patching (`PatchResult`) and the
perturbation spread (`PerturbationSpread`).

`X_partial(result, ...)` turns one shard's result into a part; `X_result(part)`
turns a merged part back into the result; the one-pass result is the merge of
one shard. A mean over the shard's content positions (KL) or prompts (logit
difference) is kept as a weighted float64 sum.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from sinkmech.interventions.ablation import ablation_weight
from sinkmech.sharding.format import Partial, batch_rows, shard_part


# ablate: each head's effect is a mean over the shard's content positions (KL)
# or prompts (logit difference); the part keeps it as a weighted sum.

def ablate_partial(result, batch, settings: dict, *, prompt_index: Sequence[int], shard: tuple[int, int] = (1, 1),
                   n_prompts_total: int | None = None) -> Partial:
    """A `HeadAblation` of one shard (the prompts of `batch`) as a part."""
    w = ablation_weight(result.metric, batch)
    settings = {**settings, "mode": result.mode, "metric": result.metric, "bos": result.bos, "method": result.method,
                "layers": list(result.layers), "heads": list(result.heads)}
    return shard_part("ablate", settings, prompt_index=prompt_index, shard=shard, n_prompts_total=n_prompts_total,
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
# positions (KL), content targets (loss) or prompts (logit difference), kept as a weighted sum. A
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
    # what the metric averages over: content positions (KL), content targets (loss), prompts (a logit difference)
    w = {"kl": float(batch.lengths.sum()), "loss": float((batch.lengths - 1).clamp(min=0).sum())}.get(
        first.metric, float(len(batch)))
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
    return shard_part("patch", settings, prompt_index=prompt_index, shard=shard, n_prompts_total=n_prompts_total,
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
    return shard_part("perturb", settings, prompt_index=prompt_index, shard=shard, n_prompts_total=n_prompts_total,
                      rows={"change": padded.numpy(), "last_changed": result.last_changed.numpy()},
                      sums={k: result.sums[k].double().numpy() for k in ENTROPY_SUMS})


def spread_result(part: Partial):
    """A (merged) perturb part back as a `PerturbationSpread`."""
    from sinkmech.interventions.perturb import ENTROPY_SUMS, per_prompt_kind, spread_from_sums

    change = torch.from_numpy(np.ascontiguousarray(part.rows["change"]))  # [prompt, bos, resid_layer, width]
    real = ~change[:, 0, 0].isnan()  # [prompt, width]
    n = int(real.any(0).nonzero().max()) + 1 if real.any() else 0
    change = change[..., :n].permute(1, 0, 2, 3).contiguous()
    s, last = part.settings, torch.from_numpy(np.ascontiguousarray(part.rows["last_changed"]))
    return spread_from_sums(change, {k: torch.from_numpy(np.ascontiguousarray(part.sums[k])) for k in ENTROPY_SUMS},
                            last, kind=s["kind"] if s["kind"] is not None else per_prompt_kind(last.tolist()),
                            threshold=s["threshold"])
