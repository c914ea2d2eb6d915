"""The <bos> cost the sink heads carry: per-head loss changes against the
ablation sweep's own code path, a planted null head, and the held-out split."""

from __future__ import annotations

import pytest
import torch

from conftest import NEEDS_HOOKED, TINY_BOS, WordTokenizer
from sinkmech.controls.bos_cost import ablated_prompt_losses, bos_cost, head_loss_changes
from sinkmech.interventions.ablation import head_ablations
from sinkmech.prompts import tokenize


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
    res = head_loss_changes(tiny_model, batch, progress=False)
    ref = head_ablations(tiny_model, batch, mode="mask_first",
                         metric=summed_nll(batch.tokens, batch.offset, batch.lengths), progress=False)
    assert torch.allclose(res.changes.sum(0).float(), ref.effects - ref.baseline, atol=1e-3)
    assert res.clean.sum() == pytest.approx(ref.baseline, rel=1e-5)
    assert res.targets.tolist() == [7, 7, 7]
    l, h = res.ranking()[0]
    assert res.mean_changes()[l, h] == res.mean_changes().max()


@NEEDS_HOOKED
def test_a_head_that_writes_nothing_costs_nothing(tiny_tokens):
    """Planted null: L1.H2 with W_O = 0 changes no loss when masked; the others do."""
    from conftest import make_tiny

    model = make_tiny(seed=3)
    with torch.no_grad():
        model.blocks[1].attn.W_O[2] = 0.0
    res = head_loss_changes(model, tiny_tokens[:2, :8].tolist(), bos_token_id=TINY_BOS, progress=False)
    assert res.changes[:, 1, 2].abs().max() < 1e-6
    assert res.changes.abs().flatten(1).max(1).values.min() > 1e-4


def test_bos_cost_ranks_on_one_set_and_measures_on_another(tiny_model, tiny_tokens):
    rows = tiny_tokens[:, :8].tolist()
    out = bos_cost(tiny_model, rows, select_prompts=2, eval_prompts=4, ks=[1, 8], bos_token_id=TINY_BOS,
                   progress=False)
    assert out["select"]["n_prompts"] == 2 and out["eval"]["n_prompts"] == 4
    held = tokenize(tiny_model, rows[2:6], bos="prepend", bos_token_id=TINY_BOS)
    none = tokenize(tiny_model, rows[2:6], bos="none")
    clean = ablated_prompt_losses(tiny_model, held, [])
    gap = ablated_prompt_losses(tiny_model, none, []) - clean
    assert out["eval"]["no_bos"][0] == pytest.approx(float(gap.sum() / (7 * 4)))
    eight = out["eval"]["top_k"]["8"]
    assert len(eight["heads"]) == 8 and eight["heads"][0] == out["select"]["top"][0]["head"]
    assert eight["share"][0] == pytest.approx(eight["loss_change"][0] / out["eval"]["no_bos"][0])
    with pytest.raises(ValueError, match="fewer than"):
        bos_cost(tiny_model, rows, select_prompts=4, eval_prompts=4, ks=[1], bos_token_id=TINY_BOS, progress=False)
    with pytest.raises(ValueError, match="ks must be"):
        bos_cost(tiny_model, rows, select_prompts=2, eval_prompts=2, ks=[9], bos_token_id=TINY_BOS, progress=False)


def test_ablate_metric_loss_cli(monkeypatch, tmp_path, capsys):
    """`ablate --metric loss`: the JSON holds each head's loss change (nats per
    content target), equal to head_loss_changes on the same prompts."""
    import json

    from conftest import make_tiny, toy_tokenizer
    from sinkmech.cli.main import main

    model = make_tiny(7)
    toy_tokenizer(monkeypatch, model, WordTokenizer())
    monkeypatch.setattr("sinkmech.loading.models.load_model", lambda spec, **kw: model)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the cat sat on the warm mat today\na cat ran far away from the big dog\n")
    out = tmp_path / "loss.json"
    assert main(["ablate", "--metric", "loss", "--prompts", str(prompts), "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    want = head_loss_changes(model, [p for p in prompts.read_text().splitlines()], progress=False)
    assert d["metric"] == "loss" and d["mode"] == "mask_first"
    assert torch.allclose(torch.tensor(d["effects"]), want.mean_changes().float(), atol=1e-6)
    assert "nats per target" in capsys.readouterr().out
    part = tmp_path / "loss.partial.json"
    assert main(["ablate", "--metric", "loss", "--prompts", str(prompts), "--shard", "1/2", "--json", str(part)]) == 2
    assert "--metric loss runs in one process" in capsys.readouterr().err
