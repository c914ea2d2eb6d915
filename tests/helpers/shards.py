"""What the tests of sharded, Ray and merged runs share: two JSON outputs compared under the
float32 error model (helpers/tolerance.py), the one `error:` line a refused run prints, and
the nine word prompts the tiny command-line model runs on."""

from __future__ import annotations

import math

from helpers.tiny import serve_tiny
from helpers.tolerance import SAME_TERMS, TINY_D_MLP, forward_rtol

# Two runs of one command whose forward passes batch the prompts differently (a shard batches
# its own prompts; Ray workers run one thread): their float32 results agree normwise, relative
# to each array's largest |value| (a sum's rounding is set by the size of the sum, not of each
# result: SmolLM2 ablate 2.6e-6 of the largest effect, 2.4e-4 of a 4e-4 effect), to the probable
# bound of SmolLM2's widest accumulation (tolerance.forward_rtol: 9.3e-6), the bound the README
# and docs/scaling.md state as 1e-5.
FLOAT32_RTOL = forward_rtol()
TINY_FLOAT32_RTOL = forward_rtol(TINY_D_MLP)  # the tiny command-line model (d_mlp 128): 2.7e-6
# The same forward passes on both sides (--batch-size 1, --prompt-batch 1: each prompt alone),
# the parts' float64 sums merged in another order: tolerance.SAME_TERMS.
EXACT_RTOL = SAME_TERMS

WORDS = ["the", "cat", "sat", "on", "a", "warm", "mat", "while", "dogs", "ran", "far", "away", "from", "big", "red",
         "barns", "and", "quiet", "old", "mills"]
SHARD_SEED = 5  # the tiny model every shard test of the command line runs on (helpers.tiny.serve_tiny)


def shard_model(monkeypatch):
    """The tiny model (seed SHARD_SEED) with the word tokenizer, served to the command line."""
    return serve_tiny(monkeypatch, SHARD_SEED)


def word_prompts(tmp_path) -> str:
    """A file of 9 prompts of 5 to 15 words (prompt 3 the longest); its path."""
    lines = [" ".join(WORDS[(3 * i + j) % len(WORDS)] for j in range(5 + (7 * i) % 11)) for i in range(9)]
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def numbers(x) -> list[float] | None:
    """The leaves of a list nested of numbers only (an array), else None."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return [float(x)]
    if not isinstance(x, list):
        return None
    out = []
    for v in x:
        leaves = numbers(v)
        if leaves is None:
            return None
        out += leaves
    return out


def assert_same_json(a, b, path="$", *, tol: float = EXACT_RTOL, normwise: bool = False):
    """Equal keys and values, floats to `tol` (relative or absolute; default: the same float32
    terms summed in another order); with `normwise`, an array (a list nested of numbers) to
    `tol` relative to its largest |value|: max |a - b| <= tol * max |a|."""
    if normwise and isinstance(a, list) and numbers(a) and numbers(b) is not None:
        x, y = numbers(a), numbers(b)
        assert len(x) == len(y), path
        scale = max(abs(v) for v in x)
        worst = max(abs(u - v) for u, v in zip(x, y))
        assert worst <= tol * scale, (path, f"max |difference| {worst:.3g} > {tol:g} x largest |value| {scale:.3g}")
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (path, set(a) ^ set(b))
        for k in a:
            assert_same_json(a[k], b[k], f"{path}.{k}", tol=tol, normwise=normwise)
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_json(x, y, f"{path}[{i}]", tol=tol, normwise=normwise)
    elif isinstance(a, float) or isinstance(b, float):
        assert math.isclose(a, b, rel_tol=tol, abs_tol=tol), (path, a, b)
    else:
        assert a == b, (path, a, b)


def error_line(capsys) -> str:
    """The last line on stderr, checked to be one `error:` line with no traceback."""
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("error: ") and "Traceback" not in "\n".join(err)
    return err[-1]
