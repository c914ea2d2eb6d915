"""The named corpora the analyses read by default: prose windows cut from text
that ships with Python or with the installed packages (no download), each
window with the document it came from. Imports nothing heavy (the command line
and study configs check a corpus name before torch loads).
"""

from __future__ import annotations

import bisect
import re
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
