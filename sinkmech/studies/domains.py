"""The headline tables on two kinds of text: does a finding hold on one corpus only?

Every real-model number of the paper's Table 2 comparison (Barbero et al.
2025) was measured on one corpus, windows of the Python documentation. This
study reruns the headline measures on each named corpus (`sinkmech.corpora`:
"pydoc", and "licenses", the legal prose installed with the packages), per
model:

- the sink rate (percent of (prompt, head) pairs with alpha_0 > eps; Gu et al.
  2025) with and without `<bos>`, and the paired change;
- the `<bos>` cost: the mean next-token loss on the same content targets with
  and without `<bos>`, and the paired change (`sinkmech.measures.sinks`);
- the if-else heads of the dormant-head scan at the default cut, with the
  threshold sweep first (`sinkmech.dormant.scan`; no no-op check here).

Windows of one document are not independent: every interval is a cluster
bootstrap over the documents (`sinkmech.stats`, BCa at 16 documents or
fewer), and each number says how many documents it rests on. `holds_on`
names, per finding, the corpora where it is detected, so a reader sees where
it holds on one corpus only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sinkmech.corpora import corpus
from sinkmech.hooks import head_label
from sinkmech.loading.backend import Model
from sinkmech.measures.sinks import format_eps, sink_scores
from sinkmech.options import RunOptions
from sinkmech.prompts import CONDITIONS
from sinkmech.results import Result
from sinkmech.stats import Interval, bootstrap_method, ratio_interval
from sinkmech.studies.configs import DomainsConfig


def _iv(x: Interval | None) -> dict | None:
    return None if x is None else {"value": x.value, "ci": x.ci, "method": x.method, "n_documents": x.n_units}


def domain_tables(model: Model, domain: str, config: DomainsConfig = DomainsConfig(),
                  options: RunOptions = RunOptions()) -> dict:
    """One model on one corpus: sink rates and loss with and without `<bos>`,
    their paired changes, and the dormant-head scan (sweep first). Intervals:
    cluster bootstrap over the corpus's documents."""
    whole = corpus(domain)  # the 170 default windows: the first n_prompts are the ones the other commands read
    texts = whole.part(0, config.n_prompts)
    groups, n_boot = list(texts.documents), config.n_boot
    runs = {c: sink_scores(model, list(texts.prompts), bos=c, max_tokens=config.max_tokens, loss=True, options=options)
            for c in CONDITIONS}
    pre, none = runs["prepend"], runs["none"]
    targets = pre.prompt_targets().double()

    def rate(run, eps):
        return ratio_interval(run.prompt_sink_rate(eps), groups=groups, n_boot=n_boot)

    out: dict = {
        "corpus": {k: v for k, v in texts.to_dict().items() if k != "documents"},
        "interval": f"cluster bootstrap over the {texts.n_documents} documents ({bootstrap_method(texts.n_documents)}, "
                    f"{n_boot} resamples)",
        "sink_rate": {c: {format_eps(e): _iv(rate(runs[c], e)) for e in config.eps} for c in CONDITIONS},
        "sink_rate_gap": {format_eps(e): _iv(ratio_interval(none.prompt_sink_rate(e) - pre.prompt_sink_rate(e),
                                                            groups=groups, n_boot=n_boot)) for e in config.eps},
        "loss": {c: _iv(ratio_interval(runs[c].prompt_loss, targets, groups=groups, n_boot=n_boot)) for c in CONDITIONS},
        "bos_cost": _iv(ratio_interval(none.prompt_loss - pre.prompt_loss, targets, groups=groups, n_boot=n_boot)),
    }
    if config.scan_prompts > 0:
        out["heads"] = _scan(model, whole.part(0, config.scan_prompts), config, options)
    return out


def _scan(model: Model, texts, config: DomainsConfig, options: RunOptions) -> dict:
    from sinkmech.dormant.scan import scan_heads

    scan = scan_heads(model, list(texts.prompts), bos="prepend", max_tokens=config.max_tokens, n_boot=0, options=options)
    found = scan.if_else_heads()
    return {
        "sweep": {f"{r['high']:g}_{r['low']:g}": {"high": r["high"], "low": r["low"], **r["mode_counts"],
                                                   "if_else_heads": list(r["if_else_heads"])} for r in scan.sweep or ()},
        "n_prompts": scan.n_prompts, "n_documents": texts.n_documents,
        "high": scan.thresholds.high, "low": scan.thresholds.low,
        "mode_counts": scan.mode_counts(), "n_if_else": len(found),
        "if_else_heads": [head_label(l, h) for l, h in found],
        "triggers": {head_label(l, h): scan.top_trigger(l, h).token for l, h in found},
    }


