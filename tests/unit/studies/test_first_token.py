"""First-token substitution: each prefix against the hand-built sequence run
directly, the spread against `perturbation_spread`, the pairing, the study from
its Config, and (slow) every substituted first token against transformers on Gemma."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from helpers.tiny import TINY_BOS
from helpers.tolerance import TINY_FORWARD, assert_normwise
from sinkmech.studies.first_token import first_token_study
from sinkmech.interventions.perturb import corpus_swaps, perturbation_spread
from sinkmech.options import QUIET, RunOptions

PREFIXES = {"bos": [TINY_BOS], "other": [7], "bos_bos": [TINY_BOS, TINY_BOS], "none": []}


@pytest.fixture(scope="module")
def rows(tiny_tokens):
    r = tiny_tokens[:5].tolist()
    r[2] = r[2][:9]  # ragged: padding must never enter
    return r


@pytest.fixture(scope="module")
def runs(tiny_model, rows):
    return first_token_study(tiny_model, rows, PREFIXES, swap_position=3,
                             options=RunOptions(batch_size=2))


def test_each_prefix_equals_the_hand_built_sequence(tiny_model, rows, runs):
    for name, prefix in PREFIXES.items():
        m = len(prefix)
        for p, row in enumerate(rows):
            with torch.no_grad():
                logits, cache = tiny_model.run_with_cache(torch.tensor([prefix + row]))
            for l in range(tiny_model.cfg.n_layers):  # batches of 2 against the prompt alone: the forward bound
                assert torch.allclose(runs.scores[name][p, l], cache["pattern", l][0, :, :, 0].mean(-1),
                                      atol=TINY_FORWARD, rtol=0)
            logp = torch.log_softmax(logits[0].double(), -1)
            # content token j sits at m + j and is predicted from m + j - 1, for j = 1 .. n-1
            nll = -sum(logp[m + j - 1, row[j]] for j in range(1, len(row)))
            assert float(runs.prompt_loss[name][p]) == pytest.approx(float(nll), rel=TINY_FORWARD)
    assert runs.targets.tolist() == [len(r) - 1 for r in rows]


def test_spread_equals_perturbation_spread(tiny_model, rows, runs):
    """With one first token (or none) the spread is `perturbation_spread`'s per-prompt mean change over layers."""
    swaps = corpus_swaps(rows, 3)
    for name, bos_id in (("bos", TINY_BOS), ("other", 7)):
        ref = perturbation_spread(tiny_model, rows, perturbation=swaps,
                                  options=RunOptions(progress=False, bos_token_id=bos_id))
        per = ref.per_prompt()["mean_change"].mean(-1)  # [bos, prompt]
        assert_normwise(runs.spread[name].float(), per[0], TINY_FORWARD)  # passes batched otherwise
        assert_normwise(runs.spread["none"].float(), per[1], TINY_FORWARD)


def test_contrasts_are_paired_against_bos(tiny_model, rows, runs):
    e = runs.entry("other")
    assert e["vs_bos"]["loss"][0] == pytest.approx(
        float((runs.prompt_loss["other"] - runs.prompt_loss["bos"]).sum() / runs.targets.sum()))
    diff = (runs.spread["other"] - runs.spread["bos"]).mean()
    assert e["vs_bos"]["spread"][0] == pytest.approx(float(diff))
    lo, hi = e["vs_bos"]["spread"][1:]
    assert lo <= e["vs_bos"]["spread"][0] <= hi
    assert "vs_bos" not in runs.entry("bos")
    # the same first token twice under two names: every paired difference is exactly 0
    same = first_token_study(tiny_model, rows, {"bos": [TINY_BOS], "again": [TINY_BOS]}, swap_position=3,
                             options=QUIET).entry("again")["vs_bos"]
    assert same["loss"] == [0.0, 0.0, 0.0] and same["spread"] == [0.0, 0.0, 0.0]
    assert set(runs.to_dict()["first_tokens"]) == set(PREFIXES)


