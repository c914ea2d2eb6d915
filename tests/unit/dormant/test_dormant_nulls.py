"""The dormant-head tests against their nulls: a head whose activity follows its
prompt is not given a trigger by the prompt-level test (the query-level Poisson
test would give it one), the planted if-else head still validates on 200
prompts while the positional null never does, and a within-corpus null
contrast confirms nothing."""

from __future__ import annotations

import json

import pytest
import torch

from sinkmech.dormant.scan import scan_heads
from helpers.tiny import TINY_RUN, TINY_BOS
from helpers.backends import require
from helpers.planted import planted_dormant_model
from sinkmech.dormant.planted import MARKER, TRIGGER, planted_corpus, trigger_corpus
from sinkmech.dormant.labels import Thresholds
from sinkmech.options import QUIET

KW = dict(bos="prepend", max_tokens=20, options=TINY_RUN)


def prompt_corpus(n: int = 64, seed: int = 0) -> torch.Tensor:
    """One prompt in five opens with MARKER and is 40 % TRIGGER; the others hold
    TRIGGER at 2 % of positions and no MARKER."""
    g = torch.Generator().manual_seed(seed)
    c = torch.randint(2, 50, (n, 20), generator=g)
    c[(c == TRIGGER) | (c == MARKER)] = 2
    marked = torch.arange(n) % 5 == 0
    rate = torch.where(marked, 0.4, 0.02)[:, None]
    c[torch.rand(c.shape, generator=g) < rate] = TRIGGER
    c[marked, 0] = MARKER
    return c


def test_a_head_that_follows_its_prompt_has_no_trigger_at_the_prompt_level():
    """Head 0 is active on whole prompts (those that open with MARKER), whatever
    the query token; TRIGGER is merely common in those prompts. Counted query by
    query, TRIGGER@query passes every validation rule (lift, count, prompts, a
    Poisson p far below the Bonferroni level); with the prompt as the unit its
    excess over the prompt's own activity is nil, and it is not validated.
    Head 1, a planted if-else head on TRIGGER, validates on the same corpus."""
    model = planted_dormant_model({0: "prompt", 1: "if_else"})
    scan = scan_heads(model, prompt_corpus(), thresholds=Thresholds(min_queries=0), **KW)
    th = scan.thresholds
    max_p = th.alpha / (scan.n_layers * scan.n_heads)
    assert 0.1 < float(scan.active_fraction[0, 0]) < 0.3 and float(scan.dormant_fraction[0, 0]) > 0.7
    (t,) = [t for t in scan.triggers[0][0] if (t.token_id, t.where) == (TRIGGER, "query")]
    # the query-level rule would validate it
    assert t.validated_lift >= th.min_lift and t.count_validated >= th.min_count
    assert t.prompts_validated >= th.min_prompts and t.p_validated < max_p * 1e-3
    # the prompt-level tests do not: the t test ...
    assert t.trigger_test == "prompt_t" and t.trigger_p > 0.05 and not t.validated
    # ... nor the permutation test over prompts, run on it as if it were the chosen one
    from sinkmech.dormant.triggers import TriggerRule, judge_by_prompt

    rec = scan.records
    only = [[[t] if (l, h) == (0, 0) else [] for h in range(scan.n_heads)] for l in range(scan.n_layers)]
    rule = TriggerRule(th.min_lift, th.min_count, th.min_prompts, max_p)
    (judged,) = judge_by_prompt(only, rec.tokens, rec.valid, rec.active(th.low), rec.key, rule=rule)[0][0]
    assert judged.trigger_p > 0.05 and judged.trigger_p_perm > 0.05 and not judged.validated
    assert judged.coverage > 0.3 and abs(judged.coverage_beyond_chance) < 0.05  # common there, but no more than chance
    (good,) = [t for t in scan.triggers[0][1] if (t.token_id, t.where) == (TRIGGER, "query")]
    assert good.trigger_test == "prompt_t" and good.trigger_p < max_p and good.validated and good.trigger_p_perm < max_p
    assert scan.mode(0, 1) == "if_else"
    entry = json.loads(scan.to_json())["heads"][1]
    assert entry["trigger_test"] == "prompt_t" and entry["trigger_p"] == pytest.approx(good.trigger_p)


