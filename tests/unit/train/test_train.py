"""From-scratch training: data rules, packing masks, checkpoints, experiments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sinkmech.options import QUIET
import torch
from jaxtyping import TypeCheckError

from helpers.paths import REPO
from helpers.backends import needs
from sinkmech.cli.main import main
from sinkmech.hooks import act_name
from sinkmech.train.run import (
    TrainConfig,
    TrainData,
    build_model,
    learning_rate,
    load_checkpoint,
    train,
)
from sinkmech.train.model import packing_hooks
from sinkmech.train.presets import RECIPES
from sinkmech.train.data import (
    BigramBackcopy,
    BigramBackcopyStream,
    backcopy_documents,
    document_ids,
    stream_documents,
)

pytestmark = needs("can_train")  # sinkmech.train builds its models from a config

TINY = dict(context_length=32, tokens_per_step=512, n_layers=1, d_model=32, n_heads=4,
            eval_every=30, eval_prompts=4, val_windows=4, threads=1, warmup=5)


def check_backcopy_rule(tokens: torch.Tensor, spec: BigramBackcopy) -> int:
    """Test oracle: raise AssertionError at the first broken rule in stream
    windows (a trigger right after `<bos>` or after another trigger, or a token
    after a trigger, inside its document, that is not the token before the
    trigger). Returns how many copies were checked."""
    n_checked = 0
    for row in tokens.tolist():
        for t in range(1, len(row)):
            if row[t] >= spec.n_triggers:
                continue
            if row[t - 1] == spec.bos or row[t - 1] < spec.n_triggers:
                raise AssertionError(f"trigger {row[t]} at {t} follows {row[t - 1]}")
            if t + 1 < len(row) and row[t + 1] != spec.bos:
                if row[t + 1] != row[t - 1]:
                    raise AssertionError(f"after the trigger at {t}: {row[t + 1]} != {row[t - 1]}")
                n_checked += 1
    return n_checked


def study(argv: list[str]) -> int:
    """`sinkmech train study ...`: the studies that scripts/train_sinks.py launches."""
    return main(["train", "study", *argv])


@pytest.mark.slow
def test_short_run_loss_falls_and_log_is_written(tmp_path):
    cfg = TrainConfig(data="text", steps=60, lr=3e-3, **TINY)
    result = train(cfg, tmp_path, options=QUIET)
    losses = result.log["train_loss"]
    assert len(losses) == 60
    # Byte-level text starts near ln(258) = 5.55 nats; 60 steps learn byte frequencies at least.
    assert sum(losses[-10:]) / 10 < sum(losses[:5]) / 5 - 1.0
    log = json.loads((tmp_path / "log.json").read_text())
    assert [e["step"] for e in log["evals"]] == [30, 60]
    final = log["evals"][-1]
    assert set(final["val_loss"]) == {"prepend", "none"}
    for cond in ("prepend", "none"):
        c = final["conditions"][cond]
        assert set(c["sink_rate"]) == {"0.3", "0.8"}
        assert len(c["head_scores"]) == 1 and len(c["head_scores"][0]) == 4
        assert c["max_head_score"] == pytest.approx(max(c["head_scores"][0]))
        # every head's alpha_0 is at least 1/T (query 0 attends only to key 0)
        assert min(c["head_scores"][0]) >= 1 / 31 - 1e-6
        assert 0 < c["uniform_score"] < 1
    assert final["val_loss"]["prepend"] < 5.0


def test_learning_rate_warmup_then_cosine():
    cfg = TrainConfig(steps=100, warmup=10, lr=1.0, min_lr_ratio=0.1)
    lrs = [learning_rate(cfg, s) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert lrs[-1] == pytest.approx(0.1, abs=1e-3)


def test_intra_doc_mask_blocks_every_cross_document_attention():
    cfg = TrainConfig(data="bigram_backcopy", packing="intra_doc", fixed_bos=True, n_layers=2, **{
        k: v for k, v in TINY.items() if k != "n_layers"})
    model = build_model(cfg, "cpu")
    bos = cfg.bos_id
    tokens = torch.randint(3, cfg.vocab, (2, 32))
    tokens[:, 0] = bos  # the fixed <bos>
    tokens[0, [9, 20]] = bos  # documents: [1..8] [9..19] [20..31]
    tokens[1, 5] = bos
    doc = document_ids(tokens[:, 1:], bos_id=bos)
    doc = torch.cat([torch.zeros_like(doc[:, :1]), doc], 1)
    cross = doc[:, :, None] != doc[:, None, :]
    cross[:, :, 0] = False  # the fixed <bos> is visible to every query
    causal = torch.ones(32, 32).tril().bool()
    assert (cross & causal).any()
    seen = []

    def check(pattern, hook):
        mass = (pattern * (cross & causal)[:, None].float()).sum()
        seen.append(float(mass))
        # The fixed <bos> stays visible: every query's attention on key 0 is positive.
        assert (pattern[..., 0] > 0).all()
        return pattern

    hooks = packing_hooks(tokens, packing="intra_doc", bos_id=bos, fixed_bos=True)
    with torch.no_grad(), model.hooks(fwd_hooks=hooks + [(lambda n: n.endswith("hook_pattern"), check)]):
        model(tokens)
    assert len(seen) == 2 and max(seen) == 0.0
    # The same check under causal packing sees attention crossing documents.
    seen.clear()
    with torch.no_grad(), model.hooks(fwd_hooks=[(act_name("pattern", 0), check)]):
        model(tokens)
    assert seen[0] > 0.1


@pytest.mark.parametrize("data", ["text", "bigram_backcopy"])
def test_fixed_bos_windows_start_with_bos_and_targets_shift(data):
    for fixed in (True, False):
        cfg = TrainConfig(data=data, fixed_bos=fixed, steps=1, **TINY)
        d = TrainData(cfg)
        for _ in range(3):
            inputs, targets = d.batch()
            assert inputs.shape == targets.shape == (cfg.batch_size, cfg.context_length)
            assert torch.equal(inputs[:, 1:], targets[:, :-1])
            if fixed:
                assert (inputs[:, 0] == cfg.bos_id).all()
                assert not (targets[:, 0] == cfg.bos_id).all()
        if not fixed:  # position 0 is whatever the stream holds there
            assert not (inputs[:, 0] == cfg.bos_id).all()


def test_bigram_backcopy_generator_obeys_its_rule():
    spec = BigramBackcopy.make(vocab=16, n_triggers=2, trigger_prob=0.2, doc_min=8, doc_max=40, seed=3)
    assert torch.allclose(spec.table.sum(-1), torch.ones(16))
    tokens = BigramBackcopyStream(spec, 8, seed=0).next(600)
    assert check_backcopy_rule(tokens, spec) > 500
    # Document lengths stay inside [doc_min, doc_max].
    for row in tokens:
        starts = (row == spec.bos).nonzero().flatten().tolist()
        lengths = [b - a - 1 for a, b in zip(starts[:-1], starts[1:])]
        assert lengths and min(lengths) >= 8 and max(lengths) <= 40
    # Outside copies, x_t follows the bigram table: compare empirical rows.
    big = BigramBackcopyStream(spec, 64, seed=1).next(800)
    prev, cur = big[:, :-1].flatten(), big[:, 1:].flatten()
    sampled = (prev >= spec.n_triggers) & (prev != spec.bos)  # not a copy, not a first token
    for a in range(spec.n_triggers, 16):
        nxt = cur[sampled & (prev == a) & (cur != spec.bos)]
        if len(nxt) < 1500:
            continue
        emp = torch.bincount(nxt, minlength=16).float() / len(nxt)
        assert 0.5 * (emp - spec.table[a]).abs().sum() < 0.08
    # Held-out scoring documents follow the same rule from their first token.
    docs = backcopy_documents(spec, 4, 50, seed=2)
    assert all(len(d) == 50 for d in docs)
    check_backcopy_rule(torch.tensor([[spec.bos] + d for d in docs]), spec)
    # The checker is not vacuous: break one copy and it complains.
    row = tokens[0].clone()
    t = next(i for i in range(1, 598) if row[i] < spec.n_triggers and row[i + 1] != spec.bos)
    row[t + 1] = (row[t - 1] + 1 - spec.n_triggers) % (16 - spec.n_triggers) + spec.n_triggers
    with pytest.raises(AssertionError):
        check_backcopy_rule(row[None], spec)


def test_checkpoint_reload_gives_identical_logits(tmp_path):
    cfg = TrainConfig(data="bigram_backcopy", steps=3, **TINY)
    result = train(cfg, tmp_path, options=QUIET)
    assert (tmp_path / "model.safetensors").exists() and (tmp_path / "config.json").exists()
    assert not list(tmp_path.glob("*.pt")) and not list(tmp_path.glob("*.bin"))
    model, cfg2 = load_checkpoint(tmp_path, device="cpu")
    assert cfg2 == cfg
    tokens = torch.randint(0, cfg.vocab + 1, (2, 32))
    with torch.no_grad():
        assert torch.equal(model(tokens), result.model(tokens))


def test_bad_options_raise_clear_errors():
    # Under pytest beartype checks the Literal annotations first; without it the
    # constructor's own check gives the ValueError, called directly here.
    for field, bad, message in (("packing", "sideways", "unknown packing"), ("data", "wikipedia", "unknown data source"),
                                ("positional", "alibi", "unknown positional embedding 'alibi'")):
        with pytest.raises((ValueError, TypeCheckError)):
            TrainConfig(**{field: bad})
        cfg = TrainConfig()
        object.__setattr__(cfg, field, bad)
        with pytest.raises(ValueError, match=message):
            cfg.__post_init__()
    with pytest.raises(ValueError, match="context_length"):
        TrainData(TrainConfig(data="text", context_length=4096, tokens_per_step=4096, text_limit_bytes=20_000))
    with pytest.raises(ValueError, match="tokens_per_step"):
        TrainConfig(context_length=256, tokens_per_step=128)
    with pytest.raises(ValueError, match="divisible"):
        TrainConfig(d_model=30, n_heads=4)


def test_stream_documents_drop_bos_and_short_documents():
    s = torch.tensor([5, 9, 1, 2, 3, 9, 4, 9, 6, 7, 8, 9])
    assert stream_documents(s, bos_id=9, min_len=2, n=10) == [[1, 2, 3], [6, 7, 8]]


@pytest.mark.slow
def test_experiment_scripts_write_their_contracts(tmp_path):
    out = tmp_path / "fig"
    common = ["--quiet", "--threads", "1", "--out", str(out), "--runs-dir", str(tmp_path / "runs")]
    small = ["--set", "val_windows=2", "eval_prompts=2"]
    assert study(["packing", "--preset", "cpu", "--steps", "2", *small, *common]) == 0
    rows = json.loads((out / "packing.json").read_text())
    assert len(rows) == 8
    assert {(r["packing"], r["fixed_bos"], r["inference_bos"]) for r in rows} == {
        (p, f, b) for p, f in RECIPES for b in (True, False)}
    for r in rows:
        assert set(r["sink_rate"]) == {"0.3", "0.8"}
        for key in ("val_loss", "max_head_score", "mean_head_score", "uniform_score", "loss_gap"):
            assert isinstance(r[key], float)
    assert "| packing |" in (out / "packing.md").read_text()
    assert (out / "packing_curves.png").stat().st_size > 0
    em = json.loads((out / "emergence.json").read_text())
    assert em["run"] == "causal-fixedbos-T128" and em["steps"] == [2]
    assert (out / "emergence.png").stat().st_size > 0
    # positional: standard is reused from the packing run (same config), the others train.
    assert study(["positional", "--preset", "cpu", "--steps", "2", *small, *common]) == 0
    rows = json.loads((out / "positional.json").read_text())
    assert [(r["positional"], r["inference_bos"]) for r in rows] == [
        (p, b) for p in ("standard", "rotary", "none") for b in (True, False)]
    for r in rows:
        assert {"positional", "fixed_bos", "inference_bos", "sink_rate", "max_head_score", "uniform_score",
                "val_loss"} <= set(r)
        assert r["fixed_bos"] is True and set(r["sink_rate"]) == {"0.3", "0.8"}
    assert rows[0]["reused_from"] == "packing/causal-fixedbos-T128" and "reused_from" not in rows[2]
    assert rows[0]["val_loss"] == json.loads((out / "packing.json").read_text())[2]["val_loss"]
    # modes: where attention goes, read back from the positional runs' logs
    assert study(["modes", "--out", str(out)]) == 0
    modes = json.loads((out / "modes.json").read_text())
    assert [(r["positional"], r["inference_bos"]) for r in modes] == [(r["positional"], r["inference_bos"]) for r in rows]
    assert all(0 <= r["other_first"][0][0] <= 1 and r["n_trigger"] > 0 for r in modes)
    # The gpu preset's model (tens of millions of parameters) runs on CPU for two
    # steps, at one short context with a one-window batch to stay fast.
    assert study(["context-length", "--preset", "gpu", "--steps", "2", "--context-length", "64", "128",
                     *small, "tokens_per_step=128", *common]) == 0
    rows = json.loads((out / "context_length.json").read_text())
    assert sorted({r["context_length"] for r in rows}) == [64, 128]
    assert {r["score_tokens"] for r in rows} == {63}  # the shortest context's content tokens, for every model
    assert len({r["uniform_score"] for r in rows if r["inference_bos"]}) == 1
    assert {r["tokens_per_step"] for r in rows} == {128}  # held constant across lengths
    assert min(r["n_params"] for r in rows) > 10_000_000
    assert (out / "context_length.png").stat().st_size > 0
    (out / "context_length.png").unlink()
    (out / "emergence.png").unlink()
    assert study(["replot", "--out", str(out)]) == 0  # figures redrawn from the JSON alone
    assert (out / "context_length.png").stat().st_size > 0 and (out / "emergence.png").stat().st_size > 0
    assert study(["findings", "--out", str(out)]) == 0
    flat = json.loads((out / "findings_train.json").read_text())
    assert flat["train.table2.intra_doc.nofixedbos.none.sink_rate.0.3"] == rows_packing_rate(out)
    assert flat["train.context_length.score_tokens"] == 63 and "train.positional.none.prepend.val_loss" in flat
    # A second seed of Table 2 (--seed 1 --prefix seed1_) adds the spread over seeds.
    other = json.loads((out / "packing.json").read_text())
    for r in other:
        r["seed"], r["val_loss"] = 1, r["val_loss"] + 1.0
    (out / "seed1_packing.json").write_text(json.dumps(other))
    assert study(["findings", "--out", str(out)]) == 0
    flat = json.loads((out / "findings_train.json").read_text())
    assert flat["train.table2_seeds.n_seeds"] == 2 and flat["train.table2_seeds.seeds"] == "0,1"
    loss = flat["train.table2.causal.fixedbos.prepend.val_loss"]
    assert flat["train.table2_seeds.causal.fixedbos.prepend.val_loss.min"] == loss
    assert flat["train.table2_seeds.causal.fixedbos.prepend.val_loss.max"] == pytest.approx(loss + 1.0)
    assert study(["packing", "--set", "packing=sideways", *common]) == 2


def rows_packing_rate(out: Path) -> float:
    rows = json.loads((out / "packing.json").read_text())
    (r,) = [r for r in rows if (r["packing"], r["fixed_bos"], r["inference_bos"]) == ("intra_doc", False, False)]
    return r["sink_rate"]["0.3"]


def test_cli_train_writes_checkpoint_log_and_plot(tmp_path):
    from sinkmech.cli.main import main

    out = tmp_path / "run"
    assert main(["train", "--data", "bigram_backcopy", "--context-length", "16", "--tokens-per-step", "64",
                 "--layers", "1", "--d-model", "16", "--steps", "2", "--eval-every", "2", "--threads", "1",
                 "--out", str(out), "--png", str(tmp_path / "curves.png")]) == 0
    assert {"model.safetensors", "config.json", "log.json"} <= {p.name for p in out.iterdir()}
    assert (tmp_path / "curves.png").stat().st_size > 0
    # A bad option is a clear error (exit 2), not a traceback.
    assert main(["train", "--context-length", "256", "--tokens-per-step", "128", "--out", str(out)]) == 2


def test_config_literals_are_the_checked_choices():
    from typing import get_args

    from sinkmech.train.config import PACKINGS, POSITIONALS, TrainConfig as ConfigDirect

    assert ConfigDirect is TrainConfig  # re-exported by sinkmech.train.run
    hints = {f.name: f.type for f in __import__("dataclasses").fields(TrainConfig)}
    assert hints["packing"] == "Packing" and hints["positional"] == "Positional" and hints["data"] == "DataSource"
    assert PACKINGS == ("causal", "intra_doc") and POSITIONALS == ("rotary", "standard", "none")
    assert get_args(__import__("sinkmech.train.config", fromlist=["x"]).DataSource) == ("text", "bigram_backcopy")


def test_run_names_match_the_committed_logs():
    logs = REPO / "figures" / "train" / "logs"
    names = {TrainConfig(packing=p, fixed_bos=f, context_length=128).run_name for p, f in RECIPES}
    # seedN_ (more seeds of Table 2) and explore_ logs sit beside the preset runs
    assert names == {p.stem for p in (logs / "packing").glob("*.json") if not p.stem.startswith(("seed", "explore_"))}
    assert build_model(TrainConfig(fixed_bos=False), "cpu").cfg.model_name == "text-causal-nofixedbos-T128"


def test_typed_evals_match_the_log(tmp_path):
    cfg = TrainConfig(data="bigram_backcopy", steps=2, eval_every=1, **{k: v for k, v in TINY.items() if k != "eval_every"})
    result = train(cfg, tmp_path, options=QUIET)
    assert len(result.evals) == 2
    log = json.loads((tmp_path / "log.json").read_text())
    for ev, entry in zip(result.evals, log["evals"]):
        assert {k: entry[k] for k in ("val_loss", "split_loss", "conditions")} == ev.to_dict()
        assert list(entry) == ["step", "train_loss", "elapsed_s", "val_loss", "split_loss", "conditions"]
        assert list(entry["conditions"]["none"]) == ["sink_rate", "layer_sink_rate", "head_scores", "max_head_score",
                                                      "mean_head_score", "uniform_score", "value_norm_first",
                                                      "value_norm_rest", "resid_norm_first", "resid_norm_rest",
                                                      "attention"]
        assert set(entry["split_loss"]) == {"prepend", "none"}
    assert result.final() == log["evals"][-1]
    assert result.final_eval().conditions["prepend"].max_head_score == result.final()["conditions"]["prepend"]["max_head_score"]
