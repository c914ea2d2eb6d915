"""Shards on a Ray cluster: an actor pool, one model per worker loaded once.

The prompts are cut into shards (`sinkmech.partial.shard_span`); each shard's
prompts are sent to a free worker, which runs the analysis on them and returns
its `Partial`; the driver writes each part as it arrives (whole or not at all,
so `--resume` can skip it) and merges them. A worker that dies is restarted by
Ray and its shard retried (`max_restarts`, `max_task_retries`); a shard that
still fails ends the run with an error that names it, never a merged result
that silently lacks prompts. Needs `pip install "sinkmech[ray]"`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from tqdm.auto import tqdm

from sinkmech.partial import Partial, merge

OBJECT_STORE_BYTES = 200 * 1024**2  # a local cluster's object store: parts are small


@runtime_checkable
class ShardTask(Protocol):
    """What a worker runs: `load()` once per worker (the model), then `run(state,
    shard, n_shards, index, prompts)` per shard, returning the shard's part."""

    def load(self): ...

    def run(self, state, shard: int, n_shards: int, index: range, prompts: list) -> Partial: ...


class ShardWorker:
    """One Ray actor: loads the task's model once, then runs shard after shard."""

    def __init__(self, task: ShardTask) -> None:
        self.task, self.state = task, task.load()

    def run(self, shard: int, n_shards: int, index: range, prompts: list) -> Partial:
        return self.task.run(self.state, shard, n_shards, index, prompts)


class ShardFailed(RuntimeError):
    """A shard failed even after Ray's retries."""


def require_ray():
    try:
        import ray
    except ImportError:
        raise RuntimeError('--ray needs Ray: pip install "sinkmech[ray]"') from None
    return ray


def start_ray(address: str | None, workers: int):
    """Connect to the cluster at `address` ("auto" or host:port), or start a small
    local one (`workers` CPUs, a 200 MB object store) whose workers import this
    very sinkmech."""
    ray = require_ray()
    if ray.is_initialized():
        return ray
    if address in (None, "local"):
        import sinkmech

        root = str(Path(sinkmech.__file__).resolve().parent.parent)
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
        ray.init(num_cpus=workers, object_store_memory=OBJECT_STORE_BYTES, include_dashboard=False,
                 log_to_driver=False, configure_logging=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
    else:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    return ray


def run_on_ray(
    task: ShardTask,
    prompts: Sequence,
    spans: Sequence[range],
    *,
    address: str | None = None,
    workers: int = 2,
    num_gpus_per_worker: float = 0.0,
    done: dict[int, Partial] | None = None,
    on_part: Callable[[int, Partial], None] | None = None,
    max_retries: int = 2,
    progress: bool = True,
) -> Partial:
    """Run `task` on every shard not in `done` with `workers` Ray actors and merge.

    Args:
        prompts: the whole corpus (each shard's prompts are sent with its call).
        spans: the shards' global prompt indices (shard i is `spans[i - 1]`).
        done: shard number -> part already on disk (skipped, merged in).
        on_part: called with (shard number, part) as each part arrives (the CLI
            writes it there).
        max_retries: Ray's restarts of a dead worker and retries of its shard.

    Returns:
        The merged part (complete: every shard).
    """
    ray = require_ray()
    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    done = dict(done or {})
    todo = [i for i in range(1, len(spans) + 1) if i not in done]
    parts = dict(done)
    if todo:
        start_ray(address, workers)

        Worker = ray.remote(max_restarts=max_retries, max_task_retries=max_retries)(ShardWorker)
        actors = [Worker.options(num_cpus=1, num_gpus=num_gpus_per_worker).remote(task)
                  for _ in range(min(workers, len(todo)))]
        pending: dict = {}  # ObjectRef -> (shard, actor)

        def submit(actor) -> None:
            i = todo.pop(0)
            span = spans[i - 1]
            ref = actor.run.remote(i, len(spans), span, [prompts[j] for j in span])
            pending[ref] = (i, actor)

        bar = tqdm(total=sum(len(s) for s in spans), initial=sum(len(spans[i - 1]) for i in done),
                   desc="prompts", unit="prompt", disable=not progress)
        try:
            for actor in actors:
                if todo:
                    submit(actor)
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                i, actor = pending.pop(ready[0])
                try:
                    part = ray.get(ready[0])
                except ray.exceptions.RayError as e:  # the worker's error, or its death: name the shard
                    reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
                    raise ShardFailed(f"shard {i}/{len(spans)} (prompts {spans[i - 1].start}.."
                                      f"{spans[i - 1].stop - 1}) failed after Ray's retries: {reason}") from None
                parts[i] = part
                if on_part is not None:
                    on_part(i, part)
                bar.update(len(spans[i - 1]))
                if todo:
                    submit(actor)
        finally:
            bar.close()
            for actor in actors:
                ray.kill(actor)
    merged = merge([parts[i] for i in sorted(parts)], [f"shard {i}" for i in sorted(parts)])
    merged.check_complete()
    return merged
