"""Metrics that score an intervened run against a reference run.

Every metric reads the next-token logits at the content positions only (the
`<bos>` position, present in one condition and not the other, never enters):
content token j sits at position `offset + j` of its run. The default is the
mean KL divergence KL(reference || intervened) over real content positions
(0 when the intervention changes nothing); `LogitDiff` is the logit of a
correct token minus an incorrect one at each prompt's last content position;
any callable `f(logits, reference, mask) -> scalar` works too.

Logits reach a metric either whole or as `Unembedded`: the last block's
output at the content positions, unembedded only where the metric reads it (a
few positions at a time for KL, one position per prompt for LogitDiff). With
Gemma 3's 262k vocabulary, whole logits of 4 prompts x 256 tokens are 1 GiB
per run; the residual stream they come from is 2.5 MiB.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Union

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

MetricFn = Callable[[Tensor, Tensor, Tensor], Tensor]
MetricName = Literal["kl", "logit_diff", "loss"]
# "logit_diff" needs its answers (LogitDiff), "loss" its content tokens (NextTokenLoss)
MetricSpec = Union[MetricName, "KL", "LogitDiff", "NextTokenLoss", "Custom", MetricFn]


@dataclass(frozen=True)
class Unembedded:
    """Logits held as the residual stream they come from: `unembed(resid[idx])`
    are the logits `logits[idx]` (idx never indexes d_model / d_vocab)."""

    resid: Float[Tensor, "... d_model"]
    unembed: Callable[[Tensor], Tensor]  # last block's output -> logits (sinkmech.loading.backend.unembed)

    @property
    def shape(self) -> tuple[int, ...]:
        """The logits' shape, d_vocab left out: [..., content_pos]."""
        return tuple(self.resid.shape[:-1])

    def copies(self) -> "Unembedded":
        """As one stacked copy: [1, ...]."""
        return Unembedded(self.resid[None], self.unembed)

    def full(self) -> Tensor:
        """Every logit at once (what the lazy form avoids; for metrics that need them whole)."""
        return self.unembed(self.resid)


Logits = Union[Tensor, Unembedded]
# A bound metric scores several stacked copies of the batch at once:
# logits [copies, batch, content_pos, d_vocab] -> [copies].
Bound = Callable[[Logits], Tensor]


def logits_at(logits: Logits, idx: tuple) -> Tensor:
    """`logits[idx]` of whole or unembedded logits (idx over the leading axes only)."""
    if isinstance(logits, Unembedded):
        return logits.unembed(logits.resid[idx])
    return logits[idx]


def whole(logits: Logits) -> Tensor:
    return logits.full() if isinstance(logits, Unembedded) else logits


def one_copy(logits: Logits) -> Logits:
    """[batch, ...] logits as one stacked copy [1, batch, ...], the form a bound metric scores."""
    return logits.copies() if isinstance(logits, Unembedded) else logits[None]


def content_logits(
    logits: Float[Tensor, "batch pos d_vocab"], offset: int, n_content: int
) -> Float[Tensor, "batch content_pos d_vocab"]:
    """The logits at content positions offset .. offset + n_content - 1."""
    return logits[:, offset : offset + n_content]


# Bytes of one fp32 temporary in the KL's blocks of rows: 32 positions of a
# 262k vocabulary (Gemma 3), 170 of SmolLM2's 49k. A block makes a few such
# temporaries (measured on Gemma 3 270M: 64 MiB blocks peaked 0.8 GiB above
# the resident set while the KL ran). Each block unembeds its rows in one
# product, which reads the whole unembedding once: on a CPU, blocks of few rows
# spend their time reading it (SmolLM2's is 113 MB, Gemma 3's 671 MB).
KL_CHUNK_BYTES = 32 << 20
# The reference's log-probabilities and probabilities are kept between calls up to this size.
REFERENCE_KEEP_BYTES = 128 << 20


