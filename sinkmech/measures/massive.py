"""Massive-activation dimensions of the first token (Sun et al. 2024, "Massive
activations in large language models", Sec. 2-3).

Per residual layer and dimension d: |h_0[d]| against the median of |h_t[d]|
over the other real positions t >= 1 of the same prompt, both averaged over
prompts (ratio of means), and each dimension's share h_0[d]^2 / ||h_0||^2 of
the first token's squared norm. The onset is the first residual layer whose
first-token norm ratio ||h_0|| / mean_t ||h_t|| exceeds a threshold. The
massive dimensions are Sun et al.'s: at the onset layer, |h_0[d]| > 100 and
>= 1000 x the median magnitude of the hidden state (all real positions and
dimensions of that layer; `sun_min_abs`, `sun_min_ratio`).

Intervention, at the `resid_pre` of every layer from the onset on (the
residual stream carries the dimensions forward and later layers could rebuild
them, so they are reset at each layer), the chosen dimensions at position 0
are either
- `others_mean`: set to their mean over the other real positions of the same
  prompt, which *removes* the massive value, or
- `sun_mean`: set to the first token's own mean value over the prompts (Sun
  et al.'s intervention, which keeps the magnitude and removes only its
  variation over inputs).
Measured: the content next-token loss (sinkmech.measures.loss targets) and the sink rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from sinkmech.loading.backend import Model
from sinkmech.hooks import act_name, check_layer
from sinkmech.measures.loss import content_loss
from sinkmech.prompts import DEFAULT_EPS, Bos, TokenBatch
from sinkmech.results import Result
from sinkmech.measures.sinks import first_key_score, format_eps, sink_rate
from sinkmech.options import RunOptions
from sinkmech.readers import Reader


@dataclass(frozen=True)
class MassiveDims(Result):
    """First-token magnitude per residual layer and dimension."""

    first_abs: Float[Tensor, "resid_layer d_model"]  # mean over prompts of |h_0[d]|
    median_abs: Float[Tensor, "resid_layer d_model"]  # mean over prompts of median_t |h_t[d]|
    norm_ratio: Float[Tensor, " resid_layer"]  # mean ||h_0|| / mean ||h_t||, t >= 1
    top_dims: Int[Tensor, "resid_layer k"]
    onset_layer: int | None  # first resid_layer with norm_ratio > threshold
    threshold: float
    bos: Bos
    model_name: str = ""
    sq_share: Float[Tensor, "resid_layer d_model"] | None = None  # mean over prompts of h_0[d]^2 / ||h_0||^2
    hidden_median: Float[Tensor, " resid_layer"] | None = None  # mean over prompts of median |h| (all positions, dims)
    first_mean: Float[Tensor, "resid_layer d_model"] | None = None  # mean over prompts of h_0[d] (signed)
    sun_min_abs: float = 100.0
    sun_min_ratio: float = 1000.0

    @property
    def dim_ratio(self) -> Float[Tensor, "resid_layer d_model"]:
        return self.first_abs / self.median_abs.clamp(min=1e-12)

    def sun_dims(self, layer: int) -> tuple[int, ...]:
        """Dimensions passing Sun et al.'s criterion at `layer`, largest first."""
        if self.hidden_median is None:
            return ()
        f = self.first_abs[layer]
        ok = (f > self.sun_min_abs) & (f >= self.sun_min_ratio * float(self.hidden_median[layer]))
        idx = ok.nonzero()[:, 0]
        return tuple(int(d) for d in idx[f[idx].argsort(descending=True)])

    @property
    def massive_dims(self) -> tuple[int, ...]:
        """Sun et al.'s massive dimensions at the onset layer (empty when there
        is no onset or none passes)."""
        if self.onset_layer is None:
            return ()
        return self.sun_dims(self.onset_layer)

    def to_dataframe(self):
        """Long format: one row per (resid_layer, top rank)."""
        import pandas as pd

        rows = []
        for l, dims in enumerate(self.top_dims.tolist()):
            for r, d in enumerate(dims):
                rows.append({"bos": self.bos, "resid_layer": l, "rank": r, "dim": d,
                             "first_abs": float(self.first_abs[l, d]), "median_abs": float(self.median_abs[l, d]),
                             "ratio": float(self.dim_ratio[l, d]), "norm_ratio": float(self.norm_ratio[l])})
        return pd.DataFrame(rows)

    def to_dict(self) -> dict:
        ratio = self.dim_ratio
        share = (lambda l, d: None) if self.sq_share is None else (lambda l, d: float(self.sq_share[l, d]))  # noqa: E731
        onset = self.onset_layer
        return {
            "model": self.model_name, "bos": self.bos, "threshold": self.threshold,
            "criterion": f"|h_0[d]| > {self.sun_min_abs:g} and >= {self.sun_min_ratio:g} x the hidden state's median "
                         "magnitude (Sun et al. 2024), at the onset layer",
            "onset_layer": onset, "massive_dims": list(self.massive_dims),
            "massive_dim_share": {str(d): share(onset, d) for d in self.massive_dims},
            "hidden_median": None if self.hidden_median is None else self.hidden_median.tolist(),
            "norm_ratio": self.norm_ratio.tolist(),
            "top_dims": [
                [{"dim": int(d), "first_abs": float(self.first_abs[l, d]), "ratio": float(ratio[l, d]),
                  "share": share(l, d)} for d in dims]
                for l, dims in enumerate(self.top_dims.tolist())
            ],
        }


