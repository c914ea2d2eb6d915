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
thousands of candidates. So a trigger also needs active queries in at least
`min_prompts` distinct prompts, and each trigger carries its lift measured
separately on the even- and odd-numbered prompts (each half's own token
occurrences; the head's position profile); it *replicates* when both halves
reach `min_lift`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

Where = Literal["query", "previous", "key"]
WHERES: tuple[Where, ...] = ("query", "previous", "key")


@dataclass(frozen=True)
class Trigger:
    """One over-represented token on a head's active queries."""

    token: str
    token_id: int
    where: Where
    count: int  # active queries with this token there
    expected: float  # position-adjusted count if tokens did not matter
    lift: float  # count / expected
    log_lr: float  # Poisson log-likelihood ratio 2[n ln(n/e) - (n - e)]: the ranking key
    active_rate: float | None  # P(active | token there); None for "key"
    n_prompts: int = 0  # distinct prompts with an active query with this token there
    lift_even: float | None = None  # lift on the even-numbered prompts alone (None: no expected count there)
    lift_odd: float | None = None
    replicated: bool = False  # both halves reach min_lift

    def to_dict(self) -> dict:
        return asdict(self)


class TriggerCounter:
    """Streaming trigger accumulators, dense over the vocabulary.

    Memory: 9 x layer x head x vocab floats on the model's device (counts of
    active queries per half of the prompts, and distinct prompts, per place).
    Prompts are split by the parity of `prompt_ids`.
    """

    def __init__(self, n_layers: int, n_heads: int, d_vocab: int, n_pos: int, device) -> None:
        shape = (2, n_layers, n_heads, d_vocab)  # [half: even / odd prompts, ...]
        self.observed_half = {w: torch.zeros(shape, device=device) for w in WHERES}
        self.prompts = {w: torch.zeros(shape[1:], device=device) for w in WHERES}
        self.key_positions_half = torch.zeros(2, n_layers, n_heads, n_pos, device=device)  # active queries per attended key
        # occurrences of token t at query position p, for the query and previous token
        self.occurrences_half = {w: torch.zeros(2, d_vocab, n_pos, device=device) for w in ("query", "previous")}
        self.n_pos = n_pos

    @property
    def observed(self) -> dict[str, Tensor]:
        return {w: v.sum(0) for w, v in self.observed_half.items()}

    @property
    def occurrences(self) -> dict[str, Tensor]:
        return {w: v.sum(0) for w, v in self.occurrences_half.items()}

    @property
    def key_positions(self) -> Tensor:
        return self.key_positions_half.sum(0)

    def add_tokens(self, tokens: Int[Tensor, "batch pos"], valid: Bool[Tensor, "batch pos"],
                   prompt_ids: Int[Tensor, " batch"] | None = None) -> None:
        """Count every valid query once (head-independent); `valid` excludes
        query 0 and padding. `prompt_ids`: each row's index in the corpus
        (default 0, 1, ...), which decides its half."""
        B, P = tokens.shape
        half = _half(prompt_ids, B, tokens.device)
        pos = torch.arange(P, device=tokens.device).expand(B, P)
        prev = torch.roll(tokens, 1, dims=1)
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
        half = _half(prompt_ids, B, tokens.device)[:, None, None].expand(B, H, P)
        row = torch.arange(B, device=tokens.device)[:, None, None].expand(B, H, P)
        tok_q = tokens[:, None, :].expand(B, H, P)
        tok_prev = torch.roll(tokens, 1, dims=1)[:, None, :].expand(B, H, P)
        tok_key = torch.gather(tokens[:, None, :].expand(B, H, P), 2, key_index)
        head = torch.arange(H, device=tokens.device)[None, :, None].expand(B, H, P)
        L, V = self.prompts["query"].shape[0], self.prompts["query"].shape[-1]
        for where, tok in (("query", tok_q), ("previous", tok_prev), ("key", tok_key)):
            cell = (head * V + tok)
            self.observed_half[where].view(-1).index_add_(0, (half * (L * H * V) + layer * H * V + cell).flatten(), act.flatten())
            # distinct prompts: one count per (row, head, token) with any active query
            seen = torch.unique((row * (H * V) + cell)[active])
            self.prompts[where][layer].view(-1).index_add_(0, seen % (H * V), torch.ones_like(seen, dtype=act.dtype))
        n = self.n_pos
        self.key_positions_half.view(-1).index_add_(0, (half * (L * H * n) + layer * H * n + head * n + key_index).flatten(),
                                                    act.flatten())

    def finalize(
        self,
        active_by_pos: Float[Tensor, "layer head_index pos"],
        *,
        decode,
        min_count: int,
        top_k: int,
        min_prompts: int = 1,
        min_lift: float = 1.0,
    ) -> tuple[list[list[list[Trigger]]], Float[Tensor, "layer head_index"]]:
        """Top triggers per head: top_k per place with count >= min_count in
        >= min_prompts distinct prompts and lift > 1, ranked by `log_lr`; and
        the best lift among them per head. Each carries its lift on the even
        and odd prompts; `replicated` when both reach `min_lift`.

        Args:
            active_by_pos: each head's active rate at each query position.
            decode: token id -> readable string.
        """
        L, H, _ = active_by_pos.shape
        rate = torch.nan_to_num(active_by_pos).to(self.key_positions_half.device)
        occurrences = self.occurrences
        at_pos = occurrences["query"]  # token frequency at each position (positions >= 1)
        freq = at_pos / at_pos.sum(0, keepdim=True).clamp(min=1)

        def expect(where: str, half: int | None) -> Tensor:
            if where == "key":
                keys = self.key_positions if half is None else self.key_positions_half[half]
                return torch.einsum("lhp,vp->lhv", keys, freq)
            occ_w = occurrences[where] if half is None else self.occurrences_half[where][half]
            return torch.einsum("lhp,vp->lhv", rate, occ_w)

        occ = {w: occurrences[w].sum(-1).cpu() for w in ("query", "previous")}
        best = torch.zeros(L, H)
        out: list[list[list[Trigger]]] = [[[] for _ in range(H)] for _ in range(L)]
        for where in WHERES:
            obs, exp = self.observed_half[where].sum(0), expect(where, None)
            ok = (obs >= min_count) & (self.prompts[where] >= min_prompts) & (exp > 0)
            lift = torch.where(ok, obs / exp.clamp(min=1e-12), 0.0)
            # rank by evidence, not lift alone: rare tokens reach huge lifts on a handful of counts
            llr = 2 * (obs * torch.log(lift.clamp(min=1e-12)) - (obs - exp))
            llr = torch.where(ok & (lift > 1), llr, -1.0)
            vals, ids = llr.topk(min(top_k, llr.shape[-1]), dim=-1)
            # each half's lift at the kept candidates only
            half_lift = []
            for half in (0, 1):
                o = torch.gather(self.observed_half[where][half], -1, ids)
                e = torch.gather(expect(where, half), -1, ids)
                half_lift.append(torch.where(e > 0, o / e.clamp(min=1e-12), torch.tensor(float("nan"), device=e.device)).cpu())
            vals, ids = vals.cpu(), ids.cpu()
            obs_c, exp_c, lift_c, prompts_c = obs.cpu(), exp.cpu(), lift.cpu(), self.prompts[where].cpu()
            for l in range(L):
                for h in range(H):
                    for k, (g, t) in enumerate(zip(vals[l, h].tolist(), ids[l, h].tolist())):
                        if g < 0:
                            break
                        n = float(obs_c[l, h, t])
                        rate_t = n / float(occ[where][t]) if where != "key" else None
                        even, odd = (_num(x[l, h, k]) for x in half_lift)
                        replicated = even is not None and odd is not None and min(even, odd) >= min_lift
                        out[l][h].append(Trigger(decode(t), t, where, int(round(n)), float(exp_c[l, h, t]),
                                                 float(lift_c[l, h, t]), g, rate_t, int(prompts_c[l, h, t]),
                                                 even, odd, replicated))
        for l in range(L):
            for h in range(H):
                out[l][h].sort(key=lambda tr: -tr.log_lr)
                best[l, h] = max((tr.lift for tr in out[l][h]), default=0.0)
        return out, best


def _half(prompt_ids: Tensor | None, n: int, device) -> Tensor:
    """0 for even-numbered prompts, 1 for odd ones."""
    ids = torch.arange(n, device=device) if prompt_ids is None else prompt_ids.to(device)
    return (ids % 2).long()


def _num(x: Tensor) -> float | None:
    v = float(x)
    return None if v != v else v
