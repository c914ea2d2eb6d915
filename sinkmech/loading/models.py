"""Model loading: "smollm2", "gemma3-270m", a .gguf path, a local Hugging Face
folder, or a hub name, on the backend the installed TransformerLens gives
(`sinkmech.loading.backend`), in float32, bfloat16 or float16, on any device.

TransformerBridge (TransformerLens 4): every GGUF goes through transformers'
reader into a Hugging Face folder in the cache, which the Bridge boots
(`sinkmech.loading.bridge`). HookedTransformer (TransformerLens 3.9): the
GGUF converters live in `sinkmech.loading.hooked`. Both are converted once and then loaded warm from `sinkmech.loading.cache`.

Every loaded model has a tokenizer that pads on the right (so a causal model
never lets padding touch a real token) and a known `<bos>` id: read it with
`bos_token_id(model)`. Tokenizers may add `<bos>` themselves (Gemma's does);
sinkmech always tokenizes with `add_special_tokens=False` and prepends it
explicitly, so `cfg.default_prepend_bos` is never consulted.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
import importlib
import importlib.util
import os
import tempfile
import warnings
from pathlib import Path

import torch

from sinkmech.loading.backend import DTYPES, IS_BRIDGE, Model, move
from sinkmech.loading.gguf import check_gguf_file
from sinkmech.loading.hooked import convert_gguf, hooked_from_hf_folder
from sinkmech.loading.cache import ModelCache, entry_key
from sinkmech.loading.names import (  # noqa: F401  (re-exported: sinkmech.loading.models is where callers look)
    DEFAULT_MODEL,
    GEMMA3_270M,
    MODEL_FORMS,
    PACKAGED_MODELS,
    SMOLLM2_INSTALL,
    SMOLLM2_PACKAGE,
    ModelNotFoundError,
    PackagedGGUF,
    check_device,
    check_model_spec,
    smollm2_path,
)

def packaged_gguf_path(name: str, cache: ModelCache | None = None) -> Path:
    """The assembled .gguf of a packaged model, joined once into the cache folder.

    Args:
        name: a key of `PACKAGED_MODELS`, e.g. "gemma3-270m".
        cache: where the file goes (default: the user cache).
    """
    entry = _packaged(name)
    pkg = importlib.import_module(entry.package)
    cache = cache or ModelCache()
    target = cache.root / "gguf" / pkg.MODEL_NAME
    if target.is_file() and cache.file_sha256(target) == pkg.EXPECTED_SHA256:
        return target
    cache.ensure_writable()
    target.parent.mkdir(parents=True, exist_ok=True)
    # assemble() writes in place; join into a temporary name so a killed run
    # never leaves a half file under the real one.
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        pkg.assemble(tmp, overwrite=True)  # checks the SHA256 itself
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target


def load_model(
    spec: str = DEFAULT_MODEL,
    *,
    device: str | None = None,
    dtype: str | torch.dtype = "float32",
    n_ctx: int = 2048,
    cache: bool | ModelCache = True,
) -> Model:
    """Load a model (HookedTransformer or TransformerBridge, as the installed
    TransformerLens gives) with its tokenizer set.

    Args:
        spec: "smollm2" (the offline default), "gemma3-270m", a path to a .gguf
            file, a local Hugging Face folder (config.json + safetensors), or a
            hub name (needs the network).
        device: torch device; default CUDA when present, else CPU.
        dtype: "float32" (default), "bfloat16" or "float16" (or a torch dtype).
        n_ctx: context length (capped at the model's own).
        cache: GGUF models only. True: the converted-model cache in the user
            cache folder (`$SINKMECH_CACHE`); a `ModelCache`: that one; False:
            convert from the GGUF every time.
    """
    dtype = check_dtype(dtype)
    device = check_device(device)
    warn_slow_cpu_dtype(dtype, device)  # before anything is cast
    # TransformerLens prints "Moving model to device" on stdout: stdout is for results.
    with contextlib.redirect_stdout(sys.stderr):
        model = _load(spec, device, n_ctx, cache, dtype)
    return move(model, dtype=dtype)


# Half-precision on a CPU: without native instructions (x86: AVX-512 BF16 / FP16
# or AMX; Arm: the bf16 / fp16 extensions) torch emulates bfloat16 and float16
# matmuls, tens of times slower than float32 (scripts/bench_dtype.py measures a
# whole forward pass on both offline models).

CPU_FLAGS = {  # dtype name -> /proc/cpuinfo flags, any of which means native support
    "bfloat16": ("avx512_bf16", "amx_bf16", "bf16"),
    "float16": ("avx512_fp16", "amx_fp16", "fphp", "asimdhp"),
}
SLOWDOWN_SIZE = 256  # the side of the square matmul timed for the warning (a few ms in float32)


def cpu_flags() -> set[str] | None:
    """The CPU's feature flags from /proc/cpuinfo (None where there is none to read)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    return flags


def native_cpu_dtype(dtype: torch.dtype) -> bool | None:
    """Whether this CPU computes `dtype` natively (float32: always); None when it
    cannot be told (no /proc/cpuinfo)."""
    name = str(dtype).removeprefix("torch.")
    if name not in CPU_FLAGS:
        return True
    flags = cpu_flags()
    if flags is None:
        return None
    return any(f in flags for f in CPU_FLAGS[name])


@functools.lru_cache(maxsize=None)
def cpu_slowdown(dtype: torch.dtype, size: int = SLOWDOWN_SIZE, repeats: int = 3) -> float:
    """How many times slower a `size` x `size` matmul runs on this CPU in `dtype`
    than in float32 (the best of `repeats` runs of each, after a warm-up)."""
    def best(dt) -> float:
        a = torch.randn(size, size, generator=torch.Generator().manual_seed(0)).to(dt)
        a @ a  # warm-up
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            a @ a
            times.append(time.perf_counter() - t)
        return min(times)

    return best(dtype) / best(torch.float32)


def warn_slow_cpu_dtype(dtype: torch.dtype, device: str) -> None:
    """One warning, with the slowdown measured here and now, when a model is about
    to be cast to bfloat16 or float16 on a CPU that does not compute them
    natively (or, where the CPU's flags cannot be read, when the measurement
    finds it more than 2x slower)."""
    if not str(device).startswith("cpu") or dtype == torch.float32:
        return
    native = native_cpu_dtype(dtype)
    if native:
        return
    ratio = cpu_slowdown(dtype)
    if native is None and ratio <= 2.0:
        return
    name = str(dtype).removeprefix("torch.")
    warnings.warn(f"--dtype {name} on a CPU without native {name} support: a {SLOWDOWN_SIZE}x{SLOWDOWN_SIZE} matmul "
                  f"runs {ratio:.0f}x slower here than in float32 (measured now); use float32 on this CPU "
                  f"(--dtype float32, the default)", stacklevel=3)


def check_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A dtype name ("float32", "bfloat16", "float16") or torch dtype -> the torch dtype."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")


