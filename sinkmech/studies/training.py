"""The from-scratch training studies: when do sinks form?

`packing` (Barbero et al. 2025, Table 2): train with and without a fixed
`<bos>`, under causal and intra-document packing (four runs), evaluate each
with and without `<bos>` at inference; the causal fixed-`<bos>` run's log also
gives the emergence figure (Guo et al. 2024's mutual reinforcement).
`positional`: the fixed-`<bos>` recipe with learned absolute (`standard`),
`rotary` and no (`none`) positional embedding (the `standard` run is reused
from `packing` when its log has the same config). `context_length`: the same
model at several context lengths, tokens per step held constant, every model
scored on the shortest context's number of tokens. `mask_self`: rotary
positions with every query's own key masked, one run per seed. `depth`: the
fixed-`<bos>` recipe at each depth and positional embedding, one run per seed.
`text`: natural text, every (depth, weight decay, fixed `<bos>`) combination.

Each study trains its runs (`sinkmech.train.parallel`), writes
`<prefix><study>.json` (one `SummaryRow` per run and inference condition) and
its figures under `settings.out`, and returns the rows; `run(None, config)`
runs the one a config (`sinkmech.studies.configs`) names and returns its rows
with the config (`TrainingStudy`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sinkmech.files import json_text, write_text
from sinkmech.options import RunOptions
from sinkmech.results import Result
from sinkmech.studies.configs import (
    ContextLengthConfig, DepthConfig, MaskSelfConfig, PackingConfig, PositionalConfig, TextConfig, TrainingConfig,
)
from sinkmech.train.config import TrainConfig, run_name
from sinkmech.train.parallel import read_json, reusable_log, run_many, same_config, save_log
from sinkmech.train.presets import (
    CONTEXT_LENGTHS,
    EMERGENCE_RUN,
    POSITIONAL_RUNS,
    PRESETS,
    RECIPES,
    StudySettings,
    parse_sets,
    recipe_name,
)
from sinkmech.train.summary import PAPER_TABLE2, packing_table, summary_rows


def write_rows(path: Path, rows: list) -> Path:
    """A study's rows (`SummaryRow`s or dicts) as strict JSON, one key per line."""
    return write_text(path, json_text([r if isinstance(r, dict) else r.to_dict() for r in rows], indent=1))


def write_emergence(log: dict, name: str, out: Path, prefix: str) -> dict:
    """`<prefix>emergence.json` and `.png` from one run's log (`sinkmech.train.emergence`)."""
    from sinkmech.plots.training import emergence_plot
    from sinkmech.train.emergence import emergence

    em = emergence(log, run=name).to_dict()
    write_text(out / f"{prefix}emergence.json", json_text(em, indent=1))
    cross = em["cross_step"]["0.3"]
    emergence_plot(em, out / f"{prefix}emergence.png",
                   title=f"Sink emergence ({name}, {log['config']['positional']} positions): first-token score "
                         f"> 0.3 first at step {cross}, from step {em['stable_step']['0.3']} on")
    print(f"emergence ({name}): alpha_0 > 0.3 first at step {cross}, from step {em['stable_step']['0.3']} on; "
          f"> 0.8 first at {em['cross_step']['0.8']}")
    return em


def packing(settings: StudySettings) -> list[dict]:
    """Table 2: both packings, with and without a fixed `<bos>`; and the emergence figure."""
    from sinkmech.plots.training import training_curves
    from sinkmech.train.run import hardware

    cfgs = [settings.config(packing=p, fixed_bos=fixed_bos) for p, fixed_bos in RECIPES]
    logs = run_many([(cfg, "packing", cfg.run_name) for cfg in cfgs], settings)
    rows = [r.to_dict() for cfg in cfgs
            for r in summary_rows(logs[cfg.run_name], preset=settings.preset, run=cfg.run_name)]
    table = packing_table(rows)
    header = (f"# Packing experiment ({settings.preset} preset, {rows[0]['data']}, T={rows[0]['context_length']}, "
              f"{rows[0]['steps']} steps, {hardware()})\n\n")
    write_rows(settings.output("packing.json"), rows)
    write_text(settings.output("packing.md"), header + table + "\n" + PAPER_TABLE2)
    training_curves(logs, settings.output("packing_curves.png"),
                    title=f"Packing recipes ({settings.preset} preset, {rows[0]['data']}): sink signals during training")
    name = run_name(EMERGENCE_RUN[0], EMERGENCE_RUN[1], rows[0]["context_length"])
    write_emergence(logs[name], name, settings.out, settings.prefix)
    print(table)
    print(f"wrote {settings.output('packing.json')}, packing.md, packing_curves.png, emergence.json, emergence.png")
    return rows


def positional_name(cfg: TrainConfig) -> str:
    return f"{cfg.positional}-{cfg.run_name}"


