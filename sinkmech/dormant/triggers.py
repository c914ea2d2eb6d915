"""Trigger statistics of dormant heads: which tokens wake a head up.

On a head's *active* queries (first-token attention <= the low threshold) we
count the token at the query position ("query"), at the position before it
("previous") and at the key the head attends most, the first token excluded
("key"). A count means little on its own: activity falls with position in
nearly every head (PAPER.md, hand study of SmolLM2), so every late token would
look like a trigger. The expected count is therefore position-adjusted:

- query / previous: sum over the token's occurrences at query position p of
  the head's active rate at p, i.e. what the head would do if it ignored tokens;
- key: sum over active queries of the token's corpus frequency at the
  position the query attended, i.e. the head kept its positions but the
  tokens there were drawn at random (so a previous-token head does not make
  late-occurring tokens look like triggers).

lift = count / expected (Barbero et al. 2025, Sec. 3.2; Guo et al. 2024).
Triggers are ranked by the Poisson log-likelihood ratio of count vs expected,
which weighs lift by how many queries back it.

Queries of one prompt are not independent (a token repeated in one prompt can
make a "trigger" of a few queries), and the top trigger is picked among
thousands of candidates, so what picks a trigger never judges it. The prompts
are split by index parity: candidates are counted and ranked on the even-
numbered prompts only (*selection*: `count`, `expected`, `lift`, `n_prompts`,
`log_lr`), and the head's one chosen trigger (the best-ranked with selection
lift >= `min_lift`) is judged on the odd-numbered prompts (*validation*: its
own token occurrences there, the head's position profile). It is `validated`
when there it reaches lift >= `min_lift` on >= `min_count` active queries in
>= `min_prompts` prompts and its test's p-value (`trigger_p`) is <= `alpha` /
(layers x heads), a Bonferroni bound over every head scanned.

The test (`trigger_test`) takes the prompt as its unit (`judge_by_prompt`,
"prompt_t"): a head and a token can cluster in the same prompts without the
head reading the token (a head active on whole prompts of one kind, where the
token happens to be common), and the Poisson upper tail P(X >= count |
expected) (`p_validated`, "query_poisson") counts such queries as
independent evidence. Per validation prompt i, the excess e_i = observed_i -
expected_i, where expected_i keeps the head's position profile r(p) but scales
it to the prompt's own activity (for "query" / "previous": c_i = active
queries of prompt i / sum of r(p) over its queries, expected_i = c_i x sum of
r(p) over the token's occurrences there, what the head would do if within
the prompt it ignored tokens; for "key": the position-adjusted count above,
restricted to the prompt). The one-sided Student t test of mean(e_i) > 0
over the prompts where the token occurs gives `trigger_p`. It needs the
scan's per-query records (a one-pass scan and merged shard parts keep them);
a scan rebuilt from sums alone falls back to the Poisson tail and says so
(`trigger_test` "query_poisson").
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, replace
from typing import Literal

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from sinkmech.stats import t_sf

Where = Literal["query", "previous", "key"]
WHERES: tuple[Where, ...] = ("query", "previous", "key")


SELECT, VALIDATE = 0, 1  # the halves of the prompts: even-numbered ones select, odd-numbered ones validate


def split_prompts(n_prompts: int) -> tuple[list[int], list[int]]:
    """(selection, validation) prompt indices of a corpus of `n_prompts`: the
    even- and the odd-numbered prompts (disjoint)."""
    return list(range(0, n_prompts, 2)), list(range(1, n_prompts, 2))


@dataclass(frozen=True)
class Trigger:
    """One over-represented token on a head's active queries. `count`,
    `expected`, `lift`, `n_prompts` and `log_lr` are measured on the selection
    prompts (they chose it); the `*_validated` fields on the disjoint
    validation prompts (they judge it)."""

    token: str
    token_id: int
    where: Where
    count: int  # active queries with this token there (selection prompts)
    expected: float  # position-adjusted count if tokens did not matter
    lift: float  # count / expected
    log_lr: float  # Poisson log-likelihood ratio 2[n ln(n/e) - (n - e)]: the ranking key
    active_rate: float | None  # P(active | token there), selection prompts; None for "key"
    n_prompts: int = 0  # distinct selection prompts with an active query with this token there
    count_validated: int = 0
    expected_validated: float = 0.0
    validated_lift: float | None = None  # None: the token never occurs where it could count on the validation prompts
    prompts_validated: int = 0
    p_validated: float | None = None  # Poisson P(X >= count_validated | expected_validated), queries as units
    validated: bool = False  # the validation rule of the module docstring holds
    trigger_test: str = "query_poisson"  # what trigger_p is: "prompt_t" (prompts as units) or "query_poisson"
    trigger_p: float | None = None  # the p-value `validated` is judged on
    # the chosen trigger's permutation test over prompts, reported beside the t test (secondary: labels read trigger_p)
    trigger_p_perm: float | None = None
    # the chosen trigger on the validation prompts: active queries, and the share of them with the trigger at
    # its place (coverage) and that share beyond what the head would do if it ignored tokens
    n_active_validated: int | None = None
    coverage: float | None = None
    coverage_beyond_chance: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


class TriggerCounter:
    """Streaming trigger accumulators, dense over the vocabulary.

    Memory: 12 x layer x head x vocab floats on the model's device (counts of
    active queries and of distinct prompts per half of the prompts, per
    place). Prompts are split by the parity of `prompt_ids` (`split_prompts`).
    """

    def __init__(self, n_layers: int, n_heads: int, d_vocab: int, n_pos: int, device) -> None:
        shape = (2, n_layers, n_heads, d_vocab)  # [half: selection (even) / validation (odd) prompts, ...]
        self.observed_half = {w: torch.zeros(shape, device=device) for w in WHERES}
        self.prompts_half = {w: torch.zeros(shape, device=device) for w in WHERES}
        self.key_positions_half = torch.zeros(2, n_layers, n_heads, n_pos, device=device)  # active queries per attended key
        # occurrences of token t at query position p, for the query and previous token
        self.occurrences_half = {w: torch.zeros(2, d_vocab, n_pos, device=device) for w in ("query", "previous")}
        # each head's active queries and all queries per position: its position profile in each half
        self.active_pos_half = torch.zeros(2, n_layers, n_heads, n_pos, device=device)
        self.queries_pos_half = torch.zeros(2, n_pos, device=device)
        self.n_pos = n_pos

    def add_tokens(self, tokens: Int[Tensor, "batch pos"], valid: Bool[Tensor, "batch pos"],
                   prompt_ids: Int[Tensor, " batch"] | None = None) -> None:
        """Count every valid query once (head-independent); `valid` excludes
        query 0 and padding. `prompt_ids`: each row's index in the corpus
        (default 0, 1, ...), which decides its half."""
        B, P = tokens.shape
        half = _half(prompt_ids, B, tokens.device)
        pos = torch.arange(P, device=tokens.device).expand(B, P)
        prev = torch.roll(tokens, 1, dims=1)
        self.queries_pos_half.view(-1).index_add_(0, (half[:, None] * self.n_pos + pos)[valid],
                                                  torch.ones(int(valid.sum()), device=tokens.device))
        for where, tok in (("query", tokens), ("previous", prev)):
            occ = self.occurrences_half[where]
            flat = ((half[:, None] * tok.new_tensor(occ.shape[1]) + tok) * self.n_pos + pos)[valid]
            counts = torch.bincount(flat, minlength=occ.numel())
            occ += counts.view_as(occ).float()

    def add_layer(
        self,
        layer: int,
        tokens: Int[Tensor, "batch pos"],
        active: Bool[Tensor, "batch head_index query_pos"],
        key_index: Int[Tensor, "batch head_index query_pos"],
        prompt_ids: Int[Tensor, " batch"] | None = None,
    ) -> None:
        """Add one layer's active queries; `key_index` is the most attended
        key (>= 1) of each query; `prompt_ids` as in `add_tokens`."""
        B, H, P = active.shape
        act = active.float()
        half_row = _half(prompt_ids, B, tokens.device)
        half = half_row[:, None, None].expand(B, H, P)
        row = torch.arange(B, device=tokens.device)[:, None, None].expand(B, H, P)
        tok_q = tokens[:, None, :].expand(B, H, P)
        tok_prev = torch.roll(tokens, 1, dims=1)[:, None, :].expand(B, H, P)
        tok_key = torch.gather(tokens[:, None, :].expand(B, H, P), 2, key_index)
        head = torch.arange(H, device=tokens.device)[None, :, None].expand(B, H, P)
        L, V = self.observed_half["query"].shape[1], self.observed_half["query"].shape[-1]
        for where, tok in (("query", tok_q), ("previous", tok_prev), ("key", tok_key)):
            cell = (head * V + tok)
            self.observed_half[where].view(-1).index_add_(0, (half * (L * H * V) + layer * H * V + cell).flatten(), act.flatten())
            # distinct prompts: one count per (row, head, token) with any active query
            seen = torch.unique((row * (H * V) + cell)[active])
            where_half = half_row[seen // (H * V)]
            self.prompts_half[where].view(-1).index_add_(0, where_half * (L * H * V) + layer * H * V + seen % (H * V),
                                                          torch.ones_like(seen, dtype=act.dtype))
        n = self.n_pos
        self.key_positions_half.view(-1).index_add_(0, (half * (L * H * n) + layer * H * n + head * n + key_index).flatten(),
                                                    act.flatten())
        qpos = torch.arange(P, device=tokens.device)[None, None, :].expand(B, H, P)
        self.active_pos_half.view(-1).index_add_(0, (half * (L * H * n) + layer * H * n + head * n + qpos).flatten(),
                                                 act.flatten())

    def finalize(
        self,
        *,
        decode,
        min_count: int,
        top_k: int,
        min_prompts: int = 1,
        min_lift: float = 1.0,
        alpha: float = 0.05,
        n_tests: int | None = None,
    ) -> tuple[list[list[list[Trigger]]], Float[Tensor, "layer head_index"]]:
        """Top triggers per head, chosen on the selection prompts: top_k per
        place with count >= min_count in >= min_prompts distinct prompts and
        lift > 1, ranked by `log_lr`, each with its numbers on the validation
        prompts; and the best selection lift among them per head.

        Args:
            decode: token id -> readable string.
            alpha: family-wise level of the validation test (Bonferroni over
                `n_tests` heads, default every head counted here).
        """
        _, L, H, _ = self.active_pos_half.shape
        # each head's active rate at each query position, in each half
        rate = self.active_pos_half / self.queries_pos_half[:, None, None, :].clamp(min=1)
        max_p = alpha / (n_tests or L * H)

        def expect(where: str, half: int) -> Tensor:
            if where == "key":
                # the head kept its positions, the tokens there were drawn from that half's frequencies
                at_pos = self.occurrences_half["query"][half]
                freq = at_pos / at_pos.sum(0, keepdim=True).clamp(min=1)
                return torch.einsum("lhp,vp->lhv", self.key_positions_half[half], freq)
            return torch.einsum("lhp,vp->lhv", rate[half], self.occurrences_half[where][half])

        best = torch.zeros(L, H)
        out: list[list[list[Trigger]]] = [[[] for _ in range(H)] for _ in range(L)]
        for where in WHERES:
            obs, exp = self.observed_half[where][SELECT], expect(where, SELECT)
            n_prompts = self.prompts_half[where][SELECT]
            ok = (obs >= min_count) & (n_prompts >= min_prompts) & (exp > 0)
            lift = torch.where(ok, obs / exp.clamp(min=1e-12), 0.0)
            # rank by evidence, not lift alone: rare tokens reach huge lifts on a handful of counts
            llr = 2 * (obs * torch.log(lift.clamp(min=1e-12)) - (obs - exp))
            llr = torch.where(ok & (lift > 1), llr, -1.0)
            vals, ids = llr.topk(min(top_k, llr.shape[-1]), dim=-1)
            # the validation prompts, at the kept candidates only
            at = lambda x: torch.gather(x, -1, ids).cpu()  # noqa: E731
            v_obs, v_exp, v_prompts = at(self.observed_half[where][VALIDATE]), at(expect(where, VALIDATE)), \
                at(self.prompts_half[where][VALIDATE])
            v_p = poisson_upper_tail(v_obs, v_exp)
            occ_sel = (self.occurrences_half[where][SELECT].sum(-1).cpu() if where != "key" else None)
            vals, ids = vals.cpu(), ids.cpu()
            obs_c, exp_c, lift_c, prompts_c = obs.cpu(), exp.cpu(), lift.cpu(), n_prompts.cpu()
            for l in range(L):
                for h in range(H):
                    for k, (g, t) in enumerate(zip(vals[l, h].tolist(), ids[l, h].tolist())):
                        if g < 0:
                            break
                        n = float(obs_c[l, h, t])
                        rate_t = n / float(occ_sel[t]) if occ_sel is not None else None
                        vo, ve, vn = float(v_obs[l, h, k]), float(v_exp[l, h, k]), int(v_prompts[l, h, k])
                        v_lift = vo / ve if ve > 0 else None
                        p = float(v_p[l, h, k]) if ve > 0 else None
                        ok_v = (v_lift is not None and v_lift >= min_lift and vo >= min_count and vn >= min_prompts
                                and p is not None and p <= max_p)
                        out[l][h].append(Trigger(decode(t), t, where, int(round(n)), float(exp_c[l, h, t]),
                                                 float(lift_c[l, h, t]), g, rate_t, int(prompts_c[l, h, t]),
                                                 int(round(vo)), ve, v_lift, vn, p, bool(ok_v), "query_poisson", p))
        for l in range(L):
            for h in range(H):
                out[l][h].sort(key=lambda tr: -tr.log_lr)
                best[l, h] = max((tr.lift for tr in out[l][h]), default=0.0)
        return out, best


N_PERMUTATIONS = 20000  # floor 1 / 20001 = 5e-5: below the Bonferroni level of a model of up to 1,000 heads


@dataclass(frozen=True)
class TriggerRule:
    """When a trigger is validated on the validation prompts: lift >= `min_lift`
    on >= `min_count` active queries in >= `min_prompts` prompts, p <= `max_p`
    (the Bonferroni level: `Thresholds.trigger_rule` builds it from `alpha`
    and the heads tested)."""

    min_lift: float
    min_count: int
    min_prompts: int
    max_p: float

    def holds(self, t: Trigger, p: float | None) -> bool:
        return (t.validated_lift is not None and t.validated_lift >= self.min_lift
                and t.count_validated >= self.min_count and t.prompts_validated >= self.min_prompts
                and p is not None and p <= self.max_p)


def judge_by_prompt(
    triggers: list[list[list[Trigger]]],
    tokens: Int[Tensor, "prompt pos"],
    valid: Bool[Tensor, "prompt pos"],
    active: Bool[Tensor, "prompt layer head_index pos"],
    key: Int[Tensor, "prompt layer head_index pos"],
    *,
    rule: TriggerRule,
    prompt_ids: Int[Tensor, " prompt"] | None = None,
    n_permutations: int = N_PERMUTATIONS,
    seed: int = 0,
) -> list[list[list[Trigger]]]:
    """Every trigger judged again with the prompt as the unit (the module
    docstring): `trigger_test` "prompt_t", `trigger_p` the one-sided t test's
    p-value over the validation prompts, `validated` re-decided on it by
    `rule` (the count, prompt and lift rules unchanged, `max_p` the
    Bonferroni level).
    Each head's chosen trigger (`chosen_trigger`, the one its label reads)
    also gets the permutation test over prompts (`trigger_p_perm`, reported
    beside the t test, not read by the label) and its coverage of the head's
    active queries.

    Args:
        triggers: [layer][head] lists from `TriggerCounter.finalize`.
        tokens, valid: the scanned prompts and their real queries (query 0
            and padding excluded), rows in corpus order.
        active, key: per query, whether the head was active (first-token
            attention <= low) and its most attended key other than the first.
        prompt_ids: each row's index in the corpus (its parity picks the half).
        n_permutations, seed: the permutation test's random pairings.
    """
    ids = torch.arange(len(tokens)) if prompt_ids is None else prompt_ids.cpu()
    rows = (ids % 2 == VALIDATE).nonzero()[:, 0]
    tok, ok = tokens.cpu()[rows].long(), valid.cpu()[rows]
    act = active.cpu()[rows] & ok[:, None, None, :]  # [prompt, layer, head, pos]
    kidx = key.cpu()[rows].long()
    L, H = act.shape[1:3]
    okf = ok.double()
    rate = act.double().sum(0) / okf.sum(0).clamp(min=1)  # [layer, head, pos]: the position profile
    n_active = act.double().sum(-1)  # [prompt, layer, head]
    scale = n_active / torch.einsum("ip,lhp->ilh", okf, rate).clamp(min=1e-12)
    at_place = {"query": tok, "previous": torch.roll(tok, 1, dims=1)}
    out = [[list(row) for row in layer] for layer in triggers]
    chosen = {(l, h): triggers[l][h].index(c) for l in range(L) for h in range(H)
              if (c := chosen_trigger(triggers[l][h], rule.min_lift)) is not None}
    perms = pairings(n_permutations, len(rows), seed) if len(rows) else None
    for where in WHERES:
        cells = [(l, h, i) for l in range(L) for h in range(H) for i, t in enumerate(triggers[l][h]) if t.where == where]
        if not cells:
            continue
        ls = torch.tensor([c[0] for c in cells])
        hs = torch.tensor([c[1] for c in cells])
        cand = torch.tensor([triggers[l][h][i].token_id for l, h, i in cells])  # [cell]
        a = act[:, ls, hs].double()  # [prompt, cell, pos]
        if where == "key":
            k = kidx[:, ls, hs]
            key_tok = torch.gather(tok[:, None, :].expand(-1, len(cells), -1), 2, k)
            obs = ((key_tok == cand[None, :, None]).double() * a).sum(-1)
            freq = ((tok[:, None, :] == cand[None, :, None]) & ok[:, None, :]).double().sum(0)  # [cell, pos]
            freq = freq / okf.sum(0).clamp(min=1)
            expected = (a * torch.gather(freq[None].expand(len(tok), -1, -1), 2, k)).sum(-1)
            occurs = ((tok[:, None, :] == cand[None, :, None]) & ok[:, None, :]).any(-1)
        else:
            x = ((at_place[where][:, None, :] == cand[None, :, None]) & ok[:, None, :]).double()  # [prompt, cell, pos]
            obs = (x * a).sum(-1)
            expected = scale[:, ls, hs] * (x * rate[ls, hs][None]).sum(-1)
            occurs = x.sum(-1) > 0
        excess = obs - expected  # [prompt, cell]
        for j, (l, h, i) in enumerate(cells):
            p_t = one_sided_t_p(excess[occurs[:, j], j])
            t = out[l][h][i]
            extra: dict = {"trigger_test": "prompt_t", "trigger_p": p_t}
            if chosen.get((l, h)) == i and perms is not None:
                pairs = _pairing_excess(where, j, a, obs, expected, tok, ok, okf, cand,
                                        kidx[:, l, h] if where == "key" else None, scale[:, l, h], rate[l, h],
                                        at_place.get(where))
                n_act = float(a[:, j].sum())
                extra |= {"trigger_p_perm": permutation_p(pairs, perms),
                          "n_active_validated": int(n_act),
                          "coverage": float(obs[:, j].sum()) / n_act if n_act else None,
                          "coverage_beyond_chance": float(excess[:, j].sum()) / n_act if n_act else None}
            out[l][h][i] = replace(t, validated=rule.holds(t, extra["trigger_p"]), **extra)
    return out


def _pairing_excess(where, j, a, obs, expected, tok, ok, okf, cand, kidx, scale, rate, at_place
                    ) -> Float[Tensor, "prompt prompt"]:
    """E[i, k]: the excess of prompt i's active queries (cell `j`) over its
    own expectation when paired with prompt k's tokens; the diagonal is the
    observed per-prompt excess."""
    act = a[:, j]  # [prompt, pos]
    if where == "key":
        # prompt i's attended keys, read in prompt k's tokens at those positions
        hit = (tok[None, :, :].expand(len(tok), -1, -1).gather(2, kidx[:, None, :].expand(-1, len(tok), -1))
               == cand[j]) & ok[None, :, :].expand(len(tok), -1, -1).gather(2, kidx[:, None, :].expand(-1, len(tok), -1))
        paired_obs = (hit.double() * act[:, None, :]).sum(-1)  # [i, k]
        return paired_obs - expected[:, j][:, None]
    x = ((at_place == cand[j]) & ok).double()  # [prompt k, pos]
    paired_obs = act @ x.T  # [i, k]
    paired_exp = scale[:, None] * ((x * rate[None, :]) @ okf.T).T  # positions real in prompt i
    return paired_obs - paired_exp


@functools.lru_cache(maxsize=4)
def pairings(n_permutations: int, n: int, seed: int) -> Int[Tensor, "permutation prompt"]:
    """`n_permutations` random orders of `n` prompts drawn from `seed`: the
    same for the same arguments, so they are drawn (20,000 sorts) once per
    process, not once per scan (read only: `permutation_p` indexes them)."""
    g = torch.Generator().manual_seed(seed)
    return torch.argsort(torch.rand(n_permutations, n, generator=g), dim=1)


def permutation_p(pairs: Float[Tensor, "prompt prompt"], perms: Int[Tensor, "permutation prompt"]) -> float:
    """One-sided permutation p of the summed excess sum_i E[i, i] against
    random pairings sum_i E[i, perm(i)]: (hits + 1) / (B + 1), whose floor
    1 / (B + 1) bounds it when no pairing reaches the observed sum."""
    n = pairs.shape[0]
    observed = float(pairs.diagonal().sum())
    null = pairs[torch.arange(n)[None, :], perms].sum(-1)
    hits = int((null >= observed - 1e-9).sum())
    return (hits + 1) / (len(perms) + 1)


def one_sided_t_p(x: Float[Tensor, " prompt"]) -> float | None:
    """P(T >= t) of the one-sided t test that mean(x) > 0 (None below 2 values).
    Excesses equal to float rounding (a head that follows its prompts exactly)
    read as 0, not as a t of rounding over rounding."""
    n = len(x)
    if n < 2:
        return None
    x = x.double()
    x = torch.where(x.abs() < 1e-9, 0.0, x)
    mean, sd = float(x.mean()), float(x.std(unbiased=True))
    if sd < 1e-9:
        return 0.0 if mean > 1e-9 else 1.0
    return t_sf(mean / (sd / math.sqrt(n)), n - 1)


def chosen_trigger(triggers, min_lift: float) -> Trigger | None:
    """The one trigger a head's label is judged on, chosen on the selection
    prompts alone: the best-ranked with selection lift >= `min_lift`, else the
    best-ranked; None without a candidate. Only this one is validated, so
    the validation prompts test one hypothesis per head."""
    ts = list(triggers)
    lifted = [t for t in ts if t.lift >= min_lift]
    return (lifted or ts or [None])[0]


def poisson_upper_tail(observed: Tensor, expected: Tensor) -> Tensor:
    """P(X >= observed) for X ~ Poisson(expected): the regularised lower
    incomplete gamma P(observed, expected) (1 at observed 0)."""
    o, e = observed.double(), expected.double().clamp(min=1e-300)
    return torch.where(o > 0, torch.special.gammainc(o.clamp(min=1e-12), e), torch.ones_like(o))


def _half(prompt_ids: Tensor | None, n: int, device) -> Tensor:
    """0 (selection) for even-numbered prompts, 1 (validation) for odd ones."""
    ids = torch.arange(n, device=device) if prompt_ids is None else prompt_ids.to(device)
    return (ids % 2).long()
