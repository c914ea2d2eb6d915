"""Any architecture a researcher brings: tiny random Hugging Face folders of
fifteen architectures (`tiny_hf.MATRIX`: sliding windows, attention and logit
soft-caps, Granite's logit scaling, mixtures of experts, gpt-oss's learned sink
logits), each against transformers run directly on the same ids with eager
attention: alpha_0, the learned sink's mass, the log-probabilities of the
model's own readout, the loss, one mask_first KL and (gpt-oss) one drop_sink KL.

Every architecture runs on the TransformerBridge (TransformerLens 4); on
TransformerLens 3.9 those it loads must agree the same way, and the others are
refused in one line that names the backend that loads them.
"""

from __future__ import annotations

import sys

import pytest
import torch

from helpers.backends import TL39_LOADS, loads_folder, needs
from sinkmech.loading.backend import forward, learned_sinks, unembed
from sinkmech.cli import main
from sinkmech.interventions.ablation import head_ablations
from sinkmech.measures.loss import content_loss
from sinkmech.loading.models import load_model
from sinkmech.prompts import tokenize
from sinkmech.measures.sinks import sink_scores
from helpers.tiny_hf import BOS, MATRIX, save_tiny
from sinkmech.options import QUIET, RunOptions
from helpers.reference import loop_ablations

LAYER, HEAD = 1, 1  # the head ablated against transformers (layer 1: after a window or a full layer)


def _rows(seed: int = 0, batch: int = 4, n: int = 12) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 50, (batch, n), generator=g).tolist()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Every architecture's folder, built once for the module."""
    root = tmp_path_factory.mktemp("archs")
    return {arch: save_tiny(root / arch, arch, seed=3, n_kv=2) for arch in MATRIX}


@pytest.fixture(scope="module", params=[pytest.param(a, marks=loads_folder(a)) for a in MATRIX])
def arch_model(request, folders):
    arch = request.param
    return arch, folders[arch], load_model(str(folders[arch]), device="cpu")


def _hf(folder, attn: str = "eager"):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, attn_implementation=attn).eval()


def _mean_kl(clean: torch.Tensor, ablated: torch.Tensor, offset: int) -> float:
    """Mean KL(clean || ablated) over content positions (every row is real here)."""
    p, q = torch.log_softmax(clean.double(), -1), torch.log_softmax(ablated.double(), -1)
    return float((p.exp() * (p - q)).sum(-1)[:, offset:].mean())


@pytest.mark.parametrize("bos", ["prepend", "none"])
def test_alpha_0_sink_mass_readout_and_loss_match_transformers(arch_model, bos):
    arch, folder, model = arch_model
    batch = tokenize(model, _rows(), bos=bos, bos_token_id=BOS)
    ours = sink_scores(model, batch, loss=True, options=QUIET)
    with torch.no_grad():
        out = _hf(folder)(batch.tokens, output_attentions=True)
        last = forward(model, batch.tokens, stop_at_layer=model.cfg.n_layers)
        readout = torch.log_softmax(unembed(model, last).float(), -1)
    ref_lp = torch.log_softmax(out.logits.float(), -1)
    # the model's own logits from its last residual: final norm, unembedding, soft-cap, logits_scaling
    assert (readout - ref_lp).abs().max() < 1e-4, arch
    # alpha_0: mean over the real queries (no padding here) of the attention on key 0
    alpha = torch.stack([a[:, :, :, 0].mean(-1) for a in out.attentions], dim=1)
    assert (ours.scores - alpha).abs().max() < 1e-5, arch
    # transformers' attentions drop the sink column: what is missing from a row is the sink's
    sink = torch.stack([(1.0 - a.sum(-1)).mean(-1) for a in out.attentions], dim=1)
    if arch == "gpt_oss":
        assert sink.min() > 0.01  # the planted sinks take a visible share: the check can fail
        assert (ours.learned_sink_scores - sink).abs().max() < 1e-5
        assert ((ours.scores + ours.learned_sink_scores) <= 1 + 1e-6).all()
        assert learned_sinks(model).shape == (model.cfg.n_layers, model.cfg.n_heads)
    else:
        assert sink.abs().max() < 1e-5
        assert ours.learned_sink_scores is None and learned_sinks(model) is None
        assert "learned_sink_scores" not in ours.to_dict()
    off = batch.offset
    nll = -ref_lp[:, off:-1].gather(-1, batch.tokens[:, off + 1 :, None])[..., 0]
    assert abs(ours.loss - float(nll.mean())) < 1e-5, arch
    assert abs(content_loss(model, batch) - float(nll.mean())) < 1e-5, arch