@dataclass(frozen=True)
class KL:
    """Mean KL(reference || intervened) over the real content positions.

    Computed a block of rows at a time (`KL_CHUNK_BYTES` per temporary; a block
    takes the real positions of several prompts, in order), the reference's
    log-probabilities included: nothing as large as the logits is held besides
    the logits themselves (with Gemma 3's 262k vocabulary, a log_softmax of a
    whole sweep pass, or of the reference, is another GiB). Each copy's per-row
    KLs are summed in float64, so a copy's value does not depend on how its rows
    were blocked beyond the float32 of each row's own log-softmax."""

    name: str = "kl"

    def bind(self, reference: Logits, mask: Tensor) -> Bound:
        vocab = logits_at(reference, (0, slice(0, 1))).shape[-1]
        real = mask.nonzero()  # [row, 2]: (prompt, content position) of every real position, in order
        n_real = max(len(real), 1)
        step = max(1, KL_CHUNK_BYTES // (4 * vocab))
        # blocks of (prompt, position) index pairs; indexing, never reshaping, so no view of the logits is copied whole
        blocks = [(real[a : a + step, 0], real[a : a + step, 1]) for a in range(0, len(real), step)]

        # The reference's log-probabilities and probabilities are the same for
        # every copy and every call: kept when they are small (a report's
        # ablation: 4 x 16 positions), and then a block runs across copies (a
        # sweep pass of short prompts unembeds its copies together); else
        # recomputed per block and call, so that a long sweep never holds them whole.
        keep = len(real) * vocab * 8 <= REFERENCE_KEEP_BYTES
        kept: list[tuple[Tensor, Tensor]] = []

        def reference_block(i: int) -> tuple[Tensor, Tensor]:
            lp = torch.log_softmax(logits_at(reference, blocks[i]).float(), dim=-1)
            return lp, lp.exp()

        def across_copies(logits: Logits) -> Tensor:
            if not kept:
                lps, ps = zip(*(reference_block(i) for i in range(len(blocks))))
                kept.append((torch.cat(lps), torch.cat(ps)))
            ref_lp, ref_p = kept[0]
            copies = logits.shape[0]
            totals = torch.zeros(copies, dtype=torch.float64, device=mask.device)
            for a in range(0, copies * len(real), step):
                r = torch.arange(a, min(a + step, copies * len(real)), device=mask.device)
                c, k = r // len(real), r % len(real)
                lp = torch.log_softmax(logits_at(logits, (c, real[k, 0], real[k, 1])).float(), dim=-1)
                kl = (ref_p[k] * (ref_lp[k] - lp)).sum(-1)  # out of place: attribution differentiates it
                totals = totals.index_add(0, c, kl.double())
            return totals

        def block_by_block(logits: Logits) -> Tensor:
            copies = logits.shape[0]
            totals = [torch.zeros((), dtype=torch.float64, device=mask.device) for _ in range(copies)]
            for i, (b, pos) in enumerate(blocks):
                ref_lp, ref_p = reference_block(i)
                for c in range(copies):
                    lp = torch.log_softmax(logits_at(logits, (c, b, pos)).float(), dim=-1)
                    kl = (ref_p * (ref_lp - lp)).sum(-1)
                    totals[c] = totals[c] + kl.double().sum()
            return torch.stack(totals)

        def score(logits: Logits) -> Tensor:  # each copy: [batch, content_pos, d_vocab]
            small = keep and not logits_at(reference, (0, slice(0, 1))).requires_grad
            return ((across_copies if small else block_by_block)(logits) / n_real).float()

        return score


@dataclass(frozen=True)
class LogitDiff:
    """logit[correct] - logit[incorrect] at each prompt's last content position,
    averaged over prompts. Token ids are one int or one per prompt."""

    correct: int | Tensor
    incorrect: int | Tensor
    name: str = "logit_diff"

    def bind(self, reference: Logits, mask: Tensor) -> Bound:
        batch = mask.shape[0]
        last = mask.long().sum(-1) - 1  # [batch]
        rows = torch.arange(batch, device=mask.device)
        good = torch.as_tensor(self.correct, device=mask.device).expand(batch)
        bad = torch.as_tensor(self.incorrect, device=mask.device).expand(batch)

        def score(logits: Logits) -> Tensor:
            at = logits_at(logits, (slice(None), rows, last))  # [copies, batch, d_vocab]
            return (at[:, rows, good] - at[:, rows, bad]).float().mean(-1)

        return score


@dataclass(frozen=True)
class Custom:
    """A user callable f(logits [batch content_pos d_vocab], reference, mask) -> scalar."""

    fn: MetricFn
    name: str = "custom"

    def bind(self, reference: Logits, mask: Tensor) -> Bound:
        ref = whole(reference)  # a user function sees whole logits

        def score(logits: Logits) -> Tensor:
            return torch.stack([torch.as_tensor(self.fn(x, ref, mask)).float().reshape(()) for x in whole(logits)])

        return score


@dataclass(frozen=True)
class NextTokenLoss:
    """The mean next-token loss (nats per target) over the content targets: content
    position j predicts content token j + 1, for every j whose next token is real
    (the targets `sinkmech.measures.loss` scores, the same with and without `<bos>`).
    Not relative to the reference: the patched run's own loss, so a patch result's
    `baseline` and `source_value` are the two runs' losses. Computed a few positions
    at a time, as KL is."""

    content: Int[Tensor, "batch content_pos"]  # the content tokens (the no-<bos> run's tokens)
    name: str = "loss"

    def bind(self, reference: Logits, mask: Tensor) -> Bound:
        scored = torch.zeros_like(mask)
        scored[:, :-1] = mask[:, :-1] & mask[:, 1:]  # j scored and its target j + 1 real
        real = scored.nonzero()  # [target, 2]: (prompt, content position), in order
        if not len(real):
            raise ValueError("metric 'loss': no content targets (every prompt has a single content token)")
        targets = self.content.to(mask.device)[real[:, 0], real[:, 1] + 1]
        vocab = logits_at(reference, (0, slice(0, 1))).shape[-1]
        step = max(1, KL_CHUNK_BYTES // (4 * vocab))
        blocks = [(a, real[a : a + step, 0], real[a : a + step, 1]) for a in range(0, len(real), step)]

        def score(logits: Logits) -> Tensor:
            out = []
            for c in range(logits.shape[0]):
                total = torch.zeros((), dtype=torch.float64, device=mask.device)
                for a, b, pos in blocks:
                    lp = torch.log_softmax(logits_at(logits, (c, b, pos)).float(), dim=-1)
                    at = targets[a : a + len(b), None].to(lp.device)
                    total = total - lp.gather(-1, at).double().sum()
                out.append(total / len(real))
            return torch.stack(out).float()

        return score


Metric = Union[KL, LogitDiff, NextTokenLoss, Custom]


def resolve_metric(metric: object, answers: tuple[int | Tensor, int | Tensor] | None = None,
                   content: Tensor | None = None) -> Metric:
    """'kl', a `LogitDiff(correct, incorrect)`, a `NextTokenLoss`, a callable, 'logit_diff' with
    `answers=(correct, incorrect)` (the command line's --metric and --answers), or 'loss' with the
    `content` tokens [batch, content_pos] it predicts."""
    if isinstance(metric, (KL, LogitDiff, NextTokenLoss, Custom)):
        return metric
    if metric == "kl":
        return KL()
    if metric == "loss":
        if content is None:
            raise ValueError("metric 'loss' needs the content tokens it predicts (content=)")
        return NextTokenLoss(content)
    if metric == "logit_diff":
        if answers is None:
            raise ValueError("metric 'logit_diff' needs its answers: pass metric=LogitDiff(correct_token, "
                             "incorrect_token)")
        return LogitDiff(*answers)
    if callable(metric):
        return Custom(metric, getattr(metric, "__name__", "custom"))
    raise ValueError(f"metric must be 'kl', 'logit_diff', 'loss' or a callable, got {metric!r}")


def content_mask(lengths: Int[Tensor, " batch"], offset: int, n_content: int) -> Bool[Tensor, "batch content_pos"]:
    """True where content position j is real (j < length - offset)."""
    j = torch.arange(n_content, device=lengths.device)
    return j[None, :] < (lengths - offset)[:, None]
