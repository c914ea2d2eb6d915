"""The KL metric, computed a few positions at a time, equals the whole-tensor formula."""

from __future__ import annotations

import pytest
import torch

from sinkmech.interventions import metrics
from sinkmech.interventions.metrics import KL
from sinkmech.options import QUIET


def brute_force_kl(reference, mask, logits):
    """Mean KL(reference || intervened) over real positions, all at once."""
    p = torch.log_softmax(reference.double(), -1)
    q = torch.log_softmax(logits.double(), -1)
    kl = (p.exp() * (p - q)).sum(-1)  # [copies, batch, pos]
    return (kl * mask).sum((-1, -2)) / mask.sum()


@pytest.mark.parametrize("keep_bytes", [0, 1 << 20])  # the reference recomputed per copy, or kept
@pytest.mark.parametrize("chunk_bytes", [4 * 50 * 3, 1 << 20])  # 3 positions per chunk (ragged), or all at once
def test_chunked_kl_equals_the_whole_tensor_formula(monkeypatch, chunk_bytes, keep_bytes):
    monkeypatch.setattr(metrics, "KL_CHUNK_BYTES", chunk_bytes)
    monkeypatch.setattr(metrics, "REFERENCE_KEEP_BYTES", keep_bytes)
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


# Unembedded logits: the sweep engine and the ablation reference stop at the last
# block and unembed only what a metric reads. Each metric must score them as it
# scores the same logits held whole.

def _last_resid_and_logits(model, tokens):
    from sinkmech.loading.backend import unembed
    from sinkmech.hooks import run

    def no_grad_unembed(model, x):
        with torch.no_grad():
            return unembed(model, x)

    resid = run(model, tokens, stop_at_layer=model.cfg.n_layers)  # [batch, pos, d_model]
    return resid, run(model, tokens), no_grad_unembed


@pytest.mark.parametrize("chunk_bytes", [4 * 1000 * 3, 1 << 20])  # tiny model's d_vocab 1000: 3 positions, or all
def test_unembedded_logits_score_as_whole_logits(tiny_model, monkeypatch, chunk_bytes):
    from sinkmech.interventions.metrics import LogitDiff, Unembedded, one_copy, resolve_metric

    monkeypatch.setattr(metrics, "KL_CHUNK_BYTES", chunk_bytes)
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(1, tiny_model.cfg.d_vocab, (3, 9), generator=g)
    resid, logits, unembed = _last_resid_and_logits(tiny_model, tokens)
    assert torch.allclose(unembed(tiny_model, resid), logits, atol=1e-5)  # the last block's output is what unembeds
    lazy_ref = Unembedded(resid[:, 1:], lambda x: unembed(tiny_model, x))
    ref = logits[:, 1:]
    # two "intervened" copies: the clean run and a perturbed residual stream
    other = resid + 0.5 * torch.randn(resid.shape, generator=g)
    copies = torch.stack([resid, other])[:, :, 1:]
    lazy = Unembedded(copies, lambda x: unembed(tiny_model, x))
    mask = torch.ones(3, 8, dtype=torch.bool)
    mask[2, 6:] = False
    custom = resolve_metric(lambda x, r, m: (x - r)[m].abs().mean())
    for metric in (KL(), LogitDiff(3, torch.tensor([4, 5, 6])), custom):
        want = metric.bind(ref, mask)(lazy.full())
        got = metric.bind(lazy_ref, mask)(lazy)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(metric.bind(lazy_ref, mask)(one_copy(lazy_ref)), metric.bind(ref, mask)(ref[None]),
                                   rtol=1e-5, atol=1e-6)
    kl = KL().bind(lazy_ref, mask)(lazy)
    assert abs(float(kl[0])) < 1e-6 and float(kl[1]) > 1e-3  # the clean copy scores 0, the perturbed one does not


def test_sweep_holds_no_whole_logits(tiny_model, monkeypatch):
    """The engine hands the metric `Unembedded` logits, and its values equal the loop's (whole logits)."""
    from helpers.reference import loop_ablations
    from sinkmech.interventions.ablation import head_ablations
    from sinkmech.interventions.metrics import Unembedded

    seen = []
    bind = KL.bind

    def spy(self, reference, mask):
        score = bind(self, reference, mask)

        def wrapped(logits):
            seen.append(type(logits))
            return score(logits)
        return wrapped

    monkeypatch.setattr(KL, "bind", spy)
    tokens = torch.randint(1, tiny_model.cfg.d_vocab, (2, 7), generator=torch.Generator().manual_seed(3))
    fast = head_ablations(tiny_model, tokens, mode="mask_first", bos="none", options=QUIET)
    assert seen and all(t is Unembedded for t in seen)
    ref = loop_ablations(tiny_model, tokens, mode="mask_first", bos="none")
    torch.testing.assert_close(fast.effects, ref.effects, rtol=1e-4, atol=1e-6)
    assert float(ref.effects.abs().max()) > 1e-4  # the heads do something: not 0 == 0


def test_the_lazy_unembedding_equals_the_models_own(tiny_model):
    """`backend.unembed` (the final norm and the unembedding, on the weights in
    place) gives the logits of the model's own forward pass."""
    from sinkmech.loading.backend import unembed

    tokens = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, cache = tiny_model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_resid_post"))
        last = cache[f"blocks.{tiny_model.cfg.n_layers - 1}.hook_resid_post"]
        torch.testing.assert_close(unembed(tiny_model, last), logits, rtol=1e-5, atol=1e-5)
