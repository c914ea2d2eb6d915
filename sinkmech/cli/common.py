"""What every `sinkmech` command shares: the common flags, the `<bos>`
conditions, JSON output, and the one error a command raises for a bad flag.

Error policy (applied by `sinkmech.cli.main.main`):

- exit 2, usage error: argparse's own errors (it exits itself), a value a
  flag's type rejects (`positive_int`, `fraction`, `image_file`, ...: each
  flag is checked once, where it is declared, while the arguments are read), a
  `UsageError` a command raises for flags that conflict, a `ValueError` an analysis
  raises for an option or input it rejects, and a `FileNotFoundError` for an
  input file that does not exist;
- exit 2 also for an output folder that holds an earlier output (without
  --overwrite) or files sinkmech did not write (`FileExistsError`);
- exit 1, runtime error: any other `OSError` (an output that cannot be written,
  a folder that cannot be created: see `sinkmech.files`) or `RuntimeError`;
- exit 130 on Ctrl-C, with one line and no traceback.

Either way one line `error: ...` goes to stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import math
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from sinkmech.files import json_text, write_text
from sinkmech.model_names import DEFAULT_MODEL, MODEL_FORMS, check_device, check_model_spec

# This module is read while the flags are parsed: it imports nothing heavy
# (torch, TransformerLens, transformers, Ray) at the top, so `--help` and a
# rejected flag answer at once; what a command runs is imported when it runs.

MODEL_HELP = MODEL_FORMS


def source_constant(module: str, name: str):
    """The literal value of `module.name` (a tuple, list or number, or the
    values of a `Literal[...]`), read from the module's source without importing
    it: a flag's choices and defaults come from where they are defined, while
    the flags are parsed, without the imports of the module that defines them."""
    for node in _source(module).body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == name and getattr(node, "value", None) is not None:
            value = node.value
            if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name) and value.value.id == "Literal":
                value = value.slice
            return ast.literal_eval(value)
    raise LookupError(f"{module} defines no literal {name}")


def dataclass_defaults(module: str, cls: str) -> dict:
    """The literal field defaults of dataclass `module.cls`, read like `source_constant`."""
    for node in _source(module).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {st.target.id: ast.literal_eval(st.value) for st in node.body
                    if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value is not None
                    and _is_literal(st.value)}
    raise LookupError(f"{module} defines no class {cls}")


def _source(module: str) -> ast.Module:
    """The parsed source of sinkmech module `module` (found under this package's
    folder: `find_spec` would import its parent packages)."""
    root = Path(__file__).resolve().parents[1]
    parts = module.split(".")
    if parts[0] != root.name:
        raise ValueError(f"not a sinkmech module: {module}")
    path = root.joinpath(*parts[1:]).with_suffix(".py")
    return ast.parse(path.read_text(encoding="utf-8"))


def _is_literal(node) -> bool:
    try:
        ast.literal_eval(node)
    except ValueError:
        return False
    return True


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


def model_name(text: str) -> str:
    """A model this machine can load ('smollm2', a packaged model, a .gguf path,
    a Hugging Face folder or a TransformerLens name), checked without loading it
    (`sinkmech.model_names.check_model_spec`)."""
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


PROMPTS_HELP = ("text file (one prompt per line), .jsonl/.ndjson with a 'text' field per line, or a .json list of "
                "strings or such objects; default: 170 windows of the Python docs")
BATCH_HELP = "prompts per forward pass (default 16; lower it if memory runs out)"
PNG_HELP = "write a figure here (.png, .svg or .pdf)"
BOS_HELP = "prepend: <bos> at position 0 of every prompt; none: the same content tokens without it (default prepend)"


def add_common(p: argparse.ArgumentParser) -> None:
    """--model, --prompts, --max-tokens, --batch-size, --json, --png."""
    p.add_argument("--model", type=model_name, default=DEFAULT_MODEL, help=MODEL_HELP)
    p.add_argument("--prompts", default=None, help=PROMPTS_HELP)
    p.add_argument("--max-tokens", type=positive_int, default=64, help="content tokens per prompt (default 64)")
    p.add_argument("--batch-size", type=positive_int, default=16, help=BATCH_HELP)
    p.add_argument("--json", type=output_file, default=None, help="write results as JSON here ('-': stdout, everything else then goes to stderr)")
    p.add_argument("--png", type=image_file, default=None, help=PNG_HELP)


DTYPE_CHOICES = ("float32", "bfloat16", "float16")


def add_model_options(p: argparse.ArgumentParser) -> None:
    """--dtype and --device (every command that loads a model)."""
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="float32",
                   help="weights and activations in this dtype (default float32); sums, losses and norms "
                        "accumulate in float32 or wider whatever it is")
    p.add_argument("--device", type=device_name, default=None,
                   help="torch device, e.g. cpu, cuda, cuda:1 (default: cuda when present)")


def load_model_arg(args, spec: str | None = None):
    """The model named by --model (or `spec`), in --dtype on --device."""
    from sinkmech import models

    return models.load_model(spec or args.model, device=getattr(args, "device", None),
                             dtype=getattr(args, "dtype", "float32"))


def add_intervention_common(p: argparse.ArgumentParser) -> None:
    """The common flags and --n-prompts (patch, ablate, perturb)."""
    add_common(p)
    p.add_argument("--n-prompts", type=positive_int, default=None, help="use only the first N prompts")


def add_bos_token(p: argparse.ArgumentParser) -> None:
    """--bos-token TEXT: the token put first in the "with <bos>" condition."""
    p.add_argument("--bos-token", default=None, metavar="TEXT",
                   help="token prepended in the 'with <bos>' condition instead of the model's <bos> (must be exactly "
                        "one token; e.g. SmolLM2's <bos> <|im_start|> is a chat-turn header, try '<|endoftext|>')")


def bos_token_arg(model, args) -> int | None:
    """--bos-token resolved to a token id once the model is loaded (None: the
    model's own <bos>). The text must tokenize to exactly one token."""
    text = getattr(args, "bos_token", None)
    if text is None:
        return None
    if not text:
        raise UsageError("--bos-token is empty")
    if model.tokenizer is None:
        raise UsageError("--bos-token needs a model with a tokenizer")
    ids = model.tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise UsageError(f"--bos-token {text!r} must be exactly one token, it tokenizes to {len(ids)}: {list(ids)}")
    return int(ids[0])


def add_metric(p: argparse.ArgumentParser, *, loss: bool = False) -> None:
    """--metric and --answers; `loss` also offers --metric loss (the content-target loss change, nats)."""
    p.add_argument("--metric", choices=["kl", "logit_diff"] + (["loss"] if loss else []), default="kl",
                   help="kl: mean KL over content positions (default)" + (
                       "; loss: the change of the next-token loss on content targets, nats per target" if loss else ""))
    p.add_argument("--answers", nargs=2, metavar=("CORRECT", "INCORRECT"), default=None, help="tokens (strings) for --metric logit_diff")


def conditions(bos: str) -> list[str]:
    """--bos prepend | none | both -> the conditions to run."""
    from sinkmech.prompts import CONDITIONS

    return list(CONDITIONS) if bos == "both" else [bos]


def prompts_arg(args):
    """--prompts read now (a bad file fails before the slow model load), cut to
    the first --n-prompts when given."""
    n = getattr(args, "n_prompts", None)
    from sinkmech.prompts import load_prompts

    prompts = load_prompts(args.prompts)
    return prompts if n is None else prompts[:n]


def warn_short(batch, max_tokens: int) -> None:
    """Say on stderr how many prompts are shorter than --max-tokens (they are
    scored at their own length, recorded as `lengths` in the JSON)."""
    content = batch.lengths - batch.offset
    if batch.context_limit is not None:
        print(f"warning: --max-tokens {max_tokens} does not fit the model's context of {batch.context_limit} "
              f"positions: longer prompts were cut to {batch.max_content} content tokens (recorded as "
              "context_limit in the JSON)", file=sys.stderr)
        max_tokens = batch.max_content
    short = int((content < max_tokens).sum())
    if short:
        print(f"warning: {short} of {len(batch)} prompts have fewer than {max_tokens} content tokens "
              f"(shortest {int(content.min())}); they are scored at their own length", file=sys.stderr)


def answers(model, args) -> tuple[int, int] | None:
    """--answers as two token ids (each answer must be exactly one token)."""
    if args.answers is None:
        return None
    ids = []
    for text in args.answers:
        toks = model.tokenizer(text, add_special_tokens=False)["input_ids"] if model.tokenizer is not None else []
        if len(toks) != 1:
            raise UsageError(f"answer {text!r} must be exactly one token, got {len(toks)}")
        ids.append(toks[0])
    return tuple(ids)


_json_stdout: list = []  # the real stdout while `--json -` sends everything else to stderr


@contextlib.contextmanager
def json_only_stdout(active: bool):
    """With `--json -`, stdout holds the JSON alone: tables and messages go to stderr."""
    if not active:
        yield
        return
    _json_stdout.append(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _json_stdout.pop()


def write_json(path: Path, payload: dict) -> None:
    """Write `payload` as strict JSON (NaN and infinities as null) and say so on
    stderr; `-` prints it to stdout instead (see `json_only_stdout`). An OSError
    says which path failed."""
    text = json_text(payload)
    if str(path) == "-":
        print(text, file=_json_stdout[-1] if _json_stdout else sys.stdout)
        return
    write_text(path, text)
    print(f"wrote {path}", file=sys.stderr)


IMAGE_SUFFIXES = (".png", ".svg", ".pdf")


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


def write_results(args, payload=None, png=None, *, extra: Sequence = ()) -> None:
    """The usual end of a command: `payload` (a dict, or a callable giving one)
    to --json and `png()` for --png, each only if asked, through `write_outputs`."""
    def json_out() -> None:
        write_json(args.json, payload() if callable(payload) else payload)

    write_outputs(*extra, *([("--json", json_out)] if getattr(args, "json", None) and payload is not None else []),
                  *([("--png", png)] if getattr(args, "png", None) and png is not None else []))


def write_outputs(*writers) -> None:
    """Run every `(label, write)` even when an earlier one fails, so a run is
    never lost to one bad path; then raise one OSError naming what failed (exit 1)."""
    failed = []
    for label, write in writers:
        try:
            write()
        except OSError as e:
            failed.append(f"{label} ({e})")
    if failed:
        raise OSError("could not write " + "; ".join(failed) + " (every other output was written)")