def test_planted_if_else_validates_on_200_prompts_and_the_positional_null_never_does():
    model = planted_dormant_model({0: "if_else", 1: "position"}, cut=13)
    scan = scan_heads(model, planted_corpus(n=200, seed=11), sweep=False, n_boot=0, **KW)
    top = scan.top_trigger(0, 0)
    assert scan.mode(0, 0) == "if_else" and (top.token_id, top.where) == (TRIGGER, "query")
    assert top.trigger_test == "prompt_t" and top.trigger_p < 1e-10 and top.trigger_p_perm == pytest.approx(1 / 20001) and top.validated  # at the floor
    assert scan.mode(0, 1) != "if_else"
    assert not any(t.validated for t in scan.triggers[0][1])


def test_null_contrasts_confirm_nothing_and_the_planted_head_stands_out_from_the_shift():
    """Prose (no trigger) against code (half trigger): the planted if-else head is
    confirmed and domain-specific; the rule between two halves of one corpus (the
    nulls) confirms nothing; the population shift is the median over every head
    with its interval, and most heads (random or planted alike) do not move."""
    from sinkmech.dormant.contrast import contrast_heads

    model = planted_dormant_model({0: "if_else", 1: "sink", 2: "prev", 3: "position"}, cut=13)
    g = torch.Generator().manual_seed(9)

    def corpus(seed: int, trigger_rate: float) -> torch.Tensor:
        return trigger_corpus(48, seed, trigger_rate, g)

    kw = dict(KW, sweep=False, n_boot=0, thresholds=Thresholds(min_queries=0))
    prose, code = (scan_heads(model, corpus(s, r), **kw) for s, r in ((5, 0.0), (6, 0.5)))
    found = contrast_heads(prose, code, name_a="prose", name_b="code", n_boot=20_000)
    assert [(h.layer, h.head) for h in found.confirmed()] == [(0, 0)]
    assert [(h.layer, h.head) for h in found.domain_specific()] == [(0, 0)]
    h = found.confirmed()[0]
    assert h.vs_shift_ci[0] > 0 and h.vs_shift == pytest.approx(h.diff_validated - found.population_shift["median_validated"])
    shift = found.population_shift
    assert shift["ci"][0] <= shift["median"] <= shift["ci"][1] and abs(shift["median"]) < 0.05
    assert [n.name for n in found.null_contrasts] == ["prose vs prose", "code vs code"]
    assert all(n.n_confirmed == 0 and n.n_prompts_a == 24 for n in found.null_contrasts)
    assert found.powered and found.power["reason"] == "the null contrasts confirm no head"
    d = json.loads(found.to_json())
    assert [n["n_confirmed"] for n in d["null_contrasts"]] == [0, 0] and len(d["diff_all"]) == 2
    assert d["power"]["powered"] is True
    assert set(d["population_shift"]) >= {"median", "ci"} and d["n_boot"] == 20_000


def test_matched_control_takes_the_other_mode_at_the_nearest_positions():
    from sinkmech.dormant.noop import matched_control

    valid = torch.ones(2, 10, dtype=torch.bool)
    valid[:, 0] = False
    mode = torch.zeros(2, 10, dtype=torch.bool)
    other = torch.zeros(2, 10, dtype=torch.bool)
    mode[0, [3, 7]] = True
    other[0, [1, 4, 8, 9]] = True
    mode[1, [2, 5, 6]] = True
    other[1, [9]] = True  # one of the other mode: then the nearest "between" queries
    got = matched_control(mode, other, valid)
    assert got[0].nonzero()[:, 0].tolist() == [4, 8]
    assert got[1].nonzero()[:, 0].tolist() == [4, 7, 9]  # 9 for position 2; then between ones: 4 for 5, 7 for 6
    assert not (got & mode).any()


