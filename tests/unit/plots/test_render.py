"""circuitsvis views: right numbers, offline, and token strings that stay inert."""

from __future__ import annotations

import html
import json
import re

import pytest
import torch
from circuitsvis.tokens import colored_tokens

from helpers.tiny import TINY_BOS, make_tiny
from helpers.markup import PLANTED, planted_str
from sinkmech.loading.backend import IS_BRIDGE
from sinkmech import render
from sinkmech.measures.attention import head_attention
from sinkmech.hooks import act_name
from sinkmech.options import RunOptions

# Token strings an attacker (or just Python source) can put in a prompt.
PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 13]


@pytest.fixture(scope="module")
def att(tiny_model):
    return head_attention(tiny_model, PROMPT, ["0.1", (1, 2)],
                          options=RunOptions(bos_token_id=TINY_BOS), token_str=planted_str)


def test_head_attention_equals_the_cache_in_both_conditions(tiny_model, att):
    for tokens, pattern in (([TINY_BOS] + PROMPT, att.with_bos), (PROMPT, att.without_bos)):
        _, cache = tiny_model.run_with_cache(torch.tensor([tokens]))
        for i, (layer, head) in enumerate(att.heads):
            torch.testing.assert_close(pattern[i], cache[act_name("pattern", layer)][0, head])
    assert att.tokens_with_bos == (planted_str(TINY_BOS),) + tuple(planted_str(t) for t in PROMPT)
    assert att.tokens_without_bos == tuple(planted_str(t) for t in PROMPT)


def test_first_token_of_a_uniform_head_is_one_over_t_plus_one():
    # A head with W_Q = 0 scores every key equally: query t puts 1/(t+1) on key 0.
    # Off-by-one errors between the two conditions would break this.
    model = make_tiny(3)
    with torch.no_grad():
        if IS_BRIDGE:  # the Bridge's W_Q is a view computed from the Hugging Face q_proj: zero that
            q_proj = model.blocks[1].attn.original_component.q_proj
            d = model.cfg.d_head
            q_proj.weight[2 * d : 3 * d].zero_()
            if q_proj.bias is not None:
                q_proj.bias[2 * d : 3 * d].zero_()
        else:
            model.blocks[1].attn.W_Q[2].zero_()
            model.blocks[1].attn.b_Q[2].zero_()
    att = head_attention(model, PROMPT, ["1.2"], options=RunOptions(bos_token_id=TINY_BOS))
    for bos, n in (("prepend", len(PROMPT) + 1), ("none", len(PROMPT))):
        expected = 1.0 / torch.arange(1, n + 1, dtype=torch.float32)
        torch.testing.assert_close(att.first_token(bos)[0], expected)


def _props(view: render.View) -> list[tuple[str, dict]]:
    return [(p.element, json.loads(p.props)) for row in view.rows for p in row]


def test_views_hand_circuitsvis_the_right_tokens_and_values(att):
    (e1, with_bos), (e2, without_bos) = _props(render.attention_view(att))
    assert e1 == e2 == "AttentionHeads"
    # AttentionHeads draws tokens as canvas text: they go raw, exactly as decoded.
    assert with_bos["tokens"] == list(att.tokens_with_bos)
    assert with_bos["attentionHeadNames"] == ["L0.H1", "L1.H2"]
    torch.testing.assert_close(torch.tensor(with_bos["attention"], dtype=torch.float64), att.with_bos.double(), atol=1e-4, rtol=0)
    torch.testing.assert_close(torch.tensor(without_bos["attention"], dtype=torch.float64), att.without_bos.double(), atol=1e-4, rtol=0)
    ft = _props(render.first_token_view(att))
    assert [e for e, _ in ft] == ["ColoredTokens"] * 4  # 2 heads x (with, without <bos>)
    # ColoredTokens writes tokens with innerHTML: they are HTML-escaped, and unescape to the original.
    assert [html.unescape(t) for t in ft[0][1]["tokens"]] == list(att.tokens_with_bos)
    assert not any("<" in t for _, p in ft for t in p["tokens"])
    torch.testing.assert_close(torch.tensor(ft[2][1]["values"], dtype=torch.float64), att.first_token("prepend")[1].double(), atol=1e-4, rtol=0)
    act = _props(render.activity_view([att, att], "1.2"))
    assert len(act) == 2
    torch.testing.assert_close(torch.tensor(act[0][1]["values"], dtype=torch.float64), 1 - att.first_token("prepend")[1].double(), atol=1e-4, rtol=0)


