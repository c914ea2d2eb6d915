"""sinkmech: instruments for attention sinks (Barbero et al. 2025, "Why do LLMs
attend to the first token?") on any TransformerLens HookedTransformer."""

from sinkmech.interventions.ablation import HeadAblation, head_ablations
from sinkmech.dormant.scan import HeadScan, scan_heads
from sinkmech.models import bos_token_id, load_model
from sinkmech.dormant.noop import noop_check
from sinkmech.interventions.patching import BosPair, bos_pair, patch
from sinkmech.perturb import perturbation_spread
from sinkmech.prompts import default_corpus, load_prompts, tokenize
from sinkmech.sinks import SinkScores, sink_scores

__all__ = [
    "load_model", "bos_token_id", "default_corpus", "load_prompts", "tokenize",
    "sink_scores", "SinkScores", "scan_heads", "HeadScan", "noop_check",
    "BosPair", "bos_pair", "patch", "head_ablations", "HeadAblation", "perturbation_spread",
]
