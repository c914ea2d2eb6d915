"""Every study's settings, one `Config` class each, registered by name in
`STUDIES`. Imports nothing heavy: the command line checks a config (flags or a
file) before torch loads. Each class names the function that runs it
(`runner`, "module:function", imported only when the study runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from sinkmech.dormant.first_look import FULL_NOOP_PROMPTS, NOOP_MAX_HEADS, NOOP_PROMPTS
from sinkmech.studies.config import ConfigError, StudyConfig

STUDIES: dict[str, type[StudyConfig]] = {}


def register(cls: type[StudyConfig]) -> type[StudyConfig]:
    """Class decorator: add a study's Config to `STUDIES` under its `study` name."""
    if not cls.study or not cls.runner:
        raise TypeError(f"{cls.__name__} needs a `study` name and a `runner`")
    if cls.study in STUDIES:
        raise TypeError(f"two studies are named {cls.study!r}")
    STUDIES[cls.study] = cls
    return cls


@register
@dataclass(frozen=True)
class CompareConfig(StudyConfig):
    """The paper's Table 2 and Figure 2 on real models, side by side
    (`sinkmech.studies.compare`): sink rates, loss and the spread of a one-token
    swap with and without `<bos>`, and the dormant-head scan with its no-op check."""

    study: ClassVar[str] = "compare"
    runner: ClassVar[str] = "sinkmech.studies.compare:run"
    help: ClassVar[dict[str, str]] = {
        "models": "models to compare, each loaded in turn",
        "prompts": "prompt file (.txt, .json, .jsonl); none: 170 windows of the Python docs",
        "n_prompts": "prompts for sink rates and loss",
        "max_tokens": "content tokens per prompt",
        "spread_prompts": "prompts for the one-token swap",
        "spread_tokens": "content tokens per prompt for the swap",
        "spread_position": "content position of the swapped token (earlier when the prompts are shorter)",
        "eps": "sink-rate thresholds",
        "dormant_prompts": "prompts for the dormant-head scan (0: skip it)",
        "noop_prompts": f"prompts held out from the scan for the no-op check (a first look; the findings check "
                        f"{FULL_NOOP_PROMPTS}; 0: none)",
        "noop_heads": "closest candidates checked besides the if-else heads",
        "noop_max_heads": "check at most this many of those heads, the if-else heads first (a first look; none: "
                          "every one; the run says what the whole check would take)",
    }

    models: tuple[str, ...] = ("smollm2", "gemma3-270m")
    prompts: str | None = None
    n_prompts: int = 170
    max_tokens: int = 64
    spread_prompts: int = 16
    spread_tokens: int = 48
    spread_position: int = 4  # sinkmech.interventions.recipes.SPREAD_POSITION
    eps: tuple[float, ...] = (0.3, 0.8)  # sinkmech.prompts.DEFAULT_EPS
    dormant_prompts: int = 64
    noop_prompts: int = NOOP_PROMPTS
    noop_heads: int = 3
    noop_max_heads: int | None = NOOP_MAX_HEADS

    def check(self) -> None:
        for key in ("n_prompts", "max_tokens", "spread_prompts", "spread_tokens"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key} must be >= 1, got {getattr(self, key)}")
        if self.dormant_prompts < 0 or self.noop_prompts < 0 or self.noop_heads < 0:
            raise ConfigError("dormant_prompts, noop_prompts and noop_heads must be >= 0")
        if self.noop_max_heads is not None and self.noop_max_heads < 1:
            raise ConfigError(f"noop_max_heads must be >= 1 or none (every head), got {self.noop_max_heads}")
        if not 0 <= self.spread_position < self.spread_tokens - 1:
            raise ConfigError(f"spread_position must lie in [0, {self.spread_tokens - 1}), got {self.spread_position}")
        if not self.models:  # whether each loads here is the command line's check, before the first loads
            raise ConfigError("models: name at least one model")
        if not self.eps or any(not 0.0 <= e < 1.0 for e in self.eps):
            raise ConfigError(f"eps must be thresholds in [0, 1), got {list(self.eps)}")


