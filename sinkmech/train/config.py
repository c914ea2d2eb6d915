"""The configuration of a from-scratch training run (Barbero et al. 2025,
Table 2 and the context-length study): data source, packing recipe, model
size, optimiser schedule and evaluation sizes, checked at construction."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Literal, get_args

DataSource = Literal["text", "bigram_backcopy"]
DATA_SOURCES: tuple[DataSource, ...] = get_args(DataSource)
Packing = Literal["causal", "intra_doc"]
PACKINGS: tuple[Packing, ...] = get_args(Packing)
# "none": no positional embedding at all (NoPE); only the causal mask tells
# positions apart.
Positional = Literal["rotary", "standard", "none"]
POSITIONALS: tuple[Positional, ...] = get_args(Positional)
TEXT_VOCAB = 256  # the text source is byte-level
# The text source's corpus: "docs" (pydoc topics + stdlib docstrings, ~2 MB) or
# "docs+source" (those plus the standard library's own .py sources, tens of MB).
TextCorpus = Literal["docs", "docs+source"]
TEXT_CORPORA: tuple[TextCorpus, ...] = get_args(TextCorpus)


def check_data_source(data: str) -> DataSource:
    if data not in DATA_SOURCES:
        raise ValueError(f"unknown data source {data!r}: choose one of {DATA_SOURCES}")
    return data  # type: ignore[return-value]


def run_name(packing: Packing, fixed_bos: bool, context_length: int) -> str:
    """`<packing>-<fixedbos|nofixedbos>-T<context_length>`: a run's name, and the
    file name of its log under figures/train/logs/<experiment>/."""
    return f"{packing}-{'fixedbos' if fixed_bos else 'nofixedbos'}-T{context_length}"


@dataclass(frozen=True)
class TrainConfig:
    """Everything a run depends on; saved as JSON beside each checkpoint."""

    data: DataSource = "text"
    packing: Packing = "causal"
    fixed_bos: bool = True
    context_length: int = 128
    tokens_per_step: int = 4096  # batch = tokens_per_step // context_length
    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    d_mlp: int | None = None  # default 4 * d_model
    positional: Positional = "rotary"
    steps: int = 500
    lr: float = 3e-3
    warmup: int = 50
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    seed: int = 0
    threads: int | None = None
    eval_every: int = 100
    eval_prompts: int = 32
    score_tokens: int | None = None  # content tokens per sink-scoring prompt; default min(64, T - 1)
    val_windows: int = 32
    text_limit_bytes: int | None = None  # text: use only the first N bytes of the corpus
    text_corpus: TextCorpus = "docs"
    # Mask every query's own key (queries >= 1) with a permanent hook on
    # hook_attn_scores: the model cannot use its own token as a no-op.
    mask_self: bool = False
    bb_vocab: int = 64  # bigram_backcopy: content tokens, triggers, document lengths
    bb_triggers: int = 3
    bb_trigger_prob: float = 0.15
    bb_doc_min: int = 16
    bb_doc_max: int = 512

    def __post_init__(self) -> None:
        check_data_source(self.data)
        if self.packing not in PACKINGS:
            raise ValueError(f"unknown packing {self.packing!r}: choose one of {PACKINGS}")
        if self.text_corpus not in TEXT_CORPORA:
            raise ValueError(f"unknown text corpus {self.text_corpus!r}: choose one of {TEXT_CORPORA}")
        if self.positional not in POSITIONALS:
            raise ValueError(f"unknown positional embedding {self.positional!r}: choose one of {POSITIONALS}")
        for name in ("context_length", "tokens_per_step", "n_layers", "d_model", "n_heads", "steps", "eval_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.context_length < 4:
            raise ValueError(f"context_length must be >= 4, got {self.context_length}")
        if self.tokens_per_step < self.context_length:
            raise ValueError(
                f"tokens_per_step ({self.tokens_per_step}) must be >= context_length ({self.context_length})"
            )
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.score_tokens is not None and not 1 <= self.score_tokens <= self.context_length - 1:
            raise ValueError(
                f"score_tokens must lie in [1, context_length - 1 = {self.context_length - 1}] (the prompt also "
                f"holds <bos>), got {self.score_tokens}"
            )
        if self.warmup < 0 or self.lr <= 0:
            raise ValueError(f"need lr > 0 and warmup >= 0, got lr {self.lr}, warmup {self.warmup}")

    @property
    def batch_size(self) -> int:
        return self.tokens_per_step // self.context_length

    @property
    def vocab(self) -> int:
        """Content tokens; `<bos>` is this id and pad the next."""
        return TEXT_VOCAB if self.data == "text" else self.bb_vocab

    @property
    def bos_id(self) -> int:
        return self.vocab

    @property
    def run_name(self) -> str:
        """See `run_name`."""
        return run_name(self.packing, self.fixed_bos, self.context_length)

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "TrainConfig":
        known = {f.name for f in fields(TrainConfig)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown TrainConfig keys: {sorted(unknown)}")
        return TrainConfig(**d)
