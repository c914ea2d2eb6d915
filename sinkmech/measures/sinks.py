"""Sink scores and sink rates per head (Gu et al. 2025, reused by Barbero et al. 2025).

alpha_0 of a head on a prompt is the mean over all T query positions of the
attention on the first key (1/T <= alpha_0 <= 1; for a model with learned
sink logits, gpt-oss, 0 < alpha_0 <= 1, and the learned sink's own share is
`learned_sink_scores`: see docs/learned_sinks.md). The sink rate at epsilon is
the percentage of (prompt, head) pairs with alpha_0 > epsilon. In the same
pass: value-vector norms and residual-stream norms at the first token versus
the rest (the sink's small value and massive activation). The per-pattern
definitions (alpha_0, the eps and row checks, the `<bos>` move) are in `sinkmech.measures.definitions`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from sinkmech.loading.backend import Model, has_learned_sinks
from sinkmech.hooks import act_name, expand_kv, run
from sinkmech.interventions.phantom import (
    PhantomSink, ValuelessBos, bos_state, paired_mass, phantom_hooks, valueless_bos_hooks,
)
from sinkmech.measures.columns import attention_columns
from sinkmech.measures.fused import Attention, resolve_attention
from sinkmech.measures.loss import masked_row_losses, target_mask
from sinkmech.options import RunOptions
from sinkmech.prompts import DEFAULT_EPS, Bos, PromptSource, TokenBatch, as_batch
from sinkmech.results import Result
from sinkmech.measures.definitions import (  # noqa: F401  (re-exported: sinkmech.measures.sinks is where callers look)
    check_eps,
    check_rows,
    first_key_score,
    learned_sink_score,
    move_bos,
    moved_bos_targets,
    moved_key_score,
    query_mean,
    sink_rate,
    skip_target_mask,
)
from sinkmech.stats import bootstrap_method, n_documents, prompt_curve, ratio_with_ci


@dataclass(frozen=True)
class SinkScores(Result):
    """Per-prompt, per-head first-token statistics for one `<bos>` condition."""

    scores: Float[Tensor, "prompt layer head_index"]
    value_norm_first: Float[Tensor, "prompt layer head_index"]
    value_norm_rest: Float[Tensor, "prompt layer head_index"]
    resid_norm_first: Float[Tensor, "prompt layer"]
    resid_norm_rest: Float[Tensor, "prompt layer"]
    lengths: Int[Tensor, " prompt"]
    bos: Bos
    max_tokens: int  # the longest prompt's content tokens: what was scored
    model_name: str = ""
    loss: float | None = None  # mean next-token loss on content targets 1..n-1 (nats), when asked
    max_tokens_requested: int | None = None  # what was asked (None: a TokenBatch was given)
    context_limit: int | None = None  # the model's n_ctx where it cut a prompt
    loss_sum: float | None = None  # the summed next-token loss behind `loss` (nats), for merging shards
    loss_count: int = 0  # the targets it sums over
    # per prompt: the summed next-token loss on its content targets (nats), for intervals over prompts
    prompt_loss: Float[Tensor, " prompt"] | None = None
    # `<bos>` moved to position K (K content tokens before it; `move_bos`), and per
    # (prompt, layer, head) the mean attention on that key over the queries at and after it
    bos_position: int | None = None
    bos_scores: Float[Tensor, "prompt layer head_index"] | None = None
    # models with learned sink logits (gpt-oss): per (prompt, layer, head) the mean over
    # real queries of the learned sink's share (1 - the row's sum over real keys); None otherwise
    learned_sink_scores: Float[Tensor, "prompt layer head_index"] | None = None
    # how attention was read: "pattern" (each layer's T x T in its hook) or "fused" (never held); None: not recorded
    attention: str | None = None
    # a sink intervention (`sink=`): what it was (`ValuelessBos.describe()` or
    # `PhantomSink.describe()`), and for a phantom sink per (prompt, layer, head)
    # the mass it took, mean over the prompt's real queries
    sink: dict | None = None
    phantom_mass: Float[Tensor, "prompt layer head_index"] | None = None
    # each prompt's source document where prompts are windows of a named corpus
    # (`sinkmech.corpora.prompt_documents`): the intervals then resample documents
    documents: tuple[str, ...] | None = None

    @property
    def n_prompts(self) -> int:
        return self.scores.shape[0]

    @property
    def content_lengths(self) -> Int[Tensor, " prompt"]:
        """Each prompt's content tokens (`lengths` less `<bos>`)."""
        return self.lengths - (1 if self.bos == "prepend" else 0)

    def token_count(self) -> str:
        """The content tokens scored, in words: "64 content tokens each",
        "12 to 64 content tokens", with the context limit where it cut."""
        lo, hi = int(self.content_lengths.min()), int(self.content_lengths.max())
        text = f"{hi} content tokens each" if lo == hi else f"{lo} to {hi} content tokens"
        if self.context_limit is not None:
            text += f" (cut to fit the model's context of {self.context_limit})"
        return text

    @property
    def n_layers(self) -> int:
        return self.scores.shape[1]

    @property
    def n_heads(self) -> int:
        return self.scores.shape[2]

    def sink_rate(self, eps: float | str) -> float:
        """Percent of (prompt, head) pairs whose alpha_0 > eps (strict)."""
        return sink_rate(self.scores, eps)

    def prompt_sink_rate(self, eps: float | str) -> Float[Tensor, " prompt"]:
        """Percent of each prompt's heads whose alpha_0 > eps (their mean is `sink_rate`)."""
        eps = check_eps(eps)
        return 100.0 * (self.scores > eps).flatten(1).double().mean(1)

    def sink_rate_ci(self, eps: float | str, *, seed: int = 0, groups: Sequence | None = None) -> list[float]:
        """[sink rate %, lo, hi]: the 95 % bootstrap interval over the prompts'
        documents (`groups`, by default `documents`: a cluster bootstrap;
        `sinkmech.stats`), or over prompts where neither is known."""
        groups = self.documents if groups is None else groups
        return prompt_curve(self.prompt_sink_rate(eps)[:, None], seed=seed, groups=groups)[0]

    def loss_ci(self, *, seed: int = 0, groups: Sequence | None = None) -> list[float] | None:
        """[loss, lo, hi]: the mean content-target loss with its 95 % bootstrap
        interval over the prompts' documents (`groups`, by default `documents`)
        or over prompts (None without per-prompt losses)."""
        if self.prompt_loss is None:
            return None
        groups = self.documents if groups is None else groups
        return ratio_with_ci(self.prompt_loss, self.prompt_targets().double(), seed=seed, groups=groups)

    def interval(self) -> dict:
        """What the intervals resample: {"unit": "document" | "prompt", "n_units", "method"}."""
        n = n_documents(self.documents, self.n_prompts)
        return {"unit": "prompt" if self.documents is None else "document", "n_units": n,
                "method": bootstrap_method(n)}

    def prompt_targets(self) -> Int[Tensor, " prompt"]:
        """Content targets each prompt's loss sums over (content tokens 1 .. n-1; with
        `<bos>` moved to K, all but content token K: `moved_bos_targets`)."""
        return (self.content_lengths - (1 if self.bos_position is None else 2)).clamp(min=0)

    def mean_scores(self) -> Float[Tensor, "layer head_index"]:
        return einops.reduce(self.scores, "prompt layer head_index -> layer head_index", "mean")

    def prompt_bos_sink_rate(self, eps: float | str) -> Float[Tensor, " prompt"]:
        """With `<bos>` moved (`bos_position`): percent of each prompt's heads whose
        attention on the moved `<bos>` key (`bos_scores`) exceeds eps."""
        if self.bos_scores is None:
            raise ValueError("no bos_scores: score with bos_position=K to move <bos> into the sequence")
        return 100.0 * (self.bos_scores > check_eps(eps)).flatten(1).double().mean(1)

    def per_layer(self) -> Float[Tensor, " layer"]:
        """Mean alpha_0 over prompts and heads, per layer."""
        return einops.reduce(self.scores, "prompt layer head_index -> layer", "mean")

    def per_layer_sink_rate(self, eps: float | str) -> Float[Tensor, " layer"]:
        """Percent of (prompt, head) pairs of each layer whose alpha_0 > eps."""
        eps = check_eps(eps)
        return 100.0 * einops.reduce((self.scores > eps).float(), "prompt layer head_index -> layer", "mean")

    def value_norm_ratio(self) -> Float[Tensor, " layer"]:
        """First-token value norm / mean value norm of the other tokens, averaged
        over prompts and heads, per layer (below 1: the sink writes little)."""
        ratio = self.value_norm_first / self.value_norm_rest.clamp(min=1e-12)
        return einops.reduce(ratio, "prompt layer head_index -> layer", "mean")

    def resid_norm_ratio(self) -> Float[Tensor, " layer"]:
        """Mean residual norm at position 0 / at the other positions, per layer."""
        return self.resid_norm_first.mean(0) / self.resid_norm_rest.mean(0).clamp(min=1e-12)

    def uniform_scores(self) -> Float[Tensor, " prompt"]:
        """alpha_0 of a head attending uniformly, per prompt: mean over its T real
        positions t of 1/(t+1), i.e. H_T / T (float64)."""
        return torch.tensor([sum(1.0 / (t + 1) for t in range(int(T))) / int(T) for T in self.lengths],
                            dtype=torch.float64)

    def uniform_score(self) -> float:
        """`uniform_scores` averaged over prompts."""
        return float(self.uniform_scores().mean())

    def relative_sink_rate(self, multiple: float) -> float:
        """Percent of (prompt, head) pairs whose alpha_0 > `multiple` x the prompt's
        uniform share H_T / T (strict): a threshold that moves with the length,
        where a fixed eps does not. A pair can pass only where multiple x H_T / T < 1."""
        if not multiple > 0:
            raise ValueError(f"multiple must be > 0, got {multiple}")
        cut = multiple * self.uniform_scores().to(self.scores.dtype)
        return 100.0 * (self.scores > cut[:, None, None]).float().mean().item()

    def top_heads(self, k: int = 10) -> list[tuple[int, int, float]]:
        """(layer, head, mean alpha_0) of the k strongest sink heads."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        mean = self.mean_scores()
        vals, idx = mean.flatten().topk(min(k, mean.numel()))
        return [(int(i) // self.n_heads, int(i) % self.n_heads, float(v)) for v, i in zip(vals, idx)]

    def to_dataframe(self):
        """Long format: one row per (prompt, layer, head)."""
        import pandas as pd

        P, L, H = self.scores.shape
        p, l, h = torch.meshgrid(torch.arange(P), torch.arange(L), torch.arange(H), indexing="ij")
        return pd.DataFrame(
            {
                "bos": self.bos,
                "prompt": p.flatten().numpy(),
                "layer": l.flatten().numpy(),
                "head": h.flatten().numpy(),
                "score": self.scores.flatten().cpu().numpy(),
                "value_norm_first": self.value_norm_first.flatten().cpu().numpy(),
                "value_norm_rest": self.value_norm_rest.flatten().cpu().numpy(),
                **({} if self.learned_sink_scores is None else
                   {"learned_sink_score": self.learned_sink_scores.flatten().cpu().numpy()}),
                **({} if self.phantom_mass is None else {"phantom_mass": self.phantom_mass.flatten().cpu().numpy()}),
            }
        )

    def summary(self, eps: Sequence[float | str] = DEFAULT_EPS) -> dict:
        """JSON-ready means over prompts."""
        return {
            "bos": self.bos,
            "scores": self.mean_scores().tolist(),
            "sink_rate": {format_eps(e): self.sink_rate(e) for e in eps},
            # [rate, lo, hi] / [loss, lo, hi]: 95 % bootstrap intervals over documents or prompts (`interval`)
            "sink_rate_ci": {format_eps(e): self.sink_rate_ci(e) for e in eps},
            "loss_ci": self.loss_ci(),
            "interval": self.interval(),
            "per_layer": self.per_layer().tolist(),
            "uniform_score": self.uniform_score(),
            "value_norm_first": self.value_norm_first.mean(0).tolist(),
            "value_norm_rest": self.value_norm_rest.mean(0).tolist(),
            "resid_norm_first": self.resid_norm_first.mean(0).tolist(),
            "resid_norm_rest": self.resid_norm_rest.mean(0).tolist(),
            "loss": self.loss,
            "lengths": self.lengths.tolist(),
            **({} if self.bos_position is None else {
                "bos_position": self.bos_position,
                "bos_scores": einops.reduce(self.bos_scores, "prompt layer head_index -> layer head_index",
                                            "mean").tolist(),
            }),
            **({} if self.learned_sink_scores is None else {
                "learned_sink_scores": einops.reduce(self.learned_sink_scores,
                                                     "prompt layer head_index -> layer head_index", "mean").tolist(),
            }),
            **({} if self.sink is None else {"sink": self.sink}),
            **({} if self.phantom_mass is None else {
                "phantom_mass": einops.reduce(self.phantom_mass, "prompt layer head_index -> layer head_index",
                                              "mean").tolist(),
            }),
        }

    def to_dict(self, eps: Sequence[float | str] = DEFAULT_EPS) -> dict:
        return {
            "model": self.model_name,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "max_tokens": self.max_tokens,
            "max_tokens_requested": self.max_tokens_requested,
            "context_limit": self.context_limit,
            "n_prompts": self.n_prompts,
            "attention": self.attention,
            **self.summary(eps),
        }


def paired_contrasts(pre: SinkScores, none: SinkScores, eps: Sequence[float | str] = DEFAULT_EPS, *,
                     groups: Sequence | None = None) -> dict:
    """Without minus with `<bos>`, paired by prompt: the sink-rate gap per eps
    [points, lo, hi] and, where both scored the same content targets (not so with
    `<bos>` moved: it leaves content token K out), the loss gap [nats, lo, hi],
    with 95 % bootstrap intervals over the prompts' documents (`groups`, by
    default the conditions' `documents`) or over prompts where none are known."""
    if not torch.equal(pre.content_lengths, none.content_lengths):
        raise ValueError("the two conditions scored different prompts: they cannot be paired")
    if groups is None:
        if pre.documents != none.documents:
            raise ValueError("the two conditions name different documents for their prompts: they cannot be paired")
        groups = pre.documents
    out = {"sink_rate_gap": {format_eps(e): prompt_curve((none.prompt_sink_rate(e) - pre.prompt_sink_rate(e))[:, None],
                                                         groups=groups)[0]
                             for e in eps}}
    same_targets = torch.equal(pre.prompt_targets(), none.prompt_targets())
    if pre.prompt_loss is not None and none.prompt_loss is not None and same_targets:
        out["loss_gap"] = ratio_with_ci(none.prompt_loss - pre.prompt_loss, pre.prompt_targets().double(), groups=groups)
    return out


