"""The <bos> cost the sink heads carry: per-head loss changes against the
ablation sweep's own code path, a planted null head, and the held-out split."""

from __future__ import annotations

import json
import math

import pytest
import torch

from helpers.tiny import TINY_RUN, TINY_BOS
from helpers.backends import needs
from helpers.tolerance import SAME_TERMS, TINY_FORWARD, sum_of_changes_atol
from sinkmech.stats import ratio_with_ci
from sinkmech.studies.bos_cost import ablated_prompt_losses, bos_cost, head_loss_changes
from sinkmech.interventions.ablation import head_ablations
from sinkmech.prompts import tokenize
from sinkmech.options import QUIET, RunOptions


def summed_nll(tokens, offset, lengths):
    """A metric for `head_ablations`: summed next-token loss over content targets
    (content position j predicts content token j + 1)."""
    def fn(logits, reference, mask):
        lp = torch.log_softmax(logits.double(), -1)
        total = lp.new_zeros(())
        for b in range(lp.shape[0]):
            n = int(lengths[b]) - offset
            for j in range(n - 1):
                total = total - lp[b, j, tokens[b, offset + j + 1]]
        return total
    return fn


def test_head_loss_changes_equal_the_sweep_with_a_loss_metric(tiny_model, tiny_tokens):
    batch = tokenize(tiny_model, tiny_tokens[:3, :8].tolist(), bos="prepend", bos_token_id=TINY_BOS)
    res = head_loss_changes(tiny_model, batch, options=QUIET)
    ref = head_ablations(tiny_model, batch, mode="mask_first",
                         metric=summed_nll(batch.tokens, batch.offset, batch.lengths), options=QUIET)
    # sums over 3 x 7 targets of float32 loss changes, restarted sweep against whole passes (helpers/tolerance.py)
    tol = sum_of_changes_atol(21, math.log(tiny_model.cfg.d_vocab))
    assert torch.allclose(res.changes.sum(0).float(), ref.effects - ref.baseline, atol=tol, rtol=0)
    assert res.clean.sum() == pytest.approx(ref.baseline, rel=TINY_FORWARD)
    assert res.targets.tolist() == [7, 7, 7]
    l, h = res.ranking()[0]
    assert res.mean_changes()[l, h] == res.mean_changes().max()


@needs("from_config", why="a zeroed W_O in a HookedTransformer")
def test_a_head_that_writes_nothing_costs_nothing(tiny_tokens):
    """Planted null: L1.H2 with W_O = 0 changes no loss when masked; the others do."""
    from helpers.tiny import make_tiny

    model = make_tiny(seed=3)
    with torch.no_grad():
        model.blocks[1].attn.W_O[2] = 0.0
    res = head_loss_changes(model, tiny_tokens[:2, :8].tolist(), options=TINY_RUN)
    assert res.changes[:, 1, 2].abs().max() < 1e-6
    assert res.changes.abs().flatten(1).max(1).values.min() > 1e-4


def test_bos_cost_ranks_on_one_set_and_measures_on_another(tiny_model, tiny_tokens):
    rows = tiny_tokens[:, :8].tolist()
    out = bos_cost(tiny_model, rows, select_prompts=2, eval_prompts=4, ks=[1, 8], options=TINY_RUN)
    assert out["select"]["n_prompts"] == 2 and out["eval"]["n_prompts"] == 4
    held = tokenize(tiny_model, rows[2:6], bos="prepend", bos_token_id=TINY_BOS)
    none = tokenize(tiny_model, rows[2:6], bos="none")
    clean = ablated_prompt_losses(tiny_model, held, [])
    gap = ablated_prompt_losses(tiny_model, none, []) - clean
    assert out["eval"]["no_bos"][0] == pytest.approx(float(gap.sum() / (7 * 4)))
    eight = out["eval"]["top_k"]["8"]
    assert len(eight["heads"]) == 8 and eight["heads"][0] == out["select"]["top"][0]["head"]
    assert eight["share"][0] == pytest.approx(eight["loss_change"][0] / out["eval"]["no_bos"][0])
    # held-out prompts that share documents: the intervals resample documents
    docs = ("s0", "s1", "d0", "d0", "d1", "d1")
    grouped = bos_cost(tiny_model, rows, select_prompts=2, eval_prompts=4, ks=[1, 8], documents=docs, options=TINY_RUN)
    assert grouped["eval"]["no_bos"] == pytest.approx(ratio_with_ci(gap, torch.full((4,), 7.0, dtype=torch.float64),
                                                                    groups=docs[2:]), rel=1e-6)
    assert grouped["eval"]["n_documents"] == 2 and out["eval"]["n_documents"] == 4
    assert grouped["eval"]["no_bos"][0] == out["eval"]["no_bos"][0] and grouped["eval"]["no_bos"] != out["eval"]["no_bos"]
    with pytest.raises(ValueError, match="documents for 6 prompts"):
        bos_cost(tiny_model, rows, select_prompts=2, eval_prompts=4, ks=[1], documents=docs[:5], options=TINY_RUN)
    with pytest.raises(ValueError, match="fewer than"):
        bos_cost(tiny_model, rows, select_prompts=4, eval_prompts=4, ks=[1], options=TINY_RUN)
    with pytest.raises(ValueError, match="ks must be"):
        bos_cost(tiny_model, rows, select_prompts=2, eval_prompts=2, ks=[9], options=TINY_RUN)