def _positive(config: StudyConfig, *names: str) -> None:
    for key in names:
        if getattr(config, key) < 1:
            raise ConfigError(f"{key} must be >= 1, got {getattr(config, key)}")
@register
@dataclass(frozen=True)
class DomainsConfig(StudyConfig):
    """The headline tables on two kinds of text (`sinkmech.studies.domains`):
    sink rates with and without `<bos>`, what removing `<bos>` costs, and the
    if-else heads, per model and named corpus, each interval over the
    documents the windows were cut from."""

    study: ClassVar[str] = "domains"
    runner: ClassVar[str] = "sinkmech.studies.domains:run"
    help: ClassVar[dict[str, str]] = {
        "models": "models, each loaded in turn",
        "domains": "named corpora (sinkmech.prompts.DOMAINS)",
        "n_prompts": "windows per corpus for sink rates and the <bos> cost",
        "max_tokens": "content tokens per window",
        "eps": "sink-rate thresholds",
        "scan_prompts": "windows per corpus for the dormant-head scan (0: no scan)",
        "n_boot": "bootstrap resamples of the documents",
    }

    models: tuple[str, ...] = ("smollm2", "gemma3-270m")
    domains: tuple[str, ...] = ("pydoc", "licenses")
    n_prompts: int = 80
    max_tokens: int = 64
    eps: tuple[float, ...] = (0.3, 0.8)
    scan_prompts: int = 64
    n_boot: int = 1000

    def check(self) -> None:
        from sinkmech.corpora import DEFAULT_N_PROMPTS, DOMAINS  # light: no torch

        _positive(self, "n_prompts", "max_tokens", "n_boot")
        if not 0 <= self.scan_prompts <= DEFAULT_N_PROMPTS or self.n_prompts > DEFAULT_N_PROMPTS:
            raise ConfigError(f"n_prompts and scan_prompts must lie in [1, {DEFAULT_N_PROMPTS}] and "
                              f"[0, {DEFAULT_N_PROMPTS}] (the windows of a corpus), got {self.n_prompts} and "
                              f"{self.scan_prompts}")
        if not self.models or not self.domains:
            raise ConfigError("name at least one model and one domain")
        unknown = sorted(set(self.domains) - set(DOMAINS))
        if unknown:
            raise ConfigError(f"unknown domain(s) {', '.join(unknown)}: known are {', '.join(DOMAINS)}")
        if not self.eps or any(not 0.0 <= e < 1.0 for e in self.eps):
            raise ConfigError(f"eps must be thresholds in [0, 1), got {list(self.eps)}")


@register
@dataclass(frozen=True)
class CalibrationConfig(StudyConfig):
    """The dormant-head cut on planted heads and nulls (`sinkmech.studies.calibration`):
    every planted scan labelled at every (high, low) cut of the sweep. No model is loaded."""

    study: ClassVar[str] = "calibration"
    runner: ClassVar[str] = "sinkmech.studies.calibration:run"
    help: ClassVar[dict[str, str]] = {
        "strengths": "factors on the planted heads' query weights (1: first-token attention ~0 or ~1)",
        "seeds": "planted models per strength",
        "n_prompts": "prompts per scan",
        "cut_position": "the positional null rests before this position and wakes after it",
    }

    strengths: tuple[float, ...] = (0.2, 0.25, 0.3, 0.4, 0.6, 1.0)
    seeds: int = 4
    n_prompts: int = 64
    cut_position: int = 13

    def check(self) -> None:
        _positive(self, "seeds", "n_prompts")
        if not self.strengths or any(not 0.0 < f <= 1.0 for f in self.strengths):
            raise ConfigError(f"strengths must lie in (0, 1], got {list(self.strengths)}")
        if not 2 <= self.cut_position < 20:
            raise ConfigError(f"cut_position must lie in [2, 20) (prompts hold 20 tokens), got {self.cut_position}")