def test_noop_check_reports_totals_controls_mean_ablation_holm_and_where_active_queries_look():
    """The planted if-else head: zeroing it and moving it to <bos> cost nothing
    on dormant queries; on active ones far more than on the matched
    control (dormant queries at the nearest positions). Its active queries look
    at the previous token. Mean-ablation equals a hand-made mean replacement;
    zero-out minus mean-ablation is paired on the same queries. Holm's
    p-values are the raw ones stepped up over the stated primary family (active
    minus matched control, per head and intervention) and nowhere else."""
    from sinkmech.dormant.noop import noop_check, with_primary
    from sinkmech.stats import holm
    from sinkmech.hooks import act_name, mean_head_hook
    from sinkmech.measures.loss import token_losses
    from sinkmech.prompts import tokenize

    model = planted_dormant_model({0: "if_else", 1: "sink"})
    batch = tokenize(model, planted_corpus(n=16, seed=4), bos="prepend", bos_token_id=TINY_BOS, max_tokens=20)
    check = noop_check(model, batch, [(0, 0), (0, 1)], options=QUIET)
    r = check.results[0]
    c = r.checks
    assert set(c) == {f"{i}_{m}" for i in ("move_to_first", "zero_out", "mean_ablate") for m in ("dormant", "active")}
    act = c["zero_out_active"]
    assert act["total"]["value"] == pytest.approx(act["per_query"]["value"] * act["n_queries"], rel=1e-6)
    assert act["per_query"]["ci"][0] <= act["per_query"]["value"] <= act["per_query"]["ci"][1]
    ctrl = act["matched_control"]
    assert ctrl["n_queries"] == act["n_queries"]  # dormant queries abound
    # the random model's loss moves either way when the head wakes; resting queries barely move
    assert abs(act["per_query"]["value"]) > 100 * abs(ctrl["per_query"]["value"])
    assert ctrl["difference"]["value"] == pytest.approx(act["per_query"]["value"] - ctrl["per_query"]["value"])
    # in total too: ~300 resting queries cost far less than ~30 waking ones
    assert abs(c["move_to_first_dormant"]["total"]["value"]) < 0.01 * abs(c["move_to_first_active"]["total"]["value"])
    assert r.active_looks["previous"] > 0.95 and r.active_looks["n_queries"] == r.n_active
    assert sum(v for k, v in r.active_looks.items() if k != "n_queries") == pytest.approx(1.0, abs=1e-4)
    # mean ablation by hand: the head's mean z over the real queries, on its active queries
    _, cache = model.run_with_cache(batch.tokens, names_filter="blocks.0.attn.hook_z")
    valid = batch.mask.clone()
    valid[:, 0] = False
    mean = cache["z", 0][:, :, 0][valid].mean(0)
    pattern = model.run_with_cache(batch.tokens, names_filter="blocks.0.attn.hook_pattern")[1]["pattern", 0]
    active = (pattern[:, 0, :, 0] <= check.low) & valid
    clean = token_losses(model, batch.tokens)
    hooked = token_losses(model, batch.tokens, [(act_name("z", 0), mean_head_hook(0, mean, active))])
    want = float((hooked - clean).sum()) / int(active.sum())
    assert c["mean_ablate_active"]["per_query"]["value"] == pytest.approx(want, rel=1e-4)
    # zero-out against mean-ablation on the same queries, paired by prompt (secondary)
    paired = c["zero_out_active"]["minus_mean_ablate"]
    assert paired["value"] == pytest.approx(c["zero_out_active"]["per_query"]["value"]
                                            - c["mean_ablate_active"]["per_query"]["value"], abs=1e-9)
    assert paired["role"] == "secondary" and paired["p_adjusted"] is None
    # Holm over the primary family only: per head and intervention, active minus matched control
    primary = [res.checks[f"{i}_active"]["matched_control"]["difference"] for res in check.results
               for i in ("move_to_first", "zero_out", "mean_ablate")]
    # 2 heads x 3 interventions named; the sink head never wakes, so its 3 have no test and the family holds 3
    assert len(check.primary_family["tests"]) == 6 and primary[3:] == [None] * 3
    primary = primary[:3]
    assert check.n_intervals == check.primary_family["size"] == 3
    assert all(e["role"] == "primary" and e["p_adjusted"] >= e["p"] - 1e-12 for e in primary)
    smallest = min(primary, key=lambda e: e["p"])
    assert smallest["p_adjusted"] == pytest.approx(min(1.0, smallest["p"] * 3))
    secondary = [e for res in check.results for entry in res.checks.values()
                 for e in (entry["total"], entry["per_query"], entry["matched_control"]["per_query"]) if e is not None]
    assert secondary and all(e["role"] == "secondary" and e["p_adjusted"] is None for e in secondary)
    # narrowed to the if-else head: a family of 3, the candidate's tests secondary and unadjusted
    narrowed = with_primary(check, [(0, 0)])
    d = json.loads(narrowed.to_json())
    assert d["primary_family"]["size"] == d["n_intervals"] == 3 and "primary family only" in d["correction"]
    assert [t["head"] for t in d["primary_family"]["tests"]] == ["L0.H0"] * 3
    assert all(e is None or e["p_adjusted"] is None for entry in narrowed.results[1].checks.values()
               for e in (entry["per_query"], entry["matched_control"]["difference"]))
    first = narrowed.results[0].checks["zero_out_active"]["matched_control"]["difference"]
    assert first["p_adjusted"] == pytest.approx(min(1.0, holm([narrowed.results[0].checks[f"{i}_active"][
        "matched_control"]["difference"]["p"] for i in ("move_to_first", "zero_out", "mean_ablate")])[1]))
    assert check.results[0].checks["zero_out_active"]["matched_control"]["difference"]["role"] == "primary"  # unchanged


