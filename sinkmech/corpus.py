"""Prompts before they are tokens: the default corpora (windows of Python's own
docs, and of its standard library's source) and prompt files (text, JSONL,
JSON), read and checked; the held-out rule's split of a corpus into the prompts
a scan sees and those that check it. Imports nothing heavy, so the command line
refuses a bad prompt file before torch loads; tokenizing is `sinkmech.prompts`.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

DEFAULT_N_PROMPTS = 170
DEFAULT_WORDS_PER_PROMPT = 72  # always >= 64 SmolLM2 tokens (checked in the tests)


def default_corpus(
    n_prompts: int = DEFAULT_N_PROMPTS, words: int = DEFAULT_WORDS_PER_PROMPT
) -> list[str]:
    """`n_prompts` windows of `words` words cut at evenly spaced offsets from
    the Python documentation in `pydoc_data.topics` (ships with every Python:
    no download). Deterministic for a given Python version."""
    from pydoc_data.topics import topics

    text = " ".join(topics[k] for k in sorted(topics))
    all_words = re.sub(r"\s+", " ", text).split(" ")
    span = len(all_words) - words
    if n_prompts < 1 or span < n_prompts:
        raise ValueError(f"cannot cut {n_prompts} prompts of {words} words from the corpus")
    starts = [i * span // n_prompts for i in range(n_prompts)]
    return [" ".join(all_words[s : s + words]) for s in starts]


def python_source_corpus(n_prompts: int = DEFAULT_N_PROMPTS, chars: int = 400) -> list[str]:
    """`n_prompts` windows of Python source, each the consecutive non-blank
    lines from an evenly spaced start until `chars` characters are reached,
    cut from the standard library's own top-level `.py` files in name order
    (no download; the code counterpart of `default_corpus`, for contrasts of
    prose and code as in Guo et al. 2024). Deterministic for a given Python
    version."""
    import sysconfig

    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    lines = [ln.rstrip() for f in files for ln in f.read_text(encoding="utf-8", errors="replace").splitlines()
             if ln.strip()]
    span = len(lines) - 200
    if n_prompts < 1 or span < n_prompts:
        raise ValueError(f"cannot cut {n_prompts} prompts from the standard library's sources")
    out = []
    for i in range(n_prompts):
        start, text = i * span // n_prompts, []
        while sum(len(t) + 1 for t in text) < chars:
            text.append(lines[start + len(text)])
        out.append("\n".join(text))
    return out


def load_prompts(source=None) -> list[str] | list[list[int]]:
    """Prompts from a list of strings, a text file (one prompt per line), a
    JSONL file with a `text` field, or None for the default corpus. Lists of
    token ids and token tensors pass through (as lists of id lists); see
    `sinkmech.prompts.PromptSource`."""
    if source is None:
        return default_corpus()
    torch = sys.modules.get("torch")  # a tensor exists only once torch is imported: this module never imports it
    if torch is not None and isinstance(source, torch.Tensor):
        if source.ndim != 2 or source.dtype.is_floating_point:
            raise ValueError(f"a token tensor must be integer [batch, pos], got {tuple(source.shape)} {source.dtype}")
        return [row.tolist() for row in source]
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if isinstance(source, os.PathLike) or path.exists() or path.suffix.lower() in PROMPT_SUFFIXES:
            return _read_prompt_file(path)
        if "\n" not in source and len(source) < 256 and ("/" in source or "." in source or " " not in source):
            raise FileNotFoundError(f"prompt file not found: {source}")
        raise ValueError(
            "a single string is ambiguous: pass a list of prompts, or the path of a prompt file "
            f"({', '.join(PROMPT_SUFFIXES)})"
        )
    prompts = list(source)
    if not prompts:
        raise ValueError("no prompts given: the prompt list is empty")
    if all(isinstance(p, str) for p in prompts):
        return prompts
    if all(isinstance(p, (list, tuple)) for p in prompts):
        return [list(map(int, p)) for p in prompts]
    raise ValueError("prompts must all be strings or all be lists of token ids")


JSONL_SUFFIXES = (".jsonl", ".ndjson")
PROMPT_SUFFIXES = (".txt", ".json", *JSONL_SUFFIXES)


def _read_prompt_file(path: Path) -> list[str]:
    """One prompt per line (.txt and any other suffix), one JSON object with a
    `text` field per line (.jsonl / .ndjson, any case), or a JSON list of
    strings or of such objects (.json)."""
    if path.is_dir():
        raise IsADirectoryError(f"prompt file {path} is a directory; give a file")
    if not path.exists():
        raise FileNotFoundError(f"prompt file not found: {path}")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"prompt file {path} is not UTF-8 text (byte {e.start}: {raw[e.start:e.start + 1]!r})") from None
    if "\x00" in text:
        raise ValueError(f"prompt file {path} is binary (NUL byte at offset {text.index(chr(0))}), not text")
    suffix = path.suffix.lower()
    if suffix == ".json":
        prompts = _json_prompts(path, text)
    elif suffix in JSONL_SUFFIXES:
        prompts = [_text_field(path, i, line) for i, line in enumerate(text.splitlines(), 1) if line.strip()]
    else:
        prompts = [line for line in text.splitlines() if line.strip()]
        if prompts and all(_looks_like_json_object(p) for p in prompts):
            raise ValueError(
                f"{path} looks like JSON lines but is read as plain text (one prompt per line, braces included); "
                "name it .jsonl to read its 'text' fields"
            )
    if not prompts:
        raise ValueError(f"prompt file {path} holds no prompts")
    return prompts


def _looks_like_json_object(line: str) -> bool:
    line = line.strip()
    if not (line.startswith("{") and line.endswith("}")):
        return False
    try:
        return isinstance(json.loads(line), dict)
    except json.JSONDecodeError:
        return False


def _text_field(path: Path, where, row) -> str:
    if isinstance(row, str) and where is not None and not isinstance(where, str):
        try:
            row = json.loads(row)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{where}: not valid JSON ({e.msg})") from e
    if not isinstance(row, dict) or not isinstance(row.get("text"), str):
        raise ValueError(f"{path}:{where}: each JSONL line needs a string field 'text'")
    return row["text"]


def _json_prompts(path: Path, text: str) -> list[str]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        lines = [l for l in text.splitlines() if l.strip()]
        if len(lines) > 1 and all(_looks_like_json_object(l) for l in lines):
            return [_text_field(path, i, l) for i, l in enumerate(text.splitlines(), 1) if l.strip()]
        raise ValueError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from e
    if not isinstance(data, list):
        raise ValueError(f"{path}: a .json prompt file holds a list of strings or of objects with 'text'")
    return [p if isinstance(p, str) else _text_field(path, f"item {i}", p) for i, p in enumerate(data)]


def split_corpus(n_items: int, scan_prompts: int | None, noop_prompts: int) -> tuple[range, range]:
    """(scan, no-op) index ranges: the scan takes the first `scan_prompts`
    (default: all that the no-op check leaves), the no-op check the next
    `noop_prompts`. ValueError when they do not fit."""
    if noop_prompts < 0 or (scan_prompts is not None and scan_prompts < 1):
        raise ValueError(f"need scan_prompts >= 1 and noop_prompts >= 0, got {scan_prompts}, {noop_prompts}")
    n_scan = n_items - noop_prompts if scan_prompts is None else scan_prompts
    if n_scan < 1 or n_scan + noop_prompts > n_items:
        raise ValueError(f"the corpus has {n_items} prompts: too few for a scan on {scan_prompts or 'the rest'} and a "
                         f"no-op check on {noop_prompts} others (the no-op check runs on prompts the scan did not see)")
    return range(n_scan), range(n_scan, n_scan + noop_prompts)
