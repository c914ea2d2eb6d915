"""Fitted sink logits: the fit's gradient against finite differences of the loss
it descends, a planted `<bos>` cost (a corpus sampled from the model with `<bos>`
first) that the fitted sinks partly recover on held-out prompts, the seeded fit,
the top-k heads, the file `sinks --sink-logits` reads, and the fitting prompts
refused for evaluation; `sinkmech fit-sinks` end to end."""

from __future__ import annotations

import json

import pytest
import torch

from helpers.planted import sampled_corpus
from helpers.tiny import TINY_BOS, TINY_RUN, make_tiny, serve_tiny
from sinkmech.interventions.fit_sinks import (
    FitSettings, _batch_loss, bos_mass, evaluate_sinks, fit_sinks,
)
from sinkmech.interventions.phantom import PhantomSink, phantom_hooks
from sinkmech.interventions.sink_file import read_sink_file
from sinkmech.prompts import tokenize


@pytest.fixture(scope="module")
def model():
    return make_tiny(4)


@pytest.fixture(scope="module")
def corpus(model):
    return sampled_corpus(model, 64, 14, seed=1)


def batches(model, corpus):
    fit = tokenize(model, corpus[:40], bos="none", max_tokens=14)
    held = tokenize(model, corpus[40:], bos="none", max_tokens=14)
    return fit, held


def test_the_fit_descends_the_loss_it_says(model, corpus):
    """d loss / d b of the fit's loss (autograd through the frozen model, the
    unembedding recomputed in checkpointed chunks) against central finite
    differences of the same loss run without gradients (float64 sums of float32
    losses: step 1e-2, agreement to 2 %)."""
    fit, _ = batches(model, corpus)
    part = fit.slice(0, 4)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    b = torch.zeros(L, H, requires_grad=True)
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        total, n = _batch_loss(model, part, phantom_hooks(model, PhantomSink("logits", logits=b)))
        (total / n).backward()
    finally:
        for p in model.parameters():
            p.requires_grad_(True)

    def loss_at(x):
        with torch.no_grad():
            t, k = _batch_loss(model, part, phantom_hooks(model, PhantomSink("logits", logits=x)))
        return float(t) / k

    for l, h in ((0, 1), (1, 3)):
        step = torch.zeros(L, H)
        step[l, h] = 1e-2
        fd = (loss_at(b.detach() + step) - loss_at(b.detach() - step)) / 2e-2
        assert float(b.grad[l, h]) == pytest.approx(fd, rel=0.02, abs=1e-5)


def test_fitted_sinks_recover_part_of_a_planted_bos_cost(model, corpus):
    """On text the with-<bos> model wrote, removing <bos> costs loss; sinks with values
    fitted on 40 prompts give part of it back on 24 others (interval above zero; a
    random model's <bos> writes a large value, so logits alone need not)."""
    fit, held = batches(model, corpus)
    fitted = fit_sinks(model, fit, FitSettings(steps=40, lr=0.2, value=True), options=TINY_RUN)
    e = evaluate_sinks(model, held, fitted, options=TINY_RUN)
    assert e["vs_bos"]["none"][1] > 0  # the planted cost
    assert e["recovery"][1] > 0 and e["recovery"][0] < 1.5
    assert len(e["learned_mass"]) == model.cfg.n_layers and len(e["bos_mass"][0]) == model.cfg.n_heads
    # held-out windows cut from shared documents: the intervals resample the documents (same estimates)
    docs = tuple(f"doc{i // 4}" for i in range(len(held)))
    grouped = evaluate_sinks(model, held, fitted, options=TINY_RUN, documents=docs)
    assert grouped["n_documents"] == 6 and "6 documents" in grouped["interval"] and e["n_documents"] == len(held)
    assert grouped["recovery"][0] == pytest.approx(e["recovery"][0]) and grouped["recovery"][1:] != e["recovery"][1:]
    alone = evaluate_sinks(model, held, fitted, options=TINY_RUN, documents=tuple(map(str, range(len(held)))))
    assert alone["recovery"] == pytest.approx(e["recovery"])  # a document per prompt: the prompt bootstrap
    with pytest.raises(ValueError, match="documents for"):
        evaluate_sinks(model, held, fitted, options=TINY_RUN, documents=docs[:3])


def test_the_fit_is_seeded_and_keeps_its_settings(model, corpus):
    fit, _ = batches(model, corpus)
    s = FitSettings(steps=5, seed=3)
    a = fit_sinks(model, fit, s, options=TINY_RUN)
    b = fit_sinks(model, fit, s, options=TINY_RUN)
    c = fit_sinks(model, fit, FitSettings(steps=5, seed=4), options=TINY_RUN)
    assert torch.equal(a.logits, b.logits) and a.loss_trace == b.loss_trace
    assert not torch.equal(a.logits, c.logits)
    layer = fit_sinks(model, fit, FitSettings(steps=5, per="layer"), options=TINY_RUN)
    assert torch.equal(layer.logits, layer.logits[:, :1].expand_as(layer.logits))  # one logit per layer
    valued = fit_sinks(model, fit, FitSettings(steps=5, value=True), options=TINY_RUN)
    assert valued.values.shape == (model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)


