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
(`validate_estimator`). Intervals: t intervals over prompts; paired
differences also get a sign-flip permutation p-value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from sinkmech.loading.backend import Model
from sinkmech.theory.jacobian import _check_layers, jacobian_norms, jacobian_norms_hutchinson
from sinkmech.prompts import CONDITIONS, PromptSource, tokenize
from sinkmech import stats
from sinkmech.results import Result
from sinkmech.theory.sensitivity import attention_patterns, path_weights, spearman
from sinkmech.options import RunOptions

Estimator = Literal["exact", "hutchinson"]
PAIR_SETS = ("all", "content", "off_diagonal")


# Intervals over prompts


def t_interval(x: Tensor, level: float = 0.95) -> dict:
    """{"mean", "ci": [lo, hi], "n"}: the t interval of the mean over prompts (NaNs dropped)."""
    x = x.double().flatten()
    x = x[~x.isnan()]
    n = len(x)
    if n < 2:
        return {"mean": float(x.mean()) if n else None, "ci": None, "n": n}
    half = stats.t_quantile((1 + level) / 2, n - 1) * float(x.std(unbiased=True)) / math.sqrt(n)
    m = float(x.mean())
    return {"mean": m, "ci": [m - half, m + half], "n": n}


def sign_flip_p(x: Tensor, *, n_flips: int = 20000, seed: int = 0) -> float:
    """Two-sided p-value of a paired mean difference by sign-flip permutation:
    every sign pattern for up to 16 prompts, else `n_flips` random ones
    (the observed pattern counted)."""
    x = x.double().flatten()
    x = x[~x.isnan()]
    n = len(x)
    if n == 0:
        return float("nan")
    observed = abs(float(x.mean()))
    if n <= 16:
        codes = torch.arange(2**n)
        signs = ((codes[:, None] >> torch.arange(n)) & 1).double() * 2 - 1
        return float(((signs * x).mean(1).abs() >= observed - 1e-12).double().mean())
    g = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (n_flips, n), generator=g).double() * 2 - 1
    hits = int(((signs * x).mean(1).abs() >= observed - 1e-12).sum())
    return (hits + 1) / (n_flips + 1)


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
    the same with the path weights shuffled among pairs at equal distance."""

    rho: dict[str, dict[str, Float[Tensor, " prompt"]]]
    null: dict[str, dict[str, Float[Tensor, " prompt"]]]
    conditions: tuple[str, ...]
    n_tokens: int
    n_layers: int
    estimator: str
    n_probes: int | None

    @property
    def n_prompts(self) -> int:
        return len(next(iter(next(iter(self.rho.values())).values())))

    def summary(self) -> dict:
        """Means with t intervals over prompts per condition and pair set; the
        observed minus the null; none minus prepend (paired, with its
        sign-flip p-value)."""
        out: dict = {}
        for s in PAIR_SETS:
            cell: dict = {}
            for c in self.conditions:
                cell[c] = t_interval(self.rho[c][s])
                cell[c]["null"] = t_interval(self.null[c][s])
                cell[c]["minus_null"] = t_interval(self.rho[c][s] - self.null[c][s])
                cell[c]["minus_null"]["sign_flip_p"] = sign_flip_p(self.rho[c][s] - self.null[c][s])
            if set(self.conditions) == {"prepend", "none"}:
                diff = self.rho["none"][s] - self.rho["prepend"][s]
                cell["none_minus_prepend"] = t_interval(diff) | {"sign_flip_p": sign_flip_p(diff)}
            out[s] = cell
        return out

    def to_dict(self) -> dict:
        return {"n_prompts": self.n_prompts, "n_tokens": self.n_tokens, "n_layers": self.n_layers,
                "estimator": self.estimator, "n_probes": self.n_probes, **self.summary(),
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
    """The Hutchinson estimate against the exact Jacobian norms on short
    prompts, both conditions: relative error per causal entry (median, mean,
    90th percentile, max), the Spearman correlation of estimate and exact, and
    the bound's correlation (all pairs) by each."""
    plain = tokenize(model, prompts, bos="none", max_tokens=max_tokens, bos_token_id=options.bos_token_id)
    errors, agree, rho_exact, rho_est = [], [], [], []
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
        rho_exact.append(spearman(exact[mask], paths[mask]))
        rho_est.append(spearman(est[mask], paths[mask]))
    err = torch.cat(errors)
    return {
        "n_prompts": len(plain), "n_tokens": plain.max_content, "n_probes": n_probes, "n_entries": len(err),
        "relative_error": {"median": float(err.median()), "mean": float(err.mean()),
                           "p90": float(err.quantile(0.9)), "max": float(err.max())},
        "spearman_estimate_vs_exact": {"mean": float(torch.tensor(agree).mean()), "min": float(min(agree))},
        "bound_spearman_exact": rho_exact, "bound_spearman_estimate": rho_est,
        "bound_spearman_abs_difference_max": float((torch.tensor(rho_exact) - torch.tensor(rho_est)).abs().max()),
    }
