"""What every report section sees and returns: `ReportContext` (the model,
settings, output folder and the results sections share) and `Section` (one
block of the page), plus the small HTML helpers sections write with.

Shared results: sink scores with and without `<bos>` (Gu et al. 2025, as used
by Barbero et al. 2025; see sinkmech.measures.sinks), computed once per report.
"""

from __future__ import annotations

import html
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path
from collections.abc import Callable, Sequence

import torch

from sinkmech.dormant.first_look import NOOP_MAX_HEADS
from sinkmech.studies.compare import SharedPasses
from sinkmech.loading.backend import Model
from sinkmech.hooks import head_label  # noqa: F401  (sections import it from here)
from sinkmech.corpora import corpus, default_corpus, load_prompts, prompt_documents
from sinkmech.dormant.scan import ScanSums, scan_sums
from sinkmech.measures.key_sinks import key_sink_reader
from sinkmech.measures.massive import massive_reader
from sinkmech.measures.value_weighted import value_weighted_reader
from sinkmech.readers import Reader, riders, whole_chunks
from sinkmech.prompts import CONDITIONS, PromptSource, TokenBatch, TokenStr, token_text, tokenize
from sinkmech.render import View
from sinkmech.measures.sinks import SinkScores, sink_scores
from sinkmech.options import RunOptions


