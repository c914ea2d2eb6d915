"""bfloat16 / float16 on a CPU without native support: `load_model` warns once,
before anything is cast, with the slowdown it measured there and then, and
advises float32; silent on a CPU that has the instructions, and for float32.
The CPU's flags are replaced both ways (the machine running the suite may have
them or not)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from sinkmech.loading import models
from helpers.tiny_hf import save_tiny


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return str(save_tiny(tmp_path_factory.mktemp("tiny") / "llama", "llama"))


def load_warnings(spec: str, dtype: str, **kw) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = models.load_model(spec, device="cpu", dtype=dtype, **kw)
    assert model.cfg.dtype == models.check_dtype(dtype)
    return [str(w.message) for w in caught if "native" in str(w.message)]


def test_half_precision_without_native_support_warns_once_with_a_measured_slowdown(tiny_folder, monkeypatch):
    monkeypatch.setattr(models, "cpu_flags", lambda: {"avx2", "fma"})  # no AVX-512 BF16 / FP16, no AMX
    for dtype in ("bfloat16", "float16"):
        found = load_warnings(tiny_folder, dtype)
        assert len(found) == 1, found
        assert f"--dtype {dtype} on a CPU without native {dtype} support" in found[0]
        assert "slower here than in float32 (measured now)" in found[0] and "use float32" in found[0]
    assert load_warnings(tiny_folder, "float32") == []


def test_silent_where_the_cpu_has_the_instructions(tiny_folder, monkeypatch):
    monkeypatch.setattr(models, "cpu_flags", lambda: {"avx2", "avx512_bf16", "avx512_fp16"})
    assert load_warnings(tiny_folder, "bfloat16") == []
    assert load_warnings(tiny_folder, "float16") == []
    monkeypatch.setattr(models, "cpu_flags", lambda: {"amx_bf16"})
    assert load_warnings(tiny_folder, "bfloat16") == []


def test_the_warning_comes_before_the_model_loads(monkeypatch):
    monkeypatch.setattr(models, "cpu_flags", lambda: set())

    def stop(*a, **k):
        raise RuntimeError("loading")

    monkeypatch.setattr(models, "_load", stop)
    with pytest.warns(UserWarning, match="bfloat16 on a CPU without native"), pytest.raises(RuntimeError, match="loading"):
        models.load_model("smollm2", device="cpu", dtype="bfloat16")


def test_unknown_flags_decide_by_the_measurement(monkeypatch):
    monkeypatch.setattr(models, "cpu_flags", lambda: None)  # no /proc/cpuinfo
    monkeypatch.setattr(models, "cpu_slowdown", lambda dtype: 1.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        models.warn_slow_cpu_dtype(torch.bfloat16, "cpu")  # 1.5x: not worth a word
    monkeypatch.setattr(models, "cpu_slowdown", lambda dtype: 37.0)
    with pytest.warns(UserWarning, match="runs 37x slower here"):
        models.warn_slow_cpu_dtype(torch.bfloat16, "cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        models.warn_slow_cpu_dtype(torch.bfloat16, "cuda")  # not a CPU


def test_the_slowdown_is_a_measured_ratio():
    ratio = models.cpu_slowdown(torch.bfloat16, size=64, repeats=2)
    assert math.isfinite(ratio) and ratio > 0
