"""Dormant-head detector: planted heads are found and named, streaming equals
brute force, trigger lift is position-adjusted, the no-op check separates the
modes, and bad input gets clear errors."""

from __future__ import annotations

import json
import math

import pytest
import torch

from sinkmech.loading.backend import W_O, attn_scale
from sinkmech.dormant.bands import band_layout, band_norms
from sinkmech.dormant.scan import scan_heads
from sinkmech.dormant.labels import Thresholds
from sinkmech.dormant.noop import noop_check
from helpers.tiny import TINY_RUN, TINY_BOS, make_tiny
from helpers.planted import planted_dormant_model as planted_model
from sinkmech.dormant.planted import LATE, TRIGGER, planted_corpus, trigger_corpus
from helpers.tolerance import TINY_FORWARD, sum_of_changes_atol
from sinkmech.options import QUIET, RunOptions

@pytest.fixture(scope="module")
def planted():
    model = planted_model({0: "if_else", 1: "sink", 2: "prev"})
    corpus = planted_corpus()
    scan = scan_heads(model, corpus, bos="prepend", max_tokens=20, options=TINY_RUN)
    return model, corpus, scan


def test_planted_attention_is_what_we_planted(planted):
    model, corpus, _ = planted
    tokens = torch.cat([torch.full((len(corpus), 1), TINY_BOS), corpus], dim=1)
    _, cache = model.run_with_cache(tokens, names_filter="blocks.0.attn.hook_pattern")
    pattern = cache["pattern", 0]  # [batch, head, query, key]
    q = torch.arange(2, tokens.shape[1])
    is_trig = tokens[:, q] == TRIGGER
    first, prev = pattern[:, 0, q, 0], pattern[:, 0, q, q - 1]
    assert (first[~is_trig] > 0.99).all() and (prev[is_trig] > 0.99).all()
    assert (pattern[:, 1, 1:, 0] > 0.99).all()
    assert (pattern[:, 2, q, q - 1] > 0.99).all()


def test_planted_heads_get_their_labels(planted):
    _, _, scan = planted
    assert scan.mode(0, 0) == "if_else"
    assert scan.mode(0, 1) == "sink"
    assert scan.mode(0, 2) == "active"
    top = scan.triggers[0][0][0]
    assert (top.token_id, top.where) == (TRIGGER, "query")
    assert top.active_rate > 0.95 and top.lift >= scan.thresholds.min_lift
    assert scan.if_else_heads()[0] == (0, 0)
    # the if-else head's resting mode writes nothing: <bos> has a zero value
    assert scan.value_norm_first[0, 0] < 1e-6 < scan.value_norm_active[0, 0]
    assert scan.output_norm_dormant[0, 0] < 0.01 * scan.output_norm_active[0, 0]
    assert not scan.rotary and scan.band_labels == ("all",)


def test_random_heads_are_never_if_else(planted):
    _, _, scan = planted
    random_heads = [(0, 3)] + [(1, h) for h in range(4)]
    assert all(scan.mode(l, h) != "if_else" for l, h in random_heads)
    for seed in range(3):
        model = make_tiny(seed, n_kv=2)
        with torch.no_grad():  # sharper, token-dependent random attention
            for block in model.blocks:
                block.attn.W_Q.mul_(6.0)
                block.attn._W_K.mul_(6.0)  # the key/value heads of grouped-query attention
        tokens = torch.randint(2, 50, (48, 16), generator=torch.Generator().manual_seed(seed))
        random_scan = scan_heads(model, tokens, bos="prepend", max_tokens=16, options=TINY_RUN)
        assert random_scan.if_else_heads() == []
        assert {m for row in random_scan.modes for m in row} <= {"sink", "active", "mixed"}


def test_trigger_lift_is_position_adjusted():
    """A head that wakes up by position alone has no trigger, even for a token
    that only occurs where the head is active."""
    model = planted_model({0: "position"})
    corpus = planted_corpus(seed=1)
    corpus[corpus == LATE] = 3
    corpus[:, 14:][torch.rand(corpus[:, 14:].shape, generator=torch.Generator().manual_seed(2)) < 0.3] = LATE
    scan = scan_heads(model, corpus, bos="prepend", max_tokens=20, options=TINY_RUN)
    late = [t for t in scan.triggers[0][0] if t.token_id == LATE and t.where == "query"]
    raw_lift = 1.0 / float(scan.active_fraction[0, 0])  # what an unadjusted base rate would give
    assert raw_lift > 1.5
    assert all(0.8 < t.lift < 1.25 for t in late)
    assert scan.best_lift[0, 0] < scan.thresholds.min_lift
    assert scan.mode(0, 0) != "if_else"


