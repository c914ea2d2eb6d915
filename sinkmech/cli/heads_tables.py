"""The terminal tables of `sinkmech heads`: the scan's heads, the threshold
sweep, one head's profile, the no-op check and a contrast of two corpora."""

from __future__ import annotations

from collections.abc import Sequence


def _fmt(x, spec: str = ".3f") -> str:
    return "   n/a" if x is None else format(x, spec)


def _trigger_text(triggers: list, n: int = 3) -> str:
    return ", ".join(f"{t['token']!r}@{t['where']} x{t['lift']:.1f} (n={t['count']}/{t['n_prompts']}p)"
                     for t in triggers[:n]) or "-"


def _validation(t: dict | None) -> str:
    """A trigger's lift on the selection / validation prompts, '+' if validated."""
    if t is None:
        return "-"
    f = lambda x: "n/a" if x is None else f"{x:.1f}"  # noqa: E731
    return f"{f(t['lift'])}/{f(t['validated_lift'])}{'+' if t['validated'] else '-'}"


def print_heads_table(scan, top: int) -> None:
    from sinkmech.dormant.labels import mode_meaning

    if scan.sweep:  # the labels hang on the cut: the sweep first
        print_sweep(scan.sweep)
    counts = scan.mode_counts()
    print(f"\nat the cut high {scan.thresholds.high:g} / low {scan.thresholds.low:g}: "
          f"{scan.n_layers * scan.n_heads} heads over {scan.n_prompts} prompts ({scan.n_queries} queries): "
          + ", ".join(f"{v} {k}" for k, v in counts.items()))
    ranked = scan.if_else_heads()
    if ranked:
        print(f"top if-else heads ({len(ranked)} found)")
    else:
        print("no head passes the if_else rule; the closest candidates (score = fulfilment of the rule):")
        ranked = scan.ranked()
    print(f"{'head':>7} {'mode':>8} {'score':>6} {'att0':>6} {'dorm':>6} {'act':>6} {'v_first':>8} {'v_act':>8} {'out d/a':>8} "
          f"{'held-out':>12}  triggers (n = queries/prompts)")
    for l, h in ranked[:top]:
        e = scan.head_summary(l, h)
        ratio = (e["output_norm_dormant"] / e["output_norm_active"]
                 if e["output_norm_dormant"] is not None and e["output_norm_active"] else None)
        print(f"{f'{l}.{h}':>7} {e['mode']:>8} {_fmt(e['if_else_score'], '.2f'):>6} {_fmt(e['first_key_attention_excl_q0'], '.2f'):>6} "
              f"{_fmt(e['dormant_fraction'], '.2f'):>6} {_fmt(e['active_fraction'], '.2f'):>6} {_fmt(e['value_norm_first'], '.2f'):>8} "
              f"{_fmt(e['value_norm_active'], '.2f'):>8} {_fmt(ratio, '.2f'):>8} {_validation(e['trigger']):>12}  "
              f"{_trigger_text(e['triggers'])}")
    sel, val = scan.trigger_split()
    print(f"held-out: the chosen trigger's lift on the {len(sel)} selection (even) / {len(val)} validation (odd) prompts; "
          "+ = validated there")
    print("modes: " + "; ".join(f"{k}: {v}" for k, v in mode_meaning(scan.thresholds).items()))


def print_sweep(rows: Sequence[dict]) -> None:
    """Mode counts at every (high, low) cut: does a conclusion survive another cut?"""
    print("\nthreshold sweep (every other threshold fixed):")
    print(f"{'high':>5} {'low':>5} {'sink':>5} {'active':>6} {'mixed':>6} {'if_else':>7}  if_else heads")
    for r in rows:
        c = r["mode_counts"]
        print(f"{r['high']:>5.2f} {r['low']:>5.2f} {c['sink']:>5} {c['active']:>6} {c['mixed']:>6} {c['if_else']:>7}  "
              + (", ".join(r["if_else_heads"]) or "-"))


def print_head_profile(scan, layer: int, head: int) -> None:
    e = scan.profile(layer, head)
    print(f"\nhead {layer}.{head}: {e['mode']} (if_else score {_fmt(e['if_else_score'], '.2f')})")
    for why in e["evidence"]:
        print(f"  - {why}")
    u = e["uncertainty"] or {}
    for k in ("first_key_attention_excl_q0", "dormant_fraction", "active_fraction", "bimodality", "value_norm_first",
              "value_norm_rest", "value_norm_active", "value_norm_dormant", "output_norm_active", "output_norm_dormant"):
        ci = u.get(k + "_ci")
        print(f"  {k:<22} {_fmt(e[k])}" + ("" if ci is None else f"  [{_fmt(ci[0])}, {_fmt(ci[1])}]"))
    if u:
        print(f"  label '{e['mode']}' kept in {100 * u['label_agreement']:.0f}% of bootstrap resamples of the prompts")
    print("  first-token attention histogram (fraction of queries per bin)")
    n = len(e["histogram"])
    for i, frac in enumerate(e["histogram"]):
        print(f"    [{i / n:.2f}, {(i + 1) / n:.2f}) {frac:6.3f} {'#' * round(60 * frac)}")
    print("  active rate by query position: " + " ".join(_fmt(x, ".2f") for x in e["active_by_position"][1:]))
    b = e["bands"]
    print(f"  q/k norm bands ({'rotary chunks, fastest first' if b['rotary'] else 'no rotary embedding: plain norms'})")
    cols = ("q_dormant", "q_active", "k_first", "k_rest", "logit_first_dormant", "logit_first_active", "logit_key_active")
    print(f"    {'band':>10} {'freq':>8} " + " ".join(f"{c:>12}" for c in cols))
    for i, label in enumerate(b["labels"]):
        print(f"    {label:>10} {b['frequencies'][i]:8.4f} " + " ".join(f"{_fmt(b[c][i], '.3f'):>12}" for c in cols))
    print("  triggers" + ("" if e["triggers"] else f": none on >= {scan.thresholds.min_count} active queries"))
    for t in e["triggers"]:
        rate = "" if t["active_rate"] is None else f", active {t['active_rate']:.2f} of the time"
        print(f"    {t['token']!r:>14} @{t['where']:<8} n={t['count']:<5} in {t['n_prompts']:<4} prompts lift {t['lift']:.2f} "
              f"(expected {t['expected']:.1f}{rate}; selection/validation {_validation(t)})")


