"""The report sections on the sink's mechanisms (beyond.py, after the interventions), on the tiny model: their numbers
equal direct calls of the analyses, their figures are drawn, their settings
are small and capped by the model's context."""

from __future__ import annotations

import json

import pytest
import torch

from helpers.tiny import TINY_RUN, TINY_BOS
from sinkmech import report
from sinkmech.plots import mechanisms
from sinkmech.context.length import LengthSweep, long_prompts, sinks_vs_length
from sinkmech.measures.key_sinks import key_sink_scores
from sinkmech.measures.massive import massive_dims
from sinkmech.prompts import tokenize
from sinkmech.report.context import SETTINGS
from sinkmech.report.sections import SECTIONS
from sinkmech.report.beyond import (
    STREAM_KEEP, key_sinks_section, length_section, massive_section, stream_section, value_weighted_section,
)
from sinkmech.context.stream import long_tokens, stream_perplexity
from sinkmech.measures.value_weighted import value_weighted_first
from sinkmech.options import QUIET

BEYOND = [key_sinks_section, massive_section, value_weighted_section, stream_section, length_section]
KW = dict(options=TINY_RUN)


@pytest.fixture(scope="module")
def prompts():
    return torch.randint(2, 50, (10, 20), generator=torch.Generator().manual_seed(5))


@pytest.fixture(scope="module")
def built(tiny_model, prompts, tmp_path_factory):
    out = tmp_path_factory.mktemp("beyond")
    return report.build_report(tiny_model, out, sections=BEYOND, prompts=prompts, n_prompts=10, max_tokens=20,
                               beyond_prompts=6, length_prompts=3, length_tokens=16, stream_window=12, **KW)


def test_beyond_sections_close_the_default_report():
    assert SECTIONS[-5:] == BEYOND
    for name, small in (("beyond_prompts", 16), ("stream_tokens", 256), ("stream_window", 32),
                        ("length_prompts", 4), ("length_tokens", 256), ("length_steps", 3)):
        assert name in SETTINGS and getattr(report.ReportContext, name) == small


@pytest.mark.slow
def test_sections_match_direct_calls(built, tiny_model, prompts):
    s = json.loads(built.summary_json.read_text())["sections"]
    assert list(s) == ["key_sinks", "massive", "value_weighted", "streaming", "length"]
    batch = {c: tokenize(tiny_model, prompts[:6], bos=c, max_tokens=20,
                         bos_token_id=TINY_BOS) for c in ("prepend", "none")}
    for c in ("prepend", "none"):
        direct = key_sink_scores(tiny_model, batch[c], options=QUIET)
        assert s["key_sinks"][c]["strongest_position"] == direct.strongest_position.tolist()
        assert {f["head"] for f in s["key_sinks"][c]["flagged"]} == {f"L{l}.H{h}" for l, h, _ in direct.flagged_heads()}
        assert s["key_sinks"][c]["off_first_rate"] == pytest.approx(float(direct.off_first_rate.mean()))
        assert [(f["head"], f["position"]) for f in s["key_sinks"][c]["relative_flagged"]] == [
            (f"L{l}.H{h}", pos) for l, h, pos in direct.relative_flagged_heads()]
        assert s["key_sinks"][c]["n_relative_flagged"] == len(direct.relative_flagged_heads())
    md = massive_dims(tiny_model, batch["prepend"], options=QUIET)
    assert s["massive"]["norm_ratio"] == pytest.approx(md.norm_ratio.tolist())
    assert s["massive"]["onset_layer"] == md.onset_layer and ("reset" in s["massive"]) == (md.onset_layer is not None)
    vw = value_weighted_first(tiny_model, batch["prepend"], options=QUIET)
    assert s["value_weighted"]["output_first_per_layer"] == pytest.approx(vw.mean_output_first().mean(-1).tolist())
    # streaming: one long text cut to the context (64 positions = <bos> + 63): the Python docs through the
    # tokenizer (the Bridge's tiny model has one), else the prompts laid end to end (the HookedTransformer's)
    if tiny_model.tokenizer is not None:
        seq = long_tokens(tiny_model, 63, bos="prepend", bos_token_id=TINY_BOS)
    else:
        seq = tokenize(tiny_model, [prompts.flatten().tolist()], bos="prepend", max_tokens=63, bos_token_id=TINY_BOS)
    st = stream_perplexity(tiny_model, seq, window=12, keep=STREAM_KEEP, options=QUIET)
    assert (s["streaming"]["n_tokens"], s["streaming"]["window"]) == (64, 12)
    assert s["streaming"]["full_ppl"] == pytest.approx(st.full_ppl)
    assert [r["ppl"] for r in s["streaming"]["results"]] == pytest.approx(list(st.ppl))
    # eval length: 16 halved twice, on corpus windows through the tokenizer when the model has one (the Bridge's)
    if tiny_model.tokenizer is not None:
        texts = long_prompts(tiny_model, 3, 16, bos="prepend", bos_token_id=TINY_BOS)
    else:
        texts = tokenize(tiny_model, prompts[:3], bos="prepend", max_tokens=16, bos_token_id=TINY_BOS)
    sweep = sinks_vs_length(tiny_model, texts, lengths=[4, 8, 16], options=QUIET)
    assert [r["length"] for r in s["length"]["results"]] == [4, 8, 16]
    assert [r["mean_score"] for r in s["length"]["results"]] == pytest.approx(sweep.mean_score.tolist())
    assert s["length"]["results"][2]["top_heads"][0]["mask_first_cost"] == pytest.approx(
        float(sweep.mask_first_cost[2, 0]), abs=1e-7)