def test_calibration_recovers_planted_heads_labels_no_null_and_picks_its_cut_by_the_rule():
    """The calibration study on one seed: the positional null and the random
    heads are if_else at no cut, the full-strength planted head at every cut,
    the prompt-following head only on its marker key, never on the token that
    shares its prompts; the chosen cut is the rule's (most planted heads, no
    null; ties to the larger high, then the larger low), and the result
    records the config that reruns it."""
    from sinkmech.options import QUIET
    from sinkmech.studies.calibration import run, table
    from sinkmech.studies.configs import STUDIES, CalibrationConfig

    require("from_config", why="planted heads are set in a HookedTransformer's weights")
    assert STUDIES["calibration"] is CalibrationConfig
    cfg = CalibrationConfig(seeds=1, n_prompts=32)
    result = run(None, cfg, QUIET)
    out = json.loads(result.to_json())
    cuts = list(out["cuts"].values())
    assert len(cuts) == 18 and all(c["runs"] == len(cfg.strengths) for c in cuts)
    assert all(c["null_if_else"] == 0 and c["random_if_else"] == 0 for c in cuts)
    assert all(c["recovered_by_strength"]["1"] == 1 for c in cuts)
    assert all(c["prompt_triggers"] in ([], [f"[{MARKER}]"]) for c in cuts)
    best = max(cuts, key=lambda c: (c["if_else_recovered"], c["high"], c["low"]))
    assert out["chosen"] == {"high": best["high"], "low": best["low"]}
    assert CalibrationConfig.from_dict(out["config"]) == cfg and "chosen" in table(result)
    assert result.findings()["dormant_calibration"]["dormant_calibration.n_planted"] == len(cfg.strengths)


def _judged_on(active: torch.Tensor, tokens: torch.Tensor, seed: int):
    """The permutation test of TRIGGER@query for each head of `active` [prompt, head, pos]."""
    from sinkmech.dormant.triggers import Trigger, TriggerRule, judge_by_prompt

    n, H, P = active.shape
    valid = torch.ones(n, P, dtype=torch.bool)
    valid[:, 0] = False
    cand = [[[Trigger("t", TRIGGER, "query", 10, 1.0, 5.0, 9.0, None, 3, 10, 1.0, 5.0, 5)] for _ in range(H)]]
    judged = judge_by_prompt(cand, tokens, valid, active[:, None] & valid[:, None, None], torch.zeros(n, 1, H, P,
                             dtype=torch.long), rule=TriggerRule(min_lift=3.0, min_count=5, min_prompts=3, max_p=0.05),
                             n_permutations=500, seed=seed)
    return [judged[0][h][0] for h in range(H)]


