"""Training data for the from-scratch sink experiments (Barbero et al. 2025, Table 2).

Two sources, both as a stream of documents, each document opening with `<bos>`:

- `text`: the documentation that ships with Python (`pydoc_data.topics` and the
  docstrings of the top-level standard-library modules, read with `ast`, never
  imported), byte-level: a token is a UTF-8 byte (ids 0-255). With
  `text_corpus="docs+source"` the standard library's own `.py` sources follow
  (~31 MB on CPython 3.11).
- `bigram_backcopy`: the synthetic "bigram-backcopy" stream of Guo et al. 2024
  ("Active-dormant attention heads"), generated on the fly. Rule, exactly:
  a document is `<bos> x_0 x_1 ... x_{n-1}`; `x_0` is uniform over the
  non-trigger tokens; for t >= 1, if `x_{t-1}` is a trigger token then
  `x_t = x_{t-2}` (the token just before the trigger is copied), otherwise
  `x_t ~ P[x_{t-1}, :]`, a fixed random bigram table. A trigger is therefore
  never the first token and never follows a trigger, so the rule is never
  ambiguous. The copy needs attention (to two tokens back) only after a
  trigger; elsewhere the bigram needs only the current token, so the ideal
  attention head is active on triggers and dormant (on the sink) otherwise.

Special ids sit after the content vocabulary: `<bos>` = n_content,
`pad` = n_content + 1. Training windows are packed from the stream; with
`fixed_bos` a window is `<bos>` followed by `context_length - 1` stream tokens.
"""

from __future__ import annotations

import ast
import sysconfig
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from sinkmech.train.config import TEXT_VOCAB, TextCorpus, TrainConfig

VAL_EVERY = 20  # every 20th text document (by a stable hash) is held out


# --- text ----------------------------------------------------------------------


@lru_cache(maxsize=1)
def python_docs() -> tuple[str, ...]:
    """Documents: every `pydoc_data.topics` entry, then every module, class and
    function docstring (> 40 characters) of the top-level standard library."""
    return tuple(_python_docs_in_order())


def _python_docs_in_order() -> Iterator[str]:
    """`python_docs`, one document at a time: a module is parsed only when
    its documents are reached (a run that keeps the first few hundred KB
    reads the topics alone)."""
    from pydoc_data.topics import topics

    yield from (topics[k] for k in sorted(topics))
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.glob("*.py")):
        yield from _module_docs(path)