@register
@dataclass(frozen=True)
class TheoryConfig(StudyConfig):
    """Does the path bound rank sensitivity, and is attention smoother without
    `<bos>`? (`sinkmech.studies.theory`; an original test of the bound's
    ranking, not the paper's method.)"""

    study: ClassVar[str] = "theory"
    runner: ClassVar[str] = "sinkmech.studies.theory:run"
    help: ClassVar[dict[str, str]] = {
        "models": "models, each loaded in turn (the first with a fixed <bos>, the second the control)",
        "prompts": "prompts for the Jacobians (one per prompt and condition)",
        "tokens": "content tokens per prompt for the Jacobians",
        "estimator": "Jacobian norms: the forward-mode Hutchinson estimate or the exact jacrev",
        "probes": "Hutchinson probes per input position",
        "shuffles": "shuffles of the same-distance null per prompt",
        "validate_prompts": "held-out prompts on which the estimate is checked against the exact Jacobian",
        "validate_tokens": "content tokens per validation prompt (every position of each is checked; the exact "
                           "Jacobian costs T x d_model backward rows, so its time grows with the square of T)",
        "chunk_size": "tangents pushed at once",
        "entropy_prompts": "prompts for the attention entropy",
        "entropy_tokens": "content tokens per prompt for the attention entropy",
    }

    models: tuple[str, ...] = ("gemma3-270m", "smollm2")
    prompts: int = 32
    tokens: int = 32
    estimator: Literal["hutchinson", "exact"] = "hutchinson"
    probes: int = 2
    shuffles: int = 100
    validate_prompts: int = 4
    validate_tokens: int = 6
    chunk_size: int = 32
    entropy_prompts: int = 32
    entropy_tokens: int = 48

    def check(self) -> None:
        _positive(self, "probes", "shuffles", "chunk_size")
        for key in ("prompts", "tokens", "entropy_prompts", "entropy_tokens", "validate_tokens"):
            if getattr(self, key) < 2:
                raise ConfigError(f"{key} must be >= 2, got {getattr(self, key)}")
        if self.validate_prompts < 0:
            raise ConfigError(f"validate_prompts must be >= 0, got {self.validate_prompts}")
        if not self.models:
            raise ConfigError("models: name at least one model")


# The training studies (`sinkmech.studies.training`): each trains its runs from
# scratch (no model is handed in), writes its rows, logs and figures under `out`
# (checkpoints under `runs_dir`) and returns the rows. `sinkmech train study NAME`
# runs the same configs under their short names.

TRAIN_HELP = {
    "preset": "the runs' sizes (sinkmech.train.presets.PRESETS)",
    "steps": "optimiser steps (default: the preset's)",
    "threads": "torch CPU threads per run (default: the preset's)",
    "data": "the data source (default: the preset's)",
    "seed": "the seed (default: the preset's)",
    "eval_every": "steps between evaluations (default: the preset's)",
    "sets": "KEY=VALUE overrides of any TrainConfig field, applied last",
    "out": "where the rows (JSON, markdown), logs and figures go",
    "runs_dir": "where the checkpoints go",
    "prefix": "prefix of the output file names (e.g. 'gpu_')",
    "jobs": "independent runs trained at once, in separate processes",
}


@dataclass(frozen=True)
class TrainingConfig(StudyConfig):
    """What every training study shares (`sinkmech.train.presets.StudySettings`):
    the preset and its overrides, and where the outputs and checkpoints go."""

    runner: ClassVar[str] = "sinkmech.studies.training:run"
    has_findings: ClassVar[bool] = False  # `sinkmech train study findings` quotes the training studies
    short: ClassVar[str] = ""  # its name under `sinkmech train study`
    help: ClassVar[dict[str, str]] = TRAIN_HELP

    preset: Literal["cpu", "gpu", "text"] = "cpu"
    steps: int | None = None
    threads: int | None = None
    data: Literal["text", "bigram_backcopy"] | None = None
    seed: int | None = None
    eval_every: int | None = None
    sets: tuple[str, ...] = ()
    out: str = "figures/train"
    runs_dir: str = "runs/train"
    prefix: str = ""
    jobs: int = 1

    def check(self) -> None:
        for key in ("steps", "threads", "eval_every"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"{key} must be >= 1, got {value}")
        if self.jobs < 1:
            raise ConfigError(f"jobs must be >= 1, got {self.jobs}")
        from sinkmech.train.presets import parse_sets  # light: the TrainConfig fields, no torch

        try:
            parse_sets(self.sets)
        except ValueError as e:
            raise ConfigError(str(e).replace("--set", "sets")) from None