def test_bad_first_tokens_are_refused(tiny_model, rows):
    with pytest.raises(ValueError, match="must lie in"):
        first_token_study(tiny_model, rows, {"bos": [999]}, options=QUIET)
    with pytest.raises(ValueError, match="swap_position"):
        first_token_study(tiny_model, rows, PREFIXES, swap_position=8, options=QUIET)


@pytest.mark.slow
def test_gemma_first_tokens_match_transformers(gemma, gemma_transformers):
    """Every substituted first token of the first-token study on Gemma 3 270M:
    alpha_0 within 2e-3 and the content-target loss within 1e-3 nats of
    transformers' own eager Gemma on the same ids (default-corpus windows 120-121)."""
    from sinkmech.corpora import default_corpus
    from sinkmech.prompts import tokenize

    from sinkmech.studies.first_token import first_tokens

    prefixes, _ = first_tokens(gemma)
    prompts = default_corpus()[120:122]
    runs = first_token_study(gemma, prompts, prefixes, max_tokens=24, options=QUIET)
    hf = gemma_transformers
    rows = tokenize(gemma, prompts, bos="none", max_tokens=24).content()
    for name, prefix in prefixes.items():
        m = len(prefix)
        for p, row in enumerate(rows):
            with torch.no_grad():
                out = hf(torch.tensor([prefix + row]), output_attentions=True)
            alpha = torch.stack([a[0, :, :, 0].mean(-1) for a in out.attentions])  # [layer, head]
            assert (runs.scores[name][p] - alpha).abs().max() < 2e-3, name
            logp = torch.log_softmax(out.logits[0].double(), -1)
            nll = -sum(logp[m + j - 1, row[j]] for j in range(1, len(row)))
            assert abs(float(runs.prompt_loss[name][p]) - float(nll)) / (len(row) - 1) < 1e-3, name


def test_the_study_runs_from_its_config(tiny_model, monkeypatch):
    """`run` records the config it ran and writes its findings under <model>.first_token
    (the tiny model has no rare word or newline token: its first tokens are given)."""
    from sinkmech.studies import first_token
    from sinkmech.studies.configs import FirstTokenConfig

    monkeypatch.setattr(first_token, "first_tokens", lambda model: ({"bos": [TINY_BOS], "none": []}, {"pad": "none"}))
    from helpers.tiny import toy_tokenizer

    from helpers.tiny import serve_windows

    windows = serve_windows(monkeypatch, 6)

    class Tok:
        def decode(self, ids):
            return f"[{ids[0]}]"

    toy_tokenizer(monkeypatch, tiny_model, Tok())
    config = FirstTokenConfig(models=("tiny",), n_prompts=4, max_tokens=7, swap_position=2)
    result = first_token.run(tiny_model, config, QUIET)
    d = result.to_dict()
    assert d["config"] == config.to_dict() and set(d["tiny"]["first_token"]) == {"bos", "none"}
    assert d["tiny"]["first_token_skipped"] == {"pad": "none"} and d["tiny"]["first_token"]["bos"]["text"] == "[1]"
    flat = result.findings()["tiny.first_token"]
    assert "tiny.first_token.none.vs_bos.loss.0" in flat
    # windows of one document are resampled together: 4 prompts, 2 documents
    assert d["tiny"]["n_documents"] == 2 and d["tiny"]["interval"] == "95 % bca bootstrap over the 2 documents the 4 prompts were cut from"
    runs = first_token_study(tiny_model, [list(p) for p in windows.prompts[:4]], {"bos": [TINY_BOS], "none": []},
                             max_tokens=7, swap_position=2, options=QUIET)
    grouped = replace(runs, documents=("d0", "d0", "d1", "d1")).to_dict()["first_tokens"]["none"]
    assert d["tiny"]["first_token"]["none"]["vs_bos"]["loss"] == grouped["vs_bos"]["loss"]
