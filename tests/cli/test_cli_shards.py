"""`--shard I/N` then `sinkmech merge` writes what the unsharded command writes;
`--resume` skips finished shards; bad merges fail with one `error:` line."""

from __future__ import annotations

import json

import pytest
from helpers.shards import (
    EXACT_RTOL, FLOAT32_RTOL, TINY_FLOAT32_RTOL, assert_same_json, error_line, shard_model, word_prompts,
)

from sinkmech.cli.main import main


@pytest.fixture
def cli_model(monkeypatch):
    return shard_model(monkeypatch)


@pytest.fixture
def prompts(tmp_path):
    return word_prompts(tmp_path)


SINKS = ["sinks", "--max-tokens", "12", "--bos", "both", "--eps", "0.3", "0.5", "--batch-size", "2"]


def whole_and_two_shards(args: list[str], tmp_path) -> tuple[dict, dict]:
    """The command's JSON run whole, and its two shards merged (in reverse order)."""
    full = tmp_path / "full.json"
    assert main([*args, "--json", str(full)]) == 0
    parts = [tmp_path / f"s{i}.partial.json" for i in (1, 2)]
    for i, p in enumerate(parts, 1):
        assert main([*args, "--shard", f"{i}/2", "--json", str(p)]) == 0
    out = tmp_path / "merged.json"
    assert main(["merge", *map(str, reversed(parts)), "--json", str(out)]) == 0
    return json.loads(full.read_text()), json.loads(out.read_text())


# One split of each contract in the fast suite, the others in `make test` (slow).
SLOW = pytest.mark.slow


@pytest.mark.parametrize("n", [pytest.param(1, marks=SLOW), pytest.param(2, marks=SLOW), 3])
def test_sinks_shards_merge_to_the_unsharded_json(cli_model, prompts, tmp_path, n):
    full = tmp_path / "full.json"
    assert main([*SINKS, "--prompts", prompts, "--json", str(full)]) == 0
    parts = [tmp_path / f"s{i}.partial.json" for i in range(1, n + 1)]
    for i, p in enumerate(parts, 1):
        assert main([*SINKS, "--prompts", prompts, "--shard", f"{i}/{n}", "--json", str(p)]) == 0
    out, png = tmp_path / "merged.json", tmp_path / "merged.png"
    assert main(["merge", *map(str, reversed(parts)), "--json", str(out), "--png", str(png)]) == 0
    # one shard makes the whole run's passes; more batch a prompt with another neighbour
    tol = EXACT_RTOL if n == 1 else TINY_FLOAT32_RTOL
    assert_same_json(json.loads(full.read_text()), json.loads(out.read_text()), tol=tol)
    assert png.stat().st_size > 0


def test_sinks_bos_position_shards_merge_to_the_unsharded_json(cli_model, prompts, tmp_path):
    """<bos> moved after K content tokens: each shard moves it in its own prompts and keeps their
    scores on the <bos> key as rows, so the merge writes what the whole run writes (its shards
    batch their own prompts: the tiny model's forward bound)."""
    a, b = whole_and_two_shards([*SINKS, "--bos-position", "3", "--prompts", prompts], tmp_path)
    assert a["conditions"]["prepend"]["bos_position"] == 3 and "bos_position" not in a["conditions"]["none"]
    assert max(max(row) for row in a["conditions"]["prepend"]["bos_scores"]) > 0.1  # scores to compare
    assert_same_json(a, b, tol=TINY_FLOAT32_RTOL)


def test_resume_skips_a_finished_shard_and_reruns_a_changed_one(cli_model, prompts, tmp_path, capsys):
    part = tmp_path / "s1.partial.json"
    assert main([*SINKS, "--prompts", prompts, "--shard", "1/2", "--json", str(part)]) == 0
    before = part.read_text()
    capsys.readouterr()
    assert main([*SINKS, "--prompts", prompts, "--shard", "1/2", "--json", str(part), "--resume"]) == 0
    assert "skipped" in capsys.readouterr().err and part.read_text() == before
    # another max-tokens: the part on disk is not this shard's result, so it is run again
    assert main([*SINKS[:2], "10", *SINKS[3:], "--prompts", prompts, "--shard", "1/2", "--json", str(part),
                 "--resume"]) == 0
    assert "max_tokens" in capsys.readouterr().err and part.read_text() != before


