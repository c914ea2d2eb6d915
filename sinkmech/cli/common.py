"""What every `sinkmech` command shares: the common flags, the `<bos>`
conditions, JSON output, and the one error a command raises for a bad flag
(defined with the flag types in `sinkmech.cli.flags`, re-exported here).

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
import functools
import sys
from collections.abc import Sequence
from pathlib import Path

from sinkmech.cli.flags import (  # noqa: F401  (re-exported: every command imports its flag types from here)
    IMAGE_SUFFIXES, Distinct, FlagValueError, Parser, UsageError, at_least, device_name, eps_value, finite_float,
    fraction, head_spec, image_file, count_or_all, model_name, non_negative_float, non_negative_int, note_missing_folder,
    output_file, output_folder, positive_float, positive_int, share_below_one, token_text_flag,
)
from sinkmech.files import json_text, write_text
from sinkmech.loading.names import DEFAULT_MODEL, MODEL_FORMS

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


@functools.lru_cache(maxsize=None)
def _source(module: str) -> ast.Module:
    """The parsed source of sinkmech module `module` (found under this package's
    folder: `find_spec` would import its parent packages), parsed once per
    process: every parser built reads its defaults from the same few modules,
    and the callers only read the tree."""
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


def load_model_arg(args, spec: str | None = None, *, n_ctx: int = 2048):
    """The model named by --model (or `spec`), in --dtype on --device, with a
    context of `n_ctx` positions (capped at the model's own); said on stderr
    first (the imports before it and a first load's conversion take a while)."""
    print(f"loading {spec or args.model} ...", file=sys.stderr, flush=True)
    from sinkmech.loading import models

    return models.load_model(spec or args.model, device=getattr(args, "device", None),
                             dtype=getattr(args, "dtype", "float32"), n_ctx=n_ctx)


# --attention: how attention is read (sinkmech.measures.fused; its modes are read
# from there without importing it)
ATTENTION_HELP = ("how attention is read: pattern (each layer's T x T pattern in turn), fused (never the pattern: "
                  "the head's output from a fused kernel or query chunks, memory O(T) per head, the same numbers), "
                  "auto (fused from {fused_from} positions on)")


def add_attention(p: argparse.ArgumentParser, needs_pattern: str | None = None) -> None:
    """--attention fused|pattern|auto. A command whose analysis reads the whole
    pattern says why in `needs_pattern`: it keeps the pattern, and `fused` is
    refused before the model loads (`check_attention_arg`)."""
    modes = source_constant("sinkmech.measures.fused", "ATTENTION_MODES")
    fused_from = source_constant("sinkmech.measures.fused", "FUSED_FROM")
    help_ = ATTENTION_HELP.format(fused_from=fused_from)
    if needs_pattern:
        help_ += f"; this command {needs_pattern}, so it keeps the pattern (fused is refused, auto reads it)"
    p.add_argument("--attention", choices=modes, default="pattern" if needs_pattern else "auto", help=help_)
    p.set_defaults(needs_pattern=needs_pattern)


def check_attention_arg(args) -> str:
    """The --attention to run: `fused` refused (a UsageError) where the command
    needs the whole pattern, `auto` read as `pattern` there."""
    needs = getattr(args, "needs_pattern", None)
    if needs and args.attention == "fused":
        raise UsageError(f"--attention fused: {args.command} {needs}, which the fused path never holds: "
                         "run it with --attention pattern (or auto)")
    return "pattern" if needs else args.attention


def check_context(spec: str, n_positions: int) -> None:
    """Refuse `n_positions` (content tokens and <bos>) past the model's trained
    context, where it is known without loading the model (`loading.names.known_context`)."""
    from sinkmech.loading.names import known_context, resolve_source

    limit = known_context(resolve_source(spec))
    if limit is not None and n_positions > limit:
        raise UsageError(f"--max-tokens asks for {n_positions} positions (with <bos>) but {spec} was trained for "
                         f"{limit}: give --max-tokens {limit - 1} or less")


def run_options(args, *, bos_token_id: int | None = None, progress: bool = True, batch_size: int | None = None):
    """How the command's analyses run (`sinkmech.options.RunOptions`): --batch-size
    (or `batch_size`), --device and --dtype where the command has them, progress
    bars (off for a shard's worker), and the `<bos>` id --bos-token resolved to."""
    from sinkmech.options import RunOptions

    return RunOptions(batch_size=batch_size if batch_size is not None else getattr(args, "batch_size", None),
                      progress=progress, device=getattr(args, "device", None), dtype=getattr(args, "dtype", None),
                      bos_token_id=bos_token_id)


def add_intervention_common(p: argparse.ArgumentParser) -> None:
    """The common flags and --n-prompts (patch, ablate, perturb)."""
    add_common(p)
    p.add_argument("--n-prompts", type=positive_int, default=None, help="use only the first N prompts")


def add_bos_token(p: argparse.ArgumentParser) -> None:
    """--bos-token TEXT: the token put first in the "with <bos>" condition."""
    p.add_argument("--bos-token", type=token_text_flag, default=None, metavar="TEXT",
                   help="token prepended in the 'with <bos>' condition instead of the model's <bos> (must be exactly "
                        "one token; e.g. SmolLM2's <bos> <|im_start|> is a chat-turn header, try '<|endoftext|>')")


def bos_token_arg(model, args) -> int | None:
    """--bos-token resolved to a token id once the model is loaded (None: the
    model's own <bos>). The text must tokenize to exactly one token."""
    text = getattr(args, "bos_token", None)
    if text is None:
        return None
    if not text:  # the flag's type refuses it first; a caller building args by hand may not
        raise UsageError("--bos-token is empty")
    if model.tokenizer is None:
        raise UsageError("--bos-token needs a model with a tokenizer")
    ids = model.tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise UsageError(f"--bos-token {text!r} must be exactly one token, it tokenizes to {len(ids)}: {list(ids)}")
    return int(ids[0])


def add_metric(p: argparse.ArgumentParser, *, loss: str) -> None:
    """--metric (kl, logit_diff, loss: what `loss` says) and --answers."""
    p.add_argument("--metric", choices=["kl", "logit_diff", "loss"], default="kl",
                   help=f"kl: mean KL over content positions (default); logit_diff: with --answers; loss: {loss}")
    p.add_argument("--answers", nargs=2, metavar=("CORRECT", "INCORRECT"), default=None, help="tokens (strings) for --metric logit_diff")


def conditions(bos: str) -> list[str]:
    """--bos prepend | none | both -> the conditions to run."""
    from sinkmech.prompts import CONDITIONS

    return list(CONDITIONS) if bos == "both" else [bos]


def prompts_arg(args):
    """--prompts read now (a bad file fails before the slow model load), cut to
    the first --n-prompts when given."""
    n = getattr(args, "n_prompts", None)
    from sinkmech.corpora import load_prompts

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


def check_metric_answers(args) -> None:
    """--metric logit_diff needs --answers, and --answers needs it: the flags alone decide."""
    if args.metric == "logit_diff" and args.answers is None:
        raise UsageError("--metric logit_diff needs --answers CORRECT INCORRECT")
    if args.answers is not None and args.metric != "logit_diff":
        raise UsageError(f"--answers is for --metric logit_diff, not --metric {args.metric}")


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
