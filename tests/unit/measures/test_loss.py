"""The content-target loss (Table 2's loss column) against brute force."""

from __future__ import annotations

import pytest
import torch

from helpers.tiny import TINY_BOS
from helpers.tolerance import TINY_FORWARD, gamma
from sinkmech.measures.loss import content_loss, target_mask
from sinkmech.prompts import tokenize
from sinkmech.options import QUIET, RunOptions


def brute_force_loss(model, rows: list[list[int]], bos: bool) -> float:
    """Full logits, one prompt at a time: mean -log p(content token j | tokens before it), j >= 1."""
    nll = []
    for r in rows:
        seq = ([TINY_BOS] if bos else []) + r
        logits = model(torch.tensor([seq]))[0]
        lp = torch.log_softmax(logits.double(), -1)
        off = 1 if bos else 0
        nll += [-float(lp[off + j - 1, r[j]]) for j in range(1, len(r))]
    return sum(nll) / len(nll)


def test_content_loss_equals_brute_force_and_scores_the_same_targets(tiny_model):
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(2, 50, (n,), generator=g).tolist() for n in (9, 5, 12, 3)]  # ragged: padding must not count
    for bos in ("prepend", "none"):
        batch = tokenize(tiny_model, rows, bos=bos, max_tokens=12, bos_token_id=TINY_BOS)
        assert int(target_mask(batch).sum()) == sum(len(r) - 1 for r in rows)
        got = content_loss(tiny_model, batch, options=RunOptions(batch_size=3))
        # padded batches of 3 against each prompt alone: the forward bound on losses of ~ln 50 nats
        assert got == pytest.approx(brute_force_loss(tiny_model, rows, bos == "prepend"), rel=TINY_FORWARD)


def test_content_loss_rejects_prompts_without_targets(tiny_model):
    batch = tokenize(tiny_model, [[5], [7]], bos="none", max_tokens=4, bos_token_id=TINY_BOS, min_tokens=1)
    with pytest.raises(ValueError, match="at least 2 content tokens"):
        content_loss(tiny_model, batch)
    with pytest.raises(ValueError, match="batch_size"):
        content_loss(tiny_model, batch, options=RunOptions(batch_size=0))


def test_sink_scores_loss_in_the_same_pass_equals_content_loss(tiny_model):
    from sinkmech.measures.sinks import sink_scores

    g = torch.Generator().manual_seed(2)
    rows = [torch.randint(2, 50, (n,), generator=g).tolist() for n in (10, 4, 7)]
    for bos in ("prepend", "none"):
        batch = tokenize(tiny_model, rows, bos=bos, max_tokens=10, bos_token_id=TINY_BOS)
        scores = sink_scores(tiny_model, batch, loss=True, options=RunOptions(batch_size=2, progress=False))
        assert scores.loss == pytest.approx(content_loss(tiny_model, batch), rel=TINY_FORWARD)  # batches of 2 vs 3
        assert scores.summary()["loss"] == scores.loss
        assert sink_scores(tiny_model, batch, options=QUIET).loss is None  # not asked: not computed


def test_token_losses_equal_transformer_lens_per_token_loss(tiny_model):
    from sinkmech.measures.loss import token_losses

    g = torch.Generator().manual_seed(4)
    tokens = torch.randint(2, 50, (3, 21), generator=g)
    want = tiny_model(tokens, return_type="loss", loss_per_token=True)
    got = token_losses(tiny_model, tokens, chunk=4)  # chunks that do not divide the length
    # the same pass, the log-softmax over 50 logits taken in another order: gamma(50) of ~ln 50 nats
    assert got.shape == want.shape and torch.allclose(got, want.detach().float(), rtol=gamma(50), atol=0)


