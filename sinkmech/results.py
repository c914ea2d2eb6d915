"""The one result protocol: what every analysis returns can be written out the same way.

Every result class is a frozen dataclass that inherits `Result` and defines

- `to_dict()`: JSON-ready Python (lists, numbers, strings, None; NaN and
  infinities may still appear, they are cleaned when written);
- `to_dataframe()`: a pandas DataFrame in long format (one row per
  measured cell, the axes as columns);

and inherits

- `to_json()`: `to_dict()` through `sinkmech.files.json_text`, the one strict
  writer: NaN, +inf and -inf become `null`, never a bare `NaN`/`Infinity`
  that a strict JSON parser rejects.

Keyword options of `to_dict` (e.g. `eps` of `SinkScores`) pass through
`to_json(**options)`. Callers that nest one result inside a larger JSON
document use `to_dict()` (never `json.loads(r.to_json())`) and write the
whole document once through `sinkmech.files.json_text`.

A result that can be built from shards (see STYLE.md) adds its own `merge`;
that protocol sits on top of this one and does not change it.
"""

from __future__ import annotations

from sinkmech.files import json_text


class Result:
    """Base of every result dataclass: `to_json` is `to_dict` through the strict writer."""

    __slots__ = ()

    def to_dict(self, **options) -> dict:
        """JSON-ready content of the result (NaN / inf allowed; `to_json` cleans them)."""
        raise NotImplementedError(f"{type(self).__name__} must define to_dict()")

    def to_dataframe(self):
        """Long format: one row per measured cell."""
        raise NotImplementedError(f"{type(self).__name__} must define to_dataframe()")

    def notes(self) -> list[str]:
        """What a reader should know about how this result was run (a first look
        and what the whole run would take): the command line prints them after it."""
        return []

    def to_json(self, **options) -> str:
        """`to_dict(**options)` as strict JSON on one line: NaN and infinities are null."""
        return json_text(self.to_dict(**options), indent=None)
