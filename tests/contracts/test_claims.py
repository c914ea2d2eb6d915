"""Measurement definitions seen from the commands: --bos-token is
resolved to one token id, `perturb --sensitivity` reports the rank correlation
of the path bound, `heads` checks every if_else head plus candidates with
intervals, and reports triggers validated on held-out prompts."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from helpers.tiny import TINY_RUN, TINY_BOS, WordTokenizer, make_tiny, serve_tiny, toy_tokenizer
from sinkmech.cli.common import UsageError, bos_token_arg
from sinkmech.cli.main import main
from sinkmech.options import QUIET, RunOptions


@pytest.fixture
def cli_model(monkeypatch):
    return serve_tiny(monkeypatch, 7)


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.txt"
    words = "the cat sat on the warm mat today and a dog ran far away from the big red barn".split()
    lines = [" ".join(words[i:] + words[:i]) for i in range(8)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_bos_token_resolves_to_exactly_one_token(cli_model, monkeypatch):
    assert bos_token_arg(cli_model, SimpleNamespace(bos_token=None)) is None
    assert bos_token_arg(cli_model, SimpleNamespace(bos_token="<s>")) == 1
    assert bos_token_arg(cli_model, SimpleNamespace(bos_token="cat")) == WordTokenizer()("cat")["input_ids"][0]
    with pytest.raises(UsageError, match="exactly one token, it tokenizes to 2"):
        bos_token_arg(cli_model, SimpleNamespace(bos_token="big dog"))
    with pytest.raises(UsageError, match="empty"):
        bos_token_arg(cli_model, SimpleNamespace(bos_token=""))
    bare = make_tiny(0)
    toy_tokenizer(monkeypatch, bare, None)  # a model without a tokenizer (the Bridge's tiny model has one)
    with pytest.raises(UsageError, match="tokenizer"):
        bos_token_arg(bare, SimpleNamespace(bos_token="<s>"))


def test_bos_token_changes_the_first_token_of_perturb(cli_model, prompts, tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["perturb", "--noise", "0.1", "--position", "2", "--prompts", prompts, "--json", str(a)]) == 0
    assert main(["perturb", "--noise", "0.1", "--position", "2", "--prompts", prompts, "--json", str(b),
                 "--bos-token", "barn"]) == 0
    da, db = json.loads(a.read_text()), json.loads(b.read_text())
    assert da["mean_change"]["none"] == db["mean_change"]["none"]  # the no-<bos> run does not change
    assert da["mean_change"]["prepend"] != db["mean_change"]["prepend"]
    assert "normalized_entropy" in da and "normalised" in capsys.readouterr().out
    assert main(["perturb", "--noise", "0.1", "--position", "2", "--prompts", prompts, "--bos-token", "big dog"]) == 2
    assert "exactly one token" in capsys.readouterr().err


def test_perturb_sensitivity_reports_the_rank_correlation(cli_model, prompts, tmp_path, capsys):
    out = tmp_path / "s.json"
    argv = ["perturb", "--sensitivity", "--sensitivity-prompts", "2", "--sensitivity-tokens", "6", "--prompts", prompts]
    assert main(argv + ["--json", str(out)]) == 0
    s = json.loads(out.read_text())["sensitivity"]
    assert s["n_prompts"] == 2 and s["max_tokens"] == 6
    for c in ("prepend", "none"):
        assert len(s["spearman"][c]) == 2 and all(-1 <= x <= 1 for x in s["spearman"][c])
        assert len(s["rank_collapse_without_first"][c]) == len(s["rank_collapse_with_first"][c]) == 3
    assert "Spearman" in capsys.readouterr().out
    # with a swap as well: the spread's keys stay, sensitivity is added
    assert main(["perturb", "--swap", "cat", "dog", "--sensitivity", "--sensitivity-prompts", "1", "--sensitivity-tokens",
                 "4", "--prompts", prompts, "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert {"mean_change", "per_layer", "entropy", "normalized_entropy", "sensitivity"} <= set(d)
    assert main(["perturb", "--prompts", prompts]) == 2
    assert "--swap, --noise or --sensitivity" in capsys.readouterr().err


def test_sensitivity_study_against_sensitivity(tiny_model, tiny_tokens):
    from sinkmech.theory.sensitivity import sensitivity, sensitivity_study

    rows = tiny_tokens[:2, :5].tolist()
    st = sensitivity_study(tiny_model, rows, max_tokens=5, options=TINY_RUN)
    for c, bos in enumerate(st.conditions):
        for p in range(2):
            one = sensitivity(tiny_model, [rows[p]], bos=bos, max_tokens=5, options=RunOptions(bos_token_id=TINY_BOS))
            assert st.spearman[c, p] == pytest.approx(one.rank_correlation(), abs=1e-6)
            assert st.spearman_off_diagonal[c, p] == pytest.approx(one.rank_correlation(exclude_self=True), abs=1e-6)


def test_heads_checks_every_if_else_head_and_the_candidates(cli_model, prompts, tmp_path, capsys):
    out = tmp_path / "h.json"
    found = tmp_path / "findings.json"
    assert main(["heads", "--prompts", prompts, "--json", str(out), "--noop", "2", "--noop-prompts", "4",
                 "--bos-token", "barn", "--min-prompts", "2", "--findings", str(found)]) == 0
    d = json.loads(out.read_text())
    assert d["thresholds"]["min_prompts"] == 2
    if_else = [(e["layer"], e["head"]) for e in d["heads"] if e["mode"] == "if_else"]
    checked = [(r["layer"], r["head"]) for r in d["noop"]["heads"]]
    assert set(checked[: len(if_else)]) == set(if_else) and len(checked) == len(if_else) + 2
    assert all("per_query_dormant_ci" in r and "per_query_active_ci" in r for r in d["noop"]["heads"])
    assert all(set(e["trigger_selected_on"]).isdisjoint(e["trigger_validated_on"]) for e in d["heads"])
    # the no-op check ran on the prompts the scan did not see
    assert d["prompt_split"]["noop_prompts"] == d["noop"]["prompt_indices"]
    assert not set(d["prompt_split"]["scan_prompts"]) & set(d["noop"]["prompt_indices"])
    text = capsys.readouterr().out
    assert "held-out" in text and "t interval" in text and "zero out" in text and "mean ablate" in text
    # the findings: mode counts, the sweep, and every no-op effect with its interval
    f = json.loads(found.read_text())
    prefix = next(k.split(".heads.")[0] for k in f if ".heads." in k)
    assert f[f"{prefix}.heads.n_if_else"] == len(if_else) and f[f"{prefix}.heads.sweep.0.5_0.2.if_else"] == len(if_else)
    with_active = [(l, h) for l, h in checked if f.get(f"{prefix}.heads.noop.L{l}.H{h}.zero_out_active.per_query.value")
                   is not None]
    assert with_active
    for l, h in with_active:
        e = f"{prefix}.heads.noop.L{l}.H{h}.zero_out_active.per_query"
        lo, hi = f[f"{e}.ci.0"], f[f"{e}.ci.1"]
        assert f[f"{e}.detectable"] == (not lo <= 0 <= hi)
        assert f[f"{e}.p_adjusted"] is None and f[f"{e}.role"] == "secondary"  # unadjusted: not in the family
    # the primary family: per if-else head and intervention, active minus matched control, Holm over it alone
    assert f[f"{prefix}.heads.noop.primary_family.size"] == 3 * len(if_else) == f[f"{prefix}.heads.noop.n_intervals"]
    for l, h in if_else:
        assert f[f"{prefix}.heads.noop.primary_family.tests.L{l}.H{h}.zero_out.p_adjusted"] is not None


def test_noop_heads_takes_all_if_else_heads_then_candidates():
    from sinkmech.dormant.noop import noop_heads

    scan = SimpleNamespace(if_else_heads=lambda: [(3, 1), (2, 0)],
                           ranked=lambda: [(3, 1), (2, 0), (5, 5), (1, 1), (0, 0)])
    assert noop_heads(scan, 2) == [(3, 1), (2, 0), (5, 5), (1, 1)]
    assert noop_heads(scan, 0) == []


def test_report_restoration_curve_keeps_the_no_bos_sink(tiny_model, tiny_tokens, tmp_path):
    """The report's <bos> -> no-<bos> resid_pre curve patches content positions
    1..n-1 only (the old curve also overwrote position 0, the no-<bos> run's sink)."""
    from sinkmech.interventions.patching import bos_pair, patch_resid_pre
    from sinkmech.report.context import ReportContext
    from sinkmech.report.sections import ablation_section

    rows = tiny_tokens[:2, :8].tolist()
    ctx = ReportContext(model=tiny_model, out=tmp_path, prompts=rows, n_prompts=2, max_tokens=8, ablation_prompts=2,
                        ablation_tokens=8, options=TINY_RUN)
    got = ablation_section(ctx).summary["patch_resid_pre"]
    pair = bos_pair(tiny_model, rows, max_tokens=8, bos_token_id=TINY_BOS)
    want = patch_resid_pre(tiny_model, pair, per_position=False, source="prepend", options=QUIET, positions=range(1, 8))
    old = patch_resid_pre(tiny_model, pair, per_position=False, source="prepend", options=QUIET)
    assert got["patched_content_positions"] == [1, 7]
    assert got["values"] == pytest.approx(want.values.tolist(), abs=1e-6)
    assert max(abs(a - b) for a, b in zip(got["values"], old.values.tolist())) > 1e-4


def test_sinks_findings_carry_intervals_and_the_paired_contrast(cli_model, prompts, tmp_path):
    """`sinks --findings` records each rate and loss with its interval, and with both
    conditions the without-minus-with contrast, paired by prompt (as compare does)."""
    found = tmp_path / "findings.json"
    assert main(["sinks", "--prompts", prompts, "--bos", "both", "--bos-token", "barn", "--json",
                 str(tmp_path / "s.json"), "--findings", str(found)]) == 0
    f = json.loads(found.read_text())
    p = next(k.split(".sinks.")[0] for k in f if ".sinks." in k) + ".sinks.bos_barn"
    for c in ("prepend", "none"):
        rate, lo, hi = (f[f"{p}.{c}.sink_rate_ci.0.3.{i}"] for i in range(3))
        assert rate == pytest.approx(f[f"{p}.{c}.sink_rate.0.3"]) and lo <= rate <= hi
        loss, lo, hi = (f[f"{p}.{c}.loss_ci.{i}"] for i in range(3))
        assert loss == pytest.approx(f[f"{p}.{c}.loss"]) and lo <= loss <= hi
    gap = f[f"{p}.contrasts.loss_gap.0"]
    assert gap == pytest.approx(f[f"{p}.none.loss"] - f[f"{p}.prepend.loss"], abs=1e-6)
    assert f[f"{p}.contrasts.sink_rate_gap.0.3.0"] == pytest.approx(
        f[f"{p}.none.sink_rate.0.3"] - f[f"{p}.prepend.sink_rate.0.3"], abs=1e-4)


@pytest.mark.slow
def test_the_theory_study_writes_paired_intervals_its_holm_family_and_findings(cli_model, tmp_path):
    """The theory study on the tiny model: each mean with an interval around it, the
    with/without difference paired by prompt, the estimator checked on every position
    of held-out prompts, the p-values Holm-corrected over the stated family (9 tests
    per model: the paired test on 3 pair sets, 5 distinct bound-minus-null tests, the
    entropy's paired test; `family_tests`), and the findings nested from the root."""
    from sinkmech.options import QUIET
    from sinkmech.studies.configs import STUDIES, TheoryConfig
    from sinkmech.studies.theory import run, text

    assert STUDIES["theory"] is TheoryConfig
    cfg = TheoryConfig(models=("tiny",), prompts=3, tokens=5, shuffles=5, validate_prompts=2, validate_tokens=4,
                       entropy_prompts=4, entropy_tokens=8)
    result = run(["tiny"], cfg, QUIET)
    out = json.loads(result.to_json())
    assert out["config"] == cfg.to_dict()
    r = out["tiny"]
    for key in ("all", "content", "off_diagonal", "normalized_entropy"):
        for c in ("prepend", "none", "none_minus_prepend"):
            v = r[key][c]
            assert v["ci"][0] - 1e-9 <= v["mean"] <= v["ci"][1] + 1e-9
        assert r[key]["none_minus_prepend"]["mean"] == pytest.approx(r[key]["none"]["mean"] - r[key]["prepend"]["mean"])
        v = r[key]["none_minus_prepend"]
        assert 0 <= v["sign_flip_p"] <= v["sign_flip_p_holm"] <= 1
    for key in ("all", "content", "off_diagonal"):  # the bound against its same-distance shuffle, per condition
        v = r[key]["prepend"]["minus_null"]
        assert v["mean"] == pytest.approx(r[key]["prepend"]["mean"] - r[key]["prepend"]["null"]["mean"])
    # without <bos> the content pairs are all pairs: the same numbers by construction
    assert r["content"]["none"]["mean"] == r["all"]["none"]["mean"] and r["content_equals_all_without_bos"]
    # the family: per model 3 paired tests, 5 distinct bound-minus-null tests, the entropy's paired test
    assert out["family"]["size"] == 9 and len({t["name"] for t in out["family"]["tests"]}) == 9
    v = r["validation"]
    assert v["n_prompts"] == 2 and v["n_tokens"] == 4 and len(v["bound_spearman_exact"]) == 4  # 2 prompts x 2 conditions
    assert v["n_entries"] == 2 * (5 * 6 // 2) + 2 * (4 * 5 // 2)  # every causal entry, with and without <bos>
    assert r["n_prompts"] == 3 and r["n_tokens"] == 5 and r["estimator"] == "hutchinson"
    # intervals over the documents the windows come from (3 and 4 windows here cut from 2 documents)
    assert r["n_documents"] == 2 and "2 documents the 3 prompts" in r["interval"]
    assert r["normalized_entropy"]["prepend"]["n"] == 2 and r["normalized_entropy"]["prepend"]["unit"] == "document"
    assert r["entropy_setting"]["n_documents"] == 2
    found = result.findings()["tiny.theory"]
    assert not any(".per_prompt" in k for k in found)
    assert found["tiny.theory.normalized_entropy.none.mean"] == r["normalized_entropy"]["none"]["mean"]
    assert "Holm family: 9" in text(result)
    with pytest.raises(Exception, match="prompts must be >= 2"):
        TheoryConfig(prompts=1).check()
