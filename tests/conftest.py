"""Shared fixtures: a tiny random model (fast) and the real SmolLM2 (loaded once per test run)."""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import torch

    from sinkmech.loading.backend import Model


def pytest_configure(config):
    """In each process that runs tests: import what sinkmech imports before sinkmech (below),
    and build each jaxtyping checker once. pytest-xdist's controller (`-n 2`) runs no test,
    so it skips both (5 s of imports it would not use)."""
    if config.getoption("numprocesses", None) and not hasattr(config, "workerinput"):
        return
    # Imported before sinkmech: jaxtyping's import hook (pytest --jaxtyping-packages) gives the
    # cached bytecode of every module imported while a sinkmech module loads its own name, so
    # without these (and with PYTHONDONTWRITEBYTECODE) each test run compiled transformers,
    # TransformerLens, pandas and sympy from source: seconds per run.
    import matplotlib.pyplot  # noqa: F401
    import transformer_lens  # noqa: F401

    _reuse_jaxtyping_checkers()
    _lean_jaxtyping_wrappers()


def _lean_jaxtyping_wrappers() -> None:
    """The same checks as jaxtyping's wrapper with beartype, for less: jaxtyping's
    wrapper binds each call's arguments, checks them, calls the function, then checks
    the arguments again with the return value. For a function with no array annotation
    (a p-value, a dataclass of counts, a hook name: hundreds of thousands of calls) the
    shape memo it keeps holds nothing, and beartype alone makes the same checks; one
    with array annotations gets beartype inside jaxtyping's shape-memo context (its
    documented double-decorator form), so the dimensions stay shared across arguments
    and return value, checked once. Kept on jaxtyping's own wrapper: functions defined
    inside others (built again on every call of the outer one: their checkers are
    shared, `_reuse_jaxtyping_checkers`), generators, and hints that do not resolve
    where the function is defined (a name imported for type checkers only)."""
    import dataclasses
    import hashlib
    import typing

    import jaxtyping
    from beartype import BeartypeConf, beartype
    from jaxtyping import _decorator as jd
    from jaxtyping._array_types import AbstractArray
    from jaxtyping._import_hook import Typechecker

    full = jaxtyping.jaxtyped
    # raising what jaxtyping raises, so `pytest.raises(TypeCheckError)` holds either way
    alone = beartype(conf=BeartypeConf(violation_type=jaxtyping.TypeCheckError))

    def holds_array(hint) -> bool:
        if inspect.isclass(hint) and issubclass(hint, AbstractArray):
            return True
        return any(holds_array(h) for h in typing.get_args(hint))

    def lean(fn):
        """`fn` checked the lean way, or None where jaxtyping's wrapper should do it."""
        if (not inspect.isfunction(fn) or inspect.isgeneratorfunction(fn) or "<locals>" in fn.__qualname__
                or not fn.__annotations__ or getattr(fn, "__no_type_check__", False)):
            return None
        try:
            hints = typing.get_type_hints(fn, include_extras=True)
        except Exception:  # noqa: BLE001 (any hint that does not resolve now)
            return None
        if any(isinstance(h, (str, typing.ForwardRef)) for h in hints.values()):
            return None
        checked = alone(fn)
        return full(checked, typechecker=None) if any(holds_array(h) for h in hints.values()) else checked

    def jaxtyped(fn=jd._sentinel, *, typechecker=jd._sentinel):
        if fn is jd._sentinel:
            return lambda f: jaxtyped(f, typechecker=typechecker)
        # the import hook's stand-in for beartype.beartype (pyproject's --jaxtyping-packages)
        hooked = Typechecker.lookup.get(hashlib.md5(b"beartype.beartype").hexdigest())
        if typechecker is not beartype and (hooked is None or typechecker is not hooked):
            return full(fn, typechecker=typechecker)
        if inspect.isclass(fn) and dataclasses.is_dataclass(fn):
            init = lean(fn.__init__)
            if init is not None:
                fn.__init__ = init
                return fn
        elif (checked := lean(fn)) is not None:
            return checked
        return full(fn, typechecker=typechecker)

    jaxtyping.jaxtyped = jaxtyped


