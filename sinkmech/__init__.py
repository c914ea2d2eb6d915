"""sinkmech: instruments for attention sinks (Barbero et al. 2025, "Why do LLMs
attend to the first token?") on any TransformerLens HookedTransformer.

The public names below are imported on first use (`from sinkmech import
sink_scores` works as usual), so that importing a light part of the package,
such as the command line's flag parser, never pays for torch and TransformerLens.
"""

from __future__ import annotations

import importlib

# public name -> the module that defines it
_EXPORTS = {
    "load_model": "sinkmech.loading.models", "bos_token_id": "sinkmech.loading.models",
    "default_corpus": "sinkmech.corpora", "load_prompts": "sinkmech.corpora", "tokenize": "sinkmech.prompts",
    "as_batch": "sinkmech.prompts", "TokenBatch": "sinkmech.prompts",
    "sink_scores": "sinkmech.measures.sinks", "SinkScores": "sinkmech.measures.sinks",
    "content_loss": "sinkmech.measures.loss",
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
    "compare_model": "sinkmech.studies.compare", "ModelComparison": "sinkmech.studies.compare",
    "build_report": "sinkmech.report",
    "RunOptions": "sinkmech.options", "QUIET": "sinkmech.options", "Thresholds": "sinkmech.dormant.labels",
    "LogitDiff": "sinkmech.interventions.metrics", "CompareConfig": "sinkmech.studies.configs",
    "ValuelessBos": "sinkmech.interventions.phantom", "PhantomSink": "sinkmech.interventions.phantom",
    "fit_sinks": "sinkmech.interventions.fit_sinks", "FitSettings": "sinkmech.interventions.fit_sinks",
    "FittedSinks": "sinkmech.interventions.fit_sinks", "evaluate_sinks": "sinkmech.interventions.fit_sinks",
    "STUDIES": "sinkmech.studies.configs", "run_study": "sinkmech.studies.config",
    **{name: "sinkmech.studies.configs" for name in (
        "DomainsConfig", "CalibrationConfig", "TheoryConfig", "LongContextConfig", "FirstTokenConfig",
        "BosPositionConfig", "BosCostConfig", "TextBosCostConfig", "DecompositionConfig", "PackingConfig",
        "PositionalConfig", "ContextLengthConfig", "MaskSelfConfig", "DepthConfig", "TextConfig")},
}

__all__ = [
    "load_model", "bos_token_id", "default_corpus", "load_prompts", "tokenize", "as_batch", "TokenBatch",
    "sink_scores", "SinkScores", "content_loss", "scan_heads", "HeadScan", "noop_check",
    "BosPair", "bos_pair", "patch", "head_ablations", "HeadAblation", "attribute_ablations", "ablation_setup",
    "AblationSetup", "perturbation_spread", "sensitivity", "sensitivity_study", "rank_collapse", "repeat_collapse", "head_attention", "HeadAttention",
    "compare_model", "ModelComparison", "build_report",
    "RunOptions", "QUIET", "Thresholds", "LogitDiff", "CompareConfig",
    "ValuelessBos", "PhantomSink", "fit_sinks", "FitSettings", "FittedSinks", "evaluate_sinks",
    "STUDIES", "run_study", "DomainsConfig", "CalibrationConfig", "TheoryConfig", "LongContextConfig",
    "FirstTokenConfig", "BosPositionConfig", "BosCostConfig", "TextBosCostConfig", "DecompositionConfig",
    "PackingConfig", "PositionalConfig", "ContextLengthConfig", "MaskSelfConfig", "DepthConfig", "TextConfig",
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
