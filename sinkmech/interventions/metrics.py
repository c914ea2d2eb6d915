"""Metrics that score an intervened run against a reference run.

Every metric reads the next-token logits at the content positions only (the
`<bos>` position, present in one condition and not the other, never enters):
content token j sits at position `offset + j` of its run. The default is the
mean KL divergence KL(reference || intervened) over real content positions
(0 when the intervention changes nothing); `LogitDiff` is the logit of a
correct token minus an incorrect one at each prompt's last content position;
any callable `f(logits, reference, mask) -> scalar` works too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Union

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

MetricFn = Callable[[Tensor, Tensor, Tensor], Tensor]
MetricName = Literal["kl", "logit_diff"]
MetricSpec = Union[MetricName, "LogitDiff", MetricFn]
# A bound metric scores several stacked copies of the batch at once:
# logits [copies, batch, content_pos, d_vocab] -> [copies].
Bound = Callable[[Tensor], Tensor]


def content_logits(
    logits: Float[Tensor, "batch pos d_vocab"], offset: int, n_content: int
) -> Float[Tensor, "batch content_pos d_vocab"]:
    """The logits at content positions offset .. offset + n_content - 1."""
    return logits[:, offset : offset + n_content]


# Bytes of one fp32 temporary in the KL's chunks: 64 positions of a 262k
# vocabulary (Gemma 3), 341 of SmolLM2's 49k.
KL_CHUNK_BYTES = 64 << 20


@dataclass(frozen=True)
class KL:
    """Mean KL(reference || intervened) over the real content positions.

    Computed a few positions at a time (`KL_CHUNK_BYTES` per temporary), the
    reference's log-probabilities included: nothing as large as the logits is
    held besides the logits themselves (with Gemma 3's 262k vocabulary, a
    log_softmax of a whole sweep pass, or of the reference, is another GiB)."""

    name: str = "kl"

    def bind(self, reference: Tensor, mask: Tensor) -> Bound:
        batch, n_pos, vocab = reference.shape
        weight = mask.float() / mask.float().sum()
        step = max(1, KL_CHUNK_BYTES // (4 * vocab))
        # (prompt, positions) chunks; indexing, never reshaping, so no view of the logits is copied whole
        chunks = [(b, slice(a, min(a + step, n_pos))) for b in range(batch) for a in range(0, n_pos, step)]

        def score(logits: Tensor) -> Tensor:
            out = []
            for copy in logits:  # [batch, content_pos, d_vocab]
                total = logits.new_zeros((), dtype=torch.float)
                for b, pos in chunks:
                    ref_lp = torch.log_softmax(reference[b, pos].float(), dim=-1)
                    lp = torch.log_softmax(copy[b, pos].float(), dim=-1)
                    kl = (ref_lp.exp() * (ref_lp - lp)).sum(-1)  # out of place: attribution differentiates it
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

    def bind(self, reference: Tensor, mask: Tensor) -> Bound:
        batch = mask.shape[0]
        last = mask.long().sum(-1) - 1  # [batch]
        rows = torch.arange(batch, device=mask.device)
        good = torch.as_tensor(self.correct, device=mask.device).expand(batch)
        bad = torch.as_tensor(self.incorrect, device=mask.device).expand(batch)

        def score(logits: Tensor) -> Tensor:
            at = logits[:, rows, last]  # [copies, batch, d_vocab]
            return (at[:, rows, good] - at[:, rows, bad]).float().mean(-1)

        return score


@dataclass(frozen=True)
class Custom:
    """A user callable f(logits [batch content_pos d_vocab], reference, mask) -> scalar."""

    fn: MetricFn
    name: str = "custom"

    def bind(self, reference: Tensor, mask: Tensor) -> Bound:
        def score(logits: Tensor) -> Tensor:
            return torch.stack([torch.as_tensor(self.fn(x, reference, mask)).float().reshape(()) for x in logits])

        return score


Metric = Union[KL, LogitDiff, Custom]


def resolve_metric(metric: object, answers: tuple[int | Tensor, int | Tensor] | None = None) -> Metric:
    """'kl', 'logit_diff' (needs `answers=(correct, incorrect)`), a LogitDiff, or a callable."""
    if isinstance(metric, (KL, LogitDiff, Custom)):
        return metric
    if metric == "kl":
        return KL()
    if metric == "logit_diff":
        if answers is None:
            raise ValueError("metric 'logit_diff' needs answers=(correct_token, incorrect_token)")
        return LogitDiff(*answers)
    if callable(metric):
        return Custom(metric, getattr(metric, "__name__", "custom"))
    raise ValueError(f"metric must be 'kl', 'logit_diff' or a callable, got {metric!r}")


def content_mask(lengths: Int[Tensor, " batch"], offset: int, n_content: int) -> Bool[Tensor, "batch content_pos"]:
    """True where content position j is real (j < length - offset)."""
    j = torch.arange(n_content, device=lengths.device)
    return j[None, :] < (lengths - offset)[:, None]
