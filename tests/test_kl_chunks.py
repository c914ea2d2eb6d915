"""The KL metric, computed a few positions at a time, equals the whole-tensor formula."""

from __future__ import annotations

import pytest
import torch

from sinkmech.interventions import metrics
from sinkmech.interventions.metrics import KL


def brute_force_kl(reference, mask, logits):
    """Mean KL(reference || intervened) over real positions, all at once."""
    p = torch.log_softmax(reference.double(), -1)
    q = torch.log_softmax(logits.double(), -1)
    kl = (p.exp() * (p - q)).sum(-1)  # [copies, batch, pos]
    return (kl * mask).sum((-1, -2)) / mask.sum()


@pytest.mark.parametrize("chunk_bytes", [4 * 50 * 3, 1 << 20])  # 3 positions per chunk (ragged), or all at once
def test_chunked_kl_equals_the_whole_tensor_formula(monkeypatch, chunk_bytes):
    monkeypatch.setattr(metrics, "KL_CHUNK_BYTES", chunk_bytes)
    g = torch.Generator().manual_seed(0)
    reference = torch.randn(3, 7, 50, generator=g) * 3
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 5:] = False  # a short prompt: its padding never counts
    logits = reference[None] + torch.randn(4, 3, 7, 50, generator=g)
    logits[0] = reference  # an unchanged copy scores 0
    logits[2, 1, 5:] += 100.0  # a huge change on padding only: must not count
    got = KL().bind(reference, mask)(logits)
    want = brute_force_kl(reference, mask, logits)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    assert abs(float(got[0])) < 1e-6 and float(got[1]) > 0.1


def test_chunked_kl_keeps_the_gradient(monkeypatch):
    """Attribution differentiates the metric: the chunks must not cut the graph."""
    monkeypatch.setattr(metrics, "KL_CHUNK_BYTES", 4 * 50 * 2)
    g = torch.Generator().manual_seed(1)
    reference = torch.randn(2, 5, 50, generator=g)
    mask = torch.ones(2, 5, dtype=torch.bool)
    logits = (reference[None] + torch.randn(1, 2, 5, 50, generator=g)).requires_grad_()
    KL().bind(reference, mask)(logits).sum().backward()
    want = logits.detach().clone().requires_grad_()
    brute_force_kl(reference, mask, want).sum().backward()
    torch.testing.assert_close(logits.grad.double(), want.grad.double(), rtol=1e-4, atol=1e-7)
