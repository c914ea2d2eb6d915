"""The domains study: the headline tables per corpus, intervals over documents,
and where a finding holds on one corpus only."""

from __future__ import annotations

import pytest

from sinkmech.corpora import corpus

from helpers.tiny import WordTokenizer, make_tiny, toy_tokenizer
from sinkmech.options import QUIET
from sinkmech.studies.config import ConfigError
from sinkmech.studies.configs import STUDIES, DomainsConfig
from sinkmech.studies.domains import holds_on, run


def test_the_domains_config_is_registered_and_checked():
    assert STUDIES["domains"] is DomainsConfig
    assert DomainsConfig().domains == ("pydoc", "licenses")
    with pytest.raises(ConfigError, match="unknown domain"):
        DomainsConfig(domains=("novels",)).check()
    with pytest.raises(ConfigError, match="windows of a corpus"):
        DomainsConfig(n_prompts=500).check()
    assert DomainsConfig.from_dict(DomainsConfig().to_dict()) == DomainsConfig()


def test_holds_on_names_the_corpora_where_each_finding_is_detected():
    def table(gap, cost, n_if_else):
        return {"sink_rate_gap": {"0.3": {"value": gap[0], "ci": gap[1:]}},
                "bos_cost": {"value": cost[0], "ci": cost[1:]}, "heads": {"n_if_else": n_if_else}}

    found = holds_on({"pydoc": table((-70.0, -75.0, -65.0), (2.9, 2.8, 3.0), 3),
                      "licenses": table((-1.0, -3.0, 1.0), (2.5, 2.3, 2.7), 0)})
    assert found == {"sink_rate_falls_without_bos.0.3": ["pydoc"], "loss_rises_without_bos": ["pydoc", "licenses"],
                     "if_else_heads": ["pydoc"]}


def test_the_study_runs_both_corpora_with_intervals_over_documents(monkeypatch):
    model = make_tiny(0)
    toy_tokenizer(monkeypatch, model, WordTokenizer())
    cfg = DomainsConfig(models=("tiny",), n_prompts=12, max_tokens=16, scan_prompts=8, n_boot=200)
    out = run([model], cfg, QUIET).to_dict()
    assert out["config"] == cfg.to_dict()
    (name,) = [k for k in out if k not in ("config", "seconds")]
    for domain in ("pydoc", "licenses"):
        t = out[name]["domain"][domain]
        docs = t["corpus"]["n_documents"]
        assert docs == corpus(domain).part(0, 12).n_documents and t["corpus"]["n_prompts"] == 12
        rate = t["sink_rate"]["prepend"]["0.3"]
        assert rate["n_documents"] == docs and rate["method"] == ("bca" if docs <= 16 else "percentile")
        assert rate["ci"][0] <= rate["value"] <= rate["ci"][1]
        assert t["bos_cost"]["value"] == pytest.approx(t["loss"]["none"]["value"] - t["loss"]["prepend"]["value"])
        assert list(t["heads"])[0] == "sweep"  # the sweep comes first
    assert set(out[name]["one_domain_only"]) <= set(out[name]["holds_on"])
