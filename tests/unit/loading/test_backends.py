"""The model seam on whichever backend this environment has (HookedTransformer
on TransformerLens 3.9, TransformerBridge on 4.x): tiny random models of four
architectures, saved as local Hugging Face folders, against transformers'
own eager attention; dtype and device; `sinkmech --version`."""

from __future__ import annotations

import pytest
import torch

from helpers.backends import loads_folder
from sinkmech.loading.backend import BACKEND, W_O, W_V, b_V, forward, unembed, version_text
from sinkmech.cli import main
from sinkmech.hooks import cached_run
from sinkmech.measures.loss import content_loss
from sinkmech.loading.models import check_dtype, load_model
from sinkmech.prompts import tokenize
from sinkmech.measures.sinks import sink_scores
from helpers.tiny_hf import ARCHS, BOS, eager_reference, save_tiny
from sinkmech.options import QUIET, RunOptions


def _tokens(seed: int = 0, batch: int = 5, n: int = 12) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 50, (batch, n), generator=g).tolist()


@pytest.fixture(scope="module", params=[pytest.param(a, marks=loads_folder(a)) for a in ARCHS])
def tiny_folder(request, tmp_path_factory):
    arch = request.param
    return arch, save_tiny(tmp_path_factory.mktemp(arch), arch, seed=3, n_kv=2)


@pytest.mark.parametrize("bos", ["prepend", "none"])
def test_sink_scores_and_loss_match_transformers_eager_attention(tiny_folder, bos):
    arch, folder = tiny_folder
    model = load_model(str(folder), device="cpu")
    batch = tokenize(model, _tokens(), bos=bos, bos_token_id=BOS)
    ours = sink_scores(model, batch, loss=True, options=QUIET)
    attns, logprobs = eager_reference(folder, batch.tokens)
    # alpha_0: mean over real queries of the attention on key 0 (no padding here).
    ref = torch.stack([a[:, :, :, 0].mean(-1) for a in attns], dim=1)  # [prompt layer head]
    assert (ours.scores - ref).abs().max() < 1e-5, arch
    # the same targets in both conditions: content tokens 1..n-1
    off = batch.offset
    targets = batch.tokens[:, off + 1 :]
    lp = logprobs[:, off : -1].gather(-1, targets[..., None])[..., 0]
    assert abs(ours.loss - float(-lp.mean())) < 1e-4, arch
    assert abs(content_loss(model, batch) - float(-lp.mean())) < 1e-4, arch


def test_forward_starts_and_stops_at_a_layer(tiny_folder):
    """stop_at_layer=n_layers gives the last block's output (no unembedding);
    restarting from any layer's input gives the full pass's log-probabilities."""
    _, folder = tiny_folder
    model = load_model(str(folder), device="cpu")
    tokens = torch.tensor(_tokens(1, batch=2, n=9))
    L = model.cfg.n_layers
    names = [f"blocks.{l}.hook_resid_pre" for l in range(L)] + [f"blocks.{L - 1}.hook_resid_post"]
    logits, cache = cached_run(model, tokens, names)
    full = torch.log_softmax(logits.float(), -1)
    with torch.no_grad():
        last = forward(model, tokens, stop_at_layer=L)
        assert last.shape == (2, 9, model.cfg.d_model)
        assert torch.allclose(last, cache[names[-1]], atol=1e-6)
        assert torch.allclose(torch.log_softmax(unembed(model, last).float(), -1), full, atol=1e-5)
        for l in range(L):
            again = forward(model, cache[names[l]], start_at_layer=l)
            assert torch.allclose(torch.log_softmax(again.float(), -1), full, atol=1e-5), l


def test_weights_keep_key_value_heads_unexpanded(tiny_folder):
    _, folder = tiny_folder
    model = load_model(str(folder), device="cpu")
    cfg = model.cfg
    assert W_O(model).shape == (cfg.n_layers, cfg.n_heads, cfg.d_head, cfg.d_model)
    assert W_V(model).shape == (cfg.n_layers, 2, cfg.d_model, cfg.d_head)  # n_kv = 2
    assert b_V(model).shape == (cfg.n_layers, 2, cfg.d_head)


