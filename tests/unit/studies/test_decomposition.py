"""The decomposition study on the tiny rotary model, with a planted `<bos>` cost (a
corpus the model wrote with `<bos>` first): the paired phantom with `<bos>`'s
value recovers all of it, no `<bos>` none; `<bos>` first against the first-token
study's own run; the moved `<bos>` against `sink_scores(bos_position=K)`; the
per-layer conditions that coincide agree; the study end to end from its Config
(the config recorded, learned sinks refused on their fitting prompts, the
figures drawn, pieces merged)."""

from __future__ import annotations

import json

import pytest
import torch

from helpers.planted import sampled_corpus
from helpers.tiny import TINY_BOS, TINY_RUN, make_tiny
from sinkmech.interventions.fit_sinks import bos_mass
from sinkmech.measures.sinks import sink_scores
from sinkmech.options import QUIET
from sinkmech.prompts import tokenize
from sinkmech.studies.configs import STUDIES, DecompositionConfig
from sinkmech.stats import ratio_with_ci
from sinkmech.studies.decomposition import _loss_sums, decompose, merge, summarise
from sinkmech.studies.first_token import first_token_study

CONFIG = DecompositionConfig(positions=(1, 3), top_k=(1, 2, 8), learned_files=(), max_tokens=14)


@pytest.fixture(scope="module")
def model():
    return make_tiny(4)


@pytest.fixture(scope="module")
def corpus(model):
    rows = sampled_corpus(model, 36, 14, seed=2)
    rows[5] = rows[5][:10]  # ragged: padding must never enter
    return rows


@pytest.fixture(scope="module")
def study(model, corpus):
    result = decompose(model, corpus[12:], corpus[:12], CONFIG, name="tiny", options=TINY_RUN.replace(batch_size=5))
    return {**result.to_dict()["models"]["tiny"], "_runs": result.runs["tiny"]}


def test_the_paired_phantom_with_bos_value_is_bos_first(study):
    """Rotary model: the same loss, spread and collapse as <bos> first, so it recovers
    all of the planted cost; no <bos> recovers none; the value-less <bos> and the
    phantom's zero value cost something."""
    c = study["conditions"]
    assert c["none"]["vs_bos"]["loss"][1] > 0  # the planted cost
    assert c["phantom_bos_value"]["loss"][0] == pytest.approx(c["bos"]["loss"][0], rel=1e-6)
    assert c["phantom_bos_value"]["recovery"][0] == pytest.approx(1.0, abs=1e-4)
    assert c["none"]["recovery"][0] == 0.0
    assert c["phantom_bos_value"]["spread"][0] == pytest.approx(c["bos"]["spread"][0], abs=1e-5)
    runs = study["_runs"]
    assert torch.allclose(runs.collapse["phantom_bos_value"], runs.collapse["bos"], atol=1e-5)
    assert torch.allclose(runs.sink_mass["phantom_bos_value"], runs.sink_mass["bos"], atol=1e-6)
    assert float(runs.sink_mass["none"].abs().max()) == 0.0 and float(runs.sink_mass["bias"].abs().max()) == 0.0
    assert c["phantom"]["vs_bos"]["loss"][0] != pytest.approx(0.0, abs=1e-4)


def test_the_design_adds_up(study):
    """Removing both = mass alone + value alone + interaction, prompt by prompt; each
    effect is the paired difference of the conditions the design names."""
    d, c = study["design"], study["conditions"]
    assert d["both"][0] == pytest.approx(d["mass_alone"][0] + d["value_alone"][0] + d["interaction"][0], abs=1e-9)
    assert d["both"][0] == pytest.approx(c["none"]["loss"][0] - c["phantom_bos_value"]["loss"][0], abs=1e-9)
    assert d["mass_alone"][0] == pytest.approx(c["bias"]["loss"][0] - c["phantom_bos_value"]["loss"][0], abs=1e-9)
    assert d["value_alone"][0] == pytest.approx(c["phantom"]["loss"][0] - c["phantom_bos_value"]["loss"][0], abs=1e-9)
    for k in ("mass", "value", "interaction"):
        assert d[k][1] <= d[k][0] <= d[k][2]


