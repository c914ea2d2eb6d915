"""`sinkmech study NAME`: any study registered in `sinkmech.studies.configs.STUDIES`.

Its settings come from the study's `Config` (a frozen dataclass of plain fields):
its defaults, then a config file (`--config FILE.toml | FILE.json`, or a result
JSON that recorded the config it ran), then one flag per field (`--n-prompts 24`;
`--no-x` for a true/false field; several values for a list). The config is
checked from the flags alone, before torch loads: a bad one is one `error:` line
(exit 2). The result, with the config it ran under "config", goes to `--json`,
so `sinkmech study NAME --config THAT.json` runs it again.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import sys
import time
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from sinkmech.cli.common import (
    DTYPE_CHOICES, FlagValueError, UsageError, device_name, output_file, output_folder, positive_int, write_json,
)

# flags every study has; a Config field may not take their names
GENERIC = ("config", "json", "findings", "figures", "batch_size", "device", "dtype", "quiet")


def add_study_parser(sub) -> None:
    from sinkmech.studies.configs import STUDIES

    p = sub.add_parser("study", help="one of the paper's studies, from a config: " + ", ".join(STUDIES),
                       description="Run a study from its config (defaults, --config FILE, flags); `sinkmech study "
                                   "NAME --help` lists its settings.")
    names = p.add_subparsers(dest="study", required=True, metavar="NAME")
    for name, cls in STUDIES.items():
        add_one_study(names, name, cls)


def add_one_study(names, name: str, cls) -> None:
    """The parser of `sinkmech study NAME`: the generic flags and one per field of its Config."""
    doc = inspect.cleandoc(cls.__doc__ or name)
    q = names.add_parser(name, help=doc.split("\n\n")[0].replace("\n", " "), description=doc,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    q.add_argument("--config", type=Path, default=None, metavar="FILE",
                   help="settings from a .toml or .json config, or from a result JSON that recorded one (its "
                        "\"config\"); flags given beside it override it")
    settings = q.add_argument_group(f"settings (fields of {cls.__name__}; default: the Config's)")
    for flag, kw in field_flags(cls):
        settings.add_argument(flag, **kw)
    q.add_argument("--json", type=output_file, default=None,
                   help="write the result, with the config it ran, as JSON here ('-': stdout)")
    if cls.has_findings:
        q.add_argument("--findings", type=output_file, default=None,
                       help="merge the study's quotable numbers into this findings file (e.g. figures/findings.json), "
                            "each under its own prefix (an earlier run's numbers under that prefix are replaced)")
    if getattr(cls, "figures", None):
        q.add_argument("--figures", type=output_folder, default=None, metavar="DIR",
                       help="draw the study's figures (PNG and SVG) from its result into this folder")
    q.add_argument("--batch-size", type=positive_int, default=None,
                   help="prompts per forward pass (default: each analysis's own)")
    q.add_argument("--dtype", choices=DTYPE_CHOICES, default="float32",
                   help="the models' weights and activations in this dtype (default float32)")
    q.add_argument("--device", type=device_name, default=None, help="torch device (default: cuda when present)")
    q.add_argument("--quiet", action="store_true", help="no progress bars")
    q.set_defaults(func=cmd_study)


@functools.cache
def field_flags(cls) -> tuple[tuple[str, dict], ...]:
    """(`--name`, add_argument's keywords) for each field of a Config, its values
    parsed as the annotation says; worked out once per class (every parser
    build reads them)."""
    from sinkmech.studies.config import field_hints

    hints = field_hints(cls)
    flags = []
    for f in dataclasses.fields(cls):
        if f.name in GENERIC:
            raise TypeError(f"{cls.__name__}.{f.name}: a study setting may not be named like the generic flag "
                            f"--{f.name.replace('_', '-')}")
        flags.append(field_flag(f.name, hints[f.name], f.default, cls.help.get(f.name, "")))
    return tuple(flags)


def field_flag(name: str, hint: Any, default: Any, help_: str) -> tuple[str, dict]:
    """`--name` for a Config field and add_argument's keywords for it."""
    base, optional = _strip_none(hint)
    shown = " ".join(map(_text, default)) if isinstance(default, tuple) else _text(default)
    if "default" not in help_:  # a help that says its default itself keeps it
        help_ = f"{help_ + ' ' if help_ else ''}(default: {shown or 'none'})"
    kw = dict(dest=f"set_{name}", default=argparse.SUPPRESS, help=help_.replace("%", "%%"))
    flag = "--" + name.replace("_", "-")
    if base is bool:
        return flag, dict(action=argparse.BooleanOptionalAction, **kw)
    if get_origin(base) is tuple:
        item = get_args(base)[0]
        return flag, dict(nargs="+", type=FieldValue(item), metavar=_metavar(item), **kw)
    return flag, dict(type=FieldValue(base, none=optional), metavar=_metavar(base, optional), **kw)


def _strip_none(hint: Any) -> tuple[Any, bool]:
    """(the annotation without None, whether None was allowed)."""
    if get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0], len(args) < len(get_args(hint))
    return hint, False


