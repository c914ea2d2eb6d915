"""sinkmech: instruments for attention sinks (Barbero et al. 2025, "Why do LLMs
attend to the first token?") on any TransformerLens HookedTransformer.

The public names below are imported on first use (`from sinkmech import
sink_scores` works as usual), so that importing a light part of the package,
such as the command line's flag parser, never pays for torch and TransformerLens.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings

# public name -> the module that defines it
_EXPORTS = {
    "load_model": "sinkmech.loading.models", "bos_token_id": "sinkmech.loading.models",
    "default_corpus": "sinkmech.prompts", "load_prompts": "sinkmech.prompts", "tokenize": "sinkmech.prompts",
    "as_batch": "sinkmech.prompts", "TokenBatch": "sinkmech.prompts",
    "sink_scores": "sinkmech.sinks", "SinkScores": "sinkmech.sinks",
    "content_loss": "sinkmech.loss",
    "scan_heads": "sinkmech.dormant.scan", "HeadScan": "sinkmech.dormant.scan",
    "noop_check": "sinkmech.dormant.noop",
    "BosPair": "sinkmech.interventions.patching", "bos_pair": "sinkmech.interventions.patching",
    "patch": "sinkmech.interventions.patching",
    "head_ablations": "sinkmech.interventions.ablation", "HeadAblation": "sinkmech.interventions.ablation",
    "ablation_setup": "sinkmech.interventions.ablation", "AblationSetup": "sinkmech.interventions.ablation",
    "attribute_ablations": "sinkmech.interventions.attribution",
    "perturbation_spread": "sinkmech.interventions.perturb",
    "sensitivity": "sinkmech.theory.sensitivity", "sensitivity_study": "sinkmech.theory.sensitivity",
    "rank_collapse": "sinkmech.theory.sensitivity", "repeat_collapse": "sinkmech.theory.sensitivity",
    "head_attention": "sinkmech.measures.attention", "HeadAttention": "sinkmech.measures.attention",
    "compare_model": "sinkmech.controls.compare", "ModelComparison": "sinkmech.controls.compare",
    "build_report": "sinkmech.report",
}

__all__ = [
    "load_model", "bos_token_id", "default_corpus", "load_prompts", "tokenize", "as_batch", "TokenBatch",
    "sink_scores", "SinkScores", "content_loss", "scan_heads", "HeadScan", "noop_check",
    "BosPair", "bos_pair", "patch", "head_ablations", "HeadAblation", "attribute_ablations", "ablation_setup",
    "AblationSetup", "perturbation_spread", "sensitivity", "sensitivity_study", "rank_collapse", "repeat_collapse", "head_attention", "HeadAttention",
    "compare_model", "ModelComparison", "build_report",
]


def __getattr__(name: str):
    """A public name, imported from its module on first use and kept."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'sinkmech' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    """`sinkmech.theory.sensitivity` names the function, as `from sinkmech import sensitivity`
    always has, even after the module of the same name is imported (which sets the
    package attribute to that module)."""

    def __setattr__(self, name: str, value) -> None:
        if isinstance(value, types.ModuleType) and _EXPORTS.get(name) == value.__name__:
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


# Modules that moved into packages: the old path still imports (the same module
# object, so patches and isinstance checks agree) with a DeprecationWarning.
MOVED = {
    "sinkmech.backend": "sinkmech.loading.backend", "sinkmech.models": "sinkmech.loading.models",
    "sinkmech.hooked_loading": "sinkmech.loading.hooked", "sinkmech.bridge_loading": "sinkmech.loading.bridge",
    "sinkmech.gguf": "sinkmech.loading.gguf", "sinkmech.model_cache": "sinkmech.loading.cache",
    "sinkmech.model_names": "sinkmech.loading.names",
    "sinkmech.partial": "sinkmech.sharding.parts",
    "sinkmech.shards_length": "sinkmech.context.parts", "sinkmech.sharding.length": "sinkmech.context.parts",
    "sinkmech.distributed": "sinkmech.sharding.ray",
    "sinkmech.sink_measures": "sinkmech.measures.definitions", "sinkmech.attention": "sinkmech.measures.attention",
    "sinkmech.value_weighted": "sinkmech.measures.value_weighted", "sinkmech.key_sinks": "sinkmech.measures.key_sinks",
    "sinkmech.massive": "sinkmech.measures.massive",
    "sinkmech.eval_length": "sinkmech.context.length", "sinkmech.streaming": "sinkmech.context.stream",
    "sinkmech.perturb": "sinkmech.interventions.perturb", "sinkmech.recipes": "sinkmech.interventions.recipes",
    "sinkmech.compare": "sinkmech.controls.compare", "sinkmech.first_token": "sinkmech.controls.first_token",
    "sinkmech.bos_cost": "sinkmech.controls.bos_cost",
    "sinkmech.sensitivity": "sinkmech.theory.sensitivity", "sinkmech.jacobian": "sinkmech.theory.jacobian",
    "sinkmech.bound_ranking": "sinkmech.theory.bound_ranking",
    "sinkmech.figures": "sinkmech.plots", "sinkmech.figures.spread": "sinkmech.plots.perturb",
}


class _MovedModule(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a module's old path as its new one, with a DeprecationWarning."""

    def find_spec(self, fullname, path=None, target=None):
        new = MOVED.get(fullname)
        if new is None and fullname.startswith("sinkmech.figures."):
            new = "sinkmech.plots." + fullname.removeprefix("sinkmech.figures.")
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, loader_state=new)

    def create_module(self, spec):
        warnings.warn(f"{spec.name} moved to {spec.loader_state}; the old path will be removed in the next release",
                      DeprecationWarning, stacklevel=3)
        return importlib.import_module(spec.loader_state)

    def exec_module(self, module) -> None:
        """The module ran when it was imported under its new path."""


if not any(isinstance(f, _MovedModule) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedModule())