def test_bos_first_is_the_first_token_study(model, corpus, study):
    """The reference run against `first_token_study`'s own pass with <bos> first
    (loss on the same content targets, spread after the same swap), and its sink
    mass against `bos_mass`."""
    runs = study["_runs"]
    prompts = corpus[12:]
    ft = first_token_study(model, prompts, {"bos": [TINY_BOS]}, max_tokens=14, swap_position=4, options=TINY_RUN)
    nll = runs.nll["bos"]
    assert torch.allclose(torch.where(nll.isnan(), 0.0, nll).sum(1), ft.prompt_loss["bos"], rtol=1e-5)
    assert torch.allclose(runs.spread["bos"].mean(1).double(), ft.spread["bos"], atol=1e-5)
    none = tokenize(model, prompts, bos="none", max_tokens=14)
    assert torch.allclose(runs.sink_mass["bos"], bos_mass(model, none, TINY_BOS, TINY_RUN), atol=1e-6)


def test_moved_bos_scores_its_targets_and_pairs_on_them(model, corpus, study):
    """<bos> after K: the loss leaves content token K out, as `sink_scores` does, and
    is paired with <bos> first on those same targets."""
    runs = study["_runs"]
    for K in (1, 3):
        got = runs.nll[f"bos_at_{K}"]
        ref = sink_scores(model, corpus[12:], bos="prepend", bos_position=K, loss=True, max_tokens=14,
                          options=TINY_RUN)
        assert torch.allclose(torch.where(got.isnan(), 0.0, got).sum(1), ref.prompt_loss, rtol=1e-5)
        assert got[:, K].isnan().all()
        e = study["conditions"][f"bos_at_{K}"]
        base = runs.nll["bos"].clone()
        base[:, K] = float("nan")
        want = (torch.nansum(got, 1) - torch.nansum(base, 1)).sum() / (~got.isnan()).sum()
        assert e["vs_bos"]["loss"][0] == pytest.approx(float(want), rel=1e-9)
        assert "recovery" not in e


def test_layers_and_heads(model, study):
    """Two layers: the phantom in layer 0 alone is the phantom in all layers but 1; the
    top 8 heads of the tiny model are all of them, so they recover all of the cost."""
    layers = study["layers"]["bos"]
    assert layers["one"][0] == pytest.approx(layers["all_but"][1])
    assert layers["one"][1] == pytest.approx(layers["all_but"][0])
    assert study["heads"]["top_k"]["8"]["bos"][0] == pytest.approx(1.0, abs=1e-4)
    assert len(study["heads"]["top"]) == 8 and set(study["heads"]["top_k"]) == {"1", "2", "8"}
    assert study["heads"]["top_k"]["1"]["zero"] is not None


