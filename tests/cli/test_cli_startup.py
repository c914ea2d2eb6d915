"""The command line answers at once: `--help`, every command's `--help` and a
rejected flag are handled before torch, TransformerLens, transformers or Ray
are imported (a behavioural check of what a fresh interpreter has imported, not
a timing; scripts/bench_cli.py times it). Also: the constants a parser reads
from source without importing its module equal the imported ones, and the
package's public names resolve to their modules' objects."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from helpers.paths import REPO

HEAVY = ("torch", "transformer_lens", "transformers", "ray")

# In one fresh interpreter: the CLI's entry point on each argv in turn, and after
# each the exit status, its output and the heavy modules imported so far, as JSON.
PROBE = """
import contextlib, io, json, sys
from sinkmech.cli.main import main
out = []
for argv in json.loads(sys.argv[1]):
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in {heavy})
    out.append({{"argv": argv, "code": code, "text": stdout.getvalue() + stderr.getvalue(), "heavy": heavy}})
print(json.dumps(out))
""".format(heavy=set(HEAVY))


def probe(*argvs: list[str]) -> list[dict]:
    run = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argvs)], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_help_and_bad_flags_import_nothing_heavy(tmp_path):
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
        (["sinks", "--bos", "none", "--sink-value", "zero"], 2, "error: --sink-value zero"),
        (["sinks", "--phantom-sink", "logits"], 2, "error: --phantom-sink logits needs --sink-logits"),
        (["sinks", "--sink-logits", str(tmp_path / "none.json")], 2, "error: sink-logit file not found"),
        (["fit-sinks", "--n-fit", "0", "--json", str(tmp_path / "f.json")], 2, "error: --n-fit must be >= 1"),
        # what needs the whole pattern refuses the fused path; a length past the model's context is refused
        *((["heads", "patch", "ablate", "length", "stream"][i:i + 1] + ["--attention", "fused"], 2,
           "which the fused path never holds") for i in range(5)),
        (["sinks", "--keys", "all", "--attention", "fused"], 2, "error: --keys all reads every key's column"),
        (["sinks", "--model", "gemma3-270m", "--max-tokens", "40000"], 2, "gemma3-270m was trained for 32768"),
        (["sinks", "--max-tokens", "8192"], 2, "smollm2 was trained for 8192: give --max-tokens 8191 or less"),
        # the last: `--version` prints torch's version, so it imports torch (the probe can see it), not TransformerLens
        (["--version"], 0, "torch"),
    ]
    got = probe(*(argv for argv, _, _ in cases))
    for (argv, code, text), g in zip(cases, got):
        assert g["code"] == code, g
        assert text in g["text"], g
        if argv != ["--version"]:
            assert g["heavy"] == [], f"{' '.join(argv)} imported {g['heavy'][:5]}"
    assert "torch" in got[-1]["heavy"] and "transformer_lens" not in got[-1]["heavy"]


def test_version_prints_the_backends_own_line():
    from sinkmech.loading.backend import version_text
    from sinkmech.cli.main import version_line

    assert version_line() == version_text()


def test_importing_the_package_is_light():
    code = "import sys, sinkmech; print(sorted(m for m in sys.modules if m.split('.')[0] in %r))" % (HEAVY,)
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "[]", run.stdout + run.stderr


def test_the_public_names_are_their_modules_objects():
    import sinkmech

    assert sorted(sinkmech.__all__) == sorted(sinkmech._EXPORTS)
    for name, module in sinkmech._EXPORTS.items():
        assert getattr(sinkmech, name) is getattr(importlib.import_module(module), name), name
    from sinkmech import sensitivity  # the function, though a module of that name exists and is imported

    assert callable(sensitivity) and sinkmech.sensitivity is sensitivity
    with pytest.raises(AttributeError):
        sinkmech.no_such_name  # noqa: B018


def test_constants_read_from_source_equal_the_imported_ones():
    from typing import get_args

    from sinkmech.cli.common import dataclass_defaults, source_constant
    from sinkmech.context.length import DEFAULT_LENGTHS, UNIFORM_MULTIPLES
    from sinkmech.interventions.patching import PatchAct, PatchBy
    from sinkmech.report.context import ReportContext

    assert source_constant("sinkmech.context.length", "DEFAULT_LENGTHS") == DEFAULT_LENGTHS
    assert source_constant("sinkmech.context.length", "UNIFORM_MULTIPLES") == UNIFORM_MULTIPLES
    assert source_constant("sinkmech.interventions.patching", "PatchAct") == get_args(PatchAct)
    assert source_constant("sinkmech.interventions.patching", "PatchBy") == get_args(PatchBy)
    defaults = dataclass_defaults("sinkmech.report.context", "ReportContext")
    assert defaults and all(ReportContext.__dataclass_fields__[k].default == v for k, v in defaults.items())
    with pytest.raises(LookupError):
        source_constant("sinkmech.context.length", "NO_SUCH_NAME")
