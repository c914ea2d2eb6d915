"""Writing output files: the one place an `OSError` becomes "cannot write PATH: reason".

Figures, circuitsvis pages, the report and the CLI all write files; they share
this wrapper so a blocked or read-only path reads the same everywhere. It
imports nothing from sinkmech, so every layer (showing, report, cli) can use it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def cannot(action: str, path: str | os.PathLike) -> Iterator[None]:
    """Re-raise any `OSError` in the block as `OSError("cannot {action} {path}: reason")`.

    Args:
        action: what was being done, e.g. "write", "write figure to",
            "create the report folder".
        path: the path the message names.
    """
    try:
        yield
    except OSError as e:
        raise OSError(f"cannot {action} {path}: {e.strerror or e}") from e


def make_dir(path: str | os.PathLike, what: str = "folder") -> Path:
    """Create `path` and its parents; an `OSError` says which `what` could not be created."""
    path = Path(path)
    with cannot(f"create the {what}", path):
        path.mkdir(parents=True, exist_ok=True)
    return path


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` as UTF-8, creating the parent folders."""
    path = Path(path)
    with cannot("write", path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return path
