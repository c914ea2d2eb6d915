"""How an analysis runs, apart from what it measures: one `RunOptions` travels
through every analysis (`options: RunOptions = RunOptions()`, or `QUIET` where
it is nested in another) instead of the same few keywords in each signature.
The functions that build tokens (`tokenize`, `as_batch`, `bos_pair`) take the
`<bos>` id themselves: there it is what they make. Imports nothing heavy, so the
command line builds one before torch loads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

DTYPE_NAMES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class RunOptions:
    """Settings that change how fast or where an analysis runs, never what it measures.

    Attributes:
        batch_size: prompts per forward pass (rows, copies x prompts, for the stacked
            sweeps of `head_ablations` and `patch`); None: the analysis's own default.
        progress: show a progress bar on long work.
        device: where a model is loaded or moved ("cpu", "cuda", ...); None: as loaded.
        dtype: "float32", "bfloat16" or "float16"; None: as loaded.
        bos_token_id: the `<bos>` id to place (None: the tokenizer's; see `sinkmech.loading.models.bos_token_id`).
    """

    batch_size: int | None = None
    progress: bool = True
    device: str | None = None
    dtype: str | None = None
    bos_token_id: int | None = None

    def __post_init__(self) -> None:
        b = self.batch_size
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 1):
            raise ValueError(f"batch_size must be a positive integer, got {b!r}")
        if self.dtype is not None and self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_NAMES)}, got {self.dtype!r}")
        t = self.bos_token_id
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 0):
            raise ValueError(f"bos_token_id must be a token id >= 0, got {t!r}")

    def batch(self, default: int) -> int:
        """`batch_size`, or the analysis's own `default` where none was asked for."""
        return default if self.batch_size is None else self.batch_size

    def replace(self, **changes) -> RunOptions:
        """A copy with `changes` (checked like the original)."""
        return dataclasses.replace(self, **changes)


STUDY_BATCH = 8  # prompts per forward pass in the studies where --batch-size gives none
QUIET = RunOptions(progress=False)  # no progress bars: tests, nested calls
