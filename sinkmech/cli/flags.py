"""The flag types of every `sinkmech` command: each flag's value is checked once,
by the `type=` it is declared with, while argparse reads it (so before any model
loads), and the two errors a rejected flag becomes (`UsageError`, exit 2)."""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path

from sinkmech.loading.names import check_device, check_model_spec

# Read while the flags are parsed: nothing heavy (torch, TransformerLens,
# transformers, Ray) is imported here.


class UsageError(Exception):
    """A flag value the command rejects: `main` prints `error: ...` and exits 2."""


# Flag types: each flag's value is checked once, by the `type=` it is declared
# with, while argparse reads it (so before any model loads). A rejected value
# becomes one `error: --flag must be ...` line (`Parser.error`, exit 2).


class FlagValueError(argparse.ArgumentTypeError):
    """A value a flag type rejects; the message follows the flag's name."""


class Parser(argparse.ArgumentParser):
    """argparse, with a value rejected by a flag type (`FlagValueError`) raised as
    `UsageError("--flag must be ...")`, which `main` prints as one `error:` line.
    Other argparse errors (an unknown flag, a bad choice) keep argparse's message."""

    def error(self, message):
        err = sys.exc_info()[1]
        if isinstance(err, argparse.ArgumentError) and isinstance(err.__context__, FlagValueError):
            raise UsageError(f"{err.argument_name} {err.__context__}") from None
        super().error(message)


def _number(text: str, kind: type):
    try:
        value = kind(text)
    except ValueError:
        raise FlagValueError(f"takes {'whole ' if kind is int else ''}numbers, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise FlagValueError(f"must be a finite number, got {text}")
    return value


def _bounded(text: str, kind: type, low: int | float, *, strict: bool = False):
    """`text` as a `kind` >= `low` (> `low` when `strict`)."""
    value = _number(text, kind)
    if value < low or (strict and value == low):
        raise FlagValueError(f"must be {'>' if strict else '>='} {low:g}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (a count or a size)."""
    return _bounded(text, int, 1)


def count_or_all(text: str) -> int | None:
    """A whole number >= 1, or 'all' (None: no cap, one group): --noop-max-heads, --prompt-batch."""
    if text == "all":
        return None
    if not text.strip().isdigit():
        raise FlagValueError(f"takes a whole number >= 1 or 'all', got {text!r}")
    return positive_int(text)


def non_negative_int(text: str) -> int:
    """An integer >= 0 (a count where 0 turns something off, a position, a layer)."""
    return _bounded(text, int, 0)


def at_least(minimum: int):
    """A flag type: an integer >= `minimum`."""
    def check(text: str) -> int:
        return _bounded(text, int, minimum)

    check.__name__ = f"at_least_{minimum}"
    return check


def finite_float(text: str) -> float:
    """A finite number (no nan, no inf)."""
    return _number(text, float)


def positive_float(text: str) -> float:
    """A finite number > 0."""
    return _bounded(text, float, 0, strict=True)


def non_negative_float(text: str) -> float:
    """A finite number >= 0."""
    return _bounded(text, float, 0)


def fraction(text: str) -> float:
    """A finite number in [0, 1] (an attention threshold)."""
    value = _number(text, float)
    if not 0.0 <= value <= 1.0:
        raise FlagValueError(f"must lie in [0, 1], got {value}")
    return value


def share_below_one(text: str) -> float:
    """A finite number in [0, 1) (a share of attention that must stay below all of it)."""
    value = _number(text, float)
    if not 0.0 <= value < 1.0:
        raise FlagValueError(f"must lie in [0, 1), got {value}")
    return value


def eps_value(text: str) -> str:
    """A sink-rate threshold in [0, 1), kept as written ("0.3" stays the JSON key "0.3")."""
    try:
        value = float(text)
    except ValueError:
        raise FlagValueError(f"takes numbers, got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise FlagValueError(f"values must lie in [0, 1), got {text}")
    return text.strip()


def head_spec(text: str) -> str:
    """A head written LAYER.HEAD, e.g. 12.3 (checked against the model once it loads)."""
    parts = text.split(".")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise FlagValueError(f"is written LAYER.HEAD, e.g. 12.3; got {text!r}")
    return text


class Distinct(argparse.Action):
    """A list flag (nargs="+") whose values, each checked by the flag's type, may
    not repeat: a repeat is one `error:` line (exit 2) while the flags are read."""

    def __call__(self, parser, namespace, values, option_string=None):
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            raise UsageError(f"{option_string} lists {', '.join(map(str, repeated))} more than once: "
                             f"{' '.join(map(str, values))}")
        setattr(namespace, self.dest, list(values))


def token_text_flag(text: str) -> str:
    """The text of one token (e.g. --bos-token '<|endoftext|>'): not empty (that it is one
    token of the model's tokenizer is checked once the model loads)."""
    if not text:
        raise FlagValueError("is empty: give the text of one token, e.g. '<|endoftext|>'")
    return text


def model_name(text: str) -> str:
    """A model this machine can load ('smollm2', a packaged model, a .gguf path,
    a Hugging Face folder or a TransformerLens name), checked without loading it
    (`sinkmech.loading.names.check_model_spec`)."""
    try:
        check_model_spec(text)
    except (ValueError, OSError) as e:
        raise FlagValueError(f"is not loadable here: {e}") from None
    return text


def device_name(text: str) -> str:
    """A torch device this machine has (cpu, cuda, cuda:1, mps)."""
    try:
        return check_device(text)
    except ValueError as e:
        raise FlagValueError(f"names no usable device: {e}") from None


# Output paths: checked while the flags are read, so a run is not lost to a path
# it cannot write at the end.

IMAGE_SUFFIXES = (".png", ".svg", ".pdf")


def output_file(text: str) -> Path:
    """A file sinkmech will write ('-': stdout): not a folder, and its nearest
    existing folder is writable (missing folders are created later)."""
    path = Path(text)
    if text != "-":
        _check_writable(path)
    return path


def image_file(text: str) -> Path:
    """A figure file: .png, .svg or .pdf, writable as `output_file`."""
    path = Path(text)
    if path.suffix.lower() not in IMAGE_SUFFIXES:
        raise FlagValueError(f"must end in {', '.join(IMAGE_SUFFIXES)}, got {text}")
    _check_writable(path)
    return path


def _check_writable(path: Path) -> None:
    """The file at `path` can be created: it is not a folder, and its nearest
    existing ancestor is a writable folder. The rule for every output of every
    command: missing folders are created when the output is written, and said
    now, on stderr, while the flags are read (`note_missing_folder`)."""
    if path.is_dir():
        raise FlagValueError(f"{path} is a folder; give a file name")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise FlagValueError(f"{path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK):
        raise FlagValueError(f"{path}: cannot write into {parent} (permission denied)")
    try:  # os.access answers yes to root everywhere, /proc included: try it (an unnamed file, gone at once)
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        raise FlagValueError(f"{path}: cannot write into {parent} ({e.strerror or e})") from None
    note_missing_folder(path)


def note_missing_folder(path: Path) -> None:
    """Say on stderr that `path`'s folder does not exist yet and will be created
    (with its missing parents) when `path` is written."""
    if not path.parent.exists():
        print(f"note: the folder {path.parent} does not exist: it is created when {path.name} is written",
              file=sys.stderr)


def output_folder(text: str) -> Path:
    """A folder sinkmech writes as a whole (report, compare, train --out): its
    missing parent folders are created, as for every output (said on stderr)."""
    path = Path(text)
    note_missing_folder(path)
    return path
