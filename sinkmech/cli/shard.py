"""What the sharded forms of the corpus-level commands share: `--shard I/N`,
`--resume`, `--ray [ADDRESS]`, `--workers K`, `--num-gpus-per-worker G`, and the
settings a part records so that `sinkmech merge` only merges like with like.

`--shard I/N` runs the command on shard I (1-based) of N contiguous shards of
the prompts and writes a partial (`--json NAME.partial.json`, see
`sinkmech.sharding.format`) instead of the result; `sinkmech merge` writes the result.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from sinkmech.cli.common import (
    FlagValueError, UsageError, answers, bos_token_arg, non_negative_float, positive_float, positive_int,
)
from sinkmech.sharding.format import SUFFIX, parse_shard, read_partial, shard_span
from sinkmech.sharding.resume import ShardRun, already_done, run_settings


def add_shard_flags(p: argparse.ArgumentParser, *, ray: bool = False) -> None:
    p.add_argument("--shard", type=shard_spec, default=None, metavar="I/N",
                   help="run on shard I (1-based) of N contiguous shards of the prompts and write a partial result "
                        f"to --json (a name ending in {SUFFIX}); `sinkmech merge` joins the parts")
    p.add_argument("--resume", action="store_true",
                   help="skip the work whose partial is already on disk with the same settings")
    if ray:
        p.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                       help="run the shards on a Ray cluster (ADDRESS, or 'auto'; a local one when no address is "
                            "given); needs `pip install \"sinkmech[ray]\"`")
        p.add_argument("--ray-timeout", type=positive_float, default=60.0, metavar="SECONDS",
                       help="with --ray ADDRESS: end the run with an error when no cluster answers there within this "
                            "many seconds (default 60)")
        p.add_argument("--workers", type=positive_int, default=2, help="with --ray: model workers (one model each; default 2)")
        p.add_argument("--num-gpus-per-worker", type=non_negative_float, default=0.0, help="with --ray: GPUs per worker (default 0)")
        p.add_argument("--shards", type=positive_int, default=None,
                       help="with --ray: how many shards the prompts are cut into (default 4 per worker); each "
                            "finished shard is written to OUT.shards/ as it finishes, so --resume loses at most one")


def shard_spec(text: str) -> tuple[int, int]:
    """A flag type: 'I/N' (1-based, 1 <= I <= N) -> (I, N)."""
    try:
        return parse_shard(text)
    except ValueError:
        raise FlagValueError(f"is written I/N with 1 <= I <= N, e.g. 2/8; got {text!r}") from None


@dataclass(frozen=True, kw_only=True)
class ModelTask:
    """What every command's shard task (`sinkmech.sharding.ray.ShardTask`) holds: the
    model to load on each worker and the settings its parts record. A subclass adds
    the command's fields and its `run`; `from_args` fills the shared ones."""

    model: str
    device: str | None
    dtype: str
    max_tokens: int
    n_prompts_total: int
    settings: dict

    @classmethod
    def from_args(cls, args, prompts, settings: dict, **fields):
        """The task of a parsed command line over `prompts` (all of them: the corpus the shards cut)."""
        return cls(model=args.model, device=args.device, dtype=args.dtype, max_tokens=args.max_tokens,
                   n_prompts_total=len(prompts), settings=settings, **fields)

    def load_model(self):
        from sinkmech.loading import models

        return models.load_model(self.model, device=self.device, dtype=self.dtype,
                                 n_ctx=max(2048, self.max_tokens + 1))

    def load(self):
        return self.load_model()

    def where(self, shard: int, n_shards: int, index: range) -> dict:
        """The keywords that place a part in the corpus (`sinkmech.sharding.format`)."""
        return {"prompt_index": index, "shard": (shard, n_shards), "n_prompts_total": self.n_prompts_total}


@dataclass(frozen=True, kw_only=True)
class BosTokenTask(ModelTask):
    """A task whose worker state is (model, the --bos-token id or None)."""

    bos_token: str | None

    @classmethod
    def from_args(cls, args, prompts, settings: dict, **fields):
        return super().from_args(args, prompts, settings, bos_token=args.bos_token, **fields)

    def load(self):
        model = self.load_model()
        return model, bos_token_arg(model, argparse.Namespace(bos_token=self.bos_token))


@dataclass(frozen=True, kw_only=True)
class AnswersTask(ModelTask):
    """A task whose worker state is (model, the --answers token ids or None)."""

    answers: tuple[str, str] | None

    @classmethod
    def from_args(cls, args, prompts, settings: dict, **fields):
        return super().from_args(args, prompts, settings, answers=tuple(args.answers) if args.answers else None,
                                 **fields)

    def load(self):
        model = self.load_model()
        return model, answers(model, argparse.Namespace(answers=self.answers))


def base_settings(args, prompts, **extra) -> dict:
    """The settings every part of one run shares, known before the model loads."""
    return run_settings(args.command, args.model, prompts, max_tokens=args.max_tokens,
                        bos_token=getattr(args, "bos_token", None), **extra)


def model_settings(model) -> dict:
    """The settings that need the model: its backend and dtype."""
    return {"backend": type(model).__name__, "dtype": str(getattr(model.cfg, "dtype", None))}


def check_shard_flags(args) -> None:
    """The sharding flags' conflicts that need no prompts, refused before the
    prompts are read (`main` calls it for every command with --shard)."""
    ray = getattr(args, "ray", None)
    if ray is not None and args.shard is not None:
        raise UsageError("--shard runs one shard here; --ray runs them all on a cluster: give one of them")
    if args.resume and ray is None and args.shard is None and getattr(args, "scores", None) is None:
        raise UsageError("--resume needs --shard I/N or --ray")
    if args.shard is not None:
        check_part_output(args)