def test_bad_merges_fail_with_one_error_line(cli_model, prompts, tmp_path, capsys):
    parts = [tmp_path / f"s{i}.partial.json" for i in (1, 2, 3)]
    for i, p in enumerate(parts, 1):
        assert main([*SINKS, "--prompts", prompts, "--shard", f"{i}/3", "--json", str(p)]) == 0
    other = tmp_path / "eps.partial.json"
    assert main([*SINKS[:6], "0.4", *SINKS[7:], "--prompts", prompts, "--shard", "2/3", "--json", str(other)]) == 0
    capsys.readouterr()
    out = str(tmp_path / "m.json")
    assert main(["merge", str(parts[0]), str(parts[2]), "--json", out]) == 2
    assert "missing shard 2/3" in error_line(capsys)
    assert main(["merge", str(parts[0]), str(parts[1]), str(parts[1]), str(parts[2]), "--json", out]) == 2
    assert "duplicate shard 2/3" in error_line(capsys)
    assert main(["merge", str(parts[0]), str(other), str(parts[2]), "--json", out]) == 2
    assert "setting 'eps'" in error_line(capsys)
    text = parts[1].read_text()
    parts[1].write_text(text[:-40])
    assert main(["merge", *map(str, parts), "--json", out]) == 2
    assert "truncated" in error_line(capsys)
    d = json.loads(text)
    d["format_version"] += 1
    parts[1].write_text(json.dumps(d))
    assert main(["merge", *map(str, parts), "--json", out]) == 2
    assert "upgrade sinkmech" in error_line(capsys)
    assert not (tmp_path / "m.json").exists()


