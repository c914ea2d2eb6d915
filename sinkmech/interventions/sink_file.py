"""The sink-logit file: what `sinkmech fit-sinks` writes and `sinkmech sinks
--sink-logits` reads (fitted per-(layer, head) sink logits, optionally values,
and the prompts they were fitted on). Read and checked here without torch, so a
bad file is refused before any model loads; its shape is checked against the
model once it has loaded (`check_shape`).

    {"sink_logits": [[b, ...], ...],     # [layer][head]; null: no sink at that head
     "sink_values": [[[u, ...]]] | null, # [layer][head][d_head], or none fitted
     "fit_prompts": [...],               # what they were fitted on: never evaluated
     "fit_token_hashes": [...], "model": ..., ...}
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SinkFile:
    """The checked content of a sink-logit file (plain lists: no torch)."""

    path: Path
    logits: list[list[float]]  # [layer][head]; -inf where there is no sink
    values: list[list[list[float]]] | None  # [layer][head][d_head]
    fit_prompts: list  # strings or token-id lists
    fit_token_hashes: frozenset[str]
    model: str | None

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.logits), len(self.logits[0])

    def check_shape(self, n_layers: int, n_heads: int, d_head: int) -> None:
        """ValueError unless the file fits a model of this size."""
        if self.shape != (n_layers, n_heads):
            raise ValueError(f"{self.path}: sink logits for {self.shape[0]} layers x {self.shape[1]} heads do not fit "
                             f"this model ({n_layers} layers x {n_heads} heads)"
                             + (f"; the file was fitted on {self.model}" if self.model else ""))
        if self.values is not None and len(self.values[0][0]) != d_head:
            raise ValueError(f"{self.path}: sink values of {len(self.values[0][0])} numbers per head do not fit this "
                             f"model's heads (d_head {d_head})")

    def refuse_fitted(self, prompts: Sequence) -> None:
        """ValueError if any of `prompts` (strings or token-id lists) is one the
        sinks were fitted on: held-out evaluation only."""
        fitted = {_key(p) for p in self.fit_prompts}
        hit = [i for i, p in enumerate(prompts) if _key(p) in fitted]
        if hit:
            raise ValueError(f"{len(hit)} of the prompts (first: prompt {hit[0]}) are ones the sinks in {self.path} were "
                             "fitted on: evaluate on held-out prompts")

    def refuse_fitted_tokens(self, rows: Sequence[Sequence[int]]) -> None:
        """As `refuse_fitted`, on content token ids (after tokenizing)."""
        hit = [i for i, r in enumerate(rows) if token_hash(r) in self.fit_token_hashes]
        if hit:
            raise ValueError(f"{len(hit)} of the prompts (first: prompt {hit[0]}) hold the same tokens as prompts the "
                             f"sinks in {self.path} were fitted on: evaluate on held-out prompts")


def _key(prompt) -> str:
    return prompt if isinstance(prompt, str) else "ids:" + ",".join(str(int(t)) for t in prompt)


def token_hash(row: Sequence[int]) -> str:
    """The record of one fitting prompt's content tokens: sha256 of the ids written
    as a JSON list ("[2, 651, 9]")."""
    return hashlib.sha256(("[" + ", ".join(str(int(t)) for t in row) + "]").encode()).hexdigest()


def read_sink_file(path: str | Path) -> SinkFile:
    """Read and check a sink-logit file: FileNotFoundError or ValueError with the reason."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"sink-logit file {path} is a folder; give the JSON file fit-sinks wrote")
    if not path.is_file():
        raise FileNotFoundError(f"sink-logit file not found: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(data, dict) or "sink_logits" not in data:
        raise ValueError(f"{path} holds no 'sink_logits' (the [layer][head] grid sinkmech fit-sinks writes)")
    logits = data["sink_logits"]
    if not isinstance(logits, list) or not logits or not all(isinstance(r, list) and r for r in logits):
        raise ValueError(f"{path}: 'sink_logits' must be a non-empty [layer][head] grid of numbers")
    if len({len(r) for r in logits}) != 1:
        raise ValueError(f"{path}: 'sink_logits' rows differ in length: every layer needs one logit per head")
    grid = []
    for l, row in enumerate(logits):
        out = []
        for h, b in enumerate(row):
            if b is None:
                out.append(-math.inf)
            elif isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b):
                raise ValueError(f"{path}: sink_logits[{l}][{h}] must be a finite number or null, got {b!r}")
            else:
                out.append(float(b))
        grid.append(out)
    values = data.get("sink_values")
    if values is not None:
        L, H = len(grid), len(grid[0])
        ok = (isinstance(values, list) and len(values) == L and all(isinstance(r, list) and len(r) == H for r in values)
              and all(isinstance(v, list) and v for r in values for v in r))
        if not ok or len({len(v) for r in values for v in r}) != 1:
            raise ValueError(f"{path}: 'sink_values' must be a [layer][head][d_head] grid matching 'sink_logits'")
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                   for r in values for v in r for x in v):
            raise ValueError(f"{path}: 'sink_values' must hold finite numbers")
    prompts = data.get("fit_prompts") or []
    hashes = data.get("fit_token_hashes") or []
    if not isinstance(prompts, list) or not isinstance(hashes, list):
        raise ValueError(f"{path}: 'fit_prompts' and 'fit_token_hashes' must be lists")
    return SinkFile(path, grid, values, prompts, frozenset(map(str, hashes)), data.get("model"))
