"""The no-op check of a dormant head (Guo et al. 2024; Barbero et al. 2025, Sec. 3.2).

Three interventions, each on the queries where the head was dormant and,
separately, on those where it was active, against the clean run's
next-token loss:
- *move to first*: the head puts all of its attention on the first token;
  on dormant queries (already >= `high` there) this can only change a little
  by construction;
- *zero out* (Guo et al.'s ablation): the head's output z is set to 0, which
  is off the distribution the later layers saw;
- *mean ablate*: z is set to the head's mean output over the checked prompts
  (every real query), the on-distribution version of zero-out.
For a true if-else head all cost ~nothing on dormant queries and clearly more
on active ones. Each effect is given two ways, since dormant queries usually
far outnumber active ones: the *total* loss change over the intervened queries
(summed over prompts) and the *per-query* mean (total / intervened queries).
Each comes with a matched control: the same intervention on as many queries
of the head's other mode, matched by position within each prompt (the
nearest unused one; "between" queries where the other mode runs out), so a
reader sees whether the cost belongs to the mode or to intervening anywhere.

Queries of one prompt are not independent, and a dozen prompts may carry the
active queries, so every interval is a Student t interval over prompts
(per-prompt sums; a per-query mean through the ratio's linearisation,
`sinkmech.stats.ratio_t_interval`), or, where the prompts are windows cut
from shared documents (`documents`), over those documents (each document's
sums), with a two-sided p-value; Holm's correction runs over the primary
family (`primary_family`), every other interval is reported unadjusted. Run it on prompts that did
not choose the head or its trigger (`sinkmech.dormant.discover`).

The clean run also records where the head's active queries look: the share of
their attention on the first token, the query itself, the previous token, the
second position, an earlier copy of the query's token, punctuation, and the
rest (each key counted once, in that order).
"""

from __future__ import annotations

import string
import unicodedata
from dataclasses import asdict, dataclass, field, replace
from typing import Sequence

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from sinkmech.hooks import (
    Hook, head_label, act_name, all_to_first_hook, cached_run, check_head, mean_head_hook, run, zero_head_hook,
)
from sinkmech.dormant.labels import Thresholds
from sinkmech.loading.backend import Model
from sinkmech.measures.attention import sink_mass
from sinkmech.measures.loss import UNEMBED_ROWS, next_token_nll, nll_chunks, token_losses
from sinkmech.prompts import Bos, PromptSource, TokenBatch, as_batch, token_text
from sinkmech.options import RunOptions
from sinkmech.results import Result
from sinkmech.stats import (Interval, holm, n_documents, ratio_difference_t_interval, ratio_t_interval, t_interval,
                            unit_sums)


INTERVENTIONS = ("move_to_first", "zero_out", "mean_ablate")
MODES = ("dormant", "active")
LOOKS = ("first", "self", "previous", "second_position", "same_token", "punctuation", "rest")


@dataclass(frozen=True)
class NoopResult:
    """Loss changes (intervened - clean, nats) of intervening on one head: the
    `per_query_*` fields move it onto the first token, the `zero_*` fields
    zero its output (each on its dormant and on its active queries, t
    intervals over prompts); `checks` holds every intervention in full."""

    layer: int
    head: int
    n_dormant: int  # queries forced in the dormant condition
    n_active: int
    delta_loss_dormant: float  # mean over all predicted tokens
    delta_loss_active: float
    per_query_dormant: float | None  # summed loss change / forced queries
    per_query_active: float | None
    per_query_dormant_ci: tuple[float, float] | None = None  # t interval over prompts (NoopCheck.ci_level)
    per_query_active_ci: tuple[float, float] | None = None
    n_prompts_dormant: int = 0  # prompts with at least one forced query
    n_prompts_active: int = 0
    zero_dormant: float | None = None  # zero-out, summed loss change / zeroed queries
    zero_active: float | None = None
    zero_dormant_ci: tuple[float, float] | None = None
    zero_active_ci: tuple[float, float] | None = None
    # "<intervention>_<mode>" -> n_queries, n_prompts, total, per_query (each value, ci, p, p_adjusted,
    # detectable, detectable_adjusted), matched_control (n_queries, per_query, difference)
    checks: dict = field(default_factory=dict)
    active_looks: dict | None = None  # share of the active queries' attention per place (LOOKS), n_queries

    def effects(self) -> dict[str, tuple[float | None, tuple[float, float] | None]]:
        """(per-query effect, interval) of move to first and zero out, by `<intervention>_<mode>`."""
        return {"move_to_first_dormant": (self.per_query_dormant, self.per_query_dormant_ci),
                "move_to_first_active": (self.per_query_active, self.per_query_active_ci),
                "zero_out_dormant": (self.zero_dormant, self.zero_dormant_ci),
                "zero_out_active": (self.zero_active, self.zero_active_ci)}

    def detectable(self) -> dict[str, bool | None]:
        """Per effect: does its interval exclude zero (None: no interval)."""
        return {k: None if ci is None else not ci[0] <= 0.0 <= ci[1] for k, (_, ci) in self.effects().items()}

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("per_query_dormant_ci", "per_query_active_ci", "zero_dormant_ci", "zero_active_ci"):
            d[k] = None if d[k] is None else list(d[k])
        d["detectable"] = self.detectable()
        return d


