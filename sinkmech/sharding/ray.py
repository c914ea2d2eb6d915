"""Shards on a Ray cluster: an actor pool, one model per worker loaded once.

The prompts are cut into shards (`sinkmech.sharding.format.shard_span`); each shard's
prompts are sent to a free worker, which runs the analysis on them and returns
its `Partial`; the driver writes each part as it arrives (whole or not at all,
so `--resume` can skip it) and merges them. A worker that dies is restarted by
Ray and its shard retried (`max_restarts`, `max_task_retries`); a shard that
still fails ends the run with an error that names it, never a merged result
that silently lacks prompts. Needs `pip install "sinkmech[ray]"`.

A cluster that does not answer never hangs a run: an address is probed (a TCP
connection to its port) and `ray.init` waited on for at most `timeout` seconds
(`ClusterUnreachable`); a cluster whose head stops answering mid-run ends it
with the shards already finished (`ClusterLost`), which `--resume` keeps. A
loopback address keeps Ray on loopback (the driver's own address too).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from tqdm.auto import tqdm

from sinkmech.options import RunOptions
from sinkmech.sharding.format import Partial, merge

OBJECT_STORE_BYTES = 200 * 1024**2  # a local cluster's object store: parts are small
RAY_TIMEOUT_S = 60.0  # how long a cluster may take to answer (`--ray-timeout`)
POLL_S = 5.0  # while shards run: how often the head is checked when no part has arrived
# Ray takes a loopback address (and a local cluster) to the machine's interface
# address unless it believes clusters are off (its setting for Windows and macOS,
# which keeps every node address on 127.0.0.1): `keep_on_loopback` says so.
RAY_CLUSTER_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@dataclass(frozen=True)
class RayCluster:
    """Where and how shards run on Ray: the cluster's `address` (None: a local
    cluster started for the run), `workers` (one actor each, one model each), the
    GPUs each worker asks for, Ray's retries of a dead worker and of its shard, and
    the seconds the cluster may take to answer (`ClusterUnreachable` after them)."""

    address: str | None = None
    workers: int = 2
    num_gpus_per_worker: float = 0.0
    max_retries: int = 2
    timeout: float = RAY_TIMEOUT_S


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


class ClusterUnreachable(RuntimeError):
    """No Ray cluster answered at the address within the timeout."""


class ClusterLost(RuntimeError):
    """The cluster's head stopped answering mid-run; `done` holds the shard
    numbers whose parts arrived (and were handed to `on_part`) before it did."""

    def __init__(self, message: str, done: Sequence[int], n_shards: int) -> None:
        super().__init__(message)
        self.done, self.n_shards = tuple(done), n_shards


def host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of a "host:port" or "ray://host:port" address; None for
    "auto" and anything else Ray resolves itself."""
    text = address.removeprefix("ray://")
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def answers(host: str, port: int, timeout: float) -> bool:
    """Whether something accepts a TCP connection at host:port within `timeout` seconds."""
    try:
        with socket.create_connection((host, port), timeout=max(timeout, 0.05)):
            return True
    except OSError:
        return False


def is_loopback(host: str) -> bool:
    return host == "localhost" or host.startswith("127.") or host == "::1"


def wait_for_address(address: str, timeout: float) -> None:
    """Return once `address` (host:port) accepts a connection, trying every
    second; `ClusterUnreachable` naming it after `timeout` seconds."""
    hp = host_port(address)
    if hp is None:
        return
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if answers(*hp, timeout=min(2.0, left)):
            return
        if time.monotonic() + 1.0 >= deadline:
            raise ClusterUnreachable(
                f"no Ray cluster answers at {address}: nothing accepted a connection on {hp[0]}:{hp[1]} within "
                f"{timeout:g} s (start one with `ray start --head`, check the address, or raise --ray-timeout)")
        time.sleep(1.0)


def keep_on_loopback(ray) -> None:
    """Keep Ray's node addresses on 127.0.0.1 in this process and in the processes
    it starts (a local cluster, or a driver joining a head on loopback)."""
    os.environ[RAY_CLUSTER_SWITCH] = "0"  # read by the processes Ray starts
    try:  # this process read the setting when it imported Ray
        ray._private.ray_constants.ENABLE_RAY_CLUSTER = False
    except AttributeError:
        pass


def init_within(ray, wait: float, where: str, *, timeout: float | None = None, **kwargs) -> None:
    """`ray.init(**kwargs)` run in a thread and waited on for `wait` seconds (Ray
    itself retries an address that does not answer for minutes); the errors name
    `where`, the address, and `timeout`, the whole run's limit (default `wait`)."""
    outcome: dict = {}

    def run() -> None:
        try:
            ray.init(**kwargs)
            outcome["ok"] = True
        except BaseException as e:  # handed to the caller's thread below
            outcome["error"] = e

    thread = threading.Thread(target=run, name="ray-init", daemon=True)
    thread.start()
    thread.join(max(wait, 0.0))
    if "error" in outcome:
        e = outcome["error"]
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ClusterUnreachable(f"could not connect to the Ray cluster at {where}: {reason}") from None
    if "ok" not in outcome:
        raise ClusterUnreachable(f"the Ray cluster at {where} did not answer within {timeout or wait:g} s "
                                 "(check the address, or raise --ray-timeout)")


