"""The long-context study on the tiny model: its position buckets add up to the
one masked loss, its sink rate by position is the pattern's own attention on
key 0, the stream runs reuse full attention's losses exactly, and its config
refuses what it cannot run."""

from __future__ import annotations

import pytest
import torch

from helpers.tiny import TINY_BOS, WordTokenizer, toy_tokenizer
from sinkmech.options import QUIET
from sinkmech.studies.config import ConfigError
from sinkmech.studies.configs import STUDIES, LongContextConfig

SMALL = dict(lengths=(12, 40), n_prompts=3, buckets=(8, 32, 64), stream_length=40, stream_window=8,
             stream_keep=(0, 1), learned_sinks=(), collapse_repeats=(2, 6), collapse_prefix=8)


def test_the_config_is_registered_reads_back_and_refuses_bad_settings():
    assert STUDIES["long-context"] is LongContextConfig
    config = LongContextConfig(**SMALL)
    # the recorded config reruns the study (lists as tuples: the test suite's type checker sees __init__ first)
    recorded = {k: tuple(v) if isinstance(v, list) else v for k, v in config.to_dict().items()}
    assert LongContextConfig.from_dict(recorded) == config
    with pytest.raises(ConfigError, match="n_prompts must be >= 2"):
        LongContextConfig(n_prompts=1)
    with pytest.raises(ConfigError, match="buckets must be increasing"):
        LongContextConfig(buckets=(512, 64))
    with pytest.raises(ConfigError, match="leaves no token to score"):
        LongContextConfig(stream_length=1024, stream_window=1024)


def test_bucket_edges_cover_the_content_positions_once():
    from sinkmech.studies.long_context import bucket_edges

    assert bucket_edges((64, 512, 2048), 512) == [(1, 64), (65, 512)]
    assert bucket_edges((64, 512, 2048), 1000) == [(1, 64), (65, 512), (513, 1000)]


@pytest.fixture(scope="module")
def study(tiny_model):
    from sinkmech.studies.long_context import run

    with pytest.MonkeyPatch.context() as mp:
        toy_tokenizer(mp, tiny_model, WordTokenizer())
        yield run(tiny_model, LongContextConfig(**SMALL), QUIET.replace(bos_token_id=TINY_BOS)), tiny_model


@pytest.mark.parametrize("bos", ["prepend", "none"])
def test_buckets_add_up_to_the_masked_loss_and_read_the_patterns_key_0(study, bos, monkeypatch):
    from sinkmech.context.long_text import long_prompts_for
    from sinkmech.hooks import cached_run
    from sinkmech.measures.sinks import sink_scores
    from sinkmech.prompts import tokenize

    result, model = study
    toy_tokenizer(monkeypatch, model, WordTokenizer())
    texts = [t.text for t in long_prompts_for(3, 40, LongContextConfig().topics)]
    run = result.run(40, bos)
    batch = tokenize(model, texts, bos=bos, max_tokens=40, bos_token_id=TINY_BOS)
    ref = sink_scores(model, batch, loss=True, options=QUIET)
    # every content target falls in exactly one bucket: the buckets' sums are the prompt's loss
    assert torch.allclose(run.loss_sum.sum(1), ref.prompt_loss, rtol=1e-5)
    assert torch.equal(run.loss_count.sum(1), ref.prompt_targets().float())
    assert run.buckets == ((1, 8), (9, 32), (33, 40))
    # bucket 9-32: the mean attention on key 0 of the content queries at content positions 9 .. 32
    names = [f"blocks.{l}.attn.hook_pattern" for l in range(model.cfg.n_layers)]
    _, cache = cached_run(model, batch.tokens, names)
    off = batch.offset
    for l, name in enumerate(names):
        want = cache[name][:, :, off + 8 : off + 32, 0].mean(-1)
        assert (run.first[:, l, :, 1] - want).abs().max() < 1e-5
    assert (run.alpha0 - ref.scores).abs().max() < 1e-5


