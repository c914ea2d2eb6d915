"""Context windows: loss and sinks past the training length (`length`) and
StreamingLLM windows with their sink tokens (`stream`); the length sweep's shard
parts (`parts`).

`first_scored` (the window leaves a token to score) and `check_fits` (the
text fits the model's context) are the checks the library and `sinkmech
stream` share; they import nothing, so the command line runs them before a
model loads.
"""

from __future__ import annotations

from collections.abc import Sequence


def first_scored(window: int, keep: Sequence[int], n_positions: int, offset: int = 0,
                 scored_from: int | None = None) -> int:
    """The first scored position of a sliding-window run: `scored_from`, or by
    default `window` + the most first keys kept (the first query whose window
    is full); refused when it leaves no next-token target among `n_positions`
    (or sits before the content, at `offset`)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    keep = tuple(int(k) for k in keep)
    if not keep or any(k < 0 for k in keep):
        raise ValueError(f"keep needs one or more counts >= 0, got {keep}")
    start = window + max(keep) if scored_from is None else scored_from
    if not max(offset, 0) <= start < n_positions - 1:
        why = "window + the most first keys kept" if scored_from is None else "scored_from"
        raise ValueError(f"no token left to score: positions {start} on are scored ({why}) but the sequence has "
                         f"{n_positions} positions; use a longer text or a smaller window")
    return start


def check_fits(n_content: int, n_ctx: int, bos: bool = True) -> None:
    """Refuse `n_content` tokens (and `<bos>` before them) that do not fit a
    context of `n_ctx` positions."""
    if n_content + int(bos) > n_ctx:
        raise ValueError(f"{n_content} content tokens do not fit the model's context of {n_ctx} positions "
                         f"(at most {n_ctx - int(bos)}{' beside <bos>' if bos else ''})")
