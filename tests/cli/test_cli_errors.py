"""The CLI's error policy: usage errors exit 2, runtime errors exit 1, each as
one `error: ...` line on stderr; `python -m sinkmech.cli --help` works."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sinkmech.cli import main
from sinkmech.cli.common import UsageError
from helpers.paths import REPO



def test_module_entry_point_prints_help():
    run = subprocess.run([sys.executable, "-m", "sinkmech.cli", "--help"], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    for command in ("sinks", "heads", "patch", "ablate", "perturb", "report", "train"):
        assert command in run.stdout


def test_argparse_usage_error_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["sinks", "--bos", "sideways"])
    assert e.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["sinks", "--eps", "abc"], "--eps takes numbers"),
    (["report", "--out", "unused", "--heads", "0"], "--heads must be >= 1"),
    (["sinks", "--prompts", "/no/such/prompts.txt"], "prompt file not found"),
])
def test_bad_flag_values_and_missing_inputs_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_an_unwritable_output_is_a_runtime_error_exit_1(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert main(["report", "--out", str(blocker / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot create the report folder")


def test_each_error_kind_maps_to_its_exit_code(monkeypatch, capsys):
    """Whatever the command: UsageError / ValueError / FileNotFoundError -> 2; OSError / RuntimeError -> 1."""
    import sinkmech.cli.sinks as sinks_cmd

    for error, code in ((UsageError("bad flag"), 2), (ValueError("bad value"), 2), (FileNotFoundError("no file"), 2),
                        (OSError("cannot write x: disk full"), 1), (RuntimeError("broken"), 1)):
        def boom(args, error=error):
            raise error

        monkeypatch.setattr(sinks_cmd, "cmd_sinks", boom)
        # the parser binds cmd_sinks when it is built, so rebuild per call
        assert main(["sinks"]) == code, error
        assert capsys.readouterr().err == f"error: {error}\n"