def format_eps(eps: float | str) -> str:
    """Epsilon as a JSON key, written as on the command line: "0.3" stays "0.3"."""
    return eps.strip() if isinstance(eps, str) else repr(float(eps))


def sink_scores(
    model: Model,
    tokens: PromptSource | TokenBatch,
    *,
    bos: Bos | None = None,
    max_tokens: int | None = None,
    loss: bool = False,
    bos_position: int | None = None,
    options: RunOptions = RunOptions(),
    attention: Attention = "pattern",
    sink: ValuelessBos | PhantomSink | None = None,
    also: Callable[[slice, TokenBatch], list] | None = None,
) -> SinkScores:
    """First-token attention scores per (prompt, layer, head), streamed.

    Each layer's attention pattern is reduced inside its hook to one number
    per (prompt, head): the full activation cache is never held. Padding
    positions never enter any mean.

    Args:
        model: a HookedTransformer or a TransformerBridge (`sinkmech.loading.backend`).
        tokens: a ready TokenBatch, or prompts (strings, a .txt / .jsonl path,
            token-id lists, or None for the default corpus), tokenized once.
        bos: "prepend" puts `<bos>` at position 0; "none" scores the same content
            tokens without it. Default: a TokenBatch's own, "prepend" for prompts.
            Token ids that already start with `<bos>` are refused with "prepend"
            (they would get a second one); pass bos="none" to score them as given.
        max_tokens: content tokens per prompt (default 64, as in the paper); for
            a TokenBatch, only recorded as requested. `SinkScores.max_tokens`
            is always the longest content actually scored.
        loss: also the mean next-token loss on content targets 1..n-1 (the
            same targets with and without `<bos>`; see `sinkmech.measures.loss`), from
            the last block's output in the same pass, unembedded in chunks.
        bos_position: K >= 1 moves `<bos>` into the sequence (`move_bos`, with
            bos="prepend"): `scores` stay alpha_0 on key 0 (now a content
            token), `bos_scores` hold the attention on the `<bos>` key, and the
            loss is on content targets 1..n-1 except content token K, which only
            the `<bos>` position would predict (`moved_bos_targets`).
        options: batch size (default 16 prompts per forward pass), progress bar,
            and the `<bos>` id for prompts of a model whose tokenizer lacks one.
        attention: "pattern" reads each layer's pattern in its hook (one layer's
            batch x heads x T x T at a time); "fused" never holds it
            (`sinkmech.measures.fused`: the same numbers, memory O(T) per head);
            "auto" takes the fused path from `FUSED_FROM` positions on.
        sink: a sink intervention (`sinkmech.interventions.phantom`) in every pass:
            `ValuelessBos` (bos="prepend": `<bos>`'s value zeroed in the chosen
            heads) or `PhantomSink` (bos="none": a sink without a token; its
            mass per head is `phantom_mass`, the paired form's m comes from the
            same content with `<bos>` first: the batch's `<bos>` id, the
            options', or the tokenizer's). `scores` stay alpha_0 on key 0 as the
            intervened pattern has it (the
            pattern path only: `attention` "auto" reads the pattern with one).
        also: more readers in the same passes: called with each chunk's rows
            and tokens, it returns hooks that only read (the pattern path
            without a sink intervention; e.g. `ScanSums.ride`, the report's
            dormant scan on its first prompts).

    Returns:
        SinkScores with [prompt, layer, head_index] tensors.
    """
    if max_tokens is None and not isinstance(tokens, TokenBatch):
        max_tokens = 64
    batch = as_batch(model, tokens, bos=bos, default="prepend", max_tokens=max_tokens,
                     bos_token_id=options.bos_token_id)
    if bos_position is not None:
        batch = move_bos(batch, bos_position)
    phantom, bos_id, bos_values = _check_sink(model, batch, sink, bos_position, options.bos_token_id)
    chunks = batch.batches(options.batch(16))
    if sink is not None and attention == "fused":
        raise ValueError("the sink interventions act on the attention pattern: use attention='pattern' (or 'auto')")
    path = "pattern" if sink is not None else resolve_attention(attention, int(batch.tokens.shape[1]))
    if also is not None and (path != "pattern" or sink is not None):
        raise ValueError("more readers ride only the plain pattern pass: no sink intervention, attention='pattern'")
    cfg = model.cfg
    P, L, H = len(batch), cfg.n_layers, cfg.n_heads
    out = {
        k: torch.zeros(P, L, H)
        for k in ("scores", "value_norm_first", "value_norm_rest")
    }
    resid_first, resid_rest = torch.zeros(P, L), torch.zeros(P, L)
    bos_scores = torch.zeros(P, L, H) if bos_position is not None else None
    learned = torch.zeros(P, L, H) if has_learned_sinks(model) else None
    phantom_mass = torch.zeros(P, L, H) if phantom else None
    loss_sum, loss_n = 0.0, 0
    prompt_loss = torch.zeros(P, dtype=torch.float64)
    for rows, part in tqdm(chunks, desc=f"sink scores (bos={batch.bos})", disable=not options.progress, unit="batch"):
        valid = part.mask.float()  # [batch, pos]
        n_real = part.lengths.float()
        n_rest = (n_real - 1).clamp(min=1)
        rest = valid.clone()
        rest[:, 0] = 0.0
        if path == "fused":  # the same numbers from the per-query columns, no T x T pattern
            mask = None if not loss else target_mask(part) if bos_position is None else moved_bos_targets(part, bos_position)
            cols = attention_columns(model, part.tokens, keys=(0,) if bos_position is None else (0, bos_position),
                                     loss_mask=mask)
            for name, v in cols.first_key_stats(part.lengths, bos_position).items():
                target = {"resid_norm_first": resid_first, "resid_norm_rest": resid_rest, "bos_scores": bos_scores,
                          "learned_sink_scores": learned}.get(name, out.get(name))
                if target is not None:
                    target[rows] = v
            if loss:
                prompt_loss[rows] = cols.row_loss
                loss_sum, loss_n = loss_sum + float(cols.row_loss.sum()), loss_n + int(mask[:, :-1].sum())
            continue

        def pattern_hook(pattern, hook):
            check_rows(pattern, valid, hook.layer(), learned=learned is not None, phantom=phantom)
            pattern = pattern.float()  # reductions in float32 whatever the model's dtype
            out["scores"][rows, hook.layer()] = first_key_score(pattern, part.lengths).cpu()
            if learned is not None:
                learned[rows, hook.layer()] = learned_sink_score(pattern, part.lengths).cpu()
            if bos_scores is not None:
                bos_scores[rows, hook.layer()] = moved_key_score(pattern, part.lengths, bos_position).cpu()

        def value_hook(v, hook):
            norms = expand_kv(model, v).float().norm(dim=-1)  # [batch, pos, head_index]
            out["value_norm_first"][rows, hook.layer()] = norms[:, 0].float().cpu()
            mean_rest = einops.einsum(norms, rest, "b p h, b p -> b h") / n_rest[:, None]
            out["value_norm_rest"][rows, hook.layer()] = mean_rest.float().cpu()

        def resid_hook(resid, hook):
            norms = resid.float().norm(dim=-1)  # [batch, pos]
            resid_first[rows, hook.layer()] = norms[:, 0].float().cpu()
            resid_rest[rows, hook.layer()] = ((norms * rest).sum(-1) / n_rest).float().cpu()

        hooks = _sink_hooks(model, part, sink, bos_id, bos_values, phantom_mass, rows)
        for l in range(L):
            hooks += [
                (act_name("pattern", l), pattern_hook),
                (act_name("v", l), value_hook),
                (act_name("resid_post", l), resid_hook),
            ]
        if also is not None:
            hooks += also(rows, part)
        if loss:  # the same pass, through the one masked loss
            mask = target_mask(part) if bos_position is None else moved_bos_targets(part, bos_position)
            per_row = masked_row_losses(model, part.tokens, mask, hooks)
            prompt_loss[rows] = per_row
            loss_sum, loss_n = loss_sum + float(per_row.sum()), loss_n + int(mask[:, :-1].sum())
        else:  # the logits are not needed: stop after the last block
            run(model, part.tokens, hooks, stop_at_layer=L)
    for k, v in out.items():
        if torch.isnan(v).any():
            raise FloatingPointError(f"NaN in {k}: the model produced NaN activations")
    return SinkScores(
        scores=out["scores"],
        value_norm_first=out["value_norm_first"],
        value_norm_rest=out["value_norm_rest"],
        resid_norm_first=resid_first,
        resid_norm_rest=resid_rest,
        lengths=batch.lengths.cpu(),
        bos=batch.bos,
        max_tokens=batch.max_content,
        max_tokens_requested=max_tokens,
        context_limit=batch.context_limit,
        model_name=cfg.model_name,
        loss=(loss_sum / loss_n if loss_n else None) if loss else None,
        loss_sum=loss_sum if loss else None,
        loss_count=loss_n if loss else 0,
        prompt_loss=prompt_loss if loss else None,
        bos_position=bos_position,
        bos_scores=bos_scores,
        learned_sink_scores=learned,
        attention=path,
        sink=None if sink is None else sink.describe(),
        phantom_mass=phantom_mass,
    )


