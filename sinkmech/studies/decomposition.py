"""Sink or `<bos>`: what removing `<bos>` costs, split into the attention it
takes (mass) and what it writes (value) (Barbero et al. 2025's "the sink is a
no-op", tested with `sinkmech.interventions.phantom`).

On the same held-out prompts, each condition against `<bos>` first, paired by
prompt: `<bos>` first; the value-less `<bos>`; the phantom sink on the run without
`<bos>` (paired mass; zero value, and `<bos>`'s own value); the bias only (`<bos>`'s
value weighted by the paired mass, no mass taken); learned sink logits fitted by
`sinkmech fit-sinks` (with and without a value); no `<bos>`. The four paired-mass
conditions make a 2 x 2 design, mass {kept, removed} x value {kept, removed},
with both main effects and their interaction. Measured per prompt: the
next-token loss on content targets 1..n-1 (`sinkmech.measures.loss`), the sink
mass and rate (the attention the sink takes, mean over the content queries that
see it; a head is a sink above eps), alpha_0 on key 0 (`sinkmech.measures.sinks`),
the spread of a one-token swap (the paper's Figure 2: relative residual change
of the later content positions, `sinkmech.interventions.perturb.corpus_swaps`)
and rank collapse by layer (`sinkmech.theory.sensitivity.collapse_ratio`, over
content tokens 1..n-1). Where the dump and the value matter: the phantom in one
layer at a time, in all layers but one, and in the top-k sink heads only (ranked
on separate selection prompts). `<bos>` moved after K content tokens beside
them (its loss leaves content token K out, in every condition it is paired with).
Intervals: the bootstrap over the prompts' documents where prompts are windows of
a named corpus (windows of one document are not independent: a cluster bootstrap,
BCa at 16 documents or fewer), else over prompts (`sinkmech.stats`); each model's
section says which (`interval`, `n_documents`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor
from tqdm.auto import tqdm

from sinkmech.hooks import act_name, cached_run, residual_stack
from sinkmech.interventions.fit_sinks import bos_mass
from sinkmech.interventions.perturb import apply_swap, corpus_swaps
from sinkmech.interventions.phantom import (
    PhantomSink, ValuelessBos, bos_state, phantom_hooks, valueless_bos_hooks,
)
from sinkmech.interventions.sink_file import read_sink_file
from sinkmech.loading.backend import Model
from sinkmech.measures.definitions import check_eps, first_key_score
from sinkmech.measures.sinks import format_eps
from sinkmech.measures.loss import content_nll, laid_out
from sinkmech.options import STUDY_BATCH, RunOptions
from sinkmech.prompts import TokenBatch, tokenize
from sinkmech.results import Result
from sinkmech.stats import interval_description, n_documents, prompt_curve, ratio_with_ci
from sinkmech.studies.configs import DecompositionConfig
from sinkmech.theory.sensitivity import collapse_ratio

# The conditions every model runs in full (loss, sink rate, spread, collapse), in
# the order they are reported; learned-logit conditions follow from the files.
MAIN = ("bos", "valueless_bos", "phantom", "phantom_bos_value", "bias", "none")


@dataclass(frozen=True)
class Condition:
    """One run: where the content sits (`layout`: "prepend", "none" or K, `<bos>`
    after K content tokens) and the sink intervention in every pass."""

    name: str
    layout: str | int
    sink: ValuelessBos | PhantomSink | None = None
    full: bool = True  # loss, sink mass, spread and collapse; False: the loss only


def main_conditions() -> list[Condition]:
    return [Condition("bos", "prepend"), Condition("valueless_bos", "prepend", ValuelessBos()),
            Condition("phantom", "none", PhantomSink("paired", "zero")),
            Condition("phantom_bos_value", "none", PhantomSink("paired", "bos")),
            Condition("bias", "none", PhantomSink("paired", "bos", "bias")), Condition("none", "none")]


# Where the `<bos>` sits in a layout (`sinkmech.measures.loss.laid_out`)


def sink_key(layout: str | int) -> int | None:
    """The position of `<bos>` in a layout (None: no `<bos>`)."""
    return None if layout == "none" else 0 if layout == "prepend" else int(layout)


# One condition on all prompts


@dataclass
class Runs:
    """Per prompt, per condition: next-token loss of each content target (NaN where
    not scored), the sink's mass per head, alpha_0 on key 0, spread and collapse by
    layer (full conditions only)."""

    nll: dict[str, Tensor] = field(default_factory=dict)  # [prompt content]
    sink_mass: dict[str, Tensor] = field(default_factory=dict)  # [prompt layer head_index]
    first_key: dict[str, Tensor] = field(default_factory=dict)  # [prompt layer head_index]
    spread: dict[str, Tensor] = field(default_factory=dict)  # [prompt resid_layer]
    collapse: dict[str, Tensor] = field(default_factory=dict)  # [prompt resid_layer]


@dataclass
class Shared:
    """What the conditions share on one model: content rows and their swapped copies,
    `<bos>`'s id and values, and the paired mass of `<bos>` first ([prompt layer
    head_index query], clean and swapped), filled by the `bos` condition."""

    rows: list[list[int]]
    swapped: list[list[int]]
    swap_position: int
    bos_id: int
    pad: int
    bos_values: Tensor
    mass: dict[str, Tensor] = field(default_factory=dict)


def measure(model: Model, cond: Condition, shared: Shared, runs: Runs, options: RunOptions = RunOptions()) -> None:
    """Run `cond` on every prompt (and its swapped copy when full) into `runs`."""
    P, L, H = len(shared.rows), model.cfg.n_layers, model.cfg.n_heads
    width = max(map(len, shared.rows))
    nll = torch.full((P, width), float("nan"), dtype=torch.float64)
    mass_out, first_out = torch.zeros(P, L, H), torch.zeros(P, L, H)
    spread_out, collapse_out = torch.zeros(P, L + 1), torch.zeros(P, L + 1)
    keep_mass = cond.name == "bos"
    if keep_mass:
        shared.mass = {k: torch.zeros(P, L, H, width) for k in ("clean", "swapped")}
    step = options.batch(8)
    for s in range(0, P, step):
        rows = slice(s, min(s + step, P))
        clean, cidx = laid_out(shared.rows[rows], cond.layout, shared.bos_id, width, shared.pad)
        hooks = _condition_hooks(model, cond, shared, rows, "clean", clean, cidx, mass_out, first_out)
        if cond.full:
            h = residual_stack(model, clean.tokens, hooks)
            last = h[:, -1]
        else:
            name = act_name("resid_post", L - 1)
            _, cache = cached_run(model, clean.tokens, [name], hooks, stop_at_layer=L)
            last = cache[name]
        got = content_nll(model, last, clean.tokens, cidx, width)
        nll[rows] = got
        if not cond.full:
            continue
        later = (cidx > shared.swap_position)
        collapse_out[rows] = collapse_ratio(h, cidx >= 1).cpu()
        pert, pidx = laid_out(shared.swapped[rows], cond.layout, shared.bos_id, width, shared.pad)
        h2 = residual_stack(model, pert.tokens, _condition_hooks(model, cond, shared, rows, "swapped", pert, pidx))
        rel = (h2.float() - h.float()).norm(dim=-1) / h.float().norm(dim=-1).clamp(min=1e-12)
        w = later.to(rel.device).float()[:, None, :]
        spread_out[rows] = ((rel * w).sum(-1) / w.sum(-1)).cpu()
    runs.nll[cond.name] = nll
    if cond.full:
        runs.sink_mass[cond.name], runs.first_key[cond.name] = mass_out, first_out
        runs.spread[cond.name], runs.collapse[cond.name] = spread_out, collapse_out


def _condition_hooks(model, cond: Condition, shared: Shared, rows: slice, copy: str, batch: TokenBatch,
                     cidx: Tensor, mass_out: Tensor | None = None, first_out: Tensor | None = None) -> list:
    """The intervention's hooks, then the readers (sink mass, alpha_0, the paired mass of `<bos>` first)."""
    L = model.cfg.n_layers
    hooks: list = []
    record = None
    if isinstance(cond.sink, ValuelessBos):
        hooks += valueless_bos_hooks(model, cond.sink)
    elif isinstance(cond.sink, PhantomSink):
        mass = shared.mass[copy][rows] if cond.sink.form == "paired" else None
        if mass_out is not None and cond.sink.mode == "dump":
            real = batch.mask.float()

            def record(layer, m):
                mass_out[rows, layer] = ((m.float() * real.to(m.device)[:, None]).sum(-1)
                                         / batch.lengths.to(m.device)[:, None]).cpu()

        hooks += phantom_hooks(model, cond.sink, mass=mass, bos_value=shared.bos_values, record=record)
    key = sink_key(cond.layout)
    keep = cond.name == "bos"

    def read(pattern, hook):
        l = hook.layer()
        if keep:
            shared.mass[copy][rows, l, :, : pattern.shape[-2] - 1] = pattern[:, :, 1:, 0].float().cpu()
        if first_out is None:
            return
        first_out[rows, l] = first_key_score(pattern, batch.lengths).cpu()
        if key is not None:
            pos = torch.arange(pattern.shape[-2], device=pattern.device)
            q = ((cidx.to(pattern.device) >= 0) & (pos[None, :] > key)).float()  # content queries that see <bos>
            mass_out[rows, l] = ((pattern[..., key].float() * q[:, None]).sum(-1) / q.sum(-1)[:, None]).cpu()

    if keep or first_out is not None:
        hooks += [(act_name("pattern", l), read) for l in range(L)]
    return hooks


