"""Partial results: shards of 1, 2 and 3 merged in any order equal the one-pass
result; the partial file format round-trips float64 exactly; bad merges are refused."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from helpers.tiny import make_tiny

from sinkmech.sharding.format import (
    FORMAT,
    FORMAT_VERSION,
    PartialError,
    checksum,
    merge,
    parse_shard,
    read_partial,
    read_parts,
    shard_span,
    split,
    write_partial,
)
from sinkmech.prompts import tokenize
from sinkmech.sharding.measures import SINK_ROWS, sinks_partial, sinks_result
from sinkmech.measures.sinks import sink_scores
from sinkmech.options import QUIET, RunOptions

N_PROMPTS = 10


@pytest.fixture(scope="module")
def model():
    return make_tiny(3)


@pytest.fixture(scope="module")
def ragged():
    """10 prompts of 5 to 19 content tokens (ids in [2, 50): none is <bos>)."""
    g = torch.Generator().manual_seed(0)
    return [torch.randint(2, 50, (int(n),), generator=g).tolist() for n in torch.randint(5, 20, (N_PROMPTS,), generator=g)]


def run_sinks(model, prompts, idx, batch_size):
    out = {}
    for bos in ("prepend", "none"):
        batch = tokenize(model, [prompts[i] for i in idx], bos=bos, max_tokens=16, bos_token_id=1)
        out[bos] = sink_scores(model, batch, max_tokens=16, loss=True,
                               options=RunOptions(batch_size=batch_size, progress=False))
    return out


def sharded(model, prompts, n, batch_size, settings=None):
    spans = [shard_span(len(prompts), i, n) for i in range(1, n + 1)]
    return [sinks_partial(run_sinks(model, prompts, s, batch_size), settings or {"run": "test"}, prompt_index=s,
                          shard=(i, n), n_prompts_total=len(prompts), n_ctx=model.cfg.n_ctx)
            for i, s in enumerate(spans, 1)]


ROWS = SINK_ROWS  # scores, norms, lengths: the per-prompt rows of a sinks part


@pytest.mark.parametrize("n", [1, 2, 3])
def test_sink_shards_merged_in_any_order_equal_the_one_pass_result(model, ragged, n):
    # batch_size 1: every prompt is its own forward pass in both runs, so each
    # per-prompt row must be bitwise equal and the loss sums equal to float64 rounding
    one = run_sinks(model, ragged, range(N_PROMPTS), batch_size=1)
    parts = sharded(model, ragged, n, batch_size=1)
    for perm in itertools.permutations(parts):
        merged = merge(perm)
        merged.check_complete()
        got = sinks_result(merged)
        for c in ("prepend", "none"):
            for k in ROWS:
                assert torch.equal(getattr(got[c], k), getattr(one[c], k)), (n, c, k)
            assert got[c].loss_count == one[c].loss_count
            assert got[c].loss == pytest.approx(one[c].loss, rel=1e-9)
            assert got[c].max_tokens == one[c].max_tokens
            assert got[c].summary(["0.3", "0.8"])["sink_rate"] == one[c].summary(["0.3", "0.8"])["sink_rate"]


def test_ragged_batches_agree_to_float32_rounding(model, ragged):
    """Batches of 4: a shard pads its prompts to another width than the one-pass
    run, so float32 matmuls may round differently (never by more than 1e-6)."""
    one = run_sinks(model, ragged, range(N_PROMPTS), batch_size=4)
    got = sinks_result(merge(sharded(model, ragged, 3, batch_size=4)))
    for c in ("prepend", "none"):
        for k in ROWS:
            torch.testing.assert_close(getattr(got[c], k), getattr(one[c], k), rtol=1e-6, atol=1e-6)
        assert got[c].loss == pytest.approx(one[c].loss, rel=1e-6)


def test_merge_is_order_free_and_associative(model, ragged):
    one = sinks_partial(run_sinks(model, ragged, range(N_PROMPTS), 4), {"run": "test"},
                        prompt_index=range(N_PROMPTS), n_ctx=64)
    rows_only = type(one)(**{**one.__dict__, "sums": {}})
    a, b, c = split(rows_only, [range(3), range(3, 7), range(7, 10)])
    left, right = merge([merge([a, b]), c]), merge([a, merge([c, b])])
    for m in (left, right, merge([c, a, b])):
        assert m.complete and np.array_equal(m.prompt_index, np.arange(N_PROMPTS))
        for k in one.rows:
            assert np.array_equal(m.rows[k], one.rows[k])
    # sums: added in the order of the parts' first prompt, whatever the order given
    s = sharded(model, ragged, 3, batch_size=4)
    sums = [merge(p).sums for p in itertools.permutations(s)]
    assert all(all(np.array_equal(x[k], sums[0][k]) for k in x) for x in sums)
    assoc = merge([merge(s[:2]), s[2]]).sums
    for k in assoc:
        np.testing.assert_allclose(assoc[k], sums[0][k], rtol=1e-12)


def test_partial_file_round_trips_float64_exactly(tmp_path, model, ragged):
    part = sharded(model, ragged, 2, batch_size=4)[1]
    odd = dict(part.sums, odd=np.array([0.1 + 0.2, 1e-300, -2.5e300, 1 / 3, np.nan, np.inf]))
    part = type(part)(**{**part.__dict__, "sums": odd})
    path = write_partial(tmp_path / "p.partial.json", part)
    json.loads(path.read_text())  # strict JSON: no bare NaN
    assert "NaN" not in path.read_text()
    back = read_partial(path)
    for k, v in part.rows.items():
        assert back.rows[k].dtype == v.dtype and np.array_equal(back.rows[k], v)
    for k, v in part.sums.items():
        assert np.array_equal(back.sums[k], v, equal_nan=True)
    assert back.settings == part.settings and back.shards == (2,) and back.n_shards == 2


def test_parts_under_the_other_format_name_still_merge(tmp_path, model, ragged):
    """Parts are written as "sinkmech.partial"; parts that say
    "sinkmech.sharding.parts" (same version, checksum over that name) read and
    merge, with the others, to the same result."""
    parts = sharded(model, ragged, 3, batch_size=4)
    paths = [write_partial(tmp_path / f"s{i}.partial.json", p) for i, p in enumerate(parts, 1)]
    d = json.loads(paths[1].read_text())
    assert d["format"] == FORMAT == "sinkmech.partial"
    body = {k: v for k, v in d.items() if k != "sha256"} | {"format": "sinkmech.sharding.parts"}
    old = tmp_path / "old.partial.json"
    old.write_text(json.dumps({**body, "sha256": checksum(body)}))
    got, want = read_parts([paths[0], old, paths[2]]), read_parts(paths)
    assert got.rows.keys() == want.rows.keys() and all(np.array_equal(got.rows[k], want.rows[k]) for k in got.rows)
    assert all(np.array_equal(got.sums[k], want.sums[k]) for k in want.sums) and got.settings == want.settings
    (tmp_path / "other.partial.json").write_text(json.dumps({**body, "format": "other.tool", "sha256": "x"}))
    with pytest.raises(PartialError, match="not a sinkmech partial file"):
        read_partial(tmp_path / "other.partial.json")


def test_bad_merges_are_refused_with_one_line_each(tmp_path, model, ragged):
    parts = sharded(model, ragged, 3, batch_size=4)
    paths = [write_partial(tmp_path / f"s{i}.partial.json", p) for i, p in enumerate(parts, 1)]
    with pytest.raises(PartialError, match=r"missing shard 2/3"):
        read_parts([paths[0], paths[2]])
    with pytest.raises(PartialError, match=r"duplicate shard 1/3"):
        read_parts([paths[0], paths[0], paths[1], paths[2]])
    other = sharded(model, ragged, 3, batch_size=4, settings={"run": "test", "max_tokens": 32})
    odd = write_partial(tmp_path / "other.partial.json", other[1])
    with pytest.raises(PartialError, match=r"differ in setting 'max_tokens'"):
        read_parts([paths[0], odd, paths[2]])
    text = paths[1].read_text()
    (tmp_path / "cut.partial.json").write_text(text[: len(text) // 2])
    with pytest.raises(PartialError, match="corrupt or truncated"):
        read_parts([paths[0], tmp_path / "cut.partial.json", paths[2]])
    d = json.loads(text)
    d["rows"]["prepend.scores"]["values"][0] += 0.25  # a changed value: the checksum no longer fits
    (tmp_path / "flip.partial.json").write_text(json.dumps(d))
    with pytest.raises(PartialError, match="checksum"):
        read_partial(tmp_path / "flip.partial.json")
    d = json.loads(text)
    d["format_version"] = FORMAT_VERSION + 1
    (tmp_path / "new.partial.json").write_text(json.dumps(d))
    with pytest.raises(PartialError, match=f"format version {FORMAT_VERSION + 1}"):
        read_partial(tmp_path / "new.partial.json")
    two = sharded(model, ragged, 2, batch_size=4)
    with pytest.raises(PartialError, match="different splits"):
        merge([parts[0], two[1]])


def test_shard_spans_cover_the_corpus_once():
    for n_prompts in (1, 7, 10, 170):
        for n in range(1, min(n_prompts, 9) + 1):
            spans = [shard_span(n_prompts, i, n) for i in range(1, n + 1)]
            assert [i for s in spans for i in s] == list(range(n_prompts))
            assert max(map(len, spans)) - min(map(len, spans)) <= 1
    assert parse_shard("2/8") == (2, 8)
    for bad in ("0/3", "4/3", "1", "a/b", "1/0"):
        with pytest.raises(ValueError):
            parse_shard(bad)
    with pytest.raises(ValueError, match="at least one prompt"):
        shard_span(2, 1, 3)


def assert_close_json(a, b, rel: float, path: str = "$") -> None:
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            assert_close_json(a[k], b[k], rel, f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close_json(x, y, rel, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, rel=rel, abs=1e-9), (path, a, b)
    else:
        assert a == b, (path, a, b)


@pytest.mark.slow
def test_head_scan_shards_equal_the_one_pass_scan_on_planted_heads():
    """The planted if-else head (trigger token TRIGGER), the sink and the
    previous-token head: the merged scan labels them as the one-pass scan does,
    with the same triggers and the same numbers (the trigger halves follow each
    prompt's global index)."""
    from helpers.tiny import TINY_BOS
    from helpers.planted import TRIGGER, planted_corpus, planted_dormant_model as planted_model

    from sinkmech.dormant.labels import Thresholds
    from sinkmech.dormant.scan import accumulate, scan_heads
    from sinkmech.sharding.dormant import heads_partial, heads_result

    model = planted_model({0: "if_else", 1: "sink", 2: "prev"})
    corpus = planted_corpus(n=45).tolist()  # shard 2 of 3 starts at prompt 15: an odd one
    one = scan_heads(model, corpus, bos="prepend", max_tokens=20,
                     options=RunOptions(batch_size=5, progress=False, bos_token_id=TINY_BOS))
    assert one.mode(0, 0) == "if_else" and one.triggers[0][0][0].token_id == TRIGGER
    want = json.loads(one.to_json(profiles=True))
    for n in (1, 2, 3):
        parts = []
        for i in range(1, n + 1):
            span = shard_span(len(corpus), i, n)
            batch = tokenize(model, [corpus[j] for j in span], bos="prepend", max_tokens=20, bos_token_id=TINY_BOS)
            acc = accumulate(model, batch, Thresholds(),
                             options=RunOptions(batch_size=5, progress=False), first_prompt=span.start, n_pos=21)
            parts.append(heads_partial(acc, batch, {}, prompt_index=span, shard=(i, n), n_prompts_total=len(corpus)))
        for perm in itertools.permutations(parts):
            got = heads_result(merge(perm), model)
            assert got.modes == one.modes
            assert [[[(t.token_id, t.where, t.count, t.n_prompts, t.validated) for t in ts] for ts in row]
                    for row in got.triggers] == [[[(t.token_id, t.where, t.count, t.n_prompts, t.validated)
                                                   for t in ts] for ts in row] for row in one.triggers]
            # batches of 5 fall differently in a shard: float32 rounding only
            assert_close_json(json.loads(got.to_json(profiles=True)), want, rel=1e-6)


@pytest.mark.parametrize("metric", ["kl", "logit_diff"])
def test_ablation_shards_merged_in_any_order_equal_the_one_pass_result(model, ragged, metric):
    """Each effect is a float32 mean over the shard's content positions (KL) or
    prompts (logit difference): weighted back into sums, the parts merge to the
    one-pass effects to float32 rounding."""
    from sinkmech.interventions.ablation import head_ablations
    from sinkmech.interventions.metrics import LogitDiff
    from sinkmech.sharding.interventions import ablate_partial, ablate_result

    kw = {"mode": "zero", "metric": LogitDiff(3, 4) if metric == "logit_diff" else metric}

    def run(idx):
        batch = tokenize(model, [ragged[i] for i in idx], bos="prepend", max_tokens=16, bos_token_id=1)
        return head_ablations(model, batch, options=QUIET, **kw), batch

    one = run(range(N_PROMPTS))[0]
    assert one.effects.abs().max() > 1e-3
    for n in (1, 2, 3):
        spans = [shard_span(N_PROMPTS, i, n) for i in range(1, n + 1)]
        parts = [ablate_partial(*run(s), {}, prompt_index=s, shard=(i, n), n_prompts_total=N_PROMPTS)
                 for i, s in enumerate(spans, 1)]
        for perm in itertools.permutations(parts):
            got = ablate_result(merge(perm))
            torch.testing.assert_close(got.effects, one.effects, rtol=1e-5, atol=1e-7)
            assert got.baseline == pytest.approx(one.baseline, rel=1e-5, abs=1e-7)
            assert got.n_prompts == one.n_prompts
