"""The brute-force references the batched sweeps are tested against: the same
cells (`ablation_setup(...).cells()`, `patch_setup(...).cells`) scored by
`sweep.loop`, one full `run_with_hooks` per cell, nothing shared."""

from __future__ import annotations

from sinkmech.interventions.ablation import HeadAblation, ablation_setup
from sinkmech.interventions.patching import PatchResult, patch_setup
from sinkmech.interventions.sweep import loop


def loop_ablations(model, tokens, **setup) -> HeadAblation:
    """`head_ablations`' result, one pass per head; `setup`: `ablation_setup`'s
    arguments (an `options` only gives the `<bos>` id; `prompt_batch` is refused)."""
    if "prompt_batch" in setup:
        raise TypeError("the reference runs every prompt in one group")
    s = ablation_setup(model, tokens, **setup)
    values = loop(model, s.batch.tokens, s.cells(), score=s.score, offset=s.batch.offset, n_content=s.n_content)
    return s.result(values.reshape(len(s.layers), len(s.heads)), "loop")


def loop_patch(model, pair, **setup) -> PatchResult:
    """`patch`'s result, one pass per cell; `setup`: `patch_setup`'s arguments (an
    `options` is ignored: it only sets the sweep's batch and progress bar)."""
    setup.pop("options", None)
    s = patch_setup(model, pair, **setup)
    run = s.target_run
    return s.result(loop(model, run.tokens, s.cells, score=s.score, offset=run.offset, n_content=s.n_content))