def holds_on(per_domain: dict[str, dict]) -> dict[str, list[str]]:
    """Per finding, the corpora where it is detected: the paired sink-rate
    change and the `<bos>` cost where their intervals exclude zero (by sign),
    and "if_else_heads" where the scan labels any."""
    out: dict[str, list[str]] = {}

    def add(name: str, domain: str) -> None:
        out.setdefault(name, []).append(domain)

    for domain, t in per_domain.items():
        for eps, g in t["sink_rate_gap"].items():
            if g is not None and not g["ci"][0] <= 0.0 <= g["ci"][1]:
                add(f"sink_rate_{'falls' if g['value'] < 0 else 'rises'}_without_bos.{eps}", domain)
        c = t["bos_cost"]
        if c is not None and not c["ci"][0] <= 0.0 <= c["ci"][1]:
            add(f"loss_{'rises' if c['value'] > 0 else 'falls'}_without_bos", domain)
        if t.get("heads", {}).get("n_if_else"):
            add("if_else_heads", domain)
    return out


@dataclass(frozen=True)
class Domains(Result):
    """Per model and corpus: the headline tables (`domain_tables`) and where each finding holds."""

    tables: dict[str, dict[str, dict]]  # model -> domain -> tables
    config: DomainsConfig
    seconds: float

    def to_dict(self) -> dict:
        domains = list(self.config.domains)
        return {"config": self.config.to_dict(), "seconds": round(self.seconds, 1),
                **{m: {"domain": t, "holds_on": holds_on(t),
                       "one_domain_only": {k: v for k, v in holds_on(t).items() if len(domains) > 1 and len(v) == 1}}
                   for m, t in self.tables.items()}}

    def to_dataframe(self):
        import pandas as pd

        rows = []
        for m, by_domain in self.tables.items():
            for d, t in by_domain.items():
                for c in CONDITIONS:
                    for eps, v in t["sink_rate"][c].items():
                        rows.append({"model": m, "domain": d, "measure": f"sink_rate_{eps}", "bos": c, **_row(v)})
                    rows.append({"model": m, "domain": d, "measure": "loss", "bos": c, **_row(t["loss"][c])})
                rows.append({"model": m, "domain": d, "measure": "bos_cost", "bos": "none_minus_prepend",
                             **_row(t["bos_cost"])})
        return pd.DataFrame(rows)

    def findings(self) -> dict:
        """The quotable numbers: {prefix: flat values} for `sinkmech.findings.record`
        (`<model>.domain.<name>.*`, `<model>.domain.holds_on.*`)."""
        from sinkmech.findings import flatten

        out = {}
        for m, by_domain in self.tables.items():
            d = self.to_dict()[m]
            out[f"{m}.domain"] = flatten(f"{m}.domain", {**{name: _flat(t) for name, t in by_domain.items()},
                                                         "holds_on": d["holds_on"],
                                                         "one_domain_only": d["one_domain_only"]})
        return out


def _row(v: dict | None) -> dict:
    if v is None:
        return {"value": None, "lo": None, "hi": None, "n_documents": None}
    return {"value": v["value"], "lo": v["ci"][0], "hi": v["ci"][1], "n_documents": v["n_documents"]}


def _flat(t: dict) -> dict:
    """[value, lo, hi] lists for the findings file, with the document counts."""
    def tri(v):
        return None if v is None else [v["value"], *v["ci"]]

    out = {"n_prompts": t["corpus"]["n_prompts"], "n_documents": t["corpus"]["n_documents"],
           "sink_rate": {c: {e: tri(v) for e, v in by_eps.items()} for c, by_eps in t["sink_rate"].items()},
           "sink_rate_gap": {e: tri(v) for e, v in t["sink_rate_gap"].items()},
           "loss": {c: tri(v) for c, v in t["loss"].items()}, "bos_cost": tri(t["bos_cost"])}
    if "heads" in t:
        h = t["heads"]
        out["heads"] = {k: h[k] for k in ("sweep", "n_prompts", "n_documents", "high", "low", "mode_counts", "n_if_else",
                                          "if_else_heads", "triggers")}
    return out


def run(models=None, config: DomainsConfig = DomainsConfig(), options: RunOptions = RunOptions()) -> Domains:
    """The domains study: `domain_tables` for every model (loaded one at a
    time from `config.models`, or the loaded models or specs given) and corpus."""
    from sinkmech.loading.models import load_model

    t0 = time.perf_counter()
    for d in config.domains:  # a corpus that cannot be read fails before a model loads
        if len(corpus(d)) < max(config.n_prompts, config.scan_prompts):
            raise ValueError(f"the {d} corpus has {len(corpus(d))} windows: fewer than the study asks for")
    specs = list(config.models) if models is None else (list(models) if isinstance(models, (list, tuple)) else [models])
    tables = {}
    for spec in specs:
        model = load_model(spec, device=options.device, dtype=options.dtype or "float32") if isinstance(spec, str) \
            else spec
        name = spec if isinstance(spec, str) else (model.cfg.model_name or "model")
        tables[name] = {d: domain_tables(model, d, config, options) for d in config.domains}
        del model
    return Domains(tables, config, time.perf_counter() - t0)


__all__ = ["Domains", "domain_tables", "holds_on", "run"]