def test_noop_check_on_planted_heads(planted):
    model, corpus, scan = planted
    check = noop_check(model, corpus, scan.if_else_heads(), bos="prepend", max_tokens=20, options=TINY_RUN)
    (r,) = check.results
    assert (r.layer, r.head) == (0, 0)
    assert r.n_dormant + r.n_active == scan.n_queries
    assert abs(r.per_query_dormant) < 1e-4
    assert abs(r.per_query_active) > 100 * abs(r.per_query_dormant)
    assert json.loads(check.to_json())["heads"][0]["n_active"] == r.n_active
    # t intervals over prompts: around the estimate; the dormant one tight at ~0 (a true no-op),
    # the active one wide (the random model's active cost varies by prompt)
    (dlo, dhi), (alo, ahi) = r.per_query_dormant_ci, r.per_query_active_ci
    assert dlo <= r.per_query_dormant <= dhi and alo <= r.per_query_active <= ahi
    assert max(abs(dlo), abs(dhi)) < 1e-4 and ahi - alo > 100 * (dhi - dlo)
    # zero-out (Guo et al.): the planted head's <bos> value is exactly 0, so moving it onto <bos> *is* zeroing
    # its output: the two interventions must agree query for query
    assert r.zero_dormant == pytest.approx(r.per_query_dormant, abs=1e-6)
    assert r.zero_active == pytest.approx(r.per_query_active, rel=1e-4)
    assert r.zero_active_ci == pytest.approx(r.per_query_active_ci, rel=1e-4)
    assert r.detectable()["zero_out_dormant"] is False and r.detectable()["move_to_first_dormant"] is False
    assert r.n_prompts_dormant == len(corpus) and 0 < r.n_prompts_active <= len(corpus)
    # streamed in batches of 5 prompts: the same per-prompt bookkeeping
    again = noop_check(model, corpus, [(0, 0)], bos="prepend", max_tokens=20,
                       options=RunOptions(batch_size=5, progress=False, bos_token_id=TINY_BOS)).results[0]
    assert again.per_query_active_ci == pytest.approx(r.per_query_active_ci, rel=1e-4)


