"""sinkmech: instruments for attention sinks (Barbero et al. 2025, "Why do LLMs
attend to the first token?") on any TransformerLens HookedTransformer."""

from sinkmech.attention import HeadAttention, head_attention
from sinkmech.compare import ModelComparison, compare_model
from sinkmech.dormant.noop import noop_check
from sinkmech.dormant.scan import HeadScan, scan_heads
from sinkmech.interventions.ablation import AblationSetup, HeadAblation, ablation_setup, head_ablations
from sinkmech.interventions.attribution import attribute_ablations
from sinkmech.interventions.patching import BosPair, bos_pair, patch
from sinkmech.loss import content_loss
from sinkmech.models import bos_token_id, load_model
from sinkmech.perturb import perturbation_spread
from sinkmech.prompts import TokenBatch, as_batch, default_corpus, load_prompts, tokenize
from sinkmech.report import build_report
from sinkmech.sensitivity import rank_collapse, repeat_collapse, sensitivity, sensitivity_study
from sinkmech.sinks import SinkScores, sink_scores

__all__ = [
    "load_model", "bos_token_id", "default_corpus", "load_prompts", "tokenize", "as_batch", "TokenBatch",
    "sink_scores", "SinkScores", "content_loss", "scan_heads", "HeadScan", "noop_check",
    "BosPair", "bos_pair", "patch", "head_ablations", "HeadAblation", "attribute_ablations", "ablation_setup",
    "AblationSetup", "perturbation_spread", "sensitivity", "sensitivity_study", "rank_collapse", "repeat_collapse", "head_attention", "HeadAttention",
    "compare_model", "ModelComparison", "build_report",
]
