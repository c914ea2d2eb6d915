"""Sliding-window attention with and without the sink (StreamingLLM) on the tiny model."""

from __future__ import annotations

import math

import pytest
import torch

from sinkmech.hooks import act_name, cached_run
from sinkmech.measures.loss import resid_token_losses
from sinkmech.prompts import tokenize
from sinkmech.context.stream import StreamResult, stream_perplexity, window_mask
from helpers.tiny import TINY_BOS
from helpers.backends import needs
from sinkmech.options import QUIET


@pytest.fixture(scope="module")
def seq(tiny_model):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 50, (1, 40), generator=g)
    return tokenize(tiny_model, ids, bos="prepend", max_tokens=40, bos_token_id=TINY_BOS)


def brute_ppl(model, batch, window, keep, scored_from):
    """Reference: renormalise each layer's softmax pattern over an explicitly built
    allowed set (restricting a softmax = renormalising it), looping over (query, key)."""
    T = int(batch.lengths[0])
    allowed = torch.zeros(T, T)
    for t in range(T):
        for k in range(t + 1):
            if window is None or t - window < k or k < keep:
                allowed[t, k] = 1.0

    def renorm(pattern, hook):
        p = pattern * allowed
        return p / p.sum(-1, keepdim=True)

    L = model.cfg.n_layers
    hooks = [(act_name("pattern", l), renorm) for l in range(L)] if window is not None else []
    name = act_name("resid_post", L - 1)
    _, cache = cached_run(model, batch.tokens, [name], fwd_hooks=hooks, stop_at_layer=L)
    mask = torch.zeros(1, T, dtype=torch.bool)
    mask[0, scored_from : T - 1] = True
    total, n = resid_token_losses(model, cache[name], batch.tokens, mask)
    return math.exp(total / n)


def test_window_mask_by_hand():
    m = window_mask(5, 2, 1)
    want = torch.tensor(
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 1, 1, 0], [1, 0, 0, 1, 1]], dtype=torch.bool
    )
    assert torch.equal(m, want)


def test_stream_equals_explicit_mask(tiny_model, seq):
    res = stream_perplexity(tiny_model, seq, window=6, keep=(0, 1, 3), options=QUIET)
    assert res.scored_from == 9
    for k, p in zip(res.keep, res.ppl):
        assert math.isclose(p, brute_ppl(tiny_model, seq, 6, k, 9), rel_tol=1e-5)
    assert math.isclose(res.full_ppl, brute_ppl(tiny_model, seq, None, 0, 9), rel_tol=1e-5)
    assert res.ppl[0] != pytest.approx(res.full_ppl, rel=1e-4)  # the window does change the model
    # the W + k control: a plain window of 6 + k keys, brute force
    assert res.control_ppl[0] is None
    for k, c in zip(res.keep[1:], res.control_ppl[1:]):
        assert math.isclose(c, brute_ppl(tiny_model, seq, 6 + k, 0, 9), rel_tol=1e-5)


def test_window_covering_everything_is_full_attention(tiny_model, seq):
    T = int(seq.lengths[0])
    res = stream_perplexity(tiny_model, seq, window=T, keep=(0, 2), scored_from=5, options=QUIET)
    for p in res.ppl:
        assert math.isclose(p, res.full_ppl, rel_tol=1e-6)


def test_stream_to_dict_contract(tiny_model, seq):
    d = stream_perplexity(tiny_model, seq, window=4, keep=(0, 1), options=QUIET).to_dict()
    assert set(d) == {"model", "window", "n_tokens", "scored_from", "full_ppl", "positions", "reindex", "results"}
    assert d["positions"].startswith("original") and d["reindex"] is False
    assert [set(r) for r in d["results"]] == [{"keep", "ppl", "control_window", "control_ppl"}] * 2
    assert d["results"][1]["control_window"] == 5 and d["results"][0]["control_ppl"] is None
    assert d["n_tokens"] == 41 and d["window"] == 4


def test_stream_bad_input(tiny_model, seq, tiny_tokens):
    two = tokenize(tiny_model, tiny_tokens[:2], bos="none")
    with pytest.raises(ValueError, match="one sequence"):
        stream_perplexity(tiny_model, two, window=4)
    with pytest.raises(ValueError, match="no token left to score"):
        stream_perplexity(tiny_model, seq, window=40, keep=(1,))
    with pytest.raises(ValueError, match="no token left to score.*scored_from"):
        stream_perplexity(tiny_model, seq, window=4, scored_from=int(seq.lengths[0]) - 1)
    with pytest.raises(ValueError, match="keep"):
        stream_perplexity(tiny_model, seq, window=4, keep=(-1,))
    assert isinstance(StreamResult, type)


