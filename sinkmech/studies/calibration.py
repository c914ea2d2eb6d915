"""The dormant-head cut (`high`, `low`) measured on planted heads and nulls.

Tiny attention-only models with hand-set layer-0 heads
(`sinkmech.dormant.planted`): an if-else head (rests on `<bos>`, wakes on one
token), the positional null (mode follows position) and the prompt-following
null (whole prompts active or dormant, whatever the token), each scaled by a
strength factor f that softens its attention (f = 1: first-token attention ~0
or ~1; f = 0.2: graded, about 0.45-0.8 on resting queries), beside the four
random heads of layer 1. The prompt-following head reads its prompt's marker
at the attended key, a real key trigger; what it must never get is the token
that merely shares its prompts (TRIGGER at the query), so its labels are
counted apart with the triggers they rest on. Every scan labels every head at
every cut of the sweep (`sinkmech.dormant.queries.SWEEP_HIGH` x `SWEEP_LOW`);
per cut this counts the planted if-else heads recovered and the null heads
labelled if_else, and `chosen` is the cut the rule picks: the most planted
heads recovered with no null labelled, ties to the larger `high`, then the
larger `low`. `docs/dormant_calibration.md` reads the result and says what
the rule's history is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from sinkmech.dormant.planted import BOS, prompt_marker_corpus, planted_dormant_model
from sinkmech.options import RunOptions
from sinkmech.results import Result
from sinkmech.studies.configs import CalibrationConfig

ROLES = {"L0.H0": "if_else", "L0.H1": "position", "L0.H2": "prompt"}


@dataclass(frozen=True)
class Calibration(Result):
    """Per cut ("<high>_<low>"): planted if-else heads recovered (of `runs`, and
    by strength), nulls and random heads labelled if_else, the prompt-following
    head's if_else labels and the triggers they rest on; `chosen` the rule's cut."""

    cuts: dict[str, dict]
    chosen: dict | None
    config: CalibrationConfig
    seconds: float

    def to_dict(self) -> dict:
        c = self.config
        return {"config": c.to_dict(), "strengths": list(c.strengths), "seeds": c.seeds, "n_prompts": c.n_prompts,
                "roles": ROLES, "cuts": self.cuts, "chosen": self.chosen,
                "rule": "the most planted if-else heads recovered with no null or random head labelled if_else; "
                        "ties to the larger high, then the larger low",
                "seconds": round(self.seconds, 1)}

    def to_dataframe(self):
        import pandas as pd

        return pd.DataFrame([{k: v for k, v in c.items() if k not in ("recovered_by_strength", "prompt_triggers")}
                             for c in self.cuts.values()])

    def findings(self) -> dict:
        """The quotable numbers: {prefix: flat values} for `sinkmech.findings.record` (`dormant_calibration.*`)."""
        from sinkmech.findings import flatten

        c = self.config
        return {"dormant_calibration": flatten("dormant_calibration", {"chosen": self.chosen, "seeds": c.seeds, "n_prompts": c.n_prompts,
                "n_planted": c.seeds * len(c.strengths), "strengths": list(c.strengths),
                "cuts": {k: {x: v[x] for x in ("high", "low", "if_else_recovered", "null_if_else", "random_if_else",
                                               "prompt_if_else")} for k, v in self.cuts.items()}})}


def choose_cut(cuts: dict[str, dict]) -> dict | None:
    """The rule: the most planted heads recovered with no null labelled; ties
    to the larger high (the stricter notion of resting), then the larger low
    (fewer queries between the cuts). None when every cut labels a null."""
    clean = [c for c in cuts.values() if c["null_if_else"] == 0 and c["random_if_else"] == 0]
    best = max(clean, key=lambda c: (c["if_else_recovered"], c["high"], c["low"])) if clean else None
    return None if best is None else {"high": best["high"], "low": best["low"]}


def run(models=None, config: CalibrationConfig = CalibrationConfig(), options: RunOptions = RunOptions()
        ) -> Calibration:
    """Scan `config.seeds` planted models at each strength and label every head
    at every cut. `models` is unused (the planted models are built here)."""
    from sinkmech.dormant.scan import scan_heads

    t0 = time.perf_counter()
    counts: dict[str, dict] = {}
    runs = [(f, s) for f in config.strengths for s in range(config.seeds)]
    for f, seed in tqdm(runs, desc="calibration scans", disable=not options.progress):
        model = planted_dormant_model({0: "if_else", 1: "position", 2: "prompt"}, seed=seed, cut=config.cut_position)
        with torch.no_grad():
            for h in (0, 1, 2):
                model.blocks[0].attn.W_Q[h] *= f
        scan = scan_heads(model, prompt_marker_corpus(config.n_prompts, 100 + seed), bos="prepend", max_tokens=20,
                          n_boot=0, options=RunOptions(progress=False, bos_token_id=BOS))
        for row in scan.sweep:
            key = f"{row['high']:g}_{row['low']:g}"
            c = counts.setdefault(key, {"high": row["high"], "low": row["low"], "if_else_recovered": 0,
                                        "null_if_else": 0, "random_if_else": 0, "prompt_if_else": 0, "runs": 0,
                                        "recovered_by_strength": {f"{x:g}": 0 for x in config.strengths},
                                        "prompt_triggers": set()})
            c["runs"] += 1
            heads = set(row["if_else_heads"])
            if "L0.H0" in heads:
                c["if_else_recovered"] += 1
                c["recovered_by_strength"][f"{f:g}"] += 1
            c["null_if_else"] += int("L0.H1" in heads)
            c["prompt_if_else"] += int("L0.H2" in heads)
            if "L0.H2" in heads:  # the head reads its prompt's MARKER key: a real key trigger, not TRIGGER@query
                c["prompt_triggers"].add(row["triggers"]["L0.H2"])
            c["random_if_else"] += len({h for h in heads if h.startswith("L1.")})
    for c in counts.values():
        c["prompt_triggers"] = sorted(c["prompt_triggers"])
    return Calibration(counts, choose_cut(counts), config, time.perf_counter() - t0)


def table(result: Calibration) -> str:
    """The counts per cut as text, strictest cut first."""
    strengths = list(result.config.strengths)
    lines = [f"{'high':>5} {'low':>5} {'recovered':>9} {'nulls':>5} {'random':>6} {'prompt':>6}  by strength {strengths}"]
    for c in sorted(result.cuts.values(), key=lambda c: (-c["high"], -c["low"])):
        lines.append(f"{c['high']:>5.2f} {c['low']:>5.2f} {c['if_else_recovered']:>5}/{c['runs']:<3} "
                     f"{c['null_if_else']:>5} {c['random_if_else']:>6} {c['prompt_if_else']:>6}  "
                     f"{list(c['recovered_by_strength'].values())}")
    triggers = sorted({t for c in result.cuts.values() for t in c["prompt_triggers"]})
    lines.append(f"chosen: {result.chosen}; the prompt-following head's triggers: {triggers}")
    return "\n".join(lines)
