"""The paper's length claims where they live: thousands of tokens (Barbero et
al. 2025: sinks keep long contexts from over-mixing; Gemma 7B without `<bos>`
scores 0.0 on RULER-4096).

On long natural text (`sinkmech.context.long_text`: documents joined by topic,
each prompt's sources recorded), the same texts cut to each length T, with and
without `<bos>`, and without it with each learned-sink file's sink logits (and
values) in every row (`none_learned_<variant>`; the same content tokens, the
same targets):

- the next-token loss by position bucket (1-64, 65-512, ...: the target's
  content position, from 1), and the sink rate by position: per head, the
  mean attention on key 0 over the content queries of a bucket, against eps
  (key 0 is `<bos>`, or the first content token without it); also over the
  heads of global layers alone, since a sliding-window layer cannot see key 0
  past its window;
- StreamingLLM (Xiao et al. 2024) at T = `stream_length` with `<bos>`: every
  layer restricted to its last W keys, the first `keep` keys kept or dropped,
  each keep k > 0 beside its control (a window of W + k keys, none the first),
  and the first key replaced by learned sink logits (`sinkmech fit-sinks`;
  with their fitted values where the file has them) in the rows where the
  window drops it (`sinkmech.measures.fused.StandIn`), perplexity on the same
  scored tokens as full attention;
- representational collapse in length (`sinkmech.theory.sensitivity.repeat_collapse`,
  the paper's setting): a prefix whose last token is repeated k times, out to
  thousands of repeats, with and without `<bos>`.

Every pass runs through `sinkmech.measures.columns` (fused by default: no T x T
pattern at any length). Intervals: Student t over prompts (a few long prompts,
each from its own documents), the loss as a ratio of sums over prompts.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from sinkmech.context import first_scored
from sinkmech.context.long_text import long_prompts_for
from sinkmech.loading.attention import layer_windows
from sinkmech.loading.backend import Model
from sinkmech.measures.columns import attention_columns
from sinkmech.measures.definitions import check_eps, query_mean
from sinkmech.measures.fused import StandIn
from sinkmech.measures.loss import target_mask
from sinkmech.measures.sinks import format_eps
from sinkmech.options import RunOptions
from sinkmech.prompts import CONDITIONS, tokenize
from sinkmech.results import Result
from sinkmech.stats import Interval, ratio_difference_t_interval, ratio_t_interval, t_interval
from sinkmech.studies.configs import LongContextConfig
from sinkmech.theory.sensitivity import repeat_collapse


def _as_dict(iv: Interval | None) -> dict | None:
    """An interval in this study's JSON form (`Interval.to_dict`: "value", "ci", "p", ...)."""
    return None if iv is None else iv.to_dict()


def bucket_edges(buckets, n_content: int) -> list[tuple[int, int]]:
    """[(first, last)] content positions (from 1) of each bucket that starts within `n_content`."""
    edges, lo = [], 1
    for hi in buckets:
        if lo > n_content:
            break
        edges.append((lo, min(hi, n_content)))
        lo = hi + 1
    return edges


def bucket_label(lo: int, hi: int) -> str:
    return f"{lo}-{hi}"