def test_bfloat16_holds_alpha_0_within_1e_2(tmp_path):
    folder = save_tiny(tmp_path / "llama", "llama", seed=5)
    prompts = _tokens(2, batch=6, n=16)
    f32 = sink_scores(load_model(str(folder), device="cpu"), prompts,
                      options=RunOptions(progress=False, bos_token_id=BOS))
    bf16_model = load_model(str(folder), device="cpu", dtype="bfloat16")
    assert next(bf16_model.parameters()).dtype == torch.bfloat16
    bf16 = sink_scores(bf16_model, prompts, options=RunOptions(progress=False, bos_token_id=BOS))
    assert bf16.scores.dtype == torch.float32  # reductions accumulate in float32
    assert (bf16.scores - f32.scores).abs().max() < 1e-2


def test_bfloat16_loss_and_perturbation_stay_near_float32(tmp_path):
    """A bfloat16 model's loss, attention entropies and residual changes (all
    reduced in float32) agree with the float32 model's within bfloat16's rounding
    of the activations (8 bits of mantissa). At 17 positions this bounds the
    total error; it cannot tell a float32 sum from a bfloat16 one (too few terms)."""
    from sinkmech.interventions.perturb import EmbeddingNoise, perturbation_spread

    folder = save_tiny(tmp_path / "llama", "llama", seed=6)
    rows = _tokens(4, batch=4, n=16)
    f32, bf16 = load_model(str(folder), device="cpu"), load_model(str(folder), device="cpu", dtype="bfloat16")
    batch = tokenize(f32, rows, bos="prepend", bos_token_id=BOS)
    assert abs(content_loss(bf16, batch) - content_loss(f32, batch)) < 2e-2
    noise = EmbeddingNoise(scale=0.5, position=4)
    a = perturbation_spread(f32, rows, perturbation=noise, options=RunOptions(progress=False, bos_token_id=BOS))
    b = perturbation_spread(bf16, rows, perturbation=noise, options=RunOptions(progress=False, bos_token_id=BOS))
    assert b.change.dtype == b.normalized_entropy.dtype == torch.float32
    assert (b.normalized_entropy - a.normalized_entropy).abs().max() < 1e-2
    reached = a.change[..., 4:]  # the noised position and later: changes of order 0.1-1
    assert torch.allclose(b.change[..., 4:], reached, rtol=5e-2, atol=2e-2)


def test_bad_dtype_and_device_are_refused_before_loading(capsys, monkeypatch):
    from sinkmech.loading import models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("loaded a model"))
    assert main(["sinks", "--device", "nonsense"]) == 2
    assert "error: --device" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["sinks", "--dtype", "float64"])
    assert e.value.code == 2
    with pytest.raises(ValueError, match="dtype must be one of"):
        check_dtype("int8")


def test_version_names_the_backend(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.strip() == version_text()
    assert f"backend {BACKEND}" in out and "TransformerLens " in out and "torch " in out and "device " in out


@pytest.fixture(scope="module")
def gemma_eager():
    """transformers' own Gemma 3 270M from the same GGUF, eager attention (read once)."""
    from transformers import AutoModelForCausalLM

    from sinkmech.loading.models import packaged_gguf_path

    path = packaged_gguf_path("gemma3-270m")
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                                attn_implementation="eager").eval()


