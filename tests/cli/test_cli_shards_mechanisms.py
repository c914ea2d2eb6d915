"""`--shard I/N` then `sinkmech merge` writes what the unsharded command writes:
massive (--no-reset), patch, perturb, sinks --keys all, on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.shards import TINY_FLOAT32_RTOL, assert_same_json, error_line, shard_model, word_prompts

from sinkmech.cli.main import main


@pytest.fixture
def cli_model(monkeypatch):
    return shard_model(monkeypatch)


@pytest.fixture
def prompts(tmp_path):
    return word_prompts(tmp_path)


def shards_merge_to_the_unsharded_json(args: list[str], tmp_path, n: int) -> dict:
    """Run `args` whole and in n shards, merge the parts (in reverse order) and
    check the two JSONs agree (floats to the tiny model's forward bound: a shard batches its own
    prompts, so its float32 passes have other shapes); returns the unsharded JSON."""
    full = tmp_path / "full.json"
    assert main([*args, "--json", str(full)]) == 0
    parts = [tmp_path / f"p{i}.partial.json" for i in range(1, n + 1)]
    for i, p in enumerate(parts, 1):
        assert main([*args, "--shard", f"{i}/{n}", "--json", str(p)]) == 0
    out, png = tmp_path / "merged.json", tmp_path / "merged.png"
    assert main(["merge", *map(str, reversed(parts)), "--json", str(out), "--png", str(png)]) == 0
    a = json.loads(full.read_text())
    assert_same_json(a, json.loads(out.read_text()), tol=TINY_FLOAT32_RTOL)
    assert png.stat().st_size > 0
    return a


# One split of each contract in the fast suite, the others in `make test` (slow).
SLOW = pytest.mark.slow


@pytest.mark.parametrize("n", [pytest.param(2, marks=SLOW), 3])
def test_massive_shards_merge_to_the_unsharded_json(cli_model, prompts, tmp_path, n):
    # threshold 0.5: the tiny models' first-token norm ratios lie near 1 (0.9-1.0 on
    # the Bridge's), so an onset exists on both backends and its dims merge too
    a = shards_merge_to_the_unsharded_json(["massive", "--prompts", prompts, "--max-tokens", "12", "--no-reset",
                                            "--threshold", "0.5", "--batch-size", "2"], tmp_path, n)
    assert a["onset_layer"] is not None and a["n_prompts"] == 9


def test_massive_refuses_to_shard_the_reset(prompts, tmp_path, capsys):
    assert main(["massive", "--prompts", prompts, "--shard", "1/2", "--json", str(tmp_path / "m.partial.json")]) == 2
    assert "--no-reset" in error_line(capsys)


@pytest.mark.parametrize(("extra", "n"), [pytest.param(["--act", "resid_pre"], 3, marks=SLOW),
                                          (["--act", "z", "--source", "prepend"], 2),
                                          # the loss: a mean over content targets, weighted by them
                                          pytest.param(["--act", "resid_pre", "--metric", "loss"], 3, marks=SLOW)])
def test_patch_shards_merge_to_the_unsharded_json(cli_model, prompts, tmp_path, extra, n):
    """Per position (layer_pos: some shards lack the corpus' last positions) and per head."""
    a = shards_merge_to_the_unsharded_json(["patch", "--prompts", prompts, "--max-tokens", "16", *extra], tmp_path, n)
    assert a["max_tokens"] == 15  # prompt 3 (shard 2 of 3) alone is that long
    assert max(abs(v) for r in a["results"].values() for row in r["values"] for v in row) > 1e-3


@pytest.mark.parametrize("extra", [["--noise", "0.5", "--position", "2", "--seed", "3"],
                                   pytest.param(["--swap", "cat", "dogs"], marks=SLOW)])
def test_perturb_shards_merge_to_the_unsharded_json(cli_model, prompts, tmp_path, extra):
    """Noise: every shard draws the noise the whole corpus' run draws for its prompts."""
    if "--swap" in extra:  # every prompt holds the swapped word
        lines = Path(prompts).read_text().splitlines()
        prompts = str(tmp_path / "cat.txt")
        Path(prompts).write_text("\n".join(f"one cat {line}" for line in lines) + "\n")
    a = shards_merge_to_the_unsharded_json(["perturb", "--prompts", prompts, "--max-tokens", "16", *extra], tmp_path, 3)
    assert a["n_prompts"] == 9 and max(a["per_layer"]["prepend"]["mean_change"]) > 1e-3


def test_perturb_refuses_to_shard_the_sensitivity_study(prompts, tmp_path, capsys):
    assert main(["perturb", "--prompts", prompts, "--noise", "0.5", "--position", "1", "--sensitivity", "--shard", "1/2",
                 "--json", str(tmp_path / "p.partial.json")]) == 2
    assert "--sensitivity" in error_line(capsys)


@pytest.mark.parametrize("n", [pytest.param(2, marks=SLOW), 3])
def test_sinks_keys_all_shards_merge_to_the_unsharded_json(cli_model, prompts, tmp_path, n):
    """The top keys name their prompt by its index in the whole corpus."""
    a = shards_merge_to_the_unsharded_json(["sinks", "--prompts", prompts, "--max-tokens", "12", "--bos", "both",
                                            "--keys", "all", "--min-queries", "2", "--batch-size", "2"], tmp_path, n)
    tops = [k["prompt"] for c in a["conditions"].values() for row in c["key_scores"] for keys in row for k in keys]
    assert max(tops) >= 6  # some top key lies in the last shard
