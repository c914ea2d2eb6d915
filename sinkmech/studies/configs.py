"""Every study's settings, one `Config` class each, registered by name in
`STUDIES`. Imports nothing heavy: the command line checks a config (flags or a
file) before torch loads. Each class names the function that runs it
(`runner`, "module:function", imported only when the study runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

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
        "noop_prompts": "prompts held out from the scan for the no-op check (0: none)",
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
        for key in ("n_prompts", "max_tokens", "spread_prompts", "spread_tokens"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key} must be >= 1, got {getattr(self, key)}")
        if self.dormant_prompts < 0 or self.noop_prompts < 0 or self.noop_heads < 0:
            raise ConfigError("dormant_prompts, noop_prompts and noop_heads must be >= 0")
        if not 0 <= self.spread_position < self.spread_tokens - 1:
            raise ConfigError(f"spread_position must lie in [0, {self.spread_tokens - 1}), got {self.spread_position}")
        if not self.models:
            raise ConfigError("models: name at least one model")
        if not self.eps or any(not 0.0 <= e < 1.0 for e in self.eps):
            raise ConfigError(f"eps must be thresholds in [0, 1), got {list(self.eps)}")
