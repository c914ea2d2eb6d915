"""The paper's theory measured on the offline models, at a CPU-sized setting:
(1) does the path-weight bound rank sensitivity (Spearman correlation of
||d h_j^(L) / d h_i^(0)|| with the path weight, `sinkmech.sensitivity`) with
and without `<bos>`, and (2) is attention smoother without `<bos>`
(normalised attention entropy of content queries, `sinkmech.perturb`)?
Barbero et al. 2025 predict both effects on a model trained with a fixed
`<bos>` (Gemma 3); SmolLM2 (no fixed `<bos>`) is the control.

Every number goes into a JSON file and, with --findings, into the findings
file under `<model>.theory`, each mean with a 95 % bootstrap interval over
prompts (the with/without difference paired by prompt).

    python scripts/theory.py --out figures/theory.json --findings figures/findings.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from sinkmech import models
from sinkmech.files import json_text
from sinkmech.findings import flatten, record
from sinkmech.perturb import corpus_swaps, perturbation_spread
from sinkmech.prompts import CONDITIONS, default_corpus, tokenize
from sinkmech.sensitivity import sensitivity_study
from sinkmech.stats import prompt_curve


def bootstrap_mean(x: torch.Tensor, *, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> dict:
    """Mean of per-prompt values with a percentile bootstrap interval over prompts (`sinkmech.stats`)."""
    x = x.double()[~x.isnan()]
    mean, lo, hi = prompt_curve(x[:, None], n_boot=n_boot, level=level, seed=seed)[0]
    return {"mean": mean, "ci": [lo, hi], "n": len(x)}


def entropy_per_prompt(model, prompts: list[str], max_tokens: int) -> torch.Tensor:
    """Mean normalised attention entropy over layers and heads, per prompt and
    condition ([bos, prompt]), from `perturbation_spread`'s clean run."""
    rows = tokenize(model, prompts, bos="none", max_tokens=max_tokens)
    content = [r[:n].tolist() for r, n in zip(rows.tokens.cpu(), rows.lengths.cpu())]
    swaps = corpus_swaps(content, 4)
    out = torch.zeros(len(CONDITIONS), len(content))
    for p, (row, swap) in enumerate(zip(content, swaps)):
        res = perturbation_spread(model, [row], perturbation=[swap], progress=False)
        out[:, p] = res.normalized_entropy.nanmean((1, 2))
    return out


def measure(name: str, *, n_prompts: int, max_tokens: int, entropy_prompts: int, entropy_tokens: int) -> dict:
    model = models.load_model(name)
    prompts = default_corpus()
    st = sensitivity_study(model, prompts[:n_prompts], max_tokens=max_tokens, progress=True)
    ent = entropy_per_prompt(model, prompts[:entropy_prompts], entropy_tokens)
    out: dict = {"setting": {"sensitivity_prompts": n_prompts, "sensitivity_tokens": max_tokens,
                             "entropy_prompts": entropy_prompts, "entropy_tokens": entropy_tokens,
                             "n_layers": model.cfg.n_layers}}
    for key, rho in (("spearman", st.spearman), ("spearman_off_diagonal", st.spearman_off_diagonal)):
        out[key] = {c: bootstrap_mean(rho[i]) for i, c in enumerate(CONDITIONS)}
        out[key]["none_minus_prepend"] = bootstrap_mean(rho[1] - rho[0])
    out["normalized_entropy"] = {c: bootstrap_mean(ent[i]) for i, c in enumerate(CONDITIONS)}
    out["normalized_entropy"]["none_minus_prepend"] = bootstrap_mean(ent[1] - ent[0])
    del model
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["gemma3-270m", "smollm2"])
    p.add_argument("--prompts", type=int, default=4, help="prompts for the Jacobians (one per prompt and condition)")
    p.add_argument("--tokens", type=int, default=10, help="content tokens per prompt for the Jacobians")
    p.add_argument("--entropy-prompts", type=int, default=16)
    p.add_argument("--entropy-tokens", type=int, default=48)
    p.add_argument("--out", type=Path, required=True, help="JSON output")
    p.add_argument("--findings", type=Path, default=None, help="merge into this findings file under <model>.theory")
    args = p.parse_args(argv)
    if min(args.prompts, args.tokens, args.entropy_prompts, args.entropy_tokens) < 2:
        print("error: --prompts, --tokens, --entropy-prompts and --entropy-tokens must be >= 2", file=sys.stderr)
        return 2
    t0, results = time.perf_counter(), {}
    for name in args.models:
        print(f"{name} ...", file=sys.stderr, flush=True)
        results[name] = measure(name, n_prompts=args.prompts, max_tokens=args.tokens,
                                entropy_prompts=args.entropy_prompts, entropy_tokens=args.entropy_tokens)
    results["seconds"] = round(time.perf_counter() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json_text(results))
    if args.findings is not None:
        for name in args.models:
            record(args.findings, flatten(f"{name}.theory", results[name]), replace_prefix=f"{name}.theory")
    for name in args.models:
        r = results[name]
        for key in ("spearman", "spearman_off_diagonal", "normalized_entropy"):
            cells = ", ".join(f"{c} {v['mean']:.3f} [{v['ci'][0]:.3f}, {v['ci'][1]:.3f}]" for c, v in r[key].items())
            print(f"{name} {key}: {cells}")
    print(f"wrote {args.out} in {results['seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
