"""The batched intervention engine behind every patching and ablation sweep.

An intervention that first touches layer l cannot change anything before l,
so the residual stream entering layer l is taken from one clean run and the
forward pass restarts there (`start_at_layer=l`). Many interventions on the
same layer run in one forward pass: the prompts are stacked once per
intervention and each intervention's hooks act on its own rows only. The
result equals one full forward pass with hooks per intervention (`loop`, kept as the
reference implementation) up to float rounding.

A pass stops at the last block's output and hands the metric `Unembedded`
logits: the content positions' residual stream, unembedded only where the
metric reads it, so no pass holds [rows, pos, d_vocab] logits (with Gemma 3's
262k vocabulary those were a GiB per pass, and the reference's another).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from sinkmech.loading.backend import Model, unembed
from sinkmech.hooks import Hook, act_name, cached_run, run
from sinkmech.interventions.metrics import Bound, Unembedded, content_logits
from sinkmech.options import QUIET, RunOptions

# (rows of the stacked batch this intervention owns, total rows, positions) -> hooks
HookMaker = Callable[[slice, int, int], list[Hook]]


@dataclass(frozen=True)
class Intervention:
    """One cell of a sweep: the first layer it touches and how to build its hooks."""

    layer: int
    hooks: HookMaker


def clean_pass(model: Model, tokens: Int[Tensor, "batch pos"], offset: int, n_content: int
               ) -> tuple[Unembedded, list[Tensor]]:
    """The clean run once: its content logits (unembedded lazily: what
    `reference_logits` gives) and the residual stream entering every layer,
    [batch pos d_model] each (the restarts `sweep` takes as `starts`)."""
    L = model.cfg.n_layers
    names = [act_name("resid_pre", l) for l in range(L)]
    last = act_name("resid_post", L - 1)  # the last block's output: what a pass stopped after it returns
    _, cache = cached_run(model, tokens, [*names, last], stop_at_layer=L)
    return unembedded(model, cache[last], offset, n_content), [cache[n] for n in names]


def unembedded(model: Model, resid: Float[Tensor, "*copies batch pos d_model"], offset: int,
               n_content: int) -> Unembedded:
    """The content positions' logits of a pass stopped after its last block, unembedded lazily
    (without grad, as the pass itself ran)."""
    def logits(x: Tensor) -> Tensor:
        with torch.no_grad():
            return unembed(model, x)

    return Unembedded(resid[..., offset : offset + n_content, :], logits)


def sweep(
    model: Model,
    tokens: Int[Tensor, "batch pos"],
    interventions: Sequence[Intervention],
    *,
    starts: Sequence[Tensor],
    score: Bound,
    offset: int,
    n_content: int,
    desc: str = "sweep",
    options: RunOptions = RunOptions(),
) -> Float[Tensor, " cell"]:
    """Score every intervention, batching those that start at the same layer.

    Args:
        tokens: the run being intervened on, right-padded [batch, pos].
        starts: its clean residual stream entering every layer (`clean_pass`),
            where each intervention's pass restarts.
        score: a bound metric, logits [copies, batch, content_pos, d_vocab] -> [copies].
        offset, n_content: content token j sits at position offset + j.
        options: rows per forward pass (copies x batch; default 128; at least one
            copy runs), progress bar.

    Returns:
        One metric value per intervention, in the order given.
    """
    max_rows = options.batch(128)
    batch, n_pos = tokens.shape
    per_pass = max(1, max_rows // batch)
    by_layer: dict[int, list[int]] = {}
    for i, cell in enumerate(interventions):
        if not 0 <= cell.layer < model.cfg.n_layers:
            raise ValueError(f"layer {cell.layer} out of range: the model has {model.cfg.n_layers} layers")
        by_layer.setdefault(cell.layer, []).append(i)
    values = torch.empty(len(interventions))
    bar = tqdm(total=len(interventions), desc=desc, disable=not options.progress, unit="cell")
    for layer in sorted(by_layer):
        ids = by_layer[layer]
        for a in range(0, len(ids), per_pass):
            chunk = ids[a : a + per_pass]
            n = len(chunk)
            rows = n * batch
            hooks: list[Hook] = []
            for c, i in enumerate(chunk):
                hooks += interventions[i].hooks(slice(c * batch, (c + 1) * batch), rows, n_pos)
            resid = starts[layer].repeat(n, 1, 1)
            last = run(model, resid, hooks, start_at_layer=layer, stop_at_layer=model.cfg.n_layers)
            logits = unembedded(model, last.reshape(n, batch, n_pos, -1), offset, n_content)
            values[chunk] = score(logits).float().cpu()
            bar.update(n)
    bar.close()
    return values


def loop(
    model: Model,
    tokens: Int[Tensor, "batch pos"],
    interventions: Sequence[Intervention],
    *,
    score: Bound,
    offset: int,
    n_content: int,
    desc: str = "loop",
    options: RunOptions = QUIET,
) -> Float[Tensor, " cell"]:
    """The reference: one full forward pass with hooks per intervention, nothing shared."""
    batch, n_pos = tokens.shape
    values = torch.empty(len(interventions))
    for i, cell in enumerate(tqdm(interventions, desc=desc, disable=not options.progress, unit="cell")):
        hooks = cell.hooks(slice(0, batch), batch, n_pos)
        logits = run(model, tokens, hooks)
        values[i] = score(content_logits(logits, offset, n_content)[None]).float().cpu()[0]
    return values


def reference_logits(model: Model, tokens: Int[Tensor, "batch pos"], offset: int, n_content: int) -> Unembedded:
    """Plain forward pass, content positions only (unembedded lazily)."""
    return unembedded(model, run(model, tokens, stop_at_layer=model.cfg.n_layers), offset, n_content)
