"""The two-model comparison (Table 2 / Figure 2 on real models) and Gemma's CLI contracts."""

from __future__ import annotations

import json

import pytest
import torch

from helpers.tiny import TINY_BOS
from helpers.tolerance import TINY_FORWARD
from helpers.tiny import TINY_RUN
from sinkmech.studies.compare import compare_model
from sinkmech.studies.config import ConfigError
from sinkmech.studies.configs import CompareConfig
from sinkmech.measures.loss import content_loss
from sinkmech.interventions.perturb import corpus_swaps, perturbation_spread
from sinkmech.prompts import tokenize
from sinkmech.measures.sinks import sink_scores
from sinkmech.options import QUIET, RunOptions


def test_compare_model_equals_the_analyses_it_runs(tiny_model):
    g = torch.Generator().manual_seed(3)
    rows = torch.randint(2, 50, (6, 20), generator=g).tolist()
    config = CompareConfig(n_prompts=6, max_tokens=16, spread_prompts=3, spread_tokens=12, spread_position=2,
                           dormant_prompts=4, noop_prompts=2, noop_heads=2)
    res = compare_model(tiny_model, rows, config=config, options=TINY_RUN)
    # compare's own passes against direct calls batched otherwise: the tiny model's forward bound (losses ~ln 50)
    tol = TINY_FORWARD
    for bos in ("prepend", "none"):
        batch = tokenize(tiny_model, rows, bos=bos, max_tokens=16, bos_token_id=TINY_BOS)
        direct = sink_scores(tiny_model, batch, options=QUIET)
        row = res.conditions[bos]
        assert row.sink_rate["0.3"] == pytest.approx(direct.sink_rate(0.3))
        assert row.per_layer_score == pytest.approx(direct.per_layer().tolist(), abs=tol)
        assert row.loss == pytest.approx(content_loss(tiny_model, batch), abs=4 * tol)
    content = [r[:12] for r in rows[:3]]
    spread = perturbation_spread(tiny_model, content, perturbation=corpus_swaps(content, 2),
                                 options=TINY_RUN).per_layer()["mean_change"]
    assert res.conditions["none"].per_layer_spread == pytest.approx(spread[1].tolist(), abs=tol)
    assert res.conditions["prepend"].spread == pytest.approx(float(spread[0].mean()), abs=tol)
    assert res.dormant is not None and len(res.dormant.noop) == 2
    # the no-op check ran on prompts the scan did not see
    assert res.dormant.noop_prompts == [4, 5] and res.dormant.n_prompts == 4
    # reach and spread curves over fractional depth: per-prompt means, brute force
    full = perturbation_spread(tiny_model, content, perturbation=corpus_swaps(content, 2), options=TINY_RUN)
    later = full.later()
    row = res.conditions["none"]
    assert row.depth == pytest.approx([l / tiny_model.cfg.n_layers for l in range(tiny_model.cfg.n_layers + 1)])
    for l in range(len(row.depth)):
        reach = [float((full.change[1, p, l][later[p]] > full.threshold).float().mean()) for p in range(3)]
        mean, lo, hi = row.reach_curve[l]
        assert mean == pytest.approx(sum(reach) / 3, abs=tol) and lo <= mean + 1e-9 and mean <= hi + 1e-9
        assert min(reach) - 1e-9 <= lo and hi <= max(reach) + 1e-9
    assert set(res.findings()["none"]["curve_at_depth"]) == {"0.25", "0.5", "0.75", "1"}
    # the without-minus-with gap, paired by prompt: per-prompt differences of the change, brute force
    for l in range(len(row.depth)):
        gap = [float(full.change[1, p, l][later[p]].mean() - full.change[0, p, l][later[p]].mean()) for p in range(3)]
        mean, lo, hi = res.gap_curves["mean_change"][l]
        assert mean == pytest.approx(sum(gap) / 3, abs=tol)
        assert min(gap) - tol <= lo <= mean + tol and mean <= hi + tol and hi <= max(gap) + tol
    at = res.findings()["gap_at_depth"]
    assert set(at) == {"0.25", "0.5", "0.75", "1"}
    for v in at.values():
        m, lo, hi = v["mean_change"]
        assert v["mean_change_detectable"] == (lo > 0 or hi < 0)
    # at the embeddings (depth 0) later positions are untouched in both conditions: no gap at all
    assert res.gap_curves["mean_change"][0] == pytest.approx([0.0, 0.0, 0.0], abs=1e-7)
    # the without-minus-with contrasts, paired by prompt, brute force from each prompt's own loss and rates
    per = {}
    for bos in ("prepend", "none"):
        batch = tokenize(tiny_model, rows, bos=bos, max_tokens=16, bos_token_id=TINY_BOS)
        per[bos] = [content_loss(tiny_model, batch.slice(p, p + 1)) for p in range(6)]
        rate = [100 * float((sink_scores(tiny_model, batch.slice(p, p + 1), options=QUIET).scores > 0.3).float().mean())
                for p in range(6)]
        assert res.conditions[bos].sink_rate_ci["0.3"][0] == pytest.approx(sum(rate) / 6)
        per[bos + "_rate"] = rate
        loss, lo, hi = res.conditions[bos].loss_ci
        assert loss == pytest.approx(res.conditions[bos].loss, abs=4 * tol) and lo <= loss <= hi
    gap, lo, hi = res.contrasts["loss_gap"]
    diffs = [a - b for a, b in zip(per["none"], per["prepend"])]  # every prompt has 15 targets: the mean of diffs
    assert gap == pytest.approx(sum(diffs) / 6, abs=8 * tol)  # a difference of two losses, each 4 tol
    assert min(diffs) - 8 * tol <= lo <= gap <= hi <= max(diffs) + 8 * tol
    assert gap == pytest.approx(res.findings()["loss_gap"], abs=8 * tol)
    assert res.findings()["loss_gap_detectable"] == (lo > 0 or hi < 0)
    rgap = res.contrasts["sink_rate_gap"]["0.3"]
    assert rgap[0] == pytest.approx(sum(a - b for a, b in zip(per["none_rate"], per["prepend_rate"])) / 6)
    json.loads(res.to_json())
    with pytest.raises(ValueError, match="spread_position"):
        CompareConfig(spread_tokens=4, spread_position=3)


