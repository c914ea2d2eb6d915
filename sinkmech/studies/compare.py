"""The paper's Table 2 and Figure 2 on real models, side by side.

Barbero et al. 2025 (Table 2): a model trained with `<bos>` always at position
0 loses its sinks and most of its next-token accuracy when `<bos>` is removed
at inference; a model trained without a fixed `<bos>` does not care. Figure 2:
without the sink, a small input change spreads further through the layers.
`compare_model` measures all of it on one model, in both conditions, on the
same content tokens: sink rates (Gu et al. 2025's alpha_0), the content-target
loss (`sinkmech.measures.loss`), the perturbation spread of a one-token swap
(`sinkmech.interventions.perturb`) and, optionally, the dormant-head scan with its no-op
check (Sec. 3.2). Run it on a model with a fixed `<bos>` (Gemma 3) and on one
without (SmolLM2) and the two rows are the paper's contrast.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch
from jaxtyping import Float
from torch import Tensor

from sinkmech.loading.backend import Model
from sinkmech.loading.models import each_model
from sinkmech.dormant.discover import discover_heads
from sinkmech.dormant.first_look import first_look_note
from sinkmech.hooks import head_label
from sinkmech.corpora import load_prompts, prompt_documents
from sinkmech.prompts import CONDITIONS, PromptSource, tokenize
from sinkmech.interventions.recipes import swap_then_spread
from sinkmech.measures.sinks import SinkScores, format_eps, paired_contrasts, sink_scores
from sinkmech.options import RunOptions
from sinkmech.results import Result
from sinkmech.studies.configs import CompareConfig
from sinkmech.stats import excludes_zero, interval_description, prompt_curve



@dataclass(frozen=True)
class ConditionRow:
    """One model under one `<bos>` condition: a row of the Table 2 analogue."""

    bos: str
    sink_rate: dict[str, float]  # eps (as written) -> percent of (prompt, head) pairs
    mean_score: float  # mean alpha_0 over prompts and heads
    uniform_score: float  # alpha_0 of uniform attention at these lengths
    loss: float  # mean next-token loss on content targets 1..n-1, nats
    spread: float  # mean relative residual change of the positions after the swap, over layers
    per_layer_score: list[float]  # mean alpha_0 per layer
    per_layer_spread: list[float]  # mean change after the swap, per residual layer (0 = embeddings)
    # curves over fractional depth (residual layer / n_layers), each point a mean over prompts with its 95 %
    # bootstrap interval over prompts: relative change and reach (share of later positions changed > 0.1)
    depth: list[float] = field(default_factory=list)
    spread_curve: list[list[float]] = field(default_factory=list)  # [layer] -> [mean, lo, hi]
    reach_curve: list[list[float]] = field(default_factory=list)
    # 95 % bootstrap intervals over prompts: eps -> [rate %, lo, hi]; [loss, lo, hi]
    sink_rate_ci: dict[str, list[float]] = field(default_factory=dict)
    loss_ci: list[float] | None = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class DormantSummary:
    """The dormant-head scan and no-op check on one model (with `<bos>`)."""

    n_prompts: int
    mode_counts: dict[str, int]
    if_else_heads: list[str]
    candidates: dict[str, dict]  # head label -> scan summary (triggers, fractions, norms)
    noop: dict[str, dict]  # head label -> no-op check numbers (NoopResult.to_dict)
    loss_clean: float | None
    sweep: list[dict] = field(default_factory=list)  # labels at other (high, low) cuts
    noop_prompts: list[int] = field(default_factory=list)  # held out from the scan
    noop_covers: list[str] = field(default_factory=list)  # every head the check covers (it ran on the first ones)
    noop_seconds: float = 0.0  # what the check took

    def first_look_note(self, *, all_heads: str = "all") -> str | None:
        """What the no-op check left out and what the whole check would take
        (`sinkmech.dormant.first_look`); None when it was whole or did not run."""
        return first_look_note(len(self.noop), len(self.noop_covers), len(self.noop_prompts), self.noop_seconds,
                               all_heads=all_heads) if self.noop else None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class SharedPasses:
    """What `compare_model` ran that a report on the same model and prompts can
    take over instead of running again (`build_report(..., shared=...)`):

    - `sinks`: the SinkScores of each `<bos>` condition (loss included), on
      `n_prompts` prompts of at most `max_tokens` content tokens; a report
      takes them only at those settings;
    - `discoveries`: the memo of `discover_heads` (scan, then no-op check),
      keyed by every setting, so a report at other settings runs its own.
    """

    sinks: dict[str, SinkScores] = field(default_factory=dict)
    n_prompts: int | None = None
    max_tokens: int | None = None
    discoveries: dict = field(default_factory=dict)

    def sinks_for(self, n_prompts: int, max_tokens: int) -> dict[str, SinkScores] | None:
        """The kept sink scores if they were measured at these settings, else None."""
        if self.sinks and (self.n_prompts, self.max_tokens) == (n_prompts, max_tokens):
            return self.sinks
        return None


@dataclass(frozen=True)
class ModelComparison(Result):
    """Everything `compare_model` measured on one model."""

    model: str
    n_layers: int
    n_heads: int
    n_prompts: int
    max_tokens: int
    spread_prompts: int
    spread_position: int
    conditions: dict[str, ConditionRow]
    dormant: DormantSummary | None = None
    settings: dict = field(default_factory=dict)
    # without minus with <bos>, paired by prompt (the same swap in both conditions), per residual layer:
    # [mean, lo, hi] with a 95 % bootstrap interval over prompts; keys "mean_change" and "reach"
    gap_curves: dict = field(default_factory=dict)
    timing_s: dict = field(default_factory=dict)  # wall seconds per stage: spread, sinks_<bos>, dormant
    # without minus with <bos>, paired by prompt (the same content targets): "loss_gap" [nats, lo, hi],
    # "sink_rate_gap" {eps: [points, lo, hi]}, 95 % bootstrap intervals over prompts
    contrasts: dict = field(default_factory=dict)
    # the passes a report on the same prompts can reuse (not part of the JSON)
    shared: SharedPasses | None = field(default=None, repr=False, compare=False)
    interval: str = ""  # what every interval resamples (`sinkmech.stats.interval_description`)

    def per_layer_score(self) -> Float[Tensor, "bos layer"]:
        return torch.tensor([self.conditions[c].per_layer_score for c in CONDITIONS])

    def to_dict(self) -> dict:
        return {
            "model": self.model, "n_layers": self.n_layers, "n_heads": self.n_heads,
            "n_prompts": self.n_prompts, "max_tokens": self.max_tokens,
            "spread_prompts": self.spread_prompts, "spread_position": self.spread_position,
            "conditions": {c: r.to_dict() for c, r in self.conditions.items()},
            "dormant": None if self.dormant is None else self.dormant.to_dict(),
            "settings": self.settings,
            "gap_curves": self.gap_curves,
            "timing_s": self.timing_s,
            "contrasts": self.contrasts,
            "interval": self.interval,
        }

    def findings(self) -> dict:
        """The quotable numbers, nested (see `sinkmech.findings.flatten`): per
        condition the sink rates, loss, spread and scores; the with/without
        contrasts; the dormant-head counts and no-op numbers."""
        c = {k: {"sink_rate": r.sink_rate, "sink_rate_ci": r.sink_rate_ci, "loss_ci": r.loss_ci, "loss": r.loss, "spread": r.spread, "mean_score": r.mean_score,
                 "uniform_score": r.uniform_score, "per_layer_score": r.per_layer_score,
                 "curve_at_depth": _depth_points(r)}
             for k, r in self.conditions.items()}
        pre, none = self.conditions["prepend"], self.conditions["none"]
        out = {
            "n_prompts": self.n_prompts, "max_tokens": self.max_tokens, "spread_prompts": self.spread_prompts,
            "spread_position": self.spread_position, "n_layers": self.n_layers, "n_heads": self.n_heads,
            **c,
            "loss_gap": none.loss - pre.loss,
            "loss_gap_ci": self.contrasts.get("loss_gap"),
            "loss_gap_detectable": excludes_zero(self.contrasts.get("loss_gap")),
            "sink_rate_gap": self.contrasts.get("sink_rate_gap"),
            "spread_ratio": none.spread / pre.spread if pre.spread else None,
            "gap_at_depth": gap_at_depth(pre.depth, self.gap_curves),
        }
        if self.dormant is not None:
            d = self.dormant
            out["dormant"] = {
                "n_prompts": d.n_prompts, "mode_counts": d.mode_counts, "n_if_else": len(d.if_else_heads),
                "if_else_heads": d.if_else_heads, "noop_prompts": len(d.noop_prompts),
                "validated_lift": {h: d.candidates[h]["validated_lift"] for h in d.if_else_heads},
                "noop": {h: {k: n[k] for k in ("n_dormant", "n_active", "per_query_dormant", "per_query_active",
                                                "per_query_dormant_ci", "per_query_active_ci", "zero_dormant",
                                                "zero_active", "zero_dormant_ci", "zero_active_ci", "detectable")}
                         for h, n in d.noop.items()},
                "sweep": {f"{r['high']:g}_{r['low']:g}": {"if_else": r["mode_counts"]["if_else"],
                                                         "mixed": r["mode_counts"]["mixed"],
                                                         "active": r["mode_counts"]["active"],
                                                         "sink": r["mode_counts"]["sink"],
                                                         "if_else_heads": list(r["if_else_heads"])}
                          for r in d.sweep}}
        return out

    def to_dataframe(self):
        import pandas as pd

        rows = []
        for c, r in self.conditions.items():
            row = {"model": self.model, "bos": c, "loss": r.loss, "spread": r.spread, "mean_score": r.mean_score}
            row.update({f"sink_rate_{e}": v for e, v in r.sink_rate.items()})
            rows.append(row)
        return pd.DataFrame(rows)


def _depth_points(r: ConditionRow, depths: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)) -> dict:
    """The spread and reach curves at a few fractional depths (the nearest layer)."""
    out = {}
    if not r.depth:
        return out
    for d in depths:
        i = min(range(len(r.depth)), key=lambda j: abs(r.depth[j] - d))
        out[f"{d:g}"] = {"depth": r.depth[i], "spread": r.spread_curve[i] if r.spread_curve else None,
                         "reach": r.reach_curve[i] if r.reach_curve else None}
    return out


def gap_at_depth(depth: list[float], gaps: dict, depths: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)) -> dict:
    """The paired without-minus-with `<bos>` curves at a few fractional depths (the
    nearest layer): [mean, lo, hi] per quantity, and whether the interval
    excludes zero (`detectable`; otherwise: no detectable effect)."""
    out = {}
    if not depth or not gaps:
        return out
    for d in depths:
        i = min(range(len(depth)), key=lambda j: abs(depth[j] - d))
        point = {"depth": depth[i]}
        for k, curve in gaps.items():
            v = curve[i] if curve else None
            point[k] = v
            point[f"{k}_detectable"] = excludes_zero(v)
        out[f"{d:g}"] = point
    return out


def compare_model(
    model: Model,
    prompts: PromptSource = None,
    *,
    config: CompareConfig = CompareConfig(),
    name: str | None = None,
    shared: SharedPasses | None = None,
    documents: Sequence[str] | None = None,
    options: RunOptions = RunOptions(),
) -> ModelComparison:
    """Sink rates, loss and perturbation spread with and without `<bos>`, and
    the dormant-head scan (skipped when `config.dormant_prompts` is 0), on one model.

    Args:
        prompts: see `load_prompts` (default: `config.prompts`, else the
            Python-docs corpus); the first `config.n_prompts` are used.
        config: the study's settings (`CompareConfig`; `config.models` is
            not read here): `max_tokens` content tokens per prompt for sink
            scores and loss; the one-token swap (a token of the next prompt at
            content position `spread_position`) on the first `spread_prompts`
            prompts, cut to `spread_tokens` content tokens; the dormant-head scan
            on the first `dormant_prompts` prompts and the no-op check of the
            if_else heads and the `noop_heads` closest candidates (at most
            `noop_max_heads` of them, the if-else heads first) on the next
            `noop_prompts` (held out from the scan).
        name: the model's name in the result (default its cfg name).
        shared: the passes to share with a report (`SharedPasses`; default a
            new one): filled here and handed back as `ModelComparison.shared`,
            for `build_report(..., shared=result.shared)` on the same prompts.
        documents: each prompt's source document (at least the prompts used);
            default: those of the named corpus `prompts` stands for (None for a
            list or a file). With them every interval resamples documents.
        options: batch size, progress bars and the `<bos>` id of every pass.

    Returns:
        ModelComparison with one ConditionRow per `<bos>` condition.
    """
    c = config
    n_prompts, max_tokens, eps = c.n_prompts, c.max_tokens, c.eps
    shared = SharedPasses() if shared is None else shared
    prompts = c.prompts if prompts is None else prompts
    items = load_prompts(prompts)[:n_prompts]
    if documents is None:  # windows of a named corpus: intervals over their documents
        documents = prompt_documents(prompts, len(items))
    elif len(documents) < len(items):
        raise ValueError(f"{len(documents)} documents for {len(items)} prompts")
    else:
        documents = tuple(documents[: len(items)])
    rows, timing, t0 = {}, {}, time.perf_counter()
    swapped = swap_then_spread(model, items[:c.spread_prompts], max_tokens=c.spread_tokens, position=c.spread_position,
                               options=options)
    spread = swapped.spread
    later = spread.per_layer()["mean_change"]  # [bos, resid_layer]
    per_prompt = spread.per_prompt()  # [bos, prompt, resid_layer]: the same prompts and swap in both conditions
    swap_docs = None if documents is None else documents[: len(items[: c.spread_prompts])]
    curves = {k: [prompt_curve(v[i], groups=swap_docs) for i in range(len(CONDITIONS))] for k, v in per_prompt.items()}
    pre_i, none_i = spread.conditions.index("prepend"), spread.conditions.index("none")
    gaps = {k: prompt_curve(v[none_i] - v[pre_i], groups=swap_docs) for k, v in per_prompt.items()}
    depth = (torch.arange(later.shape[1]) / model.cfg.n_layers).tolist()
    timing["spread"], t0 = round(time.perf_counter() - t0, 2), time.perf_counter()
    kept = {}
    for i, bos in enumerate(CONDITIONS):
        batch = tokenize(model, items, bos=bos, max_tokens=max_tokens, bos_token_id=options.bos_token_id)
        scores = kept[bos] = replace(sink_scores(model, batch, max_tokens=max_tokens, loss=True, options=options),
                                     documents=documents)
        shared.sinks[bos] = scores
        used = scores.max_tokens  # the longest content scored (the same in both conditions)
        rows[bos] = ConditionRow(
            bos=bos,
            sink_rate={format_eps(e): scores.sink_rate(e) for e in eps},
            mean_score=float(scores.scores.mean()),
            uniform_score=scores.uniform_score(),
            loss=scores.loss,
            spread=float(later[i].mean()),
            per_layer_score=scores.per_layer().tolist(),
            per_layer_spread=later[i].tolist(),
            depth=depth,
            spread_curve=curves["mean_change"][i],
            reach_curve=curves["reach"][i],
            sink_rate_ci={format_eps(e): scores.sink_rate_ci(e) for e in eps},
            loss_ci=scores.loss_ci(),
        )
        timing[f"sinks_{bos}"], t0 = round(time.perf_counter() - t0, 2), time.perf_counter()
    contrasts = paired_contrasts(kept["prepend"], kept["none"], eps)
    dormant = None
    if c.dormant_prompts > 0:
        pool = load_prompts(prompts)
        n_noop = min(c.noop_prompts, len(pool) // 2)  # held out from the scan
        disc = discover_heads(model, pool, scan_prompts=min(c.dormant_prompts, len(pool) - n_noop),
                              noop_prompts=n_noop, n_candidates=c.noop_heads, max_heads=c.noop_max_heads,
                              max_tokens=max_tokens, memo=shared.discoveries, options=options)
        scan, noop = disc.scan, disc.noop
        found = scan.if_else_heads()
        checked = [(r.layer, r.head) for r in noop.results] if noop is not None else found
        dormant = DormantSummary(
            n_prompts=scan.n_prompts,
            mode_counts=scan.mode_counts(),
            if_else_heads=[head_label(*hd) for hd in found],
            candidates={head_label(*hd): scan.head_summary(*hd) for hd in dict.fromkeys(found + checked)},
            noop={} if noop is None else {head_label(r.layer, r.head): r.to_dict() for r in noop.results},
            loss_clean=None if noop is None else noop.loss_clean,
            sweep=list(scan.sweep or ()),
            noop_prompts=list(disc.noop_prompts),
            noop_covers=[head_label(*hd) for hd in disc.noop_covers],
            noop_seconds=round(disc.noop_seconds, 2),
        )
        timing["dormant"] = round(time.perf_counter() - t0, 2)
    shared.n_prompts, shared.max_tokens = len(items), max_tokens
    return ModelComparison(
        model=name or model.cfg.model_name, n_layers=model.cfg.n_layers, n_heads=model.cfg.n_heads,
        n_prompts=len(items), max_tokens=used, spread_prompts=len(swapped.rows), spread_position=swapped.position,
        conditions=rows, dormant=dormant, gap_curves=gaps, timing_s=timing, contrasts=contrasts,
        interval=interval_description(documents, len(items)),
        settings={"eps": [format_eps(e) for e in eps], "spread_tokens": c.spread_tokens,
                  "dormant_prompts": c.dormant_prompts, "noop_prompts": c.noop_prompts,
                  "noop_max_heads": c.noop_max_heads,
                  "max_tokens_requested": max_tokens},
        shared=shared,
    )


def table_rows(results: Sequence[ModelComparison]) -> list[dict]:
    """One row per (model, condition): the columns of compare.md."""
    rows = []
    for r in results:
        for c in CONDITIONS:
            row = r.conditions[c]
            rows.append({"model": r.model, "bos": c, **{f"sink_rate_{e}": v for e, v in row.sink_rate.items()},
                         "mean_score": row.mean_score, "uniform_score": row.uniform_score, "loss": row.loss,
                         "spread": row.spread})
    return rows


@dataclass(frozen=True)
class Comparison(Result):
    """The compare study: `compare_model` on each model of a `CompareConfig`, the
    config it ran (`to_dict()["config"]`: `sinkmech study compare --config` on a
    written result runs it again) and the wall time."""

    models: tuple[ModelComparison, ...]
    config: CompareConfig
    seconds: float

    def to_dict(self) -> dict:
        return {"models": [r.to_dict() for r in self.models], "table": table_rows(self.models),
                "seconds": round(self.seconds, 1), "config": self.config.to_dict()}

    def to_dataframe(self):
        import pandas as pd

        return pd.concat([r.to_dataframe() for r in self.models], ignore_index=True)

    def notes(self, *, all_heads: str = "none") -> list[str]:
        """Each model's first-look note on its no-op check (what it left out, what
        the whole check would take); `all_heads`: how the command spells no cap."""
        notes = [(r.model, r.dormant.first_look_note(all_heads=all_heads)) for r in self.models if r.dormant]
        return [f"{name}: {note}" for name, note in notes if note]

    def findings(self) -> dict[str, dict]:
        """{prefix: flat values} for `sinkmech.findings.record`: each model's under `<model>.compare`."""
        from sinkmech.findings import flatten

        return {f"{r.model}.compare": flatten(f"{r.model}.compare", r.findings()) for r in self.models}


def run(models=None, config: CompareConfig = CompareConfig(), options: RunOptions = RunOptions()) -> Comparison:
    """The compare study: `compare_model` on each model in turn, one in memory at a time.

    Args:
        models: loaded models, specs to load, or a list of either (see
            `sinkmech.loading.models.each_model`); None: `config.models`.
        config: the study's settings.
        options: batch size, progress bars, the `<bos>` id, and the device and
            dtype specs are loaded in.
    """
    t0 = time.perf_counter()
    prompts = load_prompts(config.prompts)  # a bad file fails before the first model loads
    documents = prompt_documents(config.prompts)
    results = []
    for name, model in each_model(config.models if models is None else models, device=options.device,
                                  dtype=options.dtype):
        results.append(replace(compare_model(model, prompts, config=config, name=name, documents=documents,
                                             options=options), shared=None))
    return Comparison(tuple(results), config, time.perf_counter() - t0)