@pytest.mark.slow
def test_pages_and_figures(built):
    page = built.index.read_text()
    for text in ("alpha_k", "norm ratio", "Kobayashi", "last 12 keys", "cut to 4, 8, 16 content tokens"):
        assert text in page, text
    names = sorted(f.name for f in built.figures)
    assert names == sorted(f"{n}.{x}" for n in ("strongest_key", "massive_dims", "value_weighted", "stream",
                                                "sinks_vs_length") for x in ("png", "svg"))
    for f in built.figures:
        assert f.stat().st_size > 1000, f


@pytest.mark.slow
def test_massive_section_resets_from_the_onset(tiny_model, prompts, tmp_path, monkeypatch):
    # A low threshold gives the tiny model an onset, so the reset runs and is reported.
    import sinkmech.report.beyond as sb

    monkeypatch.setattr(sb, "massive_dims", lambda *a, **k: massive_dims(*a, **{**k, "threshold": 1.01, "sun_min_abs": 0.0,
                                                                                 "sun_min_ratio": 0.0}))
    rep = report.build_report(tiny_model, tmp_path / "r", sections=[massive_section], prompts=prompts, n_prompts=4,
                              max_tokens=12, **KW)
    m = rep.summary["sections"]["massive"]
    assert m["onset_layer"] is not None and m["reset"]["from_layer"] == m["onset_layer"]
    assert m["reset"]["dims"] == m["massive_dims"] and m["reset"]["n_prompts"] == 2
    assert set(m["resets"]) == {"others_mean", "sun_mean"}
    assert "On the first 2 prompts" in rep.index.read_text()


def test_figures_refuse_empty_results(tmp_path):
    with pytest.raises(ValueError, match="no key-sink results"):
        mechanisms.strongest_key_heatmap({}, tmp_path / "a.png")
    empty = LengthSweep(
        lengths=(), eps=(0.3,), sink_rate=torch.zeros(0, 1), mean_score=torch.zeros(0), uniform_score=torch.zeros(0),
        top_layer=torch.zeros(0, 1, dtype=torch.long), top_head=torch.zeros(0, 1, dtype=torch.long),
        top_score=torch.zeros(0, 1), mask_first_cost=torch.zeros(0, 1), skipped=((64, "too long"),), bos="prepend",
        n_prompts=1)
    with pytest.raises(ValueError, match="every length was skipped"):
        mechanisms.length_lines(empty, tmp_path / "b.png")


def test_the_report_on_the_default_windows_resamples_their_documents(monkeypatch, tmp_path):
    """Without prompts the report scores n_prompts windows spread over the default corpus;
    its sink intervals resample the documents those windows were cut from."""
    from helpers.tiny import serve_tiny

    from sinkmech.corpora import corpus
    from sinkmech.report.context import ReportContext

    model = serve_tiny(monkeypatch, 3)
    ctx = ReportContext(model=model, out=tmp_path, n_prompts=12, max_tokens=8, options=QUIET)
    windows = corpus(n_prompts=12)
    assert ctx.prompt_list() == list(windows.prompts)
    sinks = ctx.sinks()
    assert all(s.documents == windows.documents for s in sinks.values())
    assert sinks["prepend"].interval()["n_units"] == windows.n_documents < 12
