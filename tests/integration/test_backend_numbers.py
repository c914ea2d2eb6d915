"""The same numbers on every backend: heads, ablate, patch,
perturb and massive on tiny random models of several architectures (local
Hugging Face folders), each against transformers' own eager forward pass with
the intervention written directly on the Hugging Face modules (no TransformerLens
involved in the reference). Whichever backend this environment has
(HookedTransformer on TransformerLens 3.9, TransformerBridge on 4.x) must give
transformers' numbers."""

from __future__ import annotations

import pytest
import torch

from helpers.backends import loads_folder
from sinkmech.dormant.scan import scan_heads
from sinkmech.interventions.ablation import head_ablations
from sinkmech.interventions.patching import bos_pair, patch
from sinkmech.measures.massive import massive_dims
from sinkmech.loading.models import load_model
from sinkmech.interventions.perturb import TokenSwap, perturbation_spread
from sinkmech.prompts import tokenize
from helpers.tiny_hf import ARCHS, BOS, save_tiny
from sinkmech.options import QUIET, RunOptions

N_PROMPTS, N_CONTENT = 4, 10


@pytest.fixture(scope="module", params=[pytest.param(a, marks=loads_folder(a)) for a in ARCHS])
def both(request, tmp_path_factory):
    """(sinkmech's model, transformers' eager model) over one tiny folder, and content rows."""
    from transformers import AutoModelForCausalLM

    arch = request.param
    folder = save_tiny(tmp_path_factory.mktemp(arch), arch, seed=7, n_kv=2)
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, attn_implementation="eager").eval()
    g = torch.Generator().manual_seed(11)
    rows = torch.randint(3, 50, (N_PROMPTS, N_CONTENT), generator=g).tolist()
    return arch, load_model(str(folder), device="cpu"), hf, rows


def _layers(hf):
    return hf.model.layers


def _hidden(out):
    return out[0] if isinstance(out, tuple) else out


