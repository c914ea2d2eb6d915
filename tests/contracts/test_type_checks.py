"""The suite's runtime type checks (pyproject's --jaxtyping-packages, tests/conftest.py's
lean wrappers) reach every sinkmech function: those of a module and those defined inside
another function, which the import hook decorates again on every call of the outer one."""

from __future__ import annotations

import hashlib

import jaxtyping
import pytest
import torch
from jaxtyping import Float
from jaxtyping._import_hook import Typechecker
from torch import Tensor

import sinkmech.stats  # noqa: F401  (the import hook has run: its beartype stand-in is registered)


def as_hooked(fn):
    """`fn` decorated as the import hook decorates a sinkmech function."""
    hooked = Typechecker.lookup[hashlib.md5(b"beartype.beartype").hexdigest()]
    return jaxtyping.jaxtyped(typechecker=hooked)(fn)


def rows(x: Float[Tensor, "a b"]) -> Float[Tensor, " a"]:
    return x.sum(0)  # wrong on purpose: the sum over rows has b entries


def outer():
    def inner(n: int, x: Float[Tensor, "a b"]) -> Float[Tensor, " a"]:
        return x.sum(n)
    return inner


def test_a_modules_function_is_checked():
    checked = as_hooked(rows)
    with pytest.raises(jaxtyping.TypeCheckError):
        checked(torch.zeros(2, 3))  # returns 3 entries for a = 2
    assert checked(torch.zeros(2, 2)).shape == (2,)


def test_functions_defined_inside_others_are_checked_on_every_call():
    for _ in range(2):  # a new inner function each call: each one checked
        checked = as_hooked(outer())
        assert checked(1, torch.zeros(2, 3)).shape == (2,)
        with pytest.raises(jaxtyping.TypeCheckError):
            checked("1", torch.zeros(2, 3))  # not an int
        with pytest.raises(jaxtyping.TypeCheckError):
            checked(0, torch.zeros(2, 3))  # the shape of the result is not [a]
