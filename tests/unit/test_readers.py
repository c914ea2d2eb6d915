"""Readers riding another streamed pass (`sinkmech.readers`): the key-sink, massive-dimension
and value-weighted readers filled by the sink pass over a batch whose first prompts are
theirs give the results of their own passes, bit for bit (the same chunks run the same
computation, so nothing here needs a tolerance); a chunk out of order, a pass that stopped
early and other settings are refused."""

from __future__ import annotations

import json

import pytest
import torch

from helpers.tiny import TINY_BOS
from sinkmech.measures.key_sinks import key_sink_reader, key_sink_scores
from sinkmech.measures.massive import massive_dims, massive_reader
from sinkmech.measures.sinks import sink_scores
from sinkmech.measures.value_weighted import value_weighted_first, value_weighted_reader
from sinkmech.options import RunOptions
from sinkmech.prompts import tokenize
from sinkmech.readers import riders

RUN = RunOptions(progress=False, bos_token_id=TINY_BOS, batch_size=4)


@pytest.fixture(scope="module")
def batches(tiny_model):
    """10 prompts of uneven length (padding inside the chunks), in both conditions."""
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(2, 50, (n,), generator=g).tolist() for n in (12, 9, 12, 7, 11, 12, 5, 12, 10, 8)]
    return {bos: tokenize(tiny_model, prompts, bos=bos, max_tokens=12, bos_token_id=TINY_BOS)
            for bos in ("prepend", "none")}


def as_json(result) -> str:
    return json.dumps(result.to_dict())


def test_readers_that_ride_the_sink_pass_equal_their_own_passes(tiny_model, batches):
    for bos, batch in batches.items():
        first = batch.slice(0, 8)  # the pass's first two chunks of three
        keys, massive, weighted = (key_sink_reader(tiny_model, first, min_queries=2), massive_reader(tiny_model, first),
                                   value_weighted_reader(tiny_model, first))
        ridden = sink_scores(tiny_model, batch, options=RUN, also=riders([keys.ride, massive.ride, weighted.ride]))
        assert torch.equal(ridden.scores, sink_scores(tiny_model, batch, options=RUN).scores)  # the readers only read
        assert as_json(key_sink_scores(tiny_model, first, min_queries=2, options=RUN, reader=keys)) == as_json(
            key_sink_scores(tiny_model, first, min_queries=2, options=RUN))
        assert as_json(massive_dims(tiny_model, first, options=RUN, reader=massive)) == as_json(
            massive_dims(tiny_model, first, options=RUN))
        assert as_json(value_weighted_first(tiny_model, first, options=RUN, reader=weighted)) == as_json(
            value_weighted_first(tiny_model, first, options=RUN))


def test_a_reader_rides_only_whole_chunks_of_its_own_prompts_in_order(tiny_model, batches):
    batch = batches["prepend"]
    with pytest.raises(ValueError, match="not the reader's next chunk"):  # 6 prompts: the second chunk crosses them
        sink_scores(tiny_model, batch, options=RUN, also=massive_reader(tiny_model, batch.slice(0, 6)).ride)
    with pytest.raises(ValueError, match="not the reader's next chunk"):  # not the pass's first prompts
        sink_scores(tiny_model, batch, options=RUN, also=massive_reader(tiny_model, batch.slice(2, 10)).ride)


def test_readers_that_missed_prompts_or_settings_are_refused(tiny_model, batches):
    batch = batches["prepend"]
    first = batch.slice(0, 8)
    partial = value_weighted_reader(tiny_model, first)
    sink_scores(tiny_model, batch.slice(0, 4), options=RUN, also=partial.ride)  # a pass over the first chunk only
    with pytest.raises(ValueError, match="holds 4 of its 8 prompts"):
        value_weighted_first(tiny_model, first, options=RUN, reader=partial)
    keys = key_sink_reader(tiny_model, first, min_queries=2)
    with pytest.raises(ValueError, match="other settings"):
        key_sink_scores(tiny_model, first, min_queries=3, options=RUN, reader=keys)
    with pytest.raises(ValueError, match="other settings"):
        value_weighted_first(tiny_model, first, vector="value", options=RUN, reader=value_weighted_reader(tiny_model, first))
    with pytest.raises(ValueError, match="other prompts"):
        massive_dims(tiny_model, batch.slice(2, 10), options=RUN, reader=massive_reader(tiny_model, first))
