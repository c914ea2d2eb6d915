"""The `sinkmech` command: one subcommand per analysis, one module per subcommand.

`build_parser` collects the subcommands; `main` runs one and applies the
error policy of `sinkmech.cli.common`: a usage error (argparse's, a
`UsageError`, a `ValueError` from an analysis, a missing input file) prints
`error: ...` on stderr and exits 2; a runtime error (an output that cannot be
written, any other `OSError`, a `RuntimeError`) prints `error: ...` and exits 1;
Ctrl-C prints one line and exits 130 (outputs written whole-or-nothing are not
left half-written: see `sinkmech.files.staged_dir`). With `--json -` the JSON
is all that reaches stdout.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from sinkmech.cli.ablate import add_ablate_parser
from sinkmech.cli.common import Parser, UsageError, add_model_options, check_attention_arg, json_only_stdout
from sinkmech.cli.compare import add_compare_parser
from sinkmech.cli.fit_sinks import add_fit_sinks_parser
from sinkmech.cli.heads import add_heads_parser
from sinkmech.cli.length import add_length_parser
from sinkmech.cli.massive import add_massive_parser
from sinkmech.cli.merge import add_merge_parser
from sinkmech.cli.patch import add_patch_parser
from sinkmech.cli.perturb import add_perturb_parser
from sinkmech.cli.report import add_report_parser
from sinkmech.cli.shard import check_shard_flags
from sinkmech.cli.sinks import add_sinks_parser
from sinkmech.cli.stream import add_stream_parser
from sinkmech.cli.study import add_study_parser
from sinkmech.cli.train import add_train_parser

USAGE_ERROR, RUNTIME_ERROR, INTERRUPTED = 2, 1, 130

# The parser and every flag check import nothing heavy (see sinkmech.cli.common):
# torch, TransformerLens, transformers and Ray load when a command runs.


def version_line() -> str:
    """What `--version` prints: `sinkmech.loading.backend.version_text()`'s line, from the
    packages' metadata and torch alone (TransformerLens is not imported for it)."""
    import importlib.metadata

    import torch

    from sinkmech.loading.capabilities import CAPABILITIES

    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    return (f"sinkmech {version('sinkmech')} (TransformerLens {version('transformer-lens')}, torch {torch.__version__}, "
            f"backend {CAPABILITIES.backend}, "
            f"device {'cuda' if torch.cuda.is_available() else 'cpu'})")


class VersionAction(argparse.Action):
    """`--version`: the versions line, built only when asked (it imports torch)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="sinkmech", description="Attention-sink instruments (Barbero et al. 2025) for TransformerLens models.",
        formatter_class=argparse.RawDescriptionHelpFormatter,  # --version on one line
        epilog="Outputs (--json, --png, --findings, --out): a folder in the path that does not exist is created "
               "when the output is written,\nsaid on stderr when the flags are read.",
    )
    parser.add_argument("--version", action=VersionAction,
                        help="print sinkmech, TransformerLens, torch, the backend and the device, then exit")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (add_sinks_parser, add_heads_parser, add_patch_parser, add_ablate_parser, add_perturb_parser,
                add_report_parser, add_compare_parser, add_train_parser, add_stream_parser, add_massive_parser,
                add_length_parser, add_merge_parser, add_study_parser, add_fit_sinks_parser):
        add(sub)
    for name, command in sub.choices.items():
        if name not in ("train", "merge", "study"):  # train builds its own model on the CPU; merge loads none;
            # each study has its own (`sinkmech study NAME --device ...`)
            add_model_options(command)
    return parser


def _format_warning(message, category, filename, lineno, line=None) -> str:
    """sinkmech's own warnings as one `warning: ...` line, like the CLI's other
    messages; anyone else's in Python's usual form (file, line, source)."""
    if Path(filename).resolve().is_relative_to(PACKAGE_DIR):
        return f"warning: {message}\n"
    return _python_format_warning(message, category, filename, lineno, line)


PACKAGE_DIR = Path(__file__).resolve().parents[1]
_python_format_warning = warnings.formatwarning


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; returns the exit status (argparse exits 2 itself on an
    unknown flag or a bad choice; a value a flag's type rejects is a `UsageError`:
    one `error:` line, exit 2)."""
    try:
        args = build_parser().parse_args(argv)  # every flag value is checked here, by its type
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return USAGE_ERROR
    previous, warnings.formatwarning = warnings.formatwarning, _format_warning
    try:
        return _run(args)
    finally:
        warnings.formatwarning = previous


def _run(args) -> int:
    try:
        with json_only_stdout(str(getattr(args, "json", None)) == "-"):
            if hasattr(args, "attention"):
                check_attention_arg(args)  # from the flags alone, before torch
            if hasattr(args, "shard"):
                check_shard_flags(args)  # before the prompts are read (which imports torch)
            args.func(args)
    except (UsageError, ValueError, FileNotFoundError, FileExistsError, IsADirectoryError) as e:
        print(f"error: {e}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print("interrupted: nothing was written for the unfinished output", file=sys.stderr)
        return INTERRUPTED
    except (OSError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return RUNTIME_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
