"""The report: right numbers, offline in a real browser, inert token strings."""

from __future__ import annotations

import html
import json
import shutil

import numpy as np
import pytest
import torch
from circuitsvis.tokens import colored_tokens

from helpers.browser import Dom, dump_dom, screenshot
from helpers.tiny import TINY_RUN, TINY_BOS
from sinkmech import cli, render, report
from sinkmech.plots import core as figures
from sinkmech.measures.attention import head_attention
from sinkmech.interventions.ablation import head_ablations
from sinkmech.dormant.scan import scan_heads
from sinkmech.dormant.noop import noop_check
from sinkmech.interventions.patching import bos_pair, patch_resid_pre
from sinkmech.interventions.perturb import TokenSwap, perturbation_spread
from sinkmech.measures.sinks import sink_scores
from helpers.markup import PLANTED, planted_str
from helpers.tolerance import SAME_TERMS, TINY_FORWARD, assert_normwise
from sinkmech.options import QUIET, RunOptions

TITLE = "sinkmech report: tiny"


@pytest.fixture(scope="module")
def prompts():
    """12 prompts of 16 ids; every planted token appears in the first prompts."""
    g = torch.Generator().manual_seed(1)
    toks = torch.randint(10, 50, (12, 16), generator=g)
    toks[:3, 2:7] = torch.tensor(list(PLANTED))
    return toks