def test_shard_flags_are_checked_before_the_model_loads(prompts, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sinkmech.loading.models.load_model", lambda *a, **k: pytest.fail("loaded a model"))
    base = [*SINKS, "--prompts", prompts]
    cases = [
        (["--shard", "4/3", "--json", str(tmp_path / "a.partial.json")], "1 <= I <= N"),
        (["--shard", "1/3", "--json", str(tmp_path / "a.json")], ".partial.json"),
        (["--shard", "1/3", "--json", str(tmp_path / "a.partial.json"), "--png", str(tmp_path / "a.png")], "merge"),
        (["--shard", "1/30", "--json", str(tmp_path / "a.partial.json")], "at least one prompt"),
        (["--resume", "--json", str(tmp_path / "a.json")], "--resume needs"),
    ]
    try:
        import ray  # noqa: F401
    except ImportError:
        cases.append((["--ray"], "pip install"))
    else:
        cases += [(["--ray", "--workers", "0"], "--workers"), (["--ray", "--shard", "1/2"], "give one of them"),
                  (["--ray", "--resume"], "needs --json")]
    for extra, message in cases:
        assert main([*base, *extra]) == 2
        assert message in error_line(capsys)


HEADS = ["heads", "--max-tokens", "12", "--batch-size", "2", "--min-count", "2", "--min-prompts", "1", "--noop", "2",
         "--noop-prompts", "4"]


@pytest.mark.parametrize("n", [pytest.param(2, marks=SLOW), 3])
def test_heads_shards_merge_to_the_unsharded_json(cli_model, prompts, tmp_path, n):
    """The merge runs the no-op check batched as the whole run batches it (`merge --batch-size`), so
    its passes are the whole run's: the check agrees to EXACT_RTOL. The scan's shards batch their own
    prompts (2 a pass): its float64 sums of float32 attention agree to the tiny model's forward bound."""
    full = tmp_path / "full.json"
    assert main([*HEADS, "--prompts", prompts, "--json", str(full)]) == 0
    parts = [tmp_path / f"h{i}.partial.json" for i in range(1, n + 1)]
    for i, p in enumerate(parts, 1):
        assert main([*HEADS, "--prompts", prompts, "--shard", f"{i}/{n}", "--json", str(p)]) == 0
    out = tmp_path / "merged.json"
    assert main(["merge", *map(str, parts[::-1]), "--batch-size", "2", "--json", str(out)]) == 0
    a, b = json.loads(full.read_text()), json.loads(out.read_text())
    assert a["noop"] is not None and a["mode_counts"] == b["mode_counts"]
    assert any(h["triggers"] for h in a["heads"])  # there are triggers to compare
    assert [(h["mode"], h["triggers"]) for h in a["heads"]] == [(h["mode"], h["triggers"]) for h in b["heads"]]
    assert_same_json(a["noop"], b["noop"])
    assert_same_json({k: v for k, v in a.items() if k != "noop"}, {k: v for k, v in b.items() if k != "noop"},
                     tol=TINY_FLOAT32_RTOL)


@pytest.mark.parametrize(("mode", "prompt_batch", "tol", "normwise"), [
    pytest.param("zero", [], TINY_FLOAT32_RTOL, True, id="all-zero"),
    pytest.param("mask_first", [], TINY_FLOAT32_RTOL, True, id="all-mask_first", marks=SLOW),
    pytest.param("zero", ["--prompt-batch", "1"], EXACT_RTOL, False, id="one-zero", marks=SLOW),
    pytest.param("mask_first", ["--prompt-batch", "1"], EXACT_RTOL, False, id="one-mask_first", marks=SLOW),
])
def test_ablate_shards_merge_to_the_unsharded_json(cli_model, prompts, tmp_path, mode, prompt_batch, tol, normwise):
    """By default (every prompt of a shard in one group of passes) to the tiny model's float32
    forward bound, normwise; with --prompt-batch 1 on both sides the shards make the whole run's
    passes and only the float64 means are added in another order (EXACT_RTOL)."""
    args = ["ablate", "--mode", mode, "--max-tokens", "12", "--prompts", prompts, *prompt_batch]
    full = tmp_path / "full.json"
    assert main([*args, "--json", str(full)]) == 0
    parts = [tmp_path / f"a{i}.partial.json" for i in (1, 2, 3)]
    for i, p in enumerate(parts, 1):
        assert main([*args, "--shard", f"{i}/3", "--json", str(p)]) == 0
    out = tmp_path / "merged.json"
    assert main(["merge", *map(str, parts[::-1]), "--json", str(out)]) == 0
    a, b = json.loads(full.read_text()), json.loads(out.read_text())
    assert max(max(row) for row in a["effects"]) > 1e-3  # the ablations do something to compare
    assert_same_json(a, b, tol=tol, normwise=normwise)


def test_ablate_prompt_batch_1_is_the_same_sweep_one_prompt_at_a_time(cli_model, prompts, tmp_path, capsys):
    """--prompt-batch 1 (each prompt in its own group of passes) gives the default's numbers (every
    prompt in one group, as --prompt-batch all) up to float32 batch rounding; a bad value is refused
    before the model loads."""
    args = ["ablate", "--mode", "zero", "--max-tokens", "12", "--prompts", prompts]
    every = tmp_path / "all.json"
    assert main([*args, "--json", str(every)]) == 0
    for n in ("1", "all"):
        one = tmp_path / f"{n}.json"
        assert main([*args, "--prompt-batch", n, "--json", str(one)]) == 0
        if n == "all":  # the default's passes
            assert json.loads(one.read_text()) == json.loads(every.read_text())
        assert_same_json(json.loads(every.read_text()), json.loads(one.read_text()), tol=TINY_FLOAT32_RTOL,
                         normwise=True)
    assert main([*args, "--prompt-batch", "some", "--json", str(every)]) == 2
    assert "--prompt-batch takes a whole number >= 1 or 'all'" in error_line(capsys)


def test_ablate_refuses_to_shard_what_needs_the_whole_corpus(prompts, tmp_path, capsys):
    for extra in (["--mode", "mean"], ["--mode", "zero", "--attribution"]):
        assert main(["ablate", *extra, "--prompts", prompts, "--shard", "1/2", "--json",
                     str(tmp_path / "a.partial.json")]) == 2
        assert "whole corpus" in error_line(capsys)


def whole_and_merged_halves(tmp_path, base: list[str]) -> tuple[dict, dict]:
    """`base` run whole, and as 2 shards merged in reverse order: both JSONs."""
    full = tmp_path / "full.json"
    assert main([*base, "--json", str(full)]) == 0
    parts = [tmp_path / f"part{i}.partial.json" for i in (1, 2)]
    for i, p in enumerate(parts, 1):
        assert main([*base, "--shard", f"{i}/2", "--json", str(p)]) == 0
    out = tmp_path / "merged.json"
    assert main(["merge", str(parts[1]), str(parts[0]), "--json", str(out)]) == 0
    return json.loads(full.read_text()), json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize(("prompt_batch", "tol", "normwise"), [
    ([], FLOAT32_RTOL, True),
    # each prompt alone takes 2-3 times as long on SmolLM2 (minutes): the tiny model checks it in make test
    pytest.param(["--prompt-batch", "1"], EXACT_RTOL, False, marks=pytest.mark.extended)], ids=["all", "one"])
def test_ablate_shards_merge_to_the_unsharded_json_on_smollm2(tmp_path, prompt_batch, tol, normwise):
    """SmolLM2, 2 prompts of 5 tokens, a shard each: by default (a shard's prompts in one group
    of passes) the shards' float32 passes round differently from the whole run's (2.6e-6 of the
    largest effect, measured), within SmolLM2's forward bound (FLOAT32_RTOL, 9.3e-6); with
    --prompt-batch 1 on both sides they make the same passes and the merge equals the whole run to
    EXACT_RTOL (1.2e-7 relative, measured)."""
    path = tmp_path / "p.txt"
    path.write_text("\n".join(f"Note {i}: a cat sat on {i} warm mats by the door of the old mill." for i in range(5)))
    whole, merged = whole_and_merged_halves(
        tmp_path, ["ablate", "--mode", "zero", "--max-tokens", "5", "--n-prompts", "2", "--prompts", str(path),
                   *prompt_batch])
    assert max(max(row) for row in whole["effects"]) > 0.1
    assert_same_json(whole, merged, tol=tol, normwise=normwise)


@pytest.mark.slow
def test_sinks_shards_merge_to_the_unsharded_json_on_smollm2(tmp_path):
    """The contract on a real model: SmolLM2 (from the converted-model cache), 2 shards, each
    batching its own prompts (SmolLM2's forward bound, FLOAT32_RTOL)."""
    path = tmp_path / "p.txt"
    path.write_text("\n".join(f"Item {i}: the ferry left the harbour at {i} o'clock with cars and a brass band." for i in range(5)))
    assert_same_json(*whole_and_merged_halves(
        tmp_path, ["sinks", "--prompts", str(path), "--max-tokens", "16", "--bos", "both", "--eps", "0.3", "0.8"]),
        tol=FLOAT32_RTOL)


def test_sinks_on_the_default_windows_resample_their_documents_sharded_or_not(cli_model, tmp_path):
    """Without --prompts the prompts are windows of the default corpus: every interval
    resamples their documents (a cluster bootstrap), in the merged shards as in one run."""
    from sinkmech.corpora import prompt_documents

    args = ["sinks", "--max-tokens", "12", "--bos", "both", "--n-prompts", "12", "--batch-size", "4"]
    a, b = whole_and_two_shards(args, tmp_path)
    assert_same_json(a, b, tol=TINY_FLOAT32_RTOL)
    documents = prompt_documents(None, 12)
    assert len(set(documents)) < 12  # the first windows share documents
    for c in ("prepend", "none"):
        assert a["conditions"][c]["interval"] == {"unit": "document", "n_units": len(set(documents)), "method": "bca"}