def _check(batch: TokenBatch) -> None:
    if len(batch) == 0:
        raise ValueError("the batch holds no prompts")
    if int(batch.lengths.min()) < 2:
        raise ValueError("every prompt needs at least 2 positions (position 0 against the rest)")


def hidden_median(resid: Float[Tensor, "batch pos d_model"], lengths: Int[Tensor, " batch"]) -> Float[Tensor, " batch"]:
    """Per prompt: the median magnitude of its hidden state (|h_t[d]| over every
    real position, the first included, and every dimension): Sun et al.'s yardstick."""
    a = resid.float().abs()
    real = torch.arange(a.shape[1], device=a.device)[None, :] < lengths[:, None]
    return a.masked_fill(~real[..., None], float("nan")).flatten(1).nanmedian(dim=1).values


def dim_stats(
    resid: Float[Tensor, "batch pos d_model"], lengths: Int[Tensor, " batch"]
) -> tuple[Float[Tensor, "batch d_model"], Float[Tensor, "batch d_model"], Float[Tensor, " batch"], Float[Tensor, " batch"]]:
    """Per prompt: |h_0|, median over real t >= 1 of |h_t| (per dim), ||h_0||, mean_t ||h_t||."""
    a = resid.float().abs()
    T = a.shape[1]
    pos = torch.arange(T, device=a.device)
    rest = (pos[None, :] >= 1) & (pos[None, :] < lengths[:, None])  # [batch, pos]
    # nanmedian over the real rest positions (torch picks the lower middle value).
    med = a.masked_fill(~rest[..., None], float("nan")).nanmedian(dim=1).values
    norms = resid.float().norm(dim=-1)
    rest_norm = (norms * rest).sum(-1) / rest.sum(-1)
    return a[:, 0], med, norms[:, 0], rest_norm


MASSIVE_SUMS = ("first_abs", "median_abs", "sq_share", "first_signed", "first_norm", "rest_norm", "hidden_median")


def massive_sums(model: Model, batch: TokenBatch, *, options: RunOptions = RunOptions()) -> dict[str, Tensor]:
    """The additive statistics behind `massive_dims`: float64 sums over the
    prompts of `batch` of each per-prompt statistic (`MASSIVE_SUMS`), by name,
    plus "n_prompts". Sums of shards of the prompts add up to the sums of the
    whole corpus (`sinkmech.sharding.measures`).

    Returns:
        name -> float64 tensor [resid_layer, d_model] (|h_0|, median_t |h_t|,
        h_0^2 / ||h_0||^2, h_0) or [resid_layer] (||h_0||, mean_t ||h_t||, the
        hidden state's median magnitude); "n_prompts": [1].
    """
    return massive_reader(model, batch).read(model, options)


def massive_reader(model: Model, batch: TokenBatch) -> Reader:
    """What `massive_sums` reads from each chunk of its passes (`sinkmech.readers`)."""
    _check(batch)
    L, D = model.cfg.n_layers, model.cfg.d_model
    sums = {k: torch.zeros(L + 1, D, dtype=torch.float64) for k in MASSIVE_SUMS[:4]}
    sums.update({k: torch.zeros(L + 1, dtype=torch.float64) for k in MASSIVE_SUMS[4:]})

    def hooks(rows: slice, part: TokenBatch) -> list:
        def make(i: int):
            def hook(resid, hook):
                f, m, a, b = dim_stats(resid, part.lengths)
                stats = {"first_abs": f, "median_abs": m, "first_norm": a, "rest_norm": b,
                         "sq_share": f ** 2 / (a ** 2)[:, None].clamp(min=1e-30), "first_signed": resid[:, 0].float(),
                         "hidden_median": hidden_median(resid, part.lengths)}
                for k, v in stats.items():
                    sums[k][i] += v.double().sum(0).cpu()

            return hook

        return [(act_name("resid_pre", l), make(l)) for l in range(L)] + [(act_name("resid_post", L - 1), make(L))]

    def finish() -> dict[str, Tensor]:
        return {**sums, "n_prompts": torch.tensor([float(len(batch))], dtype=torch.float64)}

    return Reader(batch, hooks, finish, desc=f"massive dims (bos={batch.bos})")