def test_stream_reuses_full_attention_and_the_window_costs_without_the_first_key(study):
    from sinkmech.studies.long_context import stream_runs

    result, model = study
    s = result.stream
    assert s.settings == ("full", "keep0", "keep1", "control1") and s.scored_from == 9
    # the reused full-attention losses are the ones a fresh full pass gives
    with pytest.MonkeyPatch.context() as mp:
        toy_tokenizer(mp, model, WordTokenizer())
        from sinkmech.context.long_text import long_prompts_for

        texts = [t.text for t in long_prompts_for(3, 40, LongContextConfig().topics)]
        fresh = stream_runs(model, texts, LongContextConfig(**SMALL), QUIET.replace(bos_token_id=TINY_BOS))
    assert torch.allclose(fresh.loss_sum, s.loss_sum, rtol=1e-5)
    d = result.to_dict()
    assert set(d["stream"]["settings"]) == {"full", "keep0", "keep1", "control1"}
    assert d["stream"]["settings"]["keep1"]["minus_control"] is not None


def _sink_file(path, model, logit: float | None, values: bool) -> str:
    import json

    L, H, d = model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head
    data = {"model": "tiny", "sink_logits": [[logit] * H for _ in range(L)],
            "sink_values": [[[0.5] * d] * H for _ in range(L)] if values else None}
    path.write_text(json.dumps(data))
    return str(path)


def test_learned_sinks_stand_in_for_the_dropped_first_key(study, tmp_path):
    """Each learned-sink file is one more stream run, the first key dropped and
    the file's logits in its place, compared with dropping and keeping it; a
    file of -inf logits (no sink at any head) is the run with the key dropped;
    a file of the wrong shape is refused before anything runs."""
    from sinkmech.context.long_text import long_prompts_for
    from sinkmech.studies.long_context import learned_stand_ins, stream_runs

    _, model = study
    files = (_sink_file(tmp_path / "tiny_head.json", model, 2.0, False),
             _sink_file(tmp_path / "tiny_none.json", model, None, False),
             _sink_file(tmp_path / "tiny_head_value.json", model, 2.0, True))
    config = LongContextConfig(**{**SMALL, "model": "tiny", "learned_sinks": tuple(
        f.replace("tiny_", "{model}_") for f in files)})
    config.check_inputs()
    sinks = learned_stand_ins(model, config)
    assert list(sinks) == ["learned_head", "learned_none", "learned_head_value"]
    assert sinks["learned_head"].values is None and sinks["learned_head_value"].values is not None
    with pytest.MonkeyPatch.context() as mp:
        toy_tokenizer(mp, model, WordTokenizer())
        texts = [t.text for t in long_prompts_for(3, 40, LongContextConfig().topics)]
        s = stream_runs(model, texts, config, QUIET.replace(bos_token_id=TINY_BOS),
                        stand_ins={f"keep0_{n}": v for n, v in sinks.items()})
    col = {n: s.loss_sum[:, i] for i, n in enumerate(s.settings)}
    assert torch.allclose(col["keep0_learned_none"], col["keep0"], rtol=1e-5)
    assert not torch.allclose(col["keep0_learned_head"], col["keep0"], rtol=1e-3)
    assert not torch.allclose(col["keep0_learned_head_value"], col["keep0_learned_head"], rtol=1e-3)
    summary = s.summary()["keep0_learned_head"]
    assert set(summary) >= {"loss", "minus_full", "minus_keep0", "minus_keep1"}
    assert summary["minus_keep0"]["value"] == pytest.approx(
        float((col["keep0_learned_head"] - col["keep0"]).sum() / (3 * s.n_scored)), rel=1e-6)
    wrong = tmp_path / "wrong_head.json"
    wrong.write_text('{"sink_logits": [[1.0]]}')
    with pytest.raises(ValueError, match="do not fit this model"):
        learned_stand_ins(model, LongContextConfig(**{**SMALL, "model": "wrong", "learned_sinks": (
            str(tmp_path / "{model}_head.json"),)}))
    with pytest.raises(FileNotFoundError, match="not found"):
        LongContextConfig(**{**SMALL, "learned_sinks": (str(tmp_path / "missing.json"),)}).check_inputs()


