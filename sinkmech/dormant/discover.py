"""Scan, then no-op check on held-out prompts: the one recipe the CLI, the
report and `compare` run to find dormant heads.

What chooses a head or its trigger never judges it: the scan runs on the
first `scan_prompts` prompts (its triggers chosen on the even-numbered ones
and validated on the odd-numbered ones, `sinkmech.dormant.triggers`), and the
no-op check on the next `noop_prompts`, which neither saw.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sinkmech.loading.backend import Model
from sinkmech.dormant.first_look import first_look_note
from sinkmech.dormant.noop import NoopCheck, noop_check, noop_heads, with_primary
from sinkmech.dormant.labels import Thresholds
from sinkmech.dormant.result import HeadScan
from sinkmech.dormant.scan import ScanSums, scan_heads
from sinkmech.corpora import load_prompts, prompt_documents, split_corpus
from sinkmech.prompts import PromptSource
from sinkmech.options import RunOptions


@dataclass(frozen=True)
class Discovery:
    """A scan and the no-op check of its heads, on disjoint prompts."""

    scan: HeadScan
    noop: NoopCheck | None
    scan_prompts: tuple[int, ...]  # corpus indices the scan used
    noop_prompts: tuple[int, ...]  # corpus indices the no-op check used (disjoint)
    noop_covers: tuple[tuple[int, int], ...] = ()  # every head the check covers: if-else heads, then candidates
    noop_seconds: float = 0.0  # what the check took (its cost on more heads or prompts scales from it)

    def first_look_note(self, *, all_heads: str = "all") -> str | None:
        """What the no-op check left out and what the whole check would take
        (`sinkmech.dormant.first_look`); None when no check ran or it was whole."""
        if self.noop is None:
            return None
        return first_look_note(len(self.noop.results), len(self.noop_covers), len(self.noop_prompts),
                               self.noop_seconds, all_heads=all_heads)

    def to_dict(self) -> dict:
        return {"scan_prompts": list(self.scan_prompts), "noop_prompts": list(self.noop_prompts)}


def discover_heads(
    model: Model,
    prompts: PromptSource,
    *,
    scan_prompts: int | None = None,
    noop_prompts: int = 32,
    n_candidates: int = 3,
    max_heads: int | None = None,
    max_tokens: int = 64,
    thresholds: Thresholds = Thresholds(),
    memo: dict | None = None,
    options: RunOptions = RunOptions(),
    scan_sums: ScanSums | None = None,
) -> Discovery:
    """`scan_heads` on the first prompts, then `noop_check` of every if_else
    head and the `n_candidates` closest besides on the next `noop_prompts`
    (0: no check), both with `<bos>` prepended.

    Args:
        prompts: see `sinkmech.corpora.load_prompts`.
        scan_prompts: prompts to scan (default: all but the no-op ones).
        max_heads: check at most this many of those heads, the if-else heads
            first (None: every one). A check's cost grows with its heads and
            prompts; `Discovery.first_look_note` says what the whole one takes.
        thresholds: the scan's cuts and rules (`scan_heads`); the no-op check
            uses its query-mode cuts.
        memo: a dict shared between callers in one process (`compare --report`
            hands the report the one `compare` filled): a call with the same
            model, prompts and settings returns the stored Discovery instead
            of scanning and checking again.
        options: batch size, progress bars, the `<bos>` id (`RunOptions`).
        scan_sums: the scan's running sums, filled in another pass over its
            prompts (`sinkmech.dormant.scan.scan_sums`: the report's sink pass);
            only its labels are left.
    """
    items = load_prompts(prompts)
    scan_rows, noop_rows = split_corpus(len(items), scan_prompts, noop_prompts)
    key = None
    if memo is not None:
        # the model itself, not its id: the memo keeps it alive, so no later model can reuse the key
        key = (model, repr(items[: noop_rows.stop]), len(scan_rows), len(noop_rows), n_candidates, max_heads,
               max_tokens, thresholds, options.batch_size, options.bos_token_id)
        if key in memo:
            return memo[key]
    scan = scan_heads(model, items[scan_rows.start:scan_rows.stop], bos="prepend", max_tokens=max_tokens,
                      thresholds=thresholds, options=options, sums=scan_sums)
    covers = noop_heads(scan, n_candidates)
    checked = covers if max_heads is None else covers[:max_heads]
    noop, t0 = None, time.perf_counter()
    if checked and len(noop_rows):
        documents = prompt_documents(prompts, noop_rows.stop)  # windows of one document are not independent
        noop = noop_check(model, items[noop_rows.start:noop_rows.stop], checked, bos="prepend", max_tokens=max_tokens,
                          thresholds=scan.thresholds,
                          documents=None if documents is None else documents[noop_rows.start:],
                          options=options).at_prompts(noop_rows)
        # the primary family: the scan's if-else heads; candidates are secondary
        noop = with_primary(noop, scan.if_else_heads())
    found = Discovery(scan, noop, tuple(scan_rows), tuple(noop_rows), tuple(covers), time.perf_counter() - t0)
    if memo is not None:
        memo[key] = found
    return found