def positional(settings: StudySettings, positionals: Sequence[str] = POSITIONAL_RUNS) -> list[dict]:
    """Token or position? The fixed-`<bos>` recipe under each positional
    embedding, evaluated with and without `<bos>`."""
    from sinkmech.plots.training import training_curves

    specs, reused, logs = [], {}, {}
    for pos in positionals:
        cfg = settings.config(packing="causal", fixed_bos=True, positional=pos)
        name = positional_name(cfg)
        log = reusable_log(cfg, settings, "packing", cfg.run_name)
        if log is not None:
            print(f"{name}: reusing logs/packing/{settings.prefix}{cfg.run_name}.json (same config)")
            logs[name] = log
            save_log(log, settings, "positional", name)
            reused[name] = f"packing/{cfg.run_name}"
        else:
            specs.append((cfg, "positional", name))
    logs.update(run_many(specs, settings))
    names = [positional_name(settings.config(packing="causal", fixed_bos=True, positional=p)) for p in positionals]
    logs = {n: logs[n] for n in names}
    rows = [r.to_dict() for n in names
            for r in summary_rows(logs[n], preset=settings.preset, run=n, reused_from=reused.get(n))]
    write_rows(settings.output("positional.json"), rows)
    training_curves(logs, settings.output("positional_curves.png"),
                    title=f"Positional embeddings, fixed <bos> ({settings.preset} preset, {rows[0]['data']})")
    print(packing_table(rows))
    print(f"wrote {settings.output('positional.json')}, positional_curves.png")
    return rows


def _write_study(settings: StudySettings, study: str, rows: list[dict], logs: dict, title: str) -> None:
    """<study>.json and a figure: training curves for a few runs, the depth
    plot for the depth sweep (too many runs for one column each)."""
    from sinkmech.plots.training import depth_plot, training_curves

    write_rows(settings.output(f"{study}.json"), rows)
    if study == "depth":
        depth_plot(rows, settings.output("depth.png"), title=title)
        figure = "depth.png"
    else:
        training_curves(logs, settings.output(f"{study}_curves.png"), title=title)
        figure = f"{study}_curves.png"
    print(packing_table(rows))
    print(f"wrote {settings.output(study + '.json')}, {figure}")


def mask_self(settings: StudySettings, seeds: Sequence[int] = (0, 1, 2)) -> list[dict]:
    """The hypothesis test: rotary positions with every query's own key masked
    (queries >= 1), fixed `<bos>`, one run per seed, evaluated with and
    without `<bos>`."""
    cfgs = [settings.config(packing="causal", fixed_bos=True, positional="rotary", mask_self=True, seed=seed)
            for seed in seeds]
    names = [f"rotary-maskself-seed{cfg.seed}" for cfg in cfgs]
    logs = run_many([(cfg, "mask_self", n) for cfg, n in zip(cfgs, names)], settings)
    rows = [r.to_dict() for n in names for r in summary_rows(logs[n], preset=settings.preset, run=n)]
    _write_study(settings, "mask_self", rows, logs,
                 f"Rotary, self key masked, fixed <bos> ({settings.preset} preset, seeds {list(seeds)})")
    return rows


def _depth_specs(settings: StudySettings, seeds, layers, positionals, deep_steps, deep_seeds) -> list:
    specs = []
    for i, seed in enumerate(seeds):  # seed-major: a cut-short sweep still has every depth
        for depth in layers:
            if depth > 1 and deep_seeds is not None and i >= deep_seeds:
                continue
            for pos in positionals:
                over = dict(packing="causal", fixed_bos=True, positional=pos, n_layers=depth, seed=seed)
                if deep_steps and depth >= 4:
                    over.update(steps=deep_steps, eval_every=min(PRESETS[settings.preset]["eval_every"], deep_steps))
                specs.append((settings.config(**over), "depth", f"{pos}-L{depth}-seed{seed}"))
    return specs


