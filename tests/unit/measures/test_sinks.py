"""Sink scores: planted heads, brute force, padding, <bos> alignment, bad input."""

from __future__ import annotations

import json
import math

import pytest
import torch

from sinkmech.loading.backend import Model

from sinkmech.corpora import default_corpus, load_prompts
from sinkmech.prompts import tokenize
from sinkmech.measures.sinks import sink_scores
from helpers.tiny import TINY_RUN, TINY_BOS, toy_tokenizer
from helpers.backends import require
from helpers.tolerance import SMOLLM2_FORWARD, TINY_FORWARD, assert_normwise, gamma
from sinkmech.options import QUIET, RunOptions


def planted_model() -> Model:
    """Attention-only, no positional rotation: head 0 always attends to <bos>
    (id 1), head 1 attends uniformly, heads 2-3 stay random."""
    require("from_config", why="planted heads are set in a HookedTransformer's weights")
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=1, d_model=16, n_heads=4, d_head=4, n_ctx=32, d_vocab=50,
        attn_only=True, normalization_type=None, positional_embedding_type="standard", seed=1, device="cpu",
    )
    model = HookedTransformer(cfg)
    with torch.no_grad():
        model.embed.W_E[:, 0] = 0.0
        model.embed.W_E[TINY_BOS, 0] = 1.0  # dim 0 marks <bos>
        model.pos_embed.W_pos[:, 0] = 0.0
        attn = model.blocks[0].attn
        for h in (0, 1):
            attn.W_Q[h] = 0.0
            attn.W_K[h] = 0.0
            attn.b_Q[h] = 0.0
            attn.b_K[h] = 0.0
        attn.b_Q[0, 0] = 200.0
        attn.W_K[0, 0, 0] = 1.0
    model.eval()
    return model


def brute_force_scores(model, batch) -> torch.Tensor:
    """alpha_0 per (prompt, layer, head) from a full cache, one prompt at a time."""
    out = torch.zeros(len(batch), model.cfg.n_layers, model.cfg.n_heads)
    for i in range(len(batch)):
        T = int(batch.lengths[i])
        _, cache = model.run_with_cache(batch.tokens[i : i + 1, :T])
        for l in range(model.cfg.n_layers):
            out[i, l] = cache["pattern", l][0, :, :, 0].mean(-1)
    return out


def test_planted_sink_head_scores_one_and_uniform_head_scores_harmonic(tiny_tokens):
    model = planted_model()
    res = sink_scores(model, tiny_tokens, bos="prepend", options=TINY_RUN)
    T = tiny_tokens.shape[1] + 1
    assert torch.allclose(res.scores[:, 0, 0], torch.ones(len(tiny_tokens)), atol=1e-4)
    harmonic = sum(1.0 / (t + 1) for t in range(T)) / T  # uniform causal attention
    assert torch.allclose(res.scores[:, 0, 1], torch.full((len(tiny_tokens),), harmonic), atol=1e-6)
    assert res.uniform_score() == pytest.approx(harmonic)
    # The planted head is a sink at any eps < 1; the uniform head at none above 1/T.
    rate = res.sink_rate(0.8)
    assert rate >= 25.0 and (res.scores[:, 0, 1] <= 0.8).all()


def test_streaming_equals_brute_force_tiny(tiny_model, tiny_tokens):
    for bos in ("prepend", "none"):
        batch = tokenize(tiny_model, tiny_tokens, bos=bos, bos_token_id=TINY_BOS)
        res = sink_scores(tiny_model, tiny_tokens, bos=bos,
                          options=RunOptions(batch_size=4, progress=False, bos_token_id=TINY_BOS))
        # batches of 4 against one pass of 6: each probability within the forward bound (values <= 1)
        assert torch.allclose(res.scores, brute_force_scores(tiny_model, batch), atol=TINY_FORWARD, rtol=0)


def test_value_and_residual_norms_match_cache(tiny_model, tiny_tokens):
    res = sink_scores(tiny_model, tiny_tokens, bos="prepend", options=TINY_RUN)
    batch = tokenize(tiny_model, tiny_tokens, bos="prepend", bos_token_id=TINY_BOS)
    _, cache = tiny_model.run_with_cache(batch.tokens)
    for l in range(tiny_model.cfg.n_layers):  # the same pass; norms and means summed in another order: gamma(64)
        v = cache["v", l].norm(dim=-1)  # [batch pos head]
        assert torch.allclose(res.value_norm_first[:, l], v[:, 0], rtol=gamma(64), atol=0)
        assert torch.allclose(res.value_norm_rest[:, l], v[:, 1:].mean(1), rtol=gamma(64), atol=0)
        r = cache["resid_post", l].norm(dim=-1)
        assert torch.allclose(res.resid_norm_first[:, l], r[:, 0], rtol=gamma(64), atol=0)
        assert torch.allclose(res.resid_norm_rest[:, l], r[:, 1:].mean(1), rtol=gamma(64), atol=0)