@dataclass(frozen=True)
class LengthRun:
    """One (T, `<bos>` condition): per prompt and position bucket, the summed
    content-target loss and its count, and per (prompt, layer, head, bucket)
    the mean attention on key 0 over the bucket's content queries."""

    T: int
    bos: str
    buckets: tuple[tuple[int, int], ...]
    loss_sum: Float[Tensor, "prompt bucket"]
    loss_count: Float[Tensor, "prompt bucket"]
    first: Float[Tensor, "prompt layer head_index bucket"]
    alpha0: Float[Tensor, "prompt layer head_index"]  # Gu et al.'s alpha_0 over all T queries
    token_loss: Float[Tensor, "prompt pos"] | None = None  # kept where the stream runs reuse it (NaN: not scored)
    sink: Float[Tensor, "prompt layer head_index bucket"] | None = None  # a learned sink's mass (learned runs)

    def loss(self, b: int) -> dict | None:
        return _as_dict(ratio_t_interval(self.loss_sum[:, b], self.loss_count[:, b]))

    def sink_rate(self, eps: float, b: int, heads: Tensor | None = None) -> dict | None:
        """Percent of heads (of `heads` [layer head_index] bool, default all)
        whose bucket-mean attention on key 0 exceeds eps, t interval over prompts."""
        above = self.first[..., b] > check_eps(eps)
        if heads is not None:
            above = above[:, heads]
        return _as_dict(t_interval(100.0 * above.flatten(1).double().mean(1)))

    def to_dict(self, eps=(0.3, 0.8), global_heads: Tensor | None = None) -> dict:
        return self.summary(eps, global_heads)

    def prompt_rate(self, eps: float, b: int) -> Tensor:
        """[prompt] percent of the heads whose bucket-mean attention on key 0 exceeds eps."""
        return 100.0 * (self.first[..., b] > check_eps(eps)).flatten(1).double().mean(1)

    def summary(self, eps, global_heads: Tensor | None) -> dict:
        out = {}
        for b, (lo, hi) in enumerate(self.buckets):
            out[bucket_label(lo, hi)] = {
                "loss": self.loss(b),
                "sink_rate": {format_eps(e): self.sink_rate(e, b) for e in eps},
                "sink_rate_global_layers": {format_eps(e): None if global_heads is None else
                                            self.sink_rate(e, b, global_heads) for e in eps},
                "targets": int(self.loss_count[:, b].sum()),
            }
        if self.sink is not None:  # the learned sink's mean mass over heads, per bucket
            for b, (lo, hi) in enumerate(self.buckets):
                out[bucket_label(lo, hi)]["learned_sink_mass"] = _as_dict(t_interval(self.sink[..., b].flatten(1)
                                                                                     .double().mean(1)))
        whole = {"alpha0_sink_rate": {format_eps(e): _as_dict(t_interval(100.0 * (self.alpha0 > check_eps(e)).flatten(1)
                                                                  .double().mean(1))) for e in eps},
                 "loss": _as_dict(ratio_t_interval(self.loss_sum.sum(1), self.loss_count.sum(1)))}
        return {"buckets": out, "whole": whole}


def length_run(model: Model, texts: list[str], T: int, bos: str, config: LongContextConfig,
               options: RunOptions, *, keep_losses: bool = False, learned: tuple[str, StandIn] | None = None
               ) -> LengthRun:
    """Loss and attention on key 0 by position bucket, one prompt per pass
    (each position's loss kept too with `keep_losses`; `learned`: (its name,
    a sink in every row) on the run without `<bos>`, the run's label then)."""
    if learned is not None and (bos != "none" or learned[1].where != "every"):
        raise ValueError("a learned sink's length run is the run without <bos> with the sink in every row")
    batch = tokenize(model, texts, bos=bos, max_tokens=T, bos_token_id=options.bos_token_id)
    if int((batch.lengths - batch.offset).min()) < T:
        raise ValueError(f"a long text holds fewer than {T} content tokens: use fewer or other topics")
    edges = bucket_edges(config.buckets, T)
    P, L, H = len(batch), model.cfg.n_layers, model.cfg.n_heads
    loss_sum, loss_count = torch.zeros(P, len(edges), dtype=torch.float64), torch.zeros(P, len(edges))
    first, alpha0 = torch.zeros(P, L, H, len(edges)), torch.zeros(P, L, H)
    sink = None if learned is None else torch.zeros(P, L, H, len(edges))
    label = bos if learned is None else learned[0]
    kept = torch.full(batch.tokens.shape, float("nan")) if keep_losses else None
    for rows, part in tqdm(batch.batches(options.batch(1)), desc=f"long context T={T} {label}",
                           disable=not options.progress, unit="prompt"):
        mask = target_mask(part)
        cols = attention_columns(model, part.tokens, loss_mask=mask, attention=config.attention,
                                 stand_in=None if learned is None else learned[1])
        loss = cols.token_loss.double()  # position p predicts content position p - offset + 2 (from 1)
        if kept is not None:
            kept[rows, : loss.shape[1]] = cols.token_loss
        for b, (lo, hi) in enumerate(edges):
            # targets at content positions lo .. hi (from 1) are predicted at positions offset + lo - 2 .. offset + hi - 2
            a, e = part.offset + lo - 2, part.offset + hi - 1
            sel = mask[:, max(a, 0) : e]
            loss_sum[rows, b] = torch.where(sel, loss[:, max(a, 0) : e], 0.0).sum(1)
            loss_count[rows, b] = sel.sum(1).float()
            for l in range(L):  # content queries at content positions lo .. hi
                first[rows, l, :, b] = query_mean(cols.weights[l, :, :, 0], part.lengths,
                                                  start=part.offset + lo - 1, stop=part.offset + hi)
                if sink is not None:
                    sink[rows, l, :, b] = query_mean(cols.sink[l], part.lengths, start=part.offset + lo - 1,
                                                     stop=part.offset + hi)
        for l in range(L):
            alpha0[rows, l] = query_mean(cols.weights[l, :, :, 0], part.lengths)
    return LengthRun(T=T, bos=label, buckets=tuple(edges), loss_sum=loss_sum, loss_count=loss_count, first=first,
                     alpha0=alpha0, token_loss=kept, sink=sink)


