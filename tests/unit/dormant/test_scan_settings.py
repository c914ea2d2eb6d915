"""`scan_heads` takes its rules as one `Thresholds` object; single fields are a shortcut."""

from __future__ import annotations

import pytest
import torch

from sinkmech.dormant.labels import Thresholds
from sinkmech.dormant.scan import scan_heads
from sinkmech.prompts import tokenize

from helpers.tiny import TINY_BOS


def test_thresholds_object_and_field_shortcut_give_the_same_scan(tiny_model, tiny_tokens):
    batch = tokenize(tiny_model, tiny_tokens[:6], bos="prepend", bos_token_id=TINY_BOS, max_tokens=12)
    kw = dict(progress=False, sweep=False, n_boot=0)
    by_object = scan_heads(tiny_model, batch, thresholds=Thresholds(high=0.3, low=0.1, min_queries=1), **kw)
    by_fields = scan_heads(tiny_model, batch, high=0.3, low=0.1, min_queries=1, **kw)
    mixed = scan_heads(tiny_model, batch, thresholds=Thresholds(high=0.3, low=0.1), min_queries=1, **kw)
    assert by_object.thresholds == by_fields.thresholds == mixed.thresholds == Thresholds(0.3, 0.1, min_queries=1)
    assert torch.equal(by_object.dormant_fraction, by_fields.dormant_fraction)
    assert by_object.modes == by_fields.modes == mixed.modes
    default = scan_heads(tiny_model, batch, **kw)
    assert default.thresholds == Thresholds()


def test_an_unknown_threshold_is_refused_with_the_fields(tiny_model, tiny_tokens):
    with pytest.raises(TypeError, match="unknown threshold hgih: Thresholds has .*high"):
        scan_heads(tiny_model, tiny_tokens[:2], bos_token_id=TINY_BOS, hgih=0.3, progress=False)
    with pytest.raises(ValueError, match="out of order"):
        scan_heads(tiny_model, tiny_tokens[:2], bos_token_id=TINY_BOS, thresholds=Thresholds(), low=0.9,
                   progress=False)