@register
@dataclass(frozen=True)
class PackingConfig(TrainingConfig):
    """Table 2: both packings, with and without a fixed `<bos>` (four runs), each
    evaluated with and without `<bos>`; and the emergence figure."""

    study: ClassVar[str] = "train-packing"
    short: ClassVar[str] = "packing"


Positional = Literal["rotary", "standard", "none"]  # sinkmech.train.config.POSITIONALS


@register
@dataclass(frozen=True)
class PositionalConfig(TrainingConfig):
    """Token or position? The fixed-`<bos>` recipe under each positional embedding."""

    study: ClassVar[str] = "train-positional"
    short: ClassVar[str] = "positional"
    help: ClassVar[dict[str, str]] = {**TRAIN_HELP, "positionals": "the positional embeddings, one run each"}

    positionals: tuple[Positional, ...] = ("standard", "rotary", "none")  # sinkmech.train.presets.POSITIONAL_RUNS


@register
@dataclass(frozen=True)
class ContextLengthConfig(TrainingConfig):
    """The same model at several context lengths, tokens per step held constant,
    every model scored on the shortest context's number of tokens."""

    study: ClassVar[str] = "train-context-length"
    short: ClassVar[str] = "context-length"
    help: ClassVar[dict[str, str]] = {**TRAIN_HELP, "context_lengths": "the context lengths (default: the preset's)",
                                      "fixed_bos": "train with a fixed <bos> at position 0"}

    context_lengths: tuple[int, ...] | None = None
    fixed_bos: bool = True

    def check(self) -> None:
        super().check()
        if self.context_lengths is not None and (not self.context_lengths or min(self.context_lengths) < 2):
            raise ConfigError(f"context_lengths must be integers >= 2, got {list(self.context_lengths)}")


@register
@dataclass(frozen=True)
class MaskSelfConfig(TrainingConfig):
    """Rotary positions with each query's own key masked, fixed `<bos>`, one run per seed."""

    study: ClassVar[str] = "train-mask-self"
    short: ClassVar[str] = "mask-self"
    help: ClassVar[dict[str, str]] = {**TRAIN_HELP, "seeds": "one run per seed"}

    seeds: tuple[int, ...] = (0, 1, 2)


@register
@dataclass(frozen=True)
class DepthConfig(TrainingConfig):
    """The fixed-`<bos>` recipe at each depth and positional embedding, one run per seed."""

    study: ClassVar[str] = "train-depth"
    short: ClassVar[str] = "depth"
    help: ClassVar[dict[str, str]] = {
        **TRAIN_HELP, "seeds": "one run per seed", "layers": "the depths", "positionals": "the positional embeddings",
        "deep_steps": "steps for depths >= 4 (default: the preset's)",
        "fresh": "train the 1- and 2-layer runs anew instead of reusing the positional runs' logs",
        "deep_seeds": "depths above 1 for the first N seeds only (default: every seed)"}

    seeds: tuple[int, ...] = (0, 1, 2)
    layers: tuple[int, ...] = (1, 2, 4)
    positionals: tuple[Positional, ...] = ("rotary", "standard")
    deep_steps: int | None = None
    fresh: bool = False
    deep_seeds: int | None = None

    def check(self) -> None:
        super().check()
        if not self.layers or min(self.layers) < 1:
            raise ConfigError(f"layers must be depths >= 1, got {list(self.layers)}")


@register
@dataclass(frozen=True)
class TextConfig(TrainingConfig):
    """Natural text: every (depth, weight decay, fixed `<bos>` or not) combination, one run each."""

    study: ClassVar[str] = "train-text"
    short: ClassVar[str] = "text"
    help: ClassVar[dict[str, str]] = {**TRAIN_HELP, "layers": "the depths", "weight_decays": "the weight decays",
                                      "fixed_bos": "with a fixed <bos> (true), without (false), or both"}

    preset: Literal["cpu", "gpu", "text"] = "text"
    layers: tuple[int, ...] = (2,)
    weight_decays: tuple[float, ...] = (0.1, 0.0)
    fixed_bos: tuple[bool, ...] = (True, False)


