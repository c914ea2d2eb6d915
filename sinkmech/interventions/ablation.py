"""Per-head sink ablations over every (layer, head) in one call, exact and attributed.

Switching one head's sink off tests the paper's claim that the sink is the
head's no-op (Barbero et al. 2025, Sec. 3; Guo et al. 2024 for dormant heads).
Modes: `mask_first` (the head cannot attend to the first key; its row
renormalises over the others; a learned sink logit, gpt-oss's, stays in),
`all_to_first` (all attention on the first key: fully dormant), `zero` (output
zeroed), `mean` (output replaced by its mean over the prompts' real positions),
`drop_sink` (a model with learned sink logits only: the head's sink logit
removed, its softmax over the real keys alone). The effect is a metric of the ablated run
against the clean run (default mean KL over content positions). `attribute`
estimates all heads from one batched forward and backward pass.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Literal, Sequence

import torch
from jaxtyping import Bool, Float
from torch import Tensor
from tqdm.auto import tqdm

from sinkmech.loading.backend import NO_LEARNED_SINKS, Model, has_learned_sinks
from sinkmech.hooks import (
    act_name, all_to_first_hook, cached_run, check_head, drop_sink_hook, mask_first_hook, mean_head_hook, row_queries,
    zero_head_hook,
)
from sinkmech.interventions.metrics import (
    Bound, Custom, LogitDiff, Logits, Metric, MetricSpec, content_mask, one_copy, resolve_metric,
)
from sinkmech.prompts import Bos, PromptSource, TokenBatch, as_batch
from sinkmech.interventions.sweep import Intervention, clean_pass, sweep
from sinkmech.options import QUIET, RunOptions
from sinkmech.results import Result

AblationMode = Literal["mask_first", "all_to_first", "zero", "mean", "drop_sink"]
MODES: tuple[str, ...] = ("mask_first", "all_to_first", "zero", "mean")  # for every model
SINK_MODES: tuple[str, ...] = ("drop_sink",)  # for models with learned sink logits (gpt-oss)
# Which activation each mode rewrites (hooks.py holds the rewrites themselves).
MODE_ACT = {"mask_first": "attn_scores", "all_to_first": "pattern", "zero": "z", "mean": "z", "drop_sink": "pattern"}


def check_mode(mode: str, model: Model | None = None) -> AblationMode:
    """`mode` checked; with `model`, drop_sink is refused for a model without learned sink logits."""
    if mode not in MODES + SINK_MODES:
        raise ValueError(f"mode must be one of {MODES + SINK_MODES}, got {mode!r}")
    if mode == "drop_sink" and model is not None and not has_learned_sinks(model):
        raise ValueError(f"mode drop_sink: {model.cfg.model_name or 'the model'} {NO_LEARNED_SINKS}")
    return mode  # type: ignore[return-value]


@dataclass(frozen=True)
class HeadAblation(Result):
    """Effect of ablating each head alone: `effects[layer, head]` is the metric of
    the ablated run against the clean run (for KL, 0 = no effect); `baseline`
    is the clean run's own metric. `method` is "sweep" (exact) or "attribution"
    (estimated); "loop" for the one-pass-per-head reference."""

    effects: Float[Tensor, "layer head_index"]
    mode: AblationMode
    metric: str
    bos: Bos
    baseline: float
    method: str
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    n_prompts: int

    @property
    def n_layers(self) -> int:
        return self.effects.shape[0]

    @property
    def n_heads(self) -> int:
        return self.effects.shape[1]

    def top_heads(self, k: int = 10) -> list[tuple[int, int, float]]:
        """(layer, head, effect) of the k heads with the largest |effect - baseline|."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        score = (self.effects - self.baseline).abs().flatten()
        idx = score.topk(min(k, score.numel())).indices
        return [(self.layers[int(i) // self.n_heads], self.heads[int(i) % self.n_heads], float(self.effects.flatten()[i])) for i in idx]

    def to_dataframe(self):
        import pandas as pd

        rows = [(l, h, float(self.effects[a, b])) for a, l in enumerate(self.layers) for b, h in enumerate(self.heads)]
        df = pd.DataFrame(rows, columns=["layer", "head", "effect"])
        return df.assign(mode=self.mode, metric=self.metric, bos=self.bos, method=self.method)

    def to_dict(self) -> dict:
        return {
            "mode": self.mode, "metric": self.metric, "bos": self.bos, "method": self.method,
            "n_layers": self.n_layers, "n_heads": self.n_heads, "layers": list(self.layers),
            "heads": list(self.heads), "n_prompts": self.n_prompts, "baseline": self.baseline,
            "effects": self.effects.tolist(),
        }


def mean_head_outputs(model: Model, batch: TokenBatch) -> Float[Tensor, "layer head_index d_head"]:
    """Each head's output z averaged over all real (prompt, position) pairs."""
    names = [act_name("z", l) for l in range(model.cfg.n_layers)]
    _, cache = cached_run(model, batch.tokens, names, stop_at_layer=model.cfg.n_layers)
    w = batch.mask.float()[:, :, None, None]
    return torch.stack([(cache[n] * w).sum((0, 1)) / w.sum() for n in names])


@dataclass(frozen=True)
class AblationSetup:
    """What every per-head ablation estimate shares: the tokens, the (layer, head)
    grid, the clean run's content logits, the metric bound to them, and (mode
    "mean") each head's mean output. Built once by `ablation_setup`."""

    batch: TokenBatch
    mode: AblationMode
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    metric: Metric
    reference: Logits  # [batch content_pos d_vocab], unembedded lazily
    mask: Bool[Tensor, "batch content_pos"]
    means: Float[Tensor, "layer head_index d_head"] | None
    # the clean run's residual stream entering every layer (the sweep's restarts), from the pass that gave `reference`
    starts: tuple[Tensor, ...]

    @property
    def n_content(self) -> int:
        return self.batch.tokens.shape[1] - self.batch.offset

    @property
    def score(self) -> Bound:
        """The metric against the clean run: logits [copies, batch, content_pos, d_vocab] -> [copies]."""
        return self.metric.bind(self.reference, self.mask)

    @property
    def baseline(self) -> float:
        """The clean run's own metric (0 for KL)."""
        return float(self.score(one_copy(self.reference))[0])

    def cells(self) -> list[Intervention]:
        """One intervention per (layer, head) of the grid, layer by layer: what an
        engine (`sweep.sweep`, or the reference `sweep.loop`) scores."""
        return [Intervention(l, ablation_hooks(self.mode, l, h, self.means)) for l in self.layers for h in self.heads]

    def result(self, effects: Float[Tensor, "layer head_index"], method: str, baseline: float | None = None) -> HeadAblation:
        return HeadAblation(
            effects=effects, mode=self.mode, metric=self.metric.name, bos=self.batch.bos,
            baseline=self.baseline if baseline is None else baseline, method=method,
            layers=self.layers, heads=self.heads, n_prompts=len(self.batch),
        )


def pair_ablations(model: Model, tokens: PromptSource | TokenBatch, pairs: Sequence[tuple[int, int]], *,
                   mode: AblationMode, metric: MetricSpec = "kl", bos: Bos | None = None,
                   options: RunOptions = QUIET) -> list[HeadAblation]:
    """Each (layer, head) of `pairs` ablated alone: what `head_ablations(tokens,
    layers=[l], heads=[h])` gives for each, from one clean run and one sweep
    (the heads of one layer share its passes) instead of one of each per head.
    One HeadAblation per pair, in their order, its effects [1, 1]."""
    pairs = [(int(l), int(h)) for l, h in pairs]
    s = ablation_setup(model, tokens, mode=mode, metric=metric, layers=sorted({l for l, _ in pairs}),
                       heads=sorted({h for _, h in pairs}), bos=bos, options=options)
    cells = [Intervention(l, ablation_hooks(mode, l, h, s.means)) for l, h in pairs]
    values = sweep(model, s.batch.tokens, cells, score=s.score, offset=s.batch.offset, n_content=s.n_content,
                   options=options, desc=f"ablate {mode}", starts=s.starts)
    return [replace(s, layers=(l,), heads=(h,)).result(values[i].reshape(1, 1), "sweep") for i, (l, h) in enumerate(pairs)]


def ablation_weight(metric: str, batch: TokenBatch) -> float:
    """What an ablation effect averages over: real content positions for KL, prompts otherwise."""
    return float((batch.lengths - batch.offset).sum()) if metric == "kl" else float(len(batch))


def _grouped_ablations(model, tokens, prompt_batch: int, *, mode, bos, metric, max_tokens, layers, heads,
                       options: RunOptions) -> HeadAblation:
    """`head_ablations` over groups of `prompt_batch` prompts, combined by weight."""
    if isinstance(prompt_batch, bool) or not isinstance(prompt_batch, int) or prompt_batch < 1:
        raise ValueError(f"prompt_batch must be a positive integer, got {prompt_batch!r}")
    check_mode(mode, model)
    if mode == "mean":
        raise ValueError("prompt_batch: the mean ablation needs every prompt at once (the mean output); "
                         "use mask_first, all_to_first or zero")
    resolved = resolve_metric(metric)
    if isinstance(resolved, Custom):
        raise ValueError("prompt_batch: a callable metric has no per-group average to combine; use 'kl' or 'logit_diff'")
    batch = as_batch(model, tokens, bos=bos, default="prepend", max_tokens=max_tokens,
                     bos_token_id=options.bos_token_id)
    weighted = []  # (one group's HeadAblation, its weight)
    with tqdm(total=len(batch), desc=f"ablate {mode}", disable=not options.progress, unit="prompt") as bar:
        for rows, part in batch.batches(prompt_batch):
            one = head_ablations(model, part, mode=mode, metric=_metric_rows(resolved, rows, len(batch)),
                                 layers=layers, heads=heads, options=options.replace(progress=False))
            weighted.append((one, ablation_weight(one.metric, part)))
            bar.update(len(part))
    total = sum(w for _, w in weighted)
    effects = sum(r.effects.double() * w for r, w in weighted) / total
    baseline = sum(r.baseline * w for r, w in weighted) / total
    return replace(weighted[0][0], effects=effects.float(), baseline=baseline, n_prompts=len(batch))


def _metric_rows(metric: Metric, rows: slice, n_prompts: int) -> MetricSpec:
    """A logit difference with one answer per prompt, cut to `rows`; KL by its name."""
    if not isinstance(metric, LogitDiff):
        return "kl"

    def cut(ids):
        t = torch.as_tensor(ids)
        return t[rows] if t.ndim == 1 and len(t) == n_prompts else ids

    return replace(metric, correct=cut(metric.correct), incorrect=cut(metric.incorrect))


def ablation_setup(
    model: Model,
    tokens: PromptSource | TokenBatch,
    *,
    mode: AblationMode,
    metric: MetricSpec = "kl",
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    bos: Bos | None = None,
    max_tokens: int | None = None,  # prompts: 64; a TokenBatch: checked only when given
    options: RunOptions = QUIET,
) -> AblationSetup:
    """Check the options, tokenize once (see `prompts.as_batch`; default
    "prepend") and run the clean pass(es) an ablation estimate needs.

    Args:
        tokens: a TokenBatch, or prompts.
        mode, metric, layers, heads: as in `head_ablations`.
        options: the `<bos>` id for prompts of a model without a tokenizer.
    """
    check_mode(mode, model)
    batch = as_batch(model, tokens, bos=bos, default="prepend", max_tokens=max_tokens,
                     bos_token_id=options.bos_token_id)
    layers = tuple(range(model.cfg.n_layers)) if layers is None else tuple(layers)
    heads = tuple(range(model.cfg.n_heads)) if heads is None else tuple(heads)
    for l in layers:
        for h in heads:
            check_head(model, l, h)
    n_content = batch.tokens.shape[1] - batch.offset
    reference, starts = clean_pass(model, batch.tokens, batch.offset, n_content)
    return AblationSetup(
        batch=batch, mode=mode, layers=layers, heads=heads, metric=resolve_metric(metric),
        reference=reference, mask=content_mask(batch.lengths, batch.offset, n_content),
        means=mean_head_outputs(model, batch) if mode == "mean" else None, starts=tuple(starts),
    )


def ablation_hooks(mode: AblationMode, layer: int, head: int, means: Tensor | None) -> Callable:
    """The intervention for one head, acting on its own rows of a stacked batch."""
    name = act_name(MODE_ACT[mode], layer)

    def make(rows: slice, n_rows: int, n_pos: int):
        q = row_queries(rows, n_rows, n_pos, device=means.device if means is not None else None)
        if mode == "mask_first":
            return [(name, mask_first_hook(head, q))]
        if mode == "all_to_first":
            return [(name, all_to_first_hook(head, q))]
        if mode == "zero":
            return [(name, zero_head_hook(head, q))]
        if mode == "drop_sink":
            return [(name, drop_sink_hook(head, q))]
        return [(name, mean_head_hook(head, means[layer, head], q))]

    return make


def head_ablations(
    model: Model,
    tokens: PromptSource | TokenBatch,
    *,
    mode: AblationMode,
    bos: Bos | None = None,
    metric: MetricSpec = "kl",
    max_tokens: int | None = None,  # prompts: 64; a TokenBatch: checked only when given
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    prompt_batch: int | None = None,
    options: RunOptions = RunOptions(),
) -> HeadAblation:
    """Ablate every (layer, head) alone and score each ablated run.

    Args:
        tokens: a ready TokenBatch, or prompts tokenized once (see `tokenize`;
            `bos` defaults to "prepend", a TokenBatch keeps its own).
        mode: "mask_first", "all_to_first", "zero", "mean" or, for a model with
            learned sink logits (gpt-oss), "drop_sink". mask_first leaves a
            learned sink logit in: the row renormalises over it and keys 1 .. t.
        metric: "kl" (mean KL(clean || ablated) over content positions),
            `LogitDiff(correct, incorrect)` (`sinkmech.interventions.metrics`),
            or f(logits, reference, mask).
        layers, heads: a sub-grid to sweep (default: all).
        prompt_batch: prompts per group of forward passes (default: all at
            once). 1 makes each prompt's forward passes independent of which
            prompts share its batch, so shards of a corpus merge to the whole
            run to float32 rounding of the means (float32 forward passes of
            different batch sizes round differently: 3.4e-6 relative on
            SmolLM2 at 6 tokens); the groups' effects are combined in float64,
            weighted as the metric averages (content positions for KL,
            prompts for a logit difference).
            Not for mode "mean" or a callable metric (no per-group average).
        options: rows per stacked forward pass (copies x prompts; default 128:
            memory grows with it), progress bar, the `<bos>` id for prompts.

    Each head's copies of the prompts run batched, restarting at the head's
    layer (`sweep.sweep`); `ablation_setup(...).cells()` scored by `sweep.loop`,
    one `run_with_hooks` per head, is the reference it equals (tests).

    Returns:
        HeadAblation with effects [layer, head_index].
    """
    if prompt_batch is not None:
        return _grouped_ablations(model, tokens, prompt_batch, mode=mode, bos=bos, metric=metric,
                                  max_tokens=max_tokens, layers=layers, heads=heads, options=options)
    s = ablation_setup(model, tokens, mode=mode, metric=metric, layers=layers, heads=heads, bos=bos,
                       max_tokens=max_tokens, options=options)
    values = sweep(model, s.batch.tokens, s.cells(), score=s.score, offset=s.batch.offset, n_content=s.n_content,
                   options=options, desc=f"ablate {mode}", starts=s.starts)
    return s.result(values.reshape(len(s.layers), len(s.heads)), "sweep")
