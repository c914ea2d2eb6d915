"""Does the path-weight bound rank sensitivity? An original test of the bound's
ranking (not Barbero et al. 2025's own method), at a size that can decide.

Barbero et al. 2025 (Sec. 3) bound ||d h_j^(L) / d h_i^(0)|| by a constant^L
times the path weight (`sinkmech.theory.sensitivity.path_weights`). If the bound
ranks sensitivity, the two correlate over the causal pairs i <= j. Per prompt
and condition (with and without `<bos>`), the Spearman correlation over:

- all pairs i <= j;
- content pairs: both positions content tokens (with `<bos>`, i >= 1; the
  `<bos>` column, where the sink inflates the path weight, is left out;
  without it, every pair), so both conditions rank the same content pairs;
- off-diagonal pairs i < j.

The null: the path weights shuffled among the pairs at the same distance j - i
(within a prompt), which keeps what distance alone explains; the observed
correlation minus the null's mean says what the path weight adds. Jacobian
norms come from the exact `jacrev` or the forward-mode Hutchinson estimate
(`jacobian_norms_hutchinson`), validated against the exact one on short prompts
(`validate_estimator`: every position of a few held-out prompts). Without
`<bos>` every pair is a content pair, so the "content" and "all" numbers of
that condition are the same by construction. Intervals: t intervals over
the documents the prompts were cut from (each document's prompts averaged
first: windows of one document are not independent), or over the prompts
where they have no documents; paired differences also get a sign-flip
permutation p-value over the same units, and
`run` (the study: both models, the attention entropy beside the bound)
corrects those p-values with Holm over every test it reports, across models
and pair sets (`family`).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Literal

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from sinkmech.loading.backend import Model
from sinkmech.theory.jacobian import _check_layers, jacobian_norms, jacobian_norms_hutchinson
from sinkmech.options import QUIET, RunOptions
from sinkmech.corpora import default_corpus, prompt_documents
from sinkmech.prompts import CONDITIONS, PromptSource, tokenize
from sinkmech import stats
from sinkmech.results import Result
from sinkmech.studies.configs import TheoryConfig
from sinkmech.theory.sensitivity import attention_patterns, path_weights, spearman

Estimator = Literal["exact", "hutchinson"]
PAIR_SETS = ("all", "content", "off_diagonal")


# Intervals over documents (or prompts)


def mean_ci(x: Tensor, groups=None, level: float = stats.LEVEL) -> dict:
    """{"mean", "ci": [lo, hi], "n", "unit", "method"}: the mean over units with
    its Student t interval (`sinkmech.stats.t_interval`; NaNs dropped). The
    units are the documents `groups` names (per prompt; each document's
    prompts averaged first, `sinkmech.stats.unit_means`), else the prompts."""
    unit = "prompt" if groups is None else "document"
    x = stats.unit_means(x, groups)
    x = x[~x.isnan()]
    iv = stats.t_interval(x, level=level, unit=unit)
    if iv is None:
        return {"mean": float(x.mean()) if len(x) else None, "ci": None, "n": len(x), "unit": unit, "method": "t"}
    return {"mean": iv.value, "ci": iv.ci, "n": iv.n_units, "unit": unit, "method": "t"}


def paired(x: Tensor, groups=None) -> dict:
    """`mean_ci` of a paired difference with its sign-flip test over the same
    units: `sign_flip_p`, and `sign_flip_p_at_floor` where no random pattern
    reached the observed mean (p is then only bounded: < `sign_flip_p_floor`)."""
    test = stats.sign_flip_test(stats.unit_means(x, groups))
    return mean_ci(x, groups) | {"sign_flip_p": test.p, "sign_flip_p_floor": test.floor,
                                 "sign_flip_p_at_floor": test.at_floor, "sign_flip_exact": test.exact}


def interval_text(groups, n_prompts: int, level: float = stats.LEVEL) -> str:
    """What the study's intervals are over, in words."""
    unit = (f"the {stats.n_documents(groups, n_prompts)} documents the {n_prompts} prompts were cut from "
            "(each document's prompts averaged first)" if groups is not None else f"the {n_prompts} prompts")
    return f"{100 * level:g} % Student t intervals and sign-flip tests over {unit}"


