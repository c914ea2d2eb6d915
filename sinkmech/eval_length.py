"""Sinks against the evaluation length.

Barbero et al. 2025 (Sec. 5, Fig. 5) vary the *training* context length only.
Here a trained model is evaluated on the same texts cut to growing lengths T:
the sink rate (Gu et al. 2025's alpha_0 > epsilon), the uniform baseline
alpha_0 = H_T / T (it falls with T, so it is reported per length), and the cost
of masking the first key for each of the top-k sink heads alone
(`head_ablations(mode="mask_first")`, KL on content positions).
Lengths beyond the model's context, or beyond the prompts, are skipped and said so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from sinkmech.backend import Model
from sinkmech.interventions.ablation import head_ablations
from sinkmech.prompts import DEFAULT_EPS, Bos, TokenBatch, default_corpus, tokenize
from sinkmech.results import Result
from sinkmech.sinks import check_eps, format_eps, sink_scores

DEFAULT_LENGTHS = (64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class LengthSweep(Result):
    """Sink statistics per evaluation length (content tokens, `<bos>` not counted)."""

    lengths: tuple[int, ...]  # the lengths measured
    eps: tuple[float, ...]
    sink_rate: Float[Tensor, "length eps"]
    mean_score: Float[Tensor, " length"]  # mean alpha_0 over prompts and heads
    uniform_score: Float[Tensor, " length"]
    top_layer: Int[Tensor, "length k"]
    top_head: Int[Tensor, "length k"]
    top_score: Float[Tensor, "length k"]
    mask_first_cost: Float[Tensor, "length k"]  # KL(clean || first key masked), that head alone
    skipped: tuple[tuple[int, str], ...]
    bos: Bos
    n_prompts: int
    model_name: str = ""

    def to_dataframe(self):
        """Long format: one row per (length, top head)."""
        import pandas as pd

        rows = []
        for i, T in enumerate(self.lengths):
            for r in range(self.top_layer.shape[1]):
                rows.append({
                    "bos": self.bos, "length": T, "rank": r, "layer": int(self.top_layer[i, r]),
                    "head": int(self.top_head[i, r]), "score": float(self.top_score[i, r]),
                    "mask_first_cost": float(self.mask_first_cost[i, r]),
                    "mean_score": float(self.mean_score[i]), "uniform_score": float(self.uniform_score[i]),
                    **{f"sink_rate_{format_eps(e)}": float(self.sink_rate[i, j]) for j, e in enumerate(self.eps)},
                })
        return pd.DataFrame(rows)

    def to_dict(self) -> dict:
        return {
            "model": self.model_name, "bos": self.bos, "n_prompts": self.n_prompts,
            "skipped": [{"length": T, "reason": why} for T, why in self.skipped],
            "results": [
                {
                    "length": T,
                    "sink_rate": {format_eps(e): float(self.sink_rate[i, j]) for j, e in enumerate(self.eps)},
                    "mean_score": float(self.mean_score[i]),
                    "uniform_score": float(self.uniform_score[i]),
                    "top_heads": [
                        {"layer": int(self.top_layer[i, r]), "head": int(self.top_head[i, r]),
                         "score": float(self.top_score[i, r]), "mask_first_cost": float(self.mask_first_cost[i, r])}
                        for r in range(self.top_layer.shape[1])
                    ],
                }
                for i, T in enumerate(self.lengths)
            ],
        }


def long_prompts(model: Model, n_prompts: int, n_tokens: int, *, bos: Bos = "prepend",
                 bos_token_id: int | None = None) -> TokenBatch:
    """`n_prompts` windows of the default corpus with at least `n_tokens` content
    tokens each (cut to the model's context), for `sinks_vs_length`."""
    n_tokens = min(n_tokens, model.cfg.n_ctx - 1)  # room for <bos> in either condition, as in `tokenize`
    texts = default_corpus(n_prompts, words=n_tokens)  # a word is >= 1 token for BPE tokenizers
    return tokenize(model, texts, bos=bos, max_tokens=n_tokens, bos_token_id=bos_token_id)


def truncate(batch: TokenBatch, n_content: int) -> TokenBatch:
    """The first `n_content` content tokens of every row (all rows must have them)."""
    width = batch.offset + n_content
    return TokenBatch(batch.tokens[:, :width], batch.lengths.clamp(max=width), batch.bos, batch.bos_token_id,
                      batch.context_limit)


def sinks_vs_length(
    model: Model,
    batch: TokenBatch,
    *,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    top_k: int = 3,
    eps: Sequence[float] = DEFAULT_EPS,
    batch_size: int = 8,
    progress: bool = True,
) -> LengthSweep:
    """Sink rate and top-head mask_first cost as the evaluation length grows.

    Args:
        batch: long prompts (e.g. `long_prompts`); each length T uses the first
            T content tokens of every row.
        lengths: content lengths to measure; those beyond the model's context or
            beyond the shortest prompt are skipped (listed in `skipped`).
        top_k: strongest sink heads (mean alpha_0 at that length) whose
            single-head mask_first cost is measured.
        eps: sink-rate thresholds.

    Returns:
        LengthSweep with [length, ...] tensors.
    """
    lengths = tuple(int(T) for T in lengths)
    if not lengths or any(T < 2 for T in lengths):
        raise ValueError(f"lengths must be one or more integers >= 2, got {lengths}")
    if not 1 <= top_k <= model.cfg.n_layers * model.cfg.n_heads:
        raise ValueError(f"top_k must lie in [1, {model.cfg.n_layers * model.cfg.n_heads}], got {top_k}")
    eps = tuple(check_eps(e) for e in eps)
    shortest = int(batch.lengths.min()) - batch.offset
    done, skipped = [], []
    for T in lengths:
        if T > model.cfg.n_ctx - 1:
            skipped.append((T, f"longer than the model's context allows ({model.cfg.n_ctx} positions, one kept for <bos>)"))
        elif T > shortest:
            skipped.append((T, f"the shortest prompt has {shortest} content tokens"))
        else:
            done.append(T)
    rates, means, uniform, tl, th, ts, cost = [], [], [], [], [], [], []
    for T in tqdm(done, desc="sinks vs length", disable=not progress, unit="length"):
        sub = truncate(batch, T)
        ss = sink_scores(model, sub, batch_size=batch_size, progress=False)
        rates.append([ss.sink_rate(e) for e in eps])
        means.append(float(ss.scores.mean()))
        uniform.append(ss.uniform_score())
        heads = ss.top_heads(top_k)
        tl.append([l for l, _, _ in heads])
        th.append([h for _, h, _ in heads])
        ts.append([s for _, _, s in heads])
        cost.append([
            float(head_ablations(model, sub, mode="mask_first", layers=[l], heads=[h], progress=False).effects[0, 0])
            for l, h, _ in heads
        ])
    k = top_k
    return LengthSweep(
        lengths=tuple(done), eps=eps,
        sink_rate=torch.tensor(rates, dtype=torch.float).reshape(len(done), len(eps)),
        mean_score=torch.tensor(means, dtype=torch.float), uniform_score=torch.tensor(uniform, dtype=torch.float),
        top_layer=torch.tensor(tl, dtype=torch.long).reshape(len(done), k),
        top_head=torch.tensor(th, dtype=torch.long).reshape(len(done), k),
        top_score=torch.tensor(ts, dtype=torch.float).reshape(len(done), k),
        mask_first_cost=torch.tensor(cost, dtype=torch.float).reshape(len(done), k),
        skipped=tuple(skipped), bos=batch.bos, n_prompts=len(batch), model_name=model.cfg.model_name,
    )