def hf_run(hf, tokens, *, layer_input=None, o_proj=None):
    """One eager forward pass with the residual stream entering each layer and
    leaving the last recorded ([n_layers + 1] of [batch pos d_model]).

    layer_input: (l, f) replaces the hidden states entering layer l by f(h).
    o_proj: (l, f) replaces the input of layer l's output projection (the heads'
    concatenated outputs, [batch pos n_heads * d_head]) by f(x).
    """
    resid, handles = [], []
    layers = _layers(hf)

    def pre(l):
        def hook(module, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            if layer_input is not None and layer_input[0] == l:
                h = layer_input[1](h)
                if args:
                    args = (h, *args[1:])
                else:
                    kwargs = {**kwargs, "hidden_states": h}
            resid.append(h.detach().clone())
            return args, kwargs

        return hook

    for l, block in enumerate(layers):
        handles.append(block.register_forward_pre_hook(pre(l), with_kwargs=True))
    handles.append(layers[-1].register_forward_hook(lambda m, a, out: resid.append(_hidden(out).detach().clone())))
    if o_proj is not None:
        l, f = o_proj
        handles.append(layers[l].self_attn.o_proj.register_forward_pre_hook(lambda m, args: (f(args[0]),)))
    try:
        with torch.no_grad():
            out = hf(torch.as_tensor(tokens), output_attentions=True)
    finally:
        for h in handles:
            h.remove()
    return out.logits.float(), list(out.attentions), resid


def mean_kl(reference, logits):
    """Mean over positions of KL(reference || logits), both [batch pos vocab]."""
    ref = torch.log_softmax(reference.float(), -1)
    lp = torch.log_softmax(logits.float(), -1)
    return float((ref.exp() * (ref - lp)).sum(-1).mean())


def test_heads_profile_matches_eager_attention(both):
    """The head scan's first-key attention (queries >= 1) and dormant fraction."""
    arch, model, hf, rows = both
    batch = tokenize(model, rows, bos="prepend", bos_token_id=BOS)
    scan = scan_heads(model, batch, sweep=False, n_boot=0, options=QUIET)
    _, attns, _ = hf_run(hf, batch.tokens)
    first = torch.stack([a[:, :, 1:, 0] for a in attns], 1)  # [prompt layer head query]
    ref_mean = first.mean((0, 3))
    assert (scan.first_key_attention_excl_q0 - ref_mean).abs().max() < 1e-5, arch
    ref_dormant = (first >= scan.thresholds.high).float().mean((0, 3))  # the scan's own cut
    assert torch.allclose(scan.dormant_fraction, ref_dormant, atol=1e-6), arch


def test_zero_ablation_matches_eager_with_the_head_cut_out(both):
    """Every head's `zero` ablation effect (mean KL against the clean run) equals
    transformers' with that head's slice of the output projection's input zeroed."""
    arch, model, hf, rows = both
    batch = tokenize(model, rows, bos="prepend", bos_token_id=BOS)
    ours = head_ablations(model, batch, mode="zero", options=QUIET).effects
    clean, _, _ = hf_run(hf, batch.tokens)
    d_head = model.cfg.d_head
    ref = torch.zeros_like(ours)
    for l in range(model.cfg.n_layers):
        for h in range(model.cfg.n_heads):
            def cut(x, h=h):
                x = x.clone()
                x[..., h * d_head : (h + 1) * d_head] = 0.0
                return x

            logits, _, _ = hf_run(hf, batch.tokens, o_proj=(l, cut))
            ref[l, h] = mean_kl(clean[:, 1:], logits[:, 1:])
    assert ours.abs().max() > 1e-4, arch  # the heads do something
    assert torch.allclose(ours, ref, rtol=1e-3, atol=1e-6), (arch, ours, ref)


def test_resid_patch_matches_eager_with_the_hidden_state_replaced(both):
    """Patching the residual stream entering each layer (and the one between
    attention and MLP, by the seam's translation on the Bridge) from the `<bos>`
    run into the run without it, all content positions at once."""
    arch, model, hf, rows = both
    pair = bos_pair(model, rows, bos_token_id=BOS)
    src_logits, _, src_resid = hf_run(hf, pair.with_bos.tokens)
    reference = src_logits[:, 1:]
    ours = patch(model, pair, act="resid_pre", by="layer", source="prepend", options=QUIET).values
    for l in range(model.cfg.n_layers):
        logits, _, _ = hf_run(hf, pair.without_bos.tokens, layer_input=(l, lambda h, l=l: src_resid[l][:, 1:].clone()))
        assert abs(float(ours[l]) - mean_kl(reference, logits)) < 1e-5 * max(1.0, mean_kl(reference, logits)), (arch, l)
    # resid_mid of the last layer with every content position set to the source's:
    # what follows (MLP, final norm, unembedding) acts per position, so the run gives
    # the source's logits (KL 0) only if the write reaches the residual stream (on the
    # Bridge, through the seam's translation of hook_resid_mid).
    mid = patch(model, pair, act="resid_mid", by="layer", source="prepend", options=QUIET)
    assert mid.baseline > 1e-3 and float(mid.values[-1]) < 1e-5, arch


def test_perturbation_spread_matches_eager_hidden_states(both):
    arch, model, hf, rows = both
    swap = TokenSwap([rows[0][3]], [3 if rows[0][3] != 3 else 4], position=3)
    one = [rows[0]]
    spread = perturbation_spread(model, one, perturbation=swap, options=RunOptions(progress=False, bos_token_id=BOS))
    swapped = [one[0][:3] + list(swap.replacement) + one[0][4:]]
    for c, cond in enumerate(spread.conditions):
        pre = [BOS] if cond == "prepend" else []
        _, _, clean = hf_run(hf, [pre + one[0]])
        _, _, moved = hf_run(hf, [pre + swapped[0]])
        off = len(pre)
        for l in range(model.cfg.n_layers + 1):
            h, h2 = clean[l][0, off:], moved[l][0, off:]
            ref = (h2 - h).norm(dim=-1) / h.norm(dim=-1)
            assert torch.allclose(spread.change[c, 0, l], ref, rtol=1e-4, atol=1e-6), (arch, cond, l)


def test_massive_dims_match_eager_hidden_states(both):
    arch, model, hf, rows = both
    batch = tokenize(model, rows, bos="prepend", bos_token_id=BOS)
    ours = massive_dims(model, batch, options=QUIET)
    _, _, resid = hf_run(hf, batch.tokens)
    for l, h in enumerate(resid):
        first = h[:, 0].abs().mean(0)
        assert torch.allclose(ours.first_abs[l], first, rtol=1e-4, atol=1e-6), (arch, l)
        ratio = h[:, 0].norm(dim=-1).mean() / h[:, 1:].norm(dim=-1).mean()
        assert float(ours.norm_ratio[l]) == pytest.approx(float(ratio), rel=1e-4), (arch, l)
