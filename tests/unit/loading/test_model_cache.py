"""Converted-model cache: hit, miss, corrupt and partial entries, changed files.

All on a tiny random model (no GGUF): `store`/`load` take any HookedTransformer.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

import sinkmech.loading.cache as mc
from helpers.tiny import make_tiny
from helpers.backends import needs
from sinkmech.loading.cache import CACHE_ENV, ModelCache, default_cache_dir, entry_key

# The Bridge caches Hugging Face folders instead (tests/unit/loading/test_backends.py).
pytestmark = needs("from_config", why="entries hold a HookedTransformer built from a config")
KEY = entry_key("ab" * 32)
TOKENS = torch.tensor([[1, 5, 9, 20, 33, 2]])


def tiny_tokenizer(folder):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<bos>": 1, **{f"w{i}": i for i in range(2, 50)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", pad_token="<pad>").save_pretrained(folder)
    # Loaded back from disk: TransformerLens re-reads a tokenizer by its name_or_path.
    return AutoTokenizer.from_pretrained(folder)


def tied_tiny():
    model = make_tiny(seed=3)
    with torch.no_grad():
        model.unembed.W_U.copy_(model.embed.W_E.T)
    return model


def logits(model):
    with torch.no_grad():
        return model(TOKENS)


def test_miss_then_hit_gives_identical_logits(tmp_path):
    cache = ModelCache(tmp_path)
    assert cache.load(KEY) is None
    model = make_tiny(seed=1)
    cache.store(KEY, model, context_length=64)
    back = cache.load(KEY)
    assert back is not None and back is not model
    assert torch.equal(logits(back), logits(model))
    assert back.cfg.n_layers == model.cfg.n_layers and back.cfg.dtype == torch.float32


def test_entry_holds_json_safetensors_and_no_pickle(tmp_path):
    folder = ModelCache(tmp_path).store(KEY, make_tiny())
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["manifest.json", "weights.safetensors"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["config"]["n_layers"] == 2 and manifest["conversion_version"] == mc.CONVERSION_VERSION
    assert manifest["weights"]["sha256"] == mc.sha256_file(folder / "weights.safetensors")
    # No temporary folders are left behind next to the entry.
    assert [p.name for p in folder.parent.iterdir()] == [KEY]


def test_tokenizer_round_trips_and_pads_right(tmp_path):
    model = make_tiny()
    model.set_tokenizer(tiny_tokenizer(tmp_path / "tok"), default_padding_side="left")
    cache = ModelCache(tmp_path / "cache")
    cache.store(KEY, model)
    back = cache.load(KEY)
    assert back.tokenizer.padding_side == "right"
    assert back.tokenizer("w3 w7", add_special_tokens=False)["input_ids"] == [3, 7]
    assert back.tokenizer.bos_token_id == 1


def test_a_loaded_tokenizer_is_read_once_and_prepends_bos(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    model = make_tiny()
    model.set_tokenizer(tiny_tokenizer(tmp_path / "tok"))
    cache = ModelCache(tmp_path / "cache")
    cache.store(KEY, model)
    reads = []
    real = AutoTokenizer.from_pretrained.__func__
    monkeypatch.setattr(AutoTokenizer, "from_pretrained",
                        classmethod(lambda cls, *a, **k: reads.append(k) or real(cls, *a, **k)))
    back = cache.load(KEY)
    # read with add_bos_token=True, so TransformerLens keeps it instead of reading it again
    assert reads == [{"add_bos_token": True}]
    assert back.tokenizer("w3 w7")["input_ids"] == [1, 3, 7]
    assert back.tokenizer("w3 w7")["input_ids"] == model.tokenizer("w3 w7")["input_ids"]


def test_weights_hash_is_memoized_on_load_and_a_changed_file_still_misses(tmp_path, monkeypatch):
    cache = ModelCache(tmp_path)
    folder = cache.store(KEY, make_tiny(seed=1))
    weights = folder / "weights.safetensors"
    calls = []
    real = mc.sha256_file
    monkeypatch.setattr(mc, "sha256_file", lambda p: (calls.append(p) if p == weights else None) or real(p))
    assert cache.load(KEY) is not None and cache.load(KEY) is not None
    assert len(calls) == 1  # the second load's hash is the memo's
    st = weights.stat()
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # an edit moves the mtime
    with pytest.warns(UserWarning, match="discarding corrupt"):
        assert cache.load(KEY) is None
    assert len(calls) == 2


def test_an_entry_loads_from_a_cache_that_cannot_be_written(tmp_path, monkeypatch):
    cache = ModelCache(tmp_path)
    cache.store(KEY, make_tiny(seed=1))

    def refuse(*args, **kwargs):
        raise PermissionError("read-only")

    monkeypatch.setattr(mc, "write_bytes", refuse)
    monkeypatch.setattr(ModelCache, "ensure_writable", refuse)
    back = cache.load(KEY)
    assert back is not None and torch.equal(logits(back), logits(make_tiny(seed=1)))


def test_tied_unembedding_is_written_once(tmp_path):
    model = tied_tiny()
    folder = ModelCache(tmp_path).store(KEY, model)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["tied_unembed"] is True
    back = ModelCache(tmp_path).load(KEY)
    assert torch.equal(back.unembed.W_U, model.unembed.W_U)
    # An untied copy: editing the embedding must not move the unembedding.
    assert back.unembed.W_U.data_ptr() != back.embed.W_E.data_ptr()
    assert json.loads((ModelCache(tmp_path / "b").store(KEY, make_tiny()) / "manifest.json").read_text())["tied_unembed"] is False


def test_corrupt_weights_are_discarded_and_rebuilt(tmp_path):
    cache = ModelCache(tmp_path)
    folder = cache.store(KEY, make_tiny(seed=1))
    weights = folder / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF  # same size, one flipped byte: only the checksum sees it
    weights.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="discarding corrupt"):
        assert cache.load(KEY) is None
    assert not folder.exists()
    built = []
    model = cache.get_or_build(KEY, lambda: (built.append(1) or make_tiny(seed=2), None))
    assert built == [1]
    assert torch.equal(logits(model), logits(make_tiny(seed=2)))


@pytest.mark.parametrize("damage", ["no_manifest", "truncated_weights", "bad_json", "other_version"])
def test_partial_or_stale_entry_is_never_used(tmp_path, damage):
    cache = ModelCache(tmp_path)
    folder = cache.store(KEY, make_tiny())
    manifest = folder / "manifest.json"
    if damage == "no_manifest":
        manifest.unlink()
    elif damage == "truncated_weights":
        weights = folder / "weights.safetensors"
        weights.write_bytes(weights.read_bytes()[:100])
    elif damage == "bad_json":
        manifest.write_text("{not json")
    else:
        data = json.loads(manifest.read_text())
        data["conversion_version"] = mc.CONVERSION_VERSION - 1
        manifest.write_text(json.dumps(data))
    with pytest.warns(UserWarning, match="discarding corrupt"):
        assert cache.load(KEY) is None
    assert not folder.exists()


def test_get_or_build_builds_once(tmp_path):
    cache = ModelCache(tmp_path)
    calls = []

    def build():
        calls.append(1)
        return make_tiny(seed=4), 64

    first = cache.get_or_build(KEY, build)
    second = cache.get_or_build(KEY, build)
    assert calls == [1]
    assert torch.equal(logits(first), logits(second))


def test_n_ctx_is_rebuilt_and_capped_at_the_context_length(tmp_path):
    cache = ModelCache(tmp_path)
    cache.store(KEY, make_tiny(), context_length=48)
    assert cache.load(KEY, n_ctx=16).cfg.n_ctx == 16
    assert cache.load(KEY, n_ctx=4096).cfg.n_ctx == 48
    assert cache.load(KEY).cfg.n_ctx == 64  # as stored


def test_failed_store_leaves_no_entry(tmp_path, monkeypatch):
    cache = ModelCache(tmp_path)

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(mc, "write_bytes", boom)
    with pytest.raises(OSError, match="disk full"):
        cache.store(KEY, make_tiny())
    assert not cache.entry_dir(KEY).exists()
    assert list((tmp_path / "models").iterdir()) == []


def test_file_hash_is_memoized_and_a_changed_file_misses(tmp_path, monkeypatch):
    cache = ModelCache(tmp_path / "cache")
    src = tmp_path / "model.gguf"
    src.write_bytes(b"GGUF" + b"\0" * 1000)
    calls = []
    real = mc.sha256_file
    monkeypatch.setattr(mc, "sha256_file", lambda p: (calls.append(p) if p == src else None) or real(p))
    first = cache.file_sha256(src)
    assert cache.file_sha256(src) == first and len(calls) == 1  # memo hit
    key = entry_key(first)
    cache.store(key, make_tiny())
    # Same size, same mtime, different bytes written in place is the one
    # change a stat-keyed memo cannot see; any real edit moves mtime or size.
    st = src.stat()
    src.write_bytes(b"GGUF" + b"\1" * 1000)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    second = cache.file_sha256(src)
    assert len(calls) == 2 and second != first
    assert cache.load(entry_key(second)) is None
    assert cache.load(key) is not None


def test_cache_dir_from_env(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "here"))
    assert default_cache_dir() == tmp_path / "here"
    assert ModelCache().root == tmp_path / "here"
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "sinkmech"


@pytest.mark.parametrize("key", ["", "../escape", "a/b", ".hidden"])
def test_bad_keys_are_refused(tmp_path, key):
    with pytest.raises(ValueError, match="bad cache key"):
        ModelCache(tmp_path).entry_dir(key)


def test_entry_key_wants_a_sha256():
    with pytest.raises(ValueError, match="not a hex SHA256"):
        entry_key("abc")
    assert entry_key("0" * 64).endswith(f"-v{mc.CONVERSION_VERSION}")
