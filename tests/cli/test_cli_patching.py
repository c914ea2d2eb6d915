"""`sinkmech patch / ablate / perturb` end to end on a tiny model with a word tokenizer."""

from __future__ import annotations

import json

import pytest

from helpers.tiny import serve_tiny
from sinkmech.cli.main import main


@pytest.fixture
def cli_model(monkeypatch):
    return serve_tiny(monkeypatch, 7)


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("the cat sat on the warm mat today\na cat ran far away from the big dog\n")
    return str(path)


def test_ablate_writes_the_json_contract_and_a_png(cli_model, prompts, tmp_path):
    out, png = tmp_path / "abl.json", tmp_path / "abl.png"
    assert main(["ablate", "--mode", "mask_first", "--prompts", prompts, "--attribution", "--json", str(out), "--png", str(png)]) == 0
    d = json.loads(out.read_text())
    assert d["mode"] == "mask_first" and d["metric"] == "kl"
    assert (d["n_layers"], d["n_heads"]) == (2, 4)
    assert len(d["effects"]) == 2 and all(len(row) == 4 for row in d["effects"])
    assert -1 <= d["attribution"]["pearson"] <= 1
    assert png.stat().st_size > 1000


def test_patch_both_directions(cli_model, prompts, tmp_path):
    out, png = tmp_path / "patch.json", tmp_path / "patch.png"
    assert main(["patch", "--act", "resid_pre", "--prompts", prompts, "--json", str(out), "--png", str(png)]) == 0
    d = json.loads(out.read_text())
    assert set(d["results"]) == {"prepend", "none"} and d["by"] == "layer_pos"
    assert len(d["results"]["prepend"]["values"]) == 2 and len(d["results"]["prepend"]["values"][0]) == 9
    assert png.exists()


def test_perturb_swap_and_errors(cli_model, prompts, tmp_path, capsys):
    out, png = tmp_path / "pert.json", tmp_path / "pert.png"
    assert main(["perturb", "--swap", "cat", "dog", "--prompts", prompts, "--json", str(out), "--png", str(png)]) == 0
    d = json.loads(out.read_text())
    assert d["last_changed"] == [1, 1] and set(d["mean_change"]) == {"prepend", "none"}
    assert png.exists()
    assert main(["perturb", "--swap", "cat", "big dog", "--prompts", prompts]) == 2
    assert "must keep the length" in capsys.readouterr().err
    assert main(["perturb", "--noise", "0.1", "--prompts", prompts]) == 2
    with pytest.raises(SystemExit):
        main(["ablate", "--mode", "knockout", "--prompts", prompts])


@pytest.mark.slow  # the whole report page, on the tiny model
def test_compare_with_report_reuses_the_sink_passes(cli_model, monkeypatch, tmp_path, capsys):
    """`compare --report DIR` (make demo) writes the first model's report page from
    compare's own sink passes: the page's sink rates are compare's, and both land in
    the findings file."""
    words = "the cat sat on a warm mat and ran far from the big dog today".split()
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(" ".join(words[i:] + words[:i]) for i in range(8)) + "\n")
    out, rep, found = tmp_path / "cmp", tmp_path / "rep", tmp_path / "findings.json"
    args = ["compare", "--models", "smollm2", "--out", str(out), "--report", str(rep), "--prompts", str(prompts),
            "--n-prompts", "8", "--max-tokens", "12", "--spread-prompts", "2", "--spread-tokens", "10",
            "--dormant-prompts", "4", "--noop-prompts", "0", "--findings", str(found)]  # as make demo: no no-op check
    assert main(args) == 0
    cmp = json.loads((out / "compare.json").read_text())["models"][0]["conditions"]
    page = json.loads((rep / "summary.json").read_text())["sections"]["sinks"]
    for bos in ("prepend", "none"):
        assert page["sink_rate"][bos]["0.3"] == pytest.approx(cmp[bos]["sink_rate"]["0.3"])
        assert page["per_layer_score"][bos] == pytest.approx(cmp[bos]["per_layer_score"])
    keys = json.loads(found.read_text())
    assert any(k.startswith("smollm2.compare.") for k in keys) and any(k.startswith("smollm2.report.") for k in keys)
    assert (rep / "index.html").exists()
    assert json.loads((rep / "summary.json").read_text())["sections"]["dormant"]["noop"] is None  # the scan alone
    capsys.readouterr()
    same = ["compare", "--models", "smollm2", "--out", str(tmp_path / "x"), "--report", str(tmp_path / "x")]
    assert main(same) == 2 and "--report" in capsys.readouterr().err
