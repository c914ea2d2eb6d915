"""The command line answers at once: `--help`, every command's `--help` and a
rejected flag are handled before torch, TransformerLens, transformers or Ray
are imported (a behavioural check of what a fresh interpreter has imported, not
a timing; scripts/bench_cli.py times it). Also: the constants a parser reads
from source without importing its module equal the imported ones."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformer_lens", "transformers", "ray")

# Runs the CLI's entry point in a fresh interpreter on argv, then prints which heavy
# modules it imported and the exit status as one JSON line on stderr's last line.
PROBE = """
import json, sys
from sinkmech.cli.main import main
argv = json.loads(sys.argv[1])
try:
    code = main(argv)
except SystemExit as e:
    code = e.code
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {heavy})
print(json.dumps({{"code": code, "heavy": heavy}}), file=sys.stderr)
""".format(heavy=set(HEAVY))


def probe(argv: list[str]) -> dict:
    run = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    return {**json.loads(run.stderr.strip().splitlines()[-1]), "stdout": run.stdout, "stderr": run.stderr}


def test_help_and_a_bad_flag_import_nothing_heavy(tmp_path):
    """One fresh interpreter per case (the imports of one would hide another's)."""
    cases = [
        (["--help"], 0, "sinks"),
        (["sinks", "--help"], 0, "--batch-size"),
        (["heads", "--help"], 0, "--noop-prompts"),
        (["length", "--help"], 0, "--lengths"),
        (["report", "--help"], 0, "--length-steps"),
        (["sinks", "--batch-size", "0"], 2, "error: --batch-size must be >= 1"),
        (["merge", "--json", str(tmp_path / "x.json")], 2, "error:"),
        (["sinks", "--shard", "3/2"], 2, "error: --shard is written I/N"),
        (["ablate", "--shard", "1/2", "--json", str(tmp_path / "a.json")], 2, "ending in .partial.json"),
        (["perturb", "--noise", "nan"], 2, "error: --noise must be a finite number"),
        (["sinks", "--json", "/proc/x.json"], 2, "error: --json /proc/x.json: cannot write into /proc"),
    ]
    for argv, code, text in cases:
        got = probe(argv)
        assert got["code"] == code, (argv, got["stderr"])
        assert text in got["stdout"] + got["stderr"], (argv, got)
        assert got["heavy"] == [], f"{' '.join(argv)} imported {got['heavy'][:5]}"


def test_the_probe_sees_heavy_imports():
    """The check above can fail: `--version` does import torch (it prints its version)."""
    got = probe(["--version"])
    assert got["code"] == 0 and "torch" in got["heavy"] and "torch" in got["stdout"]
    assert "transformer_lens" not in got["heavy"]


def test_version_prints_the_backends_own_line():
    from sinkmech.backend import version_text
    from sinkmech.cli.main import version_line

    assert version_line() == version_text()


def test_importing_the_package_is_light_and_keeps_its_public_names():
    code = ("import sys, sinkmech; light = not any(m.split('.')[0] in %r for m in sys.modules); "
            "from sinkmech import sink_scores, load_model, sensitivity; import sinkmech.sensitivity as s; "
            "print(light, sink_scores.__module__, load_model.__module__, callable(s), sorted(sinkmech.__all__) == "
            "sorted(sinkmech._EXPORTS))" % (HEAVY,))
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.stdout.split() == ["True", "sinkmech.sinks", "sinkmech.models", "True", "True"], run.stderr


def test_constants_read_from_source_equal_the_imported_ones():
    from typing import get_args

    from sinkmech.backend import IS_BRIDGE
    from sinkmech.cli.common import dataclass_defaults, source_constant
    from sinkmech.eval_length import DEFAULT_LENGTHS, UNIFORM_MULTIPLES
    from sinkmech.interventions.patching import PatchAct, PatchBy
    from sinkmech.model_names import is_bridge_installed
    from sinkmech.report.context import ReportContext

    assert source_constant("sinkmech.eval_length", "DEFAULT_LENGTHS") == DEFAULT_LENGTHS
    assert source_constant("sinkmech.eval_length", "UNIFORM_MULTIPLES") == UNIFORM_MULTIPLES
    assert source_constant("sinkmech.interventions.patching", "PatchAct") == get_args(PatchAct)
    assert source_constant("sinkmech.interventions.patching", "PatchBy") == get_args(PatchBy)
    defaults = dataclass_defaults("sinkmech.report.context", "ReportContext")
    assert defaults and all(ReportContext.__dataclass_fields__[k].default == v for k, v in defaults.items())
    assert is_bridge_installed() == IS_BRIDGE
    with pytest.raises(LookupError):
        source_constant("sinkmech.eval_length", "NO_SUCH_NAME")
