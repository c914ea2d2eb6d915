"""The registry of part kinds (`sinkmech.sharding.format.KINDS`): every kind an
adapter or a command writes is there, each names the function that turns a merged
part back into its result, next to that result; an unknown kind is refused with
one line, by the library and by `sinkmech merge`."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import numpy as np
import pytest
from jaxtyping import Float, Int
from torch import Tensor

import sinkmech
from sinkmech.cli.main import main
from sinkmech.cli.merge import mergers
from sinkmech.sharding.format import (
    KINDS, Partial, PartialError, check_kind, result_function, row_fields, write_partial,
)

PACKAGE = Path(sinkmech.__file__).resolve().parent

# Where a kind is named when a part is made (`shard_part`, the first argument) and
# when a command writes or resumes one (`sharded`, `run_command_on_ray`, `run_shard`).
WRITERS = {"shard_part": 0, "sharded": 2, "run_command_on_ray": 3, "run_shard": 4}


def kinds_written(folder: Path) -> dict[str, set[str]]:
    """For each writer above, the kinds the modules under `folder` pass it: string
    literals, or names imported (anywhere in the module) from a module that defines them."""
    out: dict[str, set[str]] = {w: set() for w in WRITERS}
    for path in sorted(folder.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        imported = {a.asname or a.name: n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                    for a in n.names}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in WRITERS):
                continue
            i = WRITERS[node.func.id]
            if len(node.args) <= i:
                continue
            arg = node.args[i]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                out[node.func.id].add(arg.value)
            elif isinstance(arg, ast.Name) and arg.id != "kind":  # `kind`: a parameter passed on
                value = getattr(importlib.import_module(imported.get(arg.id, module)), arg.id)
                out[node.func.id].add(value)
            elif not isinstance(arg, ast.Name):
                raise AssertionError(f"{path.name}:{node.lineno}: a kind the test cannot read")
    return out


def test_every_kind_an_adapter_makes_is_registered_and_nothing_else():
    made = kinds_written(PACKAGE)["shard_part"]
    # the ten kinds of docs/outputs.md: if one is added, it is registered, documented and merged here
    assert made == set(KINDS) == {"sinks", "key_sinks", "value_weighted", "massive", "heads", "ablate", "patch",
                                  "perturb", "length_scores", "length"}


def test_every_kind_a_command_writes_is_registered_and_merged_by_sinkmech_merge():
    written = kinds_written(PACKAGE / "cli")
    commands = written["sharded"] | written["run_command_on_ray"] | written["run_shard"]
    assert commands == set(mergers())  # what `sinkmech merge` prints and writes
    assert commands <= set(KINDS)
    assert set(KINDS) - commands == {"key_sinks", "value_weighted"}  # written by the library only


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kind_names_its_result_function_in_the_sharding_package(kind):
    """Each kind's adapters sit in sharding/ (what `sinkmech merge` reads them through)."""
    f = result_function(kind)
    assert callable(f) and f.__name__.endswith("_result")
    assert f.__module__.rsplit(".", 1)[0] == "sinkmech.sharding", f.__module__


def test_an_unknown_kind_is_refused_with_one_line(tmp_path, capsys):
    with pytest.raises(PartialError, match=r"^this sinkmech cannot merge 'nope' parts$"):
        check_kind("nope")
    with pytest.raises(PartialError, match="cannot merge 'nope' parts"):
        result_function("nope")
    out = tmp_path / "merged.json"
    for kind in ("nope", "value_weighted"):  # unknown; known to the library but no command's
        part = Partial(kind=kind, settings={}, n_shards=1, shards=(1,), n_prompts_total=2,
                       prompt_index=np.arange(2), rows={"x": np.zeros(2)})
        path = write_partial(tmp_path / f"{kind}.partial.json", part)
        assert main(["merge", str(path), "--json", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"error: this sinkmech cannot merge '{kind}' parts"]
        assert not out.exists()


def test_rows_are_the_fields_with_a_prompt_axis_that_every_result_has():
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Planted:
        per_prompt: Float[Tensor, "prompt layer head_index"]
        not_per_prompt: Float[Tensor, "layer head_index"]
        lengths: Int[Tensor, " prompt"]
        prompts_seen: int
        optional: Float[Tensor, " prompt"] | None = None

    assert row_fields(Planted) == ("per_prompt", "lengths")


def test_the_sink_rows_are_the_row_names_of_a_sinks_part_file():
    from sinkmech.sharding.measures import SINK_ROWS

    # the rows a sinks part (format version 1) holds per condition: a new per-prompt
    # field of SinkScores without a default would ask older part files for rows they lack
    assert SINK_ROWS == ("scores", "value_norm_first", "value_norm_rest", "resid_norm_first", "resid_norm_rest",
                         "lengths")
