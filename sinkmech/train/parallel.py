"""Training a study's runs: each run's log is reused when one with exactly the
same config is already under `out/logs/<study>/`, the others train
`settings.jobs` at a time in separate processes (spawned: each has its own
torch threads), and every new log is saved as it finishes."""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from sinkmech.files import json_text, write_text
from sinkmech.options import QUIET, RunOptions
from sinkmech.train.config import TrainConfig
from sinkmech.train.presets import StudySettings

Spec = tuple[TrainConfig, str, str]  # (config, study, run name)


def read_json(path: Path):
    return json.loads(Path(path).read_text())


def same_config(log: dict, cfg: TrainConfig) -> bool:
    """The log's run had exactly `cfg`: a field the log predates ran with its
    default, so the log's config is read through `TrainConfig.from_dict`."""
    try:
        return TrainConfig.from_dict(log["config"]) == cfg
    except (ValueError, TypeError):
        return False


def reusable_log(cfg: TrainConfig, settings: StudySettings, study: str, name: str) -> dict | None:
    """The saved log of a run with exactly this config, or None."""
    path = settings.log_path(study, name)
    if not path.exists():
        return None
    log = read_json(path)
    return log if same_config(log, cfg) else None


def save_log(log: dict, settings: StudySettings, study: str, name: str) -> Path:
    """`out/logs/<study>/<prefix><name>.json`, on one line."""
    return write_text(settings.log_path(study, name), json_text(log, indent=None))


def run_many(specs: Sequence[Spec], settings: StudySettings) -> dict[str, dict]:
    """Train every (cfg, study, name) not already logged with the same config,
    `settings.jobs` at a time in separate processes; name -> log."""
    from sinkmech.train.run import train_to_log  # torch and TransformerLens: only when something trains

    logs: dict[str, dict] = {}
    todo = []
    for cfg, study, name in specs:
        log = reusable_log(cfg, settings, study, name)
        if log is not None:
            print(f"{name}: reusing logs/{study}/{settings.prefix}{name}.json (same config)", flush=True)
            logs[name] = log
        else:
            todo.append((cfg, study, name))

    def done(cfg: TrainConfig, study: str, name: str, log: dict) -> None:
        print(f"{name}: {log['seconds']:.1f} s ({log['n_params']} parameters, {log['hardware']})", flush=True)
        logs[name] = log
        save_log(log, settings, study, name)

    jobs = max(1, settings.jobs or 1)
    if jobs == 1 or len(todo) <= 1:
        for cfg, study, name in todo:
            done(cfg, study, name, train_to_log(cfg.to_dict(), str(settings.checkpoint_dir(study, name)),
                                                RunOptions(progress=not settings.quiet)))
        return logs
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        futures = {pool.submit(train_to_log, cfg.to_dict(), str(settings.checkpoint_dir(study, name)), QUIET):
                   (cfg, study, name) for cfg, study, name in todo}
        for fut in as_completed(futures):
            done(*futures[fut], fut.result())
    return logs