def test_learned_sinks_in_every_row_of_the_run_without_bos_at_each_length(tiny_model, tmp_path):
    """The whole study with two learned-sink files: per length one more run
    without `<bos>` for each, labelled `none_learned_<variant>`, with the
    sink's mass by bucket and its loss against both conditions; a file of
    -inf logits is the run without `<bos>` bucket by bucket; the stream runs
    gain `keep0_learned_<variant>`."""
    from sinkmech.studies.long_context import run

    files = (_sink_file(tmp_path / "tiny_head.json", tiny_model, 1.0, True),
             _sink_file(tmp_path / "tiny_none.json", tiny_model, None, False))
    config = LongContextConfig(**{**SMALL, "model": "tiny", "collapse_repeats": (), "learned_sinks": tuple(
        f.replace("tiny_", "{model}_") for f in files)})
    with pytest.MonkeyPatch.context() as mp:
        toy_tokenizer(mp, tiny_model, WordTokenizer())
        result = run(tiny_model, config, QUIET.replace(bos_token_id=TINY_BOS))
    assert result.conditions == ("prepend", "none", "none_learned_head", "none_learned_none")
    assert set(result.stream.settings) >= {"keep0_learned_head", "keep0_learned_none"}
    for T in (12, 40):
        off, none = result.run(T, "none_learned_none"), result.run(T, "none")
        assert torch.allclose(off.loss_sum, none.loss_sum, rtol=1e-5) and off.sink.abs().max() < 1e-5
        assert result.run(T, "none_learned_head").sink.min() > 0
    d = result.to_dict()
    bucket = d["lengths"]["40"]["none_learned_head"]["buckets"]["9-32"]
    assert bucket["learned_sink_mass"]["value"] > 0 and "learned_sink_mass" not in d["lengths"]["40"]["none"]["buckets"]["9-32"]
    gap = d["learned_contrasts"]["40"]["none_learned_head"]["9-32"]
    on, pre = result.run(40, "none_learned_head"), result.run(40, "prepend")
    assert gap["minus_prepend"]["value"] == pytest.approx(
        float(on.loss_sum[:, 1].sum() / on.loss_count[:, 1].sum() - pre.loss_sum[:, 1].sum() / pre.loss_count[:, 1].sum()))
    assert set(gap) == {"minus_prepend", "minus_none"}
    import warnings

    from sinkmech.plots.long_context import long_context_figures

    with warnings.catch_warnings():  # no collapse measured: its panel says so, and no empty legend is asked for
        warnings.simplefilter("error")
        assert all(p.stat().st_size > 0 for p in long_context_figures(d, tmp_path))  # the learned runs drawn beside


def test_the_result_records_its_config_sources_and_findings(study):
    result, _ = study
    d = result.to_dict()
    assert d["config"] == LongContextConfig(**SMALL).to_dict()
    assert len(d["prompt_sources"]) == 3 and all(s["sources"] for s in d["prompt_sources"])
    assert set(d["collapse"]) == {"prepend", "none", "none_minus_prepend"}
    f = result.findings()[f"{result.model_name}.long"]
    assert all(k.startswith(f"{result.model_name}.long.") for k in f)
    assert any(".lengths.40.prepend.buckets.9-32.loss.value" in k for k in f)


def test_a_model_loaded_with_too_short_a_context_is_refused(tiny_model):
    from sinkmech.studies.long_context import run

    with pytest.raises(ValueError, match="load it with n_ctx="):
        run(tiny_model, LongContextConfig(**{**SMALL, "lengths": (100,)}), QUIET)


def test_contrasts_pair_the_conditions_bucket_by_bucket(study):
    """The paired loss gap of a bucket is the difference of the two conditions' losses there."""
    result, _ = study
    c = result.to_dict()["contrasts"]["40"]
    pre, none = result.run(40, "prepend"), result.run(40, "none")
    for b, key in enumerate(c):
        gap = c[key]["loss_gap"]["value"]
        want = float(none.loss_sum[:, b].sum() / none.loss_count[:, b].sum()
                     - pre.loss_sum[:, b].sum() / pre.loss_count[:, b].sum())
        assert abs(gap - want) < 1e-9
