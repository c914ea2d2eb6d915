"""Scan, then no-op check on held-out prompts: the one recipe the CLI, the
report and `compare` run to find dormant heads.

What chooses a head or its trigger never judges it: the scan runs on the
first `scan_prompts` prompts (its triggers chosen on the even-numbered ones
and validated on the odd-numbered ones, `sinkmech.dormant.triggers`), and the
no-op check on the next `noop_prompts`, which neither saw.
"""

from __future__ import annotations

from dataclasses import dataclass

from sinkmech.loading.backend import Model
from sinkmech.dormant.noop import NoopCheck, noop_check, noop_heads
from sinkmech.dormant.labels import Thresholds
from sinkmech.dormant.result import HeadScan
from sinkmech.dormant.scan import scan_heads
from sinkmech.prompts import PromptSource, load_prompts
from sinkmech.options import RunOptions


@dataclass(frozen=True)
class Discovery:
    """A scan and the no-op check of its heads, on disjoint prompts."""

    scan: HeadScan
    noop: NoopCheck | None
    scan_prompts: tuple[int, ...]  # corpus indices the scan used
    noop_prompts: tuple[int, ...]  # corpus indices the no-op check used (disjoint)

    def to_dict(self) -> dict:
        return {"scan_prompts": list(self.scan_prompts), "noop_prompts": list(self.noop_prompts)}


def split_corpus(n_items: int, scan_prompts: int | None, noop_prompts: int) -> tuple[range, range]:
    """(scan, no-op) index ranges: the scan takes the first `scan_prompts`
    (default: all that the no-op check leaves), the no-op check the next
    `noop_prompts`. ValueError when they do not fit."""
    if noop_prompts < 0 or (scan_prompts is not None and scan_prompts < 1):
        raise ValueError(f"need scan_prompts >= 1 and noop_prompts >= 0, got {scan_prompts}, {noop_prompts}")
    n_scan = n_items - noop_prompts if scan_prompts is None else scan_prompts
    if n_scan < 1 or n_scan + noop_prompts > n_items:
        raise ValueError(f"the corpus has {n_items} prompts: too few for a scan on {scan_prompts or 'the rest'} and a "
                         f"no-op check on {noop_prompts} others (the no-op check runs on prompts the scan did not see)")
    return range(n_scan), range(n_scan, n_scan + noop_prompts)


def discover_heads(
    model: Model,
    prompts: PromptSource,
    *,
    scan_prompts: int | None = None,
    noop_prompts: int = 32,
    n_candidates: int = 3,
    heads: list[tuple[int, int]] | None = None,
    max_tokens: int = 64,
    thresholds: Thresholds = Thresholds(),
    memo: dict | None = None,
    options: RunOptions = RunOptions(),
) -> Discovery:
    """`scan_heads` on the first prompts, then `noop_check` of every if_else
    head and the `n_candidates` closest besides (or of `heads`) on the next
    `noop_prompts` (0: no check), both with `<bos>` prepended.

    Args:
        prompts: see `sinkmech.prompts.load_prompts`.
        scan_prompts: prompts to scan (default: all but the no-op ones).
        thresholds: the scan's cuts and rules (`scan_heads`); the no-op check
            uses its query-mode cuts.
        memo: a dict shared between callers in one process (`compare --report`
            hands the report the one `compare` filled): a call with the same
            model, prompts and settings returns the stored Discovery instead
            of scanning and checking again.
        options: batch size, progress bars, the `<bos>` id (`RunOptions`).
    """
    items = load_prompts(prompts)
    scan_rows, noop_rows = split_corpus(len(items), scan_prompts, noop_prompts)
    key = None
    if memo is not None:
        # the model itself, not its id: the memo keeps it alive, so no later model can reuse the key
        key = (model, repr(items[: noop_rows.stop]), len(scan_rows), len(noop_rows), n_candidates,
               None if heads is None else tuple(heads), max_tokens, thresholds, options.batch_size,
               options.bos_token_id)
        if key in memo:
            return memo[key]
    scan = scan_heads(model, items[scan_rows.start:scan_rows.stop], bos="prepend", max_tokens=max_tokens,
                      thresholds=thresholds, options=options)
    checked = heads if heads is not None else noop_heads(scan, n_candidates)
    noop = None
    if checked and len(noop_rows):
        noop = noop_check(model, items[noop_rows.start:noop_rows.stop], checked, bos="prepend", max_tokens=max_tokens,
                          thresholds=scan.thresholds, prompt_indices=noop_rows, options=options)
    found = Discovery(scan, noop, tuple(scan_rows), tuple(noop_rows))
    if memo is not None:
        memo[key] = found
    return found
