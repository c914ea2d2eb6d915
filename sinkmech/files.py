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


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary file beside `path` for the block to write; when the block
    succeeds it is renamed over `path` (readers see the old file or the whole
    new one, never a half-written one), when it fails it is deleted.
    The one temp-file-and-rename of the package (text, bytes, a part, a model)."""
    import tempfile

    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def write_bytes(path: str | os.PathLike, data: bytes, *, action: str = "write") -> Path:
    """Write `data` atomically (`atomic_path`), creating the parent folders; an
    `OSError` reads "cannot {action} PATH: reason"."""
    path = Path(path)
    with cannot(action, path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tmp.write_bytes(data)
    return path


def write_text(path: str | os.PathLike, text: str, *, action: str = "write") -> Path:
    """Write `text` as UTF-8, atomically (`atomic_path`), creating the parent folders."""
    return write_bytes(path, text.encode("utf-8"), action=action)


# Whole-or-nothing output folders: a report (or comparison) is written into a
# temporary folder beside its destination and moved into place at the end, so
# an interrupted run never leaves a page that mixes two runs.

OUTPUT_MARK = ".sinkmech-output"  # marks a folder sinkmech wrote as a whole


def check_output_dir(out: str | os.PathLike, *, overwrite: bool, what: str = "output folder") -> Path:
    """Fail early (before any model is loaded) when `out` cannot take a new output:
    it holds an earlier sinkmech output and `overwrite` is False, or it holds
    files sinkmech did not write (never replaced). Creates the parent folder."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"the {what} {out} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not (out / OUTPUT_MARK).exists():
            raise FileExistsError(
                f"the {what} {out} already holds files sinkmech did not write; choose an empty or new folder"
            )
        if not overwrite:
            raise FileExistsError(
                f"the {what} {out} already holds an earlier output; it is kept as it is. "
                "Pass --overwrite (overwrite=True) to replace it as a whole"
            )
    make_dir(out.parent, what)
    with cannot(f"write into the {what}", out.parent):
        if not os.access(out.parent, os.W_OK):
            raise PermissionError(13, "Permission denied")
    return out


@contextmanager
def staged_dir(out: str | os.PathLike, *, overwrite: bool, what: str = "output folder") -> Iterator[Path]:
    """Yield a temporary folder beside `out`; when the block succeeds it replaces
    `out` as a whole, when it fails (or is interrupted) it is deleted and `out`
    is left as it was."""
    import shutil
    import tempfile

    out = check_output_dir(out, overwrite=overwrite, what=what)
    with cannot(f"create a temporary folder beside the {what}", out.parent):
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        yield tmp
        (tmp / OUTPUT_MARK).write_text("written whole by sinkmech; replaced only as a whole\n", encoding="utf-8")
        with cannot("move the new output into", out):
            if out.exists():
                old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
                os.rename(out, old / "previous")
                os.rename(tmp, out)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def finite_or_none(value):
    """`value` with every NaN / infinite float replaced by None (JSON null), at any
    depth (dicts stay dicts, lists and tuples become lists). One loop over an
    explicit stack, with no call per value: a result holds ~10^5 numbers."""
    import math

    box: list = [value]  # the root as an item: written over in place by its cleaned copy
    stack: list = [(box, box)]
    while stack:
        source, target = stack.pop()
        for k, v in (source.items() if isinstance(source, dict) else enumerate(source)):
            if isinstance(v, float):
                out = v if math.isfinite(v) else None
            elif isinstance(v, dict):
                out = {}
                stack.append((v, out))
            elif isinstance(v, (list, tuple)):
                out = [None] * len(v)
                stack.append((v, out))
            else:
                out = v
            target[k] = out  # a dict's key, or an index of a list made to size
    return box[0]


def json_text(
    payload, indent: int | None = 1, *, sort_keys: bool = False, compact: bool = False, ensure_ascii: bool = True
) -> str:
    """Strict JSON: NaN and infinities become null (a strict parser rejects bare NaN).

    The one place sinkmech turns Python into JSON text: results (`sinkmech.results`),
    CLI output, the report, the findings, partial results and their checksums,
    training logs and the model cache all write through it.

    Args:
        indent: spaces per level (None: one line).
        sort_keys: keys in sorted order (canonical text, e.g. for a checksum).
        compact: no spaces after separators (and one line).
        ensure_ascii: escape non-ASCII characters (json's default).
    """
    import json

    return json.dumps(finite_or_none(payload), indent=None if compact else indent, allow_nan=False,
                      sort_keys=sort_keys, separators=(",", ":") if compact else None, ensure_ascii=ensure_ascii)
