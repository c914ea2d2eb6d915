"""The dormant-head scan (`sinkmech.dormant.scan`) as a part (`sinkmech.sharding.format`)
and back.

The scan's running sums (moments, histograms, per-position rates, band norms,
trigger counts by the parity of each prompt's global index) are all additive;
labels and triggers are drawn from the merged sums. Every part keeps the same
position width (`n_pos`), cut to the corpus' longest prompt at the end. The
one-pass scan is the merge of one shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from sinkmech.sharding.format import Partial, shard_part

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
    # what the threshold sweep and the bootstrap read (sinkmech.dormant.queries): rows, one per prompt
    width = acc.key_level.shape[-1]
    tokens = torch.zeros(len(batch), width, dtype=torch.long)
    tokens[:, : batch.tokens.shape[1]] = batch.tokens.cpu()
    rows = {"lengths": batch.lengths.cpu().numpy(), "tokens": tokens.numpy(), "key_level": acc.key_level.numpy(),
            **{f"per_prompt.{k}": v.numpy() for k, v in acc.per_prompt.items()}}
    part = shard_part("heads", settings, prompt_index=prompt_index, shard=shard, n_prompts_total=n_prompts_total,
                      rows=rows, sums={})
    return replace(part, sums=sums)  # float32 sums stay float32: the scan adds them so


def heads_result(part: Partial, model, *, top_triggers: int = 5):
    """A (merged) heads part back as a `HeadScan`: the model gives the token texts
    and the band layout (it must be the model the parts were run on)."""
    from sinkmech.dormant.labels import Thresholds
    from sinkmech.dormant.scan import ScanSums
    from sinkmech.prompts import TokenBatch, token_text

    s = part.settings
    th = Thresholds(**s["thresholds"])
    lengths = torch.from_numpy(part.rows["lengths"])
    width = int(lengths.max())
    tokens = (torch.from_numpy(part.rows["tokens"])[:, :width] if "tokens" in part.rows
              else torch.zeros(len(lengths), width, dtype=torch.long))
    batch = TokenBatch(tokens, lengths, s["bos"], None)
    acc = ScanSums(model, batch, th, s["n_bins"])
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
