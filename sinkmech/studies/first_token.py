"""Sink or token? Controls for what the model needs at the start of a sequence.

Removing `<bos>` (Barbero et al. 2025, Table 2) changes two things at once: the
sink position loses its trained token, and the sequence no longer looks like
training data. Two controls separate them, each scored on the same content
targets and paired by prompt against `<bos>` first:

- first-token substitution (`first_token_study`): another token (or several)
  at the start, e.g. `<eos>`, `<pad>`, a newline, " the", a rare word,
  `<bos>` twice. Does the model need *a* first token, or its trained `<bos>`?
- `<bos>` moved into the sequence (`sinkmech.studies.bos_position`): is the
  sink the first *position* or the `<bos>` *token*?

Per prompt: the sink rate on key 0 (alpha_0, Gu et al. 2025, `sinkmech.measures.sinks`),
the mean next-token loss on content targets 1..n-1 (`sinkmech.measures.loss`), and the
spread of a one-token swap (`sinkmech.interventions.perturb`: mean relative residual change
||h' - h|| / ||h|| of the content positions after the swap, over layers).
Intervals: the percentile bootstrap over prompts (`sinkmech.stats`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from sinkmech.loading.backend import Model
from sinkmech.hooks import act_name, residual_stack
from sinkmech.measures.loss import resid_row_losses
from sinkmech.interventions.perturb import apply_swap, corpus_swaps
from sinkmech.prompts import DEFAULT_EPS, PromptSource, tokenize
from sinkmech.interventions.recipes import SPREAD_POSITION
from sinkmech.results import Result
from sinkmech.measures.sinks import check_eps, first_key_score, format_eps
from sinkmech.stats import interval_description, n_documents, prompt_curve, ratio_with_ci
from sinkmech.options import STUDY_BATCH, RunOptions

REFERENCE = "bos"  # the trained first token every other is paired against


def _mean_ci(x: Tensor, groups: Sequence | None = None) -> list[float] | None:
    """[mean over prompts, lo, hi] of a per-prompt value (NaN prompts dropped), the interval over
    the prompts' documents with `groups` (a cluster bootstrap); None when no prompt has one."""
    curve = prompt_curve(x[:, None].double(), groups=groups)
    return curve[0] if curve else None


@dataclass(frozen=True)
class FirstTokenRuns(Result):
    """Per prompt, for each first-token prefix (name -> token ids; `[]` is no
    first token at all): alpha_0 per head, the summed content-target loss, and
    the swap's spread. All prefixes hold the same content tokens and targets."""

    prefixes: dict[str, tuple[int, ...]]
    scores: dict[str, Float[Tensor, "prompt layer head_index"]]
    prompt_loss: dict[str, Float[Tensor, " prompt"]]  # summed nats over the prompt's content targets
    spread: dict[str, Float[Tensor, " prompt"]]
    targets: Int[Tensor, " prompt"]  # content targets per prompt (content tokens - 1)
    swap_position: int
    model_name: str = ""
    # each prompt's source document (windows of a named corpus): the intervals resample documents
    documents: tuple[str, ...] | None = None

    def prompt_sink_rate(self, name: str, eps: float | str) -> Float[Tensor, " prompt"]:
        """Percent of each prompt's heads whose alpha_0 > eps (as `SinkScores.prompt_sink_rate`)."""
        return 100.0 * (self.scores[name] > check_eps(eps)).flatten(1).double().mean(1)

    def entry(self, name: str, eps: Sequence[float | str] = DEFAULT_EPS, *, reference: str = REFERENCE) -> dict:
        """One first token: sink rate per eps, loss and spread as [mean, lo, hi],
        and each paired against `reference` (this minus reference, by prompt)."""
        rates = {format_eps(e): self.prompt_sink_rate(name, e) for e in eps}
        g = self.documents
        out = {
            "token_ids": list(self.prefixes[name]),
            "sink_rate": {k: _mean_ci(v, g) for k, v in rates.items()},
            "loss": ratio_with_ci(self.prompt_loss[name], self.targets.double(), groups=g),
            "spread": _mean_ci(self.spread[name], g),
        }
        if name != reference and reference in self.prefixes:
            ref = {format_eps(e): self.prompt_sink_rate(reference, e) for e in eps}
            out[f"vs_{reference}"] = {
                "sink_rate": {k: _mean_ci(v - ref[k], g) for k, v in rates.items()},
                "loss": ratio_with_ci(self.prompt_loss[name] - self.prompt_loss[reference], self.targets.double(),
                                      groups=g),
                "spread": _mean_ci(self.spread[name] - self.spread[reference], g),
            }
        return out

    def to_dict(self, eps: Sequence[float | str] = DEFAULT_EPS) -> dict:
        return {"model": self.model_name, "n_prompts": len(self.targets), "swap_position": self.swap_position,
                "n_documents": n_documents(self.documents, len(self.targets)),
                "interval": interval_description(self.documents, len(self.targets)),
                "content_tokens": int(self.targets.max()) + 1,
                "first_tokens": {name: self.entry(name, eps) for name in self.prefixes}}

    def to_dataframe(self):
        import pandas as pd

        rows = []
        for name in self.prefixes:
            for p in range(len(self.targets)):
                rows.append({"first_token": name, "prompt": p, "sink_rate_0.3": float(self.prompt_sink_rate(name, 0.3)[p]),
                             "loss": float(self.prompt_loss[name][p] / self.targets[p]), "spread": float(self.spread[name][p])})
        return pd.DataFrame(rows)


