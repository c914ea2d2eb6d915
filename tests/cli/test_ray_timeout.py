"""Ray that fails clearly: an address where nothing answers ends the run within
--ray-timeout with one `error:` line naming it (exit 1, the model never loaded);
a head that stops answering mid-run ends it naming the shards already written,
and `--resume` then computes only the rest and equals the single-process run.
Nothing here starts a Ray cluster: the first test only probes a loopback port
where nothing listens, the others run the shard loop against a stand-in for
Ray whose head answers or not."""

from __future__ import annotations

import json
import socket
import threading
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("ray")

from helpers.tiny import TINY_BOS  # noqa: E402
from sinkmech.loading import models  # noqa: E402
from sinkmech.sharding import ray as distributed  # noqa: E402
from sinkmech.cli.main import main  # noqa: E402
from sinkmech.prompts import tokenize  # noqa: E402
from helpers.same_json import assert_same_json  # noqa: E402


def free_port() -> int:
    """A loopback port where nothing listens (bound once, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_address_where_nothing_answers_ends_within_the_timeout(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    prompts = tmp_path / "p.txt"
    prompts.write_text("one prompt here\nanother prompt there\n")
    address = f"127.0.0.1:{free_port()}"
    start = time.monotonic()
    assert main(["sinks", "--prompts", str(prompts), "--ray", address, "--ray-timeout", "2",
                 "--json", str(tmp_path / "s.json")]) == 1
    elapsed = time.monotonic() - start
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: no Ray cluster answers at {address}"), err
    assert "within 2 s" in err[0]
    assert elapsed < 30, elapsed  # bounded by the timeout (Ray alone retries for minutes)
    assert not (tmp_path / "s.json").exists()


def test_ray_init_that_never_returns_is_abandoned_after_the_timeout():
    """An address that accepts connections but is no Ray head: `ray.init` would wait for minutes."""
    release = threading.Event()
    never = SimpleNamespace(init=lambda **kw: release.wait(60))
    try:
        with pytest.raises(distributed.ClusterUnreachable, match=r"at 10\.0\.0\.1:6379 did not answer within 0\.5 s"):
            distributed.init_within(never, 0.5, "10.0.0.1:6379", address="10.0.0.1:6379")
        failing = SimpleNamespace(init=lambda **kw: (_ for _ in ()).throw(ConnectionError("refused\nmore")))
        with pytest.raises(distributed.ClusterUnreachable, match=r"could not connect .* at h:1: refused$"):
            distributed.init_within(failing, 5.0, "h:1", address="h:1")
    finally:
        release.set()


class Ref:
    """A stand-in ObjectRef: hashable, its value computed when asked."""

    def __init__(self, value) -> None:
        self.value = value


class StandInRay:
    """What `run_on_ray` asks of Ray, run in this process: an actor runs its shard
    when asked for the result; after `answer_for` parts the head stops answering
    (nothing more finishes, and its address refuses connections)."""

    class RayError(Exception):
        pass

    exceptions = SimpleNamespace(RayError=RayError)

    def __init__(self, answer_for: int | None = None) -> None:
        self.answer_for, self.delivered = answer_for, 0
        self.gcs = f"127.0.0.1:{free_port()}"

    def is_initialized(self) -> bool:
        return True

    def remote(self, **_):
        def wrap(cls):
            def start(task):
                worker = cls(task)
                call = lambda *a: Ref(lambda: worker.run(*a))  # noqa: E731
                return SimpleNamespace(run=SimpleNamespace(remote=call))

            return SimpleNamespace(options=lambda **_: SimpleNamespace(remote=start))

        return wrap

    def wait(self, refs, num_returns=1, timeout=None):
        if self.answer_for is not None and self.delivered >= self.answer_for:
            return [], refs
        self.delivered += 1
        return refs[:1], refs[1:]

    def get(self, ref):
        return ref.value()

    def kill(self, actor) -> None:
        pass

    def get_runtime_context(self):
        alive = self.answer_for is None or self.delivered < self.answer_for
        return SimpleNamespace(gcs_address=self.gcs if not alive else "auto")  # "auto": nothing to probe


def test_a_head_that_dies_names_the_shards_written_and_resume_finishes(tiny_model, tmp_path, monkeypatch, capsys):
    def by_numbers(model, prompts, *, bos, max_tokens, **kw):
        return tokenize(model, [[int(w) for w in p.split()] for p in prompts], bos=bos, max_tokens=max_tokens,
                        bos_token_id=TINY_BOS)

    monkeypatch.setattr(models, "load_model", lambda spec, **kw: tiny_model)
    monkeypatch.setattr("sinkmech.prompts.tokenize", by_numbers)
    monkeypatch.setattr(distributed, "POLL_S", 0.01)
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(" ".join(str(2 + (k * i + 3 * k) % 47) for i in range(10)) for k in range(1, 7)))
    base = ["sinks", "--prompts", str(prompts), "--max-tokens", "8", "--bos", "both"]
    single, dist = tmp_path / "single.json", tmp_path / "ray.json"
    assert main([*base, "--json", str(single)]) == 0

    ray = StandInRay(answer_for=1)
    monkeypatch.setattr(distributed, "require_ray", lambda: ray)
    capsys.readouterr()
    assert main([*base, "--ray", "127.0.0.1:6379", "--workers", "1", "--shards", "3", "--json", str(dist)]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: the Ray cluster at 127.0.0.1:6379 stopped answering after 1 of 3 shards"), err
    assert f"shards written to {dist}.shards: 1 (of 3)" in err and "--resume" in err and "the other 2" in err
    assert [p.name for p in (tmp_path / "ray.json.shards").iterdir()] == ["shard-1-of-3.partial.json"]
    assert not dist.exists()

    ray = StandInRay()  # a cluster that answers: --resume runs shards 2 and 3 only
    monkeypatch.setattr(distributed, "require_ray", lambda: ray)
    assert main([*base, "--ray", "127.0.0.1:6379", "--workers", "1", "--shards", "3", "--json", str(dist),
                 "--resume"]) == 0
    assert "1 of 3 shards already" in capsys.readouterr().err and ray.delivered == 2
    assert_same_json(json.loads(single.read_text()), json.loads(dist.read_text()))


@pytest.mark.slow
def test_a_local_cluster_stays_on_loopback():
    """Ray would otherwise put its nodes on the machine's interface address."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    try:
        distributed.start_ray(None, 1)
        assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")
        assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
    finally:
        ray.shutdown()