def _masked_first_attention(layer: int, head: int):
    """transformers' own eager attention of each module, with `head` of `layer`
    unable to attend to key 0 (query 0 keeps it): the causal mask widened to one
    row of heads, that head's key-0 column at -inf. A learned sink, added after
    the mask, stays."""

    def attention(module, query, key, value, attention_mask, **kwargs):
        eager = sys.modules[type(module).__module__].eager_attention_forward
        if getattr(module, "layer_idx", None) == layer:
            B, H, Q = query.shape[0], query.shape[1], query.shape[2]
            mask = attention_mask[:, :, :, : key.shape[-2]].expand(B, H, Q, key.shape[-2]).clone()
            mask[:, head, 1:, 0] = float("-inf")
            attention_mask = mask
        return eager(module, query, key, value, attention_mask, **kwargs)

    return attention


def test_mask_first_kl_matches_transformers(arch_model):
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    arch, folder, model = arch_model
    batch = tokenize(model, _rows(1, batch=3, n=10), bos="prepend", bos_token_id=BOS)
    ours = head_ablations(model, batch, mode="mask_first", layers=[LAYER], heads=[HEAD], options=QUIET)
    AttentionInterface.register("sinkmech_mask_first", _masked_first_attention(LAYER, HEAD))
    AttentionMaskInterface.register("sinkmech_mask_first", eager_mask)  # eager's masks (windows included)
    with torch.no_grad():
        clean = _hf(folder)(batch.tokens).logits
        ablated = _hf(folder, "sinkmech_mask_first")(batch.tokens).logits
    ref = _mean_kl(clean, ablated, batch.offset)
    assert ref > 1e-5, arch  # the masked head matters: the comparison can fail
    assert abs(float(ours.effects[0, 0]) - ref) <= 1e-4 * ref + 1e-7, arch


@loads_folder("gpt_oss")
def test_drop_sink_kl_matches_transformers_with_the_sink_logit_removed(folders):
    """gpt-oss: drop_sink for one head equals transformers with that head's sink
    logit set to -inf; every head's effect is positive (each sink held mass)."""
    folder = folders["gpt_oss"]
    model = load_model(str(folder), device="cpu")
    batch = tokenize(model, _rows(2, batch=3, n=10), bos="prepend", bos_token_id=BOS)
    ours = head_ablations(model, batch, mode="drop_sink", options=QUIET)
    loop = loop_ablations(model, batch, mode="drop_sink")
    assert (ours.effects - loop.effects).abs().max() < 1e-6
    assert (ours.effects > 0).all()
    hf = _hf(folder)
    with torch.no_grad():
        clean = hf(batch.tokens).logits
        hf.model.layers[LAYER].self_attn.sinks[HEAD] = float("-inf")
        ablated = hf(batch.tokens).logits
    ref = _mean_kl(clean, ablated, batch.offset)
    assert abs(float(ours.effects[LAYER, HEAD]) - ref) <= 1e-4 * ref + 1e-7


def _prompt_file(tmp_path, rows: list[list[int]]):
    path = tmp_path / "prompts.txt"
    path.write_text("".join(" ".join(f"w{t}" for t in row) + "\n" for row in rows))
    return str(path)