def test_top_k_fits_the_heads_with_the_most_attention_on_bos(model, corpus):
    fit, _ = batches(model, corpus)
    fitted = fit_sinks(model, fit, FitSettings(steps=3, top_k=3), options=TINY_RUN)
    mass = bos_mass(model, fit, TINY_BOS, TINY_RUN).mean(0)
    want = mass.flatten().topk(3).indices.tolist()
    H = model.cfg.n_heads
    assert sorted(fitted.heads) == sorted((i // H, i % H) for i in want)
    finite = torch.isfinite(fitted.logits)
    assert int(finite.sum()) == 3 and all(finite[l, h] for l, h in fitted.heads)


def test_the_file_round_trips_and_refuses_its_fitting_prompts(model, corpus, tmp_path):
    fit, held = batches(model, corpus)
    fitted = fit_sinks(model, fit, FitSettings(steps=3, top_k=2, value=True),
                       fit_prompts=tuple(corpus[:40]), options=TINY_RUN)
    path = tmp_path / "f.json"
    path.write_text(json.dumps(fitted.to_dict()))
    f = read_sink_file(path)
    assert torch.equal(torch.tensor(f.logits), fitted.logits)  # null -> -inf where no sink
    assert torch.allclose(torch.tensor(f.values), fitted.values)
    f.check_shape(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
    with pytest.raises(ValueError, match="fitted on"):
        f.refuse_fitted(corpus[38:42])
    f.refuse_fitted(corpus[40:])
    with pytest.raises(ValueError, match="same tokens"):
        f.refuse_fitted_tokens(fit.content()[:2])
    with pytest.raises(ValueError, match="fitting prompts"):
        evaluate_sinks(model, fit, fitted, options=TINY_RUN)


def test_settings_refuse_what_cannot_be_fitted(model, corpus):
    with pytest.raises(ValueError, match="per head"):
        FitSettings(per="layer", top_k=2)
    with pytest.raises(ValueError, match="steps"):
        FitSettings(steps=0)
    with pytest.raises(ValueError, match="lr"):
        FitSettings(lr=float("nan"))
    fit, _ = batches(model, corpus)
    with pytest.raises(ValueError, match="more than"):
        fit_sinks(model, fit, FitSettings(top_k=99), options=TINY_RUN)
    with pytest.raises(ValueError, match="bos='none'"):
        fit_sinks(model, tokenize(model, corpus[:4], bos="prepend", bos_token_id=TINY_BOS), options=TINY_RUN)


@pytest.mark.parametrize("argv, message", [
    (["--per", "layer", "--top-k", "2"], "--top-k chooses heads"),
    (["--n-fit", "100", "--n-eval", "100"], "needs 200 prompts"),
    (["--n-eval", "1"], "--n-eval must be >= 2"),
    (["--lr", "0"], "--lr must be > 0"),
])
def test_fit_sinks_bad_flags_are_refused_before_the_model_loads(argv, message, monkeypatch, capsys, tmp_path):
    from sinkmech.cli import main
    from sinkmech.loading import models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(["fit-sinks", "--json", str(tmp_path / "f.json"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
    assert not (tmp_path / "f.json").exists()


def test_fit_sinks_cli_writes_the_file_sinks_reads(monkeypatch, tmp_path):
    """fit-sinks --json/--png/--findings on the tiny model, then sinks --sink-logits on
    held-out prompts (its fitting prompts refused)."""
    from sinkmech.cli import main

    serve_tiny(monkeypatch, 3)
    words = [" ".join(f"w{(i * 7 + j * 3) % 40 + 3}" for j in range(12)) for i in range(10)]
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(words))
    out, png, findings = tmp_path / "fit.json", tmp_path / "fit.png", tmp_path / "f.json"
    assert main(["fit-sinks", "--prompts", str(prompts), "--n-fit", "4", "--n-eval", "4", "--steps", "3",
                 "--json", str(out), "--png", str(png), "--findings", str(findings)]) == 0
    d = json.loads(out.read_text())
    assert d["fit_prompts"] == words[:4] and d["variant"] == "head" and d["evaluation"]["n_prompts"] == 4
    assert png.stat().st_size > 0
    assert any(k.endswith("fit_sinks.head.loss.fitted.0") for k in json.loads(findings.read_text()))
    held = tmp_path / "held.txt"
    held.write_text("\n".join(words[4:]))
    assert main(["sinks", "--prompts", str(held), "--bos", "none", "--sink-logits", str(out)]) == 0
    assert main(["sinks", "--prompts", str(prompts), "--bos", "none", "--sink-logits", str(out)]) == 2