@lru_cache(maxsize=None)
def _module_docs(path: Path) -> tuple[str, ...]:
    """The module, class and function docstrings (> 40 characters) of one source
    file, in the order `ast.walk` meets them (parsed once per process); none
    for a file that does not parse."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, OSError):
        return ()
    docs = (ast.get_docstring(node) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)))
    return tuple(doc for doc in docs if doc and len(doc) > 40)


@lru_cache(maxsize=1)
def stdlib_sources() -> tuple[str, ...]:
    """Documents: every `.py` file of the standard library (test suites
    included, site-packages excluded), in path order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.relative_to(root).parts:
            continue
        try:
            docs.append(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    return tuple(docs)


def corpus_documents(corpus: TextCorpus = "docs") -> tuple[str, ...]:
    """The text source's documents: `python_docs()`, plus `stdlib_sources()`
    for "docs+source"."""
    return python_docs() + (stdlib_sources() if corpus == "docs+source" else ())


def _documents_in_order(corpus: TextCorpus) -> Iterator[str]:
    """`corpus_documents(corpus)`, one at a time, each source read only when reached."""
    yield from _python_docs_in_order()
    if corpus == "docs+source":
        yield from stdlib_sources()


def text_streams(
    *, limit_bytes: int | None = None, corpus: TextCorpus = "docs"
) -> tuple[Int[Tensor, " train_tokens"], Int[Tensor, " val_tokens"]]:
    """Byte-level train and validation streams, each document prefixed by `<bos>`.

    Args:
        limit_bytes: keep documents only until this many bytes (for small tests).
        corpus: "docs" or "docs+source" (see `corpus_documents`).

    Returns:
        (train, val) 1-D int64 streams; `<bos>` is id 256.
    """
    parts: dict[str, list[Tensor]] = {"train": [], "val": []}
    bos = torch.tensor([TEXT_VOCAB], dtype=torch.long)
    used = 0
    for doc in _documents_in_order(corpus):  # with a limit, only the documents before it are read
        data = doc.encode("utf-8")
        if not data:
            continue
        if limit_bytes is not None and used + len(data) > limit_bytes:
            break
        used += len(data)
        split = "val" if zlib.crc32(data) % VAL_EVERY == 0 else "train"
        parts[split] += [bos, torch.frombuffer(bytearray(data), dtype=torch.uint8).long()]
    train, val = (torch.cat(parts[k]) if parts[k] else torch.zeros(0, dtype=torch.long) for k in ("train", "val"))
    return train, val


def stream_documents(
    stream: Int[Tensor, " tokens"], *, bos_id: int, min_len: int, n: int
) -> list[list[int]]:
    """The first `n` complete documents of a stream with at least `min_len`
    content tokens, without their `<bos>` (for sink scoring, which puts `<bos>`
    in front itself or not)."""
    starts = (stream == bos_id).nonzero().flatten().tolist()
    docs = [stream[a + 1 : b].tolist() for a, b in zip(starts[:-1], starts[1:])]
    return [d for d in docs if len(d) >= min_len][:n]


# --- bigram-backcopy ----------------------------------------------------------------


@dataclass(frozen=True)
class BigramBackcopy:
    """The generator's fixed parts: bigram table, trigger set, document lengths.

    Content ids are 0..vocab-1; the triggers are ids 0..n_triggers-1; `<bos>`
    is id `vocab`. Document lengths (content tokens) are uniform in
    [doc_min, doc_max].
    """

    table: Float[Tensor, "vocab next_token"]  # rows sum to 1
    n_triggers: int
    doc_min: int
    doc_max: int

    @property
    def vocab(self) -> int:
        return self.table.shape[0]

    @property
    def bos(self) -> int:
        return self.vocab

    @staticmethod
    def make(
        *,
        vocab: int = 64,
        n_triggers: int = 3,
        trigger_prob: float = 0.15,
        concentration: float = 0.2,
        doc_min: int = 16,
        doc_max: int = 512,
        seed: int = 0,
    ) -> "BigramBackcopy":
        """A random bigram table: each row is Dirichlet(concentration) over the
        non-triggers scaled to 1 - trigger_prob, plus trigger_prob spread evenly
        over the triggers (so triggers are common in every context)."""
        if not 0 < n_triggers < vocab - 1:
            raise ValueError(f"need 0 < n_triggers < vocab - 1, got {n_triggers} triggers, vocab {vocab}")
        if not 0.0 < trigger_prob < 1.0:
            raise ValueError(f"trigger_prob must lie in (0, 1), got {trigger_prob}")
        if not 2 <= doc_min <= doc_max:
            raise ValueError(f"need 2 <= doc_min <= doc_max, got {doc_min}, {doc_max}")
        g = torch.Generator().manual_seed(seed)
        gamma = torch._standard_gamma(torch.full((vocab, vocab - n_triggers), concentration), generator=g)
        gamma = gamma + 1e-6  # no transition is impossible
        rows = gamma / gamma.sum(-1, keepdim=True) * (1 - trigger_prob)
        table = torch.cat([torch.full((vocab, n_triggers), trigger_prob / n_triggers), rows], dim=1)
        return BigramBackcopy(table=table, n_triggers=n_triggers, doc_min=doc_min, doc_max=doc_max)


class BigramBackcopyStream:
    """`batch` independent, endless bigram-backcopy streams, extended `n`
    tokens at a time: consecutive calls continue the same documents.

    Every stream starts at a random phase: a partial document of uniform
    length in [0, doc_max] (no `<bos>`; its first token is drawn like a
    document's first token), then whole documents. `doc_len` fixes every
    later document's length (for held-out scoring documents).
    """

    def __init__(self, spec: BigramBackcopy, batch: int, *, seed: int, doc_len: int | None = None):
        self.spec = spec
        self.g = torch.Generator().manual_seed(seed)
        self.batch = batch
        self.doc_len = doc_len
        self.cum = spec.table.cumsum(-1)
        self.cum[:, -1] = 1.0 + 1e-6  # searchsorted never runs off the end
        self.left = torch.randint(0, spec.doc_max + 1, (batch,), generator=self.g)  # content tokens left
        self.prev = torch.full((batch,), -1, dtype=torch.long)  # -1: no content token yet
        self.prev2 = torch.full((batch,), -1, dtype=torch.long)

    def next(self, n: int) -> Int[Tensor, "batch n"]:
        """The next `n` tokens of every stream ([batch, n], int64)."""
        s, B = self.spec, self.batch
        out = torch.empty(B, n, dtype=torch.long)
        u = torch.rand(B, n, 1, generator=self.g)
        first = s.n_triggers + torch.randint(0, s.vocab - s.n_triggers, (B, n), generator=self.g)
        if self.doc_len is None:
            lengths = torch.randint(s.doc_min, s.doc_max + 1, (B, n), generator=self.g)
        else:
            lengths = torch.full((B, n), self.doc_len, dtype=torch.long)
        bos = torch.full((B,), s.bos, dtype=torch.long)
        none = torch.full((B,), -1, dtype=torch.long)
        for t in range(n):
            new_doc = self.left == 0
            sampled = torch.searchsorted(self.cum[self.prev.clamp(min=0)], u[:, t].contiguous()).squeeze(1)
            tok = torch.where(self.prev < 0, first[:, t], sampled)
            tok = torch.where((self.prev >= 0) & (self.prev < s.n_triggers), self.prev2, tok)
            tok = torch.where(new_doc, bos, tok)
            out[:, t] = tok
            # Advance the state: a <bos> opens a fresh document.
            self.left = torch.where(new_doc, lengths[:, t], self.left - 1)
            self.prev2 = torch.where(new_doc, none, self.prev)
            self.prev = torch.where(new_doc, none, tok)
        return out


def backcopy_documents(spec: BigramBackcopy, n: int, length: int, *, seed: int) -> list[list[int]]:
    """`n` fresh documents of exactly `length` content tokens, without `<bos>`."""
    stream = BigramBackcopyStream(spec, n, seed=seed, doc_len=length)
    stream.left.zero_()  # start at a document boundary
    return stream.next(length + 1)[:, 1:].tolist()


# --- packing -------------------------------------------------------------------------


def sample_windows(
    stream: Int[Tensor, " tokens"], *, batch: int, length: int, generator: torch.Generator
) -> Int[Tensor, "batch length"]:
    """`batch` windows of `length` consecutive stream tokens at uniform offsets."""
    if length >= len(stream):
        raise ValueError(
            f"a window of {length} tokens does not fit a stream of {len(stream)} tokens: "
            "lower the context length or use a larger corpus"
        )
    starts = torch.randint(0, len(stream) - length + 1, (batch,), generator=generator)
    return stream[starts[:, None] + torch.arange(length)]


def make_inputs(
    chunk: Int[Tensor, "batch n"], *, fixed_bos: bool, bos_id: int
) -> tuple[Int[Tensor, "batch pos"], Int[Tensor, "batch pos"]]:
    """Inputs and next-token targets from `context_length + 1` (no fixed bos) or
    `context_length` (fixed bos) stream tokens per row."""
    if fixed_bos:
        bos = torch.full((chunk.shape[0], 1), bos_id, dtype=chunk.dtype)
        return torch.cat([bos, chunk[:, :-1]], dim=1), chunk
    return chunk[:, :-1], chunk[:, 1:]


def document_ids(tokens: Int[Tensor, "batch pos"], *, bos_id: int) -> Int[Tensor, "batch pos"]:
    """Index of the document each position belongs to: a `<bos>` opens a new one.
    Tokens before the first `<bos>` of a window are the tail of document 0."""
    return torch.cumsum((tokens == bos_id).long(), dim=1)


def same_document(
    tokens: Int[Tensor, "batch pos"], *, bos_id: int, fixed_bos: bool
) -> Bool[Tensor, "batch query_pos key_pos"]:
    """True where query and key lie in the same document. With `fixed_bos` the
    `<bos>` at position 0 belongs to no document and every query may see it."""
    doc = document_ids(tokens[:, 1:] if fixed_bos else tokens, bos_id=bos_id)
    if fixed_bos:
        doc = torch.cat([torch.zeros_like(doc[:, :1]), doc], dim=1)  # doc 0 now includes key 0
    allowed = doc[:, :, None] == doc[:, None, :]
    if fixed_bos:
        allowed[:, :, 0] = True
    return allowed


def post_trigger(
    inputs: Int[Tensor, "batch pos"], targets: Int[Tensor, "batch pos"], *, n_triggers: int, bos_id: int
) -> Bool[Tensor, "batch pos"]:
    """Bigram-backcopy positions whose target is a copy: the input token is a
    trigger (ids 0..n_triggers-1) and the target is not a `<bos>` (a document
    may end right after a trigger). Only these positions need attention."""
    return (inputs < n_triggers) & (targets != bos_id)


# --- a run's data ----------------------------------------------------------------------


def sink_tokens(cfg: TrainConfig) -> int:
    """Content tokens per sink-scoring prompt: `cfg.score_tokens` if set (the
    context-length experiment scores every model on the shortest context's
    count), else the paper's 64, or fewer if the context (which must also hold
    `<bos>`) is shorter."""
    if cfg.score_tokens is not None:
        return cfg.score_tokens
    return min(64, cfg.context_length - 1)


class TrainData:
    """A run's data under `cfg`: training batches (`batch()`), fixed validation
    windows (`val_chunks`, content tokens [val_windows, context_length]) and
    held-out documents for sink scoring (`prompts`, `sink_tokens(cfg)` content
    tokens each, without `<bos>`; where `score_tokens` scores a model on
    fewer tokens than its context holds, `own_prompts` hold context_length - 1
    content tokens each, so the model is also scored at its own training
    length; else None)."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.bos_id = cfg.bos_id
        self.g = torch.Generator().manual_seed(cfg.seed)
        need = cfg.context_length + 1
        sink_len = sink_tokens(cfg)
        self.val_chunks: Int[Tensor, "val_windows context_length"]
        self.prompts: list[list[int]]
        if cfg.data == "text":
            self.train_stream, val = text_streams(limit_bytes=cfg.text_limit_bytes, corpus=cfg.text_corpus)
            for name, s in (("training", self.train_stream), ("validation", val)):
                if len(s) <= need:
                    raise ValueError(
                        f"context_length {cfg.context_length} needs more than {need} tokens, but the "
                        f"{name} split of the text corpus has {len(s)}: lower the context length "
                        "or raise text_limit_bytes"
                    )
            self.bb = None
            val_g = torch.Generator().manual_seed(10_000 + cfg.seed)
            self.val_chunks = sample_windows(val, batch=cfg.val_windows, length=cfg.context_length, generator=val_g)
            self.prompts = stream_documents(val, bos_id=self.bos_id, min_len=sink_len, n=cfg.eval_prompts)
        else:
            self.bb = BigramBackcopy.make(
                vocab=cfg.bb_vocab, n_triggers=cfg.bb_triggers, trigger_prob=cfg.bb_trigger_prob,
                doc_min=cfg.bb_doc_min, doc_max=cfg.bb_doc_max, seed=cfg.seed,
            )
            self.stream = BigramBackcopyStream(self.bb, cfg.batch_size, seed=cfg.seed + 1)
            self.val_chunks = BigramBackcopyStream(self.bb, cfg.val_windows, seed=cfg.seed + 2).next(cfg.context_length)
            self.prompts = backcopy_documents(self.bb, cfg.eval_prompts, sink_len, seed=cfg.seed + 3)
        if not self.prompts:
            raise ValueError(f"no held-out document has {sink_len} tokens to score sinks on")
        own = cfg.context_length - 1
        self.own_prompts: list[list[int]] | None = None
        if cfg.score_tokens is not None and own > sink_len:
            self.own_prompts = (backcopy_documents(self.bb, cfg.eval_prompts, own, seed=cfg.seed + 3) if self.bb is not None
                                else stream_documents(val, bos_id=self.bos_id, min_len=own, n=cfg.eval_prompts) or None)

    def batch(self) -> tuple[Int[Tensor, "batch pos"], Int[Tensor, "batch pos"]]:
        """One training batch (inputs, targets) under the config's `fixed_bos`."""
        cfg = self.cfg
        n = cfg.context_length + (0 if cfg.fixed_bos else 1)
        if self.bb is None:
            chunk = sample_windows(self.train_stream, batch=cfg.batch_size, length=n, generator=self.g)
        else:
            chunk = self.stream.next(n)
        return make_inputs(chunk, fixed_bos=cfg.fixed_bos, bos_id=self.bos_id)
