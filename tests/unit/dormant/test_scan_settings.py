"""`scan_heads` takes its rules as one `Thresholds` object."""

from __future__ import annotations

import pytest

from sinkmech.dormant.labels import Thresholds
from sinkmech.dormant.scan import scan_heads
from sinkmech.prompts import tokenize

from helpers.tiny import TINY_RUN, TINY_BOS
from sinkmech.options import QUIET


def test_the_thresholds_object_sets_the_cut_and_is_recorded(tiny_model, tiny_tokens):
    batch = tokenize(tiny_model, tiny_tokens[:6], bos="prepend", bos_token_id=TINY_BOS, max_tokens=12)
    kw = dict(options=QUIET, sweep=False, n_boot=0)
    low_cut = scan_heads(tiny_model, batch, thresholds=Thresholds(high=0.3, low=0.1, min_queries=1), **kw)
    high_cut = scan_heads(tiny_model, batch, thresholds=Thresholds(high=0.9, low=0.1, min_queries=1), **kw)
    assert low_cut.thresholds == Thresholds(0.3, 0.1, min_queries=1)
    # a query dormant at 0.9 is dormant at 0.3: the lower cut finds at least as many, and here more
    assert (low_cut.dormant_fraction >= high_cut.dormant_fraction).all()
    assert (low_cut.dormant_fraction > high_cut.dormant_fraction).any()
    default = scan_heads(tiny_model, batch, **kw)
    assert default.thresholds == Thresholds()


def test_single_threshold_fields_are_not_keywords_of_the_scan(tiny_model, tiny_tokens):
    with pytest.raises(TypeError):
        scan_heads(tiny_model, tiny_tokens[:2], high=0.3, options=TINY_RUN)
    with pytest.raises(ValueError, match="out of order"):
        Thresholds(low=0.9)
