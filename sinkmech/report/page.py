"""The one-page report: a model in, a browsable folder out.

`build_report` runs a list of sections (each computes its numbers, writes its
figures and returns HTML, JSON and circuitsvis views) and writes
`DIR/index.html`, `DIR/summary.json` and `DIR/figures/`. The page references
figures by relative path and inlines the circuitsvis bundle once, so the
folder works offline wherever it is copied. Definitions: sink score and sink
rate of Gu et al. 2025 as used by Barbero et al. 2025 (see sinkmech.sinks).

The sections themselves live in `sinkmech.report.sections` (which imports
this module); `SECTIONS`, the default list, is loaded from there on first use.
To add a section, write `def my_section(ctx: ReportContext) -> Section` and
pass `sections=[*SECTIONS, my_section]` to `build_report`.
"""

from __future__ import annotations

import html
import json
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Sequence

import torch
from transformer_lens import HookedTransformer

from sinkmech import figures, render
from sinkmech.prompts import PromptSource, default_corpus, load_prompts
from sinkmech.sinks import SinkScores, sink_scores

CONDITIONS = ("prepend", "none")
EPS = (0.3, 0.8)


@dataclass
class ReportContext:
    """What every section sees: the model, the settings, the output folder, and
    results shared between sections (computed once, on first use)."""

    model: HookedTransformer
    out: Path
    prompts: PromptSource = None
    n_prompts: int = 170
    max_tokens: int = 64
    batch_size: int = 16
    bos_token_id: int | None = None
    token_str: render.TokenStr | None = None
    n_heads: int = 3
    view_tokens: int = 32
    view_prompts: int = 3
    # the intervention and dormant-head sections run on the first prompts, each
    # count capped by n_prompts and each length by max_tokens
    spread_prompts: int = 8  # token swaps, with and without <bos>
    scan_prompts: int = 64  # dormant-head scan
    noop_prompts: int = 8  # no-op check of the top candidates
    ablation_prompts: int = 4  # mask_first over every head, and the resid_pre patch
    ablation_tokens: int = 16
    progress: bool = True
    cache: dict = field(default_factory=dict)

    def prompt_list(self) -> list:
        if "prompts" not in self.cache:
            items = default_corpus(self.n_prompts) if self.prompts is None else load_prompts(self.prompts)[: self.n_prompts]
            self.cache["prompts"] = items
        return self.cache["prompts"]

    def first(self, n: int) -> list:
        """The first n prompts (at most n_prompts)."""
        return self.prompt_list()[: max(1, min(n, self.n_prompts))]

    def token_text(self, token_id: int) -> str:
        """Display string of a token id (raw: escape it before it goes into HTML)."""
        if "token_str" not in self.cache:
            self.cache["token_str"] = self.token_str or render.default_token_str(self.model)
        return self.cache["token_str"](int(token_id))

    def sinks(self) -> dict[str, SinkScores]:
        """Sink scores with and without `<bos>` (computed once)."""
        if "sinks" not in self.cache:
            self.cache["sinks"] = {
                bos: sink_scores(self.model, self.prompt_list(), bos=bos, max_tokens=self.max_tokens,
                                 batch_size=self.batch_size, bos_token_id=self.bos_token_id, progress=self.progress)
                for bos in CONDITIONS
            }
        return self.cache["sinks"]

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

    def figure(self, name: str, draw: Callable[[Path], Path]) -> list[str]:
        """Draw a figure as PNG and SVG under out/figures; returns the relative paths."""
        paths = []
        for suffix in (".png", ".svg"):
            draw(self.out / "figures" / f"{name}{suffix}")
            paths.append(f"figures/{name}{suffix}")
        return paths


SETTINGS = ("n_prompts", "max_tokens", "batch_size", "n_heads", "view_tokens", "view_prompts", "spread_prompts",
            "scan_prompts", "noop_prompts", "ablation_prompts", "ablation_tokens")


