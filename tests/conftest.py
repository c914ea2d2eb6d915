"""Shared fixtures: a tiny random model (fast) and the real SmolLM2 (once per session)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

from sinkmech.backend import BACKEND, IS_BRIDGE, Model

TINY_BOS = 1  # the tiny model's <bos> (HookedTransformer: it has no tokenizer; tests pass this id)
# Tests that set a HookedTransformer's weights by hand, or test what only
# TransformerLens 3.x has, are skipped on the Bridge with this reason.
NEEDS_HOOKED = pytest.mark.skipif(
    IS_BRIDGE, reason=f"hand-built HookedTransformer (TransformerLens 3.x); this run's backend is {BACKEND}")
_TINY_DIR = Path(tempfile.mkdtemp(prefix="sinkmech-tiny-"))
# Fixtures that load a real model: every test using one is marked `slow`
# automatically, so `pytest -m "not slow"` never loads a real model.
REAL_MODEL_FIXTURES = {"smollm2", "gemma"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def make_tiny(seed: int = 0, *, n_layers: int = 2, n_heads: int = 4, d_head: int = 8, n_kv: int | None = None) -> Model:
    """A tiny random model: a HookedTransformer (LayerNorm, GELU) on TransformerLens
    3.x; on the Bridge a tiny random Llama saved as a Hugging Face folder, same sizes."""
    if IS_BRIDGE:
        from sinkmech.models import load_model
        from tiny_hf import save_tiny

        folder = _TINY_DIR / f"llama-{seed}-{n_layers}-{n_heads}-{d_head}-{n_kv}"
        if not folder.exists():
            save_tiny(folder, "llama", seed, n_layers=n_layers, n_heads=n_heads, d_head=d_head, n_kv=n_kv)
        return load_model(str(folder), device="cpu")
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=n_layers,
        d_model=n_heads * d_head,
        n_heads=n_heads,
        d_head=d_head,
        d_mlp=4 * n_heads * d_head,
        n_ctx=64,
        d_vocab=50,
        act_fn="gelu",
        normalization_type="LN",
        positional_embedding_type="rotary",
        n_key_value_heads=n_kv,
        seed=seed,
        device="cpu",
    )
    model = HookedTransformer(cfg)
    model.eval()
    return model


def toy_tokenizer(monkeypatch, model: Model, tokenizer) -> None:
    """Give `model` a toy tokenizer for one test (monkeypatch restores it). The
    Bridge checks a tokenizer's class on assignment; sinkmech only calls it."""
    monkeypatch.setattr(model, "_tokenizer" if IS_BRIDGE else "tokenizer", tokenizer)


@pytest.fixture(scope="session")
def tiny_model() -> Model:
    return make_tiny()


@pytest.fixture(scope="session")
def tiny_tokens() -> torch.Tensor:
    """Content tokens [6, 12], ids in [2, 50) so none collides with <bos>."""
    g = torch.Generator().manual_seed(0)
    return torch.randint(2, 50, (6, 12), generator=g)


@pytest.fixture(scope="session")
def gemma() -> Model:
    """Gemma 3 270M (trained with a fixed <bos>), loaded once, with the network cut."""
    import socket

    from sinkmech.models import load_model

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setattr(socket.socket, "connect", lambda self, address, *a, **k: pytest.fail(f"network: {address!r}"))
        return load_model("gemma3-270m", device="cpu")


@pytest.fixture(scope="session")
def smollm2() -> Model:
    from sinkmech.models import load_model

    return load_model("smollm2", device="cpu")
