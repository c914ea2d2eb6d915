"""Partial results: one analysis on one shard of the prompts, mergeable exactly.

Every corpus-level quantity sinkmech computes is a sum or a per-prompt list, so
it can be computed on shards of the prompts and merged. A `Partial` holds
- `rows`: per-prompt arrays (first axis: prompt), kept with each prompt's
  global index in the corpus (`prompt_index`);
- `sums`: additive float64 statistics (sums, counts, fixed-bin histograms);
- `labels`: a union-merged {key: text} map (e.g. token id -> token text);
- `settings`: what must be equal for two parts to merge (model and its file
  hash, backend, dtype, `<bos>` condition, max tokens, eps, thresholds, ...).

`merge(parts)` concatenates rows in global prompt order and adds sums in a
fixed order (by first prompt index), so it is order-free (bitwise) and
associative (to float64 rounding); the one-pass result is the merge of one
shard. Each analysis says, next to its result, how that result becomes a part
and how a merged part becomes the result again (its package's `parts` module:
`sinkmech.sharding.measures`, `sinkmech.sharding.dormant`, `sinkmech.sharding.interventions`,
`sinkmech.sharding.length`); `KINDS` finds them by the part's kind. The file
format (`.partial.json`, strict JSON, float64 values exact, `sinkmech.sharding.arrays`)
is documented in docs/outputs.md.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path

import numpy as np

from sinkmech.files import cannot, json_text, write_text
from sinkmech.sharding.arrays import decode, encode

FORMAT = "sinkmech.partial"  # the file format's name (a contract: it does not follow the module's path)
FORMATS = (FORMAT, "sinkmech.sharding.parts")  # also read: the name a development version wrote
FORMAT_VERSION = 1
SUFFIX = ".partial.json"


class PartialError(ValueError):
    """A part that cannot be read or merged: one line that names the problem."""


@dataclass(frozen=True)
class Partial:
    """One analysis on some shards of the prompts (see the module docstring).

    Attributes:
        kind: the analysis ("sinks", "heads", "ablate").
        settings: JSON values that must be equal to merge.
        n_shards: how many shards the corpus was split into (N of I/N).
        shards: the 1-based shard numbers this part holds.
        n_prompts_total: prompts in the whole corpus.
        prompt_index: int64 [prompt], sorted global indices of the rows.
        rows: name -> array [prompt, ...] aligned with `prompt_index`.
        sums: name -> float64 array, additive.
        labels: key -> text, merged by union (equal keys must agree).
    """

    kind: str
    settings: dict
    n_shards: int
    shards: tuple[int, ...]
    n_prompts_total: int
    prompt_index: np.ndarray
    rows: dict[str, np.ndarray] = field(default_factory=dict)
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Every shard and every prompt of the corpus is here."""
        return (self.shards == tuple(range(1, self.n_shards + 1))
                and len(self.prompt_index) == self.n_prompts_total)

    def check_complete(self) -> None:
        """Raise a `PartialError` naming the missing shards (or prompts)."""
        missing = sorted(set(range(1, self.n_shards + 1)) - set(self.shards))
        if missing:
            names = ", ".join(f"{i}/{self.n_shards}" for i in missing)
            raise PartialError(f"missing shard{'s' if len(missing) > 1 else ''} {names}: merge needs all "
                               f"{self.n_shards} shards")
        if not np.array_equal(self.prompt_index, np.arange(self.n_prompts_total)):
            raise PartialError(f"the parts hold {len(self.prompt_index)} of {self.n_prompts_total} prompts")

    def to_dict(self) -> dict:
        """The JSON form (see docs/outputs.md), with its sha256 checksum."""
        body = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "kind": self.kind,
            "settings": self.settings,
            "n_shards": self.n_shards,
            "shards": list(self.shards),
            "n_prompts_total": self.n_prompts_total,
            "prompt_index": [int(i) for i in self.prompt_index],
            "rows": {k: encode(v) for k, v in sorted(self.rows.items())},
            "sums": {k: encode(v) for k, v in sorted(self.sums.items())},
            "labels": dict(sorted(self.labels.items())),
        }
        return {**body, "sha256": checksum(body)}

    def to_json(self) -> str:
        return json_text(self.to_dict(), compact=True)

    @classmethod
    def from_dict(cls, d: dict, *, name: str = "part") -> Partial:
        """Read a part back, checking its format, version and checksum."""
        if not isinstance(d, dict) or d.get("format") not in FORMATS:
            raise PartialError(f"{name} is not a sinkmech partial file (no \"format\": \"{FORMAT}\")")
        version = d.get("format_version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise PartialError(f"{name} has partial format version {version}; this sinkmech reads versions up to "
                               f"{FORMAT_VERSION}: upgrade sinkmech to merge it")
        body = {k: v for k, v in d.items() if k != "sha256"}
        if d.get("sha256") != checksum(body):
            raise PartialError(f"{name} is corrupt: its content does not match its sha256 checksum")
        try:
            index = np.asarray(d["prompt_index"], dtype=np.int64)
            rows = {k: decode(v) for k, v in d["rows"].items()}
            part = cls(kind=d["kind"], settings=d["settings"], n_shards=int(d["n_shards"]),
                       shards=tuple(int(i) for i in d["shards"]), n_prompts_total=int(d["n_prompts_total"]),
                       prompt_index=index, rows=rows, sums={k: decode(v) for k, v in d["sums"].items()},
                       labels=dict(d["labels"]))
        except (KeyError, TypeError, ValueError) as e:
            raise PartialError(f"{name} is corrupt: {type(e).__name__}: {e}") from None
        bad = [k for k, v in rows.items() if v.shape[0] != len(index)]
        if bad:
            raise PartialError(f"{name} is corrupt: rows {bad[0]!r} do not match its {len(index)} prompts")
        return part


