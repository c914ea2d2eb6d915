"""The settings of a study as one object: written into every result it produces and
read back from it (or from a TOML file) to run it again. Imports nothing heavy, so
the command line checks a config before torch loads.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args, get_origin


class ConfigError(ValueError):
    """A config that cannot be read: an unknown or ill-typed field, or a bad file."""


@dataclasses.dataclass(frozen=True)
class StudyConfig:
    """Base of every study's `Config`: fields of JSON types (bool, int, float, str,
    None, tuples of them, Literal choices), each with a default, so that
    `Config()` is the study as the findings quote it."""

    study: ClassVar[str] = ""  # the name `sinkmech study NAME` runs
    runner: ClassVar[str] = ""  # "module:function" that runs it: run(model_or_models, config) -> Result
    # whether its result quotes numbers (`findings()`: {prefix: flat values}) for `--findings`
    has_findings: ClassVar[bool] = True
    help: ClassVar[dict[str, str]] = {}  # field -> the help of its command-line flag

    def __post_init__(self) -> None:
        """Every field checked against its annotation (a list becomes a tuple), then `check`."""
        hints = field_hints(type(self))
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, coerce(getattr(self, f.name), hints[f.name], f.name))
        self.check()

    def check(self) -> None:
        """Checks across fields (a study overrides it); raise ConfigError."""

    def to_dict(self) -> dict:
        """The fields as JSON-ready values, with the study's name under "study"."""
        out = {"study": self.study}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else v
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> StudyConfig:
        """A config from `to_dict()`'s form (the "study" entry, when present, must
        name this study); unknown fields and ill-typed values are refused."""
        values = dict(values)
        name = values.pop("study", cls.study)
        if name != cls.study:
            raise ConfigError(f"this config is for the study {name!r}, not {cls.study!r}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ConfigError(f"unknown setting(s) for the study {cls.study!r}: {', '.join(unknown)} "
                              f"(known: {', '.join(fields)})")
        hints = field_hints(cls)  # lists read as the tuples the fields hold (a type-checked __init__ wants them)
        return cls(**{k: coerce(v, hints[k], k) for k, v in values.items()})  # and checked again by __post_init__

    @classmethod
    def read(cls, path: str | Path) -> StudyConfig:
        """A config from a `.toml` file (its fields at the top level) or a `.json`
        file: a config, or a study's result that recorded one (its "config")."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file {path} not found")
        text = path.read_text(encoding="utf-8")
        try:
            if path.suffix == ".toml":
                import tomllib

                values = tomllib.loads(text)
            elif path.suffix == ".json":
                values = json.loads(text)
            else:
                raise ConfigError(f"a config file is .toml or .json, got {path.name}")
        except (ValueError, UnicodeDecodeError) as e:
            if isinstance(e, ConfigError):
                raise
            raise ConfigError(f"{path} is not valid {path.suffix[1:].upper()}: {e}") from None
        if isinstance(values, dict) and isinstance(values.get("config"), dict):
            values = values["config"]
        if not isinstance(values, dict):
            raise ConfigError(f"{path} holds no config (a table of settings)")
        return cls.from_dict(values)

    def check_inputs(self) -> None:
        """The files the config names, read and checked before any model loads
        (`sinkmech study` calls it; a study that names none has nothing to check)."""

    def run_function(self):
        """The function that runs this study (imported now: it may import torch)."""
        import importlib

        module, name = self.runner.split(":")
        return getattr(importlib.import_module(module), name)

    def run(self, models=None, options=None):
        """Run the study: `run_function()(models, self, options=options)` (`options`
        only where the study's `run` takes them). `models`: what the study's `run`
        takes (a loaded model, specs, or None for what the config names)."""
        import inspect

        fn = self.run_function()
        if options is not None and "options" in inspect.signature(fn).parameters:
            return fn(models, self, options=options)
        return fn(models, self)

    def replace(self, **changes) -> StudyConfig:
        """A copy with `changes`, checked as `from_dict` checks them."""
        return type(self).from_dict({**self.to_dict(), **changes})


@functools.cache
def field_hints(cls: type) -> dict[str, Any]:
    """A Config class's resolved field annotations (resolved once per class: every
    config built, read or turned into flags needs them)."""
    return typing.get_type_hints(cls)


def coerce(value: Any, hint: Any, name: str) -> Any:
    """`value` as the annotation `hint` wants it (lists become tuples), or a ConfigError."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return coerce(value, a, name)
            except ConfigError:
                pass
        raise ConfigError(f"{name}: {value!r} is none of {hint}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{name}: {value!r} is not one of {', '.join(map(repr, args))}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}: expected a list, got {value!r}")
        item = args[0] if args else Any
        return tuple(coerce(v, item, f"{name}[{i}]") for i, v in enumerate(value))
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{name}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{name}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{name}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{name}: settings of type {hint} cannot be read from a file")


@dataclasses.dataclass(frozen=True)
class StudyResult:
    """A study's result held as JSON sections by model (or by run): `to_dict()` is
    the sections with the config that ran them under "config"; `findings()` maps
    each findings prefix to the flat values recorded under it
    (`sinkmech.findings.record(path, values, replace_prefix=prefix)`)."""

    config: StudyConfig
    sections: dict
    findings_map: dict = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"config": self.config.to_dict(), **self.sections}

    def to_json(self) -> str:
        from sinkmech.files import json_text

        return json_text(self.to_dict(), indent=None)

    def to_dataframe(self):
        """Long format: one row per flat value (section, key, value)."""
        import pandas as pd

        from sinkmech.findings import flatten

        return pd.DataFrame([{"section": s, "key": k, "value": v} for s, d in self.sections.items()
                             for k, v in flatten("", d).items()])

    def findings(self) -> dict[str, dict]:
        return dict(self.findings_map)


def run_study(config: StudyConfig, models=None, options=None):
    """Run a study from its config, as `sinkmech study NAME` does: `config.run(models, options)`.

    Args:
        config: a registered study's Config (`sinkmech.STUDIES`), e.g.
            `DecompositionConfig(models=("gemma3-270m",), parts=("main",))`.
        models: a loaded model, specs, or None for what the config names.
        options: `RunOptions` (batch size, progress, device, dtype); None: the defaults.
    """
    return config.run(models, options)