@pytest.mark.slow
def test_compare_cli_writes_table_and_figures(smollm2, tmp_path, monkeypatch, capsys):
    from sinkmech import cli
    from sinkmech.loading import models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: smollm2)
    out = tmp_path / "cmp"
    args = ["compare", "--models", "smollm2", "--out", str(out), "--n-prompts", "4", "--max-tokens", "12",
            "--spread-prompts", "2", "--spread-tokens", "10", "--dormant-prompts", "4", "--noop-prompts", "2",
            "--noop-max-heads", "1"]
    assert cli.main(args) == 0
    data = json.loads((out / "compare.json").read_text())
    d = data["models"][0]["dormant"]
    assert len(d["noop"]) == 1 and list(d["noop"]) == d["noop_covers"][:1] and len(d["noop_covers"]) > 1
    err = capsys.readouterr().err  # the first look says what it left out and how to ask for the whole check
    assert f"smollm2: note: the no-op check ran on 1 of the {len(d['noop_covers'])} heads" in err
    assert "--noop-max-heads all --noop-prompts 64" in err
    assert [r["bos"] for r in data["table"]] == ["prepend", "none"]
    assert set(data["models"][0]["conditions"]["none"]) >= {"sink_rate", "loss", "spread", "per_layer_score"}
    assert (out / "first_token_score.png").stat().st_size > 1000 and (out / "spread.png").exists()
    assert "| smollm2 | with <bos> |" in (out / "compare.md").read_text()
    assert cli.main(args) == 2  # an earlier comparison is kept unless --overwrite
    assert "--overwrite" in capsys.readouterr().err