@dataclass(frozen=True)
class StreamRuns:
    """StreamingLLM at one length with `<bos>`: per prompt, the summed loss on
    the same scored tokens under full attention and each window setting."""

    T: int
    window: int
    scored_from: int
    # "full", "keep0", "keep1", "control1" (a window of W + 1, no first key), ..., "keep0_learned_<variant>"
    # (the first key dropped, learned sink logits in its place)
    settings: tuple[str, ...]
    loss_sum: Float[Tensor, "prompt setting"]
    n_scored: int

    def to_dict(self) -> dict:
        return {"T": self.T, "window": self.window, "scored_from": self.scored_from, "n_scored": self.n_scored,
                "settings": self.summary()}

    def summary(self) -> dict:
        counts = torch.full((self.loss_sum.shape[0],), float(self.n_scored), dtype=torch.float64)
        out = {}
        for i, name in enumerate(self.settings):
            loss = _as_dict(ratio_t_interval(self.loss_sum[:, i], counts))
            out[name] = {"loss": loss, "ppl": None if loss is None else math.exp(loss["value"])}
            if name != "full":
                out[name]["minus_full"] = _as_dict(ratio_difference_t_interval(self.loss_sum[:, i], counts,
                                                                      self.loss_sum[:, 0], counts))
        for name in self.settings:  # keep k against its control: the first keys against as many recent ones
            if name.startswith("keep") and name != "keep0" and f"control{name[4:]}" in self.settings:
                c = self.settings.index(f"control{name[4:]}")
                out[name]["minus_control"] = _as_dict(ratio_difference_t_interval(
                    self.loss_sum[:, self.settings.index(name)], counts, self.loss_sum[:, c], counts))
        for name in self.settings:  # learned sinks in the first key's place: against dropping it, and keeping it
            if name.startswith("keep0_"):
                i = self.settings.index(name)
                for other in ("keep0", "keep1"):
                    if other in self.settings:
                        out[name][f"minus_{other}"] = _as_dict(ratio_difference_t_interval(
                            self.loss_sum[:, i], counts, self.loss_sum[:, self.settings.index(other)], counts))
        return out


def stream_runs(model: Model, texts: list[str], config: LongContextConfig, options: RunOptions,
                full: Tensor | None = None, stand_ins: dict[str, StandIn] | None = None) -> StreamRuns:
    """Full attention and StreamingLLM's windows on the same scored tokens
    (`full`: each position's loss under full attention, when a length run
    already has it: [prompt pos], NaN where not scored; `stand_ins`: setting
    name -> learned sinks in the first key's place, each run with it dropped)."""
    T, W, keep = config.stream_length, config.stream_window, tuple(config.stream_keep)
    batch = tokenize(model, texts, bos="prepend", max_tokens=T, bos_token_id=options.bos_token_id)
    n_pos = int(batch.lengths.min())
    start = first_scored(W, keep or (0,), n_pos, batch.offset)
    settings = [("full", None, None)] + [(f"keep{k}", (W, k), None) for k in keep]
    settings += [(f"control{k}", (W + k, 0), None) for k in keep if k > 0]
    settings += [(name, (W, 0), sink) for name, sink in (stand_ins or {}).items()]
    loss_sum = torch.zeros(len(batch), len(settings), dtype=torch.float64)
    for rows, part in tqdm(batch.batches(options.batch(1)), desc=f"stream T={T} W={W}",
                           disable=not options.progress, unit="prompt"):
        pos = torch.arange(part.tokens.shape[1])
        mask = (pos[None, :] >= start) & (pos[None, :] < part.lengths[:, None] - 1)
        for i, (_, stream, sink) in enumerate(settings):
            if stream is None and full is not None:
                loss_sum[rows, i] = torch.where(mask, full[rows, : mask.shape[1]].double(), 0.0).sum(1)
                continue
            cols = attention_columns(model, part.tokens, loss_mask=mask, stream=stream, attention=config.attention,
                                     stand_in=sink)
            loss_sum[rows, i] = cols.row_loss
    n_scored = int(n_pos - 1 - start)
    return StreamRuns(T=T, window=W, scored_from=start, settings=tuple(n for n, _, _ in settings), loss_sum=loss_sum,
                      n_scored=n_scored)


