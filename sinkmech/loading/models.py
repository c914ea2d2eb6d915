"""Model loading: "smollm2", "gemma3-270m", a .gguf path, a local Hugging Face
folder, or a hub name, on the backend the installed TransformerLens gives
(`sinkmech.loading.backend`), in float32, bfloat16 or float16, on any device.

The spec is read once, by `sinkmech.loading.names.resolve_source`, into a
`ModelSource` (package, GGUF file, folder or hub name); the installed
backend's loader takes it from there: `sinkmech.loading.hooked.load_hooked`
(TransformerLens 3.9: GGUF converted to a HookedTransformer, cached as weights)
or `sinkmech.loading.bridge.load_bridge` (TransformerLens 4: GGUF converted to
a Hugging Face folder, cached, booted as a TransformerBridge). Both convert once
and then load warm from `sinkmech.loading.cache`.

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
import warnings
from pathlib import Path

import torch

from sinkmech.loading.backend import CAPABILITIES, DTYPES, Model
from sinkmech.loading.bridge import load_bridge
from sinkmech.loading.cache import ModelCache, packaged_gguf_path  # noqa: F401  (re-exported)
from sinkmech.loading.hooked import load_hooked
from sinkmech.loading.names import (  # noqa: F401  (re-exported: sinkmech.loading.models is where callers look)
    DEFAULT_MODEL,
    GEMMA3_270M,
    MODEL_FORMS,
    PACKAGED_MODELS,
    SMOLLM2_INSTALL,
    SMOLLM2_PACKAGE,
    ModelNotFoundError,
    ModelSource,
    PackagedGGUF,
    check_device,
    check_model_spec,
    resolve_source,
    smollm2_path,
)


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
        return _load(spec, device, n_ctx, cache, dtype)


def each_model(models, *, device: str | None = None, dtype: str | torch.dtype | None = None):
    """(name, model) for each of `models`: a loaded model, a spec to load (see
    `load_model`), or a list of either. Specs are loaded in turn and let go before
    the next loads, so one model is in memory at a time; a spec's name is the spec,
    a loaded model's its `cfg.model_name`."""
    import gc

    items = models if isinstance(models, (list, tuple)) else [models]
    for item in items:
        if isinstance(item, (str, Path)):
            model = load_model(str(item), device=device, dtype=dtype or "float32")
            yield str(item), model
            del model
            gc.collect()
        else:
            yield item.cfg.model_name, item


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


# One loader per backend, each taking a resolved source (never the spec) and
# returning the model on the device, in the dtype, in eval mode.
LOADERS = {"HookedTransformer": load_hooked, "TransformerBridge": load_bridge}


def _load(spec, device, n_ctx, cache, dtype) -> Model:
    source = resolve_source(spec)
    if not isinstance(n_ctx, int) or n_ctx < 1:
        raise ValueError(f"n_ctx must be a positive integer, got {n_ctx!r}")
    return LOADERS[CAPABILITIES.backend](source, device=device, dtype=dtype, n_ctx=n_ctx, cache=_as_cache(cache))


def _as_cache(cache: bool | ModelCache) -> ModelCache | None:
    if isinstance(cache, ModelCache):
        return cache
    if cache is True:
        return ModelCache()
    if cache is False:
        return None
    raise ValueError(f"cache must be True, False or a ModelCache, got {cache!r}")


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