def test_per_prompt_losses_and_their_intervals(tiny_model):
    """sink_scores keeps each prompt's summed loss: each equals the brute-force sum,
    they add up to the mean loss, and the intervals sit around the estimates."""
    from sinkmech.measures.sinks import sink_scores

    g = torch.Generator().manual_seed(2)
    rows = [torch.randint(2, 50, (n,), generator=g).tolist() for n in (9, 5, 12, 3, 12, 7)]
    for bos in ("prepend", "none"):
        batch = tokenize(tiny_model, rows, bos=bos, max_tokens=12, bos_token_id=TINY_BOS)
        s = sink_scores(tiny_model, batch, loss=True, options=RunOptions(batch_size=4, progress=False))
        for p, r in enumerate(rows):
            assert float(s.prompt_loss[p]) / (len(r) - 1) == pytest.approx(
                brute_force_loss(tiny_model, [r], bos == "prepend"), abs=1e-4)
        assert s.prompt_targets().tolist() == [len(r) - 1 for r in rows]
        loss, lo, hi = s.loss_ci()
        assert loss == pytest.approx(s.loss, abs=1e-6) and lo < loss < hi
        rate, rlo, rhi = s.sink_rate_ci(0.3)
        assert rate == pytest.approx(s.sink_rate(0.3)) and rlo <= rate <= rhi
        assert float(s.prompt_sink_rate(0.3).mean()) == pytest.approx(s.sink_rate(0.3))
    assert sink_scores(tiny_model, batch, options=QUIET).loss_ci() is None  # no loss asked, no interval


def by_vocabulary_rows(model):
    """A copy of `model` with W_U stored as sinkmech's loaders keep it (the
    transpose of a contiguous [d_vocab, d_model] tensor)."""
    import copy

    from sinkmech.loading.hooked import _weights_as_linear_reads_them

    model = copy.deepcopy(model)
    _weights_as_linear_reads_them(model)
    assert model.unembed.W_U.T.is_contiguous() and not model.unembed.W_U.is_contiguous()
    return model


@pytest.mark.parametrize("layout", ["d_model_rows", "vocabulary_rows"])
def test_next_token_nll_in_a_reused_buffer_equals_a_float64_log_softmax(tiny_model, layout):
    """The logits go into one buffer kept across calls and the log-softmax is
    taken in place: a large call, then smaller and 1-row ones (the buffer is
    reused, not grown), then a larger one (it grows), each against float64; with
    W_U as TransformerLens builds it and as sinkmech's loaders keep it (another
    product, the logits transposed in the buffer)."""
    from sinkmech.loading.backend import CAPABILITIES, unembed
    from sinkmech.measures.loss import next_token_nll

    if layout == "vocabulary_rows":
        if not CAPABILITIES.from_config:
            pytest.skip("the Bridge unembeds by the Hugging Face model's own lm_head")
        tiny_model = by_vocabulary_rows(tiny_model)

    g = torch.Generator().manual_seed(3)
    resid = torch.randn(4, 9, tiny_model.cfg.d_model, generator=g) * 3
    targets = torch.randint(0, tiny_model.cfg.d_vocab, (4, 9), generator=g)
    with torch.no_grad():
        logits = unembed(tiny_model, resid)  # a new tensor: the buffer is not involved
        exact = -torch.log_softmax(logits.double(), -1).gather(-1, targets[..., None])[..., 0]
    for rows in (slice(0, 3), slice(1, 2), slice(3, 4), slice(0, 4)):
        got = next_token_nll(tiny_model, resid[rows, 2:7], targets[rows, 2:7])  # strided rows, as the sweeps pass
        assert got.shape == exact[rows, 2:7].shape
        # float32 log-softmax over 50 logits against float64: gamma(50) relative
        torch.testing.assert_close(got.double(), exact[rows, 2:7], rtol=gamma(50), atol=0)
    assert next_token_nll(tiny_model, resid[:0], targets[:0]).shape == (0, 9)  # no rows at all
    flat = next_token_nll(tiny_model, resid[0, 0], targets[0, 0])  # one row
    assert flat.shape == () and abs(float(flat) - float(exact[0, 0])) < gamma(50) * float(exact[0, 0])
    first = next_token_nll(tiny_model, resid[:2], targets[:2])
    next_token_nll(tiny_model, resid[2:], targets[2:])  # overwrites the buffer
    torch.testing.assert_close(first.double(), exact[:2], rtol=gamma(50), atol=0)  # a result never aliases it
