"""Sinks against the evaluation length.

Barbero et al. 2025 (Sec. 5, Fig. 5) vary the *training* context length only.
Here a trained model is evaluated on the same texts cut to growing lengths T:
the sink rate (Gu et al. 2025's alpha_0 > epsilon), the uniform baseline
alpha_0 = H_T / T (it falls with T, so it is reported per length), and the cost
of masking the first key for each of the top-k sink heads alone
(`head_ablations(mode="mask_first")`, KL on content positions).
Lengths beyond the model's context, or beyond the prompts, are skipped and said so.

A fixed eps is a different bar at each length: uniform attention scores
H_T / T, 0.074 at T = 64 but 0.0073 at T = 1024. Beside it, the sweep reports a
baseline-relative rate: the share of (prompt, head) pairs with alpha_0 > m x
H_T / T, for each multiple m in `uniform_multiples` (m = 4 is eps 0.29 at T =
64, the paper's truncation); a multiple with m x H_T / T >= 1 cannot be passed
and is reported as null. The top heads are re-chosen at each length; one fixed
head (by default the top head at the shortest measured length, or the one the
caller names) is tracked across every length: its alpha_0, alpha_0 over the
uniform share, and its mask_first cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from sinkmech.loading.backend import Model
from sinkmech.hooks import head_label
from sinkmech.interventions.ablation import HeadAblation, pair_ablations
from sinkmech.corpora import default_corpus
from sinkmech.prompts import DEFAULT_EPS, Bos, TokenBatch, tokenize
from sinkmech.results import Result
from sinkmech.measures.sinks import SinkScores, check_eps, format_eps, sink_scores
from sinkmech.options import QUIET, RunOptions

DEFAULT_LENGTHS = (64, 128, 256, 512, 1024)
UNIFORM_MULTIPLES = (2.0, 4.0)  # m in "alpha_0 > m x H_T / T"; 4 matches eps 0.3 at T = 64


@dataclass(frozen=True)
class LengthSweep(Result):
    """Sink statistics per evaluation length (content tokens, `<bos>` not counted)."""

    lengths: tuple[int, ...]  # the lengths measured
    eps: tuple[float, ...]
    sink_rate: Float[Tensor, "length eps"]
    mean_score: Float[Tensor, " length"]  # mean alpha_0 over prompts and heads
    uniform_score: Float[Tensor, " length"]
    top_layer: Int[Tensor, "length k"]
    top_head: Int[Tensor, "length k"]
    top_score: Float[Tensor, "length k"]
    mask_first_cost: Float[Tensor, "length k"]  # KL(clean || first key masked), that head alone
    skipped: tuple[tuple[int, str], ...]
    bos: Bos
    n_prompts: int
    model_name: str = ""
    uniform_multiples: tuple[float, ...] = ()
    relative_rate: Float[Tensor, "length multiple"] | None = None  # % with alpha_0 > m x H_T / T
    fixed_layer: int | None = None  # the head tracked across every length (None: no length measured)
    fixed_head: int | None = None
    fixed_chosen_at: int | None = None  # the length it was chosen at (None: named by the caller)
    fixed_score: Float[Tensor, " length"] | None = None  # its mean alpha_0
    fixed_cost: Float[Tensor, " length"] | None = None  # its mask_first cost

    def relative_threshold(self, i: int, j: int) -> float:
        """m x H_T / T at length index i, multiple index j."""
        return self.uniform_multiples[j] * float(self.uniform_score[i])

    def relative_rates(self, i: int) -> dict:
        """Multiple -> relative sink rate at length index i; None where m x H_T / T >= 1
        (alpha_0 <= 1 can never pass it)."""
        return {format_eps(m): (float(self.relative_rate[i, j]) if self.relative_threshold(i, j) < 1 else None)
                for j, m in enumerate(self.uniform_multiples)}

    def to_dataframe(self):
        """Long format: one row per (length, top head)."""
        import pandas as pd

        rows = []
        for i, T in enumerate(self.lengths):
            for r in range(self.top_layer.shape[1]):
                rows.append({
                    "bos": self.bos, "length": T, "rank": r, "layer": int(self.top_layer[i, r]),
                    "head": int(self.top_head[i, r]), "score": float(self.top_score[i, r]),
                    "mask_first_cost": float(self.mask_first_cost[i, r]),
                    "mean_score": float(self.mean_score[i]), "uniform_score": float(self.uniform_score[i]),
                    **{f"sink_rate_{format_eps(e)}": float(self.sink_rate[i, j]) for j, e in enumerate(self.eps)},
                    **{f"relative_sink_rate_{m}": v for m, v in self.relative_rates(i).items()},
                })
        return pd.DataFrame(rows)

    def to_dict(self) -> dict:
        fixed = None
        if self.fixed_layer is not None:
            fixed = {"layer": self.fixed_layer, "head": self.fixed_head,
                     "label": head_label(self.fixed_layer, self.fixed_head), "chosen_at_length": self.fixed_chosen_at,
                     "rule": ("the top head (mean alpha_0) at the shortest measured length" if self.fixed_chosen_at
                              is not None else "named by the caller")}
        return {
            "model": self.model_name, "bos": self.bos, "n_prompts": self.n_prompts,
            "uniform_multiples": list(self.uniform_multiples),
            "relative_rule": "relative_sink_rate[m]: % of (prompt, head) pairs with alpha_0 > m x H_T / T (the "
                             "uniform share at that length); null where m x H_T / T >= 1",
            "fixed_head": fixed,
            "skipped": [{"length": T, "reason": why} for T, why in self.skipped],
            "results": [
                {
                    "length": T,
                    "sink_rate": {format_eps(e): float(self.sink_rate[i, j]) for j, e in enumerate(self.eps)},
                    "mean_score": float(self.mean_score[i]),
                    "uniform_score": float(self.uniform_score[i]),
                    "top_heads": [
                        {"layer": int(self.top_layer[i, r]), "head": int(self.top_head[i, r]),
                         "score": float(self.top_score[i, r]), "mask_first_cost": float(self.mask_first_cost[i, r])}
                        for r in range(self.top_layer.shape[1])
                    ],
                    "relative_sink_rate": self.relative_rates(i),
                    "relative_threshold": {format_eps(m): self.relative_threshold(i, j)
                                           for j, m in enumerate(self.uniform_multiples)},
                    "fixed_head": None if fixed is None else {
                        "score": float(self.fixed_score[i]),
                        "score_over_uniform": float(self.fixed_score[i]) / float(self.uniform_score[i]),
                        "mask_first_cost": float(self.fixed_cost[i])},
                }
                for i, T in enumerate(self.lengths)
            ],
        }


def long_prompt_texts(model: Model, n_prompts: int, n_tokens: int) -> tuple[list[str], int]:
    """The texts `long_prompts` tokenizes, and the content tokens it keeps of each
    (`n_tokens` cut to the model's context). Each text is tokenized on its own, so
    a shard of these texts tokenizes row for row as the whole list does."""
    n_tokens = min(n_tokens, model.cfg.n_ctx - 1)  # room for <bos> in either condition, as in `tokenize`
    return default_corpus(n_prompts, words=n_tokens), n_tokens  # a word is >= 1 token for BPE tokenizers


def long_prompts(model: Model, n_prompts: int, n_tokens: int, *, bos: Bos = "prepend",
                 bos_token_id: int | None = None) -> TokenBatch:
    """`n_prompts` windows of the default corpus with at least `n_tokens` content
    tokens each (cut to the model's context), for `sinks_vs_length`."""
    texts, n_tokens = long_prompt_texts(model, n_prompts, n_tokens)
    return tokenize(model, texts, bos=bos, max_tokens=n_tokens, bos_token_id=bos_token_id)


def truncate(batch: TokenBatch, n_content: int) -> TokenBatch:
    """The first `n_content` content tokens of every row (all rows must have them)."""
    width = batch.offset + n_content
    return TokenBatch(batch.tokens[:, :width], batch.lengths.clamp(max=width), batch.bos, batch.bos_token_id,
                      batch.context_limit)


# The sweep in named steps. `sinks_vs_length` runs them on one batch; a sharded
# run (`sinkmech.sharding.length`) runs the scores and the costs on each shard and
# the choice of heads and the assembly on the merged parts, through the same
# functions.

def check_sweep(n_layers: int, n_heads: int, *, lengths: Sequence[int], top_k: int, eps: Sequence[float],
                uniform_multiples: Sequence[float], fixed_head: tuple[int, int] | None
                ) -> tuple[tuple[int, ...], tuple[float, ...], tuple[float, ...]]:
    """The sweep's options checked against a model of `n_layers` x `n_heads`
    (`ValueError` naming the bad one). Returns (lengths, eps, uniform_multiples)."""
    lengths = tuple(int(T) for T in lengths)
    if not lengths or any(T < 2 for T in lengths):
        raise ValueError(f"lengths must be one or more integers >= 2, got {lengths}")
    if not 1 <= top_k <= n_layers * n_heads:
        raise ValueError(f"top_k must lie in [1, {n_layers * n_heads}], got {top_k}")
    eps = tuple(check_eps(e) for e in eps)
    multiples = tuple(float(m) for m in uniform_multiples)
    if any(not m > 0 for m in multiples):
        raise ValueError(f"uniform_multiples must be > 0, got {multiples}")
    if fixed_head is not None:
        fl, fh = fixed_head
        if not (0 <= fl < n_layers and 0 <= fh < n_heads):
            raise ValueError(f"fixed_head {fixed_head} is not a head of the model "
                             f"({n_layers} layers x {n_heads} heads)")
    return lengths, eps, multiples


def fits_context(T: int, n_ctx: int) -> bool:
    """T content tokens and a `<bos>` fit the model's context."""
    return T <= n_ctx - 1


def plan_lengths(lengths: Sequence[int], n_ctx: int, shortest: int) -> tuple[tuple[int, ...], tuple[tuple[int, str], ...]]:
    """The lengths measured (in the given order) and those skipped, with why: beyond
    the context, or beyond the `shortest` prompt (its content tokens)."""
    done, skipped = [], []
    for T in lengths:
        if not fits_context(T, n_ctx):
            skipped.append((T, f"longer than the model's context allows ({n_ctx} positions, one kept for <bos>)"))
        elif T > shortest:
            skipped.append((T, f"the shortest prompt has {shortest} content tokens"))
        else:
            done.append(T)
    return tuple(done), tuple(skipped)


def length_scores(model: Model, batch: TokenBatch, lengths: Sequence[int], *,
                  options: RunOptions = RunOptions()) -> dict[int, SinkScores]:
    """Stage 1: length T -> the sink scores of every prompt cut to T (per prompt;
    `options`: batch size, default 8 prompts per forward pass, and a progress bar by length)."""
    per_length = RunOptions(batch_size=options.batch(8), progress=False)
    return {T: sink_scores(model, truncate(batch, T), options=per_length)
            for T in tqdm(lengths, desc="sink scores by length", disable=not options.progress, unit="length")}


@dataclass(frozen=True)
class ChosenHeads:
    """The heads whose mask_first cost a sweep measures: the top-k sink heads at
    each length (by mean alpha_0) and the fixed head tracked across every length."""

    lengths: tuple[int, ...]
    top_k: int
    top: tuple[tuple[tuple[int, int, float], ...], ...]  # [length][rank] -> (layer, head, mean alpha_0)
    fixed: tuple[int, int] | None  # None: no length measured
    chosen_at: int | None  # the length the fixed head was chosen at (None: named by the caller)

    def measured(self, i: int) -> list[tuple[int, int]]:
        """The heads costed at length index i: the top heads, then the fixed head if not among them."""
        heads = [(l, h) for l, h, _ in self.top[i]]
        return heads + ([self.fixed] if self.fixed not in heads else [])

    def to_dict(self) -> dict:
        return {"lengths": list(self.lengths), "top_k": self.top_k, "top": [[list(t) for t in row] for row in self.top],
                "fixed": None if self.fixed is None else list(self.fixed), "chosen_at": self.chosen_at}

    @classmethod
    def from_dict(cls, d: dict) -> ChosenHeads:
        return cls(lengths=tuple(int(T) for T in d["lengths"]), top_k=int(d["top_k"]),
                   top=tuple(tuple((int(l), int(h), float(s)) for l, h, s in row) for row in d["top"]),
                   fixed=None if d["fixed"] is None else (int(d["fixed"][0]), int(d["fixed"][1])),
                   chosen_at=d["chosen_at"])


def choose_heads(scores: dict[int, SinkScores], top_k: int, fixed_head: tuple[int, int] | None = None) -> ChosenHeads:
    """The top-k heads at each length of `scores` (in its order) and the fixed head:
    `fixed_head`, or else the top head at the first length."""
    top = tuple(tuple(ss.top_heads(top_k)) for ss in scores.values())
    chosen_at = None
    if fixed_head is None and top:  # chosen once, at the shortest measured length
        fixed_head, chosen_at = (top[0][0][0], top[0][0][1]), next(iter(scores))
    return ChosenHeads(lengths=tuple(scores), top_k=top_k, top=top, chosen_at=chosen_at,
                       fixed=None if fixed_head is None else (int(fixed_head[0]), int(fixed_head[1])))


def length_costs(model: Model, batch: TokenBatch, heads: ChosenHeads, *, options: RunOptions = RunOptions()
                 ) -> dict[int, list[HeadAblation]]:
    """Stage 2: length T -> the mask_first ablation of each head `heads.measured`
    at T, that head alone (KL(clean || first key masked), mean over content positions);
    the heads of one length share its clean run (`pair_ablations`)."""
    return {T: pair_ablations(model, truncate(batch, T), heads.measured(i), mode="mask_first", options=QUIET)
            for i, T in enumerate(tqdm(heads.lengths, desc="mask_first by length", disable=not options.progress,
                                       unit="length"))}


def length_sweep(scores: dict[int, SinkScores], heads: ChosenHeads, costs: dict[int, Sequence[float]], *,
                 skipped: Sequence[tuple[int, str]], eps: Sequence[float], uniform_multiples: Sequence[float],
                 bos: Bos, n_prompts: int, model_name: str = "") -> LengthSweep:
    """The `LengthSweep` of stage 1's `scores`, the `heads` chosen on them and
    stage 2's `costs` (length -> one cost per head of `heads.measured`)."""
    rates, rel, means, uniform, f_score, f_cost = [], [], [], [], [], []
    for i, (T, ss) in enumerate(scores.items()):
        rates.append([ss.sink_rate(e) for e in eps])
        rel.append([ss.relative_sink_rate(m) for m in uniform_multiples])
        means.append(float(ss.scores.mean()))
        uniform.append(ss.uniform_score())
        f_score.append(float(ss.mean_scores()[heads.fixed]))
        f_cost.append(float(costs[T][heads.measured(i).index(heads.fixed)]))
    n, k = len(scores), heads.top_k
    top = [[list(t) for t in row] for row in heads.top]
    return LengthSweep(
        lengths=tuple(scores), eps=tuple(eps),
        sink_rate=torch.tensor(rates, dtype=torch.float).reshape(n, len(eps)),
        mean_score=torch.tensor(means, dtype=torch.float), uniform_score=torch.tensor(uniform, dtype=torch.float),
        top_layer=torch.tensor([[t[0] for t in row] for row in top], dtype=torch.long).reshape(n, k),
        top_head=torch.tensor([[t[1] for t in row] for row in top], dtype=torch.long).reshape(n, k),
        top_score=torch.tensor([[t[2] for t in row] for row in top], dtype=torch.float).reshape(n, k),
        mask_first_cost=torch.tensor([[float(c) for c in costs[T][:k]] for T in scores],
                                     dtype=torch.float).reshape(n, k),
        skipped=tuple(skipped), bos=bos, n_prompts=n_prompts, model_name=model_name,
        uniform_multiples=tuple(uniform_multiples),
        relative_rate=torch.tensor(rel, dtype=torch.float).reshape(n, len(uniform_multiples)),
        fixed_layer=None if heads.fixed is None else heads.fixed[0],
        fixed_head=None if heads.fixed is None else heads.fixed[1], fixed_chosen_at=heads.chosen_at,
        fixed_score=torch.tensor(f_score, dtype=torch.float), fixed_cost=torch.tensor(f_cost, dtype=torch.float),
    )


def sinks_vs_length(
    model: Model,
    batch: TokenBatch,
    *,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    top_k: int = 3,
    eps: Sequence[float] = DEFAULT_EPS,
    uniform_multiples: Sequence[float] = UNIFORM_MULTIPLES,
    fixed_head: tuple[int, int] | None = None,
    options: RunOptions = RunOptions(),
) -> LengthSweep:
    """Sink rate and top-head mask_first cost as the evaluation length grows.

    Args:
        batch: long prompts (e.g. `long_prompts`); each length T uses the first
            T content tokens of every row.
        lengths: content lengths to measure; those beyond the model's context or
            beyond the shortest prompt are skipped (listed in `skipped`).
        top_k: strongest sink heads (mean alpha_0 at that length) whose
            single-head mask_first cost is measured.
        eps: sink-rate thresholds.
        uniform_multiples: m of the baseline-relative rate (alpha_0 > m x H_T / T).
        fixed_head: (layer, head) tracked across every length; default: the
            top head at the shortest measured length.
        options: batch size (default 8 prompts per forward pass), progress bar.

    Returns:
        LengthSweep with [length, ...] tensors.
    """
    lengths, eps, multiples = check_sweep(model.cfg.n_layers, model.cfg.n_heads, lengths=lengths, top_k=top_k, eps=eps,
                                          uniform_multiples=uniform_multiples, fixed_head=fixed_head)
    done, skipped = plan_lengths(lengths, model.cfg.n_ctx, int(batch.lengths.min()) - batch.offset)
    scores = length_scores(model, batch, done, options=options)
    heads = choose_heads(scores, top_k, fixed_head)
    costs = length_costs(model, batch, heads, options=options)
    return length_sweep(scores, heads, {T: [float(r.effects[0, 0]) for r in rs] for T, rs in costs.items()},
                        skipped=skipped, eps=eps, uniform_multiples=multiples, bos=batch.bos, n_prompts=len(batch),
                        model_name=model.cfg.model_name)
