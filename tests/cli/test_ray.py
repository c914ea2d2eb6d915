"""The Ray engine on a local 2-worker cluster: `sinks --ray --workers 2` equals the
single-process run; a worker that dies is restarted and its shard retried; a
shard that keeps failing ends the run naming it. Every test here starts a Ray
cluster (tens of seconds on two cores), so all are marked slow; the other commands
on the cluster (each its own use of the same engine: 20-50 s apiece) are marked
extended, for make test-extended and CI."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from helpers.shards import EXACT_RTOL, FLOAT32_RTOL, assert_same_json  # noqa: E402
from sinkmech.sharding.ray import ShardFailed, run_on_ray  # noqa: E402
from sinkmech.sharding.format import Partial, shard_span  # noqa: E402
from sinkmech.options import QUIET  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def shutdown_ray():
    yield
    if ray.is_initialized():
        ray.shutdown()


def squares_task(fail_shard: int | None = None, die_once: str | None = None):
    """A model-free task: each prompt's row is its value squared; shard
    `fail_shard` raises every time; with `die_once` (a path), the first shard run
    kills its worker process once."""

    class Squares:
        def load(self):
            return os.getpid()

        def run(self, state, shard, n_shards, index, prompts):
            if die_once is not None and not os.path.exists(die_once):
                open(die_once, "w").close()
                os._exit(1)  # the worker process dies mid-shard
            if shard == fail_shard:
                raise ValueError("planted failure")
            return Partial(kind="squares", settings={"task": "squares"}, n_shards=n_shards, shards=(shard,),
                           n_prompts_total=10, prompt_index=np.asarray(list(index), dtype=np.int64),
                           rows={"sq": np.asarray([p * p for p in prompts], dtype=np.float64)},
                           sums={"n": np.asarray([float(len(prompts))])})

    return Squares()


def test_engine_merges_every_shard_and_retries_a_dead_worker(tmp_path):
    prompts = list(range(10))
    spans = [shard_span(10, i, 4) for i in range(1, 5)]
    written = []
    merged = run_on_ray(squares_task(die_once=str(tmp_path / "died")), prompts, spans,
                        on_part=lambda i, p: written.append(i), options=QUIET)
    assert (tmp_path / "died").exists()  # a worker did die, and its shard was run again
    assert merged.complete and sorted(written) == [1, 2, 3, 4]
    assert np.array_equal(merged.rows["sq"], np.arange(10.0) ** 2) and merged.sums["n"][0] == 10


def test_a_shard_that_keeps_failing_ends_the_run_naming_it():
    spans = [shard_span(10, i, 3) for i in range(1, 4)]
    with pytest.raises(ShardFailed, match=r"shard 2/3 \(prompts 3\.\.5\) failed.*planted failure"):
        run_on_ray(squares_task(fail_shard=2), list(range(10)), spans, options=QUIET)


def test_sinks_on_ray_equals_the_single_process_run(tmp_path, capsys):
    """SmolLM2 (loaded by each worker from the converted-model cache). The single run batches all 6
    prompts in one pass, each shard its own 2: SmolLM2's forward bound (FLOAT32_RTOL)."""
    from sinkmech.cli.main import main

    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(f"Line {i}: the river ran past {i} stone houses and a mill with a red door." for i in range(6)))
    base = ["sinks", "--prompts", str(prompts), "--max-tokens", "16", "--bos", "both", "--eps", "0.3", "0.8"]
    single, dist = tmp_path / "single.json", tmp_path / "ray.json"
    assert main([*base, "--json", str(single)]) == 0
    assert main([*base, "--ray", "--workers", "2", "--shards", "3", "--json", str(dist)]) == 0
    assert_same_json(json.loads(single.read_text()), json.loads(dist.read_text()), tol=FLOAT32_RTOL)
    assert sorted(p.name for p in (tmp_path / "ray.json.shards").iterdir()) == [
        f"shard-{i}-of-3.partial.json" for i in (1, 2, 3)]
    # --resume: every shard is on disk, so no worker starts and the result is the same
    capsys.readouterr()
    again = tmp_path / "ray.json"
    assert main([*base, "--ray", "--workers", "2", "--shards", "3", "--json", str(again), "--resume"]) == 0
    assert "3 of 3 shards already" in capsys.readouterr().err
    assert_same_json(json.loads(single.read_text()), json.loads(again.read_text()), tol=FLOAT32_RTOL)


