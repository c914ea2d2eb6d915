"""GGUF file -> HookedTransformerConfig + state dict + tokenizer.

Reads llama-family GGUF files (llama, mistral-style, grouped-query attention)
with the `gguf` package, dequantizes every tensor to float32, undoes
llama.cpp's RoPE row permutation of the query/key weights (its converter
interleaves the two rotary halves of each head; TransformerLens rotates
halves, like Hugging Face), and maps the tensors onto TransformerLens names.

Why it is kept beside transformers' GGUF reader (which every other
architecture, and every file on the TransformerBridge, goes through):
`scripts/bench_gguf_readers.py` converts SmolLM2-135M both ways in one run.
The two give the same tokens and bit-identical logits and first-token
attention on 16 corpus prompts, and this reader's cold conversion took 15.6 s
against 32.7 s (2.1x) on the quiet 2-core machine, since it skips the Hugging
Face model and folder. Warm loads come from the model cache either way, so the
gain is one-time; it is the only reason, and a measured one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import einops
import numpy as np
import torch

GGUF_MAGIC = b"GGUF"
SUPPORTED_ARCHITECTURES = ("llama", "mistral")


class GGUFError(ValueError):
    """A GGUF file that cannot be turned into a HookedTransformer."""


@dataclass(frozen=True)
class GGUFModel:
    cfg: object  # a HookedTransformerConfig
    state_dict: dict[str, torch.Tensor]
    tokenizer: object  # a transformers PreTrainedTokenizerFast
    bos_token_id: int
    architecture: str
    path: Path


def check_gguf_file(path: str | os.PathLike) -> Path:
    """Raise a specific error for a missing, empty or non-GGUF file."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    if not path.is_file():
        raise GGUFError(f"not a file: {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFError(
            f"{path} is not a GGUF file (first bytes {magic!r}, expected {GGUF_MAGIC!r})"
        )
    return path


@contextlib.contextmanager
def one_reader_per_file() -> Iterator[None]:
    """Within this block every GGUF file is parsed once. A reader parses the
    whole metadata on opening, the tokenizer's vocabulary one string at a time
    (Gemma 3's 262k tokens: about 17 s on one core), and a conversion opens the
    file up to four times: sinkmech for its metadata, transformers for the
    config, the tokenizer and the weights (each through `gguf.GGUFReader`).
    The reader maps the file read-only, so one can serve them all. Nested
    blocks share the outer one's readers."""
    import gguf

    real = gguf.GGUFReader
    if isinstance(real, _SharedReaders):
        yield
        return
    gguf.GGUFReader = _SharedReaders(real)
    try:
        yield
    finally:
        gguf.GGUFReader = real


class _SharedReaders:
    """Stands in for `gguf.GGUFReader` inside `one_reader_per_file`: one reader per (file, mode)."""

    def __init__(self, real) -> None:
        self.real, self.readers = real, {}

    def __call__(self, path, mode: str = "r"):
        key = (str(Path(path).resolve()), mode)
        if key not in self.readers:
            self.readers[key] = self.real(path, mode)
        return self.readers[key]


def _open_reader(path: Path):
    import gguf

    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # gguf raises ValueError/IndexError/... on short files
        raise GGUFError(
            f"{path} is truncated or corrupt: the GGUF reader failed with "
            f"{type(e).__name__}: {e}"
        ) from e


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        if default is not None:
            return default
        raise GGUFError(f"GGUF metadata key {key!r} is missing")
    return field.contents()