@dataclass(frozen=True)
class LongContextResult(Result):
    """Everything the study measured, with the config that reruns it."""

    config: LongContextConfig
    model_name: str
    sources: tuple[dict, ...]
    windows: tuple[int | None, ...]
    runs: tuple[LengthRun, ...]
    stream: StreamRuns | None
    collapse: dict[str, Float[Tensor, "prompt repeat resid_layer"]]

    def global_heads(self) -> Tensor:
        """[layer head_index] True for the heads of layers without a sliding window."""
        H = self.runs[0].first.shape[2]
        return torch.tensor([w is None for w in self.windows])[:, None].expand(-1, H)

    def run(self, T: int, bos: str) -> LengthRun:
        return next(r for r in self.runs if r.T == T and r.bos == bos)

    @property
    def conditions(self) -> tuple[str, ...]:
        """The runs' labels at every length: "prepend", "none", then "none_learned_<variant>"."""
        return tuple(dict.fromkeys(r.bos for r in self.runs))

    def learned_contrasts(self, T: int) -> dict:
        """Each learned sink's run minus the run with `<bos>` and minus the run
        without it, per bucket (the loss, nats; paired by prompt)."""
        out = {}
        for label in self.conditions[len(CONDITIONS):]:
            run = self.run(T, label)
            out[label] = {}
            for b, (lo, hi) in enumerate(run.buckets):
                out[label][bucket_label(lo, hi)] = {
                    f"minus_{other}": _as_dict(ratio_difference_t_interval(
                        run.loss_sum[:, b], run.loss_count[:, b], self.run(T, other).loss_sum[:, b],
                        self.run(T, other).loss_count[:, b])) for other in CONDITIONS}
        return out

    def contrasts(self, T: int) -> dict:
        """Without minus with `<bos>` at length T, paired by prompt (the same
        content targets and queries): per bucket the loss gap (nats) and the
        sink-rate gap (points) per eps, each with its t interval."""
        pre, none = self.run(T, "prepend"), self.run(T, "none")
        out = {}
        for b, (lo, hi) in enumerate(pre.buckets):
            out[bucket_label(lo, hi)] = {
                "loss_gap": _as_dict(ratio_difference_t_interval(none.loss_sum[:, b], none.loss_count[:, b],
                                                        pre.loss_sum[:, b], pre.loss_count[:, b])),
                "sink_rate_gap": {format_eps(e): _as_dict(t_interval(none.prompt_rate(e, b) - pre.prompt_rate(e, b)))
                                  for e in self.config.eps},
            }
        return out

    def collapse_summary(self) -> dict:
        """Per condition and k: the last layer's ||h_last(k) - h_last(k + 1)|| with its t interval,
        and without minus with `<bos>` paired by prompt."""
        out = {}
        for bos, d in self.collapse.items():
            out[bos] = {str(k): _as_dict(t_interval(d[:, i, -1])) for i, k in enumerate(self.config.collapse_repeats)}
        if set(self.collapse) == set(CONDITIONS):
            diff = self.collapse["none"][..., -1] - self.collapse["prepend"][..., -1]
            out["none_minus_prepend"] = {str(k): _as_dict(t_interval(diff[:, i]))
                                         for i, k in enumerate(self.config.collapse_repeats)}
        return out

    def to_dict(self) -> dict:
        g = self.global_heads()
        return {
            "config": self.config.to_dict(),
            "model": self.model_name,
            "prompt_sources": list(self.sources),
            "layer_windows": list(self.windows),
            "lengths": {str(T): {bos: self.run(T, bos).summary(self.config.eps, g) for bos in self.conditions}
                        for T in self.config.lengths},
            "contrasts": {str(T): self.contrasts(T) for T in self.config.lengths},
            "learned_contrasts": {str(T): self.learned_contrasts(T) for T in self.config.lengths},
            # per prompt and bucket, what the intervals rest on: summed loss (nats) and targets
            "per_prompt": {str(T): {bos: {"loss_sum": self.run(T, bos).loss_sum.tolist(),
                                          "loss_count": self.run(T, bos).loss_count.tolist()}
                                    for bos in self.conditions}
                           for T in self.config.lengths},
            "stream": None if self.stream is None else self.stream.to_dict(),
            "collapse": self.collapse_summary(),
            "interval": "95 % Student t over prompts (loss: ratio of sums, linearised)",
        }

    def to_dataframe(self):
        """Long format: one row per (length, condition, position bucket): the loss and
        the sink rate at each eps, each with its interval."""
        import pandas as pd

        rows = []
        for T, conds in self.to_dict()["lengths"].items():
            for bos, d in conds.items():
                for bucket, b in d["buckets"].items():
                    row = {"T": int(T), "bos": bos, "bucket": bucket, "targets": b["targets"]}
                    for name, v in [("loss", b["loss"])] + [(f"sink_rate_{e}", x) for e, x in b["sink_rate"].items()]:
                        row[name] = None if v is None else v["value"]
                        row[f"{name}_lo"], row[f"{name}_hi"] = (None, None) if v is None else v["ci"]
                    rows.append(row)
        return pd.DataFrame(rows)

    def findings(self) -> dict:
        """The numbers the docs quote: {prefix: flat values} for `sinkmech.findings.record` (`<model>.long.*`)."""
        from sinkmech.findings import flatten

        d = self.to_dict()
        values = {"config": d["config"], "n_prompts": self.config.n_prompts, "lengths": d["lengths"],
                  "contrasts": d["contrasts"], "learned_contrasts": d["learned_contrasts"], "stream": d["stream"],
                  "collapse": d["collapse"]}
        return {f"{self.model_name}.long": flatten(f"{self.model_name}.long", values)}


