"""`sinkmech length` in two sharded stages: `--shard I/N` (the scores), then
`--shard I/N --scores PARTS...` (the chosen heads' costs), then `sinkmech merge`
writes the JSON and the table the unsharded command writes; bad parts and flags
are refused with one `error:` line before any model loads."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from helpers.shards import TINY_FLOAT32_RTOL, assert_same_json, error_line, shard_model, word_prompts

from sinkmech.cli.main import main
from sinkmech.sharding.format import read_partial, write_partial

# 6 windows of the default corpus (the word tokenizer: 63 content tokens each, the context's limit); 100 is skipped
LENGTH = ["length", "--lengths", "4", "8", "16", "100", "--n-prompts", "6", "--top", "2", "--batch-size", "2"]


@pytest.fixture
def cli_model(monkeypatch):
    return shard_model(monkeypatch)


def table(out: str) -> list[str]:
    """The printed table, without the lines naming written files."""
    return [line for line in out.splitlines() if not line.startswith("wrote ")]


def two_stages(tmp_path, n: int, args=LENGTH, stage2_n: int | None = None) -> tuple[list, list]:
    """Stage 1 in n shards, stage 2 in `stage2_n` (default n) on all of stage 1's parts (given in reverse)."""
    scores = [tmp_path / f"s{i}.partial.json" for i in range(1, n + 1)]
    for i, p in enumerate(scores, 1):
        assert main([*args, "--shard", f"{i}/{n}", "--json", str(p)]) == 0
    m = stage2_n or n
    costs = [tmp_path / f"c{i}.partial.json" for i in range(1, m + 1)]
    for i, p in enumerate(costs, 1):
        assert main([*args, "--shard", f"{i}/{m}", "--scores", *map(str, reversed(scores)), "--json", str(p)]) == 0
    return scores, costs


@pytest.mark.parametrize(("n", "stage2_n"), [pytest.param(1, 1, marks=pytest.mark.slow),  # one split in the fast suite
                                             pytest.param(2, 2, marks=pytest.mark.slow), (3, 2)])
def test_two_stage_recipe_merges_to_the_unsharded_json_and_table(cli_model, tmp_path, capsys, n, stage2_n):
    full, png = tmp_path / "full.json", tmp_path / "full.png"
    assert main([*LENGTH, "--json", str(full), "--png", str(png)]) == 0
    want = table(capsys.readouterr().out)
    _, costs = two_stages(tmp_path, n, stage2_n=stage2_n)
    capsys.readouterr()
    out, merged_png = tmp_path / "merged.json", tmp_path / "merged.png"
    assert main(["merge", *map(str, reversed(costs)), "--json", str(out), "--png", str(merged_png)]) == 0
    assert table(capsys.readouterr().out) == want
    a, b = json.loads(full.read_text()), json.loads(out.read_text())
    assert [r["length"] for r in a["results"]] == [4, 8, 16] and a["skipped"][0]["length"] == 100
    assert a["n_prompts"] == 6 and max(h["mask_first_cost"] for r in a["results"] for h in r["top_heads"]) > 1e-4
    assert [[(h["layer"], h["head"]) for h in r["top_heads"]] for r in a["results"]] == \
        [[(h["layer"], h["head"]) for h in r["top_heads"]] for r in b["results"]]
    assert_same_json(a, b, tol=TINY_FLOAT32_RTOL)  # 2 shards batch prompt 2 without prompt 3
    assert merged_png.stat().st_size > 1000


@pytest.mark.slow
def test_a_named_head_and_resume_in_both_stages(cli_model, tmp_path, capsys):
    args = [*LENGTH[:-4], "--top", "1", "--head", "1.3", "--uniform-multiples", "1.5"]
    full = tmp_path / "full.json"
    assert main([*args, "--json", str(full)]) == 0
    scores, costs = two_stages(tmp_path, 2, args)
    before = [p.read_text() for p in (*scores, *costs)]
    capsys.readouterr()
    assert main([*args, "--shard", "1/2", "--json", str(scores[0]), "--resume"]) == 0
    assert main([*args, "--shard", "2/2", "--scores", *map(str, scores), "--json", str(costs[1]), "--resume"]) == 0
    assert capsys.readouterr().err.count("skipped (--resume)") == 2
    assert [p.read_text() for p in (*scores, *costs)] == before
    out = tmp_path / "merged.json"
    assert main(["merge", *map(str, costs), "--json", str(out)]) == 0
    b = json.loads(out.read_text())
    assert b["fixed_head"]["label"] == "L1.H3" and b["fixed_head"]["rule"] == "named by the caller"
    assert_same_json(json.loads(full.read_text()), b, tol=TINY_FLOAT32_RTOL)


@pytest.mark.slow
def test_bad_stages_are_refused_with_one_line_before_any_model_loads(cli_model, tmp_path, capsys, monkeypatch):
    scores, costs = two_stages(tmp_path, 3)
    sinks = tmp_path / "sinks.partial.json"
    prompts = word_prompts(tmp_path)
    assert main(["sinks", "--prompts", prompts, "--max-tokens", "8", "--shard", "1/1", "--json", str(sinks)]) == 0
    second = read_partial(costs[1])  # a stage-2 part of other chosen heads
    heads = {**second.settings["heads"], "fixed": [0, 0]}
    other = write_partial(tmp_path / "odd.partial.json", replace(second, settings={**second.settings, "heads": heads}))
    capsys.readouterr()
    monkeypatch.setattr("sinkmech.loading.models.load_model", lambda *a, **k: pytest.fail("loaded a model"))
    out = str(tmp_path / "c.partial.json")
    cases = [
        ([*LENGTH, "--scores", str(scores[0]), "--json", out], "needs --shard I/N"),
        ([*LENGTH, "--shard", "1/3", "--json", out, "--png", str(tmp_path / "a.png")], "merge"),
        ([*LENGTH, "--shard", "1/3", "--json", str(tmp_path / "c.json")], ".partial.json"),
        ([*LENGTH, "--shard", "1/7", "--json", out], "at least one prompt"),
        ([*LENGTH, "--resume", "--json", str(tmp_path / "r.json")], "--resume needs"),
        ([*LENGTH, "--shard", "1/3", "--scores", str(scores[0]), str(scores[2]), "--json", out], "missing shard 2/3"),
        ([*LENGTH, "--shard", "1/3", "--scores", str(sinks), "--json", out], "stage-1 parts"),
        ([*LENGTH, "--shard", "1/3", "--scores", *map(str, costs), "--json", out], "stage-1 parts"),
        ([*LENGTH[:-3], "1", *LENGTH[-2:], "--shard", "1/3", "--scores", *map(str, scores), "--json", out],
         "another 'top_k'"),
        (["merge", *map(str, scores), "--json", str(tmp_path / "m.json")], "run stage 2"),
        (["merge", str(costs[0]), str(other), str(costs[2]), "--json", str(tmp_path / "m.json")],
         "setting 'heads.fixed'"),
    ]
    try:
        import ray  # noqa: F401
    except ImportError:
        cases.append(([*LENGTH, "--ray"], "pip install"))
    else:
        cases.append(([*LENGTH, "--ray", "--scores", str(scores[0])], "both stages"))
    for argv, message in cases:
        assert main(argv) == 2, argv
        assert message in error_line(capsys), argv
    assert not (tmp_path / "m.json").exists() and not (tmp_path / "c.partial.json").exists()
