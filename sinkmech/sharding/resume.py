"""Provenance and resume for sharded runs: the settings every part of one run
records (the model file's and the prompts' SHA256, the sinkmech version), so that
`sinkmech merge` only merges like with like, and `already_done`, which lets a run
skip a shard whose part is already on disk with the same settings. The command
line's `--shard` and `--resume` use these; so can a Python caller that cuts its
own shards.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

from sinkmech.files import json_text
from sinkmech.sharding.format import PartialError, differing_setting, read_partial


@dataclass(frozen=True)
class ShardRun:
    """Shard I of N: the global indices of its prompts and the settings known before the model loads."""

    i: int
    n: int
    index: range
    n_total: int
    settings: dict


def sinkmech_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sinkmech")
    except PackageNotFoundError:
        return "unknown"


def model_sha256(spec: str) -> str | None:
    """sha256 of the model's file (memoized by the model cache), None for a model
    known by name only (a TransformerLens download or a packaged model)."""
    from sinkmech.loading.cache import ModelCache
    from sinkmech.loading.models import DEFAULT_MODEL, smollm2_path

    path = smollm2_path() if spec == DEFAULT_MODEL else Path(spec)
    return ModelCache().file_sha256(path) if path.is_file() else None


def prompts_sha256(prompts) -> str:
    return hashlib.sha256(json_text(prompts, indent=None, ensure_ascii=False).encode("utf-8")).hexdigest()


def run_settings(command: str, model: str, prompts, *, max_tokens: int | None, bos_token: str | None = None,
                 **extra) -> dict:
    """The settings every part of one run shares, known before the model loads: the
    command, the model spec and its file's SHA256, the prompts' SHA256, the
    content tokens per prompt, the `<bos>` token asked for and the sinkmech version;
    `extra` adds the command's own."""
    return {
        "command": command,
        "model": model,
        "model_sha256": model_sha256(model),
        "prompts_sha256": prompts_sha256(prompts),
        "max_tokens": max_tokens,
        "bos_token": bos_token,
        "sinkmech_version": sinkmech_version(),
        **extra,
    }


def already_done(path: Path, run: ShardRun, kind: str) -> bool:
    """With --resume: the part at `path` is whole, of this analysis and shard, and
    shares every setting known before the model loads."""
    if not path.exists():
        return False
    try:
        part = read_partial(path)
    except PartialError as e:
        print(f"resume: {e}; running the shard again", file=sys.stderr)
        return False
    if part.kind != kind or part.shards != (run.i,) or part.n_shards != run.n:
        print(f"resume: {path} holds another shard or analysis; running the shard again", file=sys.stderr)
        return False
    have = {k: part.settings.get(k) for k in run.settings}
    diff = differing_setting(run.settings, have)
    if diff is not None:
        print(f"resume: {path} was run with another '{diff[0]}'; running the shard again", file=sys.stderr)
        return False
    return True
