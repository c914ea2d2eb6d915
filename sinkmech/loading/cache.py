"""Converted-model cache: dequantize a GGUF once, then load it warm.

An entry holds everything needed to rebuild a HookedTransformer without the
GGUF file: its config (`manifest.json`), its parameters (`weights.safetensors`,
never pickle) and its tokenizer (`tokenizer/`, from `save_pretrained`).
Entries are keyed by the source file's SHA256 and `CONVERSION_VERSION`, written
to a temporary folder and moved into place with `os.replace`; an entry whose
manifest, sizes or weight checksum do not agree is discarded and rebuilt.

The cache lives in `$SINKMECH_CACHE` when set, else `$XDG_CACHE_HOME/sinkmech`,
else `~/.cache/sinkmech`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import math
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from sinkmech.files import atomic_path, json_text, write_bytes
from sinkmech.loading.backend import Model
from sinkmech.loading.names import PACKAGED_MODELS

CACHE_ENV = "SINKMECH_CACHE"
# Bump when a converter's output changes, so stale entries miss instead of loading.
CONVERSION_VERSION = 1
MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"
TOKENIZER = "tokenizer"
HASH_MEMO = "sha256-memo.json"
_BLOCK = 1 << 20
# An unembedding stored as the transpose of the embedding is written once.
_TIED = ("unembed.W_U", "embed.W_E")


class CacheError(ValueError):
    """A cache entry that cannot be used (it is discarded and rebuilt)."""


class CacheNotWritableError(OSError):
    """The cache folder cannot be created or written: says which and what to do."""


def default_cache_dir() -> Path:
    """`$SINKMECH_CACHE`, else the user's cache folder + `sinkmech`."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "sinkmech"


