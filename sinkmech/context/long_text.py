"""Long natural text, offline: documents concatenated by topic from what every
installation holds, for measures at thousands of tokens (the paper's length
claims; StreamingLLM's long streams).

Three topics, each a list of documents in a fixed order, identical documents
kept once: the Python documentation's topics (`pydoc_data.topics`, one
document per topic), the license texts of the installed packages (the
`LICENSE`, `COPYING` and `NOTICE` files in site-packages' `.dist-info`
folders), and the standard library's top-level `.py` files. A long prompt is
consecutive documents of one topic joined until it is long enough; no two
prompts share a document, so prompts are independent units for intervals.
Each prompt records its topic and the documents it holds (`LongText.sources`):
the license topic depends on the packages installed, and the record says
which files a run read.
"""

from __future__ import annotations

import hashlib
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

TOPICS = ("python-docs", "licenses", "python-source")
CHARS_PER_TOKEN = 6  # text asked for per content token: more than English or code takes with a BPE tokenizer
LICENSE_NAMES = ("LICENSE", "LICENCE", "COPYING", "NOTICE")


@dataclass(frozen=True)
class Document:
    """One document: where it came from, and its text."""

    source: str  # "pydoc_data.topics:assert", "site-packages/numpy-2.4.6.dist-info/LICENSE.txt", "stdlib/abc.py"
    text: str


@dataclass(frozen=True)
class LongText:
    """One long prompt: consecutive documents of one topic."""

    text: str
    topic: str
    sources: tuple[str, ...]

    def to_dict(self) -> dict:
        return {"topic": self.topic, "sources": list(self.sources), "chars": len(self.text)}


def documents(topic: str) -> list[Document]:
    """The documents of `topic` (one of TOPICS) in their fixed order, each text once."""
    if topic not in TOPICS:
        raise ValueError(f"topic must be one of {', '.join(TOPICS)}, got {topic!r}")
    found = {"python-docs": _python_docs, "licenses": _licenses, "python-source": _python_source}[topic]()
    seen: set[str] = set()
    out = []
    for doc in found:
        key = hashlib.sha256(" ".join(doc.text.split()).encode()).hexdigest()
        if doc.text.strip() and key not in seen:
            seen.add(key)
            out.append(doc)
    return out


def _python_docs() -> Iterator[Document]:
    from pydoc_data.topics import topics

    for name in sorted(topics):
        yield Document(f"pydoc_data.topics:{name}", topics[name])


def _licenses() -> Iterator[Document]:
    site = Path(sysconfig.get_paths()["purelib"])
    files = sorted(p for p in site.glob("*.dist-info/**/*")
                   if p.is_file() and p.name.upper().startswith(LICENSE_NAMES))
    for p in files:
        yield Document(f"site-packages/{p.relative_to(site).as_posix()}", p.read_text(encoding="utf-8",
                                                                                      errors="replace"))


def _python_source() -> Iterator[Document]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for p in sorted(stdlib.glob("*.py")):
        yield Document(f"stdlib/{p.name}", p.read_text(encoding="utf-8", errors="replace"))


def long_texts(n_prompts: int, min_chars: int, topics: Sequence[str] = TOPICS) -> list[LongText]:
    """`n_prompts` texts of at least `min_chars` characters, taken from the
    topics in turn (prompt i from topics[i % len(topics)]), each the next
    documents of its topic joined by blank lines until it is long enough.

    A ValueError when a topic runs out of documents."""
    if isinstance(n_prompts, bool) or not isinstance(n_prompts, int) or n_prompts < 1:
        raise ValueError(f"n_prompts must be a positive integer, got {n_prompts!r}")
    if not topics:
        raise ValueError("give at least one topic")
    pools = {t: iter(documents(t)) for t in dict.fromkeys(topics)}
    out = []
    for i in range(n_prompts):
        topic = topics[i % len(topics)]
        parts: list[Document] = []
        while sum(len(d.text) + 2 for d in parts) < min_chars:
            doc = next(pools[topic], None)
            if doc is None:
                raise ValueError(f"the {topic} topic has too few documents for {n_prompts} prompts of "
                                 f"{min_chars} characters (prompt {i + 1} could not be filled)")
            parts.append(doc)
        out.append(LongText("\n\n".join(d.text for d in parts), topic, tuple(d.source for d in parts)))
    return out


def long_prompts_for(n_prompts: int, n_tokens: int, topics: Sequence[str] = TOPICS) -> list[LongText]:
    """Long texts with room for `n_tokens` content tokens each (CHARS_PER_TOKEN characters a token)."""
    return long_texts(n_prompts, CHARS_PER_TOKEN * n_tokens, topics)