def streaming_llm_ppl(model, batch, window, keep, scored_from):
    """Reference: StreamingLLM itself, token by token with TransformerLens' key-value
    cache (keys cached before the rotary, re-rotated at their cache positions each
    step): before token t the cache holds the first `keep` keys and the last
    window - 1, the middle evicted, so the query sits at cache position
    len(cache)."""
    from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache

    T = int(batch.lengths[0])
    tokens = batch.tokens[:, :T]
    cache = TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, 1)
    nll, cached = [], []  # cached: the original position of each cache entry
    for t in range(T - 1):
        held = [cached.index(p) for p in cached if p < keep or p > t - window]
        cached = [cached[i] for i in held] + [t]
        for e in cache.entries:
            e.past_keys, e.past_values = e.past_keys[:, held], e.past_values[:, held]
        cache.previous_attention_mask = cache.previous_attention_mask[:, held]
        logits = model(tokens[:, t:t + 1], past_kv_cache=cache, attention_mask=torch.ones(1, 1, dtype=torch.long))
        if t >= scored_from:
            nll.append(-float(torch.log_softmax(logits[0, -1].double(), -1)[tokens[0, t + 1]]))
    return math.exp(sum(nll) / len(nll))


@pytest.mark.parametrize("keep", [1, 3])
def test_reindex_equals_streaming_llm_token_by_token(tiny_model, seq, keep):
    """One pass with --reindex equals StreamingLLM's rolling cache run token by token;
    the default (original positions) does not, and the W + k control is the same
    either way (it keeps no first keys)."""
    from sinkmech.loading.backend import CAPABILITIES

    window, scored_from = 6, 9
    if not CAPABILITIES.can_reindex_cache:  # TL 4: no HookedTransformer rotary tables to re-index with; it says so
        with pytest.raises(ValueError, match="bridge"):
            stream_perplexity(tiny_model, seq, window=window, keep=(keep,), reindex=True, options=QUIET)
        return
    re = stream_perplexity(tiny_model, seq, window=window, keep=(0, keep), scored_from=scored_from, reindex=True,
                           options=QUIET)
    orig = stream_perplexity(tiny_model, seq, window=window, keep=(0, keep), scored_from=scored_from, options=QUIET)
    want = streaming_llm_ppl(tiny_model, seq, window, keep, scored_from)
    assert math.isclose(re.ppl[1], want, rel_tol=1e-4)
    assert not math.isclose(orig.ppl[1], want, rel_tol=1e-3)  # the positions matter on this model
    assert math.isclose(re.ppl[0], orig.ppl[0], rel_tol=1e-6)  # keep 0: nothing to re-index
    assert re.control_ppl == pytest.approx(orig.control_ppl)
    assert math.isclose(streaming_llm_ppl(tiny_model, seq, window, 0, scored_from), orig.ppl[0], rel_tol=1e-4)
    d = re.to_dict()
    assert d["reindex"] is True and d["positions"].startswith("reindexed")


@needs("from_config", "can_reindex_cache", why="a HookedTransformer with learned positions")
def test_reindex_needs_rotary_positions(seq):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_heads=2, d_head=8, n_ctx=64, d_vocab=50, act_fn="gelu",
                                  positional_embedding_type="standard", device="cpu")
    with pytest.raises(ValueError, match="rotary"):
        stream_perplexity(HookedTransformer(cfg), seq, window=4, keep=(1,), reindex=True, options=QUIET)


def test_smollm2_sink_tokens_rescue_window_attention(smollm2):
    """StreamingLLM's finding (Xiao et al. 2024, Fig. 3) on the real model: dropping
    the first keys from a sliding window hurts; keeping 4 of them brings the
    perplexity back near full attention. Slow: loads SmolLM2."""
    from sinkmech.context.stream import long_tokens

    batch = long_tokens(smollm2, 160, bos="prepend")
    res = stream_perplexity(smollm2, batch, window=32, keep=(0, 4), options=QUIET)
    print(res.to_dict())
    no_sink, sink = res.ppl
    assert sink < no_sink
    assert sink < 1.5 * res.full_ppl
