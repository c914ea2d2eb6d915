"""The `sinkmech` command line: one module per subcommand."""

from sinkmech.cli.main import build_parser, main

__all__ = ["main", "build_parser"]
