"""Every study's settings, one `Config` class each, registered by name in
`STUDIES`. Imports nothing heavy: the command line checks a config (flags or a
file) before torch loads. Each class names the function that runs it
(`runner`, "module:function", imported only when the study runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from sinkmech.studies.config import StudyConfig

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
