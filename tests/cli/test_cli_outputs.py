"""Outputs, small corpora and prompts, the same for every command: a missing
output folder is created and said so; `heads` on a small prompts file picks a
split that fits before the model loads; `length` reads --prompts like every
command (checked against the sweep run directly on the same tokens)."""

from __future__ import annotations

import json

import pytest

from helpers.tiny import TINY_BOS
from sinkmech.loading import models
from sinkmech.cli.main import main
from sinkmech.context.length import sinks_vs_length
from sinkmech.prompts import tokenize
from test_cli_shards import assert_same_json
from sinkmech.options import QUIET

# Prompts written as token ids ("5 7 9 ..."): the tiny model has no tokenizer.
LONG = " ".join(str(2 + (7 * i) % 47) for i in range(30))
MID = " ".join(str(2 + (11 * i + 3) % 47) for i in range(30))
SHORT = " ".join(str(2 + (5 * i + 1) % 47) for i in range(12))


def ids(text: str) -> list[int]:
    return [int(w) for w in text.split()]


@pytest.fixture
def tiny_cli(tiny_model, monkeypatch):
    """The CLI on the tiny model, each prompt's words read as token ids."""
    def by_numbers(model, prompts, *, bos, max_tokens, **kw):
        return tokenize(model, [ids(p) for p in prompts], bos=bos, max_tokens=max_tokens, bos_token_id=TINY_BOS)

    monkeypatch.setattr(models, "load_model", lambda spec, **kw: tiny_model)
    monkeypatch.setattr("sinkmech.prompts.tokenize", by_numbers)
    return tiny_model


def test_a_missing_output_folder_is_created_and_said(tiny_cli, tmp_path, capsys):
    """The rule for every output: `sinks --json` and `merge --json` into folders that do not exist."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join([LONG, MID, SHORT]) + "\n")
    part = tmp_path / "parts" / "deep" / "s.partial.json"
    assert main(["sinks", "--prompts", str(prompts), "--max-tokens", "8", "--shard", "1/1", "--json", str(part)]) == 0
    assert part.is_file()
    assert f"note: the folder {part.parent} does not exist: it is created when s.partial.json is written" \
        in capsys.readouterr().err
    merged = tmp_path / "new" / "sub" / "merged.json"
    assert main(["merge", str(part), "--json", str(merged)]) == 0
    assert json.loads(merged.read_text())["n_prompts"] == 3
    err = capsys.readouterr().err
    assert f"note: the folder {merged.parent} does not exist" in err and f"wrote {merged}" in err
    assert main(["merge", str(part), "--json", str(merged)]) == 0  # the folder is there now: no note
    assert "note:" not in capsys.readouterr().err


def test_heads_on_a_small_file_splits_it_before_the_model_loads(tmp_path, monkeypatch, capsys):
    prompts = tmp_path / "p8.txt"
    prompts.write_text("\n".join(f"line {i} of a small corpus" for i in range(8)) + "\n")

    def stop(*a, **k):
        raise RuntimeError("stopped at the model load")

    monkeypatch.setattr(models, "load_model", stop)
    part = tmp_path / "h.partial.json"
    assert main(["heads", "--prompts", str(prompts), "--shard", "2/2", "--json", str(part)]) == 1
    err = capsys.readouterr().err
    assert "the scan takes the first 4 and the no-op check the last 4" in err and "stopped at the model load" in err
    # a --noop-prompts that cannot fit is refused before the model loads, naming the flag
    assert main(["heads", "--prompts", str(prompts), "--noop-prompts", "8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the corpus has 8 prompts") and "--noop-prompts" in err and "stopped" not in err


def test_length_reads_prompts_like_every_command(tiny_cli, tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join([LONG, MID, SHORT]) + "\n")
    out = tmp_path / "l.json"
    assert main(["length", "--prompts", str(prompts), "--lengths", "8", "16", "--top", "2", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["length"] for r in data["results"]] == [8]
    assert data["skipped"] == [{"length": 16, "reason": "the shortest prompt has 12 content tokens"}]
    batch = tokenize(tiny_cli, [ids(LONG), ids(MID), ids(SHORT)], bos="prepend", max_tokens=16,
                     bos_token_id=TINY_BOS)
    direct = sinks_vs_length(tiny_cli, batch, lengths=[8, 16], top_k=2, options=QUIET)
    assert data["results"][0]["sink_rate"]["0.3"] == pytest.approx(float(direct.sink_rate[0, 0]))
    assert (data["fixed_head"]["layer"], data["fixed_head"]["head"]) == (direct.fixed_layer, direct.fixed_head)
    assert main(["length", "--prompts", str(prompts), "--n-prompts", "2", "--lengths", "8", "16", "--top", "1",
                 "--json", str(out)]) == 0  # the two long prompts: 16 fits
    assert [r["length"] for r in json.loads(out.read_text())["results"]] == [8, 16]


def test_length_prompts_in_two_sharded_stages_merge_to_the_one_process_run(tiny_cli, tmp_path):
    """Shard 1 holds the two long prompts (16 fits there), shard 2 the short one: the
    merged corpus' shortest prompt skips 16, as the one-process run does."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join([LONG, MID, SHORT]) + "\n")
    args = ["length", "--prompts", str(prompts), "--lengths", "8", "16", "--top", "2"]
    full = tmp_path / "full.json"
    assert main([*args, "--json", str(full)]) == 0
    scores = [tmp_path / f"s{i}.partial.json" for i in (1, 2)]
    costs = [tmp_path / f"c{i}.partial.json" for i in (1, 2)]
    for i in (1, 2):
        assert main([*args, "--shard", f"{i}/2", "--json", str(scores[i - 1])]) == 0
    for i in (1, 2):
        assert main([*args, "--shard", f"{i}/2", "--scores", *map(str, scores), "--json", str(costs[i - 1])]) == 0
    merged = tmp_path / "merged.json"
    assert main(["merge", *map(str, costs), "--json", str(merged)]) == 0
    a, b = json.loads(full.read_text()), json.loads(merged.read_text())
    assert [r["length"] for r in b["results"]] == [8] and b["skipped"][0]["length"] == 16
    assert_same_json(a, b)
    # another prompts file is another corpus: stage 2 refuses stage 1's parts
    other = tmp_path / "q.txt"
    other.write_text("\n".join([MID, LONG, SHORT]) + "\n")
    assert main(["length", "--prompts", str(other), "--lengths", "8", "16", "--top", "2", "--shard", "1/2",
                 "--scores", *map(str, scores), "--json", str(tmp_path / "x.partial.json")]) == 2