TRAINING_STUDIES: dict[str, type[TrainingConfig]] = {
    c.short: c for c in (PackingConfig, PositionalConfig, ContextLengthConfig, MaskSelfConfig, DepthConfig, TextConfig)
}


@register
@dataclass(frozen=True)
class LongContextConfig(StudyConfig):
    """The paper's length claims at thousands of tokens (`sinkmech.studies.long_context`):
    loss and sink rate by position with and without `<bos>`, StreamingLLM's
    window with the first key kept or dropped, representational collapse in length.

    Attributes:
        model: the model, loaded with the context the longest run needs (`n_ctx_needed`).
        lengths: content tokens per prompt, one run each (the same texts cut to each).
        n_prompts: long texts (`sinkmech.context.long_text`), from the topics in turn.
        topics: the long-text topics the prompts come from.
        buckets: upper edges of the position buckets (1-64, 65-512, ...), content positions from 1.
        eps: sink-rate thresholds (strict >).
        stream_length: content tokens of the StreamingLLM runs (with `<bos>`); 0 skips them.
        stream_window: W, the last keys every query sees.
        stream_keep: first keys kept beside the window (0: dropped), one run each, with the W + k control.
        learned_sinks: learned-sink files (`sinkmech fit-sinks`; `{model}` is `model`), each one more
            run per length without `<bos>`, the file's sink logits (and values) in every row, and one
            more stream run with the first key dropped and the sink in its place where the window drops it.
        collapse_repeats: k, the times a prefix's last token is repeated (`repeat_collapse`).
        collapse_prefix: content tokens of the prefix.
        attention: how the passes read attention (`sinkmech.measures.fused`).
    """

    study: ClassVar[str] = "long-context"
    runner: ClassVar[str] = "sinkmech.studies.long_context:run"
    figures: ClassVar[str] = "sinkmech.plots.long_context:long_context_figures"

    model: str = "gemma3-270m"
    lengths: tuple[int, ...] = (512, 2048, 8192)
    n_prompts: int = 4
    topics: tuple[str, ...] = ("python-docs", "licenses", "python-source")
    buckets: tuple[int, ...] = (64, 512, 2048, 8192)
    eps: tuple[float, ...] = (0.3, 0.8)
    stream_length: int = 8192
    stream_window: int = 1024
    stream_keep: tuple[int, ...] = (0, 1)
    learned_sinks: tuple[str, ...] = ("figures/fit_sinks/{model}_head.json", "figures/fit_sinks/{model}_head_value.json")
    collapse_repeats: tuple[int, ...] = (16, 128, 1024, 4096)
    collapse_prefix: int = 32
    attention: Literal["fused", "pattern", "auto"] = "fused"

    @property
    def n_ctx_needed(self) -> int:
        """Positions the longest pass holds (`<bos>` included)."""
        return max(*self.lengths, self.stream_length,
                   self.collapse_prefix + max(self.collapse_repeats, default=0) + 1) + 1

    def check(self) -> None:
        if not self.lengths or min(self.lengths) < 2:
            raise ConfigError(f"lengths must be >= 2, got {list(self.lengths)}")
        if self.n_prompts < 2:
            raise ConfigError(f"n_prompts must be >= 2 (intervals over prompts), got {self.n_prompts}")
        if list(self.buckets) != sorted(set(self.buckets)) or not self.buckets or self.buckets[0] < 1:
            raise ConfigError(f"buckets must be increasing positive edges, got {list(self.buckets)}")
        if self.stream_length and not self.stream_window + max(self.stream_keep, default=0) < self.stream_length - 1:
            raise ConfigError(f"stream_window {self.stream_window} leaves no token to score in {self.stream_length}")
        if any(k < 0 for k in self.collapse_repeats) or any(k < 0 for k in self.stream_keep):
            raise ConfigError("collapse_repeats and stream_keep must be >= 0")

    def check_inputs(self) -> None:
        """Every learned-sink file, read before the model loads."""
        from sinkmech.interventions.sink_file import read_sink_file  # light: no torch

        for pattern in self.learned_sinks:
            read_sink_file(pattern.format(model=self.model))


