"""Readers: what one streamed analysis reads from each chunk of its forward
passes, so that several analyses of the same prompts can share one pass.

An analysis that streams its prompts in chunks (`TokenBatch.batches`) and only
reads activations in its hooks is a `Reader`: `hooks(rows, part)` gives the
hooks for one chunk, `finish()` the result once every chunk was read. `read`
runs the reader's own passes; `ride` hands its hooks to another pass over a
batch whose first prompts are the reader's, in the same chunks (the report's
sink pass with `<bos>`: `sink_scores(..., also=...)`), so one forward pass serves
both, with the same numbers bit for bit (the same chunks run the same
computation). `riders` joins several `ride`s into one `also`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from sinkmech.hooks import run
from sinkmech.loading.backend import Model
from sinkmech.options import RunOptions
from sinkmech.prompts import TokenBatch

ChunkHooks = Callable[[slice, TokenBatch], list]


@dataclass
class Reader:
    """One streamed analysis of `batch`: its hooks per chunk, its result when done.
    `settings` are what its result depends on besides the prompts (checked by `filled`)."""

    batch: TokenBatch
    hooks: ChunkHooks
    finish: Callable[[], object]
    desc: str = "pass"
    settings: dict = field(default_factory=dict)
    seen: int = 0  # prompts read so far, in order

    def read(self, model: Model, options: RunOptions = RunOptions()):
        """The result: the reader's own passes (with a progress bar) when nothing was read
        yet, none when another pass read every prompt (`ride`)."""
        if self.seen == 0:
            chunks = self.batch.batches(options.batch(16))
            for rows, part in tqdm(chunks, desc=self.desc, disable=not options.progress, unit="batch"):
                run(model, part.tokens, self.hooks(rows, part), stop_at_layer=model.cfg.n_layers)
            self.seen = len(self.batch)
        if self.seen != len(self.batch):
            raise ValueError(f"the reader holds {self.seen} of its {len(self.batch)} prompts: the pass it rode "
                             "stopped early")
        return self.finish()

    def ride(self, rows: slice, part: TokenBatch) -> list:
        """The hooks for one chunk of another pass over a batch whose first prompts are
        this reader's: none for a chunk past them; a chunk that is not this reader's
        next is refused (the pass must run these prompts first, in the reader's chunks)."""
        if not rides(self.batch, self.seen, rows, part):
            return []
        self.seen = rows.stop
        return self.hooks(rows, part)

    def filled(self, batch: TokenBatch, **settings) -> Reader:
        """This reader, checked to be one of `batch` at these settings (an analysis
        handed a reader that rode another pass)."""
        if not same_prompts(self.batch, batch):
            raise ValueError("the reader was filled over other prompts than the analysis's")
        if settings != self.settings:
            raise ValueError(f"the reader was filled with other settings ({self.settings}) than the analysis asks "
                             f"for ({settings})")
        return self


def same_prompts(a: TokenBatch, b: TokenBatch) -> bool:
    """Whether two batches hold the same tokens and lengths (a reader filled over `a`
    serves an analysis of `b`)."""
    return len(a) == len(b) and torch.equal(a.tokens, b.tokens) and torch.equal(a.lengths, b.lengths)


def whole_chunks(n: int, batch: TokenBatch, batch_size: int) -> bool:
    """Whether the first `n` prompts of `batch` are whole chunks of a pass over it in
    chunks of `batch_size` (what a reader of them needs to ride that pass)."""
    return n == len(batch) or n % batch_size == 0


def rides(batch: TokenBatch, seen: int, rows: slice, part: TokenBatch) -> bool:
    """Whether a reader of `batch` that has read its first `seen` prompts reads chunk `rows`
    (`part`) of another pass: False past its prompts; a chunk that is not its next is refused."""
    n = len(batch)
    if rows.start >= n:
        return False
    if rows.start != seen or rows.stop > n or not torch.equal(part.tokens, batch.slice(seen, rows.stop).tokens):
        raise ValueError(f"prompts {rows.start}-{rows.stop - 1} of the pass are not the reader's next chunk (it "
                         f"has {seen} of its {n} prompts): the pass must run its prompts first, in chunks "
                         "of its batch size")
    return True


def riders(each: Sequence[ChunkHooks]) -> ChunkHooks:
    """One `also` for a pass (`sink_scores`) from several readers' `ride`s."""
    return lambda rows, part: [h for ride in each for h in ride(rows, part)]
