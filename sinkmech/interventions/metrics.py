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
MetricName = Literal["kl", "logit_diff"]
MetricSpec = Union[MetricName, "KL", "LogitDiff", "Custom", MetricFn]  # "logit_diff" needs its answers: LogitDiff


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


# Bytes of one fp32 temporary in the KL's chunks: 16 positions of a 262k
# vocabulary (Gemma 3), 85 of SmolLM2's 49k. A chunk makes about a dozen such
# temporaries (measured on Gemma 3 270M: 64 MiB chunks peaked 0.8 GiB above
# the resident set while the KL ran).
KL_CHUNK_BYTES = 16 << 20
# The reference's log-probabilities and probabilities are kept between copies up to this size.
REFERENCE_KEEP_BYTES = 128 << 20


@dataclass(frozen=True)
class KL:
    """Mean KL(reference || intervened) over the real content positions.

    Computed a few positions at a time (`KL_CHUNK_BYTES` per temporary), the
    reference's log-probabilities included: nothing as large as the logits is
    held besides the logits themselves (with Gemma 3's 262k vocabulary, a
    log_softmax of a whole sweep pass, or of the reference, is another GiB)."""

    name: str = "kl"

    def bind(self, reference: Logits, mask: Tensor) -> Bound:
        batch, n_pos = mask.shape
        vocab = logits_at(reference, (0, slice(0, 1))).shape[-1]
        weight = mask.float() / mask.float().sum()
        step = max(1, KL_CHUNK_BYTES // (4 * vocab))
        # (prompt, positions) chunks; indexing, never reshaping, so no view of the logits is copied whole
        chunks = [(b, slice(a, min(a + step, n_pos))) for b in range(batch) for a in range(0, n_pos, step)]

        # The reference's log-probabilities and probabilities are the same for
        # every copy: kept when they are small (a report's ablation: 4 x 16
        # positions), else recomputed per copy so that a long sweep never holds
        # them whole.
        keep = batch * n_pos * vocab * 8 <= REFERENCE_KEEP_BYTES
        kept: dict[int, tuple[Tensor, Tensor]] = {}

        def reference_chunk(i: int) -> tuple[Tensor, Tensor]:
            if i in kept:
                return kept[i]
            b, pos = chunks[i]
            lp = torch.log_softmax(logits_at(reference, (b, pos)).float(), dim=-1)
            pair = lp, lp.exp()
            if keep and not lp.requires_grad:
                kept[i] = pair
            return pair

        def score(logits: Logits) -> Tensor:
            out = []
            for c in range(logits.shape[0]):  # each copy: [batch, content_pos, d_vocab]
                total = torch.zeros((), dtype=torch.float, device=mask.device)
                for i, (b, pos) in enumerate(chunks):
                    ref_lp, ref_p = reference_chunk(i)
                    lp = torch.log_softmax(logits_at(logits, (c, b, pos)).float(), dim=-1)
                    kl = (ref_p * (ref_lp - lp)).sum(-1)  # out of place: attribution differentiates it
                    total = total + (kl * weight[b, pos]).sum()
                out.append(total)
            return torch.stack(out)

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


Metric = Union[KL, LogitDiff, Custom]


def resolve_metric(metric: object, answers: tuple[int | Tensor, int | Tensor] | None = None) -> Metric:
    """'kl', a `LogitDiff(correct, incorrect)`, a callable, or 'logit_diff' with
    `answers=(correct, incorrect)` (the command line's --metric and --answers)."""
    if isinstance(metric, (KL, LogitDiff, Custom)):
        return metric
    if metric == "kl":
        return KL()
    if metric == "logit_diff":
        if answers is None:
            raise ValueError("metric 'logit_diff' needs its answers: pass metric=LogitDiff(correct_token, "
                             "incorrect_token)")
        return LogitDiff(*answers)
    if callable(metric):
        return Custom(metric, getattr(metric, "__name__", "custom"))
    raise ValueError(f"metric must be 'kl', 'logit_diff' or a callable, got {metric!r}")


def content_mask(lengths: Int[Tensor, " batch"], offset: int, n_content: int) -> Bool[Tensor, "batch content_pos"]:
    """True where content position j is real (j < length - offset)."""
    j = torch.arange(n_content, device=lengths.device)
    return j[None, :] < (lengths - offset)[:, None]