def sha256_file(path: str | os.PathLike) -> str:
    """SHA256 of a file, read in 1 MiB blocks (never whole into memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def entry_key(sha256: str) -> str:
    """The cache key of a model converted from a file with this SHA256."""
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise ValueError(f"not a hex SHA256 digest: {sha256!r}")
    return f"{sha256}-v{CONVERSION_VERSION}"


class ModelCache:
    """A folder of converted models, keyed by `entry_key(sha256)`.

    `store(key, model)` / `load(key)` work on any HookedTransformer, so the
    cache logic is tested on a tiny random model; `get_or_build` is what the
    loaders call.
    """

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()

    def ensure_writable(self) -> None:
        """Create the cache folder and check a file can be written in it, or
        raise `CacheNotWritableError` naming the cache and the fix."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(dir=self.root, prefix=".write-test.")
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            source = f"${CACHE_ENV}" if os.environ.get(CACHE_ENV) else "the default cache folder"
            raise CacheNotWritableError(
                f"the sinkmech model cache {self.root} ({source}) cannot be written: "
                f"{e.strerror or e}; set {CACHE_ENV} to a folder you can write to"
            ) from None

    def entry_dir(self, key: str) -> Path:
        _check_key(key)
        return self.root / "models" / key

    def file_sha256(self, path: str | os.PathLike, *, memo_required: bool = True) -> str:
        """SHA256 of `path`, memoized per (path, size, mtime, inode) in a sidecar
        so a 240 MB file is hashed once; any change to the file rehashes it.
        With `memo_required=False` a cache that cannot be written still answers
        (the hash is then not memoized)."""
        path = Path(path).resolve()
        st = path.stat()
        stamp = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}
        memo_path = self.root / HASH_MEMO
        memo = _read_json(memo_path) or {}
        hit = memo.get(str(path))
        if isinstance(hit, dict) and all(hit.get(k) == v for k, v in stamp.items()):
            sha = hit.get("sha256")
            if isinstance(sha, str) and len(sha) == 64:
                return sha
        if memo_required:
            self.ensure_writable()  # before the slow hash, which is memoized in the cache
        sha = sha256_file(path)
        memo = _read_json(memo_path) or {}  # another process may have written meanwhile
        memo[str(path)] = {**stamp, "sha256": sha}
        try:
            write_bytes(memo_path, json_text(memo, sort_keys=True).encode())
        except OSError:
            if memo_required:
                raise
        return sha

    def load(
        self, key: str, *, device: str = "cpu", n_ctx: int | None = None
    ) -> Model | None:
        """The cached model, or None on a miss. A corrupt or partial entry is
        discarded (with a warning) and reported as a miss.

        Args:
            key: from `entry_key`.
            device: torch device for the model.
            n_ctx: context length to build with, capped at the model's own
                (masks and rotary tables are rebuilt, not stored).
        """
        folder = self.entry_dir(key)
        if not folder.exists():
            return None
        try:
            return _load_entry(self, folder, key, device=device, n_ctx=n_ctx)
        except Exception as e:  # any failure means the entry is unusable
            warnings.warn(f"discarding corrupt sinkmech cache entry {folder}: {e}", stacklevel=2)
            self.discard(key)
            return None

    def store(
        self, key: str, model: Model, *, context_length: int | None = None
    ) -> Path:
        """Write `model` as entry `key` (replacing any entry already there).

        Args:
            context_length: the longest context the model was trained for;
                `load(n_ctx=...)` caps at it.
        Returns:
            The entry's folder.
        """
        from safetensors.torch import save_file

        folder = self.entry_dir(key)
        self.ensure_writable()
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{key}.", suffix=".tmp"))
        try:
            weights, tied = _parameters(model)
            save_file(weights, str(tmp / WEIGHTS))
            del weights
            tok = model.tokenizer
            if tok is not None:
                tok.save_pretrained(str(tmp / TOKENIZER))
            manifest = {
                "key": key,
                "conversion_version": CONVERSION_VERSION,
                "config": config_to_json(model.cfg),
                "context_length": context_length,
                "tied_unembed": tied,
                "tokenizer": TOKENIZER if tok is not None else None,
                "weights": {
                    "file": WEIGHTS,
                    "size": (tmp / WEIGHTS).stat().st_size,
                    "sha256": sha256_file(tmp / WEIGHTS),
                },
            }
            # The manifest is written last: an entry without one is partial.
            write_bytes(tmp / MANIFEST, json_text(manifest).encode())
            if folder.exists():
                self.discard(key)
            try:
                os.replace(tmp, folder)
            except OSError:
                if not (folder / MANIFEST).exists():
                    raise
                # A concurrent writer won the race with the same conversion.
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return folder

    def discard(self, key: str) -> None:
        """Remove entry `key`, moving it aside first so no reader sees half of it."""
        folder = self.entry_dir(key)
        if not folder.exists():
            return
        trash = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".trash."))
        os.replace(folder, trash / key)
        shutil.rmtree(trash, ignore_errors=True)

    def get_or_build(
        self,
        key: str,
        build: Callable[[], tuple[Model, int | None]],
        *,
        device: str = "cpu",
        n_ctx: int | None = None,
    ) -> Model:
        """Load entry `key`, or `build()` (model on CPU, its trained context
        length or None), store it and load it back.

        Loading back (rather than returning the built model) makes the cold
        and warm paths hand out the same model, and frees the converter's copies.
        """
        model = self.load(key, device=device, n_ctx=n_ctx)
        if model is not None:
            return model
        print(f"note: converting the model once into the cache at {self.entry_dir(key)} (on 2 CPU cores about "
              "40 s for Gemma 3 270M, 10 s for SmolLM2); later loads read it back in seconds",
              file=sys.stderr, flush=True)
        built, context_length = build()
        self.store(key, built, context_length=context_length)
        del built
        _collect()
        model = self.load(key, device=device, n_ctx=n_ctx)
        if model is None:
            raise CacheError(f"cache entry {self.entry_dir(key)} was unreadable right after writing it")
        return model


def packaged_sha256(name: str) -> str:
    """The SHA256 a packaged model's package states for its GGUF file (a warm
    load keys the cache on it and never assembles the file)."""
    return importlib.import_module(PACKAGED_MODELS[name].package).EXPECTED_SHA256


def packaged_gguf_path(name: str, cache: ModelCache | None = None) -> Path:
    """The assembled .gguf of a packaged model, joined once into the cache folder.

    Args:
        name: a key of `PACKAGED_MODELS`, e.g. "gemma3-270m".
        cache: where the file goes (default: the user cache).
    """
    pkg = importlib.import_module(PACKAGED_MODELS[name].package)
    cache = cache or ModelCache()
    target = cache.root / "gguf" / pkg.MODEL_NAME
    if target.is_file() and cache.file_sha256(target) == pkg.EXPECTED_SHA256:
        return target
    cache.ensure_writable()
    target.parent.mkdir(parents=True, exist_ok=True)
    # assemble() writes in place; join into a temporary name so a killed run
    # never leaves a half file under the real one.
    with atomic_path(target) as tmp:
        pkg.assemble(str(tmp), overwrite=True)  # checks the SHA256 itself
    return target


def config_to_json(cfg) -> dict:
    """The config's constructor arguments as JSON values (dtype as its name)."""
    from transformer_lens import HookedTransformerConfig

    out = {}
    for f in dataclasses.fields(HookedTransformerConfig):
        if not f.init or f.name == "device":
            continue
        out[f.name] = _jsonable(getattr(cfg, f.name), f.name)
    return out