def gguf_metadata(path: str | os.PathLike) -> dict[str, object]:
    """The file's scalar and short-list metadata (`general.*`, `<arch>.*`);
    the tokenizer's vocabulary arrays are left out. Parsing a 262k-token
    vocabulary takes seconds, so warm loads never call this."""
    path = check_gguf_file(path)
    reader = _open_reader(path)
    return {
        k: f.contents()
        for k, f in reader.fields.items()
        if not k.startswith("tokenizer.") and len(f.data) <= 64
    }


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute(w, n_head)` on the rows of a q/k weight.

    llama.cpp stores each head's rows as interleaved pairs (x0, x_half, x1, ...);
    this restores the rotate-half order (x0, x1, ..., x_half, ...).
    """
    rows = w.shape[0]
    return np.ascontiguousarray(
        w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def read_gguf(path: str | os.PathLike, *, n_ctx: int = 2048) -> GGUFModel:
    """Read a llama-family GGUF file into TransformerLens form.

    Args:
        path: the .gguf file.
        n_ctx: context length to build the model with (the file's own may be
            far longer; TransformerLens allocates an n_ctx x n_ctx mask per layer).
    """
    from gguf.quants import dequantize

    path = check_gguf_file(path)
    reader = _open_reader(path)
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GGUFError(
            f"unsupported GGUF architecture {arch!r} in {path}; sinkmech converts "
            f"the llama family only: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )

    def meta(key, default=None):
        return _field(reader, f"{arch}.{key}", default)

    n_layers = int(meta("block_count"))
    d_model = int(meta("embedding_length"))
    n_heads = int(meta("attention.head_count"))
    n_kv = int(meta("attention.head_count_kv", n_heads))
    d_head = d_model // n_heads
    rotary_dim = int(meta("rope.dimension_count", d_head))
    tensors = {}
    for t in reader.tensors:
        try:
            arr = dequantize(t.data, t.tensor_type)
        except Exception as e:
            raise GGUFError(
                f"cannot dequantize tensor {t.name} ({t.tensor_type.name}) in {path}: {e}"
            ) from e
        tensors[t.name] = np.asarray(arr, dtype=np.float32).reshape(
            tuple(reversed([int(s) for s in t.shape]))
        )

    def get(name):
        if name not in tensors:
            raise GGUFError(f"tensor {name!r} missing from {path}: file truncated or not llama")
        return torch.from_numpy(tensors[name].copy())

    W_E = get("token_embd.weight")
    d_vocab = W_E.shape[0]
    d_mlp = get("blk.0.ffn_up.weight").shape[0]
    from transformer_lens import HookedTransformerConfig  # TransformerLens 3.x: this converter feeds HookedTransformer

    cfg = HookedTransformerConfig(
        d_model=d_model,
        d_head=d_head,
        n_heads=n_heads,
        n_key_value_heads=n_kv if n_kv != n_heads else None,
        d_mlp=d_mlp,
        n_layers=n_layers,
        n_ctx=min(n_ctx, int(meta("context_length", n_ctx))),
        eps=float(meta("attention.layer_norm_rms_epsilon", 1e-5)),
        d_vocab=d_vocab,
        act_fn="silu",
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_dim=rotary_dim,
        rotary_base=float(meta("rope.freq_base", 10000.0)),
        rotary_adjacent_pairs=False,
        final_rms=True,
        gated_mlp=True,
        original_architecture="LlamaForCausalLM",
        tokenizer_prepends_bos=False,
        default_prepend_bos=False,
        model_name=str(_field(reader, "general.name", path.stem)),
        dtype=torch.float32,
    )

    sd: dict[str, torch.Tensor] = {"embed.W_E": W_E}
    for l in range(n_layers):
        b = f"blk.{l}."
        W_q = torch.from_numpy(unpermute_rope_rows(get(b + "attn_q.weight").numpy(), n_heads))
        W_k = torch.from_numpy(unpermute_rope_rows(get(b + "attn_k.weight").numpy(), n_kv))
        W_v, W_o = get(b + "attn_v.weight"), get(b + "attn_output.weight")
        p = f"blocks.{l}."
        sd[p + "ln1.w"] = get(b + "attn_norm.weight")
        sd[p + "ln2.w"] = get(b + "ffn_norm.weight")
        sd[p + "attn.W_Q"] = einops.rearrange(W_q, "(n h) m -> n m h", n=n_heads)
        kv_names = ("attn._W_K", "attn._W_V") if cfg.n_key_value_heads else ("attn.W_K", "attn.W_V")
        kv_bias = ("attn._b_K", "attn._b_V") if cfg.n_key_value_heads else ("attn.b_K", "attn.b_V")
        sd[p + kv_names[0]] = einops.rearrange(W_k, "(n h) m -> n m h", n=n_kv)
        sd[p + kv_names[1]] = einops.rearrange(W_v, "(n h) m -> n m h", n=n_kv)
        sd[p + "attn.b_Q"] = torch.zeros(n_heads, d_head)
        sd[p + kv_bias[0]] = torch.zeros(n_kv, d_head)
        sd[p + kv_bias[1]] = torch.zeros(n_kv, d_head)
        sd[p + "attn.W_O"] = einops.rearrange(W_o, "m (n h) -> n h m", n=n_heads)
        sd[p + "attn.b_O"] = torch.zeros(d_model)
        sd[p + "mlp.W_in"] = get(b + "ffn_up.weight").T.contiguous()
        sd[p + "mlp.W_gate"] = get(b + "ffn_gate.weight").T.contiguous()
        sd[p + "mlp.b_in"] = torch.zeros(d_mlp)
        sd[p + "mlp.W_out"] = get(b + "ffn_down.weight").T.contiguous()
        sd[p + "mlp.b_out"] = torch.zeros(d_model)
    sd["ln_final.w"] = get("output_norm.weight")
    # Tied embeddings unless the file carries its own output matrix.
    W_U = get("output.weight") if "output.weight" in tensors else W_E
    sd["unembed.W_U"] = W_U.T.contiguous()
    sd["unembed.b_U"] = torch.zeros(d_vocab)

    tokenizer = gguf_tokenizer(path)
    bos = tokenizer.bos_token_id
    if bos is None:
        bos = int(_field(reader, "tokenizer.ggml.bos_token_id"))
    return GGUFModel(cfg, sd, tokenizer, int(bos), arch, path)


def gguf_tokenizer(path: Path):
    """The tokenizer stored in the GGUF file, built by transformers' converter."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as e:
        raise GGUFError(f"cannot build a tokenizer from {path}: {type(e).__name__}: {e}") from e
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "right"
    return tok
