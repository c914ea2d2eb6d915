"""How a sink forms over training, read from a run's log (Guo et al. 2024,
"Active-dormant attention heads": the mutual reinforcement of first-token
attention, a shrinking `<bos>` value and a growing `<bos>` residual norm, while
the post-trigger copy is learned).

Everything here is computed from `log["evals"]` as written by
`sinkmech.train.run.train`: no model is run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Emergence:
    """Per-evaluation series of one head (the strongest first-token head at the
    last evaluation, with `<bos>` at inference), and the first step at which
    its first-token score exceeds each threshold, and the step from which it
    stays above (None: never)."""

    run: str
    layer: int
    head: int
    steps: list[int]
    first_token_score: list[float]  # with <bos>: alpha_0 of this head
    first_token_score_no_bos: list[float]  # the same head, <bos> removed
    uniform_score: float
    bos_value_norm: list[float]  # this head's value norm at <bos>
    other_value_norm: list[float]  # ... mean over the other tokens
    bos_resid_norm: list[float]  # resid_post of this head's layer at <bos>
    other_resid_norm: list[float]
    loss_post_trigger: list[float] | None  # validation loss with <bos>, copies only
    loss_rest: list[float] | None
    cross_step: dict[str, int | None]  # eps -> first evaluated step with score > eps
    stable_step: dict[str, int | None]  # eps -> first step from which every evaluation has score > eps

    def to_dict(self) -> dict:
        return asdict(self)


def first_crossing(steps: list[int], values: list[float], eps: float) -> int | None:
    """The first step whose value is strictly above `eps`, or None."""
    return next((s for s, v in zip(steps, values) if v > eps), None)


def stable_crossing(steps: list[int], values: list[float], eps: float) -> int | None:
    """The first step from which every value is strictly above `eps`, or None."""
    stable = None
    for s, v in zip(steps, values):
        if v > eps:
            stable = s if stable is None else stable
        else:
            stable = None
    return stable


def emergence(log: dict, *, run: str = "", eps: tuple[float, ...] = (0.3, 0.8)) -> Emergence:
    """The emergence series of a run's strongest sink head.

    Args:
        log: a training log (`{"evals": [...]}`) with at least one evaluation.
        run: a name to carry along (the log's run name).
    """
    evals = log["evals"]
    if not evals:
        raise ValueError("the log has no evaluations")
    scores = evals[-1]["conditions"]["prepend"]["head_scores"]
    layer, head = max(((l, h) for l in range(len(scores)) for h in range(len(scores[l]))),
                      key=lambda lh: scores[lh[0]][lh[1]])
    pre = [e["conditions"]["prepend"] for e in evals]
    steps = [e["step"] for e in evals]
    first = [c["head_scores"][layer][head] for c in pre]
    split = [e.get("split_loss") for e in evals]
    has_split = all(s is not None for s in split)
    return Emergence(
        run=run,
        layer=layer,
        head=head,
        steps=steps,
        first_token_score=first,
        first_token_score_no_bos=[e["conditions"]["none"]["head_scores"][layer][head] for e in evals],
        uniform_score=pre[-1]["uniform_score"],
        bos_value_norm=[c["value_norm_first"][layer][head] for c in pre],
        other_value_norm=[c["value_norm_rest"][layer][head] for c in pre],
        bos_resid_norm=[c["resid_norm_first"][layer] for c in pre],
        other_resid_norm=[c["resid_norm_rest"][layer] for c in pre],
        loss_post_trigger=[s["prepend"]["post_trigger"] for s in split] if has_split else None,
        loss_rest=[s["prepend"]["rest"] for s in split] if has_split else None,
        cross_step={repr(float(e)): first_crossing(steps, first, e) for e in eps},
        stable_step={repr(float(e)): stable_crossing(steps, first, e) for e in eps},
    )
