"""The README's set-up commands install what the tests need, or stop and say
how: never a browser test that passes, or is skipped, without a browser."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.paths import REPO

ROOT = REPO


def _make_browser(tmp_path: Path, uid: str) -> subprocess.CompletedProcess:
    """`make browser` with no browser on PATH and `id -u` answering `uid`;
    a fake apt-get records what it was asked instead of installing."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    (bin_ / "apt-get").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'apt.log'}\n")
    for f in bin_.iterdir():
        f.chmod(0o755)
    return subprocess.run([shutil.which("make"), "-s", "-C", str(ROOT), "browser"], capture_output=True, text=True,
                          env={"PATH": str(bin_)}, timeout=60)


def test_without_root_make_stops_before_the_tests_with_the_command_to_run(tmp_path):
    proc = _make_browser(tmp_path, "1000")
    assert proc.returncode != 0
    assert proc.stderr.splitlines()[0] == (
        "error: the browser tests need chromium: run 'sudo apt-get install -y chromium' "
        "(or install Chromium/Chrome another way), then make test again")
    assert not (tmp_path / "apt.log").exists()


def test_as_root_make_installs_chromium_with_apt_get(tmp_path):
    proc = _make_browser(tmp_path, "0")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "apt.log").read_text().splitlines() == ["update -qq", "install -y -qq chromium"]


def test_every_test_target_checks_the_browser_and_runs_ruff():
    text = (ROOT / "Makefile").read_text()
    # `make test` (the README's command and CI's): both environments built side by side, then both suites
    rule = re.search(r"^test:\n((?:\t.*\n)+)", text, re.M)
    assert rule and rule.group(1).splitlines() == ["\t$(MAKE) -j2 setup setup-tl4", "\t$(MAKE) both-suites"]
    for target in ("both-suites", "test-tl3", "test-fast"):
        rule = re.search(rf"^{target}: (.*)\n((?:\t.*\n)+)", text, re.M)
        assert rule and "browser" in rule.group(1).split(), target
        assert "ruff check" in rule.group(2), target
    both = re.search(r"^both-suites: (.*)\n((?:\t.*\n)+)", text, re.M)
    assert {"$(STAMP)", "$(STAMP4)"} <= set(both.group(1).split())  # it builds both environments
    assert "$(BIN)/python -m pytest" in both.group(2) and "$(VENV4)/bin/python -m pytest" in both.group(2)


def test_a_missing_browser_fails_the_browser_tests(monkeypatch):
    from helpers import browser

    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(pytest.fail.Exception, match="apt-get install -y chromium"):
        browser.chromium()