def shard_run(args, prompts, **extra) -> ShardRun | None:
    """`--shard I/N` checked and resolved (None without it); checks the flags it
    cannot be combined with, before any model loads."""
    if getattr(args, "ray", None) is not None:
        return None
    if args.shard is None:
        if args.resume:
            raise UsageError("--resume needs --shard I/N or --ray")
        return None
    i, n = args.shard
    try:
        span = shard_span(len(prompts), i, n)
    except ValueError as e:
        raise UsageError(str(e)) from None
    check_part_output(args)
    return ShardRun(i, n, span, len(prompts), base_settings(args, prompts, **extra))


def check_part_output(args) -> None:
    if args.json is None or str(args.json) == "-" or not str(args.json).endswith(SUFFIX):
        raise UsageError(f"--shard writes a partial result: give --json a file name ending in {SUFFIX}")
    if getattr(args, "png", None) is not None:
        raise UsageError("a shard draws no figure: pass --png to `sinkmech merge`")
    if getattr(args, "findings", None) is not None:
        raise UsageError("--findings needs the whole corpus: not with --shard")


def run_command_on_ray(args, prompts, task, kind: str, settings: dict, *, stage: str | None = None):
    """`--ray`: the prompts cut into `--shards` (default 4 per worker) shards, run by
    `task` on `--workers` Ray actors; each part written to JSON.shards/ (or, for a
    command run in stages, JSON.shards/STAGE/) as it arrives (`--resume` skips the
    parts already there); returns the merged part."""
    from sinkmech.sharding.ray import ClusterLost, RayCluster, require_ray, run_on_ray
    from sinkmech.sharding.format import write_partial

    try:
        require_ray()
    except RuntimeError as e:  # Ray not installed: a flag this install cannot honour (exit 2, before any work)
        raise UsageError(str(e)) from None
    if args.shard is not None:
        raise UsageError("--shard runs one shard here; --ray runs them all on a cluster: give one of them")
    n = min(args.shards or 4 * args.workers, len(prompts))
    spans = [shard_span(len(prompts), i, n) for i in range(1, n + 1)]
    folder = None if args.json is None or str(args.json) == "-" else Path(f"{args.json}.shards")
    if folder is not None and stage is not None:
        folder = folder / stage
    if args.resume and folder is None:
        raise UsageError("--resume with --ray needs --json OUT (the finished shards are kept in OUT.shards/)")

    def path(i: int) -> Path:
        return folder / f"shard-{i}-of-{n}{SUFFIX}"

    done = {}
    if args.resume:
        done = {i: read_partial(path(i)) for i in range(1, n + 1)
                if already_done(path(i), ShardRun(i, n, spans[i - 1], len(prompts), settings), kind)}
        if done:
            print(f"resume: {len(done)} of {n} shards already in {folder}", file=sys.stderr)
    try:
        cluster = RayCluster(address=None if args.ray == "local" else args.ray, workers=args.workers,
                             num_gpus_per_worker=args.num_gpus_per_worker, timeout=args.ray_timeout)
        return run_on_ray(task, prompts, spans, cluster=cluster, done=done,
                          on_part=(lambda i, part: write_partial(path(i), part)) if folder is not None else None)
    except ClusterLost as e:
        raise RuntimeError(lost_message(e, folder)) from None


def lost_message(e, folder: Path | None) -> str:
    """What a run whose cluster stopped answering says: which shards are on disk
    and how `--resume` picks up the rest."""
    if folder is None:
        return f"{e}; nothing was kept (give --json OUT to keep finished shards in OUT.shards/ for --resume)"
    kept = ", ".join(map(str, e.done)) if e.done else "none"
    return (f"{e}; shards written to {folder}: {kept} (of {e.n_shards}); run the same command with --resume, "
            f"on a cluster that answers, to compute the other {e.n_shards - len(e.done)}")


def run_shard(args, prompts, run: ShardRun, task, kind: str) -> None:
    """`--shard I/N`: `task` on shard I's prompts, its part written to --json
    (skipped with --resume when that part is already on disk)."""
    from sinkmech.sharding.format import write_partial

    if args.resume and already_done(args.json, run, kind):
        print(f"shard {run.i}/{run.n} is already in {args.json}: skipped (--resume)", file=sys.stderr)
        return
    print(f"shard {run.i}/{run.n}: prompts {run.index.start}..{run.index.stop - 1} of {run.n_total}", file=sys.stderr)
    part = task.run(task.load(), run.i, run.n, run.index, [prompts[i] for i in run.index])
    print(f"wrote {write_partial(args.json, part)}", file=sys.stderr)


def sharded(args, prompts, kind: str, make_task, finish, **extra) -> bool:
    """The sharded forms of a command: with --ray, the shards on a cluster and
    `finish(merged part, args)`; with --shard, one shard's part. `make_task(settings)`
    builds the command's task (`sinkmech.sharding.ray.ShardTask`). Returns False
    (nothing done) without either flag."""
    if getattr(args, "ray", None) is not None:
        settings = base_settings(args, prompts, **extra)
        finish(run_command_on_ray(args, prompts, make_task(settings), kind, settings), args)
        return True
    run = shard_run(args, prompts, **extra)
    if run is None:
        return False
    run_shard(args, prompts, run, make_task(run.settings), kind)
    return True