# The study on one model


def decompose(model: Model, prompts, select, config: DecompositionConfig, *, learned: Mapping[str, PhantomSink] = {},
              name: str = "model", options: RunOptions = RunOptions()) -> Decomposition:
    """Every condition of the study on one model, per prompt.

    Args:
        prompts: the held-out prompts (strings or content token ids).
        select: the prompts that rank the sink heads for the top-k conditions (disjoint from `prompts`).
        learned: condition name -> phantom sink (`FittedSinks.phantom()`), each run in full.
        name: the model's name in the result.
        options: batch size, progress bar, the `<bos>` id (default the tokenizer's).

    Returns:
        Decomposition of this one model.
    """
    bos_token_id = options.bos_token_id
    if bos_token_id is None:
        from sinkmech.loading.models import bos_token_id as model_bos

        bos_token_id = model_bos(model)
    plain = tokenize(model, prompts, bos="none", max_tokens=config.max_tokens)
    rows = plain.content()
    short = min(map(len, rows))
    position = min(config.swap_position, short - 2)
    if position < 0:
        raise ValueError("the decomposition needs prompts of at least 2 content tokens")
    if any(not 1 <= K < short for K in config.positions):
        raise ValueError(f"positions must lie in [1, {short}) for these prompts (the shortest has {short} tokens)")
    swapped = [apply_swap(model, [r], sw)[0][0] for r, sw in zip(rows, corpus_swaps(rows, position))]
    pad = getattr(model.tokenizer, "pad_token_id", None) or 0
    shared = Shared(rows, swapped, position, int(bos_token_id), int(pad), bos_state(model, bos_token_id).values)
    conds = [c for c in main_conditions() if c.name in ("bos", "none") or "main" in config.parts]
    if "main" in config.parts:
        conds += [Condition(n, "none", s) for n, s in learned.items()]
    if "moved" in config.parts:
        conds += [Condition(f"bos_at_{K}", K) for K in config.positions]
    L, H = model.cfg.n_layers, model.cfg.n_heads
    top: list[tuple[int, int]] = []
    for value in config.layer_values:
        for l in range(L):
            if "layers" in config.parts:
                conds.append(Condition(f"layer_{value}_{l}", "none", PhantomSink("paired", value, layers=(l,)), False))
            others = tuple(x for x in range(L) if x != l)
            if "all_but" in config.parts and others:
                conds.append(Condition(f"all_but_{value}_{l}", "none", PhantomSink("paired", value, layers=others),
                                       False))
    if "heads" in config.parts and config.top_k:
        sel = tokenize(model, select, bos="none", max_tokens=config.max_tokens)
        ranked = bos_mass(model, sel, bos_token_id, options).mean(0)
        order = ranked.flatten().argsort(descending=True, stable=True)
        top = [(int(i) // H, int(i) % H) for i in order[: max(config.top_k)]]
        for k in config.top_k:
            if k <= L * H:
                for value in config.layer_values:
                    conds.append(Condition(f"top_{k}_{value}", "none", PhantomSink("paired", value, heads=tuple(top[:k])),
                                           False))
    runs = Runs()
    for cond in tqdm(conds, desc="decomposition", disable=not options.progress, unit="condition"):
        measure(model, cond, shared, runs, options.replace(progress=False))
    return Decomposition(config, {name: runs}, {name: tuple(top)}, {name: L})


# Summaries


def _loss_sums(nll: Tensor, skip: int | None = None) -> tuple[Tensor, Tensor]:
    """Per prompt: the summed loss over the scored content targets (all but `skip`) and their count."""
    x = nll.clone()
    if skip is not None:
        x[:, skip] = float("nan")
    ok = ~x.isnan()
    return torch.where(ok, x, 0.0).sum(1), ok.sum(1).double()


def _curve(x: Tensor, groups: Sequence | None) -> list[float] | None:
    c = prompt_curve(x.double()[:, None], groups=groups)
    return c[0] if c else None


def _rate(mass: Tensor, eps: float) -> Tensor:
    return 100.0 * (mass > check_eps(eps)).flatten(1).double().mean(1)


def summarise(runs: Runs, config: DecompositionConfig, *, n_layers: int, top: Sequence[tuple[int, int]] = (),
              groups: Sequence | None = None) -> dict:
    """Per condition: loss, its paired difference from `<bos>` first and (without
    `<bos>`) the share of the `<bos>` cost it recovers; sink rate, alpha_0 rate,
    spread and rank collapse with their paired differences; the 2 x 2 design; the
    per-layer and top-k recoveries. Every value is [estimate, lo, hi], the interval
    over `groups` (each prompt's document: a cluster bootstrap) or over prompts."""
    ref, targets = _loss_sums(runs.nll["bos"])
    none, _ = _loss_sums(runs.nll["none"])
    cost = none - ref
    out: dict = {"n_prompts": len(ref), "n_documents": n_documents(groups, len(ref)),
                 "interval": interval_description(groups, len(ref)), "content_targets": int(targets.sum()), "conditions": {}}
    for name, nll in runs.nll.items():
        if name.startswith(("layer_", "all_but_", "top_")):
            continue
        skip = int(name.split("_")[-1]) if name.startswith("bos_at_") else None
        loss, n = _loss_sums(nll, skip)
        base = _loss_sums(runs.nll["bos"], skip)[0]
        e = {"loss": ratio_with_ci(loss, n, groups=groups), "vs_bos": {"loss": ratio_with_ci(loss - base, n, groups=groups)}}
        if skip is not None:
            e["loss_targets"] = f"content targets 1..n-1 but {skip}, in this condition and in <bos> first"
        elif name != "bos" and float(cost.sum()) > 0 and not name.startswith("bos_at_"):
            e["recovery"] = ratio_with_ci(none - loss, cost, groups=groups)
        if name in runs.sink_mass:
            full = _full_entry(runs, name, config.eps, groups)
            e["vs_bos"] |= full.pop("vs_bos", {})
            e |= full
        out["conditions"][name] = e
    if all(k in runs.nll for k in ("phantom_bos_value", "phantom", "bias")):
        out["design"] = design(runs, targets, groups)
    out["layers"] = {}
    for value in config.layer_values:
        one = [_share(runs, f"layer_{value}_{l}", none, cost, groups) for l in range(n_layers)]
        but = [_share(runs, f"all_but_{value}_{l}", none, cost, groups) for l in range(n_layers)]
        if any(x is not None for x in one + but):
            out["layers"][value] = {"one": one, "all_but": but}
    out["heads"] = {"ranked_on": "attention on <bos> over content queries, <bos> first, on the selection prompts",
                    "top": [f"L{l}.H{h}" for l, h in top], "top_k": {}}
    for k in config.top_k:
        entry = {v: _share(runs, f"top_{k}_{v}", none, cost, groups) for v in config.layer_values}
        if any(x is not None for x in entry.values()):
            out["heads"]["top_k"][str(k)] = entry
    return out


def _share(runs: Runs, name: str, none: Tensor, cost: Tensor, groups: Sequence | None) -> list[float] | None:
    """The share of the `<bos>` cost a loss-only condition recovers, (none - it) / (none - bos)."""
    if name not in runs.nll or float(cost.sum()) <= 0:
        return None
    return ratio_with_ci(none - _loss_sums(runs.nll[name])[0], cost, groups=groups)


def _full_entry(runs: Runs, name: str, eps: Sequence[float], groups: Sequence | None) -> dict:
    m, b = runs.sink_mass[name], runs.sink_mass["bos"]
    f, fb = runs.first_key[name], runs.first_key["bos"]
    sp, spb = runs.spread[name], runs.spread["bos"]
    co, cob = runs.collapse[name], runs.collapse["bos"]
    e = {"sink_rate": {format_eps(x): _curve(_rate(m, x), groups) for x in eps},
         "sink_mass": _curve(m.flatten(1).mean(1), groups),
         "first_key_rate": {format_eps(x): _curve(_rate(f, x), groups) for x in eps},
         "spread": _curve(sp.mean(1), groups), "spread_last_layer": _curve(sp[:, -1], groups),
         "spread_by_layer": [c for c in prompt_curve(sp.double(), groups=groups)],
         "collapse_by_layer": [c for c in prompt_curve(co.double(), groups=groups)]}
    if name != "bos":
        e["vs_bos"] = {"sink_rate": {format_eps(x): _curve(_rate(m, x) - _rate(b, x), groups) for x in eps},
                       "first_key_rate": {format_eps(x): _curve(_rate(f, x) - _rate(fb, x), groups) for x in eps},
                       "spread": _curve(sp.mean(1) - spb.mean(1), groups),
                       "spread_last_layer": _curve(sp[:, -1] - spb[:, -1], groups),
                       "collapse_by_layer": prompt_curve((co - cob).double(), groups=groups)}
    return e


def design(runs: Runs, targets: Tensor, groups: Sequence | None = None) -> dict:
    """The 2 x 2 design on the run without `<bos>` with the paired mass: mass kept
    (phantom) or removed (bias only / none), value kept (`<bos>`'s) or removed
    (zero). Nats per content target, paired by prompt: each simple effect against
    both kept, both main effects (the mean of the two simple effects) and the
    interaction (removing both minus the two alone), and each as a share of
    removing both."""
    a = _loss_sums(runs.nll["phantom_bos_value"])[0]  # mass kept, value kept (= <bos> first on rotary models)
    b = _loss_sums(runs.nll["phantom"])[0]  # mass kept, value removed
    c = _loss_sums(runs.nll["bias"])[0]  # mass removed, value kept
    d = _loss_sums(runs.nll["none"])[0]  # both removed
    effects = {"mass_alone": c - a, "value_alone": b - a, "both": d - a,
               "mass": ((c - a) + (d - b)) / 2, "value": ((b - a) + (d - c)) / 2, "interaction": d - b - c + a}
    out = {k: ratio_with_ci(v, targets, groups=groups) for k, v in effects.items()}
    both = d - a
    if float(both.sum()) > 0:
        out["share"] = {k: ratio_with_ci(effects[k], both, groups=groups)
                        for k in ("mass_alone", "value_alone", "interaction")}
    return out


# The study's entry point


@dataclass(frozen=True)
class Decomposition(Result):
    """The study on each model: per-prompt runs (`Runs`), the heads ranked for the
    top-k conditions and the layer count; `to_dict()["models"][name]` is `summarise`'s section.
    `documents`: each held-out prompt's source document (windows of a named corpus; the
    intervals then resample documents), or None (prompts from a file: each its own unit)."""

    config: DecompositionConfig
    runs: dict[str, Runs]
    top: dict[str, tuple[tuple[int, int], ...]]
    n_layers: dict[str, int]
    documents: tuple[str, ...] | None = None

    @property
    def models(self) -> dict:
        return {name: summarise(r, self.config, n_layers=self.n_layers[name], top=self.top[name],
                                groups=self.documents)
                for name, r in self.runs.items()}

    def to_dict(self) -> dict:
        return {"config": self.config.to_dict(), "models": self.models}

    def to_dataframe(self):
        import pandas as pd

        rows = []
        for model, runs in self.runs.items():
            for cond, nll in runs.nll.items():
                loss, n = _loss_sums(nll)
                rows += [{"model": model, "condition": cond, "prompt": p, "loss": float(loss[p] / n[p]),
                          "document": None if self.documents is None else self.documents[p]}
                         for p in range(len(loss))]
        return pd.DataFrame(rows)

    def findings(self) -> dict[str, dict]:
        """Findings prefix -> the values written under it (`sinkmech.findings.record`)."""
        return findings_of(self.to_dict())


def findings_of(study: Mapping) -> dict[str, dict]:
    """The findings of a decomposition JSON (one run, or pieces `merge`d): per model,
    every section under `<model>.decomposition`, the by-layer curves left in the JSON."""
    from sinkmech.findings import flatten

    out = {}
    for name, section in study["models"].items():
        keep = {k: v for k, v in section.items() if k != "conditions"}
        for cond, e in section["conditions"].items():
            keep[cond] = {k: v for k, v in e.items() if k not in ("spread_by_layer", "collapse_by_layer")}
            if "vs_bos" in e:
                keep[cond]["vs_bos"] = {k: v for k, v in e["vs_bos"].items() if k != "collapse_by_layer"}
        out[f"{name}.decomposition"] = flatten(f"{name}.decomposition", keep)
    return out


def run(model_or_models=None, config: DecompositionConfig = DecompositionConfig(),
        options: RunOptions = RunOptions()) -> Decomposition:
    """The decomposition on each model of `config.models` (or the models given:
    a model, or name -> model), on the held-out prompts config names.

    Args:
        model_or_models: a loaded model (named `config.models[0]`), a mapping
            name -> model, or None to load each of `config.models` in turn.
    """
    from sinkmech.corpora import corpus_windows, load_prompts

    windows = corpus_windows(config.prompts)  # a named corpus: its windows with their documents
    corpus = list(windows.prompts) if windows is not None else load_prompts(config.prompts)
    end = config.first_prompt + config.n_prompts
    if len(corpus) < end or config.select_prompts > config.first_prompt:
        raise ValueError(f"the prompts are {config.first_prompt}..{end - 1} (held out) and 0..{config.select_prompts - 1} "
                         f"(selection): {len(corpus)} prompts do not hold them, or the two overlap")
    prompts, select = corpus[config.first_prompt : end], corpus[: config.select_prompts]
    documents = windows.documents[config.first_prompt : end] if windows is not None else None
    if model_or_models is None or isinstance(model_or_models, (list, tuple)):  # specs, loaded in turn
        models = {name: None for name in (config.models if model_or_models is None else model_or_models)}
    elif isinstance(model_or_models, Mapping):
        models = dict(model_or_models)
    else:
        models = {config.models[0]: model_or_models}
    options = options.replace(batch_size=options.batch(STUDY_BATCH))
    runs, top, layers = {}, {}, {}
    for name, model in models.items():
        if model is None:
            from sinkmech.loading.models import load_model

            model = load_model(name, device=options.device, dtype=options.dtype or "float32")
        learned = {}
        for pattern in config.learned_files if "main" in config.parts else ():
            f = read_sink_file(pattern.format(model=name))
            f.refuse_fitted(prompts)
            f.check_shape(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
            f.refuse_fitted_tokens(tokenize(model, prompts, bos="none", max_tokens=config.max_tokens).content())
            logits = torch.tensor(f.logits)
            value = "zero" if f.values is None else torch.tensor(f.values)
            variant = str(f.path.stem).split("_", 1)[-1] if "_" in f.path.stem else f.path.stem
            learned[f"learned_{variant}"] = PhantomSink("logits", value, "dump", logits)
        one = decompose(model, prompts, select, config, learned=learned, name=name, options=options)
        runs |= one.runs
        top |= one.top
        layers |= one.n_layers
        del model
    return Decomposition(config, runs, top, layers, documents)


def merge(parts: Sequence[Mapping]) -> dict:
    """Study JSONs of one config run in pieces (models or parts apart) as one: each
    model's sections unioned, the config's models and parts unioned."""
    if not parts:
        raise ValueError("nothing to merge")
    config = dict(parts[0]["config"])
    models: dict = {}
    for p in parts:
        c = p["config"]
        if {k: v for k, v in c.items() if k not in ("models", "parts")} != \
                {k: v for k, v in config.items() if k not in ("models", "parts")}:
            raise ValueError("the pieces ran different settings: they cannot be merged")
        config["models"] = list(dict.fromkeys([*config["models"], *c["models"]]))
        config["parts"] = list(dict.fromkeys([*config["parts"], *c["parts"]]))
        for name, section in p["models"].items():
            into = models.setdefault(name, {})
            _union(into, section)
    return {"config": config, "models": models}


def _union(into: dict, new: Mapping) -> None:
    """`new` into `into`: dicts recursively, lists element by element (a None, a
    piece's missing entry, gives way to a value), anything else replaced unless empty."""
    for k, v in new.items():
        old = into.get(k)
        if isinstance(v, Mapping) and isinstance(old, dict):
            _union(old, v)
        elif isinstance(v, list) and isinstance(old, list) and len(v) == len(old) and (None in v or None in old):
            into[k] = [b if a is None else a for a, b in zip(old, v)]
        elif k not in into or v not in (None, {}, []):
            into[k] = v
