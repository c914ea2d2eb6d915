"""`sinkmech stream | massive | length` and `sinks --keys all`: flags checked
before the model loads, the JSON contracts on the tiny model (its token ids
stand in for the tokenizer), and one end-to-end run on SmolLM2."""

from __future__ import annotations

import json
import math

import pytest
import torch

from sinkmech.loading.backend import CAPABILITIES
import sinkmech.cli.stream as stream_cmd
from helpers.tiny import TINY_BOS
from sinkmech.loading import models
from sinkmech.cli.main import main
from sinkmech.context.length import sinks_vs_length
from sinkmech.measures.key_sinks import key_sink_scores
from sinkmech.prompts import token_text, tokenize
from sinkmech.context.stream import stream_perplexity
from sinkmech.options import QUIET

IDS = torch.randint(2, 50, (6, 60), generator=torch.Generator().manual_seed(3))


@pytest.fixture
def never_load(monkeypatch):
    def never(*a, **k):
        raise AssertionError("the model was loaded before the flags were checked")

    monkeypatch.setattr(models, "load_model", never)


@pytest.mark.parametrize("argv, message", [
    (["stream", "--window", "0"], "--window must be >= 1"),
    (["stream", "--keep", "0", "-1"], "--keep must be >= 0"),
    (["stream", "--max-tokens", "0"], "--max-tokens must be >= 1"),
    (["stream", "--window", "32", "--keep", "4", "--max-tokens", "36"], "no token left to score"),
    (["stream", "--bos", "none", "--window", "8", "--keep", "0", "--max-tokens", "9"], "no token left to score"),
    (["stream", "--png", "out.txt"], "--png must end in"),
    (["sinks", "--keys", "all", "--top-keys", "0"], "--top-keys must be >= 1"),
    (["sinks", "--keys", "all", "--min-queries", "0"], "--min-queries must be >= 1"),
    (["massive", "--threshold", "0"], "--threshold must be > 0"),
    (["massive", "--top", "0"], "--top must be >= 1"),
    (["length", "--lengths", "64", "1"], "--lengths must be >= 2"),
    (["length", "--n-prompts", "0"], "--n-prompts must be >= 1"),
])
def test_bad_flags_fail_before_the_model_loads(argv, message, never_load, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_stream_needs_one_scored_token_exactly():
    # W + max(K) must be < positions - 1: 36 content tokens + <bos> = 37 positions
    assert stream_cmd.check_stream_args(32, [0, 3], 36, "prepend") == 35
    with pytest.raises(Exception, match="raise --max-tokens above 36"):
        stream_cmd.check_stream_args(32, [0, 4], 36, "prepend")


@pytest.fixture
def tiny_cli(tiny_model, monkeypatch):
    """The CLI on the tiny model: token ids instead of the tokenizer's text (patched where
    they are defined: each command imports them when it runs)."""
    monkeypatch.setattr(models, "load_model", lambda spec, **kw: tiny_model)
    monkeypatch.setattr("sinkmech.context.stream.long_tokens", lambda model, n, bos="prepend": tokenize(
        model, IDS[:1, :n], bos=bos, max_tokens=n, bos_token_id=TINY_BOS))
    monkeypatch.setattr("sinkmech.context.length.long_prompts", lambda model, n_prompts, n, bos="prepend": tokenize(
        model, IDS[:n_prompts], bos=bos, max_tokens=min(n, 60), bos_token_id=TINY_BOS))

    def by_ids(model, prompts, *, bos, max_tokens, **kw):
        return tokenize(model, IDS[: len(prompts)], bos=bos, max_tokens=max_tokens, bos_token_id=TINY_BOS)

    monkeypatch.setattr("sinkmech.prompts.tokenize", by_ids)
    return tiny_model


def test_stream_json_contract_and_beyond_context(tiny_cli, tmp_path, capsys):
    out = tmp_path / "s.json"
    assert main(["stream", "--window", "8", "--keep", "0", "1", "4", "--max-tokens", "40", "--json", str(out),
                 "--png", str(tmp_path / "s.png")]) == 0
    data = json.loads(out.read_text())
    assert set(data) == {"model", "window", "n_tokens", "scored_from", "full_ppl", "positions", "reindex", "results"}
    assert (data["window"], data["n_tokens"], data["scored_from"]) == (8, 41, 12)
    assert [r["keep"] for r in data["results"]] == [0, 1, 4]
    direct = stream_perplexity(tiny_cli, tokenize(tiny_cli, IDS[:1, :40], bos="prepend", max_tokens=40,
                                                  bos_token_id=TINY_BOS), window=8, keep=(0, 1, 4), options=QUIET)
    assert data["full_ppl"] == pytest.approx(direct.full_ppl)
    assert [r["ppl"] for r in data["results"]] == pytest.approx(list(direct.ppl))
    assert (tmp_path / "s.png").stat().st_size > 1000
    assert "last 8 + first 4" in capsys.readouterr().out
    found = tmp_path / "findings.json"
    assert main(["stream", "--window", "8", "--keep", "0", "4", "--max-tokens", "40", "--bos", "none",
                 "--findings", str(found)]) == 0
    f = json.loads(found.read_text())
    prefix = next(k.split(".stream.")[0] for k in f) + ".stream.none.w8"
    none = stream_perplexity(tiny_cli, tokenize(tiny_cli, IDS[:1, :40], bos="none", max_tokens=40,
                                                bos_token_id=TINY_BOS), window=8, keep=(0, 4), options=QUIET)
    assert f[f"{prefix}.full_ppl"] == pytest.approx(none.full_ppl)
    assert [f[f"{prefix}.results.{i}.ppl"] for i in range(2)] == pytest.approx(list(none.ppl))
    if not CAPABILITIES.can_reindex_cache:  # TL 4: refused with one error line
        assert main(["stream", "--window", "8", "--keep", "0", "4", "--max-tokens", "40", "--reindex"]) == 2
        assert "bridge" in capsys.readouterr().err
    else:
        assert main(["stream", "--window", "8", "--keep", "0", "4", "--max-tokens", "40", "--reindex", "--json",
                     str(out)]) == 0
        data = json.loads(out.read_text())
        direct = stream_perplexity(tiny_cli, tokenize(tiny_cli, IDS[:1, :40], bos="prepend", max_tokens=40,
                                                      bos_token_id=TINY_BOS), window=8, keep=(0, 4), reindex=True,
                                   options=QUIET)
        assert data["reindex"] is True and [r["ppl"] for r in data["results"]] == pytest.approx(list(direct.ppl))
        assert "positions: reindexed" in capsys.readouterr().out
    # 64 positions of context: 70 tokens are refused after the load, before any compute
    assert main(["stream", "--window", "8", "--max-tokens", "70"]) == 2
    assert "context of 64" in capsys.readouterr().err


def test_sinks_keys_all_adds_key_scores_and_keeps_the_contract(tiny_cli, tmp_path, capsys):
    first, every = tmp_path / "first.json", tmp_path / "all.json"
    base = ["sinks", "--n-prompts", "4", "--max-tokens", "24"]
    assert main([*base, "--json", str(first)]) == 0
    assert main([*base, "--keys", "all", "--top-keys", "3", "--json", str(every)]) == 0
    a, b = json.loads(first.read_text()), json.loads(every.read_text())
    label = token_text(tiny_cli)
    for c in ("prepend", "none"):
        assert "key_scores" not in a["conditions"][c]
        ks = b["conditions"][c].pop("key_scores")
        relative = {k: b["conditions"][c].pop(k) for k in ("min_excess", "uniform_by_position", "max_excess",
                                                           "strongest_relative_position", "off_first_rate_relative",
                                                           "relative_flagged")}
        assert b["conditions"][c] == a["conditions"][c]  # today's contract, untouched ("loss", "lengths" ...)
        assert "loss" in a["conditions"][c] and "lengths" in a["conditions"][c]
        assert len(ks) == 2 and all(len(row) == 4 for row in ks)
        batch = tokenize(tiny_cli, IDS[:4], bos=c, max_tokens=24, bos_token_id=TINY_BOS)
        direct = key_sink_scores(tiny_cli, batch, top_k=3, options=QUIET)
        for l in range(2):
            for h in range(4):
                top = ks[l][h]
                assert {"position", "token", "score"} <= set(top[0])
                assert [t["position"] for t in top] == direct.top_position[l, h].tolist()
                assert [t["score"] for t in top] == pytest.approx(direct.top_scores[l, h].tolist())
                # "[id]" on a model without a tokenizer (the HookedTransformer tiny model), its text otherwise
                assert top[0]["token"] == label(int(batch.tokens[top[0]["prompt"], top[0]["position"]]))
        assert relative["relative_flagged"] == [list(x) for x in direct.relative_flagged_heads()]
        assert sum(relative["max_excess"], []) == pytest.approx(direct.max_excess.flatten().tolist())
    out = capsys.readouterr().out
    assert "strongest key is not position 0" in out and "excess over its uniform share" in out


@pytest.mark.slow
def test_massive_and_length_write_their_tables(tiny_cli, tmp_path, capsys):
    m = tmp_path / "m.json"
    # the tiny model has no massive activation: low thresholds make every dimension pass
    assert main(["massive", "--n-prompts", "4", "--max-tokens", "16", "--threshold", "1.01", "--sun-min-abs", "0",
                 "--sun-min-ratio", "0", "--json", str(m), "--png", str(tmp_path / "m.png")]) == 0
    data = json.loads(m.read_text())
    assert data["onset_layer"] is not None and len(data["norm_ratio"]) == 3 and data["n_prompts"] == 4
    assert set(data["reset"]) == {"others_mean", "sun_mean"} and len(data["massive_dims"]) == 32
    for r in data["reset"].values():
        assert r["dims"] == data["massive_dims"] and math.isfinite(r["loss_reset"])
    assert "<- onset" in capsys.readouterr().out
    n = tmp_path / "l.json"
    assert main(["length", "--lengths", "8", "16", "100", "--n-prompts", "3", "--top", "2", "--json", str(n),
                 "--png", str(tmp_path / "l.png")]) == 0
    data = json.loads(n.read_text())
    assert [r["length"] for r in data["results"]] == [8, 16] and data["skipped"][0]["length"] == 100
    direct = sinks_vs_length(tiny_cli, tokenize(tiny_cli, IDS[:3], bos="prepend", max_tokens=60, bos_token_id=TINY_BOS),
                             lengths=[8, 16], top_k=2, options=QUIET)
    assert data["results"][1]["sink_rate"]["0.3"] == pytest.approx(float(direct.sink_rate[1, 0]))
    assert data["results"][1]["relative_sink_rate"]["4.0"] == pytest.approx(float(direct.relative_rate[1, 1]))
    assert data["fixed_head"]["chosen_at_length"] == 8
    assert (data["fixed_head"]["layer"], data["fixed_head"]["head"]) == (direct.fixed_layer, direct.fixed_head)
    assert (tmp_path / "l.png").stat().st_size > 1000
    assert "skipped 100" in capsys.readouterr().out
    assert main(["length", "--lengths", "8", "16", "--n-prompts", "3", "--top", "1", "--head", "1.3",
                 "--uniform-multiples", "1.5", "--json", str(n)]) == 0
    data = json.loads(n.read_text())
    assert data["fixed_head"]["label"] == "L1.H3" and data["uniform_multiples"] == [1.5]
    assert "fixed head L1.H3 (named by --head)" in capsys.readouterr().out


def test_smollm2_beyond_commands_end_to_end(smollm2, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(models, "load_model", lambda spec, **kw: smollm2)  # loaded once per test run
    s = tmp_path / "s.json"
    assert main(["stream", "--window", "8", "--keep", "0", "1", "--max-tokens", "48", "--json", str(s)]) == 0
    data = json.loads(s.read_text())
    ppl = {r["keep"]: r["ppl"] for r in data["results"]}
    assert data["n_tokens"] == 49 and ppl[0] > ppl[1]  # dropping <bos> from the window costs perplexity
    prompts = tmp_path / "p.txt"
    prompts.write_text("import os\nprint(os.getcwd())\nThe quick brown fox jumps over the lazy dog, twice.\n")
    k = tmp_path / "k.json"
    assert main(["sinks", "--keys", "all", "--prompts", str(prompts), "--max-tokens", "12", "--min-queries", "2",
                 "--json", str(k)]) == 0
    top = json.loads(k.read_text())["conditions"]["prepend"]["key_scores"]
    assert len(top) == 30 and len(top[5]) == 9 and isinstance(top[5][0][0]["token"], str)
    out = capsys.readouterr().out
    assert "strongest key is not position 0" in out
