"""Loading for the TransformerBridge backend (TransformerLens 4): a resolved
`ModelSource` (`sinkmech.loading.names`) -> transformers model ->
`TransformerBridge` (`load_bridge`).

GGUF files (and the packaged models) are read by transformers' own GGUF reader
(every architecture it reads: llama, qwen2/3, gemma3, ...), dequantized to
float32 once, and saved as a plain Hugging Face folder (config + safetensors +
tokenizer) in the converted-model cache (`sinkmech.loading.cache.ModelCache.root
/ "hf"`), keyed by the file's SHA256. A warm load reads that folder and boots
the Bridge; it never parses the GGUF again. Local folders boot as they are, hub
repo ids through transformers (they need the network).

The Bridge runs transformers' eager attention on the raw weights (no
compatibility mode: its hook names are already TransformerLens' own, and its
logits are transformers' logits, so nothing is folded or centred).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import torch

from sinkmech.loading.cache import ModelCache, packaged_gguf_path, packaged_sha256
from sinkmech.loading.gguf import GGUFError, check_gguf_file, one_reader_per_file
from sinkmech.loading.names import ModelSource, check_hf_folder, unknown_model

HF_ENTRY_VERSION = 1


def load_bridge(source: ModelSource, *, device: str, dtype: torch.dtype, n_ctx: int, cache: ModelCache | None):
    """The TransformerBridge over the model `source` names, in `dtype` on `device`, in eval mode.

    Args:
        n_ctx: context length (capped at the model's own).
        cache: where GGUF and packaged models are converted once into Hugging
            Face folders (None: a temporary folder every time).
    """
    if source.kind == "hub":
        return _from_hub(source, device=device, dtype=dtype)
    if source.kind == "folder":
        folder = source.path
    elif source.kind == "package":
        warm = hf_folder_entry(cache, packaged_sha256(source.location)) if cache is not None else None
        if warm is not None and (warm / "config.json").is_file():
            folder = warm  # a warm load never assembles the file
        else:
            folder = cached_hf_folder(packaged_gguf_path(source.location, cache), cache)
    else:
        folder = cached_hf_folder(source.path, cache)
    return boot_bridge(folder, device=device, dtype=dtype, n_ctx=n_ctx, name=source.name)


def _from_hub(source: ModelSource, *, device: str, dtype: torch.dtype):
    """`TransformerBridge.boot_transformers` on a hub repo id or a looked-up official name (needs the network)."""
    from transformer_lens.model_bridge import TransformerBridge

    try:
        model = TransformerBridge.boot_transformers(source.official or source.location, device=device, dtype=dtype)
    except Exception as e:
        raise unknown_model(source, e, "a path to a .gguf file or a local Hugging Face folder. Hub names need the "
                            "network", "boot_transformers") from e
    model.tokenizer.padding_side = "right"
    return model.eval()


def read_gguf_transformers(path: Path):
    """(model, tokenizer) from a GGUF file, dequantized by transformers to float32."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(path.parent), path.name
    try:
        with one_reader_per_file():  # the config, the tokenizer and the weights: one parse of the file
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            hf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except Exception as e:
        raise GGUFError(f"transformers cannot read {path}: {type(e).__name__}: {e}") from e
    # The weights are already dequantized; a config that still says GGUF would
    # make the saved folder ask for a quantizer.
    hf.config.__dict__.pop("quantization_config", None)
    hf.hf_quantizer = None
    hf.is_quantized = False
    return hf, tokenizer


def save_hf_folder(hf, tokenizer, folder: Path) -> Path:
    """Write a transformers model and its tokenizer as a Hugging Face folder,
    whole or not at all (a temporary folder renamed into place)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".tmp"))
    try:
        hf.config.architectures = [type(hf).__name__]
        hf.save_pretrained(str(tmp), safe_serialization=True)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.save_pretrained(str(tmp))
        if folder.exists():
            shutil.rmtree(folder)
        try:
            os.replace(tmp, folder)
        except OSError:
            if not _complete(folder):
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # a concurrent writer won with the same conversion
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def hf_folder_entry(cache: ModelCache, sha256: str) -> Path:
    """Where `cache` keeps the Hugging Face folder converted from the GGUF file with this SHA256."""
    return cache.root / "hf" / f"{sha256}-v{HF_ENTRY_VERSION}"


def _complete(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def cached_hf_folder(path: Path, cache: ModelCache | None) -> Path:
    """The Hugging Face folder converted from GGUF `path`, built once into `cache`
    or into a temporary folder when `cache` is None."""
    path = check_gguf_file(path).resolve()
    if cache is None:
        folder = Path(tempfile.mkdtemp(prefix="sinkmech-hf-")) / "model"
    else:
        folder = hf_folder_entry(cache, cache.file_sha256(path))
        if _complete(folder):
            return folder
    hf, tokenizer = read_gguf_transformers(path)
    with _quiet_logging():
        save_hf_folder(hf, tokenizer, folder)
    del hf
    return folder


def boot_bridge(folder: Path, *, device: str, dtype: torch.dtype, n_ctx: int, name: str):
    """A TransformerBridge over the model in a local Hugging Face folder, with
    eager attention, in `dtype` on `device`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformer_lens.model_bridge import TransformerBridge

    check_hf_folder(folder)
    try:
        with _quiet_logging():
            tokenizer = AutoTokenizer.from_pretrained(str(folder))
            hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, attn_implementation="eager")
    except Exception as e:
        raise ValueError(f"transformers cannot load {folder}: {type(e).__name__}: {str(e).splitlines()[0]}") from e
    if not getattr(hf.config, "architectures", None):
        # The Bridge picks its adapter from `architectures`.
        hf.config.architectures = [type(hf).__name__]
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    hf.eval()
    with warnings.catch_warnings(), _quiet_logging():
        warnings.simplefilter("ignore")
        try:
            bridge = TransformerBridge.boot_transformers(str(folder), hf_model=hf, tokenizer=tokenizer,
                                                         device=device, dtype=dtype)
        except Exception as e:
            raise ValueError(f"TransformerLens' Bridge cannot boot {folder} "
                             f"({hf.config.architectures[0]}): {type(e).__name__}: {str(e).splitlines()[0]}") from e
    bridge.cfg.n_ctx = min(int(n_ctx), int(bridge.cfg.n_ctx or n_ctx))
    theta = rope_theta(hf.config)
    if theta is not None:  # the Bridge's config keeps TransformerLens' default (10000), not the model's
        bridge.cfg.rotary_base = theta
    bridge.cfg.model_name = name
    bridge.tokenizer.padding_side = "right"
    bridge.eval()
    check_readout(bridge, folder, tol=1e-3 if dtype == torch.float32 else 0.1)
    return bridge