@pytest.mark.long
def test_heads_and_ablate_on_ray_equal_the_single_process_run(tmp_path):
    """The two other commands with the Ray form, SmolLM2, a few short prompts. The single-process
    run takes the workers' one thread each (Ray's num_cpus=1): float32 sums split over another
    number of threads round differently (ablate at 6 tokens: 2.3e-6 absolute, 2 threads against 1,
    measured); ablate runs a shard's prompts in one batch, so its effects agree to float32
    rounding (SmolLM2's forward bound FLOAT32_RTOL of the largest effect); heads' scan shards batch
    their own prompts too (FLOAT32_RTOL), and the driver runs the no-op check batched as the single
    run does."""
    import torch

    from sinkmech.cli.main import main

    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(f"Note {i}: a cat sat on {i} warm mats by the door of the old mill." for i in range(5)))
    for base in (["heads", "--max-tokens", "16", "--noop", "1", "--noop-prompts", "2"],
                 ["ablate", "--mode", "zero", "--max-tokens", "6", "--n-prompts", "3"]):
        base = [*base, "--prompts", str(prompts)]
        single, dist = tmp_path / f"{base[0]}-single.json", tmp_path / f"{base[0]}-ray.json"
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            assert main([*base, "--json", str(single)]) == 0
        finally:
            torch.set_num_threads(threads)
        assert main([*base, "--ray", "--workers", "2", "--shards", "2", "--json", str(dist)]) == 0
        tol = dict(tol=FLOAT32_RTOL, normwise=base[0] == "ablate")
        assert_same_json(json.loads(single.read_text()), json.loads(dist.read_text()), **tol)


@pytest.mark.extended  # the engine is the one `sinks --ray` checks in make test; here each command's use of it
def test_length_on_ray_equals_the_single_process_run(tmp_path, capsys):
    """Both stages on the cluster (the scores, the heads chosen on the driver, the costs), SmolLM2,
    3 windows of the default corpus cut to 4 and 8 tokens, one top head; the single run batches the 3
    windows in one pass, each shard its own (FLOAT32_RTOL)."""
    from sinkmech.cli.main import main

    base = ["length", "--lengths", "4", "8", "--n-prompts", "3", "--top", "1"]
    single, dist = tmp_path / "single.json", tmp_path / "ray.json"
    assert main([*base, "--json", str(single)]) == 0
    want = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert main([*base, "--ray", "--workers", "2", "--shards", "3", "--json", str(dist)]) == 0
    assert [line for line in capsys.readouterr().out.splitlines() if line.strip()] == want  # the same table
    assert_same_json(json.loads(single.read_text()), json.loads(dist.read_text()), tol=FLOAT32_RTOL)
    for stage in ("scores", "costs"):
        assert sorted(p.name for p in (tmp_path / "ray.json.shards" / stage).iterdir()) == [
            f"shard-{i}-of-3.partial.json" for i in (1, 2, 3)]
    # the costs parts alone merge to the result, as with --shard
    merged = tmp_path / "merged.json"
    assert main(["merge", *map(str, (tmp_path / "ray.json.shards" / "costs").iterdir()), "--json", str(merged)]) == 0
    assert_same_json(json.loads(single.read_text()), json.loads(merged.read_text()), tol=FLOAT32_RTOL)
    capsys.readouterr()
    assert main([*base, "--ray", "--workers", "2", "--shards", "3", "--json", str(dist), "--resume"]) == 0
    assert capsys.readouterr().err.count("3 of 3 shards already") == 2  # no worker starts in either stage


@pytest.mark.extended
@pytest.mark.parametrize(("args", "tol"), [
    # patch: its clean runs take all of a shard's prompts in one pass whatever --batch-size, so
    # 3 prompts against 1 round differently in float32: KLs agree to 3.4e-6 relative (measured),
    # within SmolLM2's forward bound of each array's largest value (FLOAT32_RTOL, helpers/shards.py)
    (["patch", "--act", "resid_pre", "--layers", "0", "1", "2", "--max-tokens", "6", "--n-prompts", "3"], FLOAT32_RTOL),
    (["perturb", "--noise", "0.5", "--position", "2", "--seed", "1", "--max-tokens", "8", "--n-prompts", "3"],
     EXACT_RTOL),
    (["massive", "--no-reset", "--max-tokens", "8", "--n-prompts", "3"], EXACT_RTOL),
], ids=["patch", "perturb", "massive"])
def test_patch_perturb_and_massive_on_ray_equal_the_single_process_run(tmp_path, args, tol):
    """SmolLM2, 3 short prompts, 2 workers and 3 shards of one prompt: with --batch-size 1 both
    runs make the same forward passes, so they agree to EXACT_RTOL (batched differently, SmolLM2's
    float32 sums differ by up to ~2e-6 relative, past it)."""
    from sinkmech.cli.main import main

    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(f"Row {i}: a boat took {i} crates of apples across the lake to the market." for i in range(3)))
    base = [*args, "--prompts", str(prompts), "--batch-size", "1"]
    single, dist = tmp_path / "single.json", tmp_path / "ray.json"
    assert main([*base, "--json", str(single)]) == 0
    assert main([*base, "--ray", "--workers", "2", "--shards", "3", "--json", str(dist)]) == 0
    assert_same_json(json.loads(single.read_text()), json.loads(dist.read_text()), tol=tol, normwise=args[0] == "patch")
    assert len(list((tmp_path / "ray.json.shards").iterdir())) == 3