@dataclass(frozen=True)
class NoopCheck(Result):
    results: tuple[NoopResult, ...]
    loss_clean: float  # mean next-token loss of the clean run
    n_tokens: int  # predicted tokens the means run over
    bos: Bos
    high: float
    low: float
    ci_level: float = 0.95
    n_boot: int = 0  # no bootstrap: the intervals are t intervals over prompts
    prompt_indices: tuple[int, ...] | None = None  # which prompts of the corpus it ran on, when known
    n_intervals: int = 0  # the size of the Holm family (`primary_family`)
    # the pre-registered tests Holm's correction runs over: one per primary head and intervention, the
    # per-query cost on its active queries minus that on as many matched controls (`primary_family`);
    # every other interval is secondary and reported unadjusted
    primary_family: dict | None = None
    n_prompts: int | None = None  # prompts checked
    n_documents: int | None = None  # the documents they were cut from, when known: the intervals' units

    def at_prompts(self, prompt_indices: Sequence[int]) -> NoopCheck:
        """This check with where its prompts sit in a larger corpus recorded
        (one index per prompt checked)."""
        indices = tuple(int(i) for i in prompt_indices)
        if self.n_prompts is not None and len(indices) != self.n_prompts:
            raise ValueError(f"{len(indices)} prompt indices for a check of {self.n_prompts} prompts")
        return replace(self, prompt_indices=indices)

    @property
    def interval(self) -> str:
        """What the t intervals run over, in words."""
        over = (f"the {self.n_documents} documents the {self.n_prompts} prompts were cut from (each document's loss "
                "changes and queries summed first)" if self.n_documents is not None else "prompts")
        return f"Student t intervals over {over} (per-query means: the ratio's linearisation)"

    def to_dataframe(self):
        import pandas as pd

        return pd.DataFrame([r.to_dict() for r in self.results])

    def to_dict(self) -> dict:
        return {"loss_clean": self.loss_clean, "n_tokens": self.n_tokens, "bos": self.bos,
                "high": self.high, "low": self.low, "ci_level": self.ci_level, "n_boot": self.n_boot,
                "interval": self.interval, "n_prompts": self.n_prompts, "n_documents": self.n_documents,
                "correction": f"Holm over the primary family only ({self.n_intervals} tests: per primary head and "
                              "intervention, active minus matched control, per query; p_adjusted); every other "
                              "interval is secondary, reported unadjusted (role 'secondary', p_adjusted null)",
                "n_intervals": self.n_intervals,
                "primary_family": self.primary_family,
                "prompt_indices": None if self.prompt_indices is None else list(self.prompt_indices),
                "heads": [r.to_dict() for r in self.results]}


def force_mask(first: Float[Tensor, "batch query_pos"], valid: Bool[Tensor, "batch query_pos"], *,
               high: float, low: float) -> tuple[Tensor, Tensor]:
    """(dormant, active) query masks from first-token attention."""
    return (first >= high) & valid, (first <= low) & valid


