"""The one backend skip (`needs`) and what each TransformerLens line loads."""

from __future__ import annotations

import pytest

from sinkmech.loading.backend import CAPABILITIES


def needs(*capabilities: str, why: str = "", **values: bool) -> pytest.MarkDecorator:
    """The one backend skip: a test (a module's `pytestmark`, a parameter's `marks=`)
    that needs the installed TransformerLens to have each of `capabilities`, or each
    `name=value` (False: a test of what happens without it), of
    `sinkmech.loading.backend.CAPABILITIES`, skipped where it has not; the reason
    names what is missing, `why` the test needs it, and the backend (pytest -rs lists
    them). No capability asked: never skipped."""
    wanted = {**dict.fromkeys(capabilities, True), **values}
    unmet = [("with " if want else "without ") + name for name, want in wanted.items()
             if getattr(CAPABILITIES, name) != want]
    reason = f"runs only {' and '.join(unmet)}" + (f" ({why})" if why else "") + f"; this run has {CAPABILITIES.described}"
    return pytest.mark.skipif(bool(unmet), reason=reason)


def require(*capabilities: str, why: str = "", **values: bool) -> None:
    """`needs`, where a helper builds its model in the middle of a test (tests/helpers/planted.py): skips now."""
    mark = needs(*capabilities, why=why, **values)
    if mark.args[0]:
        pytest.skip(mark.kwargs["reason"])


# What TransformerLens 3.9 (with transformers 5) loads from a Hugging Face folder of
# tests/helpers/tiny_hf.py: measured; the others stop in its config conversion ("... is not
# currently supported", or GPT-2's config without `n_ctx`; Gemma 3's config comes from
# the official name only). The Bridge (`any_architecture`) loads them all.
TL39_LOADS = frozenset({"llama", "qwen2", "qwen3", "gpt_neox", "mistral", "phi3", "mixtral", "gpt_oss"})


def loads_folder(arch: str) -> pytest.MarkDecorator:
    """`needs` for a test of one architecture's folder: nothing for those
    TransformerLens 3.9 loads too, `any_architecture` for the others."""
    return needs() if arch in TL39_LOADS else needs("any_architecture", why=f"TransformerLens 3.9 refuses {arch}")
