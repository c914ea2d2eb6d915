"""Training code paths: no positional embedding, the quantities logged while a
sink forms (split loss, value and residual norms), the emergence series,
score_tokens, and the throughput benchmark."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
import torch

from helpers.paths import REPO
from helpers.backends import needs
from sinkmech.measures.sinks import sink_scores
from sinkmech.train.data import post_trigger, sink_tokens
from sinkmech.hooks import act_name
from sinkmech.train.modes import mode_attention
from sinkmech.train.emergence import emergence, first_crossing, stable_crossing
from sinkmech.train.evaluate import evaluate
from sinkmech.train.model import packed_token_losses
from sinkmech.train.run import TrainConfig, TrainData, build_model, train
from sinkmech.options import QUIET, RunOptions

pytestmark = needs("can_train")  # sinkmech.train builds its models from a config

TINY = dict(data="bigram_backcopy", context_length=32, tokens_per_step=256, n_layers=1, d_model=32, n_heads=2,
            eval_prompts=4, val_windows=8, threads=1, warmup=2)


def _load(name: str):
    path = REPO / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_positional_none_has_no_position_information(tmp_path):
    """Without a positional embedding a one-layer causal model's last position
    sees its prefix as a set: permuting the earlier tokens cannot change its
    logits. With learned absolute positions it does."""
    tokens = torch.randint(0, 60, (1, 12))
    perm = torch.cat([torch.randperm(11), torch.tensor([11])])
    assert not torch.equal(tokens[0, perm], tokens[0])
    cfg = TrainConfig(positional="none", steps=3, eval_every=3, **TINY)
    result = train(cfg, tmp_path, options=QUIET)  # W_pos must stay zero while training
    model = result.model
    assert not model.pos_embed.W_pos.requires_grad and model.pos_embed.W_pos.abs().max() == 0
    with torch.no_grad():
        last = model(tokens)[0, -1]
        assert torch.allclose(model(tokens[:, perm])[0, -1], last, atol=1e-5)
        standard = build_model(TrainConfig(positional="standard", **TINY), "cpu")
        assert not torch.allclose(standard(tokens[:, perm])[0, -1], standard(tokens)[0, -1], atol=1e-3)
    # The frozen embedding is not counted as a trained parameter.
    assert result.log["n_params"] == sum(p.numel() for p in model.parameters()) - model.pos_embed.W_pos.numel()


def test_post_trigger_marks_exactly_the_copies():
    # triggers are ids 0, 1; <bos> is 9. Inputs -> targets: a copy follows each trigger.
    inputs = torch.tensor([[9, 5, 0, 5, 7, 1]])
    targets = torch.tensor([[5, 0, 5, 7, 1, 9]])  # the last trigger ends its document: no copy
    mask = post_trigger(inputs, targets, n_triggers=2, bos_id=9)
    assert mask.tolist() == [[False, False, True, False, False, False]]


def test_split_loss_recombines_to_the_validation_loss():
    """Post-trigger and other positions partition the targets, so their
    token-weighted mean is the validation loss, in both <bos> conditions."""
    cfg = TrainConfig(steps=1, **TINY)
    data = TrainData(cfg)
    model = build_model(cfg, "cpu")
    ev = evaluate(model, data)
    chunk = data.val_chunks
    for cond, (inputs, targets) in {
        "prepend": (torch.cat([torch.full((len(chunk), 1), cfg.bos_id), chunk[:, :-1]], 1)[:, 1:], chunk[:, 1:]),
        "none": (chunk[:, :-1], chunk[:, 1:]),
    }.items():
        copy = post_trigger(inputs, targets, n_triggers=cfg.bb_triggers, bos_id=cfg.bos_id)
        n = copy.sum().item()
        assert 0 < n < copy.numel()
        split = ev.split_loss[cond]
        mixed = (n * split["post_trigger"] + (copy.numel() - n) * split["rest"]) / copy.numel()
        assert mixed == pytest.approx(ev.val_loss[cond], rel=1e-5)
    # The brute-force per-token losses agree with the logged mean.
    inputs = torch.cat([torch.full((len(chunk), 1), cfg.bos_id), chunk[:, :-1]], 1)
    with torch.no_grad():
        losses = packed_token_losses(model, inputs, chunk, packing="causal", bos_id=cfg.bos_id, fixed_bos=True)
    assert float(losses[:, 1:].mean()) == pytest.approx(ev.val_loss["prepend"], rel=1e-5)
    # Text data has no triggers: no split.
    text = TrainConfig(**{**TINY, "data": "text"})
    assert evaluate(build_model(text, "cpu"), TrainData(text)).split_loss is None


def test_logged_norms_are_the_sink_scores_norms():
    cfg = TrainConfig(steps=1, **TINY)
    data = TrainData(cfg)
    model = build_model(cfg, "cpu")
    ev = evaluate(model, data)
    s = sink_scores(model, data.prompts, bos="prepend", max_tokens=sink_tokens(cfg),
                    options=RunOptions(progress=False, bos_token_id=cfg.bos_id))
    c = ev.conditions["prepend"]
    assert torch.allclose(torch.tensor(c.value_norm_first), s.value_norm_first.mean(0))
    assert torch.allclose(torch.tensor(c.resid_norm_rest), s.resid_norm_rest.mean(0))
    assert len(c.value_norm_first) == 1 and len(c.value_norm_first[0]) == 2 and len(c.resid_norm_first) == 1


def _fake_eval(step: int, scores: list[list[float]]) -> dict:
    cond = {"head_scores": scores, "uniform_score": 0.1, "value_norm_first": [[1.0, 2.0]],
            "value_norm_rest": [[3.0, 4.0]], "resid_norm_first": [5.0 + step], "resid_norm_rest": [6.0]}
    return {"step": step, "split_loss": {"prepend": {"post_trigger": 1.0 / step, "rest": 2.0}},
            "conditions": {"prepend": cond, "none": {**cond, "head_scores": [[0.05, 0.05]]}}}


def test_emergence_follows_the_strongest_head_and_marks_the_crossing():
    log = {"evals": [_fake_eval(100, [[0.2, 0.1]]), _fake_eval(200, [[0.25, 0.31]]), _fake_eval(300, [[0.2, 0.9]])]}
    em = emergence(log, run="x")
    assert (em.layer, em.head) == (0, 1)  # the strongest head at the last evaluation, not the first
    assert em.first_token_score == [0.1, 0.31, 0.9]
    assert em.cross_step == {"0.3": 200, "0.8": 300}
    assert em.stable_step == {"0.3": 200, "0.8": 300}
    assert em.bos_value_norm == [2.0] * 3 and em.other_value_norm == [4.0] * 3
    assert em.bos_resid_norm == [105.0, 205.0, 305.0]
    assert em.loss_post_trigger == [0.01, 0.005, 1 / 300]
    assert first_crossing([1, 2], [0.3, 0.3], 0.3) is None  # strict, like the sink rate
    # A score that dips back below the threshold restarts the stable crossing.
    steps, vals = [1, 2, 3, 4, 5], [0.1, 0.4, 0.2, 0.5, 0.6]
    assert first_crossing(steps, vals, 0.3) == 2 and stable_crossing(steps, vals, 0.3) == 4
    assert stable_crossing(steps, [0.4, 0.4, 0.4, 0.4, 0.1], 0.3) is None


def test_emergence_of_a_real_log_has_every_series(tmp_path):
    cfg = TrainConfig(steps=4, eval_every=2, **TINY)
    em = emergence(train(cfg, tmp_path, options=QUIET).log, run=cfg.run_name).to_dict()
    assert em["steps"] == [2, 4]
    for k in ("first_token_score", "bos_value_norm", "other_value_norm", "bos_resid_norm", "loss_post_trigger"):
        assert len(em[k]) == 2 and all(math.isfinite(v) for v in em[k])
    json.dumps(em)


def test_score_tokens_sets_the_scoring_prompts():
    cfg = TrainConfig(steps=1, score_tokens=11, **TINY)
    assert sink_tokens(cfg) == 11 and sink_tokens(TrainConfig(**TINY)) == 31
    data = TrainData(cfg)
    assert {len(p) for p in data.prompts} == {11}
    assert evaluate(build_model(cfg, "cpu"), data).conditions["prepend"].uniform_score == pytest.approx(
        sum(1 / (t + 1) for t in range(12)) / 12)  # 11 content tokens + <bos>
    with pytest.raises(ValueError, match="score_tokens"):
        TrainConfig(score_tokens=32, **TINY)  # no room for <bos> in a 32-token context


def test_bench_train_prints_and_writes_the_ratio(tmp_path, capsys):
    mod = _load("bench_train")
    assert mod.main(["--steps", "2", "--set", "context_length=32", "tokens_per_step=64", "eval_prompts=2",
                     "val_windows=2", "--out", str(tmp_path)]) == 0
    bench = json.loads((tmp_path / "bench_train.json").read_text())
    assert bench["tokens_per_step"] == 64
    assert bench["ratio_train_causal_to_plain"] > 0 and bench["plain_steps_per_s"] > 0
    assert "ratio train/plain" in capsys.readouterr().out


def test_mode_attention_finds_a_planted_if_else_head():
    """Plant the ideal bigram-backcopy head (Guo et al. 2024): on a trigger
    query all attention on the previous key (the copy source), elsewhere all on
    key 0. mode_attention must read exactly 1 and 0 where they belong."""
    cfg = TrainConfig(steps=1, **TINY)
    model = build_model(cfg, "cpu")
    data = TrainData(cfg)
    tokens = torch.cat([torch.full((len(data.prompts), 1), cfg.bos_id), torch.tensor(data.prompts)], 1)
    T = tokens.shape[1]
    trig = tokens < cfg.bb_triggers  # [batch, pos]
    ideal = torch.zeros(len(tokens), T, T)
    ideal[:, :, 0] = 1.0
    q = torch.arange(1, T)
    ideal[:, q, 0] = torch.where(trig[:, q], 0.0, 1.0)
    ideal[:, q, q - 1] += torch.where(trig[:, q], 1.0, 0.0)

    def plant(pattern, hook):
        out = pattern.clone()
        out[:, 1] = ideal  # head 1 becomes the if-else head; head 0 is left as initialised
        return out

    with model.hooks(fwd_hooks=[(act_name("pattern", 0), plant)]):
        m = mode_attention(model, tokens, n_triggers=cfg.bb_triggers)
    assert m.trigger_prev[0, 1] == pytest.approx(1.0) and m.trigger_first[0, 1] == pytest.approx(0.0)
    assert m.other_first[0, 1] == pytest.approx(1.0) and m.other_prev[0, 1] == pytest.approx(0.0)
    assert m.n_trigger == int(trig[:, 2:-1].sum()) and m.n_trigger + m.n_other == len(tokens) * (T - 3)
    assert 0 < m.other_first[0, 0] < 0.9  # the untouched random head is no sink
    with pytest.raises(ValueError, match="both trigger"):
        mode_attention(model, torch.full((1, 8), 10), n_triggers=cfg.bb_triggers)
