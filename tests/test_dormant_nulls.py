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
from tests.conftest import TINY_BOS
from tests.planted import MARKER, TRIGGER, planted_corpus, planted_dormant_model

KW = dict(bos="prepend", bos_token_id=TINY_BOS, max_tokens=20, progress=False)


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
    scan = scan_heads(model, prompt_corpus(), min_queries=0, **KW)
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
