"""Headless Chromium for the report tests: networking off, JavaScript on.

Not a test module: helpers that load a page, let its scripts run, and return
the DOM or a screenshot. A missing chromium fails the test with a clear
message (`make test` installs Debian's `chromium`); it never skips silently.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

BUDGET_MS = 15000  # virtual time for scripts to run before the DOM is read

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
    # Networking off: every host resolves to nothing, and any request that still
    # tries goes to a proxy on a closed port.
    "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
    "--host-resolver-rules=MAP * ~NOTFOUND",
]


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(
        "chromium is not installed, so the report cannot be checked in a browser: "
        "run `apt-get install -y chromium` (`make test` does when root)", pytrace=False
    )


def _run(page: Path, *extra: str) -> str:
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [chromium(), *FLAGS, f"--user-data-dir={profile}", f"--virtual-time-budget={BUDGET_MS}",
             *extra, page.resolve().as_uri()],
            capture_output=True, text=True, timeout=120,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"chromium failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout


def dump_dom(page: Path) -> str:
    """The page's DOM after its scripts ran."""
    return _run(page, "--dump-dom")


def screenshot(page: Path, png: Path, size: tuple[int, int] = (1300, 2600)) -> np.ndarray:
    """Screenshot as an array [height, width, channels] in [0, 1]."""
    import matplotlib.image

    _run(page, f"--window-size={size[0]},{size[1]}", f"--screenshot={png}")
    return matplotlib.image.imread(png)


class Dom(HTMLParser):
    """What the tests read from a dumped DOM: the title, every <img>'s
    attributes, and for each circuitsvis mount point its element, the tags
    created inside it and its text."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.title, self.images, self.views = "", [], []
        self._stack: list[str] = []
        self._open: list[tuple[int, dict]] = []  # (depth, view) of mount points we are inside
        self._in_title = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for _, view in self._open:
            view["tags"].append(tag)
        if tag == "img":
            self.images.append(a)
        if tag == "title":
            self._in_title = True
        if tag in ("img", "br", "meta", "input", "link", "hr"):
            return
        self._stack.append(tag)
        if "sinkmech-cv" in (a.get("class") or "").split():
            view = {"element": a.get("data-element"), "id": a.get("id"), "tags": [], "text": ""}
            self.views.append(view)
            self._open.append((len(self._stack), view))

    def handle_endtag(self, tag):
        if tag == "title":
            self._in_title = False
        if tag in ("img", "br", "meta", "input", "link", "hr"):
            return
        while self._stack:
            if self._open and self._open[-1][0] == len(self._stack):
                self._open.pop()
            if self._stack.pop() == tag:
                break

    def handle_data(self, data):
        if self._in_title:
            self.title += data
        for _, view in self._open:
            view["text"] += data.replace("\xa0", " ")
