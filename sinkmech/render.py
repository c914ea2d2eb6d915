"""Interactive per-head views (circuitsvis), offline and escaped.

Shows, for chosen heads, what the sink scores of Gu et al. 2025 / Barbero et
al. 2025 summarise: the attention pattern with and without `<bos>`, the
attention each query puts on the first token, and how active a head is
(1 - first-token attention, Guo et al. 2024's active/dormant modes) so that a
trigger token stands out.

circuitsvis returns a `RenderedHTML` with two forms: `cdn_src` loads its
JavaScript from unpkg (useless offline) and `local_src` inlines the bundle. We
keep only `local_src`: each view is cut into (bundle, React element, props),
and a page inlines the bundle once for all of its views. Two escapes make
token strings inert: the props JSON is inlined in a `<script>`, so `<`, `>`
and `&` in it become `\\u003c`-style escapes; and circuitsvis' ColoredTokens
writes each token with `innerHTML`, so its tokens are HTML-escaped before
being handed over (AttentionHeads draws tokens as canvas text: they go raw).

The patterns come from `sinkmech.measures.attention.head_attention`; nothing here runs a model.
"""

from __future__ import annotations

import html
import json
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Sequence
from typing import Literal

from circuitsvis.attention import attention_heads
from circuitsvis.tokens import colored_tokens
from torch import Tensor

from sinkmech.measures.attention import HeadAttention, HeadSpec
from sinkmech.files import write_text
from sinkmech.prompts import CONDITION_LABELS

FIRST_COLOR = "#1f5fbf"  # attention on the first token (dormant)
ACTIVE_COLOR = "#c0392b"  # 1 - first-token attention (active)

# --- circuitsvis local_src -> (bundle, element, props) ------------------------

_OPEN = '<script crossorigin type="module">'
_CALL = re.compile(
    r'CircuitsVis\.render\(\s*"(?P<id>[^"]+)",\s*CircuitsVis\.(?P<element>\w+),\s*(?P<props>\{.*\})\s*\)\s*</script>\s*$',
    re.S,
)
_bundle: str | None = None


def script_safe_json(text: str) -> str:
    """JSON that can sit inside <script>: no `</script>`, `<!--` or entity can form."""
    return (
        text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
        .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    )


def _split_local_src(local_src: str) -> tuple[str, str, str]:
    """(bundle, element, props JSON) from circuitsvis' `render_local` output."""
    global _bundle
    start, call = local_src.find(_OPEN), local_src.rfind("CircuitsVis.render(")
    m = _CALL.match(local_src, call) if start >= 0 and call > start else None
    if m is None:
        raise RuntimeError(
            "circuitsvis' local_src does not have the layout sinkmech expects "
            "(<div/> + <script type=module> bundle + CircuitsVis.render(...)); check the circuitsvis version"
        )
    bundle = local_src[start + len(_OPEN) : call].strip()
    if _bundle is None:
        if "</script" in bundle.lower() or "<!--" in bundle:
            raise RuntimeError("the circuitsvis bundle contains </script or <!-- and cannot be inlined safely")
        _bundle = bundle
    return bundle, m["element"], m["props"]


@dataclass(frozen=True)
class Panel:
    """One circuitsvis component: its React element name and its props (JSON)."""

    element: str
    props: str
    caption: str = ""


def _panel(rendered, caption: str) -> Panel:
    _, element, props = _split_local_src(rendered.local_src)
    json.loads(props)  # fail here, not in the browser, if the props are not JSON
    return Panel(element, script_safe_json(props), caption)


@dataclass(frozen=True)
class View:
    """A titled grid of circuitsvis panels; panels in one row sit side by side.

    Displays in a notebook without network (`_repr_html_` inlines the bundle)
    and writes a self-contained HTML file with `save`.
    """

    title: str
    rows: tuple[tuple[Panel, ...], ...]
    note: str = ""

    def _repr_html_(self) -> str:
        bodies, script = mount([self])
        return bodies[0] + script

    def save(self, path: str | Path) -> Path:
        """Write a standalone HTML page (works offline, from any folder)."""
        return write_page(path, self.title, [self])


