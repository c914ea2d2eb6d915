"""Every study's settings, one `Config` class each, registered by name in
`STUDIES`. Imports nothing heavy: the command line checks a config (flags or a
file) before torch loads. Each class names the function that runs it
(`runner`, "module:function", imported only when the study runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

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
        "noop_prompts": "prompts held out from the scan for the no-op check",
        "noop_heads": "closest candidates checked besides the if-else heads",
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
    noop_prompts: int = 32
    noop_heads: int = 3

    def check(self) -> None:
        for key in ("n_prompts", "max_tokens", "spread_prompts", "spread_tokens", "noop_prompts"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key} must be >= 1, got {getattr(self, key)}")
        if self.dormant_prompts < 0 or self.noop_heads < 0:
            raise ConfigError("dormant_prompts and noop_heads must be >= 0")
        if not 0 <= self.spread_position < self.spread_tokens - 1:
            raise ConfigError(f"spread_position must lie in [0, {self.spread_tokens - 1}), got {self.spread_position}")
        if not self.models:
            raise ConfigError("models: name at least one model")
        if not self.eps or any(not 0.0 <= e < 1.0 for e in self.eps):
            raise ConfigError(f"eps must be thresholds in [0, 1), got {list(self.eps)}")


@register
@dataclass(frozen=True)
class LongContextConfig(StudyConfig):
    """The paper's length claims at thousands of tokens (`sinkmech.studies.long_context`):
    loss and sink rate by position with and without `<bos>`, StreamingLLM's
    window with the first key kept or dropped, representational collapse in length.

    Attributes:
        lengths: content tokens per prompt, one run each (the same texts cut to each).
        n_prompts: long texts (`sinkmech.context.long_text`), from the topics in turn.
        topics: the long-text topics the prompts come from.
        buckets: upper edges of the position buckets (1-64, 65-512, ...), content positions from 1.
        eps: sink-rate thresholds (strict >).
        stream_length: content tokens of the StreamingLLM runs (with `<bos>`); 0 skips them.
        stream_window: W, the last keys every query sees.
        stream_keep: first keys kept beside the window (0: dropped), one run each, with the W + k control.
        collapse_repeats: k, the times a prefix's last token is repeated (`repeat_collapse`).
        collapse_prefix: content tokens of the prefix.
        attention: how the passes read attention (`sinkmech.measures.fused`).
    """

    study: ClassVar[str] = "long_context"
    runner: ClassVar[str] = "sinkmech.studies.long_context:run"

    lengths: tuple[int, ...] = (512, 2048, 8192)
    n_prompts: int = 4
    topics: tuple[str, ...] = ("python-docs", "licenses", "python-source")
    buckets: tuple[int, ...] = (64, 512, 2048, 8192)
    eps: tuple[float, ...] = (0.3, 0.8)
    stream_length: int = 8192
    stream_window: int = 1024
    stream_keep: tuple[int, ...] = (0, 1)
    collapse_repeats: tuple[int, ...] = (16, 128, 1024, 4096)
    collapse_prefix: int = 32
    attention: Literal["fused", "pattern", "auto"] = "fused"

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


@register
@dataclass(frozen=True)
class FirstTokenConfig(StudyConfig):
    """Sink or token? Other first tokens in `<bos>`'s place (`sinkmech.studies.first_token`):
    `<bos>`, `<eos>`, `<pad>` (where it differs from `<eos>`), a newline, " the", a rare
    word, `<bos>` twice and nothing, each paired by prompt against `<bos>` first on
    the first `n_prompts` prompts of the default corpus; Gemma 3 270M (trained with
    a fixed `<bos>`) and SmolLM2 (the control). Findings: `<model>.first_token.<name>`."""

    study: ClassVar[str] = "first_token"
    runner: ClassVar[str] = "sinkmech.studies.first_token:run"

    models: tuple[str, ...] = ("gemma3-270m", "smollm2")
    n_prompts: int = 64
    max_tokens: int = 64
    swap_position: int = 4
    batch_size: int = 8
    progress: bool = True


@register
@dataclass(frozen=True)
class BosPositionConfig(StudyConfig):
    """Sink or position? `<bos>` moved after K content tokens (`sinkmech.studies.bos_position`),
    against `<bos>` first and no `<bos>` on the same content targets (all but
    content token K, which only the `<bos>` position would predict).
    Findings: `<model>.bos_position.<K>`."""

    study: ClassVar[str] = "bos_position"
    runner: ClassVar[str] = "sinkmech.studies.bos_position:run"

    models: tuple[str, ...] = ("gemma3-270m",)
    n_prompts: int = 64
    max_tokens: int = 64
    positions: tuple[int, ...] = (1, 2, 4, 8)
    eps: tuple[float, ...] = (0.3, 0.8)
    batch_size: int = 8
    progress: bool = True


@register
@dataclass(frozen=True)
class BosCostConfig(StudyConfig):
    """What masking key 0 in some heads reproduces of the `<bos>` cost
    (`sinkmech.studies.bos_cost`): heads ranked by their `mask_first` loss change
    on the first `select` prompts, the top k masked together on the next `eval`
    (held out), every k reported (none picked). Findings: `<model>.bos_cost`."""

    study: ClassVar[str] = "bos_cost"
    runner: ClassVar[str] = "sinkmech.studies.bos_cost:run"

    models: tuple[str, ...] = ("gemma3-270m",)
    select: int = 8
    eval: int = 32
    max_tokens: int = 48
    ks: tuple[int, ...] = (1, 2, 4, 8, 16)
    batch_size: int = 8
    progress: bool = True


@register
@dataclass(frozen=True)
class TextBosCostConfig(StudyConfig):
    """`bos_cost` on models trained here (`sinkmech train study text`; each a
    checkpoint folder), on their own held-out text windows
    (`sinkmech.studies.text_bos_cost`): `select` windows of the validation split's
    first half rank the heads, `eval` of its second half are held out; each run's
    log compared with the committed one in `logs` when given. Findings:
    `train.text.bos_cost.<run>`."""

    study: ClassVar[str] = "text_bos_cost"
    runner: ClassVar[str] = "sinkmech.studies.text_bos_cost:run"

    checkpoints: tuple[str, ...] = tuple(f"runs/train/text/text-{r}" for r in (
        "L2H4-wd0-fixedbos-s0", "L2H4-wd0.1-fixedbos-s0", "L4H4-wd0.1-fixedbos-s0", "L4H4-wd0.1-fixedbos-s1",
        "L4H4-wd0.1-fixedbos-s2"))
    logs: str | None = "figures/train/logs/text"
    select: int = 64
    eval: int = 256
    ks: tuple[int, ...] = (1, 2, 4, 8, 16)
    batch_size: int = 8
    threads: int = 1
    progress: bool = True


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
    batch_size: int = 8
    progress: bool = True
