"""Sizes of the training studies (presets), the settings every study shares, and
`KEY=VALUE` overrides of any `TrainConfig` field: what a study's runs are made of
before anything trains."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path

from sinkmech.train.config import DATA_SOURCES, PACKINGS, POSITIONALS, TrainConfig

# cpu: Guo et al.'s one-layer, one-head model with learned absolute positions,
# where a thresholded sink forms: on a probe of exactly this config (seed 0) the
# head's first-token score crossed 0.3 between steps 1,750 and 2,000 and reached
# 0.54 at 3,000 (100 % of prompts > 0.3, none > 0.8), in ~4.5 minutes on one
# torch thread of a shared 2-core machine.
# gpu: the same recipe scaled up (4 layers x 8 heads, T=512, 16x the tokens per
# step); not measured on a GPU. `--steps 2` is a smoke test of either.
# text: the natural-text setting (byte-level pydoc topics + stdlib docstrings +
# stdlib .py sources, ~31 MB), rotary, 2 layers x 4 heads, d 128, T 256, 4,096
# tokens/step; sized to <= 15 minutes on one thread.
PRESETS: dict[str, dict] = {
    "cpu": dict(data="bigram_backcopy", context_length=128, tokens_per_step=2048, n_layers=1, d_model=64,
                n_heads=1, positional="standard", steps=3000, lr=5e-3, warmup=50, eval_every=100, threads=1),
    "gpu": dict(data="bigram_backcopy", context_length=512, tokens_per_step=65536, n_layers=4, d_model=512,
                n_heads=8, positional="standard", steps=4000, lr=1e-3, warmup=200, eval_every=100,
                eval_prompts=64, val_windows=64, bb_vocab=128, bb_doc_max=1024),
    "text": dict(data="text", text_corpus="docs+source", context_length=256, tokens_per_step=4096, n_layers=2,
                 d_model=128, n_heads=4, positional="rotary", steps=2000, lr=3e-3, warmup=100,
                 weight_decay=0.1, eval_every=250, threads=1),
}
CONTEXT_LENGTHS = {"cpu": [32, 64, 128, 256], "gpu": [128, 256, 512, 1024, 2048]}
# (packing, fixed_bos): the paper's Table 2, both packings.
RECIPES = [("causal", False), ("causal", True), ("intra_doc", False), ("intra_doc", True)]
POSITIONAL_RUNS = ("standard", "rotary", "none")
EMERGENCE_RUN = ("causal", True)  # the packing run whose log draws emergence.png


@dataclass(frozen=True)
class StudySettings:
    """What every study shares: the preset and its overrides, where outputs,
    logs and checkpoints go, and how many runs train at once.

    Outputs go to `out/<prefix><study>.json`, logs to
    `out/logs/<study>/<prefix><run>.json` and checkpoints to
    `runs_dir/<study>/<prefix><run>/`."""

    preset: str = "cpu"
    steps: int | None = None  # each None keeps the preset's value
    threads: int | None = None
    data: str | None = None
    seed: int | None = None
    eval_every: int | None = None
    sets: tuple[str, ...] = ()  # KEY=VALUE overrides of TrainConfig fields, applied last
    out: Path = Path("figures/train")
    runs_dir: Path = Path("runs/train")
    prefix: str = ""
    jobs: int = 1  # independent runs trained at once, in separate processes
    quiet: bool = False  # no progress bars

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}: choose one of {sorted(PRESETS)}")
        object.__setattr__(self, "out", Path(self.out))
        object.__setattr__(self, "runs_dir", Path(self.runs_dir))
        object.__setattr__(self, "sets", tuple(self.sets))

    def config(self, **overrides) -> TrainConfig:
        """The preset's config with the flag overrides, then `overrides`, then
        `sets`; evaluation every `steps` at most, warm-up no longer than the run."""
        kw = dict(PRESETS[self.preset])
        for name in ("steps", "threads", "data", "seed", "eval_every"):
            if getattr(self, name) is not None:
                kw[name] = getattr(self, name)
        kw.update(overrides)
        kw.update(parse_sets(self.sets))
        if kw["eval_every"] > kw["steps"]:
            kw["eval_every"] = kw["steps"]
        kw["warmup"] = min(kw["warmup"], kw["steps"])
        return TrainConfig(**kw)

    def output(self, name: str) -> Path:
        """`out/<prefix><name>`: one of the study's output files."""
        return self.out / f"{self.prefix}{name}"

    def log_path(self, study: str, run: str) -> Path:
        return self.out / "logs" / study / f"{self.prefix}{run}.json"

    def checkpoint_dir(self, study: str, run: str) -> Path:
        return self.runs_dir / study / f"{self.prefix}{run}"


def parse_sets(items: list[str] | tuple[str, ...] | None) -> dict:
    """`KEY=VALUE` overrides of TrainConfig fields, typed like the field's default."""
    types = {f.name: f for f in fields(TrainConfig)}
    choices = {"data": DATA_SOURCES, "packing": PACKINGS, "positional": POSITIONALS}
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or key not in types:
            raise ValueError(f"--set takes KEY=VALUE with KEY a TrainConfig field, got {item!r}")
        if key in choices and value not in choices[key]:
            raise ValueError(f"--set {key} takes one of {choices[key]}, got {value!r}")
        default = types[key].default
        if isinstance(default, bool):
            if value.lower() not in ("true", "false"):
                raise ValueError(f"--set {key} takes true or false, got {value!r}")
            out[key] = value.lower() == "true"
        elif isinstance(default, (int, float)) or default is None:
            kind = float if isinstance(default, float) else int
            try:
                out[key] = kind(value)
            except ValueError:
                raise ValueError(f"--set {key} takes {'a number' if kind is float else 'an integer'}, "
                                 f"got {value!r}") from None
        else:
            out[key] = value
    return out


def recipe_name(run: str) -> str:
    """A text run's name without its seed (`-s<seed>`): the runs that share it differ only in their seed."""
    return re.sub(r"-s\d+(?=-|$)", "", run)
