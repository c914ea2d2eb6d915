"""Calibrate the dormant-head cut (`high`, `low`) on planted heads and nulls.

Tiny attention-only models with hand-set layer-0 heads (`tests/helpers/planted.py`):
an if-else head (rests on `<bos>`, wakes on one token), the positional null
(mode follows position) and the prompt-following null (whole prompts active
or dormant, whatever the token), each scaled by a strength factor f that
softens its attention (f = 1: first-token attention ~0 or ~1; f = 0.2: graded,
about 0.45-0.8 on resting queries), beside the four random heads of layer 1. The
prompt-following head reads its prompt's marker at the attended key, a real
key trigger; what it must never get is the token that merely shares its
prompts (TRIGGER at the query), so its labels are counted apart with the
triggers they rest on. Every scan labels every head at every cut of the sweep
(`sinkmech.dormant.queries.SWEEP_HIGH` x `SWEEP_LOW`); per cut this counts
the planted if-else heads recovered and the null heads labelled if_else.
The counts and the chosen cut are written to `--json`
(`figures/dormant_calibration.json`); `docs/dormant_calibration.md` reads them.

    python scripts/calibrate_dormant.py --json figures/dormant_calibration.json --findings figures/findings.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from sinkmech.options import RunOptions

ROOT = Path(__file__).resolve().parents[1]
STRENGTHS = (0.2, 0.25, 0.3, 0.4, 0.6, 1.0)


def corpus(n: int, seed: int):
    """One prompt in five opens with MARKER and is 30 % TRIGGER; the others hold TRIGGER at 8 %."""
    import torch

    from helpers.planted import MARKER, TRIGGER

    g = torch.Generator().manual_seed(seed)
    c = torch.randint(2, 50, (n, 20), generator=g)
    c[(c == TRIGGER) | (c == MARKER)] = 2
    marked = torch.arange(n) % 5 == 0
    c[torch.rand(c.shape, generator=g) < torch.where(marked, 0.3, 0.08)[:, None]] = TRIGGER
    c[marked, 0] = MARKER
    return c


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--n-prompts", type=int, default=64)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--findings", type=Path, default=None, help="merge the counts per cut and the chosen cut into this "
                   "findings file, under dormant_calibration")
    args = p.parse_args(argv)
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the planted heads live with the tests
    import torch
    from tqdm.auto import tqdm

    from sinkmech.dormant.scan import scan_heads
    from sinkmech.files import json_text, write_text
    from helpers.tiny import TINY_BOS
    from helpers.planted import planted_dormant_model

    roles = {"L0.H0": "if_else", "L0.H1": "position", "L0.H2": "prompt"}
    counts: dict[str, dict] = {}
    runs = [(f, s) for f in STRENGTHS for s in range(args.seeds)]
    for f, seed in tqdm(runs, desc="calibration scans"):
        model = planted_dormant_model({0: "if_else", 1: "position", 2: "prompt"}, seed=seed, cut=13)
        with torch.no_grad():
            for h in (0, 1, 2):
                model.blocks[0].attn.W_Q[h] *= f
        scan = scan_heads(model, corpus(args.n_prompts, 100 + seed), bos="prepend", max_tokens=20,
                          options=RunOptions(progress=False, bos_token_id=TINY_BOS), n_boot=0)
        for row in scan.sweep:
            key = f"{row['high']:g}_{row['low']:g}"
            c = counts.setdefault(key, {"high": row["high"], "low": row["low"], "if_else_recovered": 0,
                                        "null_if_else": 0, "random_if_else": 0, "runs": 0,
                                        "recovered_by_strength": {f"{x:g}": 0 for x in STRENGTHS}})
            c["runs"] += 1
            heads = set(row["if_else_heads"])
            if "L0.H0" in heads:
                c["if_else_recovered"] += 1
                c["recovered_by_strength"][f"{f:g}"] += 1
            c["null_if_else"] += int("L0.H1" in heads)
            c["prompt_if_else"] = c.get("prompt_if_else", 0) + int("L0.H2" in heads)
            if "L0.H2" in heads:  # the head reads its prompt's MARKER key: a real key trigger, not TRIGGER@query
                c.setdefault("prompt_triggers", set()).add(row["triggers"]["L0.H2"])
            c["random_if_else"] += len({h for h in heads if h.startswith("L1.")})
    for c in counts.values():
        c["prompt_triggers"] = sorted(c.get("prompt_triggers", ()))
    clean = [c for c in counts.values() if c["null_if_else"] == 0 and c["random_if_else"] == 0]
    # the most planted heads recovered with no null labelled; ties: the larger high (the stricter notion of
    # resting), then the larger low (fewer queries between the cuts)
    best = max(clean, key=lambda c: (c["if_else_recovered"], c["high"], c["low"])) if clean else None
    out = {"strengths": list(STRENGTHS), "seeds": args.seeds, "n_prompts": args.n_prompts, "roles": roles,
           "cuts": counts, "chosen": None if best is None else {"high": best["high"], "low": best["low"]}}
    print(f"{'high':>5} {'low':>5} {'recovered':>9} {'nulls':>5} {'random':>6} {'prompt':>6}  by strength {list(STRENGTHS)}")
    for c in sorted(counts.values(), key=lambda c: (-c["high"], -c["low"])):
        print(f"{c['high']:>5.2f} {c['low']:>5.2f} {c['if_else_recovered']:>5}/{c['runs']:<3} {c['null_if_else']:>5} "
              f"{c['random_if_else']:>6} {c.get('prompt_if_else', 0):>6}  {list(c['recovered_by_strength'].values())}")
    print(f"chosen: {out['chosen']}; the prompt-following head's triggers: "
          f"{sorted({t for c in counts.values() for t in c['prompt_triggers']})}")
    if args.json is not None:
        write_text(args.json, json_text(out))
    if args.findings is not None:
        from sinkmech.findings import flatten, record

        quotable = {"chosen": out["chosen"], "seeds": args.seeds, "n_prompts": args.n_prompts,
                    "n_planted": len(runs), "strengths": list(STRENGTHS),
                    "cuts": {k: {x: c[x] for x in ("high", "low", "if_else_recovered", "null_if_else", "random_if_else",
                                                   "prompt_if_else")} for k, c in counts.items()}}
        record(args.findings, flatten("dormant_calibration", quotable), replace_prefix="dormant_calibration")
    return out


if __name__ == "__main__":
    main()
