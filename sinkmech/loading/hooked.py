"""TransformerLens 3.9: GGUF files and local Hugging Face folders to a
CPU float32 HookedTransformer (the Bridge's counterpart is
`sinkmech.loading.bridge`).

Two GGUF converters: llama-family files (SmolLM2) go through sinkmech's own
dequantizer (`sinkmech.loading.gguf`); any other architecture that transformers' GGUF
loader reads and TransformerLens knows by name (Gemma 3) is dequantized by
transformers and converted by `HookedTransformer.from_pretrained_no_processing`.
`sinkmech.loading.models` caches what these build.
"""

from __future__ import annotations

import gc
import os
import tempfile
import warnings
from pathlib import Path

import torch

from sinkmech.loading.backend import Model
from sinkmech.loading.gguf import SUPPORTED_ARCHITECTURES, GGUFError, check_gguf_file, gguf_metadata, read_gguf

BRIDGE_LOADS = ("the TransformerBridge backend loads it: TransformerLens 4 (`make setup-tl4`, "
                "then .venv-tl4/bin/sinkmech)")


def _architecture(folder: Path) -> str:
    """The folder's `architectures` entry, as its config.json names it."""
    import json

    try:
        names = json.loads((folder / "config.json").read_text()).get("architectures") or ["unnamed architecture"]
        return str(names[0])
    except (OSError, ValueError, AttributeError):
        return "unreadable config.json"


def hooked_from_hf_folder(folder: Path, n_ctx: int) -> Model:
    """HookedTransformer from a local Hugging Face folder (TransformerLens 3.9
    derives the config from the folder's config.json)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformer_lens import HookedTransformer

    from sinkmech.loading.bridge import _quiet_logging, check_hf_folder

    from transformer_lens import HookedTransformerConfig
    from transformer_lens.loading_from_pretrained import convert_hf_model_config, get_pretrained_state_dict

    check_hf_folder(folder)
    # TransformerLens 3.9 guesses the architecture from words in the name
    # ("llama", "gemma", ...) before reading config.json: a neutral link name
    # makes it read the config's own `architectures`.
    link = Path(tempfile.mkdtemp(prefix="sinkmech-hf-")) / "model"
    link.symlink_to(folder.resolve(), target_is_directory=True)
    name = str(link)
    try:
        # from_pretrained_no_processing wants an official name; its two halves take a folder.
        # The config first: an architecture TransformerLens 3.9 lacks is refused before the weights load.
        cfg = convert_hf_model_config(name)
        with _quiet_logging():
            tokenizer = AutoTokenizer.from_pretrained(name)
            hf = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32)
        cfg.update(n_ctx=min(n_ctx, cfg["n_ctx"]), device="cpu", dtype=torch.float32, default_prepend_bos=False,
                   tokenizer_prepends_bos=False, model_name=folder.name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = HookedTransformer(HookedTransformerConfig(**cfg), tokenizer=tokenizer, default_padding_side="right")
            state = get_pretrained_state_dict(name, model.cfg, hf_model=hf)
            model.load_and_process_state_dict(state, fold_ln=False, center_writing_weights=False, center_unembed=False,
                                              fold_value_biases=False, refactor_factored_attn_matrices=False)
    except Exception as e:
        raise ValueError(f"TransformerLens 3.9 cannot load {folder} ({_architecture(folder)}: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}); {BRIDGE_LOADS}") from e
    finally:
        link.unlink()
        link.parent.rmdir()
    model.cfg.n_ctx = min(n_ctx, model.cfg.n_ctx)
    return model


def convert_gguf(
    path: str | os.PathLike, *, n_ctx: int = 2048, tl_name: str | None = None
) -> tuple[Model, int | None]:
    """Convert a GGUF file to a CPU HookedTransformer (no cache).

    Args:
        path: the .gguf file.
        n_ctx: context length to build with (capped at the file's own).
        tl_name: TransformerLens name whose config fits the file; default:
            found from the file's `general.basename` and `general.size_label`.
    Returns:
        The model and the context length the file was trained for.
    """
    path = check_gguf_file(path)
    meta = gguf_metadata(path)
    arch = str(meta.get("general.architecture"))
    context_length = meta.get(f"{arch}.context_length")
    context_length = int(context_length) if context_length is not None else None
    if arch in SUPPORTED_ARCHITECTURES:
        model = _llama_from_gguf(path, n_ctx)
    else:
        model = _convert_with_transformers(path, arch, meta, n_ctx=n_ctx, tl_name=tl_name)
    return model, context_length


def _llama_from_gguf(path: Path, n_ctx: int) -> Model:
    from transformer_lens import HookedTransformer

    g = read_gguf(path, n_ctx=n_ctx)
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
    return model.eval()


def _convert_with_transformers(
    path: Path, arch: str, meta: dict, *, n_ctx: int, tl_name: str | None
) -> Model:
    """transformers dequantizes the file; TransformerLens converts its weights offline."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    from sinkmech.loading.bridge import read_gguf_transformers
    from transformer_lens import HookedTransformer

    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        raise GGUFError(
            f"unsupported GGUF architecture {arch!r} in {path}; sinkmech converts "
            f"{', '.join(SUPPORTED_ARCHITECTURES)} itself and, through transformers, "
            "architectures TransformerLens names"
        )
    tl_name = tl_name or _tl_name_for(path, arch, meta)
    # the one GGUF reader (float32, the GGUF quantization_config dropped: TransformerLens refuses it)
    hf, tokenizer = read_gguf_transformers(path)
    _check_dims(path, hf.config, tl_name)
    tokenizer.padding_side = "right"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "HookedTransformer is deprecated", DeprecationWarning)
        model = HookedTransformer.from_pretrained_no_processing(
            tl_name, hf_model=hf, tokenizer=tokenizer, device="cpu", dtype=torch.float32,
            n_ctx=n_ctx, default_padding_side="right",
        )
    del hf  # the 262k-row embedding is 670 MB; do not hold two copies
    gc.collect()
    return model.eval()


def _tl_name_for(path: Path, arch: str, meta: dict) -> str:
    """The TransformerLens name matching the file's basename and size label."""
    from transformer_lens.loading_from_pretrained import OFFICIAL_MODEL_NAMES, make_model_alias_map

    base = str(meta.get("general.basename", "")).lower()
    size = str(meta.get("general.size_label", "")).lower()
    stems = [f"{base}-{size}", base] if base else []
    aliases = make_model_alias_map()
    for stem in stems:
        if stem in aliases:
            return aliases[stem]
        for suffix in ("", "-pt", "-base", "-it", "-instruct"):
            hits = [n for n in OFFICIAL_MODEL_NAMES if n.split("/")[-1].lower() == stem + suffix]
            if hits:
                return hits[0]
    raise GGUFError(
        f"unsupported GGUF architecture {arch!r} in {path}: no TransformerLens model matches "
        f"its metadata (general.basename={meta.get('general.basename')!r}, "
        f"general.size_label={meta.get('general.size_label')!r})"
    )


def _check_dims(path: Path, hf_config, tl_name: str) -> None:
    from transformer_lens.loading_from_pretrained import get_pretrained_model_config

    tl = get_pretrained_model_config(tl_name)
    text = getattr(hf_config, "text_config", hf_config)
    ours = (tl.n_layers, tl.d_model, tl.n_heads, tl.d_vocab)
    theirs = (text.num_hidden_layers, text.hidden_size, text.num_attention_heads, text.vocab_size)
    if ours != theirs:
        raise GGUFError(
            f"{path} does not fit TransformerLens' {tl_name}: (layers, d_model, heads, vocab) "
            f"{theirs} vs {ours}"
        )