def test_the_study_runs_from_its_config(monkeypatch, tmp_path):
    """`run` from a Config on a prompt file: the config it ran is in the result, the
    learned-sink files become conditions (their fitting prompts refused), the
    findings sit under <model>.decomposition, the figures are drawn, pieces merge."""
    from helpers.tiny import serve_tiny

    from sinkmech.interventions.fit_sinks import FitSettings, fit_sinks
    from sinkmech.plots.decomposition import decomposition_figures
    from sinkmech.studies.decomposition import run

    model = serve_tiny(monkeypatch, 3)
    words = [" ".join(f"w{(i * 7 + j * 3) % 40 + 3}" for j in range(12)) for i in range(14)]
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(words))
    fit = tokenize(model, words[:4], bos="none", max_tokens=12)
    fitted = fit_sinks(model, fit, FitSettings(steps=2), fit_prompts=tuple(words[:4]), options=QUIET)
    (tmp_path / "tiny_head.json").write_text(json.dumps(fitted.to_dict()))
    config = DecompositionConfig(models=("tiny",), prompts=str(prompts), n_prompts=8, first_prompt=6, select_prompts=4,
                                 max_tokens=12, positions=(2,), top_k=(1,), layer_values=("bos",),
                                 learned_files=(str(tmp_path / "{model}_head.json"),), parts=("main", "layers", "all_but"))
    assert STUDIES["decomposition"] is DecompositionConfig
    result = run(model, config, QUIET)
    d = result.to_dict()
    assert d["config"] == config.to_dict() and DecompositionConfig.from_dict(d["config"]) == config
    section = d["models"]["tiny"]
    assert result.documents is None  # a prompt file: each prompt its own unit
    assert section["n_documents"] == 8 and section["interval"] == "95 % bca bootstrap over the 8 prompts"
    assert "learned_head" in section["conditions"] and "bos_at_2" not in section["conditions"]
    flat = result.findings()["tiny.decomposition"]
    assert "tiny.decomposition.phantom.vs_bos.loss.0" in flat and "tiny.decomposition.design.interaction.0" in flat
    paths = decomposition_figures(d, tmp_path / "fig")
    assert {p.suffix for p in paths} == {".png", ".svg"} and all(p.stat().st_size > 0 for p in paths)
    moved = run(model, config.replace(parts=("moved",)))
    both = merge([d, moved.to_dict()])
    assert set(both["config"]["parts"]) == {"main", "layers", "all_but", "moved"}
    assert {"bos_at_2", "learned_head", "phantom"} <= set(both["models"]["tiny"]["conditions"])
    with pytest.raises(ValueError, match="fitted on"):
        run(model, config.replace(first_prompt=2, select_prompts=2))
    apart = merge([run(model, config.replace(parts=("layers",))).to_dict(),
                   run(model, config.replace(parts=("all_but",))).to_dict()])
    assert apart["models"]["tiny"]["layers"] == section["layers"]


def test_windows_of_one_document_are_resampled_together(model, corpus):
    """Held-out prompts that share documents: every interval is the cluster bootstrap over
    the documents (the section says how many); a document per prompt is the bootstrap
    over prompts, resample for resample."""
    result = decompose(model, corpus[12:], corpus[:12], CONFIG.replace(top_k=(), layer_values=()), name="tiny",
                       options=TINY_RUN.replace(batch_size=8))
    runs, n_prompts = result.runs["tiny"], len(corpus) - 12
    pairs = [f"doc{i // 2}" for i in range(n_prompts)]
    by_doc = summarise(runs, CONFIG, n_layers=model.cfg.n_layers, groups=pairs)
    by_prompt = summarise(runs, CONFIG, n_layers=model.cfg.n_layers)
    assert by_doc["n_documents"] == n_prompts // 2 and by_prompt["n_documents"] == n_prompts
    assert by_doc["interval"] == f"95 % bca bootstrap over the {n_prompts // 2} documents the {n_prompts} prompts were cut from"
    loss, n = _loss_sums(runs.nll["none"])
    base = _loss_sums(runs.nll["bos"])[0]
    assert by_doc["conditions"]["none"]["vs_bos"]["loss"] == ratio_with_ci(loss - base, n, groups=pairs)
    assert by_doc["conditions"]["none"]["vs_bos"]["loss"] != by_prompt["conditions"]["none"]["vs_bos"]["loss"]
    assert by_doc["conditions"]["none"]["vs_bos"]["loss"][0] == by_prompt["conditions"]["none"]["vs_bos"]["loss"][0]
    own = summarise(runs, CONFIG, n_layers=model.cfg.n_layers, groups=[f"doc{i}" for i in range(n_prompts)])
    assert own["conditions"] == by_prompt["conditions"] and own["design"] == by_prompt["design"]
    a, b, c = (by_doc["design"][k] for k in ("mass", "value", "interaction"))
    assert all(x[1] <= x[0] <= x[2] for x in (a, b, c))


def test_a_named_corpus_gives_each_window_its_document():
    from sinkmech.corpora import corpus, corpus_windows, load_prompts

    default = corpus_windows(None)
    assert default == corpus() and list(default.prompts) == load_prompts(None)
    assert corpus_windows("licenses").domain == "licenses"
    assert corpus_windows("prompts.txt") is None and corpus_windows(["a b c"]) is None
    held_out = default.part(64, 128)
    assert held_out.n_documents < len(held_out)  # the default held-out prompts share documents
