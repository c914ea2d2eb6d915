"""Shared fixtures: a tiny random model (fast) and the real SmolLM2 (once per session)."""

from __future__ import annotations

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

TINY_BOS = 1  # the tiny model has no tokenizer; tests pass this id as <bos>
# Fixtures that load a real model: every test using one is marked `slow`
# automatically, so `pytest -m "not slow"` never loads a real model.
REAL_MODEL_FIXTURES = {"smollm2", "gemma"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def make_tiny(seed: int = 0, *, n_layers: int = 2, n_heads: int = 4, d_head: int = 8, n_kv: int | None = None) -> HookedTransformer:
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


@pytest.fixture(scope="session")
def tiny_model() -> HookedTransformer:
    return make_tiny()


@pytest.fixture(scope="session")
def tiny_tokens() -> torch.Tensor:
    """Content tokens [6, 12], ids in [2, 50) so none collides with <bos>."""
    g = torch.Generator().manual_seed(0)
    return torch.randint(2, 50, (6, 12), generator=g)


@pytest.fixture(scope="session")
def gemma() -> HookedTransformer:
    """Gemma 3 270M (trained with a fixed <bos>), loaded once, with the network cut."""
    import socket

    from sinkmech.models import load_model

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setattr(socket.socket, "connect", lambda self, address, *a, **k: pytest.fail(f"network: {address!r}"))
        return load_model("gemma3-270m", device="cpu")


@pytest.fixture(scope="session")
def smollm2() -> HookedTransformer:
    from sinkmech.models import load_model

    return load_model("smollm2", device="cpu")