def test_the_trigger_t_test_keeps_its_size_on_planted_nulls_with_skewed_counts():
    """Why the one-sided t test over prompts may judge a trigger on as few as 8
    prompts with skewed counts: on planted nulls it rejects no more often than
    its level. Head 1 wakes by position, more often late, and more in some
    prompts than others, whatever the token; head 0 wakes exactly on TRIGGER
    (the planted effect: found by both tests, the permutation test's p at its
    floor, coverage 1). Two regimes, 400 corpora each: TRIGGER common (10 % of
    positions) and rare (2 %: it occurs in about 7 of the 20 validation prompts,
    mostly once). Measured rejections of the null at 0.05 / 0.01 (of 400;
    binomial sd 1.1 % / 0.5 %): t test common 12 / 0, rare 3 / 1; permutation
    test common 21 / 2, rare 15 / 2. The t test keeps its level and is
    conservative where the token is rare: it costs power, not false triggers."""
    g = torch.Generator().manual_seed(0)
    n = 400
    for rate, t_max in ((0.1, (0.08, 0.025)), (0.02, (0.08, 0.025))):
        t_rej, p_rej = [0, 0], [0, 0]
        for rep in range(n):
            tokens = torch.randint(2, 50, (40, 20), generator=g)
            tokens[tokens == TRIGGER] = 2
            tokens[torch.rand(40, 20, generator=g) < rate] = TRIGGER
            level = torch.rand(40, 1, generator=g) * 0.5
            null = torch.rand(40, 20, generator=g) < level * torch.linspace(0.2, 1.0, 20)
            found, kept = _judged_on(torch.stack([tokens == TRIGGER, null], 1), tokens, seed=rep)
            if rep == 0 and rate == 0.1:
                assert found.trigger_p_perm == pytest.approx(1 / 501) and found.coverage == 1.0
                assert found.coverage_beyond_chance > 0.5 and found.trigger_p < 1e-6
            for i, alpha in enumerate((0.05, 0.01)):
                t_rej[i] += (kept.trigger_p if kept.trigger_p is not None else 1.0) < alpha
                p_rej[i] += kept.trigger_p_perm < alpha
        assert t_rej[0] / n <= t_max[0] and t_rej[1] / n <= t_max[1]
        assert p_rej[0] / n <= t_max[0] and p_rej[1] / n <= t_max[1]


def test_a_contrast_too_small_for_its_nulls_has_no_power_and_one_corpus_twice_is_refused():
    """The planted domain-dormant head, on 6 prompts per corpus: the rule still runs, but the null
    contrasts cannot (they need 8), so nothing is confirmed in words: `powered` is False with the
    reason; the same scan on both sides is refused."""
    from sinkmech.dormant.contrast import contrast_heads

    model = planted_dormant_model({0: "if_else", 1: "sink", 2: "prev", 3: "position"}, cut=13)
    g = torch.Generator().manual_seed(9)
    kw = dict(KW, sweep=False, n_boot=0, thresholds=Thresholds(min_queries=0))
    prose, code = (scan_heads(model, trigger_corpus(6, s, r, g), **kw) for s, r in ((5, 0.0), (6, 0.5)))
    small = contrast_heads(prose, code, name_a="prose", name_b="code", n_boot=2_000)
    assert small.null_contrasts == () and small.powered is False
    assert small.power["reason"].startswith("no power: 6 prompts") and json.loads(small.to_json())["power"]["powered"] is False
    assert contrast_heads(prose, code, nulls=False, n_boot=2_000).power["powered"] is None  # not assessed
    with pytest.raises(ValueError, match="one corpus twice"):
        contrast_heads(prose, prose)


