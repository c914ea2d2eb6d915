"""Perturbation spread with and without `<bos>` (Barbero et al. 2025, Figure 2).

A prompt and a minimally changed copy (one token swapped for another of the
same tokenized length, or noise of a given relative norm added to one input
embedding) run with and without `<bos>`. At every layer and content position
the relative change of the residual stream ||h' - h|| / ||h|| shows how far
the change spreads; without the sink it should reach more positions and grow
with depth. Also the mean attention entropy per head in both conditions (the
paper's "smoother maps" without `<bos>`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from sinkmech.loading.backend import Model
from sinkmech.hooks import act_name, residual_stack
from sinkmech.interventions.patching import BosPair
from sinkmech.prompts import CONDITIONS, PromptSource, TokenBatch, tokenize
from sinkmech.results import Result
from sinkmech.options import RunOptions


@dataclass(frozen=True)
class TokenSwap:
    """Replace `original` by `replacement` (strings as they appear in the prompt,
    e.g. " greatest" -> " best", or token-id lists); both must tokenize to the
    same length. `position` (content position) pins where; default: first match."""

    original: Union[str, Sequence[int]]
    replacement: Union[str, Sequence[int]]
    position: int | None = None


@dataclass(frozen=True)
class EmbeddingNoise:
    """Add Gaussian noise of norm `scale` x ||embedding|| to content position `position`."""

    scale: float
    position: int
    seed: int = 0


Perturbation = Union[TokenSwap, EmbeddingNoise, Sequence[TokenSwap]]


@dataclass(frozen=True)
class PerturbationSpread(Result):
    """Relative residual change per condition, prompt, layer and content position.

    `change[c, p, l, j]` = ||h' - h|| / ||h|| for condition `conditions[c]`,
    layer l (0 = embeddings entering layer 0, ..., n_layers = output of the last
    layer) and content position j; NaN on padding. `last_changed[p]` is the last
    content position the perturbation touches directly; later positions are the
    ones it can only reach by mixing. `entropy[c, l, h]` is the mean attention
    entropy (nats) over real content queries of the clean run (raw: the `<bos>`
    run's rows have one more key); `normalized_entropy[c, l, h]` the mean of
    H / log(n_keys) over content queries with >= 2 keys, the comparison to
    make between conditions (1 = uniform).
    """

    change: Float[Tensor, "bos prompt resid_layer pos"]
    entropy: Float[Tensor, "bos layer head_index"]
    normalized_entropy: Float[Tensor, "bos layer head_index"]
    last_changed: Int[Tensor, " prompt"]
    conditions: tuple[str, ...]
    kind: str
    threshold: float
    sums: dict[str, Tensor] | None = None  # the float64 entropy sums (ENTROPY_SUMS), for merging shards

    def mean_change(self) -> Float[Tensor, "bos resid_layer pos"]:
        """Mean over prompts (padding excluded)."""
        return self.change.nanmean(1)

    def later(self) -> Tensor:
        """Bool [prompt, pos]: real positions after the perturbed one."""
        j = torch.arange(self.change.shape[-1])
        return (j[None, :] > self.last_changed[:, None]) & ~self.change[0, :, 0].isnan()

    def per_layer(self) -> dict[str, Tensor]:
        """Over the later positions of all prompts: mean change, and the fraction
        whose change exceeds `threshold`."""
        later = self.later()[None, :, None, :].expand_as(self.change)
        w = later.float()
        vals = torch.where(later, self.change, torch.zeros(()))
        n = w.sum((1, 3)).clamp(min=1)
        return {
            "mean_change": vals.sum((1, 3)) / n,
            "spread_fraction": ((vals > self.threshold).float() * w).sum((1, 3)) / n,
        }

    def per_prompt(self) -> dict[str, Tensor]:
        """Per prompt, over its own later positions: mean change and reach (the
        fraction whose change exceeds `threshold`), [bos, prompt, resid_layer];
        NaN for a prompt without a later position."""
        later = self.later()[None, :, None, :].expand_as(self.change)
        w = later.float()
        vals = torch.where(later, self.change, torch.zeros(()))
        n = w.sum(-1)
        nan = torch.tensor(float("nan"))
        return {"mean_change": torch.where(n > 0, vals.sum(-1) / n.clamp(min=1), nan),
                "reach": torch.where(n > 0, ((vals > self.threshold).float() * w).sum(-1) / n.clamp(min=1), nan)}

    def to_dataframe(self):
        import pandas as pd

        C, P, L, J = self.change.shape
        g = torch.meshgrid(torch.arange(C), torch.arange(P), torch.arange(L), torch.arange(J), indexing="ij")
        df = pd.DataFrame({"bos": [self.conditions[i] for i in g[0].flatten().tolist()], "prompt": g[1].flatten().numpy(),
                           "layer": g[2].flatten().numpy(), "pos": g[3].flatten().numpy(), "change": self.change.flatten().numpy()})
        return df.dropna()

    def to_dict(self) -> dict:
        s = self.per_layer()
        return {
            "kind": self.kind, "threshold": self.threshold, "conditions": list(self.conditions),
            "n_prompts": self.change.shape[1], "n_layers": self.change.shape[2] - 1,
            "last_changed": self.last_changed.tolist(),
            "mean_change": {c: torch.nan_to_num(self.mean_change()[i]).tolist() for i, c in enumerate(self.conditions)},
            "per_layer": {c: {k: v[i].tolist() for k, v in s.items()} for i, c in enumerate(self.conditions)},
            "entropy": {c: self.entropy[i].tolist() for i, c in enumerate(self.conditions)},
            "normalized_entropy": {c: self.normalized_entropy[i].tolist() for i, c in enumerate(self.conditions)},
        }


def _ids(model, x) -> list[int]:
    if isinstance(x, str):
        if model.tokenizer is None:
            raise ValueError("the model has no tokenizer: give the swap as token-id lists")
        return model.tokenizer(x, add_special_tokens=False)["input_ids"]
    return [int(t) for t in x]


def apply_swap(model, rows: list[list[int]], swap: TokenSwap) -> tuple[list[list[int]], list[int]]:
    """The swapped copies of `rows` and each one's last swapped content position."""
    old, new = _ids(model, swap.original), _ids(model, swap.replacement)
    if len(old) != len(new) or not old:
        raise ValueError(
            f"token swap {swap.original!r} -> {swap.replacement!r} must keep the length: "
            f"they tokenize to {len(old)} and {len(new)} tokens"
        )
    out, last = [], []
    for i, row in enumerate(rows):
        n = len(old)
        starts = [swap.position] if swap.position is not None else range(len(row) - n + 1)
        at = next((s for s in starts if 0 <= s <= len(row) - n and row[s : s + n] == old), None)
        if at is None:
            where = f"at content position {swap.position}" if swap.position is not None else "anywhere"
            raise ValueError(f"prompt {i} does not hold {swap.original!r} {where}")
        out.append(row[:at] + new + row[at + n :])
        last.append(at + n - 1)
    return out, last


def corpus_swaps(rows: Sequence[Sequence[int]], position: int) -> list[TokenSwap]:
    """One one-token swap per row at content `position`: the token there becomes
    the token at `position` of the next row that differs (a real token of the
    corpus), else another token of the row itself."""
    out = []
    for i, row in enumerate(rows):
        if not 0 <= position < len(row):
            raise ValueError(f"prompt {i} has {len(row)} content tokens: no position {position} to swap")
        others = list(rows[i + 1:]) + list(rows[:i])
        pool = [r[position] for r in others if len(r) > position] + list(row[position + 1:]) + list(row[:position])
        new = next((t for t in pool if t != row[position]), None)
        if new is None:
            raise ValueError("cannot find a replacement token: every prompt holds the same single token")
        out.append(TokenSwap([int(row[position])], [int(new)], position=position))
    return out


def _noise_hook(noise: Tensor, position: int):
    """Add noise[b] (relative to the embedding's norm) at `position` of row b."""

    def hook(embed: Tensor, hook) -> Tensor:
        out = embed.clone()
        scale = out[:, position].norm(dim=-1, keepdim=True)
        out[:, position] = out[:, position] + noise.to(out) * scale
        return out

    return hook


def _entropy_hook(store: list, mask: Tensor, offset: int):
    """Per head: summed raw entropy and its count over real content queries, and
    summed H / log(n_keys) and its count over those with >= 2 keys."""

    def hook(pattern: Tensor, hook) -> None:
        a = pattern[:, :, offset:].float()  # content queries; the entropy sums in float32 whatever the model's dtype
        h = -(a * torch.log(a.clamp(min=1e-30))).sum(-1)  # [batch, head, query]
        w = mask[:, None, :].float()
        # causal: the query at position t sees t + 1 keys (padding sits after it)
        n_keys = torch.arange(offset, offset + a.shape[2], device=a.device, dtype=h.dtype) + 1
        wn = w * (n_keys > 1).to(w)
        hn = h / n_keys.log().clamp(min=1e-12)
        store.append(((h * w).sum((0, 2)), w.sum((0, 2)), (hn * wn).sum((0, 2)), wn.sum((0, 2))))

    return hook


def _content_rows(model, tokens, max_tokens: int, bos_token_id: int | None) -> tuple[list[list[int]], int | None]:
    """Content token ids of every prompt (tokenized once) and the `<bos>` id to prepend."""
    if isinstance(tokens, BosPair):
        return tokens.without_bos.content(), tokens.with_bos.bos_token_id
    if isinstance(tokens, TokenBatch):
        own = tokens.bos_token_id if tokens.bos == "prepend" else None
        return tokens.content(), own if own is not None else bos_token_id
    plain = tokenize(model, tokens, bos="none", max_tokens=max_tokens, bos_token_id=bos_token_id)
    return plain.content(), bos_token_id


def perturbation_spread(
    model: Model,
    tokens: PromptSource | TokenBatch | BosPair,
    *,
    perturbation: Perturbation,
    max_tokens: int = 64,
    threshold: float = 0.1,
    first_prompt: int = 0,
    n_prompts_total: int | None = None,
    options: RunOptions = RunOptions(),
) -> PerturbationSpread:
    """Relative residual change at every (layer, content position), with and without `<bos>`.

    Args:
        tokens: prompts (strings, a prompt file, token-id lists), tokenized
            once, or a TokenBatch / BosPair whose content tokens are used
            (`max_tokens` then unused); both conditions run on them.
        perturbation: a TokenSwap (the same for every prompt), a list of
            TokenSwaps (one per prompt, e.g. from `corpus_swaps`) or an
            EmbeddingNoise (the same noise vector in both conditions).
        threshold: relative change above which a later position counts as reached.
        first_prompt, n_prompts_total: when `tokens` are prompts first_prompt ..
            of a corpus of n_prompts_total (a shard): the noise of an
            EmbeddingNoise is the one the whole corpus' run draws for them.
        options: batch size (default 16 prompts per forward pass), progress
            bar, the `<bos>` id (for prompts, or a batch without `<bos>`).

    Returns:
        PerturbationSpread with change [bos, prompt, layer, pos] and entropy
        [bos, layer, head_index].
    """
    per_prompt = isinstance(perturbation, (list, tuple))
    if per_prompt and not all(isinstance(p, TokenSwap) for p in perturbation):
        raise ValueError("a list of perturbations must hold one TokenSwap per prompt")
    if not per_prompt and not isinstance(perturbation, (TokenSwap, EmbeddingNoise)):
        raise ValueError(f"perturbation must be a TokenSwap or EmbeddingNoise, got {type(perturbation).__name__}")
    rows, bos_id = _content_rows(model, tokens, max_tokens, options.bos_token_id)
    batch_size = options.batch(16)
    noise = None
    if per_prompt:
        if len(perturbation) != len(rows):
            raise ValueError(f"{len(perturbation)} token swaps for {len(rows)} prompts: give one per prompt")
        done = [apply_swap(model, [row], swap) for row, swap in zip(rows, perturbation)]
        changed, last = [c[0][0] for c in done], [c[1][0] for c in done]
        kind = per_prompt_kind(last)
    elif isinstance(perturbation, TokenSwap):
        changed, last = apply_swap(model, rows, perturbation)
        kind = f"swap {perturbation.original!r} -> {perturbation.replacement!r}"
    else:
        if perturbation.scale < 0:
            raise ValueError(f"noise scale must be >= 0, got {perturbation.scale}")
        short = min(len(r) for r in rows)
        if not 0 <= perturbation.position < short:
            raise ValueError(f"noise position {perturbation.position} out of range: the shortest prompt has {short} content tokens")
        changed, last = rows, [perturbation.position] * len(rows)
        n_total = len(rows) if n_prompts_total is None else n_prompts_total
        if not 0 <= first_prompt <= n_total - len(rows):
            raise ValueError(f"prompts {first_prompt}.. of {n_total}: the {len(rows)} prompts do not fit")
        g = torch.Generator().manual_seed(perturbation.seed)
        noise = torch.randn(n_total, model.cfg.d_model, generator=g)[first_prompt : first_prompt + len(rows)]
        noise = perturbation.scale * noise / noise.norm(dim=-1, keepdim=True)
        kind = f"noise {perturbation.scale:g} at content position {perturbation.position}"
    P, L, J = len(rows), model.cfg.n_layers, max(len(r) for r in rows)
    change = torch.full((2, P, L + 1, J), float("nan"))
    sums = {k: torch.zeros(2, L, model.cfg.n_heads, dtype=torch.float64) for k in ENTROPY_SUMS}
    # One tokenization per condition and copy; batches are slices of it.
    both = {
        bos: (tokenize(model, rows, bos=bos, max_tokens=J, bos_token_id=bos_id),
              tokenize(model, changed, bos=bos, max_tokens=J, bos_token_id=bos_id))
        for bos in CONDITIONS
    }
    steps = [(c, s) for c in range(len(CONDITIONS)) for s in range(0, P, batch_size)]
    for c, s in tqdm(steps, desc="perturbation spread", disable=not options.progress, unit="batch"):
        e = slice(s, min(s + batch_size, P))
        clean, pert = (b.slice(e.start, e.stop) for b in both[CONDITIONS[c]])
        off = clean.offset
        mask = clean.mask[:, off:]
        store: list = []
        ent = [(act_name("pattern", l), _entropy_hook(store, mask, off)) for l in range(L)]
        h = residual_stack(model, clean.tokens, ent)[:, :, off:]
        hooks = []
        if noise is not None:
            hooks = [(act_name("embed"), _noise_hook(noise[e], perturbation.position + off))]
        h2 = residual_stack(model, pert.tokens, hooks)[:, :, off:]
        h, h2 = h.float(), h2.float()  # norms in float32 whatever the model's dtype
        rel = (h2 - h).norm(dim=-1) / h.norm(dim=-1).clamp(min=1e-12)
        rel = torch.where(mask[:, None, :], rel, torch.full_like(rel, float("nan")))
        change[c, e, :, : rel.shape[-1]] = rel.float().cpu()
        for l, values in enumerate(store):
            for k, v in zip(ENTROPY_SUMS, values):
                sums[k][c, l] += v.double().cpu()
    return spread_from_sums(change, sums, torch.tensor(last), kind=kind, threshold=threshold)


# The entropy sums of both runs, [bos, layer, head_index]: raw entropy and its
# query count, normalised entropy and its count (queries with >= 2 keys).
ENTROPY_SUMS = ("entropy_sum", "entropy_n", "normalized_sum", "normalized_n")


def spread_from_sums(change: Tensor, sums: dict[str, Tensor], last_changed: Tensor, *, kind: str,
                     threshold: float) -> PerturbationSpread:
    """A `PerturbationSpread` from its per-prompt rows and the float64 entropy
    sums (`ENTROPY_SUMS`), of one pass or of merged shards."""
    entropy = (sums["entropy_sum"] / sums["entropy_n"].clamp(min=1)).float()
    n = sums["normalized_n"]
    normalized = torch.where(n > 0, sums["normalized_sum"] / n.clamp(min=1), torch.tensor(float("nan"))).float()
    return PerturbationSpread(change, entropy, normalized, last_changed, CONDITIONS, kind, threshold, sums)


def per_prompt_kind(last_changed: Sequence[int]) -> str:
    """The `kind` of a spread with one token swap per prompt."""
    return f"one token swap per prompt at content positions {sorted(set(int(j) for j in last_changed))}"