def _prefixed_pass(model: Model, rows: list[list[int]], swapped: list[list[int]], prefix: Sequence[int],
                   swap_position: int, batch_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """alpha_0 [prompt, layer, head], summed content-target loss [prompt] and
    spread [prompt] with `prefix` before every prompt's content tokens."""
    m, L = len(prefix), model.cfg.n_layers
    width = m + max(map(len, rows))
    clean = tokenize(model, [list(prefix) + r for r in rows], bos="none", max_tokens=width)
    pert = tokenize(model, [list(prefix) + r for r in swapped], bos="none", max_tokens=width)
    P = len(rows)
    scores = torch.zeros(P, L, model.cfg.n_heads)
    loss = torch.zeros(P, dtype=torch.float64)
    spread = torch.zeros(P, dtype=torch.float64)
    for rows_, part in clean.batches(batch_size):
        other = pert.slice(rows_.start, rows_.stop)

        def pattern_hook(pattern, hook):
            scores[rows_, hook.layer()] = first_key_score(pattern, part.lengths).cpu()

        hooks = [(act_name("pattern", l), pattern_hook) for l in range(L)]
        h = residual_stack(model, part.tokens, hooks)  # [batch, resid_layer, pos, d_model]
        pos = torch.arange(part.tokens.shape[1], device=part.tokens.device)
        # position p predicts p + 1: positions m .. T-2 predict content tokens 1 .. n-1
        mask = (pos[None, :] >= m) & (pos[None, :] < part.lengths[:, None] - 1)
        loss[rows_] = resid_row_losses(model, h[:, -1], part.tokens, mask)
        h2 = residual_stack(model, other.tokens)
        h, h2 = h[:, :, m:].float(), h2[:, :, m:].float()
        rel = (h2 - h).norm(dim=-1) / h.norm(dim=-1).clamp(min=1e-12)  # [batch, resid_layer, content pos]
        j = torch.arange(rel.shape[-1], device=rel.device)
        later = ((j[None, :] > swap_position) & (j[None, :] < (part.lengths - m)[:, None])).float()
        per_layer = (rel * later[:, None, :]).sum(-1) / later.sum(-1)[:, None]
        spread[rows_] = per_layer.mean(-1).double().cpu()
    return scores, loss, spread


def first_token_study(
    model: Model,
    prompts: PromptSource,
    prefixes: Mapping[str, Sequence[int]],
    *,
    max_tokens: int = 64,
    swap_position: int = SPREAD_POSITION,
    options: RunOptions = RunOptions(),
) -> FirstTokenRuns:
    """The same content tokens behind each prefix in turn.

    Args:
        prompts: cut to `max_tokens` content tokens each (tokenized once).
        prefixes: name -> token ids put before the content (e.g. {"bos": [2],
            "eos": [1], "bos_bos": [2, 2], "none": []}); pair against "bos".
        swap_position: the content position whose token is swapped for the
            token there in the next prompt that differs (`corpus_swaps`).
        options: batch size (default 16 prompts per forward pass), progress bar.

    Returns:
        FirstTokenRuns, one set of per-prompt tensors per prefix.
    """
    if not prefixes:
        raise ValueError("no first tokens given")
    vocab = model.cfg.d_vocab
    for name, ids in prefixes.items():
        if any(not 0 <= int(t) < vocab for t in ids):
            raise ValueError(f"first token {name!r}: ids {list(ids)} must lie in [0, {vocab})")
    plain = tokenize(model, prompts, bos="none", max_tokens=max_tokens)
    rows = plain.content()
    if not 0 <= swap_position < min(map(len, rows)) - 1:
        raise ValueError(f"swap_position must lie in [0, {min(map(len, rows)) - 1}) for these prompts, got {swap_position}")
    swaps = corpus_swaps(rows, swap_position)
    swapped = [apply_swap(model, [r], s)[0][0] for r, s in zip(rows, swaps)]
    out: dict[str, tuple] = {}
    for name, ids in tqdm(list(prefixes.items()), desc="first tokens", disable=not options.progress, unit="token"):
        out[name] = _prefixed_pass(model, rows, swapped, [int(t) for t in ids], swap_position, options.batch(16))
    return FirstTokenRuns(
        prefixes={k: tuple(int(t) for t in v) for k, v in prefixes.items()},
        scores={k: v[0] for k, v in out.items()},
        prompt_loss={k: v[1] for k, v in out.items()},
        spread={k: v[2] for k, v in out.items()},
        targets=torch.tensor([len(r) - 1 for r in rows]),
        swap_position=swap_position,
        model_name=model.cfg.model_name,
    )


# The study: which first tokens, on which models (`FirstTokenConfig`)


def rare_word(model: Model) -> int:
    """The highest-id token that decodes to a space and >= 6 lowercase letters
    and tokenizes back to itself: a late BPE merge, so a rare word."""
    tok = model.tokenizer
    for i in range(model.cfg.d_vocab - 1, 0, -1):
        text = tok.decode([i])
        if re.fullmatch(r" [a-z]{6,}", text) and tok(text, add_special_tokens=False)["input_ids"] == [i]:
            return i
    raise ValueError("no rare single-token word in the vocabulary")


def one_token(model: Model, text: str) -> int:
    ids = model.tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ValueError(f"{text!r} is {len(ids)} tokens, not one")
    return int(ids[0])


def first_tokens(model: Model) -> tuple[dict[str, list[int]], dict[str, str]]:
    """The study's first tokens, name -> token ids put first (`<bos>`, `<eos>`, `<pad>`
    where it differs from `<eos>`, a newline, " the", a rare word, `<bos>` twice,
    nothing), and the names left out with the reason."""
    from sinkmech.loading.models import bos_token_id

    tok, bos = model.tokenizer, bos_token_id(model)
    out = {"bos": [bos], "eos": [int(tok.eos_token_id)]}
    skipped = {}
    if tok.pad_token_id is None or tok.pad_token_id == tok.eos_token_id:
        skipped["pad"] = "the tokenizer's <pad> is its <eos>" if tok.pad_token_id is not None else "no <pad> token"
    else:
        out["pad"] = [int(tok.pad_token_id)]
    out |= {"newline": [one_token(model, "\n")], "the": [one_token(model, " the")], "rare": [rare_word(model)],
            "bos_bos": [bos, bos], "none": []}
    return out, skipped


def models_of(model_or_models, names: Sequence[str], options: RunOptions = RunOptions()):
    """(name, model) pairs: a model (named `names[0]`), a mapping name -> model, a
    list of specs or models, or None to load each of `names`; specs are loaded in
    --dtype on --device when their turn comes (one model in memory at a time:
    `sinkmech.loading.models.each_model`)."""
    if isinstance(model_or_models, Mapping):
        yield from model_or_models.items()
    elif model_or_models is None or isinstance(model_or_models, (list, tuple)):
        from sinkmech.loading.models import each_model

        yield from each_model(list(names) if model_or_models is None else model_or_models, device=options.device,
                              dtype=options.dtype)
    else:
        yield names[0], model_or_models


def run(model_or_models=None, config=None, options: RunOptions = RunOptions()):
    """The first-token study (`FirstTokenConfig`) on each model, the first
    `n_prompts` prompts of the default corpus; findings under `<model>.first_token`."""
    from sinkmech.findings import flatten
    from sinkmech.corpora import corpus
    from sinkmech.studies.config import StudyResult
    from sinkmech.studies.configs import FirstTokenConfig

    config = FirstTokenConfig() if config is None else config
    windows = corpus().part(0, config.n_prompts)
    prompts = list(windows.prompts)
    sections, findings = {}, {}
    for name, model in models_of(model_or_models, config.models, options):
        prefixes, skipped = first_tokens(model)
        t0 = time.perf_counter()
        runs = first_token_study(model, prompts, prefixes, max_tokens=config.max_tokens,
                                 swap_position=config.swap_position,
                                 options=options.replace(batch_size=options.batch(STUDY_BATCH)))
        runs = replace(runs, documents=windows.documents)
        d = runs.to_dict()
        out = {"first_token": d["first_tokens"], "first_token_skipped": skipped,
               "n_prompts": config.n_prompts, "n_documents": d["n_documents"], "interval": d["interval"],
               "max_tokens": config.max_tokens, "swap_position": runs.swap_position}
        for k, ids in prefixes.items():
            out["first_token"][k]["text"] = "".join(model.tokenizer.decode([i]) for i in ids)
        out["first_token_seconds"] = round(time.perf_counter() - t0, 1)
        sections[name] = out
        findings[f"{name}.first_token"] = flatten(f"{name}.first_token", out["first_token"])
    return StudyResult(config, sections, findings)