def massive_from_sums(
    sums: dict[str, Tensor],
    *,
    top_k: int = 4,
    threshold: float = 10.0,
    sun_min_abs: float = 100.0,
    sun_min_ratio: float = 1000.0,
    bos: Bos = "prepend",
    model_name: str = "",
) -> MassiveDims:
    """`MassiveDims` from the sums of `massive_sums` (of one pass or of merged shards)."""
    if not 1 <= top_k <= sums["first_abs"].shape[-1]:
        raise ValueError(f"top_k must lie in [1, d_model={sums['first_abs'].shape[-1]}], got {top_k}")
    if threshold <= 0:
        raise ValueError(f"threshold must be > 0, got {threshold}")
    P = float(sums["n_prompts"][0])
    mean = {k: (sums[k] / P).float() for k in ("first_abs", "median_abs", "sq_share", "first_signed", "hidden_median")}
    first, med = mean["first_abs"], mean["median_abs"]
    ratio = (sums["first_norm"] / sums["rest_norm"].clamp(min=1e-12)).float()
    top = (first / med.clamp(min=1e-12)).topk(top_k, dim=-1).indices
    above = (ratio > threshold).nonzero()
    onset = int(above[0]) if len(above) else None
    return MassiveDims(first, med, ratio, top, onset, float(threshold), bos, model_name,
                       sq_share=mean["sq_share"], hidden_median=mean["hidden_median"], first_mean=mean["first_signed"],
                       sun_min_abs=float(sun_min_abs), sun_min_ratio=float(sun_min_ratio))


def massive_dims(
    model: Model,
    batch: TokenBatch,
    *,
    top_k: int = 4,
    threshold: float = 10.0,
    sun_min_abs: float = 100.0,
    sun_min_ratio: float = 1000.0,
    options: RunOptions = RunOptions(),
    reader: Reader | None = None,
) -> MassiveDims:
    """Which residual dimensions carry the first token's large norm, from which layer.

    Args:
        batch: right-padded tokens, at least 2 positions per prompt.
        top_k: dimensions reported per residual layer.
        threshold: onset = first resid_layer with norm ratio > threshold.
        sun_min_abs, sun_min_ratio: Sun et al.'s criterion for a massive
            dimension (|h_0[d]| > sun_min_abs and >= sun_min_ratio x the median
            magnitude of the hidden state).
        options: batch size (default 16 prompts per forward pass), progress bar.
        reader: `massive_reader(model, batch)` filled by another pass it rode
            (`sinkmech.readers`); then no pass of its own runs.

    Returns:
        MassiveDims over resid_layer 0 .. n_layers (embeddings .. last block's output).
    """
    if not 1 <= top_k <= model.cfg.d_model:
        raise ValueError(f"top_k must lie in [1, d_model={model.cfg.d_model}], got {top_k}")
    if threshold <= 0:
        raise ValueError(f"threshold must be > 0, got {threshold}")
    sums = (massive_reader(model, batch) if reader is None else reader.filled(batch)).read(model, options)
    return massive_from_sums(sums, top_k=top_k, threshold=threshold, sun_min_abs=sun_min_abs,
                             sun_min_ratio=sun_min_ratio, bos=batch.bos, model_name=model.cfg.model_name)


@dataclass(frozen=True)
class MassiveIntervention(Result):
    """Loss and sink rate with the massive dimensions reset at position 0."""

    dims: tuple[int, ...]
    from_layer: int
    loss_clean: float
    loss_reset: float
    scores_clean: Float[Tensor, "prompt layer head_index"]
    scores_reset: Float[Tensor, "prompt layer head_index"]
    bos: Bos
    mode: str = "others_mean"  # see RESETS

    def sink_rate(self, eps: float | str, which: str = "clean") -> float:
        """Percent of (prompt, head) pairs with alpha_0 > eps, clean or with the dims reset."""
        if which not in ("clean", "reset"):
            raise ValueError(f"which must be 'clean' or 'reset', got {which!r}")
        return sink_rate(self.scores_clean if which == "clean" else self.scores_reset, eps)

    def to_dict(self, eps: Sequence[float] = DEFAULT_EPS) -> dict:
        return {
            "bos": self.bos, "mode": self.mode, "meaning": RESETS[self.mode], "dims": list(self.dims),
            "from_layer": self.from_layer,
            "loss_clean": self.loss_clean, "loss_reset": self.loss_reset,
            "sink_rate_clean": {format_eps(e): self.sink_rate(e, "clean") for e in eps},
            "sink_rate_reset": {format_eps(e): self.sink_rate(e, "reset") for e in eps},
        }

    def to_dataframe(self):
        import pandas as pd

        return pd.DataFrame([{"condition": c, "loss": l, **{f"sink_rate_{format_eps(e)}": self.sink_rate(e, c) for e in DEFAULT_EPS}}
                             for c, l in (("clean", self.loss_clean), ("reset", self.loss_reset))])