def test_grouped_query_value_norms_follow_kv_heads():
    from helpers.tiny import make_tiny

    model = make_tiny(3, n_heads=4, n_kv=2)
    tokens = torch.randint(2, 50, (3, 9), generator=torch.Generator().manual_seed(3))
    res = sink_scores(model, tokens, bos="prepend", options=TINY_RUN)
    # heads 0,1 read kv head 0; heads 2,3 read kv head 1
    assert torch.equal(res.value_norm_first[..., 0], res.value_norm_first[..., 1])
    assert torch.equal(res.value_norm_first[..., 2], res.value_norm_first[..., 3])
    assert not torch.equal(res.value_norm_first[..., 0], res.value_norm_first[..., 2])


def test_padding_never_enters_the_means(tiny_model):
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(2, 50, (n,), generator=g).tolist() for n in (3, 11, 7, 2, 15)]
    together = sink_scores(tiny_model, prompts, bos="prepend",
                           options=RunOptions(batch_size=5, progress=False, bos_token_id=TINY_BOS))
    for i, p in enumerate(prompts):
        alone = sink_scores(tiny_model, [p], bos="prepend", options=TINY_RUN)
        for field in ("scores", "value_norm_first", "value_norm_rest", "resid_norm_rest"):  # padded vs alone
            assert_normwise(getattr(together, field)[i], getattr(alone, field)[0], TINY_FORWARD, field)


def test_bos_and_no_bos_score_the_same_content_tokens(smollm2):
    prompts = ["The cat sat on the mat.", "x = [1, 2, 3]  # a list", "Attention sinks are odd."]
    with_bos = tokenize(smollm2, prompts, bos="prepend", max_tokens=5)
    without = tokenize(smollm2, prompts, bos="none", max_tokens=5)
    assert (with_bos.tokens[:, 0] == 1).all()  # <|im_start|>
    for i in range(len(prompts)):
        n = int(without.lengths[i])
        assert int(with_bos.lengths[i]) == n + 1 and n <= 5
        assert with_bos.tokens[i, 1 : n + 1].tolist() == without.tokens[i, :n].tolist()
        ids = smollm2.tokenizer(prompts[i], add_special_tokens=False)["input_ids"][:5]
        assert without.tokens[i, :n].tolist() == ids


def test_smollm2_streaming_equals_brute_force(smollm2):
    prompts = default_corpus()[:3]
    for bos in ("prepend", "none"):
        res = sink_scores(smollm2, prompts, bos=bos, max_tokens=16, options=RunOptions(batch_size=2, progress=False))
        batch = tokenize(smollm2, prompts, bos=bos, max_tokens=16)
        # batches of 2 against one pass of 3: each probability within SmolLM2's forward bound
        assert torch.allclose(res.scores, brute_force_scores(smollm2, batch), atol=SMOLLM2_FORWARD, rtol=0)
        assert res.scores.min() >= 1.0 / 17 - 1e-6 and res.scores.max() <= 1.0 + 1e-6


def test_default_corpus_is_deterministic_and_long_enough(smollm2):
    corpus = default_corpus()
    assert len(corpus) == 170 and corpus == default_corpus()
    assert len(set(corpus)) == 170
    lengths = [len(smollm2.tokenizer(p, add_special_tokens=False)["input_ids"]) for p in corpus]
    assert min(lengths) >= 64