def depth(settings: StudySettings, seeds: Sequence[int] = (0, 1, 2), layers: Sequence[int] = (1, 2, 4),
          positionals: Sequence[str] = ("rotary", "standard"), deep_steps: int | None = None, fresh: bool = False,
          deep_seeds: int | None = None) -> list[dict]:
    """Does a deeper model lean on the sink more? The fixed-`<bos>` recipe at
    each depth (`layers`) and positional embedding, one run per seed (the
    1-layer runs are reused from the positional study when their config
    matches, unless `fresh`); depths >= 4 stop at `deep_steps` when given, and
    depths above 1 run for the first `deep_seeds` seeds only when given."""
    from sinkmech.plots.training import depth_plot

    specs = _depth_specs(settings, seeds, layers, positionals, deep_steps, deep_seeds)
    logs = {}
    for cfg, study, name in specs:
        # reuse the positional runs (seed 0 unprefixed, seedN_ otherwise; the 2-layer rotary explore_ run)
        prefix = "" if cfg.seed == 0 else f"seed{cfg.seed}_"
        for path in (settings.out / "logs" / "positional" / f"{prefix}{positional_name(cfg)}.json",
                     settings.out / "logs" / "positional" / f"explore_{positional_name(cfg)}.json"):
            if fresh or name in logs or settings.log_path(study, name).exists():
                continue
            if path.exists():
                log = read_json(path)
                if same_config(log, cfg):
                    print(f"{name}: reusing {path} (same config)")
                    logs[name] = log
                    save_log(log, settings, study, name)
    logs.update(run_many([sp for sp in specs if sp[2] not in logs], settings))
    rows = [r.to_dict() for _, _, n in specs for r in summary_rows(logs[n], preset=settings.preset, run=n)]
    depths_seeds = {d: sorted({cfg.seed for cfg, _, _ in specs if cfg.n_layers == d}) for d in layers}
    title = ", ".join(f"{d} layer{'s' if d > 1 else ''}: seeds {','.join(map(str, ss))}" for d, ss in depths_seeds.items())
    steps = f"; depths >= 4 stop at step {deep_steps}" if deep_steps else ""
    _write_study(settings, "depth", rows, logs, f"Depth ({settings.preset} preset, fixed <bos>; {title}{steps})")
    if deep_steps:
        # Every run read at the deep runs' length, from its log: depths compared at equal training.
        at = [r.to_dict() for _, _, n in specs
              for r in summary_rows(logs[n], at_step=deep_steps, preset=settings.preset, run=n)]
        write_rows(settings.output("depth_at_step.json"), at)
        depth_plot(at, settings.output("depth_at_step.png"),
                   title=f"Depth, every run read at step {deep_steps} ({settings.preset} preset, fixed <bos>; {title})")
        print(f"wrote {settings.output('depth_at_step.json')}, depth_at_step.png (every run at step {deep_steps})")
    else:
        # Every depth ran the preset's steps: an earlier sweep's early-stop reading no longer matches depth.json.
        for stale in (settings.output("depth_at_step.json"), settings.output("depth_at_step.png")):
            if stale.exists():
                stale.unlink()
                print(f"removed {stale}: it read an earlier sweep whose deep runs stopped early")
    return rows


def _text_name(settings: StudySettings, n_layers: int, weight_decay: float, cfg: TrainConfig) -> str:
    """`text-L<layers>H<heads>-wd<decay>-<fixedbos|nofixedbos>-s<seed>`, then
    `-d<width>`, `-lr<lr>` and `-<steps>steps` where the run leaves the preset's."""
    bos = "fixedbos" if cfg.fixed_bos else "nofixedbos"
    name = f"text-L{n_layers}H{cfg.n_heads}-wd{weight_decay:g}-{bos}-s{cfg.seed}"
    preset = PRESETS[settings.preset]
    if cfg.d_model != preset["d_model"]:  # a wider (or narrower) run keeps its own row
        name += f"-d{cfg.d_model}"
    if cfg.lr != preset["lr"]:
        name += f"-lr{cfg.lr:g}"
    if cfg.steps != preset["steps"]:  # a longer (or shorter) run keeps its own row
        name += f"-{cfg.steps}steps"
    return name


def text(settings: StudySettings, layers: Sequence[int] = (2,), weight_decays: Sequence[float] = (0.1, 0.0),
         fixed_bos: Sequence[bool] = (True, False)) -> list[dict]:
    """Natural text (the half-the-heads target's setting): every (depth, weight
    decay, fixed `<bos>` or not) combination asked, one run each. Earlier text
    runs under `settings.out` keep their rows."""
    specs = []
    for n_layers in layers:
        for wd in weight_decays:
            for fixed in fixed_bos:
                cfg = settings.config(n_layers=n_layers, weight_decay=wd, fixed_bos=fixed, packing="causal")
                specs.append((cfg, "text", _text_name(settings, n_layers, wd, cfg)))
    logs = run_many(specs, settings)
    path = settings.output("text.json")
    old = read_json(path) if path.exists() else []
    names = [n for _, _, n in specs]
    new = [r.to_dict() for n in names for r in summary_rows(logs[n], preset=settings.preset, run=n)]
    rows = [r for r in old if r.get("run") not in names] + new  # earlier text runs stay
    rows.sort(key=lambda r: (recipe_name(r["run"]), r["seed"]))  # a recipe's seeds side by side (the sort is stable)
    all_logs = {r["run"]: read_json(settings.log_path("text", r["run"])) for r in rows}
    _write_study(settings, "text", rows, all_logs, "Natural text (byte-level, rotary): sink signals during training")
    return rows


