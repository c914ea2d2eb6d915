"""TransformerLens 3.9: a resolved `ModelSource` (`sinkmech.loading.names`) to a
HookedTransformer (`load_hooked`; the Bridge's counterpart is
`sinkmech.loading.bridge.load_bridge`).

GGUF files and packaged models are converted once into the converted-model
cache (`sinkmech.loading.cache`) and loaded warm from it. Two GGUF converters:
llama-family files (SmolLM2) go through sinkmech's own dequantizer
(`sinkmech.loading.gguf`); any other architecture that transformers' GGUF
loader reads and TransformerLens knows by name (Gemma 3) is dequantized by
transformers and converted by `HookedTransformer.from_pretrained_no_processing`.
Local Hugging Face folders are converted from their config.json, hub names by
`HookedTransformer.from_pretrained`.
"""

from __future__ import annotations

import gc
import os
import tempfile
import warnings
from pathlib import Path

import torch

from sinkmech.loading.backend import Model, move
from sinkmech.loading.cache import ModelCache, entry_key, packaged_gguf_path, packaged_sha256
from sinkmech.loading.gguf import (
    SUPPORTED_ARCHITECTURES, GGUFError, check_gguf_file, gguf_metadata, one_reader_per_file, read_gguf,
)
from sinkmech.loading.names import ModelSource, check_hf_folder, folder_architecture, unknown_model

BRIDGE_LOADS = ("the TransformerBridge backend loads it: TransformerLens 4 (`make setup-tl4`, "
                "then .venv-tl4/bin/sinkmech)")


def load_hooked(
    source: ModelSource, *, device: str, dtype: torch.dtype, n_ctx: int, cache: ModelCache | None
) -> Model:
    """The HookedTransformer `source` names, on `device`, in eval mode: built in
    float32 (so is a cache entry), then cast to `dtype`.

    Args:
        n_ctx: context length (capped at the model's own).
        cache: where GGUF and packaged models are converted once (None: convert every time).
    """
    if source.kind == "folder":
        model = hooked_from_hf_folder(source.path, n_ctx, architecture=source.architecture)
        return move(_finish(model, source.name, device), dtype=dtype)
    if source.kind == "hub":
        return move(_from_hub(source, device), dtype=dtype)
    if source.kind == "package":
        # The package states the file's SHA256: a warm load never assembles it.
        key = entry_key(packaged_sha256(source.location)) if cache is not None else None
        build = lambda: convert_gguf(packaged_gguf_path(source.location, cache), n_ctx=n_ctx,  # noqa: E731
                                     tl_name=source.official)
    else:
        path = check_gguf_file(source.path).resolve()
        key = entry_key(cache.file_sha256(path)) if cache is not None else None
        build = lambda: convert_gguf(path, n_ctx=n_ctx)  # noqa: E731
    model = build()[0] if cache is None else cache.get_or_build(key, build, device=device, n_ctx=n_ctx)
    return move(_finish(model, source.name, device), dtype=dtype)


def _finish(model: Model, name: str, device: str) -> Model:
    model.cfg.model_name = name
    if model.tokenizer is not None:
        model.tokenizer.padding_side = "right"
    _weights_as_linear_reads_them(model)
    move(model, device)
    model.eval()
    return model


def _weights_as_linear_reads_them(model: Model) -> None:
    """The same weights, each laid out as the product TransformerLens 3.9 runs on
    it reads it, so that no forward pass copies a weight (the values, shapes and
    names stay; only strides change).

    TransformerLens 3.9 rearranges its [head, d_model, d_head] W_Q, W_K, W_V and
    [head, d_head, d_model] W_O into the [out, in] matrices `F.linear` takes, and
    the gated MLP takes `W.T.contiguous()` of W_in, W_gate and W_out: on weights
    stored [head, ...] each of those is a copy of the whole matrix on every
    forward pass (for SmolLM2 a quarter of a short sweep pass: 400 MB copied
    against 1.1 GFLOP of products). Stored as the transposes of the matrices
    those calls build, the rearranged views are already contiguous. W_U is kept
    the same way, by vocabulary rows (the embedding's and Hugging Face's lm_head's
    layout): the same values, on which `unembed(..., scratch=True)` takes BLAS's
    faster product for a few hundred rows against a large vocabulary (1.5x for
    Gemma 3's 262k on 2 AVX2 cores; scripts/bench_unembed.py), and
    TransformerLens's own Unembed.forward no longer copies W_U.T."""
    from transformer_lens.components.mlps.gated_mlp import GatedMLP

    def relayout(module: torch.nn.Module, name: str, to_read, back) -> None:
        w = module._parameters.get(name)
        if w is None or to_read(w).is_contiguous():
            return
        module._parameters[name] = torch.nn.Parameter(back(to_read(w.detach()).contiguous()),
                                                      requires_grad=w.requires_grad)

    def transpose(w):
        return w.T

    def heads_rows(w):  # [head, d_model, d_head] <-> [head, d_head, d_model]: (head d_head) rows of d_model
        return w.transpose(1, 2)

    relayout(model.unembed, "W_U", transpose, transpose)
    for block in model.blocks:
        attn = block.attn
        for name in ("W_Q", "W_K", "W_V", "_W_K", "_W_V"):
            relayout(attn, name, heads_rows, heads_rows)
        relayout(attn, "W_O", lambda w: w.permute(2, 0, 1), lambda w: w.permute(1, 2, 0))  # d_model rows of (head d_head)
        if isinstance(block.mlp, GatedMLP):
            for name in ("W_in", "W_gate", "W_out"):
                relayout(block.mlp, name, transpose, transpose)


def _from_hub(source: ModelSource, device: str) -> Model:
    """`HookedTransformer.from_pretrained` on the looked-up official name (needs the network)."""
    from transformer_lens import HookedTransformer

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "HookedTransformer.from_pretrained is deprecated", DeprecationWarning)
            model = HookedTransformer.from_pretrained(source.official or source.location, device=device)
    except Exception as e:
        raise unknown_model(source, e, "or a path to a .gguf file. Other TransformerLens names need their weights "
                            "downloaded, which this machine cannot do", "from_pretrained") from e
    if model.tokenizer is not None:
        model.tokenizer.padding_side = "right"
    _weights_as_linear_reads_them(model)
    return model


def hooked_from_hf_folder(folder: Path, n_ctx: int, *, architecture: str | None = None) -> Model:
    """HookedTransformer from a local Hugging Face folder (TransformerLens 3.9
    derives the config from the folder's config.json, whose `architectures`
    entry is `architecture`, read from the folder when not given)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformer_lens import HookedTransformer

    from sinkmech.loading.bridge import _quiet_logging

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
        reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        raise ValueError(f"TransformerLens 3.9 cannot load {folder} ({architecture or folder_architecture(folder)}: "
                         f"{reason}); {BRIDGE_LOADS}") from e
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
    with one_reader_per_file():
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