def require_ray():
    try:
        import ray
    except ImportError:
        raise RuntimeError('--ray needs Ray: pip install "sinkmech[ray]"') from None
    return ray


def start_ray(address: str | None, workers: int, *, timeout: float = RAY_TIMEOUT_S):
    """Connect to the cluster at `address` ("auto" or host:port), or start a small
    local one (`workers` CPUs, a 200 MB object store, on loopback) whose workers
    import this very sinkmech. An address that does not answer within `timeout`
    seconds raises `ClusterUnreachable` naming it."""
    ray = require_ray()
    if ray.is_initialized():
        return ray
    if address in (None, "local"):
        import sinkmech

        root = str(Path(sinkmech.__file__).resolve().parent.parent)
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
        keep_on_loopback(ray)
        ray.init(num_cpus=workers, object_store_memory=OBJECT_STORE_BYTES, include_dashboard=False,
                 log_to_driver=False, configure_logging=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
        return ray
    start = time.monotonic()
    wait_for_address(address, timeout)
    hp = host_port(address)
    if hp is not None and is_loopback(hp[0]):
        keep_on_loopback(ray)
    init_within(ray, timeout - (time.monotonic() - start), address, timeout=timeout, address=address,
                log_to_driver=False, configure_logging=False)
    return ray


def head_answers(ray) -> bool:
    """Whether the connected cluster's head (its GCS) still accepts a connection."""
    try:
        hp = host_port(ray.get_runtime_context().gcs_address)
    except Exception:  # no address to probe: assume it answers, Ray will say otherwise
        return True
    return hp is None or answers(*hp, timeout=2.0)


def run_on_ray(
    task: ShardTask,
    prompts: Sequence,
    spans: Sequence[range],
    *,
    cluster: RayCluster = RayCluster(),
    done: dict[int, Partial] | None = None,
    on_part: Callable[[int, Partial], None] | None = None,
    options: RunOptions = RunOptions(),
) -> Partial:
    """Run `task` on every shard not in `done` with the cluster's workers (Ray actors) and merge.

    Args:
        prompts: the whole corpus (each shard's prompts are sent with its call).
        spans: the shards' global prompt indices (shard i is `spans[i - 1]`).
        done: shard number -> part already on disk (skipped, merged in).
        cluster: the cluster, its workers and retries (`RayCluster`).
        on_part: called with (shard number, part) as each part arrives (the CLI
            writes it there).
        options: a progress bar over the prompts.

    Returns:
        The merged part (complete: every shard).

    Raises:
        ShardFailed: a shard failed after Ray's retries.
        ClusterUnreachable: no cluster answered at `address` in time.
        ClusterLost: the head stopped answering mid-run (`.done`: the shards
            whose parts arrived, `done` included).
    """
    ray = require_ray()
    address, workers, timeout = cluster.address, cluster.workers, cluster.timeout
    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    done = dict(done or {})
    todo = [i for i in range(1, len(spans) + 1) if i not in done]
    parts = dict(done)
    if todo:
        start_ray(address, workers, timeout=timeout)

        Worker = ray.remote(max_restarts=cluster.max_retries, max_task_retries=cluster.max_retries)(ShardWorker)
        actors = [Worker.options(num_cpus=1, num_gpus=cluster.num_gpus_per_worker).remote(task)
                  for _ in range(min(workers, len(todo)))]
        pending: dict = {}  # ObjectRef -> (shard, actor)

        def submit(actor) -> None:
            i = todo.pop(0)
            span = spans[i - 1]
            ref = actor.run.remote(i, len(spans), span, [prompts[j] for j in span])
            pending[ref] = (i, actor)

        bar = tqdm(total=sum(len(s) for s in spans), initial=sum(len(spans[i - 1]) for i in done),
                   desc="prompts", unit="prompt", disable=not options.progress)
        lost = None

        def head_gone() -> ClusterLost | None:
            """The error to end the run with when the head no longer answers."""
            if head_answers(ray):
                return None
            where = f" at {address}" if address not in (None, "local") else ""
            return ClusterLost(f"the Ray cluster{where} stopped answering after {len(parts)} of {len(spans)} shards",
                               sorted(parts), len(spans))

        try:
            for actor in actors:
                if todo:
                    submit(actor)
            while pending:
                try:
                    ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
                except Exception:
                    lost = head_gone()
                    if lost is not None:
                        raise lost from None
                    raise
                if not ready:  # nothing finished for a while: is the head still there?
                    lost = head_gone()
                    if lost is not None:
                        raise lost
                    continue
                i, actor = pending.pop(ready[0])
                try:
                    part = ray.get(ready[0])
                except ray.exceptions.RayError as e:  # the worker's error, or its death: name the shard
                    lost = head_gone()
                    if lost is not None:
                        raise lost from None
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
            if lost is None:  # a lost cluster cannot be asked to stop its actors
                for actor in actors:
                    ray.kill(actor)
    merged = merge([parts[i] for i in sorted(parts)], [f"shard {i}" for i in sorted(parts)])
    merged.check_complete()
    return merged