def matched_control(mode: Bool[Tensor, "batch pos"], other: Bool[Tensor, "batch pos"],
                    valid: Bool[Tensor, "batch pos"]) -> Bool[Tensor, "batch pos"]:
    """As many queries as `mode` holds in each prompt, from `other` at the
    nearest unused position (ties: the earlier), then from the valid queries
    in neither mask where `other` runs out; fewer where both run out."""
    out = torch.zeros_like(mode)
    between = valid & ~mode & ~other
    for b in range(mode.shape[0]):
        pools = [other[b].nonzero()[:, 0].tolist(), between[b].nonzero()[:, 0].tolist()]
        for p in mode[b].nonzero()[:, 0].tolist():
            pool = next((x for x in pools if x), None)
            if pool is None:
                break
            j = min(range(len(pool)), key=lambda i: (abs(pool[i] - p), pool[i]))
            out[b, pool.pop(j)] = True
    return out


def _summarise(sums: dict, level: float, documents: Sequence | None = None) -> dict:
    """Per `<intervention>_<mode>`: counts, total and per-query effect with t
    intervals, and the matched control with the difference from it. The units
    are prompts, or with `documents` (each prompt's) the documents: every
    prompt's loss change and query count summed per document first."""
    out = {}
    g = documents
    for how in INTERVENTIONS:
        for mode in MODES:
            d, q = sums[(how, mode, "mode")]
            units = unit_sums(d, g)
            entry = {"n_queries": int(q.sum()), "n_prompts": int((q > 0).sum()),
                     "total": _effect(t_interval(units, level=level, scale=float(len(units)),
                                                 unit="document" if g is not None else "prompt")
                                      if q.sum() > 0 else None),
                     "per_query": _effect(ratio_t_interval(d, q, level=level, groups=g))}
            if g is not None:
                entry["n_documents"] = int((unit_sums(q, g) > 0).sum())
            dc, qc = sums[(how, mode, "control")]
            entry["matched_control"] = {
                "n_queries": int(qc.sum()), "n_prompts": int((qc > 0).sum()),
                "drawn_from": "the other mode at the nearest unused position in the same prompt, then between queries",
                "per_query": _effect(ratio_t_interval(dc, qc, level=level, groups=g)),
                "difference": _effect(ratio_difference_t_interval(d, q, dc, qc, level=level, groups=g)),
            }
            out[f"{how}_{mode}"] = entry
        if how == "mean_ablate":  # zero-out against mean-ablation on the same queries, paired by prompt
            for mode in MODES:
                dz, qz = sums[("zero_out", mode, "mode")]
                dm, qm = sums[("mean_ablate", mode, "mode")]
                out[f"zero_out_{mode}"]["minus_mean_ablate"] = _effect(ratio_difference_t_interval(
                    dz, qz, dm, qm, level=level, groups=g))
    return out


def _effect(t: Interval | None) -> dict | None:
    if t is None:
        return None
    return {"value": t.value, "ci": t.ci, "p": t.p, "detectable": t.excludes_zero,
            "p_adjusted": None, "detectable_adjusted": None, "role": "secondary"}


PRIMARY_TEST = "active minus matched control, per query"


def _effects(entry: dict) -> list[dict]:
    """Every interval of one `<intervention>_<mode>` entry."""
    out = [entry["total"], entry["per_query"], entry.get("minus_mean_ablate")]
    mc = entry.get("matched_control")
    if mc is not None:
        out += [mc["per_query"], mc["difference"]]
    return [e for e in out if e is not None]


def primary_family(checks: dict[tuple[int, int], dict], heads: Sequence[tuple[int, int]], alpha: float) -> dict:
    """Holm over the pre-registered primary family, in place: for each head of
    `heads` (the if-else heads) and each intervention, the per-query cost on
    its active queries minus that on as many matched controls (active minus
    matched control: `<intervention>_active.matched_control.difference`).
    Those tests get `role` "primary", `p_adjusted` and `detectable_adjusted`;
    every other interval of `checks` is secondary (unadjusted, p_adjusted
    None). Returns the family: {"size", "test", "correction", "tests"}."""
    for c in checks.values():
        for entry in c.values():
            for e in _effects(entry):
                e["role"], e["p_adjusted"], e["detectable_adjusted"] = "secondary", None, None
    tests = []
    for lh in heads:
        for how in INTERVENTIONS:
            mc = checks[lh][f"{how}_active"].get("matched_control")
            e = None if mc is None else mc["difference"]
            tests.append((lh, how, e))
    family = [e for _, _, e in tests if e is not None]
    for e, p in zip(family, holm([e["p"] for e in family])):
        e["role"], e["p_adjusted"], e["detectable_adjusted"] = "primary", p, p < alpha
    return {"size": len(family), "test": PRIMARY_TEST,
            "correction": f"Holm at {alpha:g} over these tests only; totals, per-mode effects, resting-only and "
                          "control-only intervals and zero-out minus mean-ablation are secondary (unadjusted)",
            "tests": [{"head": head_label(*lh), "intervention": how,
                       **({"value": None, "ci": None, "p": None, "p_adjusted": None, "detectable_adjusted": None}
                          if e is None else {k: e[k] for k in ("value", "ci", "p", "p_adjusted", "detectable_adjusted")})}
                      for lh, how, e in tests]}


