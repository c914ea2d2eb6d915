"""What a fresh interpreter has imported after the command line ran: the probe
the startup tests read (`--help` and a rejected flag must not load torch,
TransformerLens, transformers or Ray)."""

from __future__ import annotations

import json
import subprocess
import sys

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
    """For each argv, run in one fresh interpreter in turn: {"argv", "code", "text", "heavy"}."""
    run = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argvs)], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])