@pytest.mark.slow
def test_gemma_cli_contracts(gemma, tmp_path, monkeypatch):
    """`sinks` (with the loss) and `perturb` on Gemma 3 270M: the contracts other scripts rely on."""
    from sinkmech import cli
    from sinkmech.loading import models
    from sinkmech.corpora import default_corpus

    monkeypatch.setattr(models, "load_model", lambda *a, **k: gemma)
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(default_corpus(4)))
    assert cli.main(["sinks", "--model", "gemma3-270m", "--prompts", str(prompts), "--max-tokens", "64",
                     "--bos", "both", "--eps", "0.3", "0.8", "--json", str(tmp_path / "s.json")]) == 0
    s = json.loads((tmp_path / "s.json").read_text())
    c = s["conditions"]
    # Gemma was trained with <bos> always first: its sinks and its loss depend on it (the paper's Table 2).
    assert c["prepend"]["sink_rate"]["0.3"] > 50 and c["none"]["sink_rate"]["0.3"] < 5
    assert c["none"]["loss"] > c["prepend"]["loss"] + 1.0
    assert cli.main(["perturb", "--model", "gemma3-270m", "--prompts", str(prompts), "--max-tokens", "48",
                     "--noise", "1.0", "--position", "4", "--seed", "0", "--json", str(tmp_path / "p.json")]) == 0
    p = json.loads((tmp_path / "p.json").read_text())
    for cond in ("prepend", "none"):
        assert len(p["per_layer"][cond]["mean_change"]) == gemma.cfg.n_layers + 1


