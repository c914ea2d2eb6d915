"""The tiny random models most of the suite runs on, and a word tokenizer for them."""

from __future__ import annotations

import tempfile
from pathlib import Path

from sinkmech.loading.backend import CAPABILITIES, IS_BRIDGE, Model
from sinkmech.options import RunOptions

TINY_BOS = 1  # the tiny model's <bos> (HookedTransformer: it has no tokenizer; tests pass this id)
TINY_RUN = RunOptions(progress=False, bos_token_id=TINY_BOS)  # how an analysis runs on a tiny model in a test
_TINY_DIR = Path(tempfile.mkdtemp(prefix="sinkmech-tiny-"))


def make_tiny(seed: int = 0, *, n_layers: int = 2, n_heads: int = 4, d_head: int = 8, n_kv: int | None = None) -> Model:
    """A tiny random model: a HookedTransformer (LayerNorm, GELU) built from a config
    where the backend can (TransformerLens 3.x); on the Bridge a tiny random Llama
    saved as a Hugging Face folder, same sizes."""
    if not CAPABILITIES.from_config:
        from sinkmech.loading.models import load_model
        from helpers.tiny_hf import save_tiny

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


class WordTokenizer:
    """One id per whitespace-separated word, in [2, 50); <bos> = 1, pad = 0;
    the text '<s>' is the one special token (id 1)."""

    bos_token_id = 1
    pad_token_id = 0
    padding_side = "right"

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [1 if w == "<s>" else 2 + sum(map(ord, w)) % 48 for w in text.split()]}

    def decode(self, ids):
        return " ".join(f"w{i}" for i in ids)


def toy_tokenizer(monkeypatch, model: Model, tokenizer) -> None:
    """Give `model` a toy tokenizer for one test (monkeypatch restores it). The
    Bridge checks a tokenizer's class on assignment; sinkmech only calls it."""
    monkeypatch.setattr(model, "_tokenizer" if IS_BRIDGE else "tokenizer", tokenizer)


def serve_tiny(monkeypatch, seed: int = 0) -> Model:
    """For one test of the command line: `make_tiny(seed)` with the word
    tokenizer, the model `load_model` returns whatever it is asked for."""
    model = make_tiny(seed)
    toy_tokenizer(monkeypatch, model, WordTokenizer())
    monkeypatch.setattr("sinkmech.loading.models.load_model", lambda spec, **kw: model)
    return model


class TokenWindows:
    """A stand-in for a named corpus's windows (`sinkmech.corpora.Corpus`) whose prompts are
    token ids for the tiny model, each with its document."""

    def __init__(self, prompts, documents):
        self.prompts, self.documents = tuple(prompts), tuple(documents)

    def part(self, start: int, stop: int) -> "TokenWindows":
        return TokenWindows(self.prompts[start:stop], self.documents[start:stop])


def serve_windows(monkeypatch, n: int) -> TokenWindows:
    """The default corpus as n token-id windows of 7 tokens, two per document (d0, d0, d1, d1, ...)."""
    import sinkmech.corpora

    windows = TokenWindows([[5 + i, 6, 7, 8, 9, 10, 11] for i in range(n)], [f"d{i // 2}" for i in range(n)])
    monkeypatch.setattr(sinkmech.corpora, "corpus", lambda *args, **kwargs: windows)
    return windows
