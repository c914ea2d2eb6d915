"""What every `sinkmech` command shares: the common flags, the `<bos>`
conditions, JSON output, and the one error a command raises for a bad flag.

Error policy (applied by `sinkmech.cli.main.main`):

- exit 2, usage error: argparse's own errors (it exits itself), a `UsageError`
  a command raises for a flag value it rejects, a `ValueError` an analysis
  raises for an option or input it rejects, and a `FileNotFoundError` for an
  input file that does not exist;
- exit 1, runtime error: any other `OSError` (an output that cannot be written,
  a folder that cannot be created: see `sinkmech.files`) or `RuntimeError`.

Either way one line `error: ...` goes to stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sinkmech.files import write_text
from sinkmech.models import DEFAULT_MODEL
from sinkmech.prompts import CONDITIONS, load_prompts

MODEL_HELP = "'smollm2' (offline default), a .gguf path, or a TransformerLens model name"


class UsageError(Exception):
    """A flag value the command rejects: `main` prints `error: ...` and exits 2."""


def add_common(p: argparse.ArgumentParser) -> None:
    """--model, --prompts, --max-tokens, --batch-size, --json, --png."""
    p.add_argument("--model", default=DEFAULT_MODEL, help=MODEL_HELP)
    p.add_argument("--prompts", default=None, help="text file (one prompt per line) or JSONL with a 'text' field; default: 170 windows of the Python docs")
    p.add_argument("--max-tokens", type=int, default=64, help="content tokens per prompt (default 64)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--json", type=Path, default=None, help="write results as JSON here")
    p.add_argument("--png", type=Path, default=None, help="write a figure here (.png or .svg)")


def add_intervention_common(p: argparse.ArgumentParser) -> None:
    """The common flags and --n-prompts (patch, ablate, perturb)."""
    add_common(p)
    p.add_argument("--n-prompts", type=int, default=None, help="use only the first N prompts")


def add_metric(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metric", choices=["kl", "logit_diff"], default="kl", help="kl: mean KL over content positions (default)")
    p.add_argument("--answers", nargs=2, metavar=("CORRECT", "INCORRECT"), default=None, help="tokens (strings) for --metric logit_diff")


def conditions(bos: str) -> list[str]:
    """--bos prepend | none | both -> the conditions to run."""
    return list(CONDITIONS) if bos == "both" else [bos]


def prompts_arg(args):
    """--prompts, cut to the first --n-prompts when given."""
    if args.n_prompts is None:
        return args.prompts
    if args.n_prompts < 1:
        raise UsageError(f"--n-prompts must be >= 1, got {args.n_prompts}")
    return load_prompts(args.prompts)[: args.n_prompts]


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


def write_json(path: Path, payload: dict) -> None:
    """Write `payload` as JSON and say so (an OSError says which path failed)."""
    write_text(path, json.dumps(payload, indent=1))
    print(f"wrote {path}")