def with_primary(check: NoopCheck, heads: Sequence[tuple[int, int]]) -> NoopCheck:
    """`check` with its primary family narrowed to `heads` (the if-else heads of
    the scan that chose them; checked candidates become secondary)."""
    import copy

    checks = {(r.layer, r.head): copy.deepcopy(r.checks) for r in check.results}
    heads = [(int(l), int(h)) for l, h in heads if (int(l), int(h)) in checks]
    family = primary_family(checks, heads, 1 - check.ci_level)
    results = tuple(replace(r, checks=checks[(r.layer, r.head)]) for r in check.results)
    return replace(check, results=results, n_intervals=family["size"], primary_family=family)


def _punctuation(model: Model, tokens: Tensor) -> Tensor:
    """[d_vocab-like] bool: token ids of `tokens` whose text is punctuation only (no tokenizer: none)."""
    ids = torch.unique(tokens.cpu())
    mask = torch.zeros(int(ids.max()) + 1, dtype=torch.bool)
    if getattr(model, "tokenizer", None) is None:
        return mask
    text = token_text(model)
    for i in ids.tolist():
        t = text(i).strip()
        mask[i] = bool(t) and all(ch in string.punctuation or unicodedata.category(ch).startswith("P") for ch in t)
    return mask


def _looks(pattern: Float[Tensor, "batch query_pos key_pos"], tokens: Int[Tensor, "batch pos"],
           active: Bool[Tensor, "batch query_pos"], punct: Tensor) -> Tensor:
    """Attention mass of the `active` queries on each place of `LOOKS` (each key
    in the first place it fits), summed, then their count: [len(LOOKS) + 1]."""
    B, P, _ = pattern.shape
    q = torch.arange(P)[:, None].expand(P, P)
    k = torch.arange(P)[None, :].expand(P, P)
    same = tokens[:, :, None] == tokens[:, None, :]  # [batch, query, key]
    is_punct = punct[tokens.clamp(max=len(punct) - 1)][:, None, :].expand(B, P, P)
    places = [(k == 0).expand(B, P, P), (k == q).expand(B, P, P), (k == q - 1).expand(B, P, P),
              (k == 1).expand(B, P, P), same & (k < q), is_punct]
    taken = torch.zeros(B, P, P, dtype=torch.bool)
    out = torch.zeros(len(LOOKS) + 1, dtype=torch.float64)
    w = pattern * active[:, :, None]
    for i, m in enumerate(places):
        m = m & ~taken
        out[i] = float((w * m).sum())
        taken |= m
    out[len(places)] = float((w * ~taken).sum())
    out[-1] = float(active.sum())
    return out


# The passes.

METHODS = ("restart", "restart_each", "full")

__all__ = ["INTERVENTIONS", "LOOKS", "METHODS", "MODES", "NoopCheck", "NoopResult", "force_mask",
           "matched_control", "noop_check", "noop_heads", "primary_family", "with_primary"]


def noop_heads(scan, n_candidates: int, max_heads: int | None = None) -> list[tuple[int, int]]:
    """The heads a no-op check should cover: every head the scan (a HeadScan)
    labels if_else, then the `n_candidates` best-ranked heads that are not
    (the closest candidates); [] for 0. With `max_heads`, the first that many
    of them (the if-else heads in the scan's order first): a check's cost grows
    with its heads (a SmolLM2 scan of 162 prompts labels 22 if-else heads)."""
    if n_candidates < 1:
        return []
    found = scan.if_else_heads()
    heads = found + [hd for hd in scan.ranked() if hd not in found][:n_candidates]
    return heads if max_heads is None else heads[:max_heads]