def checksum(body: dict) -> str:
    """sha256 of the canonical JSON text of `body` (sorted keys, no spaces)."""
    text = json_text(body, sort_keys=True, compact=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# Merging.

def merge(parts: Sequence[Partial], names: Sequence[str] | None = None) -> Partial:
    """Merge parts of one analysis: rows in global prompt order, sums added.

    Order-free: the parts are sorted by their first prompt before anything is
    added. Raises `PartialError` (one line, naming the parts by `names`) for
    parts of different analyses, splits or settings, and duplicate shards or
    prompts. A merge need not be complete (see `Partial.check_complete`).
    """
    parts = list(parts)
    if not parts:
        raise PartialError("nothing to merge")
    names = list(names) if names is not None else [f"part {i + 1}" for i in range(len(parts))]
    first, a = parts[0], names[0]
    for p, b in zip(parts[1:], names[1:]):
        if p.kind != first.kind:
            raise PartialError(f"{b} holds a '{p.kind}' result, {a} a '{first.kind}' result: they do not merge")
        if p.n_shards != first.n_shards or p.n_prompts_total != first.n_prompts_total:
            raise PartialError(f"{a} and {b} come from different splits ({first.n_shards} shards of "
                               f"{first.n_prompts_total} prompts vs {p.n_shards} of {p.n_prompts_total})")
        diff = differing_setting(first.settings, p.settings)
        if diff is not None:
            key, x, y = diff
            raise PartialError(f"{a} and {b} differ in setting '{key}': {json_text(x, indent=None)} vs {json_text(y, indent=None)}")
        if set(p.rows) != set(first.rows) or set(p.sums) != set(first.sums):
            raise PartialError(f"{a} and {b} hold different statistics: they do not merge")
    seen: dict[int, str] = {}
    for p, b in zip(parts, names):
        for i in p.shards:
            if i in seen:
                raise PartialError(f"duplicate shard {i}/{first.n_shards} ({seen[i]} and {b})")
            seen[i] = b
    order = sorted(range(len(parts)), key=lambda j: (int(parts[j].prompt_index[0]) if len(parts[j].prompt_index)
                                                     else first.n_prompts_total, min(parts[j].shards)))
    parts = [parts[j] for j in order]
    index = np.concatenate([p.prompt_index for p in parts])
    if len(np.unique(index)) != len(index):
        raise PartialError("the parts share prompts: each prompt may be in one shard only")
    sort = np.argsort(index, kind="stable")
    rows = {k: np.concatenate([p.rows[k] for p in parts])[sort] for k in first.rows}
    sums = {}
    for k in first.sums:
        total = np.zeros_like(first.sums[k])
        for p in parts:
            if p.sums[k].shape != total.shape:
                raise PartialError(f"the parts' sums {k!r} differ in shape: {p.sums[k].shape} vs {total.shape}")
            total = total + p.sums[k]
        sums[k] = total
    labels: dict[str, str] = {}
    for p in parts:
        for k, v in p.labels.items():
            if labels.setdefault(k, v) != v:
                raise PartialError(f"the parts disagree on label {k!r}: {labels[k]!r} vs {v!r}")
    return replace(first, shards=tuple(sorted(seen)), prompt_index=index[sort], rows=rows, sums=sums, labels=labels)


def attach(part: Partial, name: str, other: Partial) -> Partial:
    """`part` carrying `other` (another analysis of the same prompts of the same
    shard) under `name`: its rows, sums and labels as "name/KEY", its settings as
    `settings[name]`. Merged with `part`; `detach` takes it out again."""
    if (other.shards, other.n_shards, other.n_prompts_total) != (part.shards, part.n_shards, part.n_prompts_total) \
            or not np.array_equal(other.prompt_index, part.prompt_index):
        raise ValueError(f"cannot attach '{name}': it holds other prompts than the part")
    if name in part.settings:
        raise ValueError(f"the part already has a setting '{name}'")
    return replace(part, settings={**part.settings, name: {"kind": other.kind, **other.settings}},
                   rows={**part.rows, **{f"{name}/{k}": v for k, v in other.rows.items()}},
                   sums={**part.sums, **{f"{name}/{k}": v for k, v in other.sums.items()}},
                   labels={**part.labels, **{f"{name}/{k}": v for k, v in other.labels.items()}})


def detach(part: Partial, name: str) -> Partial:
    """The analysis `attach`ed to `part` under `name`."""
    pre = f"{name}/"
    settings = dict(part.settings[name])
    kind = settings.pop("kind")

    def strip(d: dict) -> dict:
        return {k[len(pre):]: v for k, v in d.items() if k.startswith(pre)}

    return replace(part, kind=kind, settings=settings, rows=strip(part.rows), sums=strip(part.sums),
                   labels=strip(part.labels))


def differing_setting(a: dict, b: dict, prefix: str = "") -> tuple[str, object, object] | None:
    """The first setting (dotted name) whose values differ, or None."""
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            inner = differing_setting(x, y, f"{prefix}{key}.")
            if inner is not None:
                return inner
        elif x != y:
            return f"{prefix}{key}", x, y
    return None


# Files: written whole or not at all; read with a one-line error.

def write_partial(path: str | os.PathLike, part: Partial) -> Path:
    """Write `part` to `path` atomically (`sinkmech.files.write_text`), so an
    interrupted run never leaves a truncated part under the final name."""
    return write_text(path, part.to_json())


def read_partial(path: str | os.PathLike) -> Partial:
    """Read a `.partial.json`; a missing, corrupt, truncated or too new file is a
    `PartialError` (or `FileNotFoundError`) with one line naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such part: {path}")
    with cannot("read", path):
        text = path.read_text(encoding="utf-8")
    try:
        d = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PartialError(f"{path} is corrupt or truncated (not valid JSON: {getattr(e, 'msg', e)})") from None
    return Partial.from_dict(d, name=str(path))


def read_parts(paths: Iterable[str | os.PathLike]) -> Partial:
    """Read and merge the parts at `paths` (any order); complete or an error."""
    paths = [Path(p) for p in paths]
    merged = merge([read_partial(p) for p in paths], [str(p) for p in paths])
    merged.check_complete()
    return merged


# Shards.

def parse_shard(text: str) -> tuple[int, int]:
    """'I/N' (1-based) -> (I, N); a `ValueError` says what is wrong."""
    try:
        i, n = (int(x) for x in str(text).split("/"))
    except ValueError:
        raise ValueError(f"--shard is written I/N with 1 <= I <= N, e.g. 2/8; got {text!r}") from None
    if not 1 <= i <= n:
        raise ValueError(f"--shard I/N needs 1 <= I <= N, got {text!r}")
    return i, n


def shard_span(n_prompts: int, i: int, n: int) -> range:
    """Global prompt indices of shard `i` of `n` (1-based): contiguous, sizes
    differing by at most one."""
    if not 1 <= i <= n:
        raise ValueError(f"shard {i}/{n}: need 1 <= I <= N")
    if n > n_prompts:
        raise ValueError(f"{n} shards of {n_prompts} prompts: every shard needs at least one prompt")
    return range((i - 1) * n_prompts // n, i * n_prompts // n)


def split(part: Partial, spans: Sequence[range]) -> list[Partial]:
    """A part's rows cut into pieces (sums cannot be cut: for rows-only parts,
    the tests' way to check the merge algebra against the one-pass result)."""
    if part.sums:
        raise ValueError("a part with sums cannot be split after the fact")
    out = []
    for j, span in enumerate(spans, 1):
        keep = np.isin(part.prompt_index, np.asarray(span))
        out.append(replace(part, n_shards=len(spans), shards=(j,), prompt_index=part.prompt_index[keep],
                           rows={k: v[keep] for k, v in part.rows.items()}))
    return out


# What every analysis' adapters share: a shard's part, the record of what was scored
# (`TokenBatch.used`), and the fields of a result kept as rows.

def shard_part(kind: str, settings: dict, *, prompt_index: Sequence[int], shard: tuple[int, int],
               n_prompts_total: int | None = None, rows: dict, sums: dict, labels: dict | None = None) -> Partial:
    """A `Partial` for shard `shard` = (I, N) holding `prompt_index` (global, in
    order) of `n_prompts_total` prompts (default: these are all of them)."""
    index = np.asarray(list(prompt_index), dtype=np.int64)
    if len(index) and np.any(np.diff(index) <= 0):
        raise ValueError("prompt_index must increase")
    return Partial(kind=kind, settings=settings, n_shards=shard[1], shards=(shard[0],),
                   n_prompts_total=len(index) if n_prompts_total is None else n_prompts_total, prompt_index=index,
                   rows=rows, sums={k: np.asarray(v, dtype=np.float64) for k, v in sums.items()}, labels=labels or {})


def batch_rows(batch) -> tuple[dict, dict, dict]:
    """What a part keeps of its `TokenBatch` for the JSON's record of what was
    scored (`TokenBatch.used`): rows, sums and settings."""
    return ({"content_lengths": (batch.lengths - batch.offset).cpu().numpy()},
            {"context_cut": [0.0 if batch.context_limit is None else 1.0]},
            {"context_limit": batch.context_limit})


def used(part: Partial, requested: int | None) -> dict:
    """`TokenBatch.used(requested)` of the merged prompts."""
    lengths = part.rows["content_lengths"]
    cut = part.sums["context_cut"][0] > 0
    return {"max_tokens": int(lengths.max()), "max_tokens_requested": requested,
            "content_lengths": [int(x) for x in lengths], "context_limit": part.settings["context_limit"] if cut else None}


_PROMPT_AXIS = re.compile(r"""Tensor, ['"]\s*prompt\b""")


def row_fields(result_type) -> tuple[str, ...]:
    """The fields of a result dataclass that its parts keep as rows: the tensors
    with a leading `prompt` axis that every such result has (no default), in
    field order."""
    return tuple(f.name for f in fields(result_type)
                 if f.default is MISSING and _PROMPT_AXIS.search(str(f.type)))


# The kinds of part. For each, the function that turns a merged part back into its
# result ("module:function", next to that result in its package's `parts` module),
# imported on first use: reading and merging parts needs neither torch nor the analyses.

KINDS = {
    "sinks": "sinkmech.sharding.measures:sinks_result",
    "key_sinks": "sinkmech.sharding.measures:key_sinks_result",
    "value_weighted": "sinkmech.sharding.measures:value_weighted_result",
    "massive": "sinkmech.sharding.measures:massive_result",
    "heads": "sinkmech.sharding.dormant:heads_result",
    "ablate": "sinkmech.sharding.interventions:ablate_result",
    "patch": "sinkmech.sharding.interventions:patch_result",
    "perturb": "sinkmech.sharding.interventions:spread_result",
    "length_scores": "sinkmech.sharding.length:scores_result",
    "length": "sinkmech.sharding.length:length_result",
}


def check_kind(kind: str) -> str:
    """`kind`, if this sinkmech knows it (`KINDS`); else a one-line `PartialError`."""
    if kind not in KINDS:
        raise PartialError(f"this sinkmech cannot merge '{kind}' parts")
    return kind


def result_function(kind: str) -> Callable:
    """The function that turns a merged part of `kind` back into its result."""
    module, name = KINDS[check_kind(kind)].split(":")
    return getattr(importlib.import_module(module), name)