def test_noop_check_equals_full_forward_passes_by_brute_force():
    """The check restarts each intervened pass at the head's layer and unembeds only the
    positions from a prompt's first intervened query on; the reference runs every
    intervention as a full forward pass and scores every position."""
    from sinkmech.dormant.noop import force_mask
    from sinkmech.hooks import act_name, all_to_first_hook, zero_head_hook
    from sinkmech.measures.loss import token_losses
    from sinkmech.prompts import tokenize

    model = make_tiny(3, n_layers=3)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(2, model.cfg.d_vocab, (n,), generator=g).tolist() for n in (12, 7, 10, 12, 4, 9)]
    batch = tokenize(model, prompts, bos="prepend", bos_token_id=TINY_BOS, max_tokens=12)
    heads, high, low = [(1, 2), (2, 0), (0, 3)], 0.3, 0.2
    check = noop_check(model, batch, heads, thresholds=Thresholds(high=high, low=low),
                       options=RunOptions(batch_size=4, progress=False))
    _, cache = model.run_with_cache(batch.tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    clean = token_losses(model, batch.tokens)
    valid = torch.arange(clean.shape[1])[None, :] < (batch.lengths[:, None] - 1)
    valid_q = batch.mask.clone()
    valid_q[:, 0] = False
    # sums of float32 loss changes from restarted passes against whole ones (helpers/tolerance.py)
    tol = sum_of_changes_atol(int(valid.sum()), math.log(model.cfg.d_vocab))
    for (l, h), r in zip(heads, check.results):
        dormant, active = force_mask(cache["pattern", l][:, h, :, 0], valid_q, high=high, low=low)
        got = {"dormant": (r.per_query_dormant, r.zero_dormant), "active": (r.per_query_active, r.zero_active)}
        for mode, q in (("dormant", dormant), ("active", active)):
            for k, hook in enumerate(((act_name("pattern", l), all_to_first_hook(h, q)),
                                      (act_name("z", l), zero_head_hook(h, q)))):
                hooked = token_losses(model, batch.tokens, [hook])
                want = float(torch.where(valid, hooked - clean, 0.0).sum()) / int(q.sum()) if q.any() else None
                assert (got[mode][k] is None) == (want is None)
                if want is not None:
                    assert got[mode][k] == pytest.approx(want, abs=tol)
        assert r.n_dormant == int(dormant.sum()) and r.n_active == int(active.sum())
    assert any(r.n_active and r.n_dormant for r in check.results)  # both modes exercised
    assert check.loss_clean == pytest.approx(float(clean[valid].mean()), abs=TINY_FORWARD * 4)  # nats: ~ln 50
    full = noop_check(model, batch, heads, thresholds=Thresholds(high=high, low=low), method="full",
                      options=RunOptions(batch_size=4, progress=False))
    from sinkmech.findings import flatten

    for a, b in zip(check.results, full.results):  # every effect, interval and control (p-values follow from them)
        fa, fb = flatten("", a.to_dict()), flatten("", b.to_dict())
        assert fa.keys() == fb.keys() and any(".mean_ablate_active.matched_control.difference.ci" in k for k in fa)
        for k, v in fa.items():
            if isinstance(v, float) and not k.endswith(("p", "p_adjusted")):
                assert v == pytest.approx(fb[k], abs=tol), k
    with pytest.raises(ValueError, match="method"):
        noop_check(model, batch, heads, method="fast", options=QUIET)


def test_stacked_restart_equals_one_pass_per_intervention_and_full_passes(monkeypatch):
    """The default method stacks the three interventions of one set of queries in one
    restarted pass, on the prompts that hold an intervened query only, and unembeds
    across passes; it must give what one restarted pass per intervention and one
    full forward pass per intervention give, prompt by prompt (the t intervals
    over prompts would move if a prompt's change landed on another)."""
    import sinkmech.dormant.noop as noop
    from sinkmech.findings import flatten
    from sinkmech.hooks import act_name
    from sinkmech.prompts import tokenize
    from sinkmech.dormant.planted import planted_corpus

    model = planted_model({0: "if_else", 1: "sink", 2: "prev"})
    corpus = planted_corpus(n=9, seed=3)
    no_trigger = [2, 5, 6]  # prompts without a trigger: the if-else head has no active query there
    corpus[:, 3] = TRIGGER
    for i in no_trigger:
        corpus[i][corpus[i] == TRIGGER] = 3
    prompts = [row[:n].tolist() for row, n in zip(corpus, (20, 12, 20, 7, 16, 20, 9, 20, 14))]  # padded batches
    batch = tokenize(model, prompts, bos="prepend", bos_token_id=TINY_BOS, max_tokens=20)
    heads = [(0, 0), (1, 3)]
    _, cache = model.run_with_cache(batch.tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    valid_q = batch.mask.clone()
    valid_q[:, 0] = False
    dormant, active = noop.force_mask(cache[act_name("pattern", 0)][:, 0, :, 0], valid_q, high=0.5, low=0.2)
    assert dormant.any(1).all() and active.any(1).tolist() == [i not in no_trigger for i in range(9)]

    monkeypatch.setattr(noop, "UNEMBED_ROWS", 13)  # chunks that straddle passes, heads and batches
    got = {m: noop_check(model, batch, heads, method=m, options=RunOptions(batch_size=4, progress=False))
           for m in ("restart", "restart_each", "full")}
    a = got["restart"].results[0]
    assert a.n_prompts_active == 6 and a.n_prompts_dormant == 9
    assert a.checks["zero_out_active"]["matched_control"]["n_prompts"] == 6
    # sums of float32 loss changes from passes of other shapes (helpers/tolerance.py)
    tol = sum_of_changes_atol(got["restart"].n_tokens, math.log(model.cfg.d_vocab))
    for m in ("restart_each", "full"):
        assert got[m].n_tokens == got["restart"].n_tokens
        for x, y in zip(got["restart"].results, got[m].results):
            fx, fy = flatten("", x.to_dict()), flatten("", y.to_dict())
            assert fx.keys() == fy.keys()
            for k, v in fx.items():
                if isinstance(v, float) and not k.endswith(("p", "p_adjusted")):
                    assert v == pytest.approx(fy[k], abs=tol), (m, k)
                elif not isinstance(v, float):
                    assert v == fy[k], (m, k)


def test_discovery_checks_heads_on_prompts_the_scan_never_saw(planted):
    from sinkmech.corpora import split_corpus
    from sinkmech.dormant.discover import discover_heads

    model, corpus, _ = planted
    found = discover_heads(model, corpus[:40], noop_prompts=8, n_candidates=1, max_tokens=20,
                           options=TINY_RUN)
    assert found.scan_prompts == tuple(range(32)) and found.noop_prompts == tuple(range(32, 40))
    assert found.scan.n_prompts == 32 and found.noop.prompt_indices == found.noop_prompts
    assert [(r.layer, r.head) for r in found.noop.results][0] == (0, 0) and len(found.noop.results) == 2
    assert found.noop.n_tokens == 8 * 20
    with pytest.raises(ValueError, match="too few"):
        split_corpus(8, None, 8)
    with pytest.raises(ValueError, match="too few"):
        split_corpus(10, 6, 5)


def test_a_capped_discovery_checks_the_first_heads_it_covers_and_says_what_the_rest_would_cost(planted):
    """max_heads: the check runs on the first heads of those it covers (the
    if-else heads first); the Discovery keeps them all and the check's time, and
    its note scales that time to every head on FULL_NOOP_PROMPTS prompts."""
    from sinkmech.dormant.discover import discover_heads

    model, corpus, _ = planted
    whole = discover_heads(model, corpus[:40], noop_prompts=4, n_candidates=2, max_tokens=12, options=TINY_RUN)
    capped = discover_heads(model, corpus[:40], noop_prompts=4, n_candidates=2, max_heads=1, max_tokens=12,
                            options=TINY_RUN)
    assert whole.noop_covers == capped.noop_covers and whole.noop_covers[0] == (0, 0) and len(whole.noop_covers) == 2
    assert [(r.layer, r.head) for r in whole.noop.results] == list(whole.noop_covers)
    assert [(r.layer, r.head) for r in capped.noop.results] == list(capped.noop_covers[:1])
    a, b = capped.noop.results[0].to_dict(), whole.noop.results[0].to_dict()  # the same head, prompts and numbers
    assert (a["n_dormant"], a["n_active"]) == (b["n_dormant"], b["n_active"])
    for k in ("per_query_dormant", "per_query_active", "zero_dormant", "zero_active"):  # float32 losses, summed
        assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), k
    assert capped.noop_seconds > 0
    note = capped.first_look_note()
    assert "1 of the 2 heads" in note and "4 held-out prompts" in note and "--noop-max-heads all --noop-prompts 64" in note


def test_the_first_look_note_scales_the_time_to_every_head_and_the_findings_prompts():
    from sinkmech.dormant.first_look import FULL_NOOP_PROMPTS, first_look_note

    note = first_look_note(4, 12, 8, 30.0)  # 30 s x 12 / 4 heads x 64 / 8 prompts = 12 min
    assert "4 of the 12 heads" in note and "about 12 min" in note and f"--noop-prompts {FULL_NOOP_PROMPTS}" in note
    assert "--noop-max-heads none" in first_look_note(4, 12, 8, 30.0, all_heads="none")
    assert "about 3 min" in first_look_note(12, 12, 8, 22.5)  # every head, too few prompts: still a first look
    assert "--noop-prompts 100 checks every one on 100 prompts" in first_look_note(2, 4, 100, 60.0)
    assert first_look_note(12, 12, FULL_NOOP_PROMPTS, 30.0) is None  # already whole
    assert first_look_note(0, 12, 8, 0.0) is None  # nothing ran


def test_a_shared_memo_reuses_a_discovery_only_for_the_same_model_prompts_and_settings(planted, monkeypatch):
    """`compare --report` shares its scan and no-op check with the report through
    `memo`: a second call with the same inputs returns the stored Discovery (the
    scan does not run again); any other prompts or settings scan afresh."""
    import sinkmech.dormant.discover as discover

    model, corpus, _ = planted
    calls = []
    real = discover.scan_heads
    monkeypatch.setattr(discover, "scan_heads", lambda *a, **k: calls.append(1) or real(*a, **k))
    kw = dict(noop_prompts=4, n_candidates=1, max_tokens=12, options=TINY_RUN)
    memo: dict = {}
    first = discover.discover_heads(model, corpus[:20], memo=memo, **kw)
    # the same prompts handed as a longer pool: only the first 16 + 4 are used, so the key is the same
    assert discover.discover_heads(model, corpus[:30], scan_prompts=16, memo=memo, **kw) is first
    assert len(calls) == 1
    other = discover.discover_heads(model, corpus[1:21], memo=memo, **kw)  # other prompts
    assert other is not first and len(calls) == 2
    assert discover.discover_heads(model, corpus[:20], memo=memo, **{**kw, "max_tokens": 10}) is not first
    assert discover.discover_heads(model, corpus[:20], memo=memo, **{**kw, "n_candidates": 2}) is not first
    assert discover.discover_heads(model, corpus[:20], memo=memo, **{**kw, "max_heads": 1}) is not first
    assert len(calls) == 5 and len(memo) == 5
    # without a memo nothing is stored or reused
    assert discover.discover_heads(model, corpus[:20], **kw) is not first and len(calls) == 6


def test_streamed_profile_equals_brute_force():
    """Rotary GQA model, ragged prompts: every streamed mean equals the cache-based one."""
    model = make_tiny(3, n_kv=2)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, 50, (n,), generator=g).tolist() for n in (12, 7, 12, 3, 9)]
    high, low = 0.3, 0.12
    scan = scan_heads(model, prompts, bos="prepend", max_tokens=12, thresholds=Thresholds(high=high, low=low),
                      options=RunOptions(batch_size=2, progress=False, bos_token_id=TINY_BOS))
    layout = band_layout(model)
    assert scan.rotary and layout.n_bands == model.cfg.d_head // 2
    firsts, dorms, acts, reads, outs, q_act, logit0 = [], [], [], [], [], [], []
    kv = torch.arange(4) // 2
    for ids in prompts:
        tokens = torch.tensor([[TINY_BOS] + ids])
        _, cache = model.run_with_cache(tokens)
        l = 1
        pat = cache["pattern", l][0]  # [head, q, k]
        f = pat[:, 1:, 0]
        firsts.append(f)
        dorms.append(f >= high)
        acts.append(f <= low)
        vn = cache["v", l][0][:, kv].norm(dim=-1)  # [k, head]
        reads.append(torch.einsum("hqk,kh->hq", pat, vn)[:, 1:])
        z = cache["z", l][0]  # [q, head, d_head]
        outs.append(torch.einsum("qhd,hdm->hqm", z, W_O(model, l)).norm(dim=-1)[:, 1:])
        q = cache["rot_q", l][0]  # [q, head, d_head]
        q_act.append(band_norms(layout, q)[1:].transpose(0, 1))  # [head, q, band]
        k0 = cache["rot_k", l][0][0, kv]  # [head, d_head]
        logit0.append((q * k0).sum(-1)[1:].T / attn_scale(model, l))
    f, d, a = torch.cat(firsts, 1), torch.cat(dorms, 1), torch.cat(acts, 1)
    assert d.any(1).all() and a.any(1).all(), "choose thresholds that give both modes"
    torch.testing.assert_close(scan.first_key_attention_excl_q0[1], f.mean(1))
    torch.testing.assert_close(scan.dormant_fraction[1], d.float().mean(1))
    torch.testing.assert_close(scan.active_fraction[1], a.float().mean(1))

    def mode_mean(x, m):
        return (x * m).sum(1) / m.sum(1)

    torch.testing.assert_close(scan.value_norm_active[1], mode_mean(torch.cat(reads, 1), a))
    torch.testing.assert_close(scan.output_norm_dormant[1], mode_mean(torch.cat(outs, 1), d))
    qa = torch.cat(q_act, 1)
    torch.testing.assert_close(scan.bands["q_active"][1], (qa * a[..., None]).sum(1) / a.sum(1)[:, None])
    # band logits add up to the real attention logit on the first key
    torch.testing.assert_close(scan.bands["logit_first_dormant"][1].sum(-1), mode_mean(torch.cat(logit0, 1), d))
    assert scan.n_queries == sum(len(p) for p in prompts)
    assert torch.isclose(scan.histogram.sum(-1), torch.tensor(1.0)).all()


