"""Workflows that chain analyses, written once: the CLI, the report and
`compare` call the same recipe, so the copies cannot drift apart.

- scan, then the no-op check on held-out prompts: `sinkmech.dormant.discover.discover_heads`
  (it lives with the dormant-head code it chains);
- `swap_then_spread`: one token swapped at an early content position for a
  token of another prompt (`sinkmech.interventions.perturb.corpus_swaps`), and the spread of
  the change through the layers with and without `<bos>`
  (`sinkmech.interventions.perturb.perturbation_spread`; Barbero et al. 2025, Fig. 2). The
  report and `compare` each had their own copy and their own `SPREAD_POSITION`.

A recipe is a thin orchestration: what a step measures is defined in its own
module; the recipe only chooses the inputs of the next step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sinkmech.loading.backend import Model
from sinkmech.interventions.perturb import PerturbationSpread, TokenSwap, corpus_swaps, perturbation_spread
from sinkmech.prompts import tokenize
from sinkmech.options import RunOptions

SPREAD_POSITION = 4  # content position of the swapped token (earlier when the prompts are shorter)
SPREAD_THRESHOLD = 0.1  # relative change counted as "reached"


@dataclass(frozen=True)
class SwapSpread:
    """The swap that was made (content rows, position, swaps) and its spread."""

    rows: tuple[tuple[int, ...], ...]  # content token ids of each prompt, without <bos>
    position: int
    swaps: tuple[TokenSwap, ...]
    spread: PerturbationSpread


def swap_then_spread(
    model: Model,
    prompts: Sequence,
    *,
    max_tokens: int,
    position: int = SPREAD_POSITION,
    threshold: float = SPREAD_THRESHOLD,
    options: RunOptions = RunOptions(),
) -> SwapSpread:
    """Swap the token at content `position` of each prompt for the token at that
    position of the next prompt that differs, and measure how far the change
    spreads, with and without `<bos>`, on the same content tokens.

    Args:
        prompts: the prompts, cut to `max_tokens` content tokens each.
        position: the content position swapped; moved earlier (to the shortest
            prompt's length - 2) when the prompts are too short to leave a
            later position for the change to reach. `SwapSpread.position` is
            the one used.
        threshold: relative change counted as reached (`spread_fraction`).
        options: batch size, progress bar, the `<bos>` id (`perturbation_spread`).

    Returns:
        SwapSpread.
    """
    if position < 0:
        raise ValueError(f"the swap position must be >= 0, got {position}")
    plain = tokenize(model, prompts, bos="none", max_tokens=max_tokens, bos_token_id=options.bos_token_id)
    rows = [r[:n].tolist() for r, n in zip(plain.tokens.cpu(), plain.lengths.cpu())]
    shortest = min(map(len, rows))
    if shortest < 2:
        raise ValueError("perturbation spread needs prompts of at least 2 tokens")
    position = min(position, shortest - 2)  # leave later positions to reach
    swaps = corpus_swaps(rows, position)
    spread = perturbation_spread(model, rows, perturbation=swaps, max_tokens=max_tokens, threshold=threshold,
                                 options=options)
    return SwapSpread(tuple(tuple(r) for r in rows), position, tuple(swaps), spread)