def test_drop_sink_is_refused_for_a_model_without_learned_sinks(folders, tmp_path, capsys):
    model = load_model(str(folders["llama"]), device="cpu")
    with pytest.raises(ValueError, match="has no learned sink logits"):
        head_ablations(model, _rows(), mode="drop_sink", options=RunOptions(progress=False, bos_token_id=BOS))
    prompts = _prompt_file(tmp_path, _rows(batch=2))
    # from the CLI before the model loads: the folder's weights hold no `sinks` tensor
    from sinkmech.loading import models

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(models, "load_model", lambda *a, **k: pytest.fail("loaded a model"))
        for spec in (str(folders["llama"]), "smollm2"):
            assert main(["ablate", "--model", spec, "--mode", "drop_sink", "--prompts", prompts]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and err[0].startswith("error: --mode drop_sink") and "learned sink" in err[0]


@loads_folder("gpt_oss")
def test_gpt_oss_through_the_cli(folders, tmp_path, capsys):
    """`sinks --bos both --json -` carries learned_sink_scores per condition (the
    library's numbers); `ablate --mode drop_sink` runs and lists heads."""
    import json

    folder, rows = str(folders["gpt_oss"]), _rows(3, batch=3, n=8)
    prompts = _prompt_file(tmp_path, rows)
    assert main(["sinks", "--model", folder, "--prompts", prompts, "--bos", "both", "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    model = load_model(folder, device="cpu")
    for bos in ("prepend", "none"):
        ours = sink_scores(model, rows, bos=bos, options=RunOptions(progress=False, bos_token_id=BOS))
        cli = torch.tensor(out["conditions"][bos]["learned_sink_scores"])
        assert cli.shape == (2, 4) and torch.allclose(cli, ours.learned_sink_scores.mean(0), atol=1e-6)
    assert main(["ablate", "--model", folder, "--prompts", prompts, "--mode", "drop_sink", "--json", "-"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["mode"] == "drop_sink" and (torch.tensor(result["effects"]) > 0).all()


@needs(any_architecture=False, why="TransformerLens 3.9's refusals; the Bridge loads every architecture here")
@pytest.mark.parametrize("arch", sorted(set(MATRIX) - TL39_LOADS))
def test_tl39_refuses_in_one_line_naming_the_bridge(folders, arch, capsys):
    with pytest.raises(ValueError, match="TransformerBridge backend loads it") as e:
        load_model(str(folders[arch]), device="cpu")
    assert "\n" not in str(e.value) and "TransformerLens 3.9 cannot load" in str(e.value)
    assert main(["sinks", "--model", str(folders[arch]), "--json", "-"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1


@loads_folder("gpt_oss")
def test_heads_counts_key_0_plus_the_learned_sink_as_dormant(folders):
    """gpt-oss: `heads` cuts on key 0 plus the learned sink's share, from
    transformers' own attention (every query after the first, as the scan's means)."""
    from sinkmech.dormant.scan import scan_heads

    folder = folders["gpt_oss"]
    model = load_model(str(folder), device="cpu")
    batch = tokenize(model, _rows(4, batch=4, n=12), bos="prepend", bos_token_id=BOS)
    scan = scan_heads(model, batch, sweep=False, n_boot=0, options=QUIET)
    with torch.no_grad():
        attns = _hf(folder)(batch.tokens, output_attentions=True).attentions
    mass = torch.stack([a[..., 0] + 1.0 - a.sum(-1) for a in attns], dim=1)[..., 1:]  # [prompt layer head query]
    key_0 = torch.stack([a[..., 0] for a in attns], dim=1)[..., 1:]
    assert (scan.first_key_attention_excl_q0 - mass.mean((0, 3))).abs().max() < 1e-5
    assert (scan.dormant_fraction - (mass >= 0.5).double().mean((0, 3))).abs().max() < 1e-6
    # key 0 alone would read less for every head: the comparison can fail
    assert (scan.first_key_attention_excl_q0 - key_0.mean((0, 3))).min() > 0.01


def test_row_check_admits_the_sink_share_and_catches_nan_inf_and_zero_rows():
    from sinkmech.measures.sinks import check_rows

    valid = torch.ones(1, 3)
    row = torch.tensor([0.5, 0.3, 0.1])  # sums to 0.9: the sink holds 0.1
    pattern = row.expand(1, 2, 3, 3).clone()
    check_rows(pattern, valid, 0, learned=True)
    with pytest.raises(FloatingPointError, match="do not sum to 1"):
        check_rows(pattern, valid, 0)
    for bad in (float("nan"), float("inf"), 0.0, 0.7):  # NaN, inf, a zeroed (NaN) row, a sum above 1
        broken = pattern.clone()
        broken[0, 1, 2] = bad if bad != 0.0 else 0.0 * broken[0, 1, 2]
        with pytest.raises(FloatingPointError, match="layer 0"):
            check_rows(broken, valid, 0, learned=True)
    padded = pattern.clone()
    padded[0, :, 2] = float("nan")  # a padding query: never checked
    check_rows(padded, torch.tensor([[1.0, 1.0, 0.0]]), 0, learned=True)


@loads_folder("gpt_oss")
def test_a_nan_sink_logit_is_caught_not_reported(folders):
    model = load_model(str(folders["gpt_oss"]), device="cpu")
    sinks = [p for n, p in model.named_parameters() if n.endswith("sinks")]
    assert len(sinks) == model.cfg.n_layers
    with torch.no_grad():
        sinks[1][2] = float("nan")
    with pytest.raises(FloatingPointError, match="layer 1"):
        sink_scores(model, _rows(), options=RunOptions(progress=False, bos_token_id=BOS))


@needs("any_architecture", why="the Bridge's load-time readout check")
def test_a_readout_that_misses_the_model_s_own_is_refused_at_load(folders, monkeypatch):
    """Granite divides its logits by `logits_scaling`; a readout that rebuilds
    the final norm and unembedding by hand misses it, and the load says so."""
    from sinkmech.loading import backend

    def by_hand(model, resid):
        return model.unembed(model.ln_final(resid))

    monkeypatch.setattr(backend, "unembed", by_hand)
    with pytest.raises(ValueError, match="cannot reproduce this architecture's readout"):
        load_model(str(folders["granite"]), device="cpu")
    load_model(str(folders["llama"]), device="cpu")  # where the hand-made readout is the model's, it loads

    def unfit(model, resid):
        raise AttributeError("'Model' has no attribute 'model'")

    monkeypatch.setattr(backend, "unembed", unfit)
    with pytest.raises(ValueError, match="cannot read the logits from the last block's output"):
        load_model(str(folders["llama"]), device="cpu")


@loads_folder("gpt_oss")
def test_gpt_oss_sink_shards_merge_to_the_unsharded_json(folders, tmp_path):
    """`sinks --shard i/2` parts carry the learned-sink mass; `merge` gives the
    whole run's `learned_sink_scores`."""
    import json

    args = ["sinks", "--model", str(folders["gpt_oss"]), "--prompts", _prompt_file(tmp_path, _rows(5, batch=4)),
            "--bos", "both"]
    whole, merged = tmp_path / "whole.json", tmp_path / "merged.json"
    assert main([*args, "--json", str(whole)]) == 0
    parts = [tmp_path / f"part{i}.partial.json" for i in (1, 2)]
    for i, p in enumerate(parts, 1):
        assert main([*args, "--shard", f"{i}/2", "--json", str(p)]) == 0
    assert main(["merge", *map(str, parts), "--json", str(merged)]) == 0
    a, b = json.loads(whole.read_text()), json.loads(merged.read_text())
    for c in ("prepend", "none"):
        x = torch.tensor(a["conditions"][c]["learned_sink_scores"])
        assert x.min() > 0.01 and torch.allclose(torch.tensor(b["conditions"][c]["learned_sink_scores"]), x, atol=1e-6)


@pytest.mark.parametrize("mode", ["mask_first", "drop_sink"])
@loads_folder("gpt_oss")
def test_attribution_s_ablated_output_is_the_hooked_run_s_on_gpt_oss(folders, mode):
    """What attribution patching takes as a head's ablated output (`ablated_z`)
    is exactly what the mode's hook makes the head write, sink share included."""
    from sinkmech.hooks import act_name, cached_run, drop_sink_hook, expand_kv, mask_first_hook
    from sinkmech.interventions.attribution import ablated_z

    model = load_model(str(folders["gpt_oss"]), device="cpu")
    tokens = torch.tensor(_rows(6, batch=2, n=9))
    names = [act_name(n, LAYER) for n in ("z", "pattern", "v")]
    _, clean = cached_run(model, tokens, names, stop_at_layer=LAYER + 1)
    hook = (mask_first_hook if mode == "mask_first" else drop_sink_hook)(HEAD)
    point = act_name("attn_scores" if mode == "mask_first" else "pattern", LAYER)
    _, hooked = cached_run(model, tokens, names[:1], [(point, hook)], stop_at_layer=LAYER + 1)
    z, pattern, v = (clean[n] for n in names)
    ours = ablated_z(mode, z, pattern, expand_kv(model, v), None)[:, :, HEAD]
    assert (ours - hooked[names[0]][:, :, HEAD]).abs().max() < 1e-5
    assert (ours - z[:, :, HEAD]).abs().max() > 1e-3  # the ablation changes the head: the check can fail


@loads_folder("gpt_oss")
def test_learned_sink_mass_in_the_long_table(folders):
    r = sink_scores(load_model(str(folders["gpt_oss"]), device="cpu"), _rows(),
                    options=RunOptions(progress=False, bos_token_id=BOS))
    df = r.to_dataframe()
    row = df[(df["prompt"] == 2) & (df["layer"] == 1) & (df["head"] == 3)].iloc[0]
    assert row.learned_sink_score == pytest.approx(float(r.learned_sink_scores[2, 1, 3]))
    assert "learned_sink_score" not in sink_scores(load_model(str(folders["llama"]), device="cpu"), _rows(),
                                                   options=RunOptions(progress=False, bos_token_id=BOS)).to_dataframe()
