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
from helpers.planted import MARKER, TRIGGER, planted_corpus, planted_dormant_model, trigger_corpus
from helpers.paths import REPO
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
    # the prompt-level test does not
    assert t.trigger_test == "prompt_t" and t.trigger_p > 0.05 and not t.validated
    (good,) = [t for t in scan.triggers[0][1] if (t.token_id, t.where) == (TRIGGER, "query")]
    assert good.trigger_test == "prompt_t" and good.trigger_p < max_p and good.validated
    assert scan.mode(0, 1) == "if_else"
    entry = json.loads(scan.to_json())["heads"][1]
    assert entry["trigger_test"] == "prompt_t" and entry["trigger_p"] == pytest.approx(good.trigger_p)


def test_planted_if_else_validates_on_200_prompts_and_the_positional_null_never_does():
    model = planted_dormant_model({0: "if_else", 1: "position"}, cut=13)
    scan = scan_heads(model, planted_corpus(n=200, seed=11), sweep=False, n_boot=0, **KW)
    top = scan.top_trigger(0, 0)
    assert scan.mode(0, 0) == "if_else" and (top.token_id, top.where) == (TRIGGER, "query")
    assert top.trigger_test == "prompt_t" and top.trigger_p < 1e-10 and top.validated
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
    d = json.loads(found.to_json())
    assert [n["n_confirmed"] for n in d["null_contrasts"]] == [0, 0] and len(d["diff_all"]) == 2
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
    Holm's p-values are the raw ones stepped up over the whole family."""
    from sinkmech.dormant.noop import noop_check
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
    # Holm over every interval of the check
    effects = [e for res in check.results for entry in res.checks.values()
               for e in (entry["total"], entry["per_query"], entry["matched_control"]["per_query"],
                         entry["matched_control"]["difference"]) if e is not None]
    assert len(effects) == check.n_intervals > 12
    assert all(e["p_adjusted"] >= e["p"] - 1e-12 for e in effects)
    smallest = min(effects, key=lambda e: e["p"])
    assert smallest["p_adjusted"] == pytest.approx(min(1.0, smallest["p"] * len(effects)))
    assert json.loads(check.to_json())["heads"][0]["checks"]["zero_out_active"]["per_query"]["p_adjusted"] is not None


def test_calibration_recovers_planted_heads_labels_no_null_and_picks_its_cut_by_the_rule(tmp_path):
    """scripts/calibrate_dormant.py on one seed: the positional null and the
    random heads are if_else at no cut, the full-strength planted head at every
    cut, the prompt-following head only on its marker key, never on the token
    that shares its prompts; the chosen cut is the rule's (most planted heads,
    no null; ties to the larger high, then the larger low)."""
    import importlib.util

    path = REPO / "scripts" / "calibrate_dormant.py"
    spec = importlib.util.spec_from_file_location("calibrate_dormant", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.main(["--seeds", "1", "--n-prompts", "32", "--json", str(tmp_path / "c.json")])
    cuts = list(out["cuts"].values())
    assert all(c["null_if_else"] == 0 and c["random_if_else"] == 0 for c in cuts)
    assert all(c["recovered_by_strength"]["1"] == 1 for c in cuts)
    assert all(c["prompt_triggers"] in ([], [f"[{MARKER}]"]) for c in cuts)
    best = max(cuts, key=lambda c: (c["if_else_recovered"], c["high"], c["low"]))
    assert out["chosen"] == {"high": best["high"], "low": best["low"]}
    assert json.loads((tmp_path / "c.json").read_text())["chosen"] == out["chosen"]
