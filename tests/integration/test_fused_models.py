"""The fused path on the two offline models, against the pattern path, past
Gemma 3's 512-key sliding window: 640 content tokens of long natural text, the
fused path in query chunks of 256 (three chunks; on the Bridge the sliding
layers' chunks and the global layers' fused kernel), with a moved `<bos>` and
the loss, on one prompt. Tolerance as in tests/unit/measures/test_fused.py: float32 rounding
of scores summed over d_head <= 256 terms and rows over <= 641 keys, ~1e-6 on
a score in [0, 1]; 1e-5 per head."""

from __future__ import annotations

import pytest

import sinkmech.measures.fused as fused
from sinkmech.context.long_text import long_prompts_for
from sinkmech.measures.sinks import sink_scores
from sinkmech.options import QUIET
from sinkmech.prompts import tokenize

TOL = 1e-5


@pytest.mark.parametrize("name", ["smollm2", "gemma"])
def test_fused_scores_equal_the_pattern_path_on_the_offline_models(name, request, monkeypatch):
    model = request.getfixturevalue(name)
    monkeypatch.setattr(fused, "CHUNK", 256)
    texts = [t.text for t in long_prompts_for(1, 640)]  # one prompt: the window and the chunks are per prompt
    batch = tokenize(model, texts, bos="prepend", max_tokens=640)
    kw = dict(loss=True, bos_position=5, options=QUIET.replace(batch_size=1))
    p = sink_scores(model, batch, attention="pattern", **kw)
    f = sink_scores(model, batch, attention="fused", **kw)
    assert (p.scores - f.scores).abs().max() < TOL
    assert (p.bos_scores - f.bos_scores).abs().max() < TOL
    assert ((p.prompt_loss - f.prompt_loss).abs() / p.prompt_loss).max() < TOL
    for k in ("value_norm_first", "value_norm_rest", "resid_norm_first", "resid_norm_rest"):
        a, b = getattr(p, k), getattr(f, k)
        assert ((a - b).abs() / a.abs().clamp(min=1.0)).max() < TOL, k
    assert p.sink_rate(0.3) == f.sink_rate(0.3)