def mount(views: Sequence[View]) -> tuple[list[str], str]:
    """HTML for several views sharing one copy of the circuitsvis bundle.

    Returns:
        (one HTML fragment per view, the single <script> that renders them all;
        place it after every fragment).
    """
    if _bundle is None:  # load the bundle once through circuitsvis itself
        _split_local_src(colored_tokens(["x"], [0.0]).local_src)
    bodies, calls = [], []
    for view in views:
        parts = [f'<div class="sinkmech-view"><h3>{html.escape(view.title)}</h3>']
        if view.note:
            parts.append(f'<p class="note">{html.escape(view.note)}</p>')
        for row in view.rows:
            parts.append('<div class="sinkmech-row" style="display:flex;flex-wrap:wrap;gap:18px">')
            for panel in row:
                div_id = "sinkmech-cv-" + uuid.uuid4().hex[:12]
                parts.append(
                    '<div class="sinkmech-panel" style="flex:1 1 380px;min-width:0">'
                    f'<div class="caption" style="font:600 13px sans-serif;margin:6px 0">{html.escape(panel.caption)}</div>'
                    f'<div id="{div_id}" class="sinkmech-cv" data-element="{panel.element}"></div></div>'
                )
                calls.append(
                    f'try {{ CircuitsVis.render("{div_id}", CircuitsVis.{panel.element}, {panel.props}); }}'
                    f' catch (e) {{ console.error("sinkmech view {div_id}:", e); }}'
                )
            parts.append("</div>")
        parts.append("</div>")
        bodies.append("\n".join(parts))
    script = f'<script type="module">\n{_bundle}\n' + "\n".join(calls) + "\n</script>\n"
    return bodies, script


def write_page(path: str | Path, title: str, views: Sequence[View]) -> Path:
    """Write `views` as one self-contained HTML page."""
    bodies, script = mount(views)
    page = (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title></head>\n'
        f'<body style="font-family:sans-serif;max-width:1400px;margin:auto">\n'
        + "\n".join(bodies) + "\n" + script + "</body></html>\n"
    )
    return write_text(path, page)


# --- views -------------------------------------------------------------------


def safe_tokens(tokens: Sequence[str]) -> list[str]:
    """Token strings as circuitsvis' ColoredTokens must receive them: it writes
    them with innerHTML, so `<`, `>` and `&` are HTML-escaped and show as typed.
    (Its hover tooltip prints them as text, so there `&lt;` shows escaped.)"""
    return [html.escape(t, quote=False) for t in tokens]


def _values(x: Tensor) -> list:
    return x.double().round(decimals=4).tolist()


def attention_view(att: HeadAttention) -> View:
    """Attention patterns of the chosen heads, with `<bos>` beside without."""
    names = att.head_names()
    row = tuple(
        _panel(
            attention_heads(_values(pat), list(toks), attention_head_names=names, max_value=1.0, min_value=0.0),
            caption,
        )
        for pat, toks, caption in (
            (att.with_bos, att.tokens_with_bos, CONDITION_LABELS["prepend"]),
            (att.without_bos, att.tokens_without_bos, CONDITION_LABELS["none"]),
        )
    )
    return View(f"Attention patterns: {', '.join(names)}", (row,),
                note="Click a head thumbnail to enlarge it; hover a cell for source and destination tokens.")


def first_token_view(att: HeadAttention) -> View:
    """Per query, the attention on the first token, as coloured tokens (one row per head)."""
    rows = []
    for i, name in enumerate(att.head_names()):
        rows.append(tuple(
            _panel(colored_tokens(safe_tokens(toks), _values(att.first_token(bos)[i]), min_value=0.0,
                                  max_value=1.0, positive_color=FIRST_COLOR), f"{name} {label}")
            for bos, toks, label in (("prepend", att.tokens_with_bos, CONDITION_LABELS["prepend"]),
                                     ("none", att.tokens_without_bos, CONDITION_LABELS["none"]))
        ))
    return View("Attention on the first token, per query", tuple(rows),
                note="Darker blue = the query puts more attention on position 0 (the sink).")


def activity_view(atts: Sequence[HeadAttention], head: HeadSpec, *, bos: Literal["prepend", "none"] = "prepend") -> View:
    """Tokens coloured by how active `head` is (1 - first-token attention), one row per prompt."""
    if not atts:
        raise ValueError("no prompts to show: pass at least one HeadAttention")
    rows = []
    for n, att in enumerate(atts):
        i = att.index(head)
        toks = att.tokens_with_bos if bos == "prepend" else att.tokens_without_bos
        act = 1.0 - att.first_token(bos)[i]
        rows.append((_panel(colored_tokens(safe_tokens(toks), _values(act), min_value=0.0, max_value=1.0,
                                           positive_color=ACTIVE_COLOR), f"prompt {n + 1}"),))
    name = atts[0].head_names()[atts[0].index(head)]
    return View(f"{name}: where the head is active", tuple(rows),
                note="Darker red = less attention on the first token, i.e. the head reads something; "
                     "a token that recurs before dark queries is a trigger candidate.")
