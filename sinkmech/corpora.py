"""Prompts before they are tokens: the named corpora the analyses read by
default (prose windows cut from text that ships with Python or with the
installed packages, no download, each window with the document it came from;
windows of Python source), prompt files (text, JSONL, JSON) read and checked,
and the held-out rule's split of a corpus into the prompts a scan sees and
those that check it. Imports nothing heavy, so the command line and study
configs refuse a bad corpus name or prompt file before torch loads; tokenizing
is `sinkmech.prompts`.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

DEFAULT_N_PROMPTS = 170
DEFAULT_WORDS_PER_PROMPT = 72  # always >= 64 SmolLM2 tokens (checked in the tests)

Domain = Literal["pydoc", "licenses"]
# The named corpora: prose of two kinds, each cut into windows that record their source document.
DOMAINS: tuple[Domain, ...] = ("pydoc", "licenses")
DEFAULT_DOMAIN: Domain = "pydoc"
DOMAIN_TEXT = {
    "pydoc": "the Python documentation's topics (pydoc_data.topics; one document per topic)",
    "licenses": "the license texts installed with this environment's packages (LICENSE, COPYING and NOTICE files of "
                "every *.dist-info in site-packages; one document per distinct text)",
}


@dataclass(frozen=True)
class Corpus:
    """Windows of one named corpus, each with the document it was cut from
    (where its first word lies): windows of one document are not independent,
    so an interval over them resamples documents (`sinkmech.stats`, `groups`)."""

    domain: str
    prompts: tuple[str, ...]
    documents: tuple[str, ...]  # per prompt: its source document's name
    sha256: str  # of the whole text the windows were cut from (a reader's check that it is the same corpus)

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def n_documents(self) -> int:
        return len(set(self.documents))

    def part(self, start: int, stop: int) -> Corpus:
        """Windows start:stop, with their documents."""
        return Corpus(self.domain, self.prompts[start:stop], self.documents[start:stop], self.sha256)

    def to_dict(self) -> dict:
        """What a result records of its corpus: domain, sizes, each prompt's document."""
        return {"domain": self.domain, "n_prompts": len(self), "n_documents": self.n_documents,
                "documents": list(self.documents), "sha256": self.sha256, "source": DOMAIN_TEXT.get(self.domain)}


def check_domain(domain: str) -> Domain:
    if domain not in DOMAINS:
        raise ValueError(f"domain must be one of {', '.join(DOMAINS)}, got {domain!r}")
    return domain  # type: ignore[return-value]


def _pydoc_documents() -> list[tuple[str, str]]:
    from pydoc_data.topics import topics

    return [(k, topics[k]) for k in sorted(topics)]


def _license_documents() -> list[tuple[str, str]]:
    """Every LICENSE / COPYING / NOTICE file of the environment's installed
    distributions (site-packages' *.dist-info folders, in path order), one
    document per distinct text: copies that differ only in their copyright
    lines (the same MIT or Apache text) are kept once, and texts under 50
    words (pointers to another file) are left out."""
    import hashlib
    import sysconfig

    roots = sorted({Path(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")})
    seen, out = set(), []
    for root in roots:
        for dist in sorted(root.glob("*.dist-info")):
            for f in sorted(dist.rglob("*")):
                if not (f.is_file() and re.match(r"(licen[cs]e|copying|notice)", f.name, re.I)):
                    continue
                text = f.read_text(encoding="utf-8", errors="replace")
                body = " ".join(line for line in text.splitlines() if "copyright" not in line.lower())
                key = hashlib.sha256(re.sub(r"\s+", " ", body).strip().lower().encode()).hexdigest()
                if len(body.split()) < 50 or key in seen:
                    continue
                seen.add(key)
                out.append((str(f.relative_to(root)), text))
    if not out:
        raise ValueError("no license texts found in this environment's site-packages")
    return out


def corpus(domain: str = DEFAULT_DOMAIN, n_prompts: int = DEFAULT_N_PROMPTS,
           words: int = DEFAULT_WORDS_PER_PROMPT) -> Corpus:
    """`n_prompts` windows of `words` words cut at evenly spaced offsets from
    the documents of `domain` (`DOMAINS`, `DOMAIN_TEXT`) laid end to end,
    each with the document its first word comes from. Offline (the Python
    documentation ships with every Python; the license texts with every
    installed package); deterministic for a given Python version and
    environment (`Corpus.sha256`)."""
    import hashlib

    docs = {"pydoc": _pydoc_documents, "licenses": _license_documents}[check_domain(domain)]()
    text = " ".join(t for _, t in docs)
    all_words = re.sub(r"\s+", " ", text).split(" ")
    if all_words[0] == "":  # text that opens with whitespace splits off one empty word
        all_words = all_words[1:]
    # each document's words, in order: a word index -> its document
    ends, n = [], 0
    for _, t in docs:
        n += len([w for w in re.sub(r"\s+", " ", t).split(" ") if w])
        ends.append(n)
    span = len(all_words) - words
    if n_prompts < 1 or span < n_prompts:
        raise ValueError(f"cannot cut {n_prompts} prompts of {words} words from the {domain} corpus")
    starts = [i * span // n_prompts for i in range(n_prompts)]
    prompts = tuple(" ".join(all_words[s : s + words]) for s in starts)
    documents = tuple(docs[min(bisect.bisect_right(ends, s), len(docs) - 1)][0] for s in starts)
    return Corpus(domain, prompts, documents, hashlib.sha256(text.encode()).hexdigest())


def default_corpus(
    n_prompts: int = DEFAULT_N_PROMPTS, words: int = DEFAULT_WORDS_PER_PROMPT, domain: str = DEFAULT_DOMAIN
) -> list[str]:
    """`n_prompts` windows of `words` words cut at evenly spaced offsets from
    the Python documentation in `pydoc_data.topics` (ships with every Python:
    no download), or from another named corpus (`domain`, see `corpus`,
    which also gives each window's document). Deterministic for a given
    Python version."""
    return list(corpus(domain, n_prompts, words).prompts)


def corpus_windows(source=None) -> Corpus | None:
    """The named corpus `source` stands for, with each window's document (None:
    the default corpus; a name of `DOMAINS` where no file of that name exists),
    or None where `source` is anything else (a prompt file or list, read by
    `load_prompts`, whose prompts have no documents)."""
    if source is None:
        return corpus()
    if isinstance(source, str) and source in DOMAINS and not Path(source).exists():
        return corpus(source)
    return None


def prompt_documents(source=None, n_prompts: int | None = None) -> tuple[str, ...] | None:
    """Each prompt's source document where `source` names a corpus (see
    `corpus_windows`), for the first `n_prompts` (all without it); None for a
    prompt file or list, whose prompts are each their own unit."""
    windows = corpus_windows(source)
    if windows is None:
        return None
    return windows.documents if n_prompts is None else windows.documents[:n_prompts]


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
    JSONL file with a `text` field, None for the default corpus, or the name
    of a corpus (`DOMAINS`, e.g. "licenses": its default windows) where no
    file of that name exists. Lists of token ids and token tensors pass
    through (as lists of id lists); see `sinkmech.prompts.PromptSource`."""
    windows = corpus_windows(source)
    if windows is not None:
        return list(windows.prompts)
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
