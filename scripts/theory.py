"""The paper's theory measured on the offline models, on CPU: (1) does the
path-weight bound rank sensitivity (`sinkmech.studies.theory`: Spearman
correlation of ||d h_j^(L) / d h_i^(0)||_F with the path weight over all
causal pairs, content pairs and off-diagonal pairs, against a null that
shuffles the path weights among pairs at the same distance), with and without
`<bos>`; and (2) is attention smoother without `<bos>` (normalised attention
entropy of content queries, `sinkmech.interventions.perturb`)? This is an original test of
the bound's ranking, not Barbero et al. 2025's method. Gemma 3 (trained with a
fixed `<bos>`) is the model of interest; SmolLM2 (no fixed `<bos>`) the control.

The Jacobian norms come from the forward-mode Hutchinson estimator (`--probes`
probes per position; `--estimator exact` for jacrev), checked against the
exact Jacobian on short prompts first (`validation` in the JSON). Intervals:
t intervals over prompts; paired differences also carry a sign-flip
permutation p-value. Every number goes into --out and, with --findings, into
the findings file under `<model>.theory`.

    python scripts/theory.py --out figures/theory.json --findings figures/findings.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from sinkmech.loading import models
from sinkmech.studies.theory import bound_ranking, sign_flip_p, t_interval, validate_estimator
from sinkmech.files import json_text, write_text
from sinkmech.findings import flatten, record
from sinkmech.interventions.perturb import corpus_swaps, perturbation_spread
from sinkmech.prompts import CONDITIONS, default_corpus, tokenize
from sinkmech.options import QUIET


def entropy_per_prompt(model, prompts: list[str], max_tokens: int) -> torch.Tensor:
    """Mean normalised attention entropy over layers and heads, per prompt and
    condition ([bos, prompt]), from `perturbation_spread`'s clean run."""
    rows = tokenize(model, prompts, bos="none", max_tokens=max_tokens)
    content = [r[:n].tolist() for r, n in zip(rows.tokens.cpu(), rows.lengths.cpu())]
    swaps = corpus_swaps(content, 4)
    out = torch.zeros(len(CONDITIONS), len(content))
    for p, (row, swap) in enumerate(zip(content, swaps)):
        res = perturbation_spread(model, [row], perturbation=[swap], options=QUIET)
        out[:, p] = res.normalized_entropy.nanmean((1, 2))
    return out


def measure(name: str, args) -> dict:
    model = models.load_model(name)
    prompts = default_corpus()
    t0 = time.perf_counter()
    out: dict = {"n_prompts": args.prompts, "n_tokens": args.tokens, "estimator": args.estimator,
                 "n_probes": args.probes if args.estimator == "hutchinson" else None, "n_layers": model.cfg.n_layers}
    if args.estimator == "hutchinson":  # validation prompts come after the study's
        held = prompts[args.prompts : args.prompts + args.validate_prompts]
        out["validation"] = validate_estimator(model, held, max_tokens=args.validate_tokens, n_probes=args.probes,
                                               chunk_size=args.chunk_size)
    out["validation_seconds"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    br = bound_ranking(model, prompts[: args.prompts], max_tokens=args.tokens, estimator=args.estimator,
                       n_probes=args.probes, n_shuffles=args.shuffles, chunk_size=args.chunk_size)
    out |= {k: v for k, v in br.to_dict().items() if k not in ("n_prompts", "n_tokens", "estimator", "n_probes")}
    out["bound_seconds"] = round(time.perf_counter() - t0, 1)
    ent = entropy_per_prompt(model, prompts[: args.entropy_prompts], args.entropy_tokens)
    out["entropy_setting"] = {"prompts": args.entropy_prompts, "tokens": args.entropy_tokens}
    out["normalized_entropy"] = {c: t_interval(ent[i]) for i, c in enumerate(CONDITIONS)}
    out["normalized_entropy"]["none_minus_prepend"] = t_interval(ent[1] - ent[0]) | {
        "sign_flip_p": sign_flip_p(ent[1] - ent[0])}
    del model
    return out


def cell(v: dict) -> str:
    ci = v.get("ci")
    return f"{v['mean']:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else f"{v['mean']:+.3f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["gemma3-270m", "smollm2"])
    p.add_argument("--prompts", type=int, default=32, help="prompts for the Jacobians (one per prompt and condition)")
    p.add_argument("--tokens", type=int, default=32, help="content tokens per prompt for the Jacobians")
    p.add_argument("--estimator", choices=["hutchinson", "exact"], default="hutchinson")
    p.add_argument("--probes", type=int, default=2, help="Hutchinson probes per input position")
    p.add_argument("--shuffles", type=int, default=100, help="shuffles of the distance null per prompt")
    p.add_argument("--validate-prompts", type=int, default=1, help="prompts for the check against the exact Jacobian")
    p.add_argument("--validate-tokens", type=int, default=3, help="content tokens per validation prompt")
    p.add_argument("--chunk-size", type=int, default=32, help="tangents pushed at once")
    p.add_argument("--entropy-prompts", type=int, default=32)
    p.add_argument("--entropy-tokens", type=int, default=48)
    p.add_argument("--out", type=Path, required=True, help="JSON output (rewritten after each model)")
    p.add_argument("--findings", type=Path, default=None, help="merge into this findings file under <model>.theory")
    args = p.parse_args(argv)
    if min(args.prompts, args.tokens, args.entropy_prompts, args.entropy_tokens, args.validate_tokens) < 2 or min(
            args.probes, args.shuffles, args.chunk_size, args.validate_prompts) < 1:
        print("error: prompt and token counts must be >= 2 (--validate-prompts >= 1); --probes, --shuffles and "
              "--chunk-size >= 1",
              file=sys.stderr)
        return 2
    t0, results = time.perf_counter(), {}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for name in args.models:  # each model written (and recorded) as soon as it is done
        print(f"{name} ...", file=sys.stderr, flush=True)
        t1 = time.perf_counter()
        results[name] = measure(name, args)
        results[name]["seconds"] = round(time.perf_counter() - t1, 1)
        write_text(args.out, json_text({**results, "seconds": round(time.perf_counter() - t0, 1)}))
        if args.findings is not None:
            kept = {k: v for k, v in results[name].items() if k != "per_prompt"}
            record(args.findings, flatten(f"{name}.theory", kept), replace_prefix=f"{name}.theory")
    results["seconds"] = round(time.perf_counter() - t0, 1)
    write_text(args.out, json_text(results))
    for name in args.models:
        r = results[name]
        if "validation" in r:
            v = r["validation"]
            print(f"{name} estimator check ({v['n_probes']} probes): relative error median "
                  f"{v['relative_error']['median']:.3f}, max {v['relative_error']['max']:.3f}; Spearman with exact "
                  f"{v['spearman_estimate_vs_exact']['mean']:.3f}")
        for s in ("all", "content", "off_diagonal"):
            c = r[s]
            print(f"{name} {s}: with {cell(c['prepend'])} (minus null {cell(c['prepend']['minus_null'])}), "
                  f"without {cell(c['none'])} (minus null {cell(c['none']['minus_null'])}); "
                  f"paired {cell(c['none_minus_prepend'])} p {c['none_minus_prepend']['sign_flip_p']:.4f}")
        e = r["normalized_entropy"]
        print(f"{name} normalised entropy: with {cell(e['prepend'])}, without {cell(e['none'])}, "
              f"paired {cell(e['none_minus_prepend'])}")
    print(f"wrote {args.out} in {results['seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
