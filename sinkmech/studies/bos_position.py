"""Sink or position? `<bos>` moved after K content tokens, against `<bos>` first
and no `<bos>` on the same content tokens (Barbero et al. 2025 say the sink is a
property of position 0 under the training recipe: is it the position or the token?).

Per K: the sink rate on key 0 (now a content token) and on the moved `<bos>` key
(`sink_scores(..., bos_position=K)`), and the next-token loss on content targets
1..n-1 but content token K, paired by prompt with `<bos>` first and with no
`<bos>` on those same targets. Content token K is left out because the moved run
predicts it from the `<bos>` position itself, which no other condition asks; its
loss is reported apart (`dropped_target`), and so is the loss over every target
the earlier definition used (`vs_bos_all_targets`: the dropped target included).
Intervals: the percentile bootstrap over prompts (`sinkmech.stats`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch import Tensor

from sinkmech.loading.backend import Model
from sinkmech.measures.loss import target_nll
from sinkmech.measures.sinks import format_eps, sink_scores
from sinkmech.options import STUDY_BATCH, RunOptions
from sinkmech.prompts import DEFAULT_EPS, PromptSource, tokenize
from sinkmech.stats import interval_description, n_documents, prompt_curve, ratio_with_ci


def _mean_ci(x: Tensor, groups: Sequence | None = None) -> list[float] | None:
    curve = prompt_curve(x[:, None].double(), groups=groups)
    return curve[0] if curve else None


def _sums(nll: Tensor, skip: int | None = None) -> tuple[Tensor, Tensor]:
    x = nll.clone()
    if skip is not None:
        x[:, skip] = float("nan")
    ok = ~x.isnan()
    return torch.where(ok, x, 0.0).sum(1), ok.sum(1).double()


def bos_position_study(
    model: Model,
    prompts: PromptSource,
    positions: Sequence[int],
    *,
    max_tokens: int = 64,
    eps: Sequence[float | str] = DEFAULT_EPS,
    documents: Sequence[str] | None = None,
    options: RunOptions = RunOptions(),
) -> dict:
    """`<bos>` at each position K against `<bos>` first and no `<bos>`, paired by prompt
    (the intervals over the prompts' `documents` where given: a cluster bootstrap).

    Returns:
        {"bos", "none": {"sink_rate": {eps: [mean, lo, hi]}, "loss": over every
        content target}, K: {"sink_rate" (key 0), "bos_sink_rate" and "bos_score"
        (the `<bos>` key), "loss" (every content target but K), "vs_bos" (loss on
        those targets, and the sink rates against `<bos>` first's on key 0),
        "vs_none" (loss), "dropped_target" (content token K: its loss predicted
        from the `<bos>` position, with `<bos>` first, and their paired
        difference, nats), "vs_bos_all_targets" and "vs_none_all_targets" (the
        loss differences over every content target, K's predicted from `<bos>`:
        the earlier definition)}}. `options`: batch size,
        progress bars, the `<bos>` id to move.
    """
    if not positions or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in positions):
        raise ValueError(f"positions must be integers >= 1, got {list(positions)}")
    first = tokenize(model, prompts, bos="prepend", max_tokens=max_tokens, bos_token_id=options.bos_token_id)
    short = int(first.lengths.min()) - 1
    if max(positions) >= short:
        raise ValueError(f"bos position {max(positions)} is at or beyond the content length ({short} tokens)")
    none = tokenize(model, prompts, bos="none", max_tokens=max_tokens)
    rows, bos_id = none.content(), int(first.bos_token_id)
    pad = int(getattr(model.tokenizer, "pad_token_id", None) or 0)
    quiet = options.replace(progress=False)
    ref, plain = sink_scores(model, first, options=options), sink_scores(model, none, options=options)
    nll = {"bos": target_nll(model, rows, "prepend", bos_id, pad=pad, options=quiet),
           "none": target_nll(model, rows, "none", bos_id, pad=pad, options=quiet)}
    rate = {name: {format_eps(e): r.prompt_sink_rate(e) for e in eps} for name, r in (("bos", ref), ("none", plain))}
    out: dict = {}
    g = documents

    def ci(num, den):
        return ratio_with_ci(num, den, groups=g)

    for name in ("bos", "none"):
        loss, n = _sums(nll[name])
        out[name] = {"sink_rate": {k: _mean_ci(v, g) for k, v in rate[name].items()}, "loss": ci(loss, n)}
    for K in positions:
        r = sink_scores(model, first, bos_position=K, options=options)
        moved = target_nll(model, rows, K, bos_id, pad=pad, from_bos=True, options=quiet)
        loss, n = _sums(moved, K)
        base, none_loss = _sums(nll["bos"], K)[0], _sums(nll["none"], K)[0]
        key0 = {format_eps(e): r.prompt_sink_rate(e) for e in eps}
        on_bos = {format_eps(e): r.prompt_bos_sink_rate(e) for e in eps}
        everything, n_all = _sums(moved)
        out[str(K)] = {
            "sink_rate": {k: _mean_ci(v, g) for k, v in key0.items()},
            "bos_sink_rate": {k: _mean_ci(v, g) for k, v in on_bos.items()},
            "bos_score": float(r.bos_scores.mean()),
            "loss": ci(loss, n),
            "loss_targets": f"content targets 1..n-1 but {K}, here and in every condition paired with it",
            "vs_bos": {"loss": ci(loss - base, n),
                       # the <bos> key at K against the <bos> key at 0
                       "bos_sink_rate": {k: _mean_ci(v - rate["bos"][k], g) for k, v in on_bos.items()},
                       "sink_rate": {k: _mean_ci(v - rate["bos"][k], g) for k, v in key0.items()}},
            "vs_none": {"loss": ci(loss - none_loss, n)},
            "dropped_target": {"from_bos": _mean_ci(moved[:, K], g), "bos_first": _mean_ci(nll["bos"][:, K], g),
                               "difference": _mean_ci(moved[:, K] - nll["bos"][:, K], g)},
            "vs_bos_all_targets": {"loss": ci(everything - _sums(nll["bos"])[0], n_all)},
            "vs_none_all_targets": {"loss": ci(everything - _sums(nll["none"])[0], n_all)},
        }
    return out


def run(model_or_models=None, config=None, options: RunOptions = RunOptions()):
    """The moved-`<bos>` study (`BosPositionConfig`) on each model, the first
    `n_prompts` prompts of the default corpus; findings under `<model>.bos_position`."""
    from sinkmech.findings import flatten
    from sinkmech.corpora import corpus
    from sinkmech.studies.config import StudyResult
    from sinkmech.studies.configs import BosPositionConfig
    from sinkmech.studies.first_token import models_of

    config = BosPositionConfig() if config is None else config
    windows = corpus().part(0, config.n_prompts)
    prompts = list(windows.prompts)
    sections, findings = {}, {}
    for name, model in models_of(model_or_models, config.models, options):
        t0 = time.perf_counter()
        out = bos_position_study(model, prompts, list(config.positions), max_tokens=config.max_tokens,
                                 eps=config.eps, documents=windows.documents,
                                 options=options.replace(batch_size=options.batch(STUDY_BATCH)))
        sections[name] = {"bos_position": out, "n_prompts": config.n_prompts,
                          "n_documents": n_documents(windows.documents, config.n_prompts),
                          "interval": interval_description(windows.documents, config.n_prompts),
                          "max_tokens": config.max_tokens,
                          "seconds": round(time.perf_counter() - t0, 1)}
        findings[f"{name}.bos_position"] = flatten(f"{name}.bos_position", out)
    return StudyResult(config, sections, findings)
