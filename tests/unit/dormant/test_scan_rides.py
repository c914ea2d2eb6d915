"""The dormant scan riding another streamed pass (`scan_sums`, `ScanSums.ride`):
the sink pass over a batch whose first prompts are the scan's fills the scan's
sums on the way, and the labels equal a scan of its own, bit for bit (the same
chunks run the same computation, so nothing here needs a tolerance)."""

from __future__ import annotations

import json

import pytest
import torch

from helpers.tiny import TINY_BOS
from sinkmech.dormant.labels import Thresholds
from sinkmech.dormant.scan import scan_heads, scan_sums
from sinkmech.measures.sinks import sink_scores
from sinkmech.options import RunOptions
from sinkmech.prompts import tokenize

RUN = RunOptions(progress=False, bos_token_id=TINY_BOS, batch_size=4)
TH = Thresholds(min_queries=1)


@pytest.fixture(scope="module")
def batch(tiny_model):
    """10 prompts of uneven length (padding inside the chunks), <bos> first."""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(2, 50, (n,), generator=g).tolist() for n in (12, 9, 12, 7, 11, 12, 5, 12, 10, 8)]
    return tokenize(tiny_model, prompts, bos="prepend", max_tokens=12, bos_token_id=TINY_BOS)


def test_a_scan_that_rides_the_sink_pass_equals_its_own(tiny_model, batch):
    sums = scan_sums(tiny_model, batch.slice(0, 8), thresholds=TH)  # the first two chunks of four
    ridden = sink_scores(tiny_model, batch, options=RUN, also=sums.ride)
    alone = sink_scores(tiny_model, batch, options=RUN)
    for k in ("scores", "value_norm_first", "value_norm_rest", "resid_norm_first", "resid_norm_rest"):
        assert torch.equal(getattr(ridden, k), getattr(alone, k)), k  # the readers only read
    kw = dict(thresholds=TH, options=RUN)
    scan = scan_heads(tiny_model, batch.slice(0, 8), sums=sums, **kw)
    own = scan_heads(tiny_model, batch.slice(0, 8), **kw)
    assert json.dumps(scan.to_dict(profiles=True)) == json.dumps(own.to_dict(profiles=True))
    assert scan.n_prompts == 8 and scan.if_else_heads() == own.if_else_heads()


def test_a_scan_rides_only_whole_chunks_of_its_own_prompts(tiny_model, batch):
    sums = scan_sums(tiny_model, batch.slice(0, 6), thresholds=TH)  # 6 prompts: the pass's second chunk crosses them
    with pytest.raises(ValueError, match="not the reader's next chunk"):
        sink_scores(tiny_model, batch, options=RUN, also=sums.ride)
    other = scan_sums(tiny_model, batch.slice(2, 10), thresholds=TH)  # not the pass's first prompts
    with pytest.raises(ValueError, match="not the reader's next chunk"):
        sink_scores(tiny_model, batch, options=RUN, also=other.ride)


def test_sums_that_missed_prompts_or_settings_are_refused(tiny_model, batch):
    sums = scan_sums(tiny_model, batch.slice(0, 8), thresholds=TH)
    sink_scores(tiny_model, batch.slice(0, 4), options=RUN, also=sums.ride)  # a pass over the first chunk only
    with pytest.raises(ValueError, match="hold 4 of the scan's 8 prompts"):
        scan_heads(tiny_model, batch.slice(0, 8), sums=sums, thresholds=TH, options=RUN)
    with pytest.raises(ValueError, match="other thresholds"):
        scan_heads(tiny_model, batch.slice(0, 8), sums=sums, options=RUN)
    with pytest.raises(ValueError, match="other prompts"):
        scan_heads(tiny_model, batch.slice(2, 10), sums=sums, thresholds=TH, options=RUN)


def test_readers_ride_only_the_plain_pattern_pass(tiny_model, batch):
    sums = scan_sums(tiny_model, batch.slice(0, 8), thresholds=TH)
    with pytest.raises(ValueError, match="plain pattern pass"):
        sink_scores(tiny_model, batch, options=RUN, also=sums.ride, attention="fused")
    assert sums.n_prompts == 0  # refused before any pass
