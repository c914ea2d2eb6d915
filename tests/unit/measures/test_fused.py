"""The fused path against brute force: the kernel against a softmax over the
whole masked score matrix, and `sink_scores(attention="fused")` against the
pattern path on the tiny models and every architecture of the matrix
(sliding windows, soft-capped scores, learned sink logits), with query chunks
smaller than the prompts so that every chunk boundary is crossed.

Tolerances: the two orders differ only in float32 rounding. Scores are dot
products over d_head <= 8 terms, rows are sums over <= 40 keys, the means over
<= 40 queries: each term carries a relative error of a few float32 epsilons
(1.2e-7), so per-head scores in [0, 1] agree to ~1e-6; 1e-5 leaves room for
AVX2's other accumulation order (ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
ONEDNN_MAX_CPU_ISA=AVX2). Norms and summed losses are compared relative to their size.
"""

from __future__ import annotations

import pytest
import torch

import sinkmech.measures.fused as fused
from helpers.backends import loads_folder
from helpers.tiny_hf import BOS, MATRIX, save_tiny
from sinkmech.loading.backend import IS_BRIDGE
from sinkmech.measures.fused import attend, check_attention, check_right_padded, key_weight, resolve_attention
from sinkmech.measures.sinks import sink_scores
from sinkmech.options import QUIET
from sinkmech.prompts import TokenBatch

TOL = 1e-5


def brute_force(q, k, v, *, scaling, softcap=None, window=None, sinks=None):
    """The whole [query key] score matrix, masked, soft-capped, a softmax (with the
    sink column appended, then dropped): the pattern and the output, in float64."""
    q, k, v = q.double(), k.double(), v.double()
    s = (q @ k.transpose(-1, -2)) * scaling
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    t = torch.arange(q.shape[-2])
    gap = t[:, None] - t[None, :]
    seen = (gap >= 0) & ((gap < window) if window is not None else True)
    s = s.masked_fill(~seen, float("-inf"))
    if sinks is not None:
        col = sinks.double()[None, :, None, None].expand(*s.shape[:-1], 1)
        pattern = torch.softmax(torch.cat([s, col], -1), -1)[..., :-1]
    else:
        pattern = torch.softmax(s, -1)
    return pattern, pattern @ v


@pytest.mark.parametrize("softcap, window, with_sinks, chunk", [
    (None, None, False, None),  # the fused kernel
    (None, None, False, 7),
    (None, 5, False, 4),        # a sliding window, chunks of 4 against their chunk + window keys
    (2.0, None, False, 6),      # soft-capped scores (Gemma 2)
    (1.5, 3, True, 5),          # all three, and learned sink logits (gpt-oss)
    (None, None, True, None),   # the sink folded into the fused kernel's log-sum-exp
])
def test_kernel_matches_the_softmax_over_the_whole_pattern(softcap, window, with_sinks, chunk):
    g = torch.Generator().manual_seed(0)
    B, H, T, D = 2, 3, 29, 8
    q, k, v = (torch.randn(B, H, T, D, generator=g) * 2 for _ in range(3))
    sinks = torch.randn(H, generator=g) if with_sinks else None
    pattern, ref = brute_force(q, k, v, scaling=D ** -0.5, softcap=softcap, window=window, sinks=sinks)
    out, lse = attend(q, k, v, scaling=D ** -0.5, softcap=softcap, window=window, sinks=sinks, chunk=chunk)
    assert (out.double() - ref).abs().max() < TOL
    for key in (0, 4, 11):
        got = key_weight(q, k, lse, key, scaling=D ** -0.5, softcap=softcap, window=window)
        assert (got.double() - pattern[..., key]).abs().max() < TOL
    if with_sinks:  # the sink's share is what the real keys leave
        share = torch.exp(sinks[None, :, None] - lse)
        assert (share.double() - (1 - pattern.sum(-1))).abs().max() < TOL


def test_a_windowed_key_gets_no_attention_from_queries_past_the_window():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 12, 4, generator=g) for _ in range(3))
    _, lse = attend(q, k, v, scaling=0.5, window=3)
    w = key_weight(q, k, lse, 0, scaling=0.5, window=3)
    assert (w[..., :3] > 0).all() and (w[..., 3:] == 0).all()


