"""Learned sink logits, retrofitted: gpt-oss's mechanism put into a frozen model
that was trained with `<bos>`.

gpt-oss adds one learned logit b per head to every softmax row, a sink that takes
e^b / (e^b + sum_j e^{s_j}) of the row and writes nothing (`learned_sinks`). Here
such logits (one per (layer, head), or one per layer, or on the top-k sink heads
only) and optionally a value per head are fitted by gradient descent on the
next-token loss of prompts without `<bos>` (the model frozen; the phantom sink's
logits form, `sinkmech.interventions.phantom`), then scored on disjoint held-out
prompts: what share of the `<bos>` cost do they recover? Loss: the mean
next-token loss on content targets 1..n-1 (`sinkmech.measures.loss`), the same
targets with and without `<bos>`. Seeded; the fitting prompts are recorded (texts
and token hashes) and refused for evaluation.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from jaxtyping import Float
from torch import Tensor
from torch.utils.checkpoint import checkpoint
from tqdm.auto import tqdm

from sinkmech.hooks import act_name, right_padding
from sinkmech.interventions.phantom import PhantomSink, bos_state, paired_mass, phantom_hooks
from sinkmech.interventions.sink_file import token_hash
from sinkmech.loading.backend import Model, forward, unembed
from sinkmech.measures.loss import target_mask
from sinkmech.options import RunOptions
from sinkmech.prompts import TokenBatch
from sinkmech.results import Result
from sinkmech.stats import interval_description, n_documents, ratio_with_ci

FitPer = Literal["head", "layer"]
PER: tuple[str, ...] = ("head", "layer")
UNEMBED_ROWS = 128  # rows unembedded at once in the fit (recomputed in the backward pass: checkpointed)


@dataclass(frozen=True)
class FitSettings:
    """What is fitted and how.

    Attributes:
        per: "head" (one logit per (layer, head)) or "layer" (one per layer, shared by its heads).
        value: also fit a value vector per head (started at `<bos>`'s own value).
        top_k: only the k heads that put the most attention on `<bos>` on the
            fitting prompts get a sink (None: every head).
        steps, lr: Adam steps over minibatches of `batch_prompts` fitting prompts.
        seed: the minibatch order.
    """

    per: FitPer = "head"
    value: bool = False
    top_k: int | None = None
    steps: int = 100
    lr: float = 0.1
    batch_prompts: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        if self.per not in PER:
            raise ValueError(f"per must be one of {PER}, got {self.per!r}")
        for name in ("steps", "batch_prompts"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1):
            raise ValueError(f"top_k must be an integer >= 1, got {self.top_k!r}")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a finite number > 0, got {self.lr!r}")
        if self.per == "layer" and self.top_k is not None:
            raise ValueError("top_k chooses heads: fit per head with it, not per layer")

    @property
    def name(self) -> str:
        """The variant's name in findings and file names: head, head_value, layer, head_top8, ..."""
        return self.per + ("_value" if self.value else "") + (f"_top{self.top_k}" if self.top_k else "")


@dataclass(frozen=True)
class FittedSinks(Result):
    """Fitted sink logits [layer head_index] (-inf: no sink at that head), values
    [layer head_index d_head] or None, the training loss per step, and the
    fitting prompts (never to be evaluated on)."""

    logits: Float[Tensor, "layer head_index"]
    values: Float[Tensor, "layer head_index d_head"] | None
    settings: FitSettings
    loss_trace: tuple[float, ...]
    fit_prompts: tuple
    fit_token_hashes: tuple[str, ...]
    heads: tuple[tuple[int, int], ...]  # the heads that have a sink
    model_name: str = ""
    evaluation: dict = field(default_factory=dict)  # `evaluate_sinks`, when scored

    def phantom(self) -> PhantomSink:
        """The phantom sink these logits (and values) make."""
        return PhantomSink("logits", "zero" if self.values is None else self.values, "dump", self.logits,
                           heads=self.heads)

    def to_dict(self) -> dict:
        grid = [[None if not math.isfinite(float(b)) else float(b) for b in row] for row in self.logits]
        return {
            "model": self.model_name,
            "variant": self.settings.name,
            "settings": {"per": self.settings.per, "value": self.settings.value, "top_k": self.settings.top_k,
                         "steps": self.settings.steps, "lr": self.settings.lr,
                         "batch_prompts": self.settings.batch_prompts, "seed": self.settings.seed},
            "n_layers": self.logits.shape[0], "n_heads": self.logits.shape[1],
            "heads": [list(h) for h in self.heads],
            "sink_logits": grid,
            "sink_values": None if self.values is None else self.values.tolist(),
            "loss_trace": list(self.loss_trace),
            "n_fit_prompts": len(self.fit_prompts),
            "fit_prompts": list(self.fit_prompts),
            "fit_token_hashes": list(self.fit_token_hashes),
            **({"evaluation": self.evaluation} if self.evaluation else {}),
        }

    def to_dataframe(self):
        import pandas as pd

        L, H = self.logits.shape
        return pd.DataFrame([{"layer": l, "head": h, "sink_logit": float(self.logits[l, h])}
                             for l in range(L) for h in range(H)])


def content_rows_hashes(batch: TokenBatch) -> tuple[str, ...]:
    return tuple(token_hash(r) for r in batch.content())


def bos_mass(model: Model, content: TokenBatch, bos_token_id: int, options: RunOptions = RunOptions()
             ) -> Float[Tensor, "prompt layer head_index"]:
    """Per prompt and head: the attention on `<bos>` averaged over the content
    queries of the with-`<bos>` run (the paired phantom's mass, `paired_mass`)."""
    out = torch.zeros(len(content), model.cfg.n_layers, model.cfg.n_heads)
    for rows, part in content.batches(options.batch(8)):
        m = paired_mass(model, part, bos_token_id)
        out[rows] = (m.sum(-1) / part.lengths.to(m.device)[:, None, None]).cpu()
    return out


def _initial_logits(model: Model, part: TokenBatch, mass: Tensor) -> Tensor:
    """b with e^b / (e^b + Z) equal to the head's mean `<bos>` mass at the mean
    log Z of the run without `<bos>` (one pass): where the fit starts."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    lse = torch.zeros(L, H)
    valid = part.mask.float()

    def keep(scores, hook):
        z = torch.logsumexp(scores.float(), -1)  # [batch head query]
        lse[hook.layer()] = ((z * valid[:, None]).sum((0, 2)) / valid.sum()).cpu()

    from sinkmech.hooks import run

    run(model, part.tokens, [(act_name("attn_scores", l), keep) for l in range(L)], stop_at_layer=L)
    m = mass.clamp(1e-4, 1 - 1e-4)
    return torch.log(m / (1 - m)) + lse


def _batch_loss(model: Model, part: TokenBatch, hooks) -> tuple[Tensor, int]:
    """Summed next-token loss on the batch's content targets, with gradients to
    whatever the hooks hold (the model's own weights frozen), unembedded a few
    rows at a time and recomputed in the backward pass."""
    L = model.cfg.n_layers
    with right_padding(model):
        resid = forward(model, part.tokens, stop_at_layer=L, fwd_hooks=hooks)
    mask = target_mask(part)
    step = max(1, UNEMBED_ROWS // len(part))
    total = resid.new_zeros((), dtype=torch.float32)

    def nll(r: Tensor, t: Tensor, m: Tensor) -> Tensor:
        logits = unembed(model, r).float()
        return ((logits.logsumexp(-1) - logits.gather(-1, t[..., None])[..., 0]) * m).sum()

    T = part.tokens.shape[1]
    for a in range(0, T - 1, step):
        b = min(a + step, T - 1)
        m = mask[:, a:b]
        if m.any():
            total = total + checkpoint(nll, resid[:, a:b], part.tokens[:, a + 1 : b + 1], m.float(), use_reentrant=False)
    return total, int(mask[:, :-1].sum())


def fit_sinks(
    model: Model,
    fit: TokenBatch,
    settings: FitSettings = FitSettings(),
    *,
    fit_prompts: tuple = (),
    options: RunOptions = RunOptions(),
) -> FittedSinks:
    """Fit sink logits (and values) on `fit` (content tokens, bos="none"), the model frozen.

    Args:
        fit: the fitting prompts without `<bos>` (their `<bos>` mass, for the
            starting logits and top-k, comes from the same content with `<bos>` first).
        settings: what is fitted (`FitSettings`).
        fit_prompts: the prompts' texts, recorded beside their token hashes.
        options: `progress` shows the fit's progress bar; `batch_size` the
            passes that measure the `<bos>` mass; `bos_token_id` (default the tokenizer's).

    Returns:
        FittedSinks (unscored: see `evaluate_sinks`).
    """
    if fit.bos != "none":
        raise ValueError("sinks are fitted on the run without <bos>: build the batch with bos='none'")
    bos_token_id = options.bos_token_id
    if bos_token_id is None:
        from sinkmech.loading.models import bos_token_id as model_bos

        bos_token_id = model_bos(model)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    mass = bos_mass(model, fit, bos_token_id, options).mean(0)  # [layer head]
    if settings.top_k is not None:
        if settings.top_k > L * H:
            raise ValueError(f"top_k {settings.top_k} is more than the model's {L * H} heads")
        order = mass.flatten().argsort(descending=True, stable=True)[: settings.top_k]
        heads = tuple(sorted((int(i) // H, int(i) % H) for i in order))
    else:
        heads = tuple((l, h) for l in range(L) for h in range(H))
    start = _initial_logits(model, fit.slice(0, min(len(fit), 16)), mass)
    if settings.per == "layer":
        b = start.mean(1).clone().requires_grad_(True)
    else:
        b = start.clone().requires_grad_(True)
    params = [b]
    u = None
    if settings.value:
        u = bos_state(model, bos_token_id).values.clone().requires_grad_(True)
        params.append(u)
    opt = torch.optim.Adam(params, lr=settings.lr)
    g = torch.Generator().manual_seed(settings.seed)
    order: list[int] = []
    trace = []
    frozen = [p for p in model.parameters() if p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    try:
        bar = tqdm(range(settings.steps), desc=f"fit sinks ({settings.name})", disable=not options.progress, unit="step")
        for _ in bar:
            if len(order) < settings.batch_prompts:
                order += torch.randperm(len(fit), generator=g).tolist()
            pick, order = order[: settings.batch_prompts], order[settings.batch_prompts :]
            part = _rows(fit, pick)
            logits = b[:, None].expand(L, H) if settings.per == "layer" else b
            spec = PhantomSink("logits", "zero" if u is None else u, "dump", logits, heads=heads)
            opt.zero_grad()
            with torch.enable_grad():
                total, n = _batch_loss(model, part, phantom_hooks(model, spec))
                (total / n).backward()
            opt.step()
            trace.append(float(total.detach()) / n)
            bar.set_postfix(loss=f"{trace[-1]:.3f}")
    finally:
        for p in frozen:
            p.requires_grad_(True)
    final = (b[:, None].expand(L, H) if settings.per == "layer" else b).detach().clone()
    chosen = torch.zeros(L, H, dtype=torch.bool)
    for l, h in heads:
        chosen[l, h] = True
    final = torch.where(chosen, final, torch.tensor(float("-inf")))
    return FittedSinks(final.float(), None if u is None else u.detach().clone().float(), settings, tuple(trace),
                       tuple(fit_prompts), content_rows_hashes(fit), heads, model.cfg.model_name)


def _rows(batch: TokenBatch, pick: list[int]) -> TokenBatch:
    """The rows `pick` of a batch, trimmed to their longest."""
    idx = torch.tensor(pick, device=batch.tokens.device)
    lengths = batch.lengths[idx]
    return TokenBatch(batch.tokens[idx, : int(lengths.max())], lengths, batch.bos, batch.bos_token_id,
                      batch.context_limit)


def evaluate_sinks(model: Model, held: TokenBatch, fitted: FittedSinks, *, documents: Sequence | None = None,
                   options: RunOptions = RunOptions()) -> dict:
    """The fitted sinks on held-out prompts (content tokens, bos="none"; any prompt the
    sinks were fitted on is refused): the loss with `<bos>` first, without it, and
    without it with the fitted sinks, per content target with bootstrap intervals
    over prompts (over their `documents`, one per prompt, where given: a cluster
    bootstrap); the share of the `<bos>` cost they recover, (none - fitted) /
    (none - bos) as a ratio of sums; and per head the learned sink's mass against
    the attention on `<bos>` (both mean over content queries). `options.bos_token_id`:
    the `<bos>` (default the tokenizer's)."""
    from sinkmech.measures.sinks import sink_scores

    if held.bos != "none":
        raise ValueError("evaluate on the content tokens without <bos> (bos='none')")
    if documents is not None and len(documents) != len(held):
        raise ValueError(f"{len(documents)} documents for {len(held)} held-out prompts")
    seen = set(fitted.fit_token_hashes) & set(content_rows_hashes(held))
    if seen:
        raise ValueError(f"{len(seen)} held-out prompt(s) hold the same tokens as fitting prompts: evaluate on others")
    bos_token_id = options.bos_token_id
    if bos_token_id is None:
        from sinkmech.loading.models import bos_token_id as model_bos

        bos_token_id = model_bos(model)
    from sinkmech.interventions.phantom import with_bos_column

    kw = dict(loss=True, options=options.replace(batch_size=options.batch(8)))
    first = sink_scores(model, with_bos_column(held, bos_token_id), **kw)
    none = sink_scores(model, held, **kw)
    learned = sink_scores(model, held, sink=fitted.phantom(), **kw)
    targets = first.prompt_targets().double()
    bos = bos_mass(model, held, bos_token_id, options)
    cost = none.prompt_loss - first.prompt_loss
    ci = functools.partial(ratio_with_ci, groups=documents)
    return {
        "n_prompts": len(held),
        "n_documents": n_documents(documents, len(held)),
        "interval": interval_description(documents, len(held)),
        "loss": {"bos": ci(first.prompt_loss, targets), "none": ci(none.prompt_loss, targets),
                 "fitted": ci(learned.prompt_loss, targets)},
        "vs_bos": {"none": ci(cost, targets), "fitted": ci(learned.prompt_loss - first.prompt_loss, targets)},
        "recovery": ci(none.prompt_loss - learned.prompt_loss, cost) if float(cost.sum()) > 0 else None,
        "learned_mass": learned.phantom_mass.mean(0).tolist(),
        "bos_mass": bos.mean(0).tolist(),
    }