@pytest.mark.slow
@pytest.mark.parametrize("bos", ["prepend", "none"])
def test_gemma_matches_transformers_eager_attention_on_unchosen_prompts(gemma, gemma_eager, bos):
    """The backend acceptance check: Gemma 3 270M's alpha_0
    within 2e-3, sink rates within 0.5 points, loss within 0.1 nats of
    transformers' own eager attention on the same GGUF, on default-corpus
    windows 100-111 (picked by index, not by result)."""
    from sinkmech.prompts import default_corpus

    prompts = default_corpus()[100:112]
    batch = tokenize(gemma, prompts, bos=bos, max_tokens=48)
    ours = sink_scores(gemma, batch, loss=True, options=RunOptions(batch_size=4, progress=False))
    hf = gemma_eager
    ref = torch.zeros_like(ours.scores)
    nll, n = 0.0, 0
    with torch.no_grad():
        for i in range(len(batch)):
            T = int(batch.lengths[i])
            out = hf(batch.tokens[i : i + 1, :T], output_attentions=True)
            ref[i] = torch.stack([a[0, :, :, 0].mean(-1) for a in out.attentions])
            lp = torch.log_softmax(out.logits[0].float(), -1)
            tgt = batch.tokens[i, batch.offset + 1 : T]
            nll -= float(lp[batch.offset : T - 1].gather(-1, tgt[:, None]).sum())
            n += len(tgt)
    assert (ours.scores - ref).abs().max() < 2e-3
    for eps in (0.3, 0.8):
        rate = 100.0 * (ref > eps).float().mean().item()
        assert abs(ours.sink_rate(eps) - rate) < 0.5, eps
    assert abs(ours.loss - nll / n) < 0.1


def test_gemma_bfloat16_holds_sink_rates_within_2_points(gemma):
    from sinkmech.loading.models import load_model as load
    from sinkmech.prompts import default_corpus

    prompts = default_corpus()[100:112]
    f32 = sink_scores(gemma, prompts, max_tokens=48, options=RunOptions(batch_size=4, progress=False))
    bf16 = sink_scores(load("gemma3-270m", device="cpu", dtype="bfloat16"), prompts, max_tokens=48,
                       options=RunOptions(batch_size=4, progress=False))
    assert (bf16.scores - f32.scores).abs().mean() < 1e-2
    for eps in (0.3, 0.8):
        assert abs(bf16.sink_rate(eps) - f32.sink_rate(eps)) < 2.0, eps


def test_the_capability_table_is_what_the_installed_transformer_lens_has():
    """`CAPABILITIES` is read from TransformerLens' version without importing it;
    each entry is checked here against the imported library itself."""
    import importlib.metadata
    import importlib.util

    from sinkmech.loading.backend import CAPABILITIES, Model, model_from_config

    try:
        from transformer_lens import HookedTransformerConfig  # noqa: F401  (TransformerLens 4 raises ImportError)
        has_config = True
    except ImportError:
        has_config = False
    assert CAPABILITIES.from_config == CAPABILITIES.can_train == has_config
    assert Model.__name__ == CAPABILITIES.backend
    assert CAPABILITIES.transformer_lens == min(int(importlib.metadata.version("transformer-lens")[0]), 4)
    bridge = importlib.util.find_spec("transformer_lens.model_bridge") is not None and not has_config
    assert CAPABILITIES.any_architecture == CAPABILITIES.hub_ids == bridge
    if CAPABILITIES.can_reindex_cache:  # it recomputes scores with HookedTransformer's rotary and score functions
        from transformer_lens.components import AbstractAttention

        assert has_config and all(hasattr(AbstractAttention, f) for f in ("rotate_every_two", "calculate_attention_scores"))
    else:
        assert not has_config
    assert CAPABILITIES.official_name("gpt2") == "gpt2"
    with pytest.raises(ValueError):
        CAPABILITIES.official_name("no-such-model-xyz")
    if has_config:
        model = model_from_config(n_layers=1, d_model=8, n_heads=2, d_head=4, n_ctx=8, d_vocab=10, act_fn="gelu",
                                  device="cpu")
        assert isinstance(model, Model) and model.cfg.n_layers == 1
    else:
        with pytest.raises(RuntimeError, match=r"TransformerBridge backend \(TransformerLens 4\)"):
            model_from_config(n_layers=1)
