"""The weights as sinkmech's TransformerLens 3.9 loaders keep them: the same
values, laid out as the forward pass reads them, so no pass copies a weight."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sinkmech.loading.backend import CAPABILITIES

pytestmark = [pytest.mark.backend, pytest.mark.skipif(
    not CAPABILITIES.from_config, reason="TransformerLens 3.9's layouts: the Bridge runs the Hugging Face model's own")]

COPIES = {"clone", "copy_", "_to_copy", "contiguous"}


class WeightCopies(TorchDispatchMode):
    """Counts the ops of a forward pass that copy out of a parameter's storage."""

    def __init__(self, model):
        super().__init__()
        self.weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.copied = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name in COPIES:
            src = args[1] if name == "copy_" else args[0]
            if isinstance(src, torch.Tensor) and src.untyped_storage().data_ptr() in self.weights:
                self.copied.append((name, tuple(src.shape)))
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def gated_gqa():
    """A tiny Llama-like HookedTransformer: gated MLP, grouped keys and values, RMSNorm."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=2, d_model=32, n_heads=4, d_head=8, n_key_value_heads=2, d_mlp=64,
                                  n_ctx=32, d_vocab=50, act_fn="silu", gated_mlp=True, normalization_type="RMS",
                                  positional_embedding_type="rotary", seed=0, device="cpu")
    return HookedTransformer(cfg).eval()


def relaid(model):
    from sinkmech.loading.hooked import _weights_as_linear_reads_them

    model = copy.deepcopy(model)
    _weights_as_linear_reads_them(model)
    return model


def copies_in_a_forward(model, tokens) -> list:
    with torch.no_grad(), WeightCopies(model) as mode:
        model(tokens)
    return mode.copied


def test_the_same_weights_read_without_a_copy(gated_gqa):
    """Every weight keeps its name, shape and values; TransformerLens's own forward
    copies W_Q, the grouped W_K and W_V, W_O, the gated MLP's three and W_U on
    every pass as it builds them, and none of them as the loaders keep them."""
    tokens = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(0))
    kept = relaid(gated_gqa)
    before, after = dict(gated_gqa.named_parameters()), dict(kept.named_parameters())
    assert before.keys() == after.keys()
    for name, w in before.items():
        assert after[name].shape == w.shape and torch.equal(after[name], w), name
    moved = [n for n in before if after[n].stride() != before[n].stride()]
    assert {n.split(".")[-1] for n in moved} == {"W_Q", "_W_K", "_W_V", "W_O", "W_in", "W_gate", "W_out", "W_U"}
    copied = copies_in_a_forward(gated_gqa, tokens)
    assert len(copied) >= 2 * 7, copied  # the planted case: TransformerLens's layout is copied
    assert copies_in_a_forward(kept, tokens) == []
    assert relaid(kept).state_dict().keys() == kept.state_dict().keys()  # a second pass changes nothing
    assert all(a.stride() == b.stride() for a, b in zip(relaid(kept).parameters(), kept.parameters()))


def test_the_forward_pass_is_the_same_products(gated_gqa):
    """Logits of both layouts agree to the float32 rounding of one product: a logit
    is a sum of d terms read by a BLAS call with other strides, so it may be summed
    in another order, each order within d * 2^-24 * sum |terms| of the exact sum
    (the classic bound on recursive summation; d the widest product, d_mlp here)."""
    tokens = torch.randint(0, 50, (3, 9), generator=torch.Generator().manual_seed(1))
    kept = relaid(gated_gqa)
    with torch.no_grad():
        a, b = gated_gqa(tokens), kept(tokens)
        exact = copy.deepcopy(gated_gqa).double()(tokens)
    d = gated_gqa.cfg.d_mlp
    scale = exact.abs().amax()
    for logits in (a, b):
        assert (logits.double() - exact).abs().amax() <= 4 * d * 2**-24 * scale * gated_gqa.cfg.n_layers
    assert (a - b).abs().amax() <= 8 * d * 2**-24 * scale * gated_gqa.cfg.n_layers


def test_a_cast_and_a_state_dict_keep_the_layout(gated_gqa):
    """A dtype cast keeps the strides (so a bfloat16 model reads without copies too),
    and a state dict loads into the kept layout in place."""
    from sinkmech.loading.backend import move

    kept = move(relaid(gated_gqa), dtype=torch.bfloat16)
    assert copies_in_a_forward(kept, torch.tensor([[1, 2, 3]])) == []
    fresh = relaid(gated_gqa)
    fresh.load_state_dict(gated_gqa.state_dict())
    assert copies_in_a_forward(fresh, torch.tensor([[1, 2, 3]])) == []