def noop_check(
    model: Model,
    tokens: TokenBatch | PromptSource,
    heads: Sequence[tuple[int, int]],
    *,
    bos: Bos | None = None,
    max_tokens: int | None = None,
    thresholds: Thresholds = Thresholds(),
    ci_level: float = 0.95,
    documents: Sequence | None = None,
    method: str = "restart",
    options: RunOptions = RunOptions(),
) -> NoopCheck:
    """Loss change of each intervention on each head's dormant (first-token
    attention >= high) and active (<= low) queries, with matched controls.

    Args:
        model: a HookedTransformer or a TransformerBridge (`sinkmech.loading.backend`).
        tokens: a `TokenBatch`, or prompts (`sinkmech.corpora.load_prompts`)
            tokenized once with `bos` (default "prepend"), `max_tokens`
            (default 64) and `options.bos_token_id`; see `sinkmech.prompts.as_batch`.
        heads: (layer, head) pairs, e.g. `scan.if_else_heads()`.
        thresholds: its query-mode cuts `high` and `low` say which queries are
            dormant and active (use the scan's: `scan.thresholds`).
        ci_level: the level of the t intervals over prompts.
        documents: each prompt's source document (`sinkmech.corpora.prompt_documents`)
            where windows were cut from shared documents: the intervals then
            run over documents (each document's losses and queries summed
            first), not over windows that are not independent.
        method: "restart" (default) restarts the intervened passes at the
            head's layer from the clean residual, on the prompts that hold an
            intervened query, the three interventions of one set of queries
            stacked in one pass, and unembeds only the positions they can
            change, a full chunk at a time across passes; "restart_each" is
            the same with one pass and one unembedding per intervention;
            "full", the reference, runs a whole forward pass per intervention
            and scores every position. Equal up to float rounding (tests;
            `scripts/bench_noop.py` times all three).
        options: batch size (default 16 prompts per forward pass), progress bar.

    Returns:
        NoopCheck with one NoopResult per head, in the given order. Where the
        prompts sit in a larger corpus is the caller's to record
        (`check.at_prompts(prompt_indices)`), so a reader can check they are disjoint
        from the scan's.
    """
    high, low = thresholds.high, thresholds.low
    if not 0.0 <= low < high <= 1.0:
        raise ValueError(f"thresholds out of order: need 0 <= low < high <= 1, got low={low}, high={high}")
    if not 0.0 < ci_level < 1.0:
        raise ValueError(f"need 0 < ci_level < 1, got {ci_level}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    for layer, head in heads:
        check_head(model, layer, head)
    batch = as_batch(model, tokens, bos=bos, default="prepend", max_tokens=max_tokens,
                     bos_token_id=options.bos_token_id)
    if documents is not None and len(documents) != len(batch):
        raise ValueError(f"documents names {len(documents)} prompts' documents for {len(batch)} prompts")
    heads = [(int(l), int(h)) for l, h in heads]
    layers = sorted({l for l, _ in heads})
    batch_size = options.batch(16)
    means = _mean_outputs(model, batch, layers, batch_size)
    punct = _punctuation(model, batch.tokens)
    kinds = ("mode", "control")
    # per prompt: summed loss change and intervened queries, per head, intervention, mode and kind
    cells = [(lh, (i, m, k)) for lh in heads for i in INTERVENTIONS for m in MODES for k in kinds]
    cell_id = {c: n for n, c in enumerate(cells)}
    n_prompts = len(batch)
    pending = _Pending(model, len(cells) * n_prompts)  # summed loss change at cell_id * n_prompts + prompt
    counts = torch.zeros(len(cells), n_prompts, dtype=torch.float64)
    looks = {lh: torch.zeros(len(LOOKS) + 1, dtype=torch.float64) for lh in heads}  # masses, then the count
    loss_sum, n_tokens = 0.0, 0
    # one step per head and batch of prompts (its restarted passes: seconds on a CPU), so the bar moves
    n_batches = -(-len(batch) // batch_size)
    bar = tqdm(total=n_batches * len(heads), desc=f"no-op check ({len(heads)} heads)", disable=not options.progress,
               unit="head")
    for rows, part in batch.batches(batch_size):
        first: dict[int, Tensor] = {}
        valid_q = part.mask.clone()
        valid_q[:, 0] = False

        def keep(pattern, hook):
            l = hook.layer()
            first[l] = sink_mass(model, pattern).clone()  # [batch, head, query]: key 0 (+ a learned sink)
            for lh in heads:
                if lh[0] == l:
                    active = (first[l][:, lh[1]] <= low) & valid_q.to(pattern.device)
                    looks[lh] += _looks(pattern[:, lh[1]].float().cpu(), part.tokens.cpu(), active.cpu(), punct)

        clean, starts = _clean_run(model, part.tokens, layers, [(act_name("pattern", l), keep) for l in layers])
        valid_loss = torch.arange(clean.shape[1])[None, :] < (part.lengths.cpu()[:, None] - 1)
        loss_sum += float(clean[valid_loss].sum())
        n_tokens += int(valid_loss.sum())
        for lh in heads:
            layer, head = lh
            masks = dict(zip(MODES, force_mask(first[layer][:, head], valid_q, high=high, low=low)))
            for mode in MODES:
                other = masks["active" if mode == "dormant" else "dormant"]
                targets = {"mode": masks[mode], "control": matched_control(masks[mode], other, valid_q)}
                for kind, queries in targets.items():
                    if not queries.any():
                        continue
                    ids = [cell_id[(lh, (how, mode, kind))] for how in INTERVENTIONS]
                    counts[ids, rows] += queries.sum(1).double().cpu()
                    out = torch.tensor(ids)[:, None] * n_prompts + torch.arange(rows.start, rows.stop)[None, :]
                    if method == "restart":
                        _stacked_changes(model, part.tokens, starts[layer], layer, head, means[layer][head], queries,
                                         clean, valid_loss, out, pending)
                        continue
                    change = _loss_change if method == "restart_each" else _full_loss_change
                    for i, hook in enumerate(_hooks(layer, head, means[layer][head], [queries] * len(INTERVENTIONS))):
                        delta = change(model, part.tokens, starts[layer], layer, hook, queries, clean, valid_loss)
                        pending.delta.index_add_(0, out[i], delta.double().cpu())
            bar.update(1)
    bar.close()
    if n_tokens == 0:
        raise ValueError("no next-token predictions: every prompt has a single token")
    deltas = pending.finish().view(len(cells), n_prompts)
    per_prompt = {lh: {} for lh in heads}
    for (lh, c), n in cell_id.items():
        per_prompt[lh][c] = (deltas[n], counts[n])
    checks = {lh: _summarise(per_prompt[lh], ci_level, documents) for lh in heads}
    family = primary_family(checks, heads, 1 - ci_level)  # every checked head; `with_primary` narrows it
    results = []
    for lh in heads:
        l, h = lh
        c = checks[lh]

        def pq(key: str):
            e = c[key]["per_query"]
            return (None, None) if e is None else (e["value"], tuple(e["ci"]))

        (pd_, pd_ci), (pa, pa_ci), (zd, zd_ci), (za, za_ci) = (
            pq("move_to_first_dormant"), pq("move_to_first_active"), pq("zero_out_dormant"), pq("zero_out_active"))
        md, ma = per_prompt[lh][("move_to_first", "dormant", "mode")], per_prompt[lh][("move_to_first", "active", "mode")]
        n_look = float(looks[lh][-1])  # active queries, as counted in the clean run
        results.append(NoopResult(
            layer=l, head=h, n_dormant=int(md[1].sum()), n_active=int(ma[1].sum()),
            delta_loss_dormant=float(md[0].sum()) / n_tokens, delta_loss_active=float(ma[0].sum()) / n_tokens,
            per_query_dormant=pd_, per_query_active=pa, per_query_dormant_ci=pd_ci, per_query_active_ci=pa_ci,
            n_prompts_dormant=int((md[1] > 0).sum()), n_prompts_active=int((ma[1] > 0).sum()),
            zero_dormant=zd, zero_active=za, zero_dormant_ci=zd_ci, zero_active_ci=za_ci, checks=c,
            active_looks=None if n_look == 0 else {
                "n_queries": int(n_look), **{k: float(v) for k, v in zip(LOOKS, looks[lh][:-1] / n_look)}},
        ))
    return NoopCheck(tuple(results), loss_sum / n_tokens, n_tokens, batch.bos, high, low, ci_level,
                     n_intervals=family["size"], primary_family=family, n_prompts=n_prompts,
                     n_documents=None if documents is None else n_documents(documents, n_prompts))


def _mean_outputs(model: Model, batch: TokenBatch, layers: Sequence[int], batch_size: int) -> dict[int, Tensor]:
    """Each head's mean output z over the real queries (query 0 and padding
    excluded) of `batch`: {layer: [head_index, d_head]}."""
    sums: dict[int, Tensor] = {}
    count = 0.0
    for _, part in batch.batches(batch_size):
        valid = part.mask.clone()
        valid[:, 0] = False
        count += float(valid.sum())

        def keep(z, hook):
            v = valid.to(z.device)[:, :, None, None].to(z.dtype)
            s = (z.double() * v.double()).sum((0, 1)).cpu()  # float64: the same mean whatever the batching
            sums[hook.layer()] = sums.get(hook.layer(), 0) + s

        run(model, part.tokens, [(act_name("z", l), keep) for l in layers], stop_at_layer=max(layers) + 1)
    return {l: (s / max(count, 1.0)).float() for l, s in sums.items()}


def _clean_run(model: Model, tokens: Tensor, layers: Sequence[int], fwd_hooks: list
               ) -> tuple[Float[Tensor, "batch pos_minus_1"], dict[int, Tensor]]:
    """The clean run's next-token losses at every position, and the residual
    stream entering each of `layers` (where an intervention's pass restarts)."""
    names = {l: act_name("resid_pre", l) for l in layers}
    last = act_name("resid_post", model.cfg.n_layers - 1)
    _, cache = cached_run(model, tokens, [*names.values(), last], fwd_hooks, stop_at_layer=model.cfg.n_layers)
    clean = torch.zeros(tokens.shape[0], tokens.shape[1] - 1)
    for a, b, nll in nll_chunks(model, cache[last], tokens, None):
        clean[:, a:b] = nll.float().cpu()
    return clean, {l: cache[n] for l, n in names.items()}


def _hooks(layer: int, head: int, mean: Float[Tensor, " d_head"], masks: Sequence[Tensor]) -> list[Hook]:
    """The interventions of INTERVENTIONS, in that order, each on its own
    `queries` mask (one mask for all three, or one copy of the batch each)."""
    move, zero, ablate = masks
    return [(act_name("pattern", layer), all_to_first_hook(head, move)),
            (act_name("z", layer), zero_head_hook(head, zero)),
            (act_name("z", layer), mean_head_hook(head, mean, ablate))]


class _Pending:
    """Final residual rows waiting for their next-token loss, unembedded a full
    chunk of UNEMBED_ROWS at a time across passes, and `delta`, the summed loss
    change (intervened - clean) at each destination. Why across passes: on a
    CPU the product with the unembedding is slower per row in small chunks
    (Gemma 3's 262k vocabulary, one thread: 3.4 ms a row at 128 rows, 2.7 ms
    at 256; `scripts/bench_unembed.py --rows`), and each pass's changed
    positions end in such a remainder."""

    def __init__(self, model: Model, n_out: int) -> None:
        self.model = model
        self.delta = torch.zeros(n_out, dtype=torch.float64)
        self.parts: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
        self.n = 0

    def add(self, resid: Float[Tensor, "row d_model"], targets: Tensor, clean: Tensor, out: Tensor) -> None:
        """Rows of final residual, their next tokens, clean losses and destinations."""
        self.parts.append((resid, targets, clean, out))
        self.n += len(out)
        if self.n >= UNEMBED_ROWS:
            self._score(self.n - self.n % UNEMBED_ROWS)

    def finish(self) -> Float[Tensor, " out"]:
        """Scores what is left; returns `delta`."""
        if self.n:
            self._score(self.n)
        return self.delta

    def _score(self, stop: int) -> None:
        resid, targets, clean, out = (torch.cat(x) for x in zip(*self.parts))
        for a in range(0, stop, UNEMBED_ROWS):
            b = min(a + UNEMBED_ROWS, stop)
            nll = next_token_nll(self.model, resid[a:b], targets[a:b]).cpu()
            self.delta.index_add_(0, out[a:b], (nll - clean[a:b]).double())
        self.parts = [(resid[stop:], targets[stop:], clean[stop:], out[stop:])] if stop < len(out) else []
        self.n = len(out) - stop


def _stacked_changes(model: Model, tokens: Tensor, start: Tensor, layer: int, head: int,
                     mean: Float[Tensor, " d_head"], queries: Bool[Tensor, "batch pos"], clean: Tensor,
                     valid: Tensor, out: Tensor, pending: _Pending) -> None:
    """The interventions of INTERVENTIONS on `queries` in one pass restarted at
    `layer` from the clean residual: the prompts that hold an intervened
    query (the others' change is exactly 0), once per intervention along the
    batch axis, each copy with its own hook. As in `_loss_change`, only the
    positions at or after a prompt's first intervened query can change; their
    final residual goes to `pending`, destined for `out[intervention, prompt]`."""
    k = len(INTERVENTIONS)
    rows = queries.any(1).nonzero()[:, 0]
    q = queries[rows]  # [row, pos]: every row holds an intervened query
    only = []
    for i in range(k):  # copy i's hook intervenes on copy i's queries only
        m = torch.zeros(k, *q.shape, dtype=torch.bool, device=q.device)
        m[i] = q
        only.append(m.flatten(0, 1))
    resid = run(model, start[rows].repeat(k, 1, 1), _hooks(layer, head, mean, only), start_at_layer=layer,
                stop_at_layer=model.cfg.n_layers)
    pos = torch.arange(clean.shape[1], device=q.device)
    changed = (pos[None, :] >= q.float().argmax(1)[:, None]) & valid.to(q.device)[rows]  # [row, pos_minus_1]
    b, p = changed.nonzero(as_tuple=True)
    stacked = (torch.arange(k, device=q.device)[:, None] * len(rows) + b[None, :]).flatten()
    prompt, p_cpu = rows[b].cpu(), p.cpu()
    pending.add(resid[stacked, p.repeat(k)], tokens[rows[b], p + 1].repeat(k), clean[prompt, p_cpu].repeat(k),
                out[:, prompt].flatten())


def _loss_change(model: Model, tokens: Tensor, start: Tensor, layer: int, hook, queries: Bool[Tensor, "batch pos"],
                 clean: Tensor, valid: Tensor) -> Float[Tensor, " batch"]:
    """Summed next-token loss change (intervened - clean) per prompt, over the
    `valid` positions. The pass restarts at `layer` from the clean residual
    (nothing before it can change), and only the positions at or after a
    prompt's first intervened query are unembedded: causal attention leaves
    the earlier ones exactly as in the clean run, so their change is 0."""
    resid = run(model, start, [hook], start_at_layer=layer, stop_at_layer=model.cfg.n_layers)
    n_pred = clean.shape[1]
    pos = torch.arange(n_pred, device=queries.device)
    has = queries.any(1)
    first_q = torch.where(has, queries.float().argmax(1), torch.full_like(has, n_pred, dtype=torch.long))
    changed = (pos[None, :] >= first_q[:, None]) & valid.to(queries.device)  # [batch, pos_minus_1]
    b, p = changed.nonzero(as_tuple=True)
    delta = torch.zeros(tokens.shape[0], dtype=torch.float64)
    for a in range(0, len(b), UNEMBED_ROWS):
        rb, rp = b[a : a + UNEMBED_ROWS], p[a : a + UNEMBED_ROWS]
        nll = next_token_nll(model, resid[rb, rp], tokens[rb, rp + 1]).cpu()
        delta.index_add_(0, rb.cpu(), (nll - clean[rb.cpu(), rp.cpu()]).double())
    return delta


def _full_loss_change(model: Model, tokens: Tensor, start: Tensor, layer: int, hook, queries: Tensor,
                      clean: Tensor, valid: Tensor) -> Float[Tensor, " batch"]:
    """The reference for `_loss_change`: a whole forward pass with the hook, every
    position scored (`start` and `queries` unused)."""
    hooked = token_losses(model, tokens, [hook])
    return torch.where(valid, hooked - clean, torch.zeros_like(clean)).sum(1).double()