def test_attention_modes_are_checked_and_auto_switches_at_the_threshold():
    assert resolve_attention("auto", fused.FUSED_FROM - 1) == "pattern"
    assert resolve_attention("auto", fused.FUSED_FROM) == "fused"
    assert resolve_attention("pattern", 10 ** 6) == "pattern" and resolve_attention("fused", 2) == "fused"
    with pytest.raises(ValueError, match="attention must be one of fused, pattern, auto"):
        check_attention("flash")


def test_left_padding_is_refused_and_right_padding_passes():
    check_right_padded(None)
    check_right_padded(torch.tensor([[1, 1, 1], [1, 1, 0]]))
    with pytest.raises(ValueError, match="right-padded"):
        check_right_padded(torch.tensor([[0, 1, 1]]))


def _batch(seed: int = 0, T: int = 26) -> TokenBatch:
    """Three prompts of 26, 21 and 9 positions, <bos> first, right-padded."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, 50, (3, T), generator=g)
    tokens[:, 0] = BOS
    lengths = torch.tensor([T, T - 5, 9])
    for i, n in enumerate(lengths):
        tokens[i, n:] = 0
    return TokenBatch(tokens, lengths, "prepend", BOS, None)


def assert_same(pattern, fused_, what: str) -> None:
    assert pattern.attention == "pattern" and fused_.attention == "fused"
    for name in ("scores", "bos_scores", "learned_sink_scores"):
        a, b = getattr(pattern, name), getattr(fused_, name)
        assert (a is None) == (b is None), (what, name)
        if a is not None:
            assert (a - b).abs().max() < TOL, (what, name, float((a - b).abs().max()))
    for name in ("value_norm_first", "value_norm_rest", "resid_norm_first", "resid_norm_rest", "prompt_loss"):
        a, b = getattr(pattern, name).double(), getattr(fused_, name).double()
        assert ((a - b).abs() / a.abs().clamp(min=1.0)).max() < TOL, (what, name)
    assert abs(pattern.loss - fused_.loss) < TOL


@pytest.mark.parametrize("bos_position", [None, 3])
def test_fused_sink_scores_equal_the_pattern_path_across_chunks(tiny_model, monkeypatch, bos_position):
    monkeypatch.setattr(fused, "CHUNK", 5)  # five chunks over 26 positions
    batch = _batch()
    kw = dict(loss=True, bos_position=bos_position, options=QUIET.replace(batch_size=2))
    assert_same(sink_scores(tiny_model, batch, **kw), sink_scores(tiny_model, batch, attention="fused", **kw), "tiny")


def test_the_fused_path_never_holds_the_whole_pattern(tiny_model, monkeypatch):
    """TransformerLens 3.9: hook_pattern sees chunk x keys blocks only; the
    Bridge: hook_pattern never fires (there is no pattern)."""
    monkeypatch.setattr(fused, "CHUNK", 5)
    shapes = []
    real_forward = type(tiny_model).forward

    def spy(self, *args, **kwargs):
        def watch(pattern, hook):
            shapes.append(tuple(pattern.shape[-2:]))
        with self.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", watch)]):
            return real_forward(self, *args, **kwargs)

    monkeypatch.setattr(type(tiny_model), "forward", spy)
    sink_scores(tiny_model, _batch(), attention="fused", options=QUIET)
    if IS_BRIDGE:
        assert shapes == []
    else:
        assert shapes and all(q <= 5 for q, _ in shapes) and max(k for _, k in shapes) == 26


def test_auto_takes_the_pattern_path_on_short_prompts(tiny_model):
    assert sink_scores(tiny_model, _batch(), attention="auto", options=QUIET).attention == "pattern"


@pytest.fixture(scope="module")
def matrix_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("fused-archs")
    return {arch: save_tiny(root / arch, arch, seed=5, n_kv=2) for arch in MATRIX}


@pytest.mark.parametrize("arch", [pytest.param(a, marks=loads_folder(a)) for a in MATRIX])
def test_every_architecture_scores_the_same_fused(arch, matrix_folders, monkeypatch):
    """Windows of 4 keys (mistral, gemma2, gpt_oss), soft-capped scores
    (gemma2), learned sink logits (gpt_oss), grouped-query heads (n_kv=2)."""
    from sinkmech.loading.models import load_model

    monkeypatch.setattr(fused, "CHUNK", 6)
    model = load_model(str(matrix_folders[arch]), device="cpu")
    batch = _batch(seed=2)
    kw = dict(loss=True, bos_position=2, options=QUIET)
    assert_same(sink_scores(model, batch, **kw), sink_scores(model, batch, attention="fused", **kw), arch)


@pytest.mark.parametrize("window, keep", [(4, 0), (4, 1), (6, 3)])
def test_a_stream_window_gives_the_losses_and_scores_of_the_masked_pattern(tiny_model, monkeypatch, window, keep):
    """StreamingLLM's window on the fused path against the pattern path's
    `window_hook` on every layer's scores (sinkmech.context.stream): the same
    per-prompt losses and the same attention on key 0 (none past the window
    when the first key is dropped)."""
    from sinkmech.context.stream import window_hook
    from sinkmech.hooks import act_name
    from sinkmech.measures.columns import attention_columns
    from sinkmech.measures.loss import masked_row_losses, target_mask

    monkeypatch.setattr(fused, "CHUNK", 5)
    batch = _batch(seed=3)
    mask = target_mask(batch)
    L = tiny_model.cfg.n_layers
    hooks = [(act_name("attn_scores", l), window_hook(window, keep)) for l in range(L)]
    firsts = []
    hooks += [(act_name("pattern", l), lambda p, hook: firsts.append(p[..., 0].float())) for l in range(L)]
    ref = masked_row_losses(tiny_model, batch.tokens, mask, hooks)
    cols = attention_columns(tiny_model, batch.tokens, loss_mask=mask, stream=(window, keep))
    assert ((cols.row_loss - ref).abs() / ref).max() < TOL
    for l in range(L):
        assert (cols.weights[l, :, :, 0] - firsts[l]).abs().max() < TOL
    past = cols.weights[:, :, :, 0, window:]
    assert (past == 0).all() if keep == 0 else (past > 0).all()


@pytest.mark.parametrize("stream", [None, (5, 1)])
def test_columns_read_off_the_pattern_equal_the_fused_ones(tiny_model, monkeypatch, stream):
    from sinkmech.measures.columns import attention_columns
    from sinkmech.measures.loss import target_mask

    monkeypatch.setattr(fused, "CHUNK", 4)
    batch = _batch(seed=4)
    kw = dict(keys=(0, 2), loss_mask=target_mask(batch), stream=stream)
    p = attention_columns(tiny_model, batch.tokens, attention="pattern", **kw)
    f = attention_columns(tiny_model, batch.tokens, attention="fused", **kw)
    real = batch.mask  # padding positions are not compared
    assert (p.weights - f.weights).abs()[..., real[None, :, None, None, :].expand_as(p.weights)].max() < TOL
    assert torch.equal(p.token_loss.isnan(), f.token_loss.isnan())
    assert ((p.row_loss - f.row_loss).abs() / p.row_loss).max() < TOL


def _stand_in_reference(model, batch, window: int, logits, values):
    """Brute force for a stand-in sink: every layer's scores masked by the stream
    window (first key dropped); in the rows that no longer see key 0 a column of
    logit b is appended and the softmax taken over it (then dropped); m u added
    to the head's output. Returns the per-prompt summed losses and each layer's
    attention on key 0 and sink mass [batch head query]."""
    from sinkmech.context.stream import window_hook
    from sinkmech.hooks import act_name
    from sinkmech.measures.loss import masked_row_losses, target_mask

    L, T = model.cfg.n_layers, batch.tokens.shape[1]
    dropped = torch.arange(T) >= window  # no sliding window of its own: key 0 leaves the rows past W
    held, first, mass = {}, {}, {}

    def scores(s, hook):
        s = window_hook(window, 0)(s, hook)
        b = logits[hook.layer()].double()[None, :, None, None].expand(*s.shape[:-1], 1)
        b = torch.where(dropped[None, None, :, None], b, torch.tensor(float("-inf"), dtype=torch.float64))
        p = torch.softmax(torch.cat([s.double(), b], -1), -1)
        held[hook.layer()] = p
        return s

    def pattern(p, hook):
        full = held[hook.layer()]
        first[hook.layer()], mass[hook.layer()] = full[..., 0].float(), full[..., -1].float()
        return full[..., :-1].to(p.dtype)

    def z(z, hook):
        m = mass[hook.layer()]
        return z + torch.einsum("bhq,hd->bqhd", m.to(z.dtype), values[hook.layer()].to(z.dtype))

    hooks = [(act_name(n, l), f) for l in range(L) for n, f in (("attn_scores", scores), ("pattern", pattern),
                                                                  ("z", z))]
    loss = masked_row_losses(model, batch.tokens, target_mask(batch), hooks)
    return loss, first, mass


@pytest.mark.parametrize("attention", ["fused", "pattern"])
def test_a_stand_in_sink_equals_a_softmax_with_its_column_where_the_stream_drops_key_0(tiny_model, monkeypatch,
                                                                                        attention):
    """Learned sink logits (and values) in key 0's place where StreamingLLM's
    window drops it: the same losses, key-0 attention and sink mass as the
    brute-force softmax with the sink's column appended in those rows; nothing
    changes in the rows that still see key 0; logits of -inf are the plain
    stream; bad use refused."""
    from sinkmech.measures.columns import attention_columns
    from sinkmech.measures.fused import StandIn
    from sinkmech.measures.loss import target_mask

    monkeypatch.setattr(fused, "CHUNK", 5)
    W, batch = 6, _batch(seed=5)
    L, H, d = tiny_model.cfg.n_layers, tiny_model.cfg.n_heads, tiny_model.cfg.d_head
    g = torch.Generator().manual_seed(0)
    logits, values = torch.randn(L, H, generator=g) + 1.0, torch.randn(L, H, d, generator=g)
    mask = target_mask(batch)
    cols = attention_columns(tiny_model, batch.tokens, loss_mask=mask, stream=(W, 0), attention=attention,
                             stand_in=StandIn(logits, values))
    ref_loss, first, mass = _stand_in_reference(tiny_model, batch, W, logits, values)
    assert ((cols.row_loss - ref_loss).abs() / ref_loss).max() < TOL
    real = batch.mask[:, None, :]
    for l in range(L):
        assert (torch.where(real, cols.weights[l, :, :, 0] - first[l], 0.0)).abs().max() < TOL
        assert (torch.where(real, cols.sink[l] - mass[l], 0.0)).abs().max() < TOL
    # no sink where key 0 is still seen (1 - a row's sum: float32 rounding), some in every row past the window
    assert cols.sink[..., :W].abs().max() < TOL and (cols.sink[:, :, :, W:][real[..., W:].expand(L, -1, H, -1)] > TOL).all()
    plain = attention_columns(tiny_model, batch.tokens, loss_mask=mask, stream=(W, 0), attention=attention)
    none = attention_columns(tiny_model, batch.tokens, loss_mask=mask, stream=(W, 0), attention=attention,
                             stand_in=StandIn(torch.full((L, H), float("-inf")), values))
    assert ((none.row_loss - plain.row_loss).abs() / plain.row_loss).max() < TOL
    assert not torch.allclose(cols.row_loss, plain.row_loss)
    for stream in (None, (W, 1)):
        with pytest.raises(ValueError, match="keeps no first key"):
            attention_columns(tiny_model, batch.tokens, stream=stream, stand_in=StandIn(logits))
    with pytest.raises(ValueError, match="do not fit this model"):
        attention_columns(tiny_model, batch.tokens, stream=(W, 0), stand_in=StandIn(logits[:1]))


@pytest.mark.parametrize("arch", [pytest.param(a, marks=loads_folder(a)) for a in ("gemma2",)])
def test_a_stand_in_sink_leaves_the_layers_whose_own_window_already_drops_key_0(arch, matrix_folders, monkeypatch):
    """On a model with sliding-window layers (window 4 < the stream's 6), the
    stand-in acts only where the stream, not the model's own window, drops key
    0: no sink mass in the sliding layers, some in the global ones; the fused
    and pattern paths agree."""
    from sinkmech.loading.attention import layer_windows
    from sinkmech.loading.models import load_model
    from sinkmech.measures.columns import attention_columns
    from sinkmech.measures.fused import StandIn
    from sinkmech.measures.loss import target_mask

    monkeypatch.setattr(fused, "CHUNK", 5)
    model = load_model(str(matrix_folders[arch]), device="cpu")
    L, H = model.cfg.n_layers, model.cfg.n_heads
    windows = layer_windows(model)
    assert any(w is not None for w in windows) and any(w is None for w in windows), windows
    batch = _batch(seed=6)
    kw = dict(loss_mask=target_mask(batch), stream=(6, 0), stand_in=StandIn(torch.zeros(L, H)))
    p = attention_columns(model, batch.tokens, attention="pattern", **kw)
    f = attention_columns(model, batch.tokens, attention="fused", **kw)
    assert ((p.row_loss - f.row_loss).abs() / p.row_loss).max() < TOL
    real = batch.mask[:, None, :]
    for l, w in enumerate(windows):
        assert torch.where(real, p.sink[l] - f.sink[l], 0.0).abs().max() < TOL
        if w is not None:
            assert f.sink[l].abs().max() < TOL
        else:
            assert f.sink[l, 0, :, 6:].min() > 0.01


@pytest.mark.parametrize("attention", ["fused", "pattern"])
def test_a_stand_in_sink_in_every_row_is_the_phantom_sink_of_the_logits_form(tiny_model, monkeypatch, attention):
    """`where="every"` on the run without `<bos>`: the same per-prompt losses and
    sink mass as `sink_scores(sink=PhantomSink("logits", ...))`, whose hooks
    rescale each pattern row and add m u to the head's output."""
    from sinkmech.interventions.phantom import PhantomSink
    from sinkmech.measures.columns import attention_columns
    from sinkmech.measures.fused import StandIn
    from sinkmech.measures.loss import target_mask

    monkeypatch.setattr(fused, "CHUNK", 5)
    b = _batch(seed=7)
    batch = TokenBatch(b.tokens[:, 1:], b.lengths - 1, "none", BOS, None)  # the same content, no <bos>
    L, H, d = tiny_model.cfg.n_layers, tiny_model.cfg.n_heads, tiny_model.cfg.d_head
    g = torch.Generator().manual_seed(1)
    logits, values = torch.randn(L, H, generator=g), torch.randn(L, H, d, generator=g)
    ref = sink_scores(tiny_model, batch, loss=True, sink=PhantomSink("logits", values, "dump", logits), options=QUIET)
    cols = attention_columns(tiny_model, batch.tokens, loss_mask=target_mask(batch), attention=attention,
                             stand_in=StandIn(logits, values, where="every"))
    assert ((cols.row_loss - ref.prompt_loss).abs() / ref.prompt_loss).max() < TOL
    stats = cols.first_key_stats(batch.lengths)
    assert (stats["learned_sink_scores"] - ref.phantom_mass).abs().max() < TOL
    with pytest.raises((ValueError, TypeError), match="where"):  # the suite's type checker sees it first
        StandIn(logits, where="somewhere")


@pytest.mark.slow
def test_gemmas_learned_sinks_stand_in_the_same_on_the_fused_and_pattern_paths(gemma):
    """Gemma 3 270M with its fitted sink logits and values (figures/fit_sinks):
    in the rows a 64-key window drops key 0 from, and in every row of the run
    without `<bos>`, the chunked fused pass equals the pattern path to float32
    rounding, and the every-row form equals `sink_scores`' phantom hooks."""
    from pathlib import Path

    from sinkmech.corpora import default_corpus
    from sinkmech.interventions.phantom import PhantomSink
    from sinkmech.interventions.sink_file import read_sink_file
    from sinkmech.measures.columns import attention_columns
    from sinkmech.measures.fused import StandIn
    from sinkmech.measures.loss import target_mask
    from sinkmech.prompts import tokenize

    f = read_sink_file(Path(__file__).parents[3] / "figures/fit_sinks/gemma3-270m_head_value.json")
    text = [" ".join(default_corpus()[100:104])]
    for stream, bos, sink in (((64, 0), "prepend", StandIn(torch.tensor(f.logits), torch.tensor(f.values))),
                              (None, "none", StandIn(torch.tensor(f.logits), torch.tensor(f.values), where="every"))):
        batch = tokenize(gemma, text, bos=bos, max_tokens=200)
        kw = dict(loss_mask=target_mask(batch), stream=stream, stand_in=sink)
        p = attention_columns(gemma, batch.tokens, attention="pattern", **kw)
        q = attention_columns(gemma, batch.tokens, attention="fused", chunk=48, **kw)
        assert float((p.row_loss - q.row_loss).abs().max() / p.row_loss.abs().max()) < TOL
        assert (p.sink - q.sink).abs().max() < TOL and p.sink.mean() > 0.05
    ref = sink_scores(gemma, batch, loss=True, sink=PhantomSink("logits", sink.values, "dump", sink.logits), options=QUIET)
    assert float((ref.prompt_loss - p.row_loss).abs().max() / ref.prompt_loss.abs().max()) < TOL