def test_prompt_files(tmp_path):
    txt = tmp_path / "p.txt"
    txt.write_text("first prompt\n\nsecond prompt\n")
    assert load_prompts(txt) == ["first prompt", "second prompt"]
    jl = tmp_path / "p.jsonl"
    jl.write_text(json.dumps({"text": "a"}) + "\n" + json.dumps({"text": "b", "id": 2}) + "\n")
    assert load_prompts(str(jl)) == ["a", "b"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "a"}) + "\n")
    with pytest.raises(ValueError, match="'text'"):
        load_prompts(bad)
    with pytest.raises(FileNotFoundError):
        load_prompts(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="no prompts"):
        load_prompts(tmp_path / "empty.txt")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(prompts=[]), "empty"),
        (dict(prompts=["ok", "   "]), "prompt 1 is empty"),
        (dict(prompts=[[3, 4]], max_tokens=0), "max_tokens"),
        (dict(prompts=[[3, 400]]), "token ids"),
        (dict(prompts="just one string"), "ambiguous"),
    ],
)
def test_bad_input_raises_specific_errors(tiny_model, kwargs, match):
    kwargs = {"bos": "prepend", "options": TINY_RUN, **kwargs}
    prompts = kwargs.pop("prompts")
    with pytest.raises(ValueError, match=match):
        sink_scores(tiny_model, prompts, **kwargs)


@pytest.mark.parametrize("field, value", [("batch_size", 0), ("batch_size", True),
                                          ("dtype", "float64"), ("bos_token_id", -1)])
def test_run_options_refuse_a_bad_setting_when_made(field, value):
    with pytest.raises(ValueError, match=field):
        RunOptions(**{field: value})
    assert RunOptions(batch_size=3).batch(16) == 3 and RunOptions().batch(16) == 16


def test_a_prompt_beyond_the_context_is_cut_and_recorded(tiny_model):
    """No error: the prompt keeps n_ctx - 1 content tokens in both conditions, and says so."""
    long = list(range(2, 40)) * 2  # 76 content tokens; the tiny model holds 64 positions
    for bos in ("prepend", "none"):
        r = sink_scores(tiny_model, [long], bos=bos, max_tokens=70, options=TINY_RUN)
        assert (r.max_tokens, r.max_tokens_requested, r.context_limit) == (63, 70, 64)
        assert r.content_lengths.tolist() == [63] and "context of 64" in r.token_count()


def test_unknown_bos_choice_is_a_value_error():
    # Called through sink_scores, the test suite's runtime type checker rejects
    # the Literal first; without it, check_bos is what users see.
    from sinkmech.prompts import check_bos

    with pytest.raises(ValueError, match="bos must be one of"):
        check_bos("start")


def test_bad_eps_and_nan_model(tiny_tokens):
    model = planted_model()
    res = sink_scores(model, tiny_tokens, bos="prepend", options=TINY_RUN)
    with pytest.raises(ValueError, match="epsilon"):
        res.sink_rate(1.5)
    with torch.no_grad():
        model.blocks[0].attn.W_Q[2, 0, 0] = math.nan
    with pytest.raises(FloatingPointError, match="NaN"):
        sink_scores(model, tiny_tokens, bos="prepend", options=TINY_RUN)


def test_model_without_bos_needs_explicit_id(tiny_model, tiny_tokens, monkeypatch):
    toy_tokenizer(monkeypatch, tiny_model, None)  # no tokenizer, so no <bos> (the Bridge's tiny model has one)
    with pytest.raises(ValueError, match="no <bos>"):
        sink_scores(tiny_model, tiny_tokens, bos="prepend", options=QUIET)


def test_result_exports(tiny_model, tiny_tokens):
    res = sink_scores(tiny_model, tiny_tokens, bos="none", options=QUIET)
    df = res.to_dataframe()
    assert len(df) == res.n_prompts * res.n_layers * res.n_heads
    assert df.loc[(df.prompt == 2) & (df.layer == 1) & (df["head"] == 3), "score"].item() == pytest.approx(
        float(res.scores[2, 1, 3])
    )
    payload = json.loads(res.to_json(eps=["0.3", 0.8]))
    assert set(payload["sink_rate"]) == {"0.3", "0.8"}
    assert payload["sink_rate"]["0.3"] == pytest.approx(res.sink_rate(0.3))
    assert len(payload["scores"]) == res.n_layers and len(payload["scores"][0]) == res.n_heads


# <bos> moved into the sequence: K content tokens, then <bos>, then the rest.


def moved_by_hand(row: list[int], K: int) -> list[int]:
    return row[:K] + [TINY_BOS] + row[K:]


