"""What the installed TransformerLens can do for sinkmech: one table, read once
from its version (TransformerLens is not imported for it, so the command line
can ask before anything heavy loads).

TransformerLens 3.x builds `HookedTransformer`s; 4.x removed them and wraps a
Hugging Face model in a `TransformerBridge`. Code that depends on the
difference asks a capability here (`sinkmech.loading.backend` re-exports
`CAPABILITIES`), never which backend it is.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass
from typing import Literal

Backend = Literal["HookedTransformer", "TransformerBridge"]


@dataclass(frozen=True)
class Capabilities:
    """One TransformerLens line's capabilities.

    Attributes:
        backend: the model class it gives.
        transformer_lens: its major version.
        from_config: a model is built from a config and its weights set by hand
            (HookedTransformerConfig; `sinkmech.loading.backend.model_from_config`):
            what `sinkmech train` builds and what the converted-model cache stores.
        can_reindex_cache: `stream --reindex` can move the kept first keys to
            StreamingLLM's cache positions (it recomputes their scores with
            HookedTransformer's rotary tables and score function).
        any_architecture: every causal LM that transformers reads (a GGUF file
            or a Hugging Face folder) loads, and one whose logits sinkmech cannot
            read from the last block's output is refused at load; without it,
            the architectures TransformerLens names.
        hub_ids: hub repo ids (owner/name) load (booted through transformers;
            they need the network).
        official_name_lookup: "module:function" that maps a TransformerLens name
            or alias to its official name, raising ValueError for an unknown one.
    """

    backend: Backend
    transformer_lens: int
    from_config: bool
    can_reindex_cache: bool
    any_architecture: bool
    hub_ids: bool
    official_name_lookup: str

    @property
    def can_train(self) -> bool:
        """`sinkmech train` and the training studies: their models are built from a config."""
        return self.from_config

    @property
    def described(self) -> str:
        """"the TransformerBridge backend (TransformerLens 4)", for messages."""
        return f"the {self.backend} backend (TransformerLens {self.transformer_lens})"

    def official_name(self, name: str) -> str:
        """TransformerLens' official name for `name` (ValueError when it knows none).
        Imports TransformerLens."""
        module, function = self.official_name_lookup.split(":")
        return getattr(importlib.import_module(module), function)(name)


HOOKED = Capabilities(backend="HookedTransformer", transformer_lens=3, from_config=True, can_reindex_cache=True,
                      any_architecture=False, hub_ids=False,
                      official_name_lookup="transformer_lens.loading_from_pretrained:get_official_model_name")
BRIDGE = Capabilities(backend="TransformerBridge", transformer_lens=4, from_config=False, can_reindex_cache=False,
                      any_architecture=True, hub_ids=True,
                      official_name_lookup="transformer_lens.supported_models:get_official_model_name")


def installed_capabilities() -> Capabilities:
    """The table row of the installed TransformerLens (4.x and later: the Bridge;
    3.x, or none installed: HookedTransformer), from its version alone."""
    try:
        major = int(importlib.metadata.version("transformer-lens").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return HOOKED
    return BRIDGE if major >= 4 else HOOKED


CAPABILITIES = installed_capabilities()