def _load(spec, device, n_ctx, cache, dtype) -> Model:
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"model spec must be a non-empty string, got {spec!r}")
    if not isinstance(n_ctx, int) or n_ctx < 1:
        raise ValueError(f"n_ctx must be a positive integer, got {n_ctx!r}")
    store = _as_cache(cache)
    if IS_BRIDGE:
        return _load_bridge(spec, device, n_ctx, store, dtype)
    if Path(spec).is_dir():
        return _finish(hooked_from_hf_folder(Path(spec), n_ctx), Path(spec).name, device)
    if spec == DEFAULT_MODEL:
        return _from_gguf(smollm2_path(), device, n_ctx, name=DEFAULT_MODEL, cache=store)
    if spec in PACKAGED_MODELS:
        return _from_package(spec, device, n_ctx, cache=store)
    if spec.endswith(".gguf") or Path(spec).is_file():
        return _from_gguf(Path(spec), device, n_ctx, name=Path(spec).stem, cache=store)
    from transformer_lens import HookedTransformer

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "HookedTransformer.from_pretrained is deprecated", DeprecationWarning)
            model = HookedTransformer.from_pretrained(spec, device=device)
    except Exception as e:
        raise _unknown_model(spec, e, "or a path to a .gguf file. Other TransformerLens names need their weights "
                             "downloaded, which this machine cannot do", "from_pretrained") from e
    if model.tokenizer is not None:
        model.tokenizer.padding_side = "right"
    return model