@register
@dataclass(frozen=True)
class FirstTokenConfig(StudyConfig):
    """Sink or token? Other first tokens in `<bos>`'s place (`sinkmech.studies.first_token`):
    `<bos>`, `<eos>`, `<pad>` (where it differs from `<eos>`), a newline, " the", a rare
    word, `<bos>` twice and nothing, each paired by prompt against `<bos>` first on
    the first `n_prompts` prompts of the default corpus; Gemma 3 270M (trained with
    a fixed `<bos>`) and SmolLM2 (the control). Findings: `<model>.first_token.<name>`."""

    study: ClassVar[str] = "first-token"
    runner: ClassVar[str] = "sinkmech.studies.first_token:run"
    help: ClassVar[dict[str, str]] = {
        "models": "models, each loaded in turn", "n_prompts": "the first N windows of the default corpus",
        "max_tokens": "content tokens per prompt", "swap_position": "the content position of the one-token swap"}

    models: tuple[str, ...] = ("gemma3-270m", "smollm2")
    n_prompts: int = 64
    max_tokens: int = 64
    swap_position: int = 4


@register
@dataclass(frozen=True)
class BosPositionConfig(StudyConfig):
    """Sink or position? `<bos>` moved after K content tokens (`sinkmech.studies.bos_position`),
    against `<bos>` first and no `<bos>` on the same content targets (all but
    content token K, which only the `<bos>` position would predict).
    Findings: `<model>.bos_position.<K>`."""

    study: ClassVar[str] = "bos-position"
    runner: ClassVar[str] = "sinkmech.studies.bos_position:run"
    help: ClassVar[dict[str, str]] = {
        "models": "models, each loaded in turn", "n_prompts": "the first N windows of the default corpus",
        "max_tokens": "content tokens per prompt", "positions": "K: <bos> after K content tokens, one run each",
        "eps": "sink-rate thresholds"}

    models: tuple[str, ...] = ("gemma3-270m",)
    n_prompts: int = 64
    max_tokens: int = 64
    positions: tuple[int, ...] = (1, 2, 4, 8)
    eps: tuple[float, ...] = (0.3, 0.8)


@register
@dataclass(frozen=True)
class BosCostConfig(StudyConfig):
    """What masking key 0 in some heads reproduces of the `<bos>` cost
    (`sinkmech.studies.bos_cost`): heads ranked by their `mask_first` loss change
    on the first `select` prompts, the top k masked together on the next `eval`
    (held out), every k reported (none picked). Findings: `<model>.bos_cost`."""

    study: ClassVar[str] = "bos-cost"
    runner: ClassVar[str] = "sinkmech.studies.bos_cost:run"
    help: ClassVar[dict[str, str]] = {
        "models": "models, each loaded in turn", "select": "prompts that rank the heads (the first N)",
        "eval": "held-out prompts after them that score the top k", "max_tokens": "content tokens per prompt",
        "ks": "k: the top k heads masked together, one run each"}

    models: tuple[str, ...] = ("gemma3-270m",)
    select: int = 8
    eval: int = 32
    max_tokens: int = 48
    ks: tuple[int, ...] = (1, 2, 4, 8, 16)