# The test


def pair_mask(T: int, first_content: int, which: str) -> Tensor:
    """Bool [j, i] over the causal pairs of a T-position sequence: "all" (i <= j),
    "content" (i, j >= first_content), "off_diagonal" (i < j)."""
    j, i = torch.meshgrid(torch.arange(T), torch.arange(T), indexing="ij")
    causal = i <= j
    if which == "all":
        return causal
    if which == "content":
        return causal & (i >= first_content)
    if which == "off_diagonal":
        return i < j
    raise ValueError(f"pair set must be one of {PAIR_SETS}, got {which!r}")


def distance_shuffled_spearman(sens: Tensor, paths: Tensor, mask: Tensor, *, n_shuffles: int = 100,
                               seed: int = 0) -> float:
    """Mean Spearman correlation of `sens` with `paths` shuffled among the
    masked pairs at the same distance j - i (the null: distance alone)."""
    T = sens.shape[0]
    j, i = torch.meshgrid(torch.arange(T), torch.arange(T), indexing="ij")
    dist = (j - i)[mask]
    x, y = sens[mask], paths[mask]
    groups = [torch.nonzero(dist == d).flatten() for d in dist.unique()]
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_shuffles):
        z = y.clone()
        for idx in groups:
            z[idx] = y[idx[torch.randperm(len(idx), generator=g)]]
        out.append(spearman(x, z))
    return float(torch.tensor(out).nanmean())


@dataclass(frozen=True)
class BoundRanking(Result):
    """`rho[c][s]` [prompt]: Spearman correlation of sensitivity and path weight
    in condition `conditions[c]` over pair set s (`PAIR_SETS`); `null[c][s]`
    the same with the path weights shuffled among pairs at equal distance.
    `documents`: each prompt's source document, the unit of the intervals
    (None: the prompts themselves)."""

    rho: dict[str, dict[str, Float[Tensor, " prompt"]]]
    null: dict[str, dict[str, Float[Tensor, " prompt"]]]
    conditions: tuple[str, ...]
    n_tokens: int
    n_layers: int
    estimator: str
    n_probes: int | None
    documents: tuple[str, ...] | None = None

    @property
    def n_prompts(self) -> int:
        return len(next(iter(next(iter(self.rho.values())).values())))

    def summary(self) -> dict:
        """Means with t intervals over documents (or prompts) per condition and
        pair set; the observed minus the null; none minus prepend (paired, with
        its sign-flip p-value)."""
        docs = self.documents
        out: dict = {}
        for s in PAIR_SETS:
            cell: dict = {}
            for c in self.conditions:
                cell[c] = mean_ci(self.rho[c][s], docs)
                cell[c]["null"] = mean_ci(self.null[c][s], docs)
                cell[c]["minus_null"] = paired(self.rho[c][s] - self.null[c][s], docs)
            if set(self.conditions) == {"prepend", "none"}:
                diff = self.rho["none"][s] - self.rho["prepend"][s]
                cell["none_minus_prepend"] = paired(diff, docs)
            out[s] = cell
        return out

    def to_dict(self) -> dict:
        return {"n_prompts": self.n_prompts, "n_tokens": self.n_tokens, "n_layers": self.n_layers,
                "estimator": self.estimator, "n_probes": self.n_probes,
                "n_documents": stats.n_documents(self.documents, self.n_prompts),
                "interval": interval_text(self.documents, self.n_prompts), **self.summary(),
                "per_prompt": {c: {s: self.rho[c][s].tolist() for s in PAIR_SETS} for c in self.conditions}}

    def to_dataframe(self):
        import pandas as pd

        return pd.DataFrame([{"bos": c, "pairs": s, "prompt": p, "spearman": float(self.rho[c][s][p]),
                              "null": float(self.null[c][s][p])}
                             for c in self.conditions for s in PAIR_SETS for p in range(self.n_prompts)])