def __getattr__(name: str):
    """`report.SECTIONS` and the section functions, loaded lazily from
    `sinkmech.report.sections` (which imports this module)."""
    if name == "SECTIONS" or name.endswith("_section"):
        from sinkmech import report_sections

        return getattr(report_sections, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class Section:
    """One block of the report page."""

    key: str  # its key in summary.json
    title: str
    html: str = ""  # body HTML; figures referenced by relative path
    figures: tuple[str, ...] = ()
    summary: dict = field(default_factory=dict)
    views: tuple[render.View, ...] = ()


def head_label(l: int, h: int) -> str:
    return f"L{l}.H{h}"


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


# --- the page ----------------------------------------------------------------

_STYLE = """
body{font-family:system-ui,sans-serif;max-width:1400px;margin:auto;padding:0 16px;color:#222}
figure{display:inline-block;margin:8px;vertical-align:top;max-width:100%}
figure img{max-width:100%} figcaption{font-size:13px;color:#555}
table{border-collapse:collapse;margin:8px 0} td,th{border:1px solid #ccc;padding:3px 8px;font-size:14px}
.note{color:#555;font-size:13px} img.missing{outline:3px solid #c00;min-height:40px}
"""
# Marks every image as loaded or missing (data-loaded), and shows a missing
# figure file as such instead of a silent broken icon.
_IMG_CHECK = """<script>
for (const img of document.images) {
  const mark = () => { img.dataset.loaded = img.naturalWidth > 0 ? "yes" : "no";
    if (img.naturalWidth === 0) { img.classList.add("missing"); img.title = "missing file: " + img.getAttribute("src"); } };
  if (img.complete) mark(); else { img.addEventListener("load", mark); img.addEventListener("error", mark); }
}
</script>"""


@dataclass(frozen=True)
class Report:
    index: Path
    summary_json: Path
    figures: tuple[Path, ...]
    summary: dict


def build_report(
    model: HookedTransformer,
    out: str | Path,
    *,
    sections: Sequence[Callable[[ReportContext], Section]] | None = None,
    model_label: str | None = None,
    **settings,
) -> Report:
    """Run the sections and write out/index.html, out/summary.json, out/figures/.

    Args:
        model: any HookedTransformer.
        out: output folder (created).
        sections: section functions (default `SECTIONS`).
        model_label: name shown on the page (default the model's cfg name).
        **settings: ReportContext fields: prompts, n_prompts, max_tokens,
            batch_size, bos_token_id, token_str, n_heads, view_tokens,
            view_prompts, spread_prompts, scan_prompts, noop_prompts,
            ablation_prompts, ablation_tokens, progress.

    Returns:
        Report with the written paths and the summary dict.
    """
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "figures").mkdir(exist_ok=True)
    except OSError as e:
        raise OSError(f"cannot create the report folder {out}: {e.strerror or e}") from e
    unknown = set(settings) - set(ReportContext.__dataclass_fields__) - {"model", "out", "cache"}
    if unknown:
        raise ValueError(f"unknown report settings: {sorted(unknown)}")
    ctx = ReportContext(model=model, out=out, **settings)
    if min(getattr(ctx, k) for k in SETTINGS) < 1:
        raise ValueError(f"report settings must be >= 1: {', '.join(SETTINGS)}")
    if sections is None:
        from sinkmech.report.sections import SECTIONS as sections
    done, timing = [], {}
    sections = list(sections)
    for i, make in enumerate(sections, 1):
        if ctx.progress:
            print(f"[{i}/{len(sections)}] {make.__name__} ...", flush=True)
        t0 = time.perf_counter()
        done.append(make(ctx))
        timing[done[-1].key] = round(time.perf_counter() - t0, 2)
    label = model_label or model.cfg.model_name
    summary = {
        "model": label,
        "n_layers": model.cfg.n_layers,
        "n_heads": model.cfg.n_heads,
        "settings": {k: getattr(ctx, k) for k in SETTINGS},
        "timing_s": timing,
        "sections": {s.key: s.summary for s in done},
    }
    index = _write(out / "index.html", _page(label, done, summary))
    summary_json = _write(out / "summary.json", json.dumps(summary, indent=1))
    return Report(index, summary_json, tuple(out / f for s in done for f in s.figures), summary)


def _page(label: str, sections: Sequence[Section], summary: dict) -> str:
    all_views = [v for s in sections for v in s.views]
    bodies, script = render.mount(all_views) if all_views else ([], "")
    bodies_iter = iter(bodies)
    settings = ", ".join(f"{k}={v}" for k, v in summary["settings"].items())
    parts = [
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>sinkmech report: {html.escape(label)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>Attention sinks in {html.escape(label)}</h1>",
        f'<p class="note">{summary["n_layers"]} layers x {summary["n_heads"]} heads. Settings: {html.escape(settings)}. '
        f"Time per section: {html.escape(', '.join(f'{k} {v:.0f} s' for k, v in summary['timing_s'].items()))}. "
        'All numbers are in <a href="summary.json">summary.json</a>.</p>',
    ]
    for s in sections:
        parts.append(f'<section id="{html.escape(s.key)}"><h2>{html.escape(s.title)}</h2>{s.html}')
        parts += [next(bodies_iter) for _ in s.views]
        parts.append("</section>")
    parts += [script, _IMG_CHECK, "</body></html>\n"]
    return "\n".join(parts)


def _write(path: Path, text: str) -> Path:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise OSError(f"cannot write {path}: {e.strerror or e}") from e
    return path