@pytest.fixture(scope="module")
def built(tiny_model, prompts, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    rep = report.build_report(
        tiny_model, out, model_label="tiny", prompts=prompts, n_prompts=12, max_tokens=16,
        token_str=planted_str, n_heads=2, view_tokens=12, view_prompts=2, noop_prompts=8,  # the no-op check asked for
        options=TINY_RUN,
    )
    return rep


@pytest.fixture(scope="module")
def copied(built, tmp_path_factory):
    """The report folder copied somewhere else: it must work from there."""
    dest = tmp_path_factory.mktemp("elsewhere") / "copy"
    shutil.copytree(built.index.parent, dest)
    return dest


@pytest.mark.slow
def test_summary_matches_the_analysis(built, tiny_model, prompts):
    s = json.loads(built.summary_json.read_text())
    assert s == json.loads(json.dumps(built.summary))
    direct = sink_scores(tiny_model, prompts, bos="prepend", max_tokens=16, options=TINY_RUN)
    sinks = s["sections"]["sinks"]
    assert sinks["sink_rate"]["prepend"]["0.3"] == pytest.approx(direct.sink_rate(0.3))
    rate, lo, hi = sinks["sink_rate_ci"]["prepend"]["0.3"]
    assert rate == pytest.approx(direct.sink_rate(0.3)) and lo <= rate <= hi
    # without minus with, paired by prompt: the mean of the per-prompt differences is the difference of rates
    assert sinks["contrasts"]["sink_rate_gap"]["0.3"][0] == pytest.approx(
        sinks["sink_rate"]["none"]["0.3"] - sinks["sink_rate"]["prepend"]["0.3"], abs=1e-4)
    assert "loss_gap" not in sinks["contrasts"]  # the report's own sink passes score no loss
    mean = direct.mean_scores()
    top = s["sections"]["head_views"]["top sink heads"]
    least = s["sections"]["head_views"]["least sink-like heads"]
    # the report's passes (its batch size) against one pass: the forward bound on probabilities
    assert max(v["prepend"] for v in top.values()) == pytest.approx(float(mean.max()), abs=TINY_FORWARD)
    assert min(v["prepend"] for v in least.values()) == pytest.approx(float(mean.min()), abs=TINY_FORWARD)
    assert min(v["prepend"] for v in top.values()) >= max(v["prepend"] for v in least.values())
    assert set(s["timing_s"]) == {"sinks", "norms", "head_views", "perturbation", "dormant", "ablation",
                                  "key_sinks", "massive", "value_weighted", "streaming", "length"}
    for f in built.figures:
        assert f.exists() and f.stat().st_size > 1000, f


@pytest.mark.slow
def test_intervention_sections_match_direct_calls(built, tiny_model, prompts):
    s = built.summary["sections"]
    kw = dict(max_tokens=16, options=TINY_RUN)
    # perturbation: prompt 0 with the report's own swap, run alone
    p = s["perturbation"]
    assert p["n_prompts"] == 8 and p["position"] == 4
    (old, new), pos = p["swap_ids"][0], p["position"]
    assert old == int(prompts[0, pos]) != new
    direct = perturbation_spread(tiny_model, prompts[:1], perturbation=TokenSwap([old], [new], position=pos), **kw)
    later = direct.later()[0]
    for i, c in enumerate(("prepend", "none")):
        # a batch of 8 against prompt 0 alone: the forward bound
        assert p["last_layer_change_per_prompt"][c][0] == pytest.approx(float(direct.change[i, 0, -1][later].mean()),
                                                                         rel=TINY_FORWARD)
    assert p["swaps"][0][0] == PLANTED[int(prompts[0, pos])]
    # dormant heads: the same scan, and the no-op check of the first candidate
    d = s["dormant"]
    scan = scan_heads(tiny_model, prompts[:6], **kw)  # 12 prompts: the last 6 are held out for the no-op check
    assert d["n_queries"] == scan.n_queries and d["mode_counts"]["active"] == sum(r.count("active") for r in scan.modes)
    first = next(iter(d["candidates"].values()))
    assert (first["layer"], first["head"]) == (scan.if_else_heads() or scan.ranked())[0]
    assert first["dormant_fraction"] == pytest.approx(float(scan.dormant_fraction[first["layer"], first["head"]]))
    check = noop_check(tiny_model, prompts[6:12], [(first["layer"], first["head"])], **kw)  # held out from the scan
    got = d["noop"]["heads"][f"L{first['layer']}.H{first['head']}"]
    # the same passes (the same held-out prompts and batch): the float64 sums in the same order
    assert got["delta_loss_dormant"] == pytest.approx(check.results[0].delta_loss_dormant, rel=SAME_TERMS, abs=1e-12)
    assert got["n_active"] == check.results[0].n_active
    # ablation and the resid_pre restoration curve
    a = s["ablation"]
    abl = head_ablations(tiny_model, prompts[:4], mode="mask_first", **kw)
    assert_normwise(a["effects"], abl.effects.numpy(), TINY_FORWARD, "effects")  # passes batched otherwise
    assert a["top_heads"][0][0] == "L{}.H{}".format(*abl.top_heads(1)[0][:2])
    pr = patch_resid_pre(tiny_model, bos_pair(tiny_model, prompts[:4], max_tokens=16, bos_token_id=TINY_BOS),
                         per_position=False, options=QUIET, positions=range(1, 16))
    assert_normwise(a["patch_resid_pre"]["values"], pr.values.numpy(), TINY_FORWARD, "patch_resid_pre")
    # rotary model: the content tokens' embeddings are the same in both runs, so
    # patching resid_pre of layer 0 changes nothing
    assert a["patch_resid_pre"]["values"][0] == pytest.approx(a["patch_resid_pre"]["baseline"], rel=TINY_FORWARD)
    # every section says what it measured, and token strings reach the page escaped
    page = built.index.read_text()
    assert "8 prompts of up to 16 content tokens" in page and "4 prompts x 16 tokens" in page
    assert html.escape(repr(PLANTED[7])) in page and repr(PLANTED[7]) not in page


@pytest.mark.slow
def test_page_renders_offline_from_a_copied_folder(built, copied):
    dom = Dom(dump_dom(copied / "index.html"))
    # No planted token ran: a script or an onerror handler would have changed the title.
    assert dom.title == TITLE
    # Every circuitsvis mount point was filled by React, not just given a script tag.
    n_views = len([v for v in dom.views if v["element"]])
    assert n_views >= 6
    for v in dom.views:
        assert v["tags"], f"circuitsvis view {v['id']} ({v['element']}) did not render"
        if v["element"] == "AttentionHeads":
            assert "canvas" in v["tags"] and "Zoomed" in v["text"]
        if v["element"] == "ColoredTokens":
            assert "span" in v["tags"]
        assert "img" not in v["tags"] and "script" not in v["tags"]
    # The planted strings show as text, exactly as the tokenizer would decode them.
    text = "".join(v["text"] for v in dom.views if v["element"] == "ColoredTokens")
    for token in PLANTED.values():
        assert token in text
    # Every figure loaded (the page marks each <img> once it has loaded or failed).
    pngs = [f for f in built.figures if f.suffix == ".png"]
    assert len(dom.images) == len(pngs) >= 12
    assert all(img.get("data-loaded") == "yes" for img in dom.images), dom.images


@pytest.mark.slow
def test_a_missing_figure_file_is_caught(built, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(built.index.parent, copy)
    (copy / "figures" / "sink_heatmap.png").unlink()
    dom = Dom(dump_dom(copy / "index.html"))
    assert sorted(img.get("data-loaded") for img in dom.images).count("no") == 1


@pytest.mark.slow
def test_screenshot_is_not_blank(built, tmp_path):
    img = screenshot(built.index, tmp_path / "shot.png")
    rgb = img[..., :3]
    assert rgb.shape[0] >= 2000 and rgb.shape[1] >= 1200
    assert rgb.std() > 0.1
    assert (rgb.min(axis=-1) < 0.8).mean() > 0.05  # enough non-white: figures and views drew


@pytest.mark.slow
def test_checks_would_catch_raw_circuitsvis_output(tmp_path):
    # Control: circuitsvis' own local_src with a planted token runs the script,
    # and its CDN form renders nothing with the network off. The checks above
    # can therefore fail.
    planted = colored_tokens(["ok", PLANTED[5]], [0.1, 0.9])
    page = tmp_path / "raw.html"
    page.write_text(
        "<!DOCTYPE html><html><head><title>raw</title></head><body>"
        + planted.local_src + '<div class="sinkmech-cv" id="cdn" data-element="cdn">' + str(planted) + "</div></body></html>"
    )
    dom = Dom(dump_dom(page))
    assert dom.title == "PWNED-script"
    cdn = next(v for v in dom.views if v["id"] == "cdn")
    assert "span" not in cdn["tags"]


def test_custom_sections_join_the_page(tiny_model, prompts, tmp_path):
    def extra(ctx: report.ReportContext) -> report.Section:
        att = head_attention(ctx.model, ctx.prompt_list()[0], ["1.3"], max_tokens=8,
                             options=RunOptions(bos_token_id=TINY_BOS))
        figs = ctx.figure("extra", lambda p: figures.layer_lines({"a": [1.0, 2.0]}, p, title="t", ylabel="y"))
        body = "<p>extra body</p>" + report.figure_html(figs, "a line")
        return report.Section("extra", "Extra", body, tuple(figs), {"answer": 42},
                              (render.first_token_view(att),))

    rep = report.build_report(tiny_model, tmp_path, sections=[extra], prompts=prompts, n_prompts=2,
                              options=TINY_RUN)
    page = rep.index.read_text()
    assert rep.summary["sections"] == {"extra": {"answer": 42}}
    assert "extra body" in page and 'src="figures/extra.png"' in page
    assert page.count("var CircuitsVis=") == 1 and page.count('class="sinkmech-cv"') == 2


def test_bad_settings_and_folders_are_clear_errors(tiny_model, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(OSError, match="cannot create the report folder"):
        report.build_report(tiny_model, blocker / "out", options=RunOptions(bos_token_id=TINY_BOS))
    with pytest.raises(ValueError, match="unknown report settings"):
        report.build_report(tiny_model, tmp_path / "r", n_prompt=3)
    with pytest.raises(ValueError, match="unknown report settings"):  # the report's own memo is not a setting
        report.build_report(tiny_model, tmp_path / "r", cache={"sinks": {}})
    # The CLI says so before loading any model (a runtime error: exit 1).
    assert cli.main(["report", "--model", "smollm2", "--out", str(blocker / "out")]) == 1
    assert "cannot create the report folder" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.long
def test_smollm2_report_end_to_end(smollm2, tmp_path, monkeypatch):
    import sinkmech.loading.models

    monkeypatch.setattr(sinkmech.loading.models, "load_model", lambda spec, **kw: smollm2)  # loaded once per test run
    out = tmp_path / "rep"
    args = ["report", "--model", "smollm2", "--out", str(out), "--n-prompts", "8", "--max-tokens", "8",
            "--heads", "2", "--view-tokens", "10", "--view-prompts", "1", "--beyond-prompts", "2",
            "--stream-tokens", "48", "--stream-window", "16", "--length-prompts", "2", "--length-tokens", "32", "--length-steps", "1",
            "--noop-prompts", "8", "--noop-max-heads", "1"]
    assert cli.main(args) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["model"] == "smollm2" and s["n_layers"] == 30 and s["settings"]["n_prompts"] == 8
    rates = s["sections"]["sinks"]["sink_rate"]
    assert 0 < rates["prepend"]["0.3"] <= 100 and 0 <= rates["prepend"]["0.8"] <= rates["prepend"]["0.3"]
    # The intervention sections respect the reduced settings.
    sec = s["sections"]
    assert set(s["timing_s"]) == {"sinks", "norms", "head_views", "perturbation", "dormant", "ablation",
                                  "key_sinks", "massive", "value_weighted", "streaming", "length"}
    assert (sec["perturbation"]["n_prompts"], sec["perturbation"]["max_tokens"]) == (8, 8)
    # 8 prompts: the scan sees 4, the no-op check runs on the other 4 (held out from the scan).
    assert sec["dormant"]["n_prompts"] == 4 and sum(sec["dormant"]["mode_counts"].values()) == 270
    noop = sec["dormant"]["noop"]
    assert noop["n_prompts"] == 4 and set(noop["prompt_indices"]).isdisjoint(range(4))
    assert len(noop["heads"]) == 1 and list(noop["heads"]) == noop["heads_covered"][:1]  # --noop-max-heads 1
    assert s["settings"]["noop_max_heads"] == 1
    assert (sec["ablation"]["n_prompts"], sec["ablation"]["max_tokens"]) == (4, 8)
    assert np.asarray(sec["ablation"]["effects"]).shape == (30, 9) and min(map(min, sec["ablation"]["effects"])) >= -1e-6
    # The real <bos> string "<|im_start|>" reaches the page as text.
    dom = Dom(dump_dom(out / "index.html"))
    assert dom.title == "sinkmech report: smollm2"
    assert all(v["tags"] for v in dom.views)
    assert "<|im_start|>" in "".join(v["text"] for v in dom.views)
    assert all(img.get("data-loaded") == "yes" for img in dom.images)


def test_a_capped_no_op_check_says_on_the_page_what_it_left_out(tiny_model, prompts, tmp_path):
    """--noop-max-heads 1: the check runs on the first head it covers, and the page and
    summary say how many it covers; without --noop-prompts there is no check and the
    page says how to ask for one."""
    from sinkmech.report.sections import dormant_section

    kw = dict(sections=[dormant_section], prompts=prompts, n_prompts=12, max_tokens=16, n_heads=2, options=TINY_RUN)
    capped = report.build_report(tiny_model, tmp_path / "capped", noop_prompts=4, noop_max_heads=1, **kw)
    noop = capped.summary["sections"]["dormant"]["noop"]
    assert list(noop["heads"]) == noop["heads_covered"][:1] and len(noop["heads_covered"]) >= 2
    assert capped.summary["settings"]["noop_max_heads"] == 1
    page = capped.index.read_text()
    assert f"for the first 1 of the {len(noop['heads_covered'])} heads it covers" in page
    off = report.build_report(tiny_model, tmp_path / "off", **kw)
    assert off.summary["sections"]["dormant"]["noop"] is None
    assert "<code>--noop-prompts 8</code> adds a first look" in off.index.read_text()
    with pytest.raises(ValueError, match="noop_max_heads"):
        report.build_report(tiny_model, tmp_path / "bad", noop_max_heads=0, **kw)


@pytest.mark.slow
def test_the_scan_and_the_sections_beyond_the_paper_ride_the_sink_pass_with_the_same_numbers(
        tiny_model, prompts, tmp_path, monkeypatch):
    """12 prompts in chunks of 4, a scan of the first 8 and the sections beyond the paper on the first 8: the
    sink passes fill the scan's sums and the key-sink, massive and value-weighted readers (no pass of their
    own runs), and every section equals a report where nothing rides."""
    from sinkmech import readers
    from sinkmech.dormant import scan as scan_module
    from sinkmech.report.beyond import key_sinks_section, massive_section, value_weighted_section
    from sinkmech.report.sections import dormant_section, sink_section

    kw = dict(sections=[sink_section, dormant_section, key_sinks_section, massive_section, value_weighted_section],
              prompts=prompts, n_prompts=12, max_tokens=16, scan_prompts=8, beyond_prompts=8,
              options=RunOptions(progress=False, bos_token_id=TINY_BOS, batch_size=4))
    with monkeypatch.context() as m:  # the same report with nothing riding
        m.setattr(report.ReportContext, "_riders", lambda self, batches: {"prepend": {}, "none": {}})
        own = report.build_report(tiny_model, tmp_path / "own", **kw)
    with monkeypatch.context() as m:  # a pass of the scan's or a reader's own would fail here
        m.setattr(scan_module, "accumulate", lambda *a, **k: pytest.fail("the scan ran a pass of its own"))
        m.setattr(readers, "run", lambda *a, **k: pytest.fail("a reader ran a pass of its own"))
        ridden = report.build_report(tiny_model, tmp_path / "ridden", **kw)
    sections = ridden.summary["sections"]
    assert sections["dormant"]["n_prompts"] == 8 and sections["key_sinks"]["n_prompts"] == 8
    assert json.dumps(sections) == json.dumps(own.summary["sections"])
    # only what runs rides: without the dormant section the scan's sums are never made
    from sinkmech.report import context as context_module

    with monkeypatch.context() as m:
        m.setattr(context_module, "scan_sums", lambda *a, **k: pytest.fail("the scan rode without its section"))
        alone = report.build_report(tiny_model, tmp_path / "alone", **{**kw, "sections": [sink_section, key_sinks_section]})
    assert alone.summary["sections"]["key_sinks"] == own.summary["sections"]["key_sinks"]
    # 8 prompts are not a whole number of chunks of 3: each runs its own pass
    monkeypatch.setattr(scan_module, "accumulate", lambda *a, **k: pytest.fail("a separate scan pass"))
    with pytest.raises(pytest.fail.Exception, match="a separate scan pass"):
        report.build_report(tiny_model, tmp_path / "odd", **{**kw, "options": RunOptions(
            progress=False, bos_token_id=TINY_BOS, batch_size=3)})
    monkeypatch.setattr(readers, "run", lambda *a, **k: pytest.fail("a separate reader pass"))
    with pytest.raises(pytest.fail.Exception, match="a separate reader pass"):
        report.build_report(tiny_model, tmp_path / "odd2", **{**kw, "sections": [sink_section, massive_section],
                                                              "options": RunOptions(progress=False,
                                                                                    bos_token_id=TINY_BOS,
                                                                                    batch_size=3)})