def _text(value: Any) -> str:
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _metavar(hint: Any, optional: bool = False) -> str:
    if get_origin(hint) is Literal:
        names = "|".join(map(_text, get_args(hint)))
    else:
        names = {int: "N", float: "X", str: "TEXT", bool: "true|false"}.get(hint, "VALUE")
    return f"{names}|none" if optional else names


@dataclasses.dataclass(frozen=True)
class FieldValue:
    """A flag type: the text as the annotation's value (`none` allowed when the field may be None)."""

    hint: Any
    none: bool = dataclasses.field(default=False, kw_only=True)

    @property
    def __name__(self) -> str:  # argparse names the type in its messages
        return getattr(self.hint, "__name__", "value")

    def __call__(self, text: str):
        hint = self.hint
        if self.none and text.lower() == "none":
            return None
        if get_origin(hint) is Literal:
            for choice in get_args(hint):
                if text == _text(choice):
                    return choice
            raise FlagValueError(f"must be one of {', '.join(map(_text, get_args(hint)))}, got {text!r}")
        if hint is bool:
            if text.lower() in ("true", "yes"):
                return True
            if text.lower() in ("false", "no"):
                return False
            raise FlagValueError(f"takes true or false, got {text!r}")
        if hint in (int, float):
            try:
                return hint(text)
            except ValueError:
                raise FlagValueError(f"takes {'whole ' if hint is int else ''}numbers, got {text!r}") from None
        return text


def study_config(args):
    """The config the flags ask for: the Config's defaults, then --config, then each flag given."""
    from sinkmech.studies.configs import STUDIES

    from sinkmech.studies.config import ConfigError

    cls = STUDIES[args.study]
    base = cls.read(args.config) if args.config is not None else cls()
    given = {k[len("set_"):]: v for k, v in vars(args).items() if k.startswith("set_")}
    try:
        return cls.from_dict({**base.to_dict(), **given}) if given else base
    except ConfigError as e:  # said in the flag's words when a flag set it
        name = str(e).split(" ")[0].rstrip(":")
        if name in given:
            raise ConfigError(f"--{name.replace('_', '-')}{str(e)[len(name):]}") from None
        raise


def check_models(config) -> None:
    """The models a config names (a `model` or `models` field) loadable here, checked
    without loading any (`sinkmech.loading.names.check_model_spec`): a bad one is a
    usage error before the first model loads."""
    from sinkmech.loading.names import check_model_spec

    specs = [config.model] if hasattr(config, "model") else list(getattr(config, "models", ()))
    for spec in specs:
        try:
            check_model_spec(spec)
        except (ValueError, OSError) as e:
            field = "model" if hasattr(config, "model") else "models"
            raise UsageError(f"{field}: {spec!r} is not loadable here: {e}") from None


def cmd_study(args) -> None:
    config = study_config(args)  # checked here, before torch loads: a bad one exits 2
    check_models(config)
    try:
        config.check_inputs()
    except (ValueError, OSError) as e:
        raise UsageError(str(e)) from None
    from sinkmech.options import RunOptions

    options = RunOptions(batch_size=args.batch_size, progress=not args.quiet, device=args.device, dtype=args.dtype)
    if args.json is None and getattr(args, "findings", None) is None:
        print("warning: no --json: the result is not written (only what the study writes itself)", file=sys.stderr)
    t0 = time.perf_counter()
    result = config.run(study_models(config, options), options)
    print(f"study {config.study}: done in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    for note in result.notes():
        print(note, file=sys.stderr)
    if args.json is not None:
        write_json(args.json, result.to_dict())
    if getattr(args, "figures", None) is not None:
        module, name = type(config).figures.split(":")
        import importlib

        for path in getattr(importlib.import_module(module), name)(result.to_dict(), args.figures):
            print(f"wrote {path}", file=sys.stderr)
    if getattr(args, "findings", None) is not None:
        from sinkmech.findings import record

        for prefix, values in result.findings().items():
            record(args.findings, values, replace_prefix=prefix)
        print(f"recorded findings in {args.findings}", file=sys.stderr)


def study_models(config, options):
    """What the command line hands a study's `run`: the model its Config names in a
    `model` field, loaded; the specs of a `models` field, for `run` to load in turn
    (`sinkmech.loading.models.each_model`); None for a study that loads or trains
    its own."""
    if hasattr(config, "model"):
        from sinkmech.loading.models import load_model

        n_ctx = getattr(config, "n_ctx_needed", None)  # a study past the default context says what it needs
        return load_model(config.model, device=options.device, dtype=options.dtype or "float32",
                          **({} if n_ctx is None else {"n_ctx": n_ctx}))
    if hasattr(config, "models"):
        return list(config.models)
    return None