def test_view_html_is_self_contained_and_script_safe(att, tmp_path):
    views = [render.attention_view(att), render.first_token_view(att), render.activity_view([att], "0.1")]
    bodies, script = render.mount(views)
    page = "".join(bodies) + script
    # Nothing is fetched: no CDN import, no remote src/href (the bundle's own
    # strings mention w3.org namespaces and docs URLs, which are never loaded).
    assert "unpkg" not in page
    assert not re.search(r"""(src|href)\s*=\s*["']?https?:|from\s*["']https?:|import\(\s*["']https?:""", page)
    # The bundle is inlined once for all views, and the only script end tag is ours.
    assert page.count("var CircuitsVis=") == 1
    assert page.lower().count("</script") == 1 and page.rstrip().endswith("</script>")
    assert "<!--" not in script
    assert page.count('class="sinkmech-cv"') == 2 + 4 + 1
    # Notebook display and the saved file both carry the bundle (no network needed).
    assert "var CircuitsVis=" in views[0]._repr_html_()
    saved = views[0].save(tmp_path / "v.html").read_text()
    assert "var CircuitsVis=" in saved and "unpkg" not in saved


def test_script_safe_json_round_trips():
    text = json.dumps({"tokens": ["</script>", "<!--", "a&b", "\u2028"]})
    safe = render.script_safe_json(text)
    assert not re.search(r"[<>&]", safe)
    assert json.loads(safe) == json.loads(text)


def test_unexpected_circuitsvis_layout_is_a_clear_error():
    src = colored_tokens(["x"], [0.0]).local_src
    with pytest.raises(RuntimeError, match="layout"):
        render._split_local_src(src.replace("CircuitsVis.render(", "CircuitsVis.draw("))


def test_bad_heads_are_clear_errors(tiny_model, att):
    with pytest.raises(ValueError, match="layer 5 out of range"):
        head_attention(tiny_model, PROMPT, ["5.0"], options=RunOptions(bos_token_id=TINY_BOS))
    with pytest.raises(ValueError, match="head 9 out of range"):
        head_attention(tiny_model, PROMPT, [(0, 9)], options=RunOptions(bos_token_id=TINY_BOS))
    with pytest.raises(ValueError, match="LAYER.HEAD"):
        head_attention(tiny_model, PROMPT, ["L0H1"], options=RunOptions(bos_token_id=TINY_BOS))
    with pytest.raises(ValueError, match="no heads"):
        head_attention(tiny_model, PROMPT, [], options=RunOptions(bos_token_id=TINY_BOS))
    with pytest.raises(ValueError, match="was not computed"):
        render.activity_view([att], "1.3")
    with pytest.raises(ValueError, match="no prompts"):
        render.activity_view([], "0.1")


def test_saving_to_an_unwritable_place_is_a_clear_error(att, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(OSError, match="cannot write"):
        render.first_token_view(att).save(blocker / "sub" / "view.html")


def test_head_attention_tables(att):
    df = att.to_dataframe()
    n, m = len(PROMPT) + 1, len(PROMPT)
    assert len(df) == len(att.heads) * (n * (n + 1) // 2 + m * (m + 1) // 2)  # causal: key <= query only
    assert (df["key"] <= df["query"]).all()
    first = df[(df["bos"] == "none") & (df["layer"] == 1) & (df["head"] == 2) & (df["key"] == 0)].sort_values("query")
    torch.testing.assert_close(torch.tensor(first["attention"].to_numpy()), att.first_token("none")[1])
    payload = json.loads(att.to_json())
    assert payload["heads"] == ["L0.H1", "L1.H2"] and payload["tokens_without_bos"][0] == PLANTED[5]
