"""Activation patching between the run with `<bos>` and the run without it.

Barbero et al. (2025) remove `<bos>` and watch the model over-mix; patching
asks which activations carry the difference. The two runs do not share
positions: content token j sits at position j + 1 with `<bos>` and at j
without, so a `BosPair` holds both runs and the explicit map, and every patch
moves the activation of content token j from one run into the other (either
direction). The metric compares the patched run with the source run (by
default the mean KL over content positions: 0 = fully restored).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from sinkmech.loading.backend import Model
from sinkmech.hooks import act_name, cached_run, check_layer
from sinkmech.interventions.metrics import Bound, MetricSpec, content_logits, content_mask, one_copy, resolve_metric
from sinkmech.prompts import Bos, PromptSource, TokenBatch, check_bos, tokenize
from sinkmech.interventions.sweep import Intervention, clean_pass, sweep
from sinkmech.options import RunOptions
from sinkmech.results import Result

PatchAct = Literal["resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "z", "q", "k", "v"]
PatchBy = Literal["layer_pos", "layer", "head", "head_pos"]
RESID_ACTS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")
HEAD_ACTS = ("z", "q", "k", "v")
AXES = {"layer_pos": ("layer", "pos"), "layer": ("layer",), "head": ("layer", "head_index"), "head_pos": ("layer", "head_index", "pos")}


@dataclass(frozen=True)
class BosPair:
    """The same content tokens run with `<bos>` (T+1 positions) and without (T).

    Content token j is at position `content_positions("prepend")[j] == j + 1`
    in the `<bos>` run and `content_positions("none")[j] == j` in the other.
    """

    with_bos: TokenBatch
    without_bos: TokenBatch

    def run(self, bos: Bos) -> TokenBatch:
        return self.with_bos if check_bos(bos) == "prepend" else self.without_bos

    @property
    def n_content(self) -> int:
        return self.without_bos.tokens.shape[1]

    def content_positions(self, bos: Bos) -> Int[Tensor, " content_pos"]:
        return torch.arange(self.n_content) + self.run(bos).offset

    @property
    def content_mask(self) -> Bool[Tensor, "batch content_pos"]:
        return content_mask(self.without_bos.lengths, 0, self.n_content)


def bos_pair(
    model: Model, prompts: PromptSource, *, max_tokens: int = 64, bos_token_id: int | None = None
) -> BosPair:
    """Tokenize `prompts` once, then run the same content tokens with and without `<bos>`."""
    without = tokenize(model, prompts, bos="none", max_tokens=max_tokens, bos_token_id=bos_token_id)
    with_bos = tokenize(model, without.content(), bos="prepend", max_tokens=max_tokens, bos_token_id=bos_token_id)
    if not torch.equal(with_bos.tokens[:, 1:][without.mask], without.tokens[without.mask]):
        raise ValueError("the two runs do not hold the same content tokens")
    return BosPair(with_bos, without)


@dataclass(frozen=True)
class PatchResult(Result):
    """Metric of the target run with one activation patched in from the source run.

    `values` has the axes named in `axes`: (layer, pos), (layer,), (layer,
    head_index) or (layer, head_index, pos); `pos` is the content position,
    `layer` indexes `layers`. `baseline` is the unpatched target run's metric,
    `source_value` the source run's own (0 for KL).
    """

    values: Float[Tensor, "..."]
    axes: tuple[str, ...]
    act: str
    source: Bos
    target: Bos
    metric: str
    baseline: float
    source_value: float
    layers: tuple[int, ...]
    positions: tuple[int, ...] | None = None  # content positions patched (None: all)

    def restored(self) -> Float[Tensor, "..."]:
        """Fraction of the gap closed: 0 = as unpatched, 1 = as the source run."""
        gap = self.baseline - self.source_value
        return (self.baseline - self.values) / (gap if gap != 0 else float("nan"))

    def to_dataframe(self):
        import pandas as pd

        grids = torch.meshgrid(*[torch.arange(n) for n in self.values.shape], indexing="ij")
        cols = {ax: g.flatten().numpy() for ax, g in zip(self.axes, grids)}
        cols["layer"] = torch.tensor(self.layers)[cols["layer"]].numpy()
        return pd.DataFrame({"act": self.act, "source": self.source, "target": self.target, **cols, "value": self.values.flatten().numpy()})

    def to_dict(self) -> dict:
        return {
            "act": self.act, "source": self.source, "target": self.target, "metric": self.metric,
            "axes": list(self.axes), "layers": list(self.layers), "baseline": self.baseline,
            "source_value": self.source_value, "values": self.values.tolist(),
            "positions": None if self.positions is None else list(self.positions),
        }


def _patcher(name: str, source_act: Tensor, t_pos: Tensor, s_pos: Tensor, head: int | None):
    """Hooks copying source positions `s_pos` (one head, or all) onto target positions `t_pos`."""

    def make(rows: slice, n_rows: int, n_pos: int):
        def hook(act: Tensor, hook) -> Tensor:
            out = act.clone()
            if head is None:
                out[rows, t_pos] = source_act[:, s_pos].to(out)
            else:
                out[rows, t_pos, head] = source_act[:, s_pos, head].to(out)
            return out

        return [(name, hook)]

    return make


@dataclass(frozen=True)
class PatchSetup:
    """One patching sweep, ready to score: the target run, one intervention per
    cell, the metric bound to the source run's logits, and what the result
    records. Built by `patch_setup`; `patch` scores it with `sweep.sweep`, and
    `sweep.loop` (one `run_with_hooks` per cell) is the reference it equals."""

    target_run: TokenBatch
    cells: tuple[Intervention, ...]
    score: Bound
    n_content: int
    shape: tuple[int, ...]
    act: str
    by: PatchBy
    source: Bos
    target: Bos
    metric: str
    baseline: float
    source_value: float
    layers: tuple[int, ...]
    positions: tuple[int, ...] | None
    starts: tuple[Tensor, ...]  # the target run's residual stream entering every layer (the sweep's restarts)

    def result(self, values: Float[Tensor, " cell"]) -> PatchResult:
        """The scored cells (one value each, in `cells`' order) as a PatchResult."""
        return PatchResult(
            values=values.reshape(self.shape), axes=AXES[self.by], act=self.act, source=self.source,
            target=self.target, metric=self.metric, baseline=self.baseline, source_value=self.source_value,
            layers=self.layers, positions=self.positions,
        )


def patch_setup(
    model: Model,
    pair: BosPair,
    *,
    act: PatchAct,
    by: PatchBy,
    source: Bos = "prepend",
    target: Bos | None = None,
    metric: MetricSpec = "kl",
    layers: Sequence[int] | None = None,
    positions: Sequence[int] | None = None,
) -> PatchSetup:
    """Check the options, run the source run (its cache and logits) and the
    unpatched target run, and build one intervention per cell; arguments as in
    `patch`."""
    check_bos(source)
    target = check_bos(target) if target is not None else ("none" if source == "prepend" else "prepend")
    if act not in RESID_ACTS + HEAD_ACTS:
        raise ValueError(f"act must be one of {RESID_ACTS + HEAD_ACTS}, got {act!r}")
    allowed = ("layer_pos", "layer") if act in RESID_ACTS else ("head", "head_pos")
    if by not in allowed:
        raise ValueError(f"act {act!r} is patched by one of {allowed}, got by={by!r}")
    layers = tuple(range(model.cfg.n_layers)) if layers is None else tuple(layers)
    for l in layers:
        check_layer(model, l)
    resolved = resolve_metric(metric, content=pair.without_bos.tokens)
    src, tgt = pair.run(source), pair.run(target)
    n_content = pair.n_content
    s_all, t_all = pair.content_positions(source), pair.content_positions(target)
    scored = pair.content_mask
    if positions is not None:
        if by not in ("layer", "head"):
            raise ValueError(f"positions= needs by='layer' or 'head', got by={by!r}")
        positions = tuple(sorted({int(j) for j in positions}))
        if not positions or positions[0] < 0 or positions[-1] >= n_content:
            raise ValueError(f"positions must be content positions in [0, {n_content}), got {list(positions)}")
        keep = torch.tensor(positions)
        s_all, t_all = s_all[keep], t_all[keep]
        scored = scored & (torch.arange(n_content) >= positions[0])[None, :]
    names = [act_name(act, l) for l in layers]
    src_logits, cache = cached_run(model, src.tokens, names)
    reference = content_logits(src_logits, src.offset, n_content)  # same pass as the cache
    bound = resolved.bind(reference, scored)
    target_logits, starts = clean_pass(model, tgt.tokens, tgt.offset, n_content)  # the sweep restarts from this pass
    baseline = float(bound(one_copy(target_logits))[0])
    source_value = float(bound(reference[None])[0])
    n_heads = cache[names[0]].shape[2] if act in HEAD_ACTS else 1
    cells = []
    for l in layers:
        name = act_name(act, l)
        if by == "layer":
            cells.append(Intervention(l, _patcher(name, cache[name], t_all, s_all, None)))
        elif by == "layer_pos":
            cells += [Intervention(l, _patcher(name, cache[name], t_all[j : j + 1], s_all[j : j + 1], None)) for j in range(n_content)]
        elif by == "head":
            cells += [Intervention(l, _patcher(name, cache[name], t_all, s_all, h)) for h in range(n_heads)]
        else:
            cells += [
                Intervention(l, _patcher(name, cache[name], t_all[j : j + 1], s_all[j : j + 1], h))
                for h in range(n_heads)
                for j in range(n_content)
            ]
    shape = {"layer_pos": (len(layers), n_content), "layer": (len(layers),), "head": (len(layers), n_heads),
             "head_pos": (len(layers), n_heads, n_content)}[by]
    return PatchSetup(target_run=tgt, cells=tuple(cells), score=bound, n_content=n_content, shape=shape, act=act,
                      by=by, source=source, target=target, metric=resolved.name, baseline=baseline,
                      source_value=source_value, layers=layers, positions=positions, starts=tuple(starts))


def patch(
    model: Model,
    pair: BosPair,
    *,
    act: PatchAct,
    by: PatchBy,
    source: Bos = "prepend",
    target: Bos | None = None,
    metric: MetricSpec = "kl",
    layers: Sequence[int] | None = None,
    positions: Sequence[int] | None = None,
    options: RunOptions = RunOptions(),
) -> PatchResult:
    """Patch `act` from the `source` run into the `target` run, one cell at a time.

    Args:
        pair: the two runs (see `bos_pair`).
        act: a residual-stream activation (resid_pre, resid_mid, resid_post,
            attn_out, mlp_out) or a per-head one (z, q, k, v; k and v index
            key/value heads under grouped-query attention; q, k before rotary).
        by: "layer_pos" (one cell per layer and content position), "layer"
            (all content positions at once), "head" (one per layer and head,
            all positions), "head_pos" (per layer, head and content position).
        source: the run activations come from; `target` defaults to the other
            run (`target == source` patches a run into itself: a no-op check).
        metric: "kl" (mean KL(source || patched) over content positions),
            `LogitDiff(correct, incorrect)` (`sinkmech.interventions.metrics`),
            "loss" (the patched run's mean next-token loss on content targets,
            nats per target; `baseline` and `source_value` are the two runs'
            own), or f(logits, reference, mask).
        layers: the layers to sweep (default all).
        positions: with by="layer" or "head", patch only these content
            positions (together) and take the metric over content positions
            from the first of them on (earlier outputs cannot change). E.g.
            1..T-1 from `<bos>` into no-`<bos>` keeps the target's own
            position 0, its sink, instead of overwriting it.
        options: rows per forward pass (copies x prompts, default 128), progress bar.

    The cells that start at one layer run batched, restarting at that layer
    (`sweep.sweep`); `patch_setup(...)` scored by `sweep.loop`, one
    `run_with_hooks` per cell, is the reference it equals (tests).

    Returns:
        PatchResult whose `values` are [layer, pos], [layer], [layer,
        head_index] or [layer, head_index, pos].
    """
    s = patch_setup(model, pair, act=act, by=by, source=source, target=target, metric=metric, layers=layers,
                    positions=positions)
    tgt = s.target_run
    values = sweep(model, tgt.tokens, s.cells, score=s.score, offset=tgt.offset, n_content=s.n_content,
                   options=options, desc=f"patch {act} {s.source}->{s.target}", starts=s.starts)
    return s.result(values)


# Named front-ends ---------------------------------------------------------


def patch_resid_pre(model: Model, pair: BosPair, *, per_position: bool = True, **settings) -> PatchResult:
    """Patch the residual stream entering each layer, per (layer, content position)
    or per layer over all content positions. Settings (and `options`) as in `patch`."""
    return patch(model, pair, act="resid_pre", by="layer_pos" if per_position else "layer", **settings)


def patch_resid_mid(model: Model, pair: BosPair, *, per_position: bool = True, **settings) -> PatchResult:
    """Patch the residual stream between attention and MLP of each layer."""
    return patch(model, pair, act="resid_mid", by="layer_pos" if per_position else "layer", **settings)


def patch_resid_post(model: Model, pair: BosPair, *, per_position: bool = True, **settings) -> PatchResult:
    """Patch the residual stream leaving each layer."""
    return patch(model, pair, act="resid_post", by="layer_pos" if per_position else "layer", **settings)


def patch_attn_out(model: Model, pair: BosPair, *, per_position: bool = True, **settings) -> PatchResult:
    """Patch each layer's attention output (all heads together)."""
    return patch(model, pair, act="attn_out", by="layer_pos" if per_position else "layer", **settings)


def patch_mlp_out(model: Model, pair: BosPair, *, per_position: bool = True, **settings) -> PatchResult:
    """Patch each layer's MLP output."""
    return patch(model, pair, act="mlp_out", by="layer_pos" if per_position else "layer", **settings)


def patch_head_out(model: Model, pair: BosPair, *, per_position: bool = False, **settings) -> PatchResult:
    """Patch one head's output `z`, per (layer, head) over all content positions,
    or per (layer, head, content position)."""
    return patch(model, pair, act="z", by="head_pos" if per_position else "head", **settings)


def patch_head_q(model: Model, pair: BosPair, **settings) -> PatchResult:
    """Patch one head's queries (before rotary), per (layer, head)."""
    return patch(model, pair, act="q", by="head", **settings)


def patch_head_k(model: Model, pair: BosPair, **settings) -> PatchResult:
    """Patch one key head's keys (before rotary), per (layer, key/value head)."""
    return patch(model, pair, act="k", by="head", **settings)


def patch_head_v(model: Model, pair: BosPair, **settings) -> PatchResult:
    """Patch one key/value head's values, per (layer, key/value head)."""
    return patch(model, pair, act="v", by="head", **settings)