def test_the_command_says_no_power_instead_of_confirming(monkeypatch, tmp_path, capsys):
    """`heads --contrast` on 6 prompts per corpus prints the reason, judges no head, and quotes
    no confirmed head in --findings."""
    from helpers.tiny import serve_tiny

    from sinkmech.cli import main

    serve_tiny(monkeypatch, 5)
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("\n".join(f"the cat sat on mat {i} while dogs ran far away" for i in range(6)) + "\n")
    b.write_text("\n".join(f"def f{i} ( x ) : return x + {i} and not x" for i in range(6)) + "\n")
    findings = tmp_path / "f.json"
    assert main(["heads", "--prompts", str(a), "--contrast", str(b), "--max-tokens", "12", "--findings",
                 str(findings)]) == 0
    out = capsys.readouterr().out
    assert "no power: 6 prompts" in out and "chosen heads confirmed" not in out
    f = json.loads(findings.read_text())
    assert [v for k, v in f.items() if k.endswith(".contrast.power.powered")] == [False]
    assert not any(v for k, v in f.items() if k.endswith(".contrast.confirmed_heads"))


def test_noop_check_over_documents_sums_each_documents_prompts_first():
    """Windows cut from one document are not independent: with `documents` the
    no-op check's t intervals run over documents (each document's loss changes
    and query counts summed first). The estimates do not move; one document
    per prompt gives the prompt intervals exactly; grouped, each interval's p
    is the t test's on (documents - 1) degrees of freedom (the cluster form
    against per-document sums by hand: tests/unit/test_stats.py); a documents
    list of the wrong length is refused."""
    from sinkmech.dormant.noop import noop_check
    from sinkmech.prompts import tokenize
    from sinkmech.stats import t_quantile, t_sf

    model = planted_dormant_model({0: "if_else", 1: "sink"})
    batch = tokenize(model, planted_corpus(n=12, seed=5), bos="prepend", bos_token_id=TINY_BOS, max_tokens=20)
    by_prompt = noop_check(model, batch, [(0, 0)], options=QUIET)
    own = noop_check(model, batch, [(0, 0)], documents=[f"d{i}" for i in range(12)], options=QUIET)
    docs = [f"d{i // 3}" for i in range(12)]  # 4 documents of 3 windows each
    grouped = noop_check(model, batch, [(0, 0)], documents=docs, options=QUIET)
    a, b, g = by_prompt.results[0].checks, own.results[0].checks, grouped.results[0].checks
    for key in a:
        for e_a, e_b in ((a[key]["per_query"], b[key]["per_query"]), (a[key]["total"], b[key]["total"])):
            if e_a is not None:
                assert e_b["value"] == pytest.approx(e_a["value"], rel=1e-12)
                assert e_b["ci"] == pytest.approx(e_a["ci"], rel=1e-9)
        if a[key]["per_query"] is not None:
            assert g[key]["per_query"]["value"] == pytest.approx(a[key]["per_query"]["value"], rel=1e-12)
    assert own.n_documents == 12 and grouped.n_documents == 4 and by_prompt.n_documents is None
    d = json.loads(grouped.to_json())
    assert d["n_documents"] == 4 and d["n_prompts"] == 12 and "4 documents the 12 prompts" in d["interval"]
    assert "t intervals over prompts (per-query" in json.loads(by_prompt.to_json())["interval"]
    # the grouped intervals have 4 units: their p-value is the t test's on 3 degrees of freedom
    for key in g:
        e = g[key]["per_query"]
        if e is None or e["ci"][1] == e["value"]:
            continue
        se = (e["ci"][1] - e["value"]) / t_quantile(0.975, 3)
        assert e["p"] == pytest.approx(min(1.0, 2 * t_sf(abs(e["value"]) / se, 3)), rel=1e-9)
    with pytest.raises(ValueError, match="documents names 3"):
        noop_check(model, batch, [(0, 0)], documents=["a", "b", "c"], options=QUIET)