def _verdict(e: dict | None) -> str:
    from sinkmech.stats import effect_text

    if e is None:
        return "n/a"
    text = effect_text(e["value"], e["ci"])
    if e.get("p_adjusted") is None:  # secondary: unadjusted
        return f"{text} (p {e['p']:.2g}, secondary)"
    return f"{text} (primary; Holm p {e['p_adjusted']:.2g}{', holds' if e['detectable_adjusted'] else ''})"


def print_noop(check) -> None:
    from sinkmech.hooks import head_label

    print(f"\nno-op check (clean loss {check.loss_clean:.3f} over {check.n_tokens} tokens): loss change in nats, per "
          f"intervened query and in total, {100 * check.ci_level:.0f}% {check.interval}; an interval holding 0 "
          f"reads 'no detectable effect'; Holm p over the primary family only ({check.n_intervals} tests: per "
          f"if-else head and intervention, active minus matched control; 'holds': still below {1 - check.ci_level:.2g}); "
          f"every other interval is secondary (raw p); control: the same number of the other mode's queries at the "
          f"nearest positions")
    for r in check.results:
        print(f"  {head_label(r.layer, r.head)} ({r.n_dormant} dormant / {r.n_active} active queries in "
              f"{r.n_prompts_dormant} / {r.n_prompts_active} prompts)")
        for name, e in r.checks.items():
            how, _, mode = name.rpartition("_")
            ctrl = e["matched_control"]
            print(f"    {how.replace('_', ' '):>13} on {mode:<7}: per query {_verdict(e['per_query'])}; total "
                  f"{_verdict(e['total'])}" + ("" if ctrl is None else
                                               f"; minus control ({ctrl['n_queries']} q) {_verdict(ctrl['difference'])}")
                  + (f"; minus mean-ablation {_verdict(e['minus_mean_ablate'])}" if "minus_mean_ablate" in e else ""))
        if r.active_looks:
            print("    active queries look at: " + ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in r.active_looks.items()
                                                            if k != "n_queries"))


def print_contrast(c) -> None:
    from sinkmech.hooks import head_label

    print(f"\ncontrast: {c.name_a} ({c.n_prompts_a} prompts) vs {c.name_b} ({c.n_prompts_b} prompts); dormant "
          f"fraction (first-token attention >= {c.high:g}) {c.name_a} - {c.name_b}, heads chosen at |diff| >= "
          f"{c.min_diff:g} on the even prompts, confirmed on the odd ones ({100 * c.level:.0f}% family-wise interval)")
    print(f"{c.name_a}: " + ", ".join(f"{v} {k}" for k, v in c.mode_counts_a.items()))
    print(f"{c.name_b}: " + ", ".join(f"{v} {k}" for k, v in c.mode_counts_b.items()))
    if not c.heads:
        print("no head differs by that much on the selection halves")
    judged = c.powered or c.power is None or c.power["powered"] is None
    for h in c.heads:
        lo, hi = h.diff_validated_ci
        rlo, rhi = h.vs_shift_ci
        verdict = ("confirmed" if h.confirmed else "not confirmed") if judged else "not judged (no power)"
        print(f"  {head_label(h.layer, h.head)}: dormant {h.dormant_a:.2f} ({h.mode_a}) vs {h.dormant_b:.2f} ({h.mode_b}); "
              f"diff {h.diff_selected:+.2f} chosen, {h.diff_validated:+.2f} [{lo:+.2f}, {hi:+.2f}] held out: "
              + verdict + f"; against the shift {h.vs_shift:+.2f} [{rlo:+.2f}, {rhi:+.2f}]"
              + (", domain-specific" if h.domain_specific and judged else ""))
    if judged:
        print(f"{len(c.confirmed())} of {len(c.heads)} chosen heads confirmed, {len(c.domain_specific())} stand out "
              f"from the population shift ({c.n_boot} bootstrap resamples)")
    else:
        print(f"{c.power['reason']} ({len(c.heads)} heads chosen, none judged)")
    s = c.population_shift
    if s is not None:
        print(f"population shift: median over every head of the difference "
              f"{s['median']:+.3f} [{s['ci'][0]:+.3f}, {s['ci'][1]:+.3f}] (all prompts; held out: "
              f"{s['median_validated']:+.3f}); {s['n_heads_positive']} heads up, {s['n_heads_negative']} down")
    for n in (*c.null_contrasts, *([c.at_null_size] if c.at_null_size else [])):
        print(f"{'null' if n in c.null_contrasts else 'real'} contrast {n.name} ({n.n_prompts_a} vs {n.n_prompts_b} "
              f"prompts): {n.n_chosen} chosen, {n.n_confirmed} confirmed, {n.n_domain_specific} domain-specific"
              + (f" ({', '.join(n.confirmed_heads)})" if n.confirmed_heads else ""))
