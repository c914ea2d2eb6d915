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
"""

from __future__ import annotations

import html
import json
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable, Sequence
from typing import Literal

import torch
from circuitsvis.attention import attention_heads
from circuitsvis.tokens import colored_tokens
from jaxtyping import Float
from torch import Tensor
from transformer_lens import HookedTransformer

from sinkmech.hooks import act_name, check_head, parse_head, run
from sinkmech.prompts import tokenize

HeadSpec = tuple[int, int] | str
TokenStr = Callable[[int], str]

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
    path = Path(path)
    bodies, script = mount(views)
    page = (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title></head>\n'
        f'<body style="font-family:sans-serif;max-width:1400px;margin:auto">\n'
        + "\n".join(bodies) + "\n" + script + "</body></html>\n"
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(page, encoding="utf-8")
    except OSError as e:
        raise OSError(f"cannot write {path}: {e.strerror or e}") from e
    return path


# --- attention of chosen heads on one prompt ----------------------------------


@dataclass(frozen=True)
class HeadAttention:
    """Attention patterns of chosen heads on one prompt, with and without `<bos>`.

    `without_bos[:, i, j]` and `with_bos[:, i + 1, j + 1]` concern the same
    content tokens i, j.
    """

    heads: tuple[tuple[int, int], ...]
    with_bos: Float[Tensor, "head query_pos key_pos"]
    without_bos: Float[Tensor, "head content_query content_key"]
    tokens_with_bos: tuple[str, ...]
    tokens_without_bos: tuple[str, ...]

    def head_names(self) -> list[str]:
        return [f"L{l}.H{h}" for l, h in self.heads]

    def first_token(self, bos: Literal["prepend", "none"]) -> Float[Tensor, "head pos"]:
        """Attention each query puts on position 0 (`<bos>`, or the first content token)."""
        if bos not in ("prepend", "none"):
            raise ValueError(f"bos must be 'prepend' or 'none', got {bos!r}")
        return (self.with_bos if bos == "prepend" else self.without_bos)[:, :, 0]

    def index(self, head: HeadSpec) -> int:
        key = parse_head(head) if isinstance(head, str) else tuple(head)
        if key not in self.heads:
            raise ValueError(f"head L{key[0]}.H{key[1]} was not computed; have {self.head_names()}")
        return self.heads.index(key)

    def to_dataframe(self):
        """Long format: one row per (bos, head, query, key) with key <= query."""
        import pandas as pd

        rows = []
        for bos, pat in (("prepend", self.with_bos), ("none", self.without_bos)):
            q, k = torch.tril_indices(pat.shape[1], pat.shape[2])
            for i, (l, h) in enumerate(self.heads):
                rows.append(pd.DataFrame({"bos": bos, "layer": l, "head": h, "query": q.numpy(),
                                          "key": k.numpy(), "attention": pat[i, q, k].numpy()}))
        return pd.concat(rows, ignore_index=True)

    def to_json(self) -> str:
        return json.dumps({
            "heads": self.head_names(),
            "tokens_with_bos": list(self.tokens_with_bos),
            "tokens_without_bos": list(self.tokens_without_bos),
            "first_token_with_bos": self.first_token("prepend").tolist(),
            "first_token_without_bos": self.first_token("none").tolist(),
        })


def default_token_str(model: HookedTransformer) -> TokenStr:
    """Token id -> display string: the tokenizer's, or `[id]` without one."""
    tok = model.tokenizer
    if tok is None:
        return lambda i: f"[{i}]"
    return lambda i: tok.decode([i])


def head_attention(
    model: HookedTransformer,
    prompt: str | Sequence[int],
    heads: Sequence[HeadSpec],
    *,
    max_tokens: int = 32,
    bos_token_id: int | None = None,
    token_str: TokenStr | None = None,
) -> HeadAttention:
    """Attention patterns of `heads` on `prompt`, with and without `<bos>`.

    Args:
        model: any HookedTransformer.
        prompt: a string, or a list of token ids (models without tokenizer).
        heads: "L.H" strings or (layer, head) pairs.
        max_tokens: content tokens kept.
        bos_token_id: `<bos>` id for models whose tokenizer lacks one.
        token_str: token id -> display string (default: the tokenizer's).

    Returns:
        HeadAttention with [head, query_pos, key_pos] patterns.
    """
    if not heads:
        raise ValueError("no heads given: pass at least one 'L.H' head")
    parsed = []
    for h in heads:
        l, hd = parse_head(h) if isinstance(h, str) else (int(h[0]), int(h[1]))
        check_head(model, l, hd)
        parsed.append((l, hd))
    token_str = token_str or default_token_str(model)
    patterns, labels = {}, {}
    for bos in ("prepend", "none"):
        batch = tokenize(model, [prompt], bos=bos, max_tokens=max_tokens, bos_token_id=bos_token_id)
        found: dict[int, Tensor] = {}

        def keep(pattern, hook):
            found[hook.layer()] = pattern[0].detach().clone().float().cpu()

        layers = sorted({l for l, _ in parsed})
        run(model, batch.tokens, [(act_name("pattern", l), keep) for l in layers], stop_at_layer=max(layers) + 1)
        patterns[bos] = torch.stack([found[l][h] for l, h in parsed])
        labels[bos] = tuple(token_str(int(t)) for t in batch.tokens[0].tolist())
    return HeadAttention(tuple(parsed), patterns["prepend"], patterns["none"], labels["prepend"], labels["none"])


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
            (att.with_bos, att.tokens_with_bos, "with <bos>"),
            (att.without_bos, att.tokens_without_bos, "without <bos>"),
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
            for bos, toks, label in (("prepend", att.tokens_with_bos, "with <bos>"),
                                     ("none", att.tokens_without_bos, "without <bos>"))
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