@pytest.mark.slow
@pytest.mark.long
def test_gemma_report_end_to_end(gemma, tmp_path, monkeypatch):
    """Every report section (sinks, norms, views, spread, dormant heads + no-op, ablation + patching) runs on Gemma."""
    from sinkmech import cli
    from sinkmech.loading import models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: gemma)
    out = tmp_path / "rep"
    assert cli.main(["report", "--model", "gemma3-270m", "--out", str(out), "--n-prompts", "4", "--max-tokens", "8",
                     "--heads", "2", "--view-tokens", "8", "--view-prompts", "1", "--beyond-prompts", "2",
                     "--stream-tokens", "48", "--stream-window", "16", "--length-prompts", "2", "--length-tokens", "32", "--length-steps", "1"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["model"] == "gemma3-270m" and (s["n_layers"], s["n_heads"]) == (18, 4)
    assert sum(s["sections"]["dormant"]["mode_counts"].values()) == 18 * 4
    assert len(s["sections"]["ablation"]["effects"]) == 18


def test_depth_curves_and_sweep_figures_draw(tmp_path):
    from sinkmech.plots.heads import mode_sweep
    from sinkmech.plots.compare import depth_curves

    curve = [[0.1, 0.05, 0.2], [0.5, 0.4, 0.6], [0.9, 0.8, 1.0]]
    out = depth_curves({"a": {"prepend": ([0, 0.5, 1], curve), "none": ([0, 0.5, 1], curve)},
                        "b": {"prepend": ([0, 1], curve[:2])}}, tmp_path / "d.png", ylabel="reach", title="t")
    assert out.stat().st_size > 1000
    rows = [{"high": h, "low": l, "mode_counts": {"sink": 1, "active": 2, "mixed": 3, "if_else": int(h < 0.7)}}
            for h in (0.8, 0.6) for l in (0.2, 0.1)]
    assert mode_sweep(rows, tmp_path / "s.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="no sweep rows"):
        mode_sweep([], tmp_path / "x.png")


@pytest.mark.slow
def test_a_report_reuses_compares_sink_passes(tiny_model, tmp_path):
    """`compare --report` hands compare's sink passes to the report: they are the
    passes the report would run itself (same prompts and settings), and the page's
    sink numbers come out the same either way."""
    from sinkmech.report.page import build_report
    from sinkmech.report.sections import norms_section, sink_section

    g = torch.Generator().manual_seed(4)
    rows = torch.randint(2, 50, (6, 20), generator=g).tolist()
    config = CompareConfig(n_prompts=6, max_tokens=16, spread_prompts=3, spread_tokens=12, spread_position=2,
                           dormant_prompts=0)
    res = compare_model(tiny_model, rows, config=config,
                        options=RunOptions(batch_size=4, progress=False, bos_token_id=TINY_BOS))
    kept = res.shared.sinks
    assert set(kept) == {"prepend", "none"} and (res.shared.n_prompts, res.shared.max_tokens) == (6, 16)
    assert "shared" not in res.to_dict()
    kw = dict(sections=[sink_section, norms_section], prompts=rows, n_prompts=6, max_tokens=16,
              options=RunOptions(batch_size=4, progress=False, bos_token_id=TINY_BOS))
    fresh = build_report(tiny_model, tmp_path / "fresh", **kw)
    reused = build_report(tiny_model, tmp_path / "reused", shared=res.shared, **kw)
    assert res.shared.sinks_for(6, 8) is None  # other settings: the report runs its own passes
    for bos in ("prepend", "none"):
        batch = tokenize(tiny_model, rows, bos=bos, max_tokens=16, bos_token_id=TINY_BOS)
        direct = sink_scores(tiny_model, batch, options=RunOptions(batch_size=4, progress=False))
        assert torch.allclose(kept[bos].scores, direct.scores, atol=TINY_FORWARD, rtol=0)  # passes batched otherwise
    a, b = fresh.summary["sections"], reused.summary["sections"]
    for bos in ("prepend", "none"):
        assert a["sinks"]["sink_rate"][bos] == pytest.approx(b["sinks"]["sink_rate"][bos])
        # kept passes (batches of 4) against the report's own: the forward bound
        assert a["sinks"]["per_layer_score"][bos] == pytest.approx(b["sinks"]["per_layer_score"][bos], abs=TINY_FORWARD)
        assert a["norms"]["max_resid_ratio"][bos] == pytest.approx(b["norms"]["max_resid_ratio"][bos], rel=TINY_FORWARD)
    assert max(max(v) for v in a["sinks"]["per_layer_score"].values()) > 0.1  # real scores, not zeros on both sides


@pytest.mark.slow
def test_a_report_reuses_compares_dormant_head_discovery(tiny_model, tmp_path):
    """With the report's scan and no-op sizes, `compare` and the report run the
    same discovery: the report takes compare's from the shared memo (no second
    scan) and its dormant section shows the same heads and no-op numbers as a
    report that ran the discovery itself."""
    from sinkmech.report.page import build_report
    from sinkmech.report.sections import dormant_section

    g = torch.Generator().manual_seed(5)
    rows = torch.randint(2, 50, (12, 20), generator=g).tolist()
    config = CompareConfig(n_prompts=12, max_tokens=16, spread_prompts=2, spread_tokens=12, spread_position=2,
                           dormant_prompts=8, noop_prompts=4, noop_heads=2)
    res = compare_model(tiny_model, rows, config=config,
                        options=RunOptions(batch_size=4, progress=False, bos_token_id=TINY_BOS))
    memo = res.shared.discoveries
    assert len(memo) == 1
    kw = dict(sections=[dormant_section], prompts=rows, n_prompts=12, max_tokens=16, scan_prompts=8,
              noop_prompts=4, n_heads=2, options=RunOptions(batch_size=4, progress=False, bos_token_id=TINY_BOS))
    reused = build_report(tiny_model, tmp_path / "reused", shared=res.shared, **kw)
    assert len(memo) == 1  # nothing new was run
    fresh = build_report(tiny_model, tmp_path / "fresh", **kw)
    a, b = reused.summary["sections"]["dormant"], fresh.summary["sections"]["dormant"]
    assert a["noop"].pop("seconds") > 0 and b["noop"].pop("seconds") > 0  # what each check took: the one timing
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert set(res.dormant.noop) and set(res.dormant.noop) <= set(json.dumps(a).replace('"', " ").split())


def test_noop_prompts_0_runs_the_scan_alone_on_the_same_prompts(tiny_model):
    """`make demo` passes --noop-prompts 0: the same scan (the first dormant_prompts prompts), no check."""
    rows = torch.randint(2, 50, (8, 16), generator=torch.Generator().manual_seed(4)).tolist()
    kw = dict(n_prompts=8, max_tokens=12, spread_prompts=2, spread_tokens=10, spread_position=2, dormant_prompts=4)
    off = compare_model(tiny_model, rows, config=CompareConfig(noop_prompts=0, **kw), options=TINY_RUN).dormant
    on = compare_model(tiny_model, rows, config=CompareConfig(noop_prompts=2, noop_heads=1, **kw), options=TINY_RUN).dormant
    assert off.noop == {} and off.noop_prompts == [] and off.loss_clean is None and on.noop
    assert (off.n_prompts, off.mode_counts, off.if_else_heads) == (on.n_prompts, on.mode_counts, on.if_else_heads)


def test_noop_max_heads_checks_the_first_heads_covered_and_the_result_says_what_the_rest_would_cost(tiny_model):
    """noop_max_heads caps the no-op check (the if-else heads first); the summary
    keeps every head it covers and the check's time; the study's notes then say
    what the whole check would take, and there is none for a whole check."""
    from sinkmech.studies.compare import Comparison

    rows = torch.randint(2, 50, (12, 16), generator=torch.Generator().manual_seed(4)).tolist()
    kw = dict(n_prompts=8, max_tokens=12, spread_prompts=2, spread_tokens=10, spread_position=2, dormant_prompts=8,
              noop_prompts=4, noop_heads=3)
    capped = compare_model(tiny_model, rows, config=CompareConfig(noop_max_heads=2, **kw), options=TINY_RUN)
    whole = compare_model(tiny_model, rows, config=CompareConfig(noop_max_heads=None, **kw), options=TINY_RUN)
    d, w = capped.dormant, whole.dormant
    assert d.noop_covers == w.noop_covers and len(d.noop_covers) >= 3
    assert list(d.noop) == d.noop_covers[:2] and list(w.noop) == w.noop_covers
    assert d.noop_seconds > 0 and capped.settings["noop_max_heads"] == 2
    notes = Comparison((capped,), CompareConfig(**kw), 1.0).notes()
    assert len(notes) == 1 and f"2 of the {len(d.noop_covers)} heads" in notes[0] and "--noop-max-heads none" in notes[0]
    assert "--noop-max-heads all" in Comparison((capped,), CompareConfig(**kw), 1.0).notes(all_heads="all")[0]
    with pytest.raises(ConfigError, match="noop_max_heads"):
        CompareConfig(noop_max_heads=0)


def test_compare_with_documents_resamples_them(tiny_model):
    """Prompts with their documents: every interval (sink rates, loss, the paired
    contrasts, the spread curves) resamples documents; the JSON says so."""
    from sinkmech.stats import ratio_with_ci

    g = torch.Generator().manual_seed(3)
    rows = torch.randint(2, 50, (6, 20), generator=g).tolist()
    config = CompareConfig(n_prompts=6, max_tokens=16, spread_prompts=4, spread_tokens=12, spread_position=2,
                           dormant_prompts=0)
    docs = ("a", "a", "b", "b", "c", "c", "d")  # one more than the prompts used: cut to them
    plain = compare_model(tiny_model, rows, config=config, options=TINY_RUN)
    res = compare_model(tiny_model, rows, config=config, documents=docs, options=TINY_RUN)
    pre, none = res.shared.sinks["prepend"], res.shared.sinks["none"]
    assert pre.documents == docs[:6]
    assert res.conditions["prepend"].loss_ci == ratio_with_ci(pre.prompt_loss, pre.prompt_targets().double(),
                                                              groups=docs[:6])
    assert res.contrasts["loss_gap"] == ratio_with_ci(none.prompt_loss - pre.prompt_loss,
                                                      pre.prompt_targets().double(), groups=docs[:6])
    assert res.conditions["prepend"].loss_ci[0] == plain.conditions["prepend"].loss_ci[0]
    assert res.conditions["prepend"].loss_ci != plain.conditions["prepend"].loss_ci
    assert res.gap_curves["mean_change"] != plain.gap_curves["mean_change"]
    assert [c[0] for c in res.gap_curves["mean_change"]] == [c[0] for c in plain.gap_curves["mean_change"]]
    assert res.to_dict()["interval"] == "95 % bca bootstrap over the 3 documents the 6 prompts were cut from"
    assert plain.to_dict()["interval"] == "95 % bca bootstrap over the 6 prompts"
    with pytest.raises(ValueError, match="5 documents for 6 prompts"):
        compare_model(tiny_model, rows, config=config, documents=docs[:5], options=TINY_RUN)
