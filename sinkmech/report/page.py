"""The one-page report: a model in, a browsable folder out.

`build_report` runs a list of sections (each computes its numbers, writes its
figures and returns HTML, JSON and circuitsvis views) and writes
`DIR/index.html`, `DIR/summary.json` and `DIR/figures/`. The page references
figures by relative path and inlines the circuitsvis bundle once, so the
folder works offline wherever it is copied. Definitions: sink score and sink
rate of Gu et al. 2025 as used by Barbero et al. 2025 (see sinkmech.measures.sinks).

`SECTIONS` (sinkmech.report.sections) is the default list. To add a section,
write `def my_section(ctx: ReportContext) -> Section` and pass
`sections=[*SECTIONS, my_section]` to `build_report`.
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable, Sequence


from sinkmech import render
from sinkmech.loading.backend import Model
from sinkmech.options import RunOptions
from sinkmech.files import json_text, make_dir, staged_dir, write_text
from sinkmech.report.context import OPTIONAL_SETTINGS, SETTINGS, ReportContext, Section
from sinkmech.report.sections import SECTIONS

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
    model: Model,
    out: str | Path,
    *,
    sections: Sequence[Callable[[ReportContext], Section]] | None = None,
    model_label: str | None = None,
    overwrite: bool = False,
    options: RunOptions = RunOptions(),
    **settings,
) -> Report:
    """Run the sections and write out/index.html, out/summary.json, out/figures/.

    Args:
        model: a HookedTransformer or a TransformerBridge (`sinkmech.loading.backend`).
        out: output folder, written whole or not at all: the report is built in
            a temporary folder beside it and moved into place at the end.
        overwrite: replace an earlier report in `out` (as a whole); without
            it an earlier report is kept and this call fails before any work.
        sections: section functions (default `SECTIONS`).
        model_label: name shown on the page (default the model's cfg name).
        options: batch size, progress bars and the `<bos>` id every section runs with.
        **settings: ReportContext fields: prompts, n_prompts, max_tokens,
            token_str, n_heads, view_tokens, view_prompts, spread_prompts,
            scan_prompts, noop_prompts, noop_max_heads, ablation_prompts, ablation_tokens, the
            beyond-the-paper sizes, and `shared` (`compare_model`'s passes).

    Returns:
        Report with the written paths and the summary dict.
    """
    out = Path(out)
    allowed = set(ReportContext.__dataclass_fields__) - {"model", "out", "options", "cache"}  # cache: the report's own
    unknown = set(settings) - allowed
    if unknown:
        raise ValueError(f"unknown report settings: {sorted(unknown)}")
    settings["options"] = options
    check = ReportContext(model=model, out=out, **settings)
    low = [k for k in SETTINGS if getattr(check, k) < (0 if k in OPTIONAL_SETTINGS else 1)]
    if low:
        required = [k for k in SETTINGS if k not in OPTIONAL_SETTINGS]
        raise ValueError(f"report settings must be >= 1 ({', '.join(required)}) or >= 0 "
                         f"({', '.join(OPTIONAL_SETTINGS)}, 0: left out); got {', '.join(f'{k}={getattr(check, k)}' for k in low)}")
    if check.noop_max_heads is not None and check.noop_max_heads < 1:
        raise ValueError(f"noop_max_heads must be >= 1 or None (every head), got {check.noop_max_heads}")
    with staged_dir(out, overwrite=overwrite, what="report folder") as tmp:
        summary, files = _build(model, tmp, sections, model_label, settings)
    return Report(out / "index.html", out / "summary.json", tuple(out / f for f in files), summary)


def _build(model, out: Path, sections, model_label, settings) -> tuple[dict, list[str]]:
    make_dir(out / "figures", "report folder")
    ctx = ReportContext(model=model, out=out, **settings)
    done, timing = [], {}
    sections = list(SECTIONS if sections is None else sections)
    ctx.cache["sections"] = {make.__name__ for make in sections}  # what rides the sink passes: only what runs
    for i, make in enumerate(sections, 1):
        if ctx.options.progress:
            print(f"[{i}/{len(sections)}] {make.__name__} ...", flush=True)
        t0 = time.perf_counter()
        done.append(make(ctx))
        timing[done[-1].key] = round(time.perf_counter() - t0, 2)
    label = model_label or model.cfg.model_name
    summary = {
        "model": label,
        "n_layers": model.cfg.n_layers,
        "n_heads": model.cfg.n_heads,
        "settings": {**{k: getattr(ctx, k) for k in SETTINGS}, "noop_max_heads": ctx.noop_max_heads},
        "timing_s": timing,
        "sections": {s.key: s.summary for s in done},
    }
    write_text(out / "index.html", _page(label, done, summary))
    write_text(out / "summary.json", json_text(summary))
    return summary, [f for s in done for f in s.figures]


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