def test_bands_follow_the_rotary_layout():
    model = make_tiny(0)
    layout = band_layout(model)
    x = torch.zeros(model.cfg.d_head)
    half = layout.rotary_dim // 2
    x[1], x[1 + half] = 3.0, 4.0  # one rotate-half chunk
    norms = band_norms(layout, x)
    assert norms[1] == 5.0 and norms.sum() == 5.0
    assert layout.frequencies[0] == 1.0 and (layout.frequencies.diff() < 0).all()


def test_bad_input_gets_clear_errors(planted):
    model, corpus, _ = planted
    with pytest.raises(ValueError, match="out of order"):
        Thresholds(high=0.2, low=0.5)
    with pytest.raises(ValueError, match="out of order"):
        Thresholds(active_max_dormant=0.9, sink_min_dormant=0.5)
    with pytest.raises(ValueError, match="empty"):
        scan_heads(model, [], bos="prepend", options=TINY_RUN)
    with pytest.raises(ValueError, match="out of range"):
        noop_check(model, corpus, [(0, 9)], bos="prepend", options=TINY_RUN)
    with pytest.raises(ValueError, match="1 content token"):
        scan_heads(model, corpus[:, :1], bos="none", options=TINY_RUN)


@pytest.mark.slow
def test_smollm2_cli_scan_and_noop(smollm2, tmp_path, monkeypatch, capsys):
    """The CLI on a small slice of the default corpus: the JSON contract holds and
    the no-op check reports both numbers, with intervals, for every if_else head
    and the two closest candidates besides."""
    from sinkmech import cli
    from sinkmech.loading import models
    from sinkmech.corpora import default_corpus

    monkeypatch.setattr(models, "load_model", lambda *a, **k: smollm2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the CI box is small and shared
    try:
        prompts = tmp_path / "p.txt"
        prompts.write_text("\n".join(default_corpus()[:8]))
        out = tmp_path / "heads.json"
        argv = ["heads", "--prompts", str(prompts), "--max-tokens", "24", "--json", str(out), "--top", "5",
                "--noop", "2", "--noop-prompts", "2"]
        assert cli.main(argv) == 0
        assert cli.main(["heads", "--head", "30.0", "--prompts", str(prompts), "--noop-prompts", "2"]) == 2
    finally:
        torch.set_num_threads(threads)
    payload = json.loads(out.read_text())
    heads = payload["heads"]
    assert {(e["layer"], e["head"]) for e in heads} == {(l, h) for l in range(30) for h in range(9)}
    for key in ("layer", "head", "mode", "first_key_attention_excl_q0", "dormant_fraction", "active_fraction",
                "value_norm_first", "value_norm_active", "triggers"):
        assert all(key in e for e in heads)
    assert all(set(t) >= {"token", "where", "count", "lift"} for e in heads for t in e["triggers"])
    assert all(0.0 <= e["dormant_fraction"] + e["active_fraction"] <= 1.0 + 1e-6 for e in heads)
    if_else = [(e["layer"], e["head"]) for e in heads if e["mode"] == "if_else"]
    checked = [(r["layer"], r["head"]) for r in payload["noop"]["heads"]]
    assert set(checked[: len(if_else)]) == set(if_else)
    assert len(checked) == len(if_else) + 2 and not set(checked[len(if_else):]) & set(if_else)
    for r in payload["noop"]["heads"]:
        assert isinstance(r["delta_loss_dormant"], float) and isinstance(r["delta_loss_active"], float)
        assert r["per_query_dormant_ci"] is None or len(r["per_query_dormant_ci"]) == 2
    assert all(set(e["trigger_selected_on"]).isdisjoint(e["trigger_validated_on"]) for e in heads)
    assert all("validated_lift" in e for e in heads)
    captured = capsys.readouterr()
    assert "no-op check" in captured.out and ("top if-else heads" in captured.out or "no head passes" in captured.out)
    assert "out of range" in captured.err


def test_token_batch_is_the_primary_input(planted):
    """A TokenBatch gives the same scan and no-op check as the prompts it came from."""
    from sinkmech.prompts import tokenize

    model, corpus, scan = planted
    batch = tokenize(model, corpus, bos="prepend", max_tokens=20, bos_token_id=TINY_BOS)
    again = scan_heads(model, batch, options=QUIET)
    assert again.bos == "prepend" and again.max_tokens == 20 and again.n_queries == scan.n_queries
    torch.testing.assert_close(again.if_else_score, scan.if_else_score)
    assert again.modes == scan.modes and again.to_json() == scan.to_json()
    a = noop_check(model, batch.slice(0, 8), [(0, 0)], options=QUIET)
    b = noop_check(model, corpus[:8], [(0, 0)], bos="prepend", max_tokens=20, options=TINY_RUN)
    assert a.results == b.results
    # where the checked prompts sit in the corpus is recorded on the result, one index per prompt
    assert a.prompt_indices is None and a.at_prompts(range(8, 16)).prompt_indices == tuple(range(8, 16))
    assert json.loads(a.at_prompts(range(8, 16)).to_json())["prompt_indices"] == list(range(8, 16))
    with pytest.raises(ValueError, match="7 prompt indices for a check of 8 prompts"):
        a.at_prompts(range(7))
    with pytest.raises(ValueError, match="does not match"):
        scan_heads(model, batch, bos="none", options=QUIET)
    with pytest.raises(ValueError, match="max_tokens"):
        scan_heads(model, batch, max_tokens=5, options=QUIET)


def test_mode_counts_and_trigger_text(planted):
    from sinkmech.dormant.result import trigger_text

    _, _, scan = planted
    counts = scan.mode_counts()
    assert list(counts) == ["sink", "active", "if_else", "mixed", "insufficient"] and counts["insufficient"] == 0
    assert sum(counts.values()) == scan.n_layers * scan.n_heads and counts["if_else"] == 1
    assert json.loads(scan.to_json())["mode_counts"] == counts
    top = scan.triggers[0][0][0]
    # the planted trigger token has no tokenizer text: token_text shows its id
    assert top.token == f"[{TRIGGER}]"
    text = scan.trigger_text(0, 0, n=1)
    assert text == f"'[{TRIGGER}]'@{top.where} x{top.lift:.1f} (n={top.count}, {top.n_prompts} prompts)"
    assert trigger_text([top.to_dict()], 1) == text and trigger_text([], 3) == ""


def test_classify_takes_and_returns_typed_values():
    from sinkmech.dormant.labels import HeadStats, Labels, classify
    from sinkmech.dormant.triggers import Trigger

    t = Trigger("x", 5, "query", 40, 4.0, 10.0, 50.0, 0.9, n_prompts=12, count_validated=38, expected_validated=4.0,
                validated_lift=9.5, prompts_validated=11, p_validated=1e-12, validated=True)
    stats = HeadStats(dormant_fraction=torch.tensor([[0.8, 0.95, 0.02]]),
                      active_fraction=torch.tensor([[0.15, 0.0, 0.9]]),
                      output_norm_dormant=torch.tensor([[0.1, 0.1, float("nan")]]),
                      output_norm_active=torch.tensor([[1.0, float("nan"), 1.0]]))
    labels = classify(stats, [[[t], [], []]], torch.tensor([[10.0, 0.0, 0.0]]), Thresholds())
    assert isinstance(labels, Labels)
    assert labels.modes == (("if_else", "sink", "active"),)
    assert labels.if_else_score[0, 0] == pytest.approx(0.95) and labels.if_else_score[0, 1] == 0.0
    assert any("trigger 'x'@query" in e for e in labels.evidence[0][0])


def test_planted_trigger_is_chosen_on_some_prompts_and_validated_on_others(planted):
    model, corpus, scan = planted
    top = scan.top_trigger(0, 0)
    assert (top.token_id, top.where) == (TRIGGER, "query")
    # brute force: active queries (first-token attention <= low) on TRIGGER, per prompt
    tokens = torch.cat([torch.full((len(corpus), 1), TINY_BOS), corpus], dim=1)
    _, cache = model.run_with_cache(tokens, names_filter="blocks.0.attn.hook_pattern")
    active = cache["pattern", 0][:, 0, 1:, 0] <= scan.thresholds.low
    hits = (active & (tokens[:, 1:] == TRIGGER)).sum(1)
    selected, validated = scan.trigger_split()
    assert set(selected).isdisjoint(validated) and sorted(selected + validated) == list(range(len(corpus)))
    # what chose it is counted on the selection prompts only, what judges it on the others only
    assert top.count == int(hits[selected].sum()) and top.n_prompts == int((hits[selected] > 0).sum())
    assert top.count_validated == int(hits[validated].sum())
    assert top.prompts_validated == int((hits[validated] > 0).sum()) > 0.8 * len(validated)
    assert top.validated and top.validated_lift >= scan.thresholds.min_lift and top.p_validated < 1e-6
    entry = json.loads(scan.to_json())["heads"][0]
    assert entry["mode"] == "if_else" and entry["validated_lift"] == pytest.approx(top.validated_lift)
    assert entry["trigger_selected_on"] == selected and entry["trigger_validated_on"] == validated
    assert entry["trigger"]["validated"] is True


def _modes_over_seeds(kinds: dict, n_prompts: int, seeds, **scan_kw):
    """Scan the planted model on fresh small corpora; per seed the scan."""
    model = planted_model(kinds, cut=13)
    for seed in seeds:
        corpus = planted_corpus(n=n_prompts, seed=100 + seed)
        yield scan_heads(model, corpus, bos="prepend", max_tokens=20, thresholds=Thresholds(min_queries=0, **scan_kw),
                         sweep=False, n_boot=0, options=TINY_RUN)


def test_positional_null_is_never_if_else_even_on_small_corpora():
    """A head whose mode follows position alone (sink before position 13,
    previous token after, a zero <bos> value: every if_else criterion but the
    trigger holds) is not if_else on 24-prompt corpora, even with lax trigger
    counts where chance candidates abound; the planted if_else head next to it
    is found on the same corpora."""
    lax = dict(min_count=2, min_prompts=1)
    for kw in ({}, lax):
        for scan in _modes_over_seeds({0: "if_else", 1: "position"}, 24, range(4), **kw):
            d, a = float(scan.dormant_fraction[0, 1]), float(scan.active_fraction[0, 1])
            th = scan.thresholds
            assert d >= th.if_else_min_dormant and a >= th.if_else_min_active and 1 - d - a <= th.if_else_max_between
            assert scan.output_norm_dormant[0, 1] < th.max_output_ratio * scan.output_norm_active[0, 1]
            assert scan.mode(0, 1) == "mixed" and scan.mode(0, 0) == "if_else"
            assert (scan.top_trigger(0, 0).token_id, scan.top_trigger(0, 0).validated) == (TRIGGER, True)
            # position-adjusted counts: no token of the positional head is over-represented, even when chosen
            # on 12 prompts; whatever the selection proposes, the held-out prompts do not confirm
            assert all(t.lift < 1.5 and not t.validated for t in scan.triggers[0][1])


def test_sweep_at_the_scan_cut_equals_the_streamed_labels(planted):
    """The sweep relabels from per-query records; at the scan's own cut it
    must give exactly the streamed labels (brute force vs fast path)."""
    from sinkmech.dormant.queries import modes_at
    from sinkmech.prompts import token_text

    model, _, scan = planted
    modes, trig = modes_at(scan.records, scan.thresholds, decode=token_text(model))
    assert modes == scan.modes and set(trig) == {(0, 0)}
    assert trig[(0, 0)][0] == scan.top_trigger(0, 0)
    rows = {(r["high"], r["low"]): r for r in scan.sweep}
    assert rows[(0.8, 0.2)]["mode_counts"] == scan.mode_counts()
    # the planted heads attend with ~0 or ~1 to <bos>: every cut finds the same if_else head
    assert all(r["if_else_heads"] == ["L0.H0"] for r in scan.sweep)
    assert all(r["low"] < r["high"] for r in scan.sweep) and len(scan.sweep) == 18


def test_sweep_counts_triggers_once_per_low_cut_as_each_cut_alone_would(planted):
    """threshold_sweep counts triggers once per low cut, for every head any of its high cuts needs:
    a head's triggers do not depend on which other heads are counted beside it, and each row equals
    the cut relabelled on its own (modes_at counting that cut's heads alone)."""
    from dataclasses import replace

    from sinkmech.dormant.queries import SWEEP_LOW, modes_at, sweep_cuts, triggers_at
    from sinkmech.hooks import head_label
    from sinkmech.prompts import token_text

    model, _, scan = planted
    decode, rec = token_text(model), scan.records
    every = [(l, h) for l in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]
    for low in SWEEP_LOW:
        th = replace(scan.thresholds, low=low)
        together = triggers_at(rec, th, every, decode=decode)
        assert any(together.values())  # some head has triggers to compare
        for lh in every:
            alone = triggers_at(rec, th, [lh], decode=decode)[lh]
            assert len(alone) == len(together[lh])
            for a, b in zip(alone, together[lh]):
                # the Poisson tail is evaluated in float64 over every head counted at once: its rounding
                # (1e-16 relative) follows the set; every other field, and the label's prompt-level p, is equal
                assert replace(a, p_validated=None) == replace(b, p_validated=None)
                assert (a.p_validated is None) == (b.p_validated is None)
                assert b.p_validated is None or a.p_validated == pytest.approx(b.p_validated, rel=1e-12)
    for row, (high, low) in zip(scan.sweep, sweep_cuts(), strict=True):
        modes, trig = modes_at(rec, replace(scan.thresholds, high=high, low=low), decode=decode)
        assert (row["high"], row["low"]) == (high, low)
        assert row["if_else_heads"] == [head_label(l, h) for l, h in every if modes[l][h] == "if_else"]
        assert row["mode_counts"] == {m: sum(r.count(m) for r in modes) for m in row["mode_counts"]}


def test_label_uncertainty_from_the_bootstrap(planted):
    _, _, scan = planted
    u = scan.uncertainty
    lo, hi = u.dormant_fraction_ci[..., 0], u.dormant_fraction_ci[..., 1]
    assert (lo <= scan.dormant_fraction + 1e-6).all() and (scan.dormant_fraction <= hi + 1e-6).all()
    # the planted sink head rests on <bos> on every query of every prompt: no spread, the label never moves
    assert lo[0, 1] == hi[0, 1] == 1.0 and u.label_agreement[0, 1] == 1.0
    assert u.label_agreement[0, 0] == 1.0 and 0 < float(hi[0, 0] - lo[0, 0]) < 0.1
    entry = json.loads(scan.to_json())["heads"][0]
    assert entry["uncertainty"]["label_agreement"] == 1.0 and len(entry["uncertainty"]["bimodality_ci"]) == 2


def test_a_trigger_seen_in_one_prompt_is_not_an_if_else_trigger():
    """The planted if-else head, but its trigger occurs in one prompt only (8
    times): enough queries (min_count 5) and a huge lift, yet no evidence that
    the head reads the token rather than that one prompt. The old per-query
    rule labelled it if_else."""
    model = planted_model({0: "if_else"})
    corpus = planted_corpus(n=16, seed=3)
    corpus[corpus == TRIGGER] = 2
    corpus[4, 2::2] = TRIGGER  # 9 occurrences, all in prompt 4 (a selection prompt)
    kw = dict(bos="prepend", max_tokens=20, options=TINY_RUN)
    for min_prompts in (3, 1):  # min_prompts rejects it; without it, validation does (none in the held-out prompts)
        scan = scan_heads(model, corpus, thresholds=Thresholds(min_prompts=min_prompts, min_queries=0), **kw)
        assert float(scan.active_fraction[0, 0]) >= scan.thresholds.if_else_min_active
        assert scan.mode(0, 0) != "if_else" and scan.if_else_heads() == []
    top = scan.top_trigger(0, 0)
    assert (top.token_id, top.n_prompts, top.validated, top.count_validated) == (TRIGGER, 1, False, 0)
    assert top.lift >= scan.thresholds.min_lift and top.count >= scan.thresholds.min_count
    assert any("not validated" in e for e in scan.evidence[0][0])


def test_contrast_finds_a_domain_dormant_head_and_nothing_between_like_corpora():
    """The planted if-else head rests on a corpus without its trigger and wakes
    on one full of it: the contrast finds it, chosen on one half of each
    corpus and confirmed on the other; two corpora drawn alike give nothing."""
    from sinkmech.dormant.contrast import contrast_heads

    model = planted_model({0: "if_else", 1: "sink", 2: "prev", 3: "position"}, cut=13)
    g = torch.Generator().manual_seed(9)

    def corpus(seed: int, trigger_rate: float) -> torch.Tensor:
        return trigger_corpus(32, seed, trigger_rate, g)

    kw = dict(bos="prepend", max_tokens=20, sweep=False, n_boot=0, options=TINY_RUN)
    th = Thresholds(min_queries=0)
    prose, code, prose2 = (scan_heads(model, corpus(s, r),
                                      thresholds=th, **kw) for s, r in ((5, 0.0), (6, 0.5), (7, 0.0)))
    found = contrast_heads(prose, code, name_a="prose", name_b="code")
    assert [(h.layer, h.head) for h in found.confirmed()] == [(0, 0)]
    h = found.confirmed()[0]
    assert h.diff_selected > 0.3 and h.diff_validated > 0.3 and h.diff_validated_ci[0] > 0
    assert h.dormant_a > 0.99 and h.mode_a == "sink"
    assert json.loads(found.to_json())["n_confirmed"] == 1
    assert contrast_heads(prose, prose2).confirmed() == []
    with pytest.raises(ValueError, match="thresholds"):
        contrast_heads(prose, scan_heads(model, corpus(8, 0.1), thresholds=Thresholds(high=0.7, min_queries=0), **kw))


@pytest.mark.parametrize("argv, message", [
    (["heads", "--contrast", "--head", "1.1"], "--contrast runs two whole scans"),
    (["heads", "--findings", "f.json", "--head", "1.1"], "--findings records a whole scan"),
    (["heads", "--contrast", "nope.txt"], "not found"),
    (["heads", "--n-prompts", "8", "--noop-prompts", "8"], "too few"),
])
def test_heads_flags_are_refused_before_the_model_loads(argv, message, monkeypatch, capsys):
    from sinkmech import cli
    from sinkmech.loading import models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("error:") and "Traceback" not in err


def test_noop_heads_takes_the_if_else_heads_first_and_caps_them():
    """Every if-else head, then the best-ranked others; --noop-max-heads keeps the first N
    (a first look), 'all' every one; a bad value is refused by the flag's type."""
    from types import SimpleNamespace

    from sinkmech.cli.flags import count_or_all
    from sinkmech.dormant.noop import noop_heads

    scan = SimpleNamespace(if_else_heads=lambda: [(3, 1), (0, 2)], ranked=lambda: [(3, 1), (5, 0), (0, 2), (1, 1), (2, 2)])
    assert noop_heads(scan, 2) == [(3, 1), (0, 2), (5, 0), (1, 1)]
    assert noop_heads(scan, 2, max_heads=3) == [(3, 1), (0, 2), (5, 0)]
    assert noop_heads(scan, 0, max_heads=3) == []
    assert count_or_all("all") is None and count_or_all("4") == 4
    from sinkmech import cli

    assert cli.main(["heads", "--noop-max-heads", "some"]) == 2