@dataclass
class ReportContext:
    """What every section sees: the model, the settings, the output folder, and
    results shared between sections (computed once, on first use)."""

    model: Model
    out: Path
    prompts: PromptSource = None
    n_prompts: int = 80  # the sink scores: `make demo`'s size (the paper's 170 is one flag away)
    max_tokens: int = 64
    token_str: TokenStr | None = None
    n_heads: int = 3
    view_tokens: int = 32
    view_prompts: int = 3
    # the intervention and dormant-head sections run on the first prompts, each
    # count capped by n_prompts and each length by max_tokens
    spread_prompts: int = 8  # token swaps, with and without <bos>
    scan_prompts: int = 64  # dormant-head scan
    # the no-op check of the if_else heads and the top candidates: opt in (`sinkmech heads` runs it), then
    # at most noop_max_heads of them, the if-else heads first (None: every one)
    noop_prompts: int = 0
    noop_max_heads: int | None = NOOP_MAX_HEADS
    ablation_prompts: int = 4  # mask_first over every head, and the resid_pre patch
    ablation_tokens: int = 16
    # the sections beyond the paper (beyond.py, after the interventions): small, so the default
    # report grows by about a minute
    beyond_prompts: int = 16  # key sinks, massive activations, value-weighted attention
    stream_tokens: int = 256  # one long text (capped by the model's context)
    stream_window: int = 32
    length_prompts: int = 4
    length_tokens: int = 256  # longest evaluation length; halved length_steps - 1 times
    length_steps: int = 3
    options: RunOptions = RunOptions()  # batch size, progress bars, the `<bos>` id: how every section runs
    shared: SharedPasses | None = None  # passes `compare_model` ran on the same prompts, to take over
    cache: dict = field(default_factory=dict)  # what this report computed once: prompts, token text, sinks, chosen heads

    def prompt_list(self) -> list:
        if "prompts" not in self.cache:
            items = default_corpus(self.n_prompts) if self.prompts is None else load_prompts(self.prompts)[: self.n_prompts]
            self.cache["prompts"] = items
        return self.cache["prompts"]

    @property
    def batch_size(self) -> int:
        """Prompts per forward pass: the options' batch size, else 16 (what most sections default to)."""
        return self.options.batch(16)

    def first(self, n: int) -> list:
        """The first n prompts (at most n_prompts)."""
        return self.prompt_list()[: max(1, min(n, self.n_prompts))]

    def token_text(self, token_id: int) -> str:
        """Display string of a token id (raw: escape it before it goes into HTML)."""
        if "token_str" not in self.cache:
            self.cache["token_str"] = self.token_str or token_text(self.model)
        return self.cache["token_str"](int(token_id))

    def sinks(self) -> dict[str, SinkScores]:
        """Sink scores with and without `<bos>` (computed once)."""
        if "sinks" not in self.cache and self.shared is not None:
            kept = self.shared.sinks_for(len(self.prompt_list()), self.max_tokens)
            if kept is not None:
                self.cache["sinks"] = kept
        if "sinks" not in self.cache:
            # windows of a named corpus: the intervals resample their documents (the default
            # prompts are n_prompts windows spread over the whole corpus: `prompt_list`)
            documents = (corpus(n_prompts=self.n_prompts).documents if self.prompts is None
                         else prompt_documents(self.prompts, len(self.prompt_list())))
            batches = {bos: tokenize(self.model, self.prompt_list(), bos=bos, max_tokens=self.max_tokens,
                                     bos_token_id=self.options.bos_token_id) for bos in CONDITIONS}
            riding = self._riders(batches)
            self.cache["sinks"] = {
                bos: replace(sink_scores(self.model, batches[bos], max_tokens=self.max_tokens, options=self.options,
                                         also=riders([r.ride for r in riding[bos].values()]) if riding[bos] else None),
                             documents=documents)
                for bos in CONDITIONS
            }
            self.cache["ridden"] = {(name, bos): r for bos, rs in riding.items() for name, r in rs.items()}
        return self.cache["sinks"]

    def _riders(self, batches: dict[str, TokenBatch]) -> dict[str, dict[str, ScanSums | Reader]]:
        """What rides the sink passes, by condition and name: the dormant scan's sums (with
        `<bos>`; `_scan_rider`) and the readers of the key-sink, massive-dimension and
        value-weighted sections (their first `beyond_prompts` prompts), each where its
        prompts are whole chunks of the pass's first ones: one forward pass serves them all."""
        runs = self.cache.get("sections")  # the report's section functions by name (None: all of them)
        wanted = lambda name: runs is None or f"{name}_section" in runs  # noqa: E731
        n = len(self.first(self.beyond_prompts))
        beyond = whole_chunks(n, batches["prepend"], self.batch_size)
        makers = {"prepend": {"key_sinks": key_sink_reader, "massive": massive_reader,
                              "value_weighted": value_weighted_reader},
                  "none": {"key_sinks": key_sink_reader}} if beyond else {}
        out: dict[str, dict] = {bos: {} for bos in CONDITIONS}
        for bos, made in makers.items():
            for name, make in made.items():
                if not wanted(name):
                    continue
                try:
                    out[bos][name] = make(self.model, batches[bos].slice(0, n))
                except ValueError:  # its section says what is wrong, when it runs
                    continue
        scan = self._scan_rider(batches["prepend"]) if wanted("dormant") else None
        if scan is not None:
            out["prepend"]["scan"] = scan
        return out

    def ridden(self, name: str, bos: str = "prepend"):
        """What rode the sink pass of `bos` for `name` (taken once), else None (no sink pass
        ran before the section, or nothing could ride it): the section runs its own pass."""
        return self.cache["ridden"].pop((name, bos), None) if "ridden" in self.cache else None

    def scan_split(self) -> tuple[list, int, int]:
        """The dormant section's prompts, how many of them it scans (the first) and
        how many it holds out for the no-op check (the next)."""
        items = self.first(self.scan_prompts + self.noop_prompts)
        n_noop = min(self.noop_prompts, len(items) // 2)
        return items, min(self.scan_prompts, len(items) - n_noop), n_noop

    def _scan_rider(self, batch: TokenBatch) -> ScanSums | None:
        """The dormant scan's sums, to fill in the sink pass with `<bos>`: its prompts are
        that pass's first ones, so one forward pass serves both. None where the scan's
        last chunk would not be one of the pass's (a count short of a whole batch) or a
        shared memo may hold the scan already."""
        _, n_scan, _ = self.scan_split()
        if self.shared is not None or not whole_chunks(n_scan, batch, self.batch_size):
            return None
        return scan_sums(self.model, batch.slice(0, n_scan))

    def chosen_heads(self) -> dict[str, list[tuple[int, int]]]:
        """Heads to show up close, by alpha_0 with `<bos>`: the strongest sinks, the
        least sink-like, and the most prompt-dependent (largest std of alpha_0
        across prompts, among the rest: candidates for dormant/active switching)."""
        if "chosen" not in self.cache:
            scores = self.sinks()["prepend"].scores.flatten(1)  # [prompt, layer*head]
            n_heads, k = self.model.cfg.n_heads, min(self.n_heads, scores.shape[1])
            order = scores.mean(0).argsort(descending=True).tolist()
            top, least = order[:k], order[::-1][:k]
            spread = scores.std(0).nan_to_num(0.0) if scores.shape[0] > 1 else torch.zeros(scores.shape[1])
            rest = [i for i in spread.argsort(descending=True).tolist() if i not in top + least]

            def as_heads(idx: list[int]) -> list[tuple[int, int]]:
                return [(i // n_heads, i % n_heads) for i in idx]

            self.cache["chosen"] = {"top sink heads": as_heads(top), "least sink-like heads": as_heads(least),
                                    "most prompt-dependent heads": as_heads(rest[:k])}
        return self.cache["chosen"]

    def discoveries(self) -> dict:
        """The memo of `discover_heads` this report shares (with `compare_model`
        through `shared`, else its own)."""
        return self.shared.discoveries if self.shared is not None else self.cache.setdefault("discoveries", {})

    def figure(self, name: str, draw: Callable[[Path], Path]) -> list[str]:
        """Draw a figure as PNG and SVG under out/figures; returns the relative paths."""
        paths = []
        for suffix in (".png", ".svg"):
            draw(self.out / "figures" / f"{name}{suffix}")
            paths.append(f"figures/{name}{suffix}")
        return paths


SETTINGS = ("n_prompts", "max_tokens", "batch_size", "n_heads", "view_tokens", "view_prompts", "spread_prompts",
            "scan_prompts", "noop_prompts", "ablation_prompts", "ablation_tokens", "beyond_prompts",
            "stream_tokens", "stream_window", "length_prompts", "length_tokens", "length_steps")
OPTIONAL_SETTINGS = ("noop_prompts",)  # 0: that part is left out (no no-op check)



@dataclass(frozen=True)
class Section:
    """One block of the report page."""

    key: str  # its key in summary.json
    title: str
    html: str = ""  # body HTML; figures referenced by relative path
    figures: tuple[str, ...] = ()
    summary: dict = field(default_factory=dict)
    views: tuple[View, ...] = ()


def figure_html(paths: Sequence[str], caption: str, out: Path | None = None) -> str:
    """<figure> for a PNG (and links to every format), by relative path.

    With `out` (the report folder), the image is shown at 130 CSS px per inch
    of figure, so column-width and page-width figures keep their proportions.
    """
    png = next(p for p in paths if p.endswith(".png"))
    links = " ".join(f'<a href="{html.escape(p)}">{p.rsplit(".", 1)[1].upper()}</a>' for p in paths)
    width = ""
    if out is not None and (out / png).is_file():
        px = struct.unpack(">I", (out / png).read_bytes()[16:20])[0]  # PNG IHDR width
        width = f' width="{round(px * 130 / 200)}"'
    return (f'<figure><img src="{html.escape(png)}"{width} alt="{html.escape(caption)}">'
            f"<figcaption>{html.escape(caption)} ({links})</figcaption></figure>")


def table_html(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    cell = lambda v: f"{v:.3f}" if isinstance(v, float) else html.escape(str(v))  # noqa: E731
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"