def learned_stand_ins(model: Model, config: LongContextConfig) -> dict[str, StandIn]:
    """The learned sinks: per file of `config.learned_sinks` (`{model}` filled
    with `config.model`), "learned_<variant>" (the file name after the
    model's: "head", "head_value") -> its logits and values (where="dropped";
    the length runs use them in every row), checked against the model's shape."""
    from sinkmech.interventions.sink_file import read_sink_file

    out = {}
    for pattern in config.learned_sinks:
        f = read_sink_file(pattern.format(model=config.model))
        f.check_shape(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
        variant = f.path.stem.split("_", 1)[-1] if "_" in f.path.stem else f.path.stem
        out[f"learned_{variant}"] = StandIn(torch.tensor(f.logits), None if f.values is None else torch.tensor(f.values))
    return out


def run(model: Model | None = None, config: LongContextConfig = LongContextConfig(),
        options: RunOptions = RunOptions()) -> LongContextResult:
    """Run the study on one model, loaded with a context of at least the longest
    length + 1 (None: `config.model`, loaded so)."""
    need = config.n_ctx_needed
    if model is None:
        from sinkmech.loading.models import load_model

        model = load_model(config.model, device=options.device, dtype=options.dtype or "float32", n_ctx=need)
    if model.cfg.n_ctx < need:
        raise ValueError(f"the study needs {need} positions but the model was loaded with a context of "
                         f"{model.cfg.n_ctx}: load it with n_ctx={need}")
    stand_ins = learned_stand_ins(model, config)
    longest = max(*config.lengths, config.stream_length)
    texts = long_prompts_for(config.n_prompts, longest, config.topics)
    prompts = [t.text for t in texts]
    runs = []
    for T in config.lengths:
        runs += [length_run(model, prompts, T, bos, config, options,
                            keep_losses=(T, bos) == (config.stream_length, "prepend")) for bos in CONDITIONS]
        runs += [length_run(model, prompts, T, "none", config, options,
                            learned=(f"none_{name}", dataclasses.replace(sink, where="every")))
                 for name, sink in stand_ins.items()]
    runs = tuple(runs)
    full = next((r.token_loss for r in runs if r.token_loss is not None), None)
    stream = (stream_runs(model, prompts, config, options, full, {f"keep0_{n}": s for n, s in stand_ins.items()})
              if config.stream_length else None)
    collapse = {}
    if config.collapse_repeats:
        for bos in CONDITIONS:  # one prompt a pass: two sequences of prefix + k + 1 tokens
            per = [repeat_collapse(model, [p], repeats=config.collapse_repeats, bos=bos,
                                   max_tokens=config.collapse_prefix, options=options.replace(progress=False))
                   for p in tqdm(prompts, desc=f"collapse bos={bos}", disable=not options.progress, unit="prompt")]
            collapse[bos] = torch.cat(per)
    return LongContextResult(config=config, model_name=model.cfg.model_name, sources=tuple(t.to_dict() for t in texts),
                             windows=tuple(layer_windows(model)), runs=runs, stream=stream, collapse=collapse)