RESETS = {
    "others_mean": "position 0's dims set to their mean over the prompt's other positions (removes the massive value)",
    "sun_mean": "position 0's dims set to the first token's own mean value over the prompts (Sun et al.)",
}


def reset_dims_hook(dims: Sequence[int], lengths: Tensor, values: Tensor | None = None):
    """On `resid_pre`: position 0's `dims` become their mean over real positions
    t >= 1 (`values` None), or the given `values` [dims] (the "sun_mean" reset)."""
    idx = torch.tensor(list(dims), dtype=torch.long)

    def hook(resid: Float[Tensor, "batch pos d_model"], hook):
        out = resid.clone()
        if values is not None:
            out[:, 0, idx.to(resid.device)] = values.to(resid.device, resid.dtype)
            return out
        pos = torch.arange(resid.shape[1], device=resid.device)
        rest = ((pos[None, :] >= 1) & (pos[None, :] < lengths[:, None])).to(resid.dtype)
        mean = torch.einsum("bpd,bp->bd", resid[:, :, idx.to(resid.device)], rest) / rest.sum(-1, keepdim=True)
        out[:, 0, idx.to(resid.device)] = mean
        return out

    return hook


def _loss_and_scores(model, batch: TokenBatch, options: RunOptions, dims, from_layer: int | None,
                     values: Tensor | None = None):
    """Content loss (`sinkmech.measures.loss.content_loss`) and alpha_0 (`sinkmech.measures.sinks.first_key_score`)
    from the same passes, with `dims` reset (to `values` when given) from `from_layer` on."""
    L, H, P = model.cfg.n_layers, model.cfg.n_heads, len(batch)
    scores = torch.zeros(P, L, H)

    def hooks(rows: slice, part: TokenBatch) -> list:
        def pattern_hook(pattern, hook):
            scores[rows, hook.layer()] = first_key_score(pattern, part.lengths).cpu()

        out = [(act_name("pattern", l), pattern_hook) for l in range(L)]
        if dims:
            out += [(act_name("resid_pre", l), reset_dims_hook(dims, part.lengths, None if values is None else values[l]))
                    for l in range(from_layer, L)]
        return out

    loss = content_loss(model, batch, hooks=hooks, desc="massive reset" if dims else "clean", options=options)
    return loss, scores


def reset_massive_dims(
    model: Model,
    batch: TokenBatch,
    *,
    dims: Sequence[int],
    from_layer: int,
    mode: str = "others_mean",
    first_mean: Float[Tensor, "resid_layer d_model"] | None = None,
    clean: MassiveIntervention | None = None,
    options: RunOptions = RunOptions(),
) -> MassiveIntervention:
    """Content loss and first-token scores with and without resetting `dims` at position 0.

    Args:
        dims: residual dimensions to reset (e.g. `MassiveDims.massive_dims`).
        from_layer: the reset runs at resid_pre of layers from_layer .. n_layers-1
            (e.g. `MassiveDims.onset_layer`; must be < n_layers).
        mode: "others_mean" or "sun_mean" (`RESETS`); "sun_mean" needs
            `first_mean` (`MassiveDims.first_mean`, from the same bos condition).
        clean: another reset of the same `batch`: its clean run (loss and
            scores) is taken over instead of run again.
        options: batch size (default 16 prompts per forward pass), progress bar.

    Returns:
        MassiveIntervention (scores are alpha_0 [prompt, layer, head_index], as sinks.py).
    """
    _check(batch)
    dims = tuple(int(d) for d in dims)
    if not dims or any(not 0 <= d < model.cfg.d_model for d in dims):
        raise ValueError(f"dims must be one or more indices in [0, {model.cfg.d_model}), got {dims}")
    check_layer(model, from_layer, "from_layer")
    if mode not in RESETS:
        raise ValueError(f"mode must be one of {tuple(RESETS)}, got {mode!r}")
    values = None
    if mode == "sun_mean":
        if first_mean is None or first_mean.shape[0] < model.cfg.n_layers:
            raise ValueError("the sun_mean reset needs first_mean [resid_layer, d_model] (MassiveDims.first_mean)")
        values = first_mean[:, list(dims)]
    if clean is not None and clean.scores_clean.shape[0] != len(batch):
        raise ValueError(f"clean= is a reset of {clean.scores_clean.shape[0]} prompts, not of this batch of {len(batch)}")
    loss_c, sc = ((clean.loss_clean, clean.scores_clean) if clean is not None
                  else _loss_and_scores(model, batch, options, (), None))
    loss_r, sr = _loss_and_scores(model, batch, options, dims, from_layer, values)
    return MassiveIntervention(dims, from_layer, loss_c, loss_r, sc, sr, batch.bos, mode)