def config_from_json(data: dict, *, device: str):
    from transformer_lens import HookedTransformerConfig

    data = dict(data)
    if isinstance(data.get("dtype"), str):
        data["dtype"] = getattr(torch, data["dtype"].removeprefix("torch."))
    # Every parameter comes from the weights file: skip random initialisation.
    data["init_weights"] = False
    return HookedTransformerConfig(**data, device=device)


def _jsonable(value, name: str):
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, name) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v, name) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        raise CacheError(f"config field {name}={value!r} has no strict JSON form")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise CacheError(f"config field {name}={value!r} ({type(value).__name__}) has no JSON form")


def _parameters(model: Model) -> tuple[dict[str, torch.Tensor], bool]:
    """Parameters only (buffers such as masks and rotary tables are rebuilt from
    the config), with a tied unembedding left out."""
    weights = {k: v.detach().to("cpu").contiguous() for k, v in model.named_parameters()}
    w_u, w_e = _TIED
    tied = w_u in weights and w_e in weights and torch.equal(weights[w_u], weights[w_e].T)
    if tied:
        del weights[w_u]
    return weights, tied


def _load_entry(cache: ModelCache, folder: Path, key: str, *, device: str, n_ctx: int | None) -> Model:
    from safetensors.torch import load_file

    manifest = _read_json(folder / MANIFEST)
    if manifest is None:
        raise CacheError("manifest missing or unreadable (a partial write)")
    if manifest.get("key") != key or manifest.get("conversion_version") != CONVERSION_VERSION:
        raise CacheError(f"manifest is for {manifest.get('key')!r}, not {key!r}")
    info = manifest["weights"]
    weights_path = folder / info["file"]
    if not weights_path.is_file() or weights_path.stat().st_size != info["size"]:
        raise CacheError(f"{info['file']} is missing or has the wrong size")
    # memoized as the source files are (1.6 s a load for Gemma's 1.7 GB otherwise): a changed
    # file has a new stamp and is hashed again
    if cache.file_sha256(weights_path, memo_required=False) != info["sha256"]:
        raise CacheError(f"{info['file']} does not match its recorded SHA256")

    cfg_json = dict(manifest["config"])
    if n_ctx is not None:
        limit = manifest.get("context_length")
        cfg_json["n_ctx"] = min(n_ctx, limit) if limit else n_ctx
    cfg = config_from_json(cfg_json, device="cpu")
    tokenizer = None
    if manifest.get("tokenizer"):
        tokenizer = _tokenizer_with_bos(str(folder / manifest["tokenizer"]), cfg.original_architecture)
        tokenizer.padding_side = "right"
    weights = load_file(str(weights_path))
    if manifest.get("tied_unembed"):
        w_u, w_e = _TIED
        weights[w_u] = weights[w_e].T.contiguous()
    from transformer_lens import HookedTransformer

    with warnings.catch_warnings():
        # TransformerLens 3.x nags about its 4.0 successor.
        warnings.filterwarnings("ignore", "HookedTransformer is deprecated", DeprecationWarning)
        model = HookedTransformer(cfg, tokenizer=tokenizer, default_padding_side="right")
    missing, unexpected = model.load_state_dict(weights, strict=False, assign=True)
    buffers = {k for k, _ in model.named_buffers()}
    real_missing = [k for k in missing if k not in buffers]
    if real_missing or unexpected:
        raise CacheError(f"weights do not fit the config (missing {real_missing[:5]}, unexpected {unexpected[:5]})")
    if device != "cpu":
        model.to(device, print_details=False)  # HookedTransformer only: the Bridge caches HF folders
    model.eval()
    return model


# The architectures whose tokenizer HookedTransformer keeps as given.
_TOKENIZER_AS_GIVEN = ("OlmoForCausalLM", "OlmoeForCausalLM", "Olmo2ForCausalLM")


def _tokenizer_with_bos(folder: str, architecture: str | None):
    """The tokenizer as HookedTransformer would keep it: loaded with
    `add_bos_token=True` (TransformerLens otherwise loads it a second time so, 2.7 s
    for Gemma's), except where that cannot apply, which TransformerLens then
    handles as before."""
    from transformers import AutoTokenizer

    if architecture not in _TOKENIZER_AS_GIVEN:
        try:
            tokenizer = AutoTokenizer.from_pretrained(folder, add_bos_token=True)
        except ValueError:  # a special token the post-processor cannot express
            tokenizer = None
        if tokenizer is not None and tokenizer.bos_token is not None:
            return tokenizer
    return AutoTokenizer.from_pretrained(folder)


def _check_key(key: str) -> None:
    if not key or "/" in key or "\\" in key or key.startswith("."):
        raise ValueError(f"bad cache key {key!r}")


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _collect() -> None:
    import gc

    gc.collect()