def check_readout(bridge, folder: Path, *, tol: float) -> None:
    """`ValueError` unless the model's whole forward pass and sinkmech's readout
    of its last block's output (`sinkmech.loading.backend.unembed`, which every loss and
    KL uses) give the same log-probabilities on a few tokens: an architecture
    whose logits sinkmech cannot reproduce is refused at load, never half-supported."""
    from sinkmech.loading.backend import forward, unembed

    L = bridge.cfg.n_layers
    ids = torch.arange(min(4, int(bridge.cfg.d_vocab)), device=bridge.cfg.device)[None]
    name = f"{folder} ({bridge.cfg.architecture or 'unnamed architecture'})"
    with torch.no_grad():
        whole = torch.log_softmax(bridge(ids).float(), -1)
        try:
            ours = torch.log_softmax(unembed(bridge, forward(bridge, ids, stop_at_layer=L)).float(), -1)
        except Exception as e:  # a causal LM whose forward does not fit `backend._model_readout`
            raise ValueError(f"{name}: sinkmech cannot read the logits from the last block's output "
                             f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from e
    gap = float((whole - ours).abs().max())
    if not gap <= tol:
        raise ValueError(f"{name}: the logits read from the "
                         f"last block's output differ from the model's own forward pass by {gap:.3g} in log-probability "
                         "(sinkmech cannot reproduce this architecture's readout)")


def rope_theta(config) -> float | None:
    """The rotary base of a transformers config (`rope_parameters` in transformers 5,
    per attention type for Gemma 3: the global layers'; `rope_theta` before)."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict):
        if "rope_theta" in params:
            return float(params["rope_theta"])
        full = params.get("full_attention")
        if isinstance(full, dict) and "rope_theta" in full:
            return float(full["rope_theta"])
    theta = getattr(config, "rope_theta", None)
    return None if theta is None else float(theta)


@contextlib.contextmanager
def _quiet_logging():
    """Warnings at ERROR and no transformers progress bars ("Loading weights",
    "Writing model shards"): a load writes nothing to stderr unless it fails."""
    from transformers.utils import logging as hf_logging

    root = logging.getLogger()
    old, bars = root.level, hf_logging.is_progress_bar_enabled()
    root.setLevel(logging.ERROR)
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        root.setLevel(old)
        if bars:
            hf_logging.enable_progress_bar()