def test_bos_position_equals_brute_force_on_hand_built_ids(tiny_model):
    """Scores, <bos>-key scores and the loss against the hand-built sequence run
    through the model directly, on ragged prompts (padding never enters)."""
    g = torch.Generator().manual_seed(3)
    rows = [torch.randint(2, 50, (n,), generator=g).tolist() for n in (12, 7, 10)]
    for K in (1, 3, 6):
        res = sink_scores(tiny_model, rows, bos="prepend", bos_position=K, loss=True,
                          options=RunOptions(batch_size=2, progress=False, bos_token_id=TINY_BOS))
        assert res.bos_position == K
        for p, row in enumerate(rows):
            ids = torch.tensor([moved_by_hand(row, K)])
            with torch.no_grad():
                logits, cache = tiny_model.run_with_cache(ids)
            for l in range(tiny_model.cfg.n_layers):
                pattern = cache["pattern", l][0]  # [head, query, key]
                # batches of 2 (padded) against each prompt alone: the forward bound (probabilities)
                assert torch.allclose(res.scores[p, l], pattern[:, :, 0].mean(-1), atol=TINY_FORWARD, rtol=0)
                assert torch.allclose(res.bos_scores[p, l], pattern[:, K:, K].mean(-1), atol=TINY_FORWARD, rtol=0)
            # content token j sits at position j (j < K) or j + 1 (j >= K); it is
            # predicted from the position just before it, which for j = K is <bos>:
            # that target is left out (no other condition predicts from <bos>)
            where = [j if j < K else j + 1 for j in range(len(row))]
            logp = torch.log_softmax(logits[0].double(), -1)
            nll = -sum(logp[where[j] - 1, row[j]] for j in range(1, len(row)) if j != K)
            assert float(res.prompt_loss[p]) == pytest.approx(float(nll), rel=TINY_FORWARD)
        assert res.prompt_targets().tolist() == [len(r) - 2 for r in rows]


def test_bos_position_scores_the_same_content_targets_token_by_token(tiny_model, tiny_tokens):
    """The loss mask's targets are content tokens 1 .. n-1 but K, in order, the
    same as `skip_target_mask` with <bos> first or none; <bos> is never a target,
    and content token K, which <bos> itself would predict, is not either."""
    from sinkmech.measures.sinks import move_bos, moved_bos_targets, skip_target_mask

    first = tokenize(tiny_model, tiny_tokens, bos="prepend", bos_token_id=TINY_BOS)
    none = tokenize(tiny_model, tiny_tokens, bos="none")
    for K in (1, 2, 5, 10):
        moved = move_bos(first, K)
        assert moved.tokens[:, K].eq(TINY_BOS).all() and moved.tokens[:, :K].equal(tiny_tokens[:, :K])
        mask = moved_bos_targets(moved, K)
        for p in range(len(moved)):
            got = moved.tokens[p, 1:][mask[p, :-1]].tolist()
            want = tiny_tokens[p, 1:].tolist()
            del want[K - 1]
            for ref in (first, none):
                assert ref.tokens[p, 1:][skip_target_mask(ref, K)[p, :-1]].tolist() == want
            assert got == want and TINY_BOS not in got
            # <bos> itself would predict content token K: not scored
            assert not mask[p, K] and moved.tokens[p, K + 1] == tiny_tokens[p, K]


def test_bos_position_json_keys_and_bad_positions(tiny_model, tiny_tokens):
    """The summary carries bos_position and bos_scores [layer][head]; K past the
    content is refused; the moved batch's key 0 is no longer <bos>."""
    res = sink_scores(tiny_model, tiny_tokens, bos="prepend", bos_position=4, loss=True,
                      options=TINY_RUN)
    d = res.summary()
    assert d["bos_position"] == 4
    assert torch.allclose(torch.tensor(d["bos_scores"]), res.bos_scores.mean(0))
    assert len(d["bos_scores"]) == res.n_layers and len(d["bos_scores"][0]) == res.n_heads
    assert "bos_position" not in sink_scores(tiny_model, tiny_tokens, bos="prepend", options=TINY_RUN).summary()
    for K, match in ((12, "at or beyond the content length"), (0, ">= 1")):
        with pytest.raises(ValueError, match=match):
            sink_scores(tiny_model, tiny_tokens, bos="prepend", bos_position=K, options=TINY_RUN)
    with pytest.raises(ValueError, match="bos='prepend'"):
        sink_scores(tiny_model, tiny_tokens, bos="none", bos_position=2, options=QUIET)