def sensitivity_norms(model: Model, seq: Tensor, *, estimator: Estimator, n_probes: int, n_layers: int,
                      seed: int = 0, chunk_size: int = 64) -> Tensor:
    """||d h_j^(L) / d h_i^(0)||_F [j, i] by the chosen estimator."""
    if estimator == "exact":
        return jacobian_norms(model, seq, n_layers=n_layers, chunk_size=chunk_size)
    if estimator == "hutchinson":
        return jacobian_norms_hutchinson(model, seq, n_probes=n_probes, n_layers=n_layers, seed=seed,
                                         chunk_size=chunk_size)
    raise ValueError(f"estimator must be 'exact' or 'hutchinson', got {estimator!r}")


def bound_ranking(
    model: Model,
    prompts: PromptSource,
    *,
    max_tokens: int = 32,
    estimator: Estimator = "hutchinson",
    n_probes: int = 4,
    n_shuffles: int = 100,
    n_layers: int | None = None,
    seed: int = 0,
    chunk_size: int = 64,
    options: RunOptions = RunOptions(),
) -> BoundRanking:
    """The bound's ranking on every prompt, with and without `<bos>`, on the
    same content tokens (cut to `max_tokens`).

    Args:
        estimator: "hutchinson" (forward mode, `n_probes` probes per position)
            or "exact" (`jacrev`: T x d_model backward rows per prompt).
        n_shuffles: shuffles of the distance null per prompt.
        chunk_size: tangents (or backward rows) vmapped at once; memory grows with it.
        options: a progress bar, the `<bos>` id for a model whose tokenizer lacks one.

    Returns:
        BoundRanking with per-prompt correlations.
    """
    L = _check_layers(model, n_layers)
    if estimator not in ("exact", "hutchinson"):
        raise ValueError(f"estimator must be 'exact' or 'hutchinson', got {estimator!r}")
    plain = tokenize(model, prompts, bos="none", max_tokens=max_tokens, bos_token_id=options.bos_token_id)
    rows = plain.content()
    P = len(rows)
    rho = {c: {s: torch.full((P,), float("nan")) for s in PAIR_SETS} for c in CONDITIONS}
    null = {c: {s: torch.full((P,), float("nan")) for s in PAIR_SETS} for c in CONDITIONS}
    steps = [(c, p) for c in CONDITIONS for p in range(P)]
    for c, p in tqdm(steps, desc=f"bound ranking ({estimator})", disable=not options.progress, unit="prompt"):
        batch = tokenize(model, [rows[p]], bos=c, max_tokens=max_tokens, bos_token_id=options.bos_token_id)
        seq = batch.tokens[0, : int(batch.lengths[0])]
        sens = sensitivity_norms(model, seq, estimator=estimator, n_probes=n_probes, n_layers=L,
                                 seed=seed + p, chunk_size=chunk_size).float().cpu()
        paths = path_weights(attention_patterns(model, seq, L)).float().cpu()
        for s in PAIR_SETS:
            mask = pair_mask(len(seq), batch.offset, s)
            rho[c][s][p] = spearman(sens[mask], paths[mask])
            null[c][s][p] = distance_shuffled_spearman(sens, paths, mask, n_shuffles=n_shuffles, seed=seed + p)
    return BoundRanking(rho, null, CONDITIONS, max(map(len, rows)), L, estimator,
                        n_probes if estimator == "hutchinson" else None)


