"""How much of the `<bos>` cost do the sink heads carry?

Removing `<bos>` raises the loss (Barbero et al. 2025, Table 2), but it also
makes the sequence unlike training data. Here the sequence keeps its `<bos>`
and only the heads lose it: each head's `mask_first` ablation (the head may
not attend to key 0; `sinkmech.interventions.ablation`) is measured as the
change of the next-token loss on content targets 1..n-1, in nats
(`sinkmech.measures.loss`), per head on one set of prompts; the heads are ranked there,
and on a disjoint held-out set the first key is masked in the top 1, 2, 4, ...
heads at once, against removing `<bos>` from the same prompts. The share of
the `<bos>` cost they explain is the ratio of the summed loss changes, with a
bootstrap interval over the held-out prompts (`sinkmech.stats`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from sinkmech.loading.backend import Model
from sinkmech.hooks import head_label
from sinkmech.interventions.ablation import AblationMode, ablation_hooks, check_mode, mean_head_outputs
from sinkmech.measures.loss import NO_TARGETS, masked_row_losses, target_mask
from sinkmech.prompts import PromptSource, TokenBatch, as_batch, tokenize
from sinkmech.results import Result
from sinkmech.stats import interval_description, n_documents, ratio_with_ci
from sinkmech.options import QUIET, STUDY_BATCH, RunOptions


def heads_hooks(model: Model, part: TokenBatch, heads: Sequence[tuple[int, int]], mode: AblationMode,
                means: Tensor | None) -> list:
    """The `mode` ablation of every head in `heads` at once, on every row of `part`."""
    n, T = part.tokens.shape
    out = []
    for l, h in heads:
        out += ablation_hooks(mode, l, h, means)(slice(0, n), n, T)
    return out


def ablated_prompt_losses(model: Model, batch: TokenBatch, heads: Sequence[tuple[int, int]], *,
                          mode: AblationMode = "mask_first", means: Tensor | None = None,
                          options: RunOptions = QUIET) -> Float[Tensor, " prompt"]:
    """Each prompt's summed next-token loss (nats) on its content targets with
    the heads in `heads` ablated together (none: the clean run); `options`: the
    batch size (default 16 prompts per forward pass)."""
    out = torch.zeros(len(batch), dtype=torch.float64)
    for rows, part in batch.batches(options.batch(16)):
        out[rows] = masked_row_losses(model, part.tokens, target_mask(part),
                                      heads_hooks(model, part, heads, mode, means))
    return out


@dataclass(frozen=True)
class HeadLossChanges(Result):
    """`changes[prompt, layer, head]`: the summed content-target loss (nats) of
    the ablated run minus the clean run's, per prompt; `targets` per prompt."""

    changes: Float[Tensor, "prompt layer head_index"]
    clean: Float[Tensor, " prompt"]
    targets: Int[Tensor, " prompt"]
    mode: str

    def mean_changes(self) -> Float[Tensor, "layer head_index"]:
        """Nats per content target: the loss change averaged over every target."""
        return self.changes.sum(0) / self.targets.sum()

    def ranking(self) -> list[tuple[int, int]]:
        """(layer, head) by mean loss change, largest first."""
        m = self.mean_changes()
        order = m.flatten().argsort(descending=True, stable=True)
        return [(int(i) // m.shape[1], int(i) % m.shape[1]) for i in order]

    def effect(self, layer: int, head: int, groups: Sequence | None = None) -> list[float]:
        """[nats per target, lo, hi] with its bootstrap interval over prompts, or over
        their documents with `groups` (each prompt's document: a cluster bootstrap)."""
        return ratio_with_ci(self.changes[:, layer, head], self.targets.double(), groups=groups)

    def to_dict(self) -> dict:
        return {"mode": self.mode, "metric": "loss", "n_prompts": len(self.targets),
                "clean_loss": float(self.clean.sum() / self.targets.sum()),
                "effects": self.mean_changes().tolist()}

    def to_dataframe(self):
        import pandas as pd

        P, L, H = self.changes.shape
        return pd.DataFrame([{"prompt": p, "layer": l, "head": h, "loss_change": float(self.changes[p, l, h]),
                              "targets": int(self.targets[p])} for p in range(P) for l in range(L) for h in range(H)])


def head_loss_changes(
    model: Model,
    tokens: PromptSource | TokenBatch,
    *,
    mode: AblationMode = "mask_first",
    bos: str | None = None,
    max_tokens: int | None = None,
    options: RunOptions = RunOptions(),
) -> HeadLossChanges:
    """Each head ablated alone: the change of each prompt's content-target loss (nats).

    Args:
        tokens: a TokenBatch, or prompts (default bos "prepend", 64 content tokens).
        mode: as in `head_ablations` ("mask_first": the head may not attend to key 0).
        options: batch size (default 16 prompts per forward pass), progress
            bar, the `<bos>` id for prompts.

    Returns:
        HeadLossChanges, [prompt, layer, head_index].
    """
    check_mode(mode, model)
    batch = as_batch(model, tokens, bos=bos, default="prepend", max_tokens=max_tokens,
                     bos_token_id=options.bos_token_id)
    targets = (batch.lengths - batch.offset - 1).clamp(min=0).cpu()
    if int(targets.sum()) == 0:
        raise ValueError(NO_TARGETS)
    means = mean_head_outputs(model, batch) if mode == "mean" else None
    clean = ablated_prompt_losses(model, batch, [], options=options)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    changes = torch.zeros(len(batch), L, H, dtype=torch.float64)
    grid = [(l, h) for l in range(L) for h in range(H)]
    for l, h in tqdm(grid, desc=f"{mode} loss per head", disable=not options.progress, unit="head"):
        changes[:, l, h] = ablated_prompt_losses(model, batch, [(l, h)], mode=mode, means=means,
                                                 options=options) - clean
    return HeadLossChanges(changes, clean, targets, mode)


def bos_cost(
    model: Model,
    prompts: PromptSource,
    *,
    select_prompts: int,
    eval_prompts: int,
    ks: Sequence[int] | None = None,
    max_tokens: int = 64,
    documents: Sequence[str] | None = None,
    options: RunOptions = RunOptions(),
) -> dict:
    """Rank heads by their `mask_first` loss change on the first `select_prompts`
    prompts, then on the next `eval_prompts` (held out) mask the first key of
    the top-k heads together, for each k (default 1, 2, 4, 8, 16), against
    removing `<bos>`. With `documents` (each prompt's source document) every
    interval resamples documents (a cluster bootstrap).

    Returns:
        {"select": {"n_prompts", "top": [{"head", "loss_change": [nats, lo, hi]}]},
         "eval": {"n_prompts", "clean_loss", "no_bos": [nats per target, lo, hi],
                  "top_k": {k: {"heads", "loss_change": [...], "share": [...]}}}}:
        loss changes in nats per content target, the share of the no-`<bos>`
        change as a ratio of sums, each with its bootstrap interval over prompts
        (the share is None where removing `<bos>` does not raise the loss).
    """
    if select_prompts < 1 or eval_prompts < 2:
        raise ValueError("bos_cost needs select_prompts >= 1 and eval_prompts >= 2")
    first = tokenize(model, prompts, bos="prepend", max_tokens=max_tokens, bos_token_id=options.bos_token_id)
    if len(first) < select_prompts + eval_prompts:
        raise ValueError(f"{len(first)} prompts: fewer than select_prompts + eval_prompts = "
                         f"{select_prompts + eval_prompts}")
    if documents is not None and len(documents) < select_prompts + eval_prompts:
        raise ValueError(f"{len(documents)} documents for {select_prompts + eval_prompts} prompts")
    pick_docs, held_docs = (None, None) if documents is None else (
        documents[:select_prompts], documents[select_prompts : select_prompts + eval_prompts])
    return bos_cost_batches(model, first.slice(0, select_prompts),
                            first.slice(select_prompts, select_prompts + eval_prompts), ks=ks,
                            pick_documents=pick_docs, held_documents=held_docs, options=options)


def without_bos(batch: TokenBatch) -> TokenBatch:
    """The same content without its `<bos>` column: position j holds content token j."""
    if batch.bos != "prepend":
        raise ValueError("without_bos needs a TokenBatch built with bos='prepend'")
    return TokenBatch(batch.tokens[:, 1:], batch.lengths - 1, "none", batch.bos_token_id, batch.context_limit)


def bos_cost_batches(
    model: Model,
    pick: TokenBatch,
    held: TokenBatch,
    *,
    ks: Sequence[int] | None = None,
    head_sets: Mapping[str, Sequence[tuple[int, int]]] | None = None,
    pick_documents: Sequence[str] | None = None,
    held_documents: Sequence[str] | None = None,
    options: RunOptions = RunOptions(),
) -> dict:
    """`bos_cost` on ready batches: heads ranked on `pick`, measured on `held`
    (both with `<bos>` at position 0; the caller keeps them disjoint). For a
    model without a tokenizer, or windows that are not prompts (a training
    run's held-out text, `sinkmech.studies.text_bos_cost`). `head_sets`: named sets
    of (layer, head) masked together on `held` besides the top-k (e.g. a sink
    head chosen by its attention, and every other head).

    Returns:
        as `bos_cost`, plus "eval"."head_sets" {name: {"heads", "loss_change",
        "share"}} when `head_sets` is given.
    """
    for name, b in (("pick", pick), ("held", held)):
        if b.bos != "prepend":
            raise ValueError(f"{name} must be built with bos='prepend', got {b.bos!r}")
    if len(pick) < 1 or len(held) < 2:
        raise ValueError("bos_cost needs select_prompts >= 1 and eval_prompts >= 2")
    n_heads = model.cfg.n_layers * model.cfg.n_heads
    if ks is None:  # 1, 2, 4, ... up to 16 heads or all of them
        ks = [2**i for i in range(5) if 2**i <= n_heads]
    if not ks or any(isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n_heads for k in ks):
        raise ValueError(f"ks must be integers in [1, {n_heads}], got {list(ks)}")
    select_prompts, eval_prompts = len(pick), len(held)
    per_head = head_loss_changes(model, pick, options=options)
    ranking = per_head.ranking()
    clean = ablated_prompt_losses(model, held, [], options=options)
    targets = (held.lengths - 1 - 1).cpu().double()
    none = without_bos(held)
    no_bos = ablated_prompt_losses(model, none, [], options=options) - clean
    def masked(heads: Sequence[tuple[int, int]]) -> dict:
        change = ablated_prompt_losses(model, held, heads, options=options) - clean
        return {"heads": [head_label(l, h) for l, h in heads],
                "loss_change": ratio_with_ci(change, targets, groups=held_documents),
                # a share of a loss change that removing <bos> does not cause: none
                "share": ratio_with_ci(change, no_bos, groups=held_documents) if float(no_bos.sum()) > 0 else None}

    top_k = {str(k): masked(ranking[:k])
             for k in tqdm(sorted(set(ks)), desc="top-k heads masked", disable=not options.progress, unit="k")}
    return {
        "select": {"n_prompts": select_prompts, "interval": interval_description(pick_documents, select_prompts),
                   "mode": "mask_first",
                   "top": [{"head": head_label(l, h), "loss_change": per_head.effect(l, h, pick_documents)}
                           for l, h in ranking[: max(ks)]]},
        "eval": {"n_prompts": eval_prompts, "n_documents": n_documents(held_documents, eval_prompts),
                 "interval": interval_description(held_documents, eval_prompts),
                 "clean_loss": float(clean.sum() / targets.sum()),
                 "no_bos": ratio_with_ci(no_bos, targets, groups=held_documents), "top_k": top_k,
                 **({"head_sets": {name: masked(list(heads)) for name, heads in head_sets.items()}}
                    if head_sets else {})},
    }


def run(model_or_models=None, config=None, options: RunOptions = RunOptions()):
    """The study (`BosCostConfig`) on each model: heads ranked on the first `select`
    prompts of the default corpus, the top k masked together on the next `eval`
    (every k in `ks` up to the model's heads reported; none is picked). Findings
    under `<model>.bos_cost`."""
    import time

    from sinkmech.findings import flatten
    from sinkmech.corpora import corpus
    from sinkmech.studies.config import StudyResult
    from sinkmech.studies.configs import BosCostConfig
    from sinkmech.studies.first_token import models_of

    config = BosCostConfig() if config is None else config
    windows = corpus().part(0, config.select + config.eval)
    prompts = list(windows.prompts)
    sections, findings = {}, {}
    for name, model in models_of(model_or_models, config.models, options):
        t0 = time.perf_counter()
        n_heads = model.cfg.n_layers * model.cfg.n_heads
        r = bos_cost(model, prompts, select_prompts=config.select, eval_prompts=config.eval,
                     ks=[k for k in config.ks if k <= n_heads], max_tokens=config.max_tokens,
                     documents=windows.documents, options=options.replace(batch_size=options.batch(STUDY_BATCH)))
        r["max_tokens"], r["seconds"] = config.max_tokens, round(time.perf_counter() - t0, 1)
        sections[name] = r
        findings[f"{name}.bos_cost"] = flatten(f"{name}.bos_cost", r)
    return StudyResult(config, sections, findings)
