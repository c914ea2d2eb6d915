"""Recipe against recipe, paired by seed (`sinkmech.train.contrasts`), the
uniform baseline of a self-masked head, and the training findings that read
them and the `<bos>` cost control's results."""

from __future__ import annotations

import json

import pytest
import torch

from sinkmech.train.contrasts import (
    depth_contrasts,
    paired_differences,
    self_masked_uniform_score,
    text_recipe_contrasts,
)
from sinkmech.train.intervals import seed_interval


def pair(gap: float, rate: float, score: float = 0.5, loss: float = 1.0) -> tuple[dict, dict]:
    """A run's (with-`<bos>`, without-`<bos>`) summary rows."""
    r = {"val_loss": loss, "sink_rate": {"0.3": rate}, "max_head_score": score}
    return r, {**r, "val_loss": loss + gap, "sink_rate": {"0.3": 0.0}}


def test_a_paired_difference_sees_a_shift_that_overlapping_intervals_hide():
    """Seeds differ a lot, the recipe shifts every seed by the same +1 point:
    the two recipes' intervals overlap, the paired difference is exactly +1."""
    a = {s: pair(0.1, rate) for s, rate in enumerate((2.0, 8.0, 14.0))}
    b = {s: pair(0.1, rate + 1.0) for s, rate in enumerate((2.0, 8.0, 14.0))}
    lone = seed_interval([2.0, 8.0, 14.0]), seed_interval([3.0, 9.0, 15.0])
    assert lone[1]["lo"] < lone[0]["hi"]  # the intervals overlap
    d = paired_differences(a, b)
    assert d["seeds"] == "0,1,2"
    rate = d["prepend.sink_rate.0.3"]
    assert rate["mean"] == pytest.approx(1.0) and rate["lo"] == pytest.approx(1.0) and rate["hi"] == pytest.approx(1.0)
    assert d["loss_gap"]["mean"] == pytest.approx(0.0, abs=1e-12)
    assert paired_differences(a, {0: b[0], 5: pair(0.1, 1.0)}) is None  # one common seed: no interval


def test_text_recipes_are_compared_with_the_base_on_common_seeds_only():
    base = {0: pair(0.06, 6.0), 1: pair(0.10, 7.0), 2: pair(0.08, 8.0)}
    wide = {0: pair(0.10, 6.5), 1: pair(0.24, 8.0)}
    flat: dict = {}
    text_recipe_contrasts(flat, {"text-L4H4-wd0.1-fixedbos": base, "text-L4H4-wd0.1-fixedbos-d256": wide,
                                 "text-L4H4-wd0.1-fixedbos-4000steps": {0: pair(0.08, 6.45)}})
    key = "train.text.paired.text-L4H4-wd0.1-fixedbos-d256_minus_text-L4H4-wd0.1-fixedbos"
    assert flat[f"{key}.seeds"] == "0,1" and flat[f"{key}.loss_gap.n"] == 2
    assert flat[f"{key}.loss_gap.mean"] == pytest.approx(0.09)  # (0.04 + 0.14) / 2
    assert flat[f"{key}.prepend.sink_rate.0.3.mean"] == pytest.approx(0.75)
    assert not any("4000steps" in k for k in flat)


def test_depth_contrasts_pair_each_depth_with_the_shallowest_of_its_positional_embedding():
    runs = {f"{pos}.L{n}": {s: pair(0.01 * n, 10.0 * n + s) for s in range(3)}
            for pos in ("rotary", "standard") for n in (1, 2, 4)}
    flat: dict = {}
    depth_contrasts(flat, "depth", runs)
    assert flat["train.depth.paired.rotary.L4_minus_L1.loss_gap.mean"] == pytest.approx(0.03)
    assert flat["train.depth.paired.standard.L2_minus_L1.prepend.sink_rate.0.3.mean"] == pytest.approx(10.0)
    assert "train.depth.paired.rotary.L1_minus_L1.seeds" not in flat


@pytest.mark.parametrize("n", [1, 2, 3, 31, 65])
def test_the_self_masked_uniform_score_is_uniform_attention_under_the_self_mask(n):
    """Brute force: the causal mask with the diagonal removed for queries >= 1
    (as `sinkmech.train.model.mask_self_hook` does), uniform rows, mean of column 0."""
    allowed = torch.ones(n, n).tril().bool()
    allowed[torch.arange(1, n), torch.arange(1, n)] = False
    uniform = allowed.double() / allowed.sum(1, keepdim=True)
    assert self_masked_uniform_score(n) == pytest.approx(float(uniform[:, 0].mean()), abs=1e-12)
    if n == 65:  # 64 content tokens and <bos>: the committed self-masked runs' baseline
        assert self_masked_uniform_score(n) == pytest.approx(0.0884, abs=5e-5)


def test_the_findings_read_the_bos_cost_results(tmp_path):
    """`findings` flattens `text_bos_cost.json` (as the text_bos_cost study
    records it) under train.text.bos_cost.<run>, with whether each share excludes zero."""
    from sinkmech.studies.training_findings import findings, findings_text

    result = {"run": "r", "content_tokens": 255, "n_layers": 2, "n_heads": 4, "weight_decay": 0.0, "seed": 0,
              "steps": 2000,
              "select": {"n_prompts": 4, "mode": "mask_first", "top": [{"head": "L1.H2", "loss_change": [0.1, 0.0, 0.2]}]},
              "eval": {"n_prompts": 8, "clean_loss": 1.2, "no_bos": [0.09, 0.07, 0.11],
                       "top_k": {"1": {"heads": ["L1.H2"], "loss_change": [0.01, -0.01, 0.03],
                                       "share": [0.1, -0.1, 0.3]},
                                 "8": {"heads": ["L1.H2"] * 8, "loss_change": [0.09, 0.07, 0.11],
                                       "share": [1.0, 1.0, 1.0]}}}}
    (tmp_path / "text_bos_cost.json").write_text(json.dumps({"r": result}))
    flat = findings(tmp_path)
    base = "train.text.bos_cost.r"
    assert flat[f"{base}.eval.no_bos.0"] == 0.09 and flat[f"{base}.eval.top_k.1.heads.0"] == "L1.H2"
    assert flat[f"{base}.eval.top_k.1.share_detectable"] is False and flat[f"{base}.eval.top_k.8.share_detectable"]
    assert f"{base}.weight_decay" not in flat and flat[f"{base}.content_tokens"] == 255
    text = findings_text(flat)
    assert list(json.loads(text)) == sorted(flat) and text.endswith("}\n")