@register
@dataclass(frozen=True)
class TextBosCostConfig(StudyConfig):
    """`bos_cost` on models trained here (`sinkmech train study text`; each a
    checkpoint folder), on their own held-out text windows
    (`sinkmech.studies.text_bos_cost`): `select` windows of the validation split's
    first half rank the heads, `eval` of its second half are held out; each run's
    log compared with the committed one in `logs` when given. Findings:
    `train.text.bos_cost.<run>`."""

    study: ClassVar[str] = "text-bos-cost"
    runner: ClassVar[str] = "sinkmech.studies.text_bos_cost:run"
    help: ClassVar[dict[str, str]] = {
        "checkpoints": "checkpoint folders of `sinkmech train` runs", "logs": "folder of the committed training "
        "logs each run's log is compared with (none: no comparison)", "select": "validation windows that rank the heads",
        "eval": "held-out validation windows that score the top k", "ks": "k: the top k heads masked together",
        "threads": "torch CPU threads"}

    checkpoints: tuple[str, ...] = tuple(f"runs/train/text/text-{r}" for r in (
        "L2H4-wd0-fixedbos-s0", "L2H4-wd0.1-fixedbos-s0", "L4H4-wd0.1-fixedbos-s0", "L4H4-wd0.1-fixedbos-s1",
        "L4H4-wd0.1-fixedbos-s2"))
    logs: str | None = "figures/train/logs/text"
    select: int = 64
    eval: int = 256
    ks: tuple[int, ...] = (1, 2, 4, 8, 16)
    threads: int = 1


@register
@dataclass(frozen=True)
class DecompositionConfig(StudyConfig):
    """Sink or `<bos>`: what removing `<bos>` costs, split into the mass and the value
    (`sinkmech.studies.decomposition`). Held-out prompts `first_prompt` ..
    `first_prompt + n_prompts - 1` of the corpus (default: the Python docs
    windows); the top-k sink heads are ranked on prompts 0 .. `select_prompts - 1`.
    `learned_files`: `sinkmech fit-sinks` files ("{model}" is replaced by each
    model's name), each a condition of its own; their fitting prompts are refused.
    `parts`: main (the conditions and the 2 x 2 design), moved (`<bos>` after K
    content tokens), layers (the phantom in one layer at a time), all_but (in all
    layers but one), heads (in the top-k sink heads only); `<bos>` first and no
    `<bos>` run in each, so the pieces can run apart and be merged."""

    study: ClassVar[str] = "decomposition"
    runner: ClassVar[str] = "sinkmech.studies.decomposition:run"
    help: ClassVar[dict[str, str]] = {
        "models": "models, each loaded in turn", "prompts": "prompt file (none: the default corpus)",
        "n_prompts": "held-out prompts scored", "first_prompt": "the first held-out prompt's index",
        "select_prompts": "prompts 0..N-1 rank the top-k sink heads", "max_tokens": "content tokens per prompt",
        "swap_position": "the content position of the one-token swap (spread)",
        "positions": "K: <bos> after K content tokens (part moved)", "top_k": "k: the phantom in the top k sink "
        "heads only (part heads)", "layer_values": "the phantom's value in the per-layer parts",
        "learned_files": "fit-sinks files, {model} replaced by each model's name; each a condition",
        "parts": "which parts run (see above)", "eps": "sink-rate thresholds"}
    # what draws its figures from the result's JSON into a folder (PNG and SVG)
    figures: ClassVar[str] = "sinkmech.plots.decomposition:decomposition_figures"

    models: tuple[str, ...] = ("gemma3-270m", "smollm2")
    prompts: str | None = None
    n_prompts: int = 64
    first_prompt: int = 64
    select_prompts: int = 32
    max_tokens: int = 64
    swap_position: int = 4
    positions: tuple[int, ...] = (1, 2, 4, 8)
    top_k: tuple[int, ...] = (1, 2, 4, 8, 16)
    layer_values: tuple[Literal["bos", "zero"], ...] = ("bos", "zero")
    learned_files: tuple[str, ...] = ("figures/fit_sinks/{model}_head.json", "figures/fit_sinks/{model}_head_value.json")
    parts: tuple[Literal["main", "moved", "layers", "all_but", "heads"], ...] = ("main", "moved", "layers", "all_but",
                                                                                "heads")
    eps: tuple[float, ...] = (0.3, 0.8)

    def check_inputs(self) -> None:
        """The prompt file and every learned-sinks file (for each model), read before any model loads."""
        from sinkmech.corpora import load_prompts
        from sinkmech.interventions.sink_file import read_sink_file  # light: no torch

        if self.prompts is not None:
            load_prompts(self.prompts)
        if "main" in self.parts:
            for model in self.models:
                for pattern in self.learned_files:
                    read_sink_file(pattern.format(model=model))