def _unknown_model(spec: str, error: Exception, what_else: str, loader: str) -> ModelNotFoundError:
    """The one 'unknown model' message: what works offline, and the loader's first line of complaint."""
    reason = str(error).splitlines()[0] if str(error) else ""
    reason = reason if len(reason) <= 160 else reason[:160] + " ..."
    return ModelNotFoundError(
        f"unknown model {spec!r}. Offline here: {', '.join([DEFAULT_MODEL, *PACKAGED_MODELS])}, {what_else} "
        f"({loader} said: {type(error).__name__}: {reason})"
    )


def _load_bridge(spec: str, device: str, n_ctx: int, store: ModelCache | None, dtype: torch.dtype) -> Model:
    """TransformerBridge: GGUF -> (cached) Hugging Face folder -> Bridge."""
    from sinkmech.loading.bridge import boot_bridge, cached_hf_folder, hf_folder_entry

    boot = lambda folder, name: boot_bridge(folder, device=device, dtype=dtype, n_ctx=n_ctx, name=name)  # noqa: E731
    if spec == DEFAULT_MODEL:
        return boot(cached_hf_folder(smollm2_path(), store), DEFAULT_MODEL)
    if spec in PACKAGED_MODELS:
        entry = _packaged(spec)
        sha = importlib.import_module(entry.package).EXPECTED_SHA256
        warm = hf_folder_entry(store, sha) if store is not None else None
        if warm is not None and (warm / "config.json").is_file():
            return boot(warm, spec)  # a warm load never assembles the file
        return boot(cached_hf_folder(packaged_gguf_path(spec, store), store), spec)
    if Path(spec).is_dir():
        return boot(Path(spec), Path(spec).name)
    if spec.endswith(".gguf") or Path(spec).is_file():
        return boot(cached_hf_folder(Path(spec), store), Path(spec).stem)
    try:
        from transformer_lens.model_bridge import TransformerBridge

        model = TransformerBridge.boot_transformers(spec, device=device, dtype=dtype)
    except Exception as e:
        raise _unknown_model(spec, e, "a path to a .gguf file or a local Hugging Face folder. Hub names need the "
                             "network", "boot_transformers") from e
    model.tokenizer.padding_side = "right"
    return model.eval()


def _as_cache(cache: bool | ModelCache) -> ModelCache | None:
    if isinstance(cache, ModelCache):
        return cache
    if cache is True:
        return ModelCache()
    if cache is False:
        return None
    raise ValueError(f"cache must be True, False or a ModelCache, got {cache!r}")


def _packaged(name: str) -> PackagedGGUF:
    entry = PACKAGED_MODELS[name]
    missing = [m for m in (entry.package, *entry.parts) if importlib.util.find_spec(m) is None]
    if missing:
        raise ModelNotFoundError(
            f"model {name!r} is not installed (missing {', '.join(missing)}); run `{entry.install}`"
        )
    return entry


def _from_package(name: str, device: str, n_ctx: int, *, cache: ModelCache | None) -> Model:
    entry = _packaged(name)

    def build():
        path = packaged_gguf_path(name, cache)
        return convert_gguf(path, n_ctx=n_ctx, tl_name=entry.tl_name)

    if cache is None:
        model, _ = build()
    else:
        # The package states the file's SHA256: a warm load never assembles it.
        sha = importlib.import_module(entry.package).EXPECTED_SHA256
        model = cache.get_or_build(entry_key(sha), build, device=device, n_ctx=n_ctx)
    return _finish(model, name, device)


def _from_gguf(
    path: Path, device: str, n_ctx: int, *, name: str, cache: ModelCache | None
) -> Model:
    path = check_gguf_file(path).resolve()
    build = lambda: convert_gguf(path, n_ctx=n_ctx)  # noqa: E731
    if cache is None:
        model, _ = build()
    else:
        key = entry_key(cache.file_sha256(path))
        model = cache.get_or_build(key, build, device=device, n_ctx=n_ctx)
    return _finish(model, name, device)


def _finish(model: Model, name: str, device: str) -> Model:
    model.cfg.model_name = name
    if model.tokenizer is not None:
        model.tokenizer.padding_side = "right"
    move(model, device)
    model.eval()
    return model


def bos_token_id(model: Model) -> int:
    """The id of the model's `<bos>` token, or a clear error if it has none."""
    tok = model.tokenizer
    bos = getattr(tok, "bos_token_id", None) if tok is not None else None
    if bos is None:
        raise ValueError(
            f"model {model.cfg.model_name!r} has no <bos> token in its tokenizer; "
            "pass bos_token_id= explicitly"
        )
    return int(bos)