def validate_estimator(
    model: Model,
    prompts: PromptSource,
    *,
    max_tokens: int = 6,
    n_probes: int = 4,
    seed: int = 0,
    chunk_size: int = 64,
    options: RunOptions = RunOptions(),
) -> dict:
    """The Hutchinson estimate against the exact Jacobian norms on held-out
    prompts, both conditions, at every causal entry: relative error per entry
    (median, mean, 90th percentile, max), the Spearman correlation of estimate
    and exact, and the bound's correlation by each, per pair set, with the
    estimate-minus-exact difference over the prompt-conditions (the noise the
    estimator adds to the study's own numbers)."""
    plain = tokenize(model, prompts, bos="none", max_tokens=max_tokens, bos_token_id=options.bos_token_id)
    errors, agree = [], []
    rho = {k: {s: [] for s in PAIR_SETS} for k in ("exact", "estimate")}
    L = model.cfg.n_layers
    steps = [(c, r) for c in CONDITIONS for r in plain.content()]
    for c, row in tqdm(steps, desc="estimator check", disable=not options.progress, unit="prompt"):
        batch = tokenize(model, [row], bos=c, max_tokens=max_tokens, bos_token_id=options.bos_token_id)
        seq = batch.tokens[0, : int(batch.lengths[0])]
        exact = jacobian_norms(model, seq, chunk_size=chunk_size).float().cpu()
        est = jacobian_norms_hutchinson(model, seq, n_probes=n_probes, seed=seed, chunk_size=chunk_size).float().cpu()
        paths = path_weights(attention_patterns(model, seq, L)).float().cpu()
        mask = pair_mask(len(seq), 0, "all")
        errors.append(((est[mask] - exact[mask]).abs() / exact[mask].clamp(min=1e-30)).double())
        agree.append(spearman(est[mask], exact[mask]))
        for s in PAIR_SETS:
            m = pair_mask(len(seq), batch.offset, s)
            rho["exact"][s].append(spearman(exact[m], paths[m]))
            rho["estimate"][s].append(spearman(est[m], paths[m]))
    err = torch.cat(errors)
    diff = {s: torch.tensor(rho["estimate"][s]) - torch.tensor(rho["exact"][s]) for s in PAIR_SETS}
    return {
        "n_prompts": len(plain), "n_tokens": plain.max_content, "n_probes": n_probes, "n_entries": len(err),
        "relative_error": {"median": float(err.median()), "mean": float(err.mean()),
                           "p90": float(err.quantile(0.9)), "max": float(err.max())},
        "spearman_estimate_vs_exact": {"mean": float(torch.tensor(agree).mean()), "min": float(min(agree))},
        "bound_spearman_exact": rho["exact"]["all"], "bound_spearman_estimate": rho["estimate"]["all"],
        "bound_spearman_abs_difference_max": float(diff["all"].abs().max()),
        "bound_spearman_by_pairs": {s: {"exact": rho["exact"][s], "estimate": rho["estimate"][s],
                                        "estimate_minus_exact": mean_ci(diff[s]),
                                        "abs_difference_max": float(diff[s].abs().max())} for s in PAIR_SETS},
    }


# The study: both models, the attention entropy beside the bound, one Holm family


def entropy_per_prompt(model: Model, prompts: list[str], max_tokens: int,
                       options: RunOptions = RunOptions()) -> Float[Tensor, "condition prompt"]:
    """Mean normalised attention entropy over layers and heads, per condition
    ([bos, prompt]) and prompt, from `perturbation_spread`'s clean run."""
    from sinkmech.interventions.perturb import corpus_swaps, perturbation_spread

    rows = tokenize(model, prompts, bos="none", max_tokens=max_tokens, bos_token_id=options.bos_token_id)
    content = rows.content()
    swaps = corpus_swaps(content, 4)
    out = torch.zeros(len(CONDITIONS), len(content))
    for p, (row, swap) in enumerate(zip(content, swaps)):
        res = perturbation_spread(model, [row], perturbation=[swap], options=QUIET)
        out[:, p] = res.normalized_entropy.nanmean((1, 2))
    return out


