"""The command line answers at once: `--help`, every command's `--help` and a
rejected flag are handled before torch, TransformerLens, transformers or Ray
are imported (a behavioural check of what a fresh interpreter has imported, not
a timing; scripts/bench_cli.py times it). Also: the constants a parser reads
from source without importing its module equal the imported ones, and the
package's public names resolve to their modules' objects."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

import pytest

from helpers.paths import REPO
from helpers.probe import HEAVY, probe

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


def test_errors_the_flags_and_prompt_files_decide_import_nothing_heavy(tmp_path):
    """Refused before torch is imported (each a specific `error:` line, exit 2): flags that
    conflict, a flag value no model can take, and a prompt file no command can read."""
    binary, blank, text = tmp_path / "binary.txt", tmp_path / "blank.txt", tmp_path / "p.txt"
    binary.write_bytes(b"\x00\x01\x02 not text")
    blank.write_text("\n   \n\n")
    text.write_text("\n".join(f"prompt {i} has a few words" for i in range(8)) + "\n")
    cases = [
        (["heads", "--low", "0.4", "--high", "0.1"], "need 0 <= --low < --high <= 1"),
        (["sinks", "--bos-token", ""], "--bos-token is empty"),
        (["heads", "--bos-token", ""], "--bos-token is empty"),
        (["sinks", "--bos-position", "8", "--max-tokens", "8"], "--bos-position 8 is at or beyond the content length"),
        (["sinks", "--bos-position", "2", "--bos", "none"], "--bos-position moves <bos> into the sequence"),
        (["sinks", "--prompts", str(binary)], "is binary"),
        (["sinks", "--prompts", str(blank)], "holds no prompts"),
        (["heads", "--prompts", str(blank)], "holds no prompts"),
        (["ablate", "--mode", "zero", "--prompts", str(binary)], "is binary"),
        (["patch", "--prompts", str(blank)], "holds no prompts"),
        (["report", "--prompts", str(binary), "--out", str(tmp_path / "r")], "is binary"),
        (["compare", "--prompts", str(blank), "--out", str(tmp_path / "c")], "holds no prompts"),
        (["heads", "--prompts", str(text), "--contrast", str(text)], "both hold the same prompts"),
        (["patch", "--metric", "logit_diff"], "--metric logit_diff needs --answers"),
        (["patch", "--metric", "loss", "--answers", "a", "b"], "--answers is for --metric logit_diff"),
        (["ablate", "--mode", "zero", "--metric", "loss", "--shard", "1/2", "--json", str(tmp_path / "a.partial.json")],
         "--metric loss runs in one process"),
    ]
    for (argv, text), g in zip(cases, probe(*(argv for argv, _ in cases))):
        assert g["code"] == 2 and text in g["text"] and "Traceback" not in g["text"], g
        assert g["text"].strip().splitlines()[-1].startswith("error: "), g
        assert g["heavy"] == [], f"{' '.join(argv)} imported {g['heavy'][:5]}"


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
    from sinkmech import Thresholds, scan_heads  # the cuts scan_heads(thresholds=...) takes

    assert Thresholds().high == 0.5 and "thresholds" in inspect.signature(scan_heads).parameters
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