def _reuse_jaxtyping_checkers() -> None:
    """jaxtyping's import hook decorates nested functions too, so each call of an outer
    function decorates its inner ones again, and beartype compiles a new checker for each
    (some 15,000 compilations, a fifth of the fast suite's time). A checker depends only on
    the function's name and signature: build it once per signature. The checks are the same."""
    from jaxtyping import _decorator as jd

    make, apply = jd._make_fn_with_signature, jd._apply_typechecker
    made: dict = {}
    checked: dict = {}

    def make_once(name, qualname, module, signature, output):
        key = (name, qualname, module, signature, output)
        try:
            if key not in made:
                made[key] = make(name, qualname, module, signature, output)
        except TypeError:  # an unhashable default or annotation
            return make(name, qualname, module, signature, output)
        return made[key]

    def apply_once(typechecker, fn):
        key = (typechecker, fn)
        try:
            if key not in checked:
                checked[key] = apply(typechecker, fn)
        except TypeError:
            return apply(typechecker, fn)
        return checked[key]

    jd._make_fn_with_signature, jd._apply_typechecker = make_once, apply_once

_TESTS = Path(__file__).resolve().parent
# Fixtures that load a real model: every test using one is marked `slow`
# automatically, so `pytest -m "not slow"` never loads a real model.
REAL_MODEL_FIXTURES = {"smollm2", "gemma", "gemma_transformers"}

# `backend` and `pure`, also set automatically: the TransformerLens 4 suite (the
# Makefile's `-m backend`) runs only the tests that can differ between backends.
# A test is `backend` when it can touch a model: its code, its fixtures' code or
# the code of any tests/ helper they call names one of MODEL_WORDS (the model
# fixtures, make_tiny, tiny_hf, load_model, training, the command line's entry
# point, a subprocess, ...), or reads a model object; or it is marked `backend` by hand.
# Every other test is `pure` (figures, statistics, file formats, scripts' text)
# and runs once, on TransformerLens 3.9, where a pure test that builds a model
# anyway fails saying so (`_pure_tests_build_no_model`): new tests need no marking.
MODEL_WORDS = re.compile(
    r"\b(tiny_model|smollm2|gemma\w*|make_tiny|tiny_hf|save_tiny|load_model|HookedTransformer\w*|TransformerBridge|"
    r"from_pretrained|subprocess|run_path|sinkmech\.models|cli\.main|main|train|build_model|load_checkpoint|study)\b")


def pytest_collection_modifyitems(config, items):
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        # a real model asked for by name (`request.getfixturevalue(name)` over a parametrized name) counts too
        params = getattr(getattr(item, "callspec", None), "params", {})
        names |= {v for v in params.values() if isinstance(v, str)}
        if REAL_MODEL_FIXTURES & names:
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("backend") is None:
            item.add_marker(pytest.mark.backend if _touches_model(item) else pytest.mark.pure)


def _touches_model(item) -> bool:
    """Whether the test, its fixtures or the tests/ helpers they call can touch a model."""
    from torch import nn

    funcs = [getattr(item, "function", None)]
    for defs in getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {}).values():
        funcs += [d.func for d in defs]
    seen: set[int] = set()
    while funcs:
        f = funcs.pop()
        if f is None or f is _GUARD or id(f) in seen or not _in_tests(f):
            continue
        seen.add(id(f))
        if MODEL_WORDS.search(_source(f)):
            return True
        if isinstance(f, type):  # a helper class: its methods
            funcs += [v for v in vars(f).values() if inspect.isfunction(v)]
            continue
        code = getattr(f, "__code__", None)
        if code is None:
            continue
        scope = dict(getattr(f, "__globals__", {}))
        scope.update(_local_imports(_source(f)))
        names = _code_names(code) | set(code.co_varnames) | set(code.co_cellvars)
        for name in names:
            obj = scope.get(name)
            if isinstance(obj, nn.Module):  # a model built when the module was imported
                return True
            if inspect.ismodule(obj) and _in_tests(obj):  # helpers reached as module.attribute
                funcs += [getattr(getattr(obj, n), "__wrapped__", getattr(obj, n)) for n in names
                          if callable(getattr(obj, n, None))]
            elif callable(obj):
                funcs.append(getattr(obj, "__wrapped__", obj))
    return False