def measure(model: Model, config: TheoryConfig = TheoryConfig(), options: RunOptions = RunOptions()) -> dict:
    """One model: the estimator check on the prompts after the study's, the
    bound's ranking and the attention entropy (see the module docstring)."""
    prompts = default_corpus()
    c = config
    out: dict = {"n_prompts": c.prompts, "n_tokens": c.tokens, "estimator": c.estimator,
                 "n_probes": c.probes if c.estimator == "hutchinson" else None, "n_layers": model.cfg.n_layers,
                 "content_equals_all_without_bos": True}
    t0 = time.perf_counter()
    if c.estimator == "hutchinson" and c.validate_prompts > 0:  # validation prompts come after the study's
        held = prompts[c.prompts : c.prompts + c.validate_prompts]
        out["validation"] = validate_estimator(model, held, max_tokens=c.validate_tokens, n_probes=c.probes,
                                               chunk_size=c.chunk_size, options=options)
    out["validation_seconds"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    br = bound_ranking(model, prompts[: c.prompts], max_tokens=c.tokens, estimator=c.estimator, n_probes=c.probes,
                       n_shuffles=c.shuffles, chunk_size=c.chunk_size, options=options)
    br = dataclasses.replace(br, documents=prompt_documents(None, c.prompts))
    out |= {k: v for k, v in br.to_dict().items() if k not in ("n_prompts", "n_tokens", "estimator", "n_probes")}
    out["bound_seconds"] = round(time.perf_counter() - t0, 1)
    ent = entropy_per_prompt(model, prompts[: c.entropy_prompts], c.entropy_tokens, options)
    docs = prompt_documents(None, c.entropy_prompts)
    out["entropy_setting"] = {"prompts": c.entropy_prompts, "tokens": c.entropy_tokens,
                              "n_documents": stats.n_documents(docs, c.entropy_prompts),
                              "interval": interval_text(docs, c.entropy_prompts)}
    out["normalized_entropy"] = {cond: mean_ci(ent[i], docs) for i, cond in enumerate(CONDITIONS)}
    out["normalized_entropy"]["none_minus_prepend"] = paired(ent[1] - ent[0], docs)
    return out


def family_tests(per_model: dict[str, dict]) -> list[tuple[str, dict]]:
    """Every sign-flip test the study reports, named `<model>.<pairs>.<test>`:
    per model, with minus without `<bos>` over each pair set, the bound minus
    its same-distance null in each condition (without `<bos>` the content
    pairs are all pairs, so that test is counted once), and the attention
    entropy's paired change. The family Holm's correction runs over."""
    tests = []
    for name, r in per_model.items():
        for s in PAIR_SETS:
            if s in r:
                tests.append((f"{name}.{s}.none_minus_prepend", r[s]["none_minus_prepend"]))
                for cond in CONDITIONS:
                    if not (cond == "none" and s == "content"):
                        tests.append((f"{name}.{s}.{cond}.minus_null", r[s][cond]["minus_null"]))
        if "normalized_entropy" in r:
            tests.append((f"{name}.normalized_entropy.none_minus_prepend", r["normalized_entropy"]["none_minus_prepend"]))
    return tests


def correct(per_model: dict[str, dict]) -> dict:
    """Holm over `family_tests` (across models and pair sets): writes
    `sign_flip_p_holm` into each test and returns the family
    ({"size", "correction", "tests": [{"name", "p", "p_holm", "at_floor"}]})."""
    tests = family_tests(per_model)
    adjusted = stats.holm([t["sign_flip_p"] for _, t in tests])
    for (_, t), p in zip(tests, adjusted):
        t["sign_flip_p_holm"] = p
    return {"size": len(tests), "correction": "Holm over every sign-flip test below, across models and pair sets",
            "tests": [{"name": n, "p": t["sign_flip_p"], "p_holm": t["sign_flip_p_holm"],
                       "at_floor": t.get("sign_flip_p_at_floor", False)} for n, t in tests]}


@dataclass(frozen=True)
class Theory(Result):
    """The theory study: per model the estimator check, the bound's ranking
    and the attention entropy (`measure`), and the Holm family over both."""

    per_model: dict[str, dict]
    family: dict
    config: TheoryConfig
    seconds: float

    def to_dict(self) -> dict:
        return {"config": self.config.to_dict(), **self.per_model, "family": self.family,
                "seconds": round(self.seconds, 1)}

    def to_dataframe(self):
        import pandas as pd

        return pd.DataFrame(self.family["tests"])

    def findings(self) -> dict:
        """The quotable numbers: {prefix: flat values} for `sinkmech.findings.record` (`<model>.theory.*`,
        per-prompt lists left out; `theory.family.*`: the Holm family's size and each test's raw and adjusted p)."""
        from sinkmech.findings import flatten

        family = {"size": self.family["size"], "tests": {t["name"]: {k: t[k] for k in ("p", "p_holm", "at_floor")}
                                                         for t in self.family["tests"]}}
        return {**{f"{name}.theory": flatten(f"{name}.theory", {k: v for k, v in r.items() if k != "per_prompt"})
                   for name, r in self.per_model.items()},
                "theory.family": flatten("theory.family", family)}


def run(models=None, config: TheoryConfig = TheoryConfig(), options: RunOptions = RunOptions()) -> Theory:
    """The theory study on every model (loaded one at a time from
    `config.models`, or the loaded models or specs given)."""
    from sinkmech.loading.models import load_model

    t0 = time.perf_counter()
    specs = list(config.models) if models is None else (list(models) if isinstance(models, (list, tuple)) else [models])
    per_model = {}
    for spec in specs:
        model = load_model(spec, device=options.device, dtype=options.dtype or "float32") if isinstance(spec, str) \
            else spec
        name = spec if isinstance(spec, str) else (model.cfg.model_name or "model")
        t1 = time.perf_counter()
        per_model[name] = measure(model, config, options)
        per_model[name]["seconds"] = round(time.perf_counter() - t1, 1)
        del model
    family = correct(per_model)
    return Theory(per_model, family, config, time.perf_counter() - t0)


def text(result: Theory) -> str:
    """The study's numbers as lines (each mean with its interval; p-values raw and Holm)."""
    def cell(v: dict) -> str:
        ci = v.get("ci")
        return f"{v['mean']:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else f"{v['mean']:+.3f}"

    def p(v: dict) -> str:
        raw = f"< {v['sign_flip_p_floor']:.2g}" if v.get("sign_flip_p_at_floor") else f"{v['sign_flip_p']:.4f}"
        return f"p {raw} (Holm {v['sign_flip_p_holm']:.4f})"

    lines = []
    for name, r in result.per_model.items():
        lines.append(f"{name} bound ranking: {r['n_prompts']} prompts x {r['n_tokens']} tokens; {r['interval']}")
        if "validation" in r:
            v = r["validation"]
            lines.append(f"{name} estimator check ({v['n_prompts']} prompts x {v['n_tokens']} tokens, {v['n_probes']} "
                         f"probes): relative error median {v['relative_error']['median']:.3f}; Spearman with exact "
                         f"{v['spearman_estimate_vs_exact']['mean']:.3f}; bound Spearman estimate minus exact "
                         + ", ".join(f"{s} {cell(v['bound_spearman_by_pairs'][s]['estimate_minus_exact'])}"
                                     for s in PAIR_SETS))
        for s in PAIR_SETS:
            c = r[s]
            lines.append(f"{name} {s}: with {cell(c['prepend'])}, without {cell(c['none'])}; paired "
                         f"{cell(c['none_minus_prepend'])} {p(c['none_minus_prepend'])}")
        e = r["normalized_entropy"]
        lines.append(f"{name} normalised entropy: with {cell(e['prepend'])}, without {cell(e['none'])}, paired "
                     f"{cell(e['none_minus_prepend'])} {p(e['none_minus_prepend'])}")
    lines.append(f"Holm family: {result.family['size']} sign-flip tests across models and pair sets")
    return "\n".join(lines)