def test_ablate_metric_loss_cli(monkeypatch, tmp_path, capsys):
    """`ablate --metric loss`: the JSON holds each head's loss change (nats per
    content target), equal to head_loss_changes on the same prompts."""
    from helpers.tiny import serve_tiny
    from sinkmech.cli.main import main

    model = serve_tiny(monkeypatch, 7)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the cat sat on the warm mat today\na cat ran far away from the big dog\n")
    out = tmp_path / "loss.json"
    assert main(["ablate", "--metric", "loss", "--prompts", str(prompts), "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    want = head_loss_changes(model, [p for p in prompts.read_text().splitlines()], options=QUIET)
    assert d["metric"] == "loss" and d["mode"] == "mask_first"
    assert torch.allclose(torch.tensor(d["effects"]), want.mean_changes().float(), atol=SAME_TERMS, rtol=0)  # same passes
    assert "nats per target" in capsys.readouterr().out
    part = tmp_path / "loss.partial.json"
    assert main(["ablate", "--metric", "loss", "--prompts", str(prompts), "--shard", "1/2", "--json", str(part)]) == 2
    assert "--metric loss runs in one process" in capsys.readouterr().err


# --- the control on a model trained here (sinkmech.studies.text_bos_cost) ---------------------------------------

TEXT_CFG = dict(data="text", text_corpus="docs", text_limit_bytes=600_000, context_length=32, tokens_per_step=64,
                n_layers=2, n_heads=4, d_model=16, steps=1)


def test_text_windows_are_training_windows_from_two_halves_of_the_validation_split():
    from sinkmech.studies.text_bos_cost import split_stream, text_windows
    from sinkmech.train.config import TrainConfig
    from sinkmech.train.data import text_streams

    cfg = TrainConfig(**TEXT_CFG)
    pick, held = text_windows(cfg, n_select=5, n_eval=7)
    _, val = text_streams(limit_bytes=cfg.text_limit_bytes, corpus=cfg.text_corpus)
    first, second = split_stream(val, bos_id=cfg.bos_id)
    assert second[0] == cfg.bos_id and len(first) >= len(val) // 2
    for batch, half, n in ((pick, first, 5), (held, second, 7)):
        assert batch.tokens.shape == (n, cfg.context_length) and batch.bos == "prepend"
        assert (batch.tokens[:, 0] == cfg.bos_id).all() and (batch.lengths == cfg.context_length).all()
        slots = half[: len(half) // 31 * 31].view(-1, 31)  # the half's aligned 31-token slots
        starts = []
        for row in batch.tokens[:, 1:]:  # each window is an aligned slot of its own half, none twice
            hits = (slots == row).all(1).nonzero()[:, 0].tolist()
            assert hits
            starts.append(hits[0])
        assert len(set(starts)) == n


@needs("can_train", why="a model built as sinkmech.train builds it")
def test_masking_key_0_in_every_head_is_removing_bos_in_a_rotary_model():
    """Rotary attention sees only offsets, so once no head may attend to `<bos>`
    it changes nothing downstream: the top-all share is 1 by construction."""
    from sinkmech.studies.bos_cost import bos_cost_batches
    from sinkmech.studies.text_bos_cost import text_windows
    from sinkmech.train.config import TrainConfig
    from sinkmech.train.model import build_model

    cfg = TrainConfig(**TEXT_CFG, seed=3)
    model = build_model(cfg, "cpu")
    pick, held = text_windows(cfg, n_select=2, n_eval=4)
    out = bos_cost_batches(model, pick, held, ks=[8], options=QUIET)["eval"]
    assert out["top_k"]["8"]["loss_change"][0] == pytest.approx(out["no_bos"][0], abs=1e-5)


def planted_bos_reader(cfg, held):
    """A positional-free model whose only writing head, L1.H2, puts all its
    attention on `<bos>` and reads from it the one direction the unembedding
    uses: with it the logits are the held-out targets' own unigram log
    frequencies (the best constant guess), without it a random multiple of
    them, so the loss rises whenever the head loses `<bos>` (Gibbs)."""
    from sinkmech.train.model import build_model

    model = build_model(cfg, "cpu")
    s, r, d = 0, 1, cfg.d_model
    with torch.no_grad():
        for block in model.blocks:
            block.attn.W_O.zero_()
            block.attn.b_O.zero_()
            block.mlp.W_out.zero_()
            block.mlp.b_out.zero_()
        W_E = model.embed.W_E
        W_E[:, s] = 0.0
        W_E[:, 1:] -= W_E[:, 1:].mean(1, keepdim=True)  # content rows sum to 0: their normalised s-coordinate is 0
        W_E[cfg.bos_id] = 0.0
        W_E[cfg.bos_id, s] = 10.0
        a = model.blocks[1].attn
        for W in (a.W_Q, a.W_K, a.W_V):
            W[2] = 0.0
        for b in (a.b_Q, a.b_K, a.b_V):
            b[2] = 0.0
        a.b_Q[2, 0] = 20.0
        a.W_K[2, s, 0] = 1.0
        a.W_V[2, s, 0] = 1.0
        a.W_O[2, 0, r] = 50.0
        targets = held.tokens[:, 2:].flatten()
        p = torch.bincount(targets, minlength=cfg.vocab + 2).double() + 1e-3
        model.unembed.W_U.zero_()
        model.unembed.b_U.zero_()
        model.unembed.W_U[r] = (p / p.sum()).log().float() / (d - 1) ** 0.5  # the normalised r-coordinate
    return model


@needs("can_train", why="a model built as sinkmech.train builds it")
def test_a_planted_sink_head_ranks_first_and_carries_the_whole_cost(tmp_path):
    from sinkmech.studies.text_bos_cost import bos_cost_findings, checkpoint_bos_cost, text_windows
    from sinkmech.train.config import TrainConfig
    from sinkmech.train.run import save_checkpoint

    cfg = TrainConfig(**TEXT_CFG, positional="none")
    _, held = text_windows(cfg, n_select=4, n_eval=16)
    save_checkpoint(planted_bos_reader(cfg, held), cfg, tmp_path / "planted")
    scores = [[0.1] * 4, [0.1, 0.1, 0.9, 0.1]]  # the run's log: L1.H2 is its strongest sink head
    (tmp_path / "planted" / "log.json").write_text(json.dumps({"evals": [{"conditions": {"prepend": {"head_scores": scores}}}]}))
    out = checkpoint_bos_cost(tmp_path / "planted", n_select=4, n_eval=16, ks=[1, 8],
                              options=RunOptions(progress=False, device="cpu"))
    assert out["run"] == "planted" and out["content_tokens"] == 31 and out["n_layers"] == 2
    assert out["select"]["top"][0]["head"] == "L1.H2"
    assert abs(out["select"]["top"][1]["loss_change"][0]) < 1e-6  # the other heads write nothing
    e = out["eval"]
    assert e["no_bos"][1] > 0.1  # the loss rises without <bos> ...
    assert e["top_k"]["1"]["share"][0] == pytest.approx(1.0, abs=1e-4)  # ... all of it through L1.H2's key 0
    assert e["top_k"]["1"]["share"][1] > 0.99
    assert out["sink_head"] == {"head": "L1.H2", "alpha_0": 0.9, "loss_rank": 1}
    sets = e["head_sets"]
    assert sets["sink_head"]["share"][0] == pytest.approx(1.0, abs=1e-4) and len(sets["other_heads"]["heads"]) == 7
    assert abs(sets["other_heads"]["share"][0]) < 1e-6  # the heads that write nothing carry none of it
    flat = bos_cost_findings({"planted": out})
    assert flat["train.text.bos_cost.planted.eval.top_k.1.heads.0"] == "L1.H2"
    assert flat["train.text.bos_cost.planted.eval.top_k.1.share_detectable"] is True
    assert flat["train.text.bos_cost.planted.eval.head_sets.other_heads.share_detectable"] is False


@needs("can_train", why="a model built as sinkmech.train builds it")
def test_a_bos_cost_that_no_head_carries_has_a_share_of_zero():
    """Planted null: learned positions carry the whole cost (each position
    predicts the token it expects next, so removing `<bos>` puts every
    prediction one step off) and no head writes anything: every head's share
    is 0 while the loss without `<bos>` rises by nats."""
    from sinkmech.studies.bos_cost import bos_cost_batches
    from sinkmech.studies.text_bos_cost import with_fixed_bos
    from sinkmech.train.config import TrainConfig
    from sinkmech.train.model import build_model

    cfg = TrainConfig(**{**TEXT_CFG, "positional": "standard"})
    model = build_model(cfg, "cpu")
    m = 8
    with torch.no_grad():
        for block in model.blocks:
            block.attn.W_O.zero_()
            block.mlp.W_out.zero_()
        model.embed.W_E.zero_()
        model.pos_embed.W_pos.zero_()
        model.pos_embed.W_pos[torch.arange(32), torch.arange(32) % m] = 5.0  # position p: token p mod 8 comes next
        model.unembed.W_U.zero_()
        model.unembed.W_U[torch.arange(m), torch.arange(m)] = 3.0
    windows = (torch.arange(31) % m).repeat(6, 1)  # content token j is j mod 8
    out = bos_cost_batches(model, with_fixed_bos(windows[:2], cfg.bos_id), with_fixed_bos(windows[2:], cfg.bos_id),
                           ks=[1, 8], options=QUIET)["eval"]
    assert out["no_bos"][0] > 1.0
    for k in ("1", "8"):
        share = out["top_k"][k]["share"]
        assert share[1] <= 0.0 <= share[2] and abs(share[0]) < 1e-6


def test_the_sink_head_is_the_largest_alpha_0_and_its_place_in_the_loss_ranking():
    from sinkmech.studies.text_bos_cost import sink_head

    log = {"evals": [{"conditions": {"prepend": {"head_scores": [[0.9, 0.1]]}}},
                     {"conditions": {"prepend": {"head_scores": [[0.1, 0.2], [0.7, 0.05]]}}}]}
    assert sink_head(log, ["L0.H1", "L1.H0", "L0.H0"]) == {"head": "L1.H0", "alpha_0": 0.7, "loss_rank": 2}
    assert sink_head(log, ["L0.H1"])["loss_rank"] is None


def test_the_study_runs_from_its_config(tiny_model, monkeypatch):
    """`run` records its config, reports every k up to the model's heads (none picked)
    and writes its findings under <model>.bos_cost."""
    from sinkmech.studies.bos_cost import run
    from sinkmech.studies.configs import BosCostConfig

    from helpers.tiny import serve_windows

    serve_windows(monkeypatch, 8)
    monkeypatch.setattr("sinkmech.loading.models.bos_token_id", lambda model: TINY_BOS)
    config = BosCostConfig(models=("tiny",), select=2, eval=4, max_tokens=7, ks=(1, 4, 16))
    result = run(tiny_model, config, QUIET)
    d = result.to_dict()
    assert d["config"] == config.to_dict()
    assert set(d["tiny"]["eval"]["top_k"]) == {"1", "4"}  # the tiny model has 8 heads
    assert "tiny.bos_cost.eval.no_bos.0" in result.findings()["tiny.bos_cost"]
    # held-out prompts 2..5 come from documents d1, d1, d2, d2: the intervals resample 2 documents
    assert d["tiny"]["eval"]["n_documents"] == 2 and "over the 2 documents" in d["tiny"]["eval"]["interval"]