@pytest.mark.parametrize("argv, message", [
    (["--bos", "none", "--bos-position", "2"], "needs --bos both or --bos prepend"),
    (["--bos-position", "8", "--max-tokens", "8"], "at or beyond the content length"),
    (["--bos-position", "2", "--keys", "all"], "--keys all"),
])
def test_bos_position_flag_is_refused_before_the_model_loads(argv, message, monkeypatch, capsys):
    from sinkmech.loading import models
    from sinkmech.cli import main

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(["sinks", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_sinks_cli_bos_position_writes_its_keys_under_the_bos_condition(monkeypatch, tmp_path):
    from helpers.tiny import serve_tiny

    from sinkmech.cli import main

    model = serve_tiny(monkeypatch, 5)
    prompts = tmp_path / "p.txt"
    prompts.write_text("the cat sat on the warm mat today\na cat ran far away from the big dog\n")
    out, findings = tmp_path / "s.json", tmp_path / "f.json"
    assert main(["sinks", "--prompts", str(prompts), "--bos-position", "3", "--json", str(out),
                 "--findings", str(findings)]) == 0
    d = json.loads(out.read_text())["conditions"]
    assert d["prepend"]["bos_position"] == 3 and "bos_position" not in d["none"]
    want = sink_scores(model, str(prompts), bos="prepend", bos_position=3, options=QUIET)
    assert torch.allclose(torch.tensor(d["prepend"]["bos_scores"]), want.bos_scores.mean(0), atol=1e-6)
    f = json.loads(findings.read_text())
    assert any(k.endswith("sinks.bos_default_at_3.prepend.bos_position") and v == 3 for k, v in f.items())
    assert not any(".sinks.bos_default." in k for k in f)  # never under the <bos>-first run's names
    # the shortest prompt has 8 content tokens: K = 8 is refused (after tokenizing, before any forward pass)
    assert main(["sinks", "--prompts", str(prompts), "--bos-position", "8", "--max-tokens", "9"]) == 2


def test_scores_of_windows_resample_their_documents(tiny_model, tiny_tokens):
    """With each prompt's document, the intervals are the cluster bootstrap over documents
    (the summary says so); a document per prompt is the bootstrap over prompts; the paired
    contrasts take the conditions' documents, and refuse two that differ."""
    from dataclasses import replace

    from sinkmech.measures.sinks import paired_contrasts
    from sinkmech.stats import prompt_curve, ratio_with_ci

    batches = {b: tokenize(tiny_model, tiny_tokens.tolist(), bos=b, bos_token_id=TINY_BOS) for b in ("prepend", "none")}
    plain = {b: sink_scores(tiny_model, x, loss=True, options=QUIET) for b, x in batches.items()}
    n = plain["prepend"].n_prompts
    docs = tuple(f"d{i // 2}" for i in range(n))
    grouped = {b: replace(s, documents=docs) for b, s in plain.items()}
    pre, none = grouped["prepend"], grouped["none"]
    assert pre.sink_rate_ci(0.3) == prompt_curve(pre.prompt_sink_rate(0.3)[:, None], groups=docs)[0]
    assert pre.loss_ci() == ratio_with_ci(pre.prompt_loss, pre.prompt_targets().double(), groups=docs)
    assert pre.interval() == {"unit": "document", "n_units": len(set(docs)), "method": "bca"}
    assert plain["prepend"].interval() == {"unit": "prompt", "n_units": n, "method": "bca"}
    assert pre.summary()["interval"]["unit"] == "document"
    own = replace(plain["prepend"], documents=tuple(f"d{i}" for i in range(n)))
    assert own.loss_ci() == plain["prepend"].loss_ci() and own.sink_rate_ci(0.3) == plain["prepend"].sink_rate_ci(0.3)
    c = paired_contrasts(pre, none)
    gap = none.prompt_loss - pre.prompt_loss
    assert c["loss_gap"] == ratio_with_ci(gap, pre.prompt_targets().double(), groups=docs)
    assert c["loss_gap"] != paired_contrasts(plain["prepend"], plain["none"])["loss_gap"]
    with pytest.raises(ValueError, match="different documents"):
        paired_contrasts(pre, plain["none"])


def test_prompt_documents_name_each_window_of_a_named_corpus(tmp_path):
    from sinkmech.corpora import corpus, prompt_documents

    assert prompt_documents(None, 5) == corpus().documents[:5]
    assert prompt_documents("licenses") == corpus("licenses").documents
    f = tmp_path / "p.txt"
    f.write_text("a b c\nd e f\n")
    assert prompt_documents(str(f), 2) is None
