"""The `sinkmech` command line: common flags and errors in `common`, one module
per subcommand, `main` to parse and run (exit 0; 2 on a usage error, 1 on a
runtime error; see `sinkmech.cli.main`)."""

from sinkmech.cli.main import build_parser, main

__all__ = ["main", "build_parser"]
