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

    def to_dict(self) -> dict:
        return asdict(self)


class TriggerCounter:
    """Streaming trigger accumulators, dense over the vocabulary.

    Memory: 3 x layer x head x vocab floats on the model's device.
    """

    def __init__(self, n_layers: int, n_heads: int, d_vocab: int, n_pos: int, device) -> None:
        shape = (n_layers, n_heads, d_vocab)
        self.observed = {w: torch.zeros(shape, device=device) for w in WHERES}
        self.key_positions = torch.zeros(n_layers, n_heads, n_pos, device=device)  # active queries per attended key
        # occurrences of token t at query position p, for the query and previous token
        self.occurrences = {w: torch.zeros(d_vocab, n_pos, device=device) for w in ("query", "previous")}
        self.n_pos = n_pos

    def add_tokens(self, tokens: Int[Tensor, "batch pos"], valid: Bool[Tensor, "batch pos"]) -> None:
        """Count every valid query once (head-independent); `valid` excludes
        query 0 and padding."""
        B, P = tokens.shape
        pos = torch.arange(P, device=tokens.device).expand(B, P)
        prev = torch.roll(tokens, 1, dims=1)
        for where, tok in (("query", tokens), ("previous", prev)):
            flat = (tok * self.n_pos + pos)[valid]
            counts = torch.bincount(flat, minlength=self.occurrences[where].numel())
            self.occurrences[where] += counts.view_as(self.occurrences[where]).float()

    def add_layer(
        self,
        layer: int,
        tokens: Int[Tensor, "batch pos"],
        active: Bool[Tensor, "batch head_index query_pos"],
        key_index: Int[Tensor, "batch head_index query_pos"],
    ) -> None:
        """Add one layer's active queries; `key_index` is the most attended
        key (>= 1) of each query."""
        B, H, P = active.shape
        act = active.float()
        tok_q = tokens[:, None, :].expand(B, H, P)
        tok_prev = torch.roll(tokens, 1, dims=1)[:, None, :].expand(B, H, P)
        tok_key = torch.gather(tokens[:, None, :].expand(B, H, P), 2, key_index)
        head = torch.arange(H, device=tokens.device)[None, :, None].expand(B, H, P)
        V = self.observed["query"].shape[-1]
        for where, tok in (("query", tok_q), ("previous", tok_prev), ("key", tok_key)):
            self.observed[where][layer].view(-1).index_add_(0, (head * V + tok).flatten(), act.flatten())
        n = self.n_pos
        self.key_positions[layer].view(-1).index_add_(0, (head * n + key_index).flatten(), act.flatten())

    def finalize(
        self,
        active_by_pos: Float[Tensor, "layer head_index pos"],
        *,
        decode,
        min_count: int,
        top_k: int,
    ) -> tuple[list[list[list[Trigger]]], Float[Tensor, "layer head_index"]]:
        """Top triggers per head: top_k per place with count >= min_count and
        lift > 1, ranked by `log_lr`; and the best lift among them per head.

        Args:
            active_by_pos: each head's active rate at each query position.
            decode: token id -> readable string.
        """
        L, H, _ = active_by_pos.shape
        rate = torch.nan_to_num(active_by_pos).to(self.key_positions.device)
        expected = {
            w: torch.einsum("lhp,vp->lhv", rate, self.occurrences[w]) for w in ("query", "previous")
        }
        at_pos = self.occurrences["query"]  # token frequency at each position (positions >= 1)
        freq = at_pos / at_pos.sum(0, keepdim=True).clamp(min=1)
        expected["key"] = torch.einsum("lhp,vp->lhv", self.key_positions, freq)
        occ = {w: self.occurrences[w].sum(-1).cpu() for w in ("query", "previous")}
        best = torch.zeros(L, H)
        out: list[list[list[Trigger]]] = [[[] for _ in range(H)] for _ in range(L)]
        for where in WHERES:
            obs, exp = self.observed[where], expected[where]
            ok = (obs >= min_count) & (exp > 0)
            lift = torch.where(ok, obs / exp.clamp(min=1e-12), 0.0)
            # rank by evidence, not lift alone: rare tokens reach huge lifts on a handful of counts
            llr = 2 * (obs * torch.log(lift.clamp(min=1e-12)) - (obs - exp))
            llr = torch.where(ok & (lift > 1), llr, -1.0)
            vals, ids = llr.topk(min(top_k, llr.shape[-1]), dim=-1)
            vals, ids = vals.cpu(), ids.cpu()
            obs_c, exp_c, lift_c = obs.cpu(), exp.cpu(), lift.cpu()
            for l in range(L):
                for h in range(H):
                    for g, t in zip(vals[l, h].tolist(), ids[l, h].tolist()):
                        if g < 0:
                            break
                        n = float(obs_c[l, h, t])
                        rate_t = n / float(occ[where][t]) if where != "key" else None
                        out[l][h].append(Trigger(decode(t), t, where, int(round(n)), float(exp_c[l, h, t]),
                                                 float(lift_c[l, h, t]), g, rate_t))
        for l in range(L):
            for h in range(H):
                out[l][h].sort(key=lambda tr: -tr.log_lr)
                best[l, h] = max((tr.lift for tr in out[l][h]), default=0.0)
        return out, best