def _check_sink(model: Model, batch: TokenBatch, sink, bos_position: int | None, bos_token_id: int | None):
    """`sink=` checked against the batch: (is it a phantom, the `<bos>` id, `<bos>`'s values or None)."""
    if sink is None:
        return False, None, None
    if isinstance(sink, ValuelessBos):
        if batch.bos != "prepend" or bos_position is not None:
            raise ValueError("a value-less <bos> needs <bos> first: bos='prepend', without bos_position")
        valueless_bos_hooks(model, sink)  # checks the layers and heads now
        return False, None, None
    if not isinstance(sink, PhantomSink):
        raise ValueError(f"sink must be a ValuelessBos or a PhantomSink, got {type(sink).__name__}")
    if batch.bos != "none":
        raise ValueError("a phantom sink stands in for <bos> on the run without it: bos='none'")
    sink.check(model)
    bos_id = bos_token_id if bos_token_id is not None else batch.bos_token_id
    if bos_id is None and (sink.form == "paired" or isinstance(sink.value, str) and sink.value == "bos"):
        from sinkmech.loading.models import bos_token_id as model_bos

        bos_id = model_bos(model)
    needs_value = isinstance(sink.value, str) and sink.value == "bos"
    return True, bos_id, bos_state(model, bos_id).values if needs_value else None


def _sink_hooks(model: Model, part: TokenBatch, sink, bos_id, bos_values, phantom_mass, rows) -> list:
    """The intervention's hooks for one chunk (they run before the readers), recording
    a phantom's mass per (prompt, head), mean over real queries, into `phantom_mass`."""
    if sink is None:
        return []
    if isinstance(sink, ValuelessBos):
        return valueless_bos_hooks(model, sink)
    valid = part.mask.float()

    def record(layer: int, m: Tensor) -> None:
        per = einops.einsum(m.float(), valid.to(m.device), "b h q, b q -> b h") / part.lengths.to(m.device)[:, None]
        phantom_mass[rows, layer] = per.cpu()

    mass = paired_mass(model, part, bos_id) if sink.form == "paired" else None
    return phantom_hooks(model, sink, mass=mass, bos_value=bos_values, record=record)