def context_length(settings: StudySettings, context_lengths: Sequence[int] | None = None,
                   fixed_bos: bool = True) -> list[dict]:
    """The same model at each context length (default: the preset's), tokens
    per step held constant, every model scored on the shortest context's
    content tokens."""
    from sinkmech.plots.training import context_length_plot, training_curves

    lengths = list(context_lengths or CONTEXT_LENGTHS[settings.preset])
    score = min(lengths) - 1
    cfgs = [settings.config(context_length=T, packing="causal", fixed_bos=fixed_bos, score_tokens=score)
            for T in lengths]
    logs = run_many([(cfg, "context_length", cfg.run_name) for cfg in cfgs], settings)
    rows = [r.to_dict() for cfg in cfgs
            for r in summary_rows(logs[cfg.run_name], preset=settings.preset, run=cfg.run_name)]
    write_rows(settings.output("context_length.json"), rows)
    title = (f"Context length ({settings.preset} preset, {rows[0]['data']}, {rows[0]['steps']} steps, equal tokens "
             f"per step, scored on {score} tokens)")
    context_length_plot(rows, settings.output("context_length.png"), title=title)
    training_curves(logs, settings.output("context_length_curves.png"), title=title)
    print(f"{'T':>6} {'bos':>5} {'rate.3':>7} {'rate.8':>7} {'max':>6} {'mean':>6} {'unif':>6} {'loss':>6}")
    for r in rows:
        print(f"{r['context_length']:>6} {str(r['inference_bos']):>5} {r['sink_rate']['0.3']:>7.2f} "
              f"{r['sink_rate']['0.8']:>7.2f} {r['max_head_score']:>6.3f} {r['mean_head_score']:>6.3f} "
              f"{r['uniform_score']:>6.3f} {r['val_loss']:>6.3f}")
    print(f"wrote {settings.output('context_length.json')}, context_length.png, context_length_curves.png")
    return rows


@dataclass(frozen=True)
class TrainingStudy(Result):
    """A training study's rows (one `SummaryRow` dict per run and inference
    condition, as `<prefix><study>.json` holds them), the config it ran and its
    wall time (runs whose logs were reused do not train again)."""

    rows: tuple[dict, ...]
    config: TrainingConfig
    seconds: float

    def to_dict(self) -> dict:
        return {"study": self.config.study, "rows": list(self.rows), "seconds": round(self.seconds, 1),
                "config": self.config.to_dict()}

    def to_dataframe(self):
        import pandas as pd

        return pd.json_normalize(list(self.rows))


def settings_of(config: TrainingConfig, options: RunOptions = RunOptions()) -> StudySettings:
    """The `StudySettings` a training config runs with (progress bars from `options`)."""
    return StudySettings(preset=config.preset, steps=config.steps, threads=config.threads, data=config.data,
                         seed=config.seed, eval_every=config.eval_every, sets=config.sets, out=Path(config.out),
                         runs_dir=Path(config.runs_dir), prefix=config.prefix, jobs=config.jobs,
                         quiet=not options.progress)


def run(models=None, config: TrainingConfig = PackingConfig(), options: RunOptions = RunOptions()) -> TrainingStudy:
    """Run the training study `config` names: its runs trained from scratch (no
    model is handed in: `models` must be None), its rows, logs and figures
    written under `config.out`; returns the rows with the config.

    Args:
        config: `PackingConfig`, `PositionalConfig`, `ContextLengthConfig`,
            `MaskSelfConfig`, `DepthConfig` or `TextConfig` (`sinkmech.studies.configs`).
        options: progress bars (`options.progress`).
    """
    if models is not None:
        raise ValueError(f"the training study {config.study!r} trains its own models: pass None")
    t0 = time.perf_counter()
    settings = settings_of(config, options)
    parse_sets(settings.sets)  # a bad KEY=VALUE is an error before anything trains
    c = config
    if isinstance(c, PackingConfig):
        rows = packing(settings)
    elif isinstance(c, PositionalConfig):
        rows = positional(settings, c.positionals)
    elif isinstance(c, ContextLengthConfig):
        rows = context_length(settings, c.context_lengths, fixed_bos=c.fixed_bos)
    elif isinstance(c, MaskSelfConfig):
        rows = mask_self(settings, c.seeds)
    elif isinstance(c, DepthConfig):
        rows = depth(settings, c.seeds, c.layers, c.positionals, deep_steps=c.deep_steps, fresh=c.fresh,
                     deep_seeds=c.deep_seeds)
    elif isinstance(c, TextConfig):
        rows = text(settings, c.layers, c.weight_decays, fixed_bos=c.fixed_bos)
    else:
        raise ValueError(f"{type(c).__name__} is not a training study's config")
    return TrainingStudy(tuple(rows), config, time.perf_counter() - t0)