def _in_tests(obj) -> bool:
    try:
        return Path(inspect.getfile(obj)).resolve().is_relative_to(_TESTS)
    except (TypeError, OSError):
        return False


@functools.cache
def _source(f) -> str:
    try:
        return inspect.getsource(f)
    except (TypeError, OSError):
        return ""


def _local_imports(source: str) -> dict:
    """What `from <tests module> import a, b` inside a function binds."""
    found = {}
    for module, what in re.findall(r"from\s+([\w.]+)\s+import\s+\(?([\w\s,]+)", source):
        if not (_TESTS / (module.replace(".", "/") + ".py")).exists():
            continue
        mod = importlib.import_module(module)
        if _in_tests(mod):
            for name in re.findall(r"\w+", what):
                if hasattr(mod, name):
                    found[name] = getattr(mod, name)
    return found


def _code_names(code) -> set[str]:
    """Every global or attribute name the code (its lambdas and inner functions too) reads."""
    names = set(code.co_names)
    for c in code.co_consts:
        if inspect.iscode(c):
            names |= _code_names(c)
    return names


@pytest.fixture(autouse=True)
def _pure_tests_build_no_model(request, monkeypatch):
    """A test marked `pure` is left out of the TransformerLens 4 suite: on 3.9, building a
    model in one fails, so a test that touches a model cannot be left out by mistake."""
    from sinkmech.loading.backend import CAPABILITIES

    if not CAPABILITIES.from_config or request.node.get_closest_marker("pure") is None:
        return

    def refuse(*a, **k):
        pytest.fail(f"{request.node.nodeid} builds a model but was marked `pure` (tests/conftest.py): "
                    "name the model in it (e.g. the tiny_model fixture) or mark it @pytest.mark.backend", pytrace=False)

    from transformer_lens import HookedTransformer

    monkeypatch.setattr(HookedTransformer, "__init__", refuse)
    if "transformers" in sys.modules:
        from transformers import PreTrainedModel

        monkeypatch.setattr(PreTrainedModel, "__init__", refuse)


_GUARD = getattr(_pure_tests_build_no_model, "__wrapped__", _pure_tests_build_no_model)


@pytest.fixture(scope="session")
def tiny_model() -> Model:
    from helpers.tiny import make_tiny

    return make_tiny()


@pytest.fixture(scope="session")
def tiny_tokens() -> torch.Tensor:
    """Content tokens [6, 12], ids in [2, 50) so none collides with <bos>."""
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.randint(2, 50, (6, 12), generator=g)


@pytest.fixture(scope="session")
def gemma() -> Model:
    """Gemma 3 270M (trained with a fixed <bos>), loaded once, with the network cut."""
    import socket

    from sinkmech.loading.models import load_model

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setattr(socket.socket, "connect", lambda self, address, *a, **k: pytest.fail(f"network: {address!r}"))
        return load_model("gemma3-270m", device="cpu")


@pytest.fixture(scope="session")
def gemma_transformers():
    """transformers' own Gemma 3 270M read from the same GGUF (its own reader), eager
    attention, float32: the reference the backend checks compare against, read once
    per test run (the GGUF's metadata parsed once for the config, tokenizer and weights)."""
    import socket

    from transformers import AutoModelForCausalLM

    from sinkmech.loading.gguf import one_reader_per_file
    from sinkmech.loading.models import packaged_gguf_path

    path = packaged_gguf_path("gemma3-270m")
    with pytest.MonkeyPatch.context() as mp, one_reader_per_file():
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setattr(socket.socket, "connect", lambda self, address, *a, **k: pytest.fail(f"network: {address!r}"))
        return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype="float32",
                                                    attn_implementation="eager").eval()


@pytest.fixture(scope="session")
def smollm2() -> Model:
    from sinkmech.loading.models import load_model

    return load_model("smollm2", device="cpu")
