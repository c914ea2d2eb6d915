"""When do sinks form? The paper's from-scratch experiments at a chosen scale.

    python scripts/train_sinks.py packing --preset cpu          # Table 2 + emergence
    python scripts/train_sinks.py positional --preset cpu       # token or position?
    python scripts/train_sinks.py context-length --preset cpu
    python scripts/train_sinks.py modes                         # active/dormant attention of those runs
    python scripts/train_sinks.py findings                      # findings_train.json from the JSON above
    python scripts/train_sinks.py packing --preset gpu --steps 3   # smoke test anywhere

`packing` (Barbero et al. 2025, Table 2): train with and without a fixed
`<bos>`, under causal and intra-document packing (four runs), evaluate each
with and without `<bos>` at inference; the causal fixed-`<bos>` run's log also
gives the emergence figure (Guo et al. 2024's mutual reinforcement: first-token
attention, the `<bos>` value and residual norms, post-trigger loss, per
evaluation). `positional`: the same fixed-`<bos>` recipe with learned absolute
(`standard`), `rotary` and no (`none`) positional embedding, evaluated with and
without `<bos>` (the `standard` run is reused from `packing` when its log has
the same config). `context-length`: the same model at several context lengths,
tokens per step held constant, every model scored on the shortest context's
number of tokens (their context-length study).
Outputs (under --out, default figures/train): packing.json, packing.md,
packing_curves.png, emergence.json, emergence.png; positional.json,
positional_curves.png; context_length.json, context_length.png,
context_length_curves.png; modes.json; findings_train.json;
logs/<experiment>/<prefix><run>.json. Checkpoints go to
--runs-dir/<experiment>/<prefix><run>/.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import re
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sinkmech.prompts import CONDITIONS  # noqa: E402
from sinkmech.train.config import DATA_SOURCES, PACKINGS, POSITIONALS, run_name  # noqa: E402
from sinkmech.train.data import sink_tokens  # noqa: E402
from sinkmech.train.emergence import emergence  # noqa: E402
from sinkmech.train.intervals import seed_interval, slope  # noqa: E402
from sinkmech.train.run import TrainConfig, hardware, train_to_log  # noqa: E402
from sinkmech.figures.training import (  # noqa: E402
    context_length_plot,
    context_length_seeds_plot,
    depth_plot,
    emergence_plot,
    training_curves,
)

# Sizes. cpu: Guo et al.'s one-layer, one-head model with learned absolute
# positions, where a thresholded sink forms: on a probe of exactly this config
# (seed 0) the head's first-token score crossed 0.3 between steps 1,750 and
# 2,000 and reached 0.54 at 3,000 (100 % of prompts > 0.3, none > 0.8), in
# ~4.5 minutes on one torch thread of a shared 2-core machine.
# gpu: the same recipe scaled up (4 layers x 8 heads, T=512, 16x the tokens
# per step); not measured on a GPU. Keep `--steps 2` as a smoke test.
PRESETS: dict[str, dict] = {
    "cpu": dict(data="bigram_backcopy", context_length=128, tokens_per_step=2048, n_layers=1, d_model=64,
                n_heads=1, positional="standard", steps=3000, lr=5e-3, warmup=50, eval_every=100, threads=1),
    "gpu": dict(data="bigram_backcopy", context_length=512, tokens_per_step=65536, n_layers=4, d_model=512,
                n_heads=8, positional="standard", steps=4000, lr=1e-3, warmup=200, eval_every=100,
                eval_prompts=64, val_windows=64, bb_vocab=128, bb_doc_max=1024),
}
# text: the natural-text setting (byte-level pydoc topics + stdlib
# docstrings + stdlib .py sources, ~31 MB), rotary, 2 layers x 4 heads, d 128,
# T 256, 4,096 tokens/step; sized to <= 15 minutes on one thread.
PRESETS["text"] = dict(data="text", text_corpus="docs+source", context_length=256, tokens_per_step=4096, n_layers=2,
                       d_model=128, n_heads=4, positional="rotary", steps=2000, lr=3e-3, warmup=100,
                       weight_decay=0.1, eval_every=250, threads=1)
CONTEXT_LENGTHS = {"cpu": [32, 64, 128, 256], "gpu": [128, 256, 512, 1024, 2048]}
# (packing, fixed_bos): the paper's Table 2, both packings.
RECIPES = [("causal", False), ("causal", True), ("intra_doc", False), ("intra_doc", True)]
POSITIONAL_RUNS = ("standard", "rotary", "none")
PAPER_TABLE2 = (
    "Paper (Barbero et al. 2025, Table 2; 120M parameters, 30B tokens; the notes we have do not say which epsilon):\n\n"
    "| trained with | inference `<bos>` | sink rate % | val loss |\n|---|---|---|---|\n"
    "| no fixed `<bos>` | yes | 65.10 | - |\n| no fixed `<bos>` | no | 65.15 | - |\n"
    "| fixed `<bos>` | yes | 90.84 | 2.69 |\n| fixed `<bos>` | no | 0.05 | 7.56 |\n"
)
EMERGENCE_RUN = ("causal", True)  # the packing run whose log draws emergence.png


def preset_config(args, **overrides) -> TrainConfig:
    kw = dict(PRESETS[args.preset])
    for name in ("steps", "threads", "data", "seed", "eval_every"):
        if getattr(args, name) is not None:
            kw[name] = getattr(args, name)
    kw.update(overrides)
    kw.update(parse_sets(args.set))
    if kw["eval_every"] > kw["steps"]:
        kw["eval_every"] = kw["steps"]
    kw["warmup"] = min(kw["warmup"], kw["steps"])
    return TrainConfig(**kw)


def parse_sets(items: list[str] | None) -> dict:
    """`KEY=VALUE` overrides of TrainConfig fields, typed like the field's default."""
    types = {f.name: f for f in fields(TrainConfig)}
    choices = {"data": DATA_SOURCES, "packing": PACKINGS, "positional": POSITIONALS}
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or key not in types:
            raise ValueError(f"--set takes KEY=VALUE with KEY a TrainConfig field, got {item!r}")
        if key in choices and value not in choices[key]:
            raise ValueError(f"--set {key} takes one of {choices[key]}, got {value!r}")
        default = types[key].default
        if isinstance(default, bool):
            if value.lower() not in ("true", "false"):
                raise ValueError(f"--set {key} takes true or false, got {value!r}")
            out[key] = value.lower() == "true"
        elif isinstance(default, int) or default is None:
            out[key] = int(value)
        elif isinstance(default, float):
            out[key] = float(value)
        else:
            out[key] = value
    return out


def layer_rates(condition: dict, n_layers: int) -> dict:
    """{"layer_sink_rate": {eps: [per layer %]}} from an evaluation. A log
    that predates the per-layer record still determines it where the whole
    model's rate does: one layer, or a rate of 0 % or 100 % (then every layer
    has it); else {}."""
    if "layer_sink_rate" in condition:
        return {"layer_sink_rate": condition["layer_sink_rate"]}
    rates = condition["sink_rate"]
    if n_layers == 1 or all(v in (0.0, 100.0) for v in rates.values()):
        return {"layer_sink_rate": {eps: [v] * n_layers for eps, v in rates.items()}}
    return {}


def summary_rows(log: dict, at_step: int | None = None, **extra) -> list[dict]:
    """One row per inference condition from a run's log: its final evaluation,
    or the one at step `at_step` (then "steps" is that step and "run_steps"
    the run's length)."""
    cfg = TrainConfig.from_dict(log["config"])
    final = log["evals"][-1]
    if at_step is not None:
        found = [e for e in log["evals"] if e["step"] == at_step]
        if not found:
            raise ValueError(f"the log of {extra.get('run', 'a run')} has no evaluation at step {at_step}")
        final = found[0]
        extra = {"run_steps": cfg.steps, **extra}
    base = final["val_loss"]["prepend"]
    rows = []
    for cond in CONDITIONS:
        c = final["conditions"][cond]
        rows.append({
            "packing": cfg.packing,
            "fixed_bos": cfg.fixed_bos,
            "positional": cfg.positional,
            "inference_bos": cond == "prepend",
            "val_loss": final["val_loss"][cond],
            "loss_gap": final["val_loss"][cond] - base,
            "sink_rate": c["sink_rate"],
            "max_head_score": c["max_head_score"],
            "mean_head_score": c["mean_head_score"],
            "uniform_score": c["uniform_score"],
            "context_length": cfg.context_length,
            "score_tokens": sink_tokens(cfg),
            "n_layers": cfg.n_layers,
            "n_heads": cfg.n_heads,
            "d_model": cfg.d_model,
            "lr": cfg.lr,
            "data": cfg.data,
            "steps": cfg.steps if at_step is None else at_step,
            "seed": cfg.seed,
            "tokens_per_step": cfg.batch_size * cfg.context_length,
            "n_params": log["n_params"],
            "train_seconds": round(log["seconds"], 1),
            "hardware": log.get("hardware", hardware()),
            "weight_decay": cfg.weight_decay,
            **layer_rates(c, cfg.n_layers),
            "head_scores": c["head_scores"],  # [layer][head] mean alpha_0
            "value_norm_first": c["value_norm_first"],  # [layer][head]: the first token's value norm ...
            "value_norm_rest": c["value_norm_rest"],  # ... and the other tokens' mean
            **({"text_corpus": cfg.text_corpus} if cfg.data == "text" else {}),
            **({"mask_self": True} if cfg.mask_self else {}),
            **extra,
        })
    return rows


def packing_table(rows: list[dict]) -> str:
    """Markdown in the shape of the paper's Table 2, plus the continuous signals."""
    lines = [
        "| packing | positional | trained with | inference `<bos>` | sink rate % (eps 0.3) | sink rate % (eps 0.8) "
        "| max head alpha_0 | mean head alpha_0 | uniform alpha_0 | val loss | loss gap |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['packing']} | {r['positional']} | {'fixed `<bos>`' if r['fixed_bos'] else 'no fixed `<bos>`'} "
            f"| {'yes' if r['inference_bos'] else 'no'} | {r['sink_rate']['0.3']:.2f} | {r['sink_rate']['0.8']:.2f} "
            f"| {r['max_head_score']:.3f} | {r['mean_head_score']:.3f} | {r['uniform_score']:.3f} "
            f"| {r['val_loss']:.3f} | {r['loss_gap']:+.3f} |"
        )
    return "\n".join(lines) + "\n"


def _save_log(log: dict, args, experiment: str, name: str) -> None:
    out = Path(args.out) / "logs" / experiment
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.prefix}{name}.json").write_text(json.dumps(log))


def run_many(specs: list[tuple[TrainConfig, str, str]], args) -> dict[str, dict]:
    """Train every (cfg, experiment, name) not already logged with the same
    config, `args.jobs` at a time in separate processes; name -> log."""
    logs: dict[str, dict] = {}
    todo = []
    for cfg, experiment, name in specs:
        log = _reusable_log(cfg, args, experiment, name)
        if log is not None:
            print(f"{name}: reusing logs/{experiment}/{args.prefix}{name}.json (same config)", flush=True)
            logs[name] = log
        else:
            todo.append((cfg, experiment, name))

    def done(cfg: TrainConfig, experiment: str, name: str, log: dict) -> None:
        print(f"{name}: {log['seconds']:.1f} s ({log['n_params']} parameters, {log['hardware']})", flush=True)
        logs[name] = log
        _save_log(log, args, experiment, name)

    jobs = max(1, getattr(args, "jobs", 1) or 1)
    if jobs == 1 or len(todo) <= 1:
        for cfg, experiment, name in todo:
            done(cfg, experiment, name, train_to_log(cfg.to_dict(), _ckpt(args, experiment, name), not args.quiet))
        return logs
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        futures = {pool.submit(train_to_log, cfg.to_dict(), _ckpt(args, experiment, name), False): (cfg, experiment, name)
                   for cfg, experiment, name in todo}
        for fut in as_completed(futures):
            done(*futures[fut], fut.result())
    return logs


def _ckpt(args, experiment: str, name: str) -> str:
    return str(Path(args.runs_dir) / experiment / f"{args.prefix}{name}")


def _reusable_log(cfg: TrainConfig, args, experiment: str, name: str) -> dict | None:
    """A committed log of a run with exactly this config, or None."""
    path = Path(args.out) / "logs" / experiment / f"{args.prefix}{name}.json"
    if not path.exists():
        return None
    log = json.loads(path.read_text())
    return log if same_config(log, cfg) else None


def same_config(log: dict, cfg: TrainConfig) -> bool:
    """The log's run had exactly `cfg`: a field the log predates ran with its
    default, so the log's config is read through `TrainConfig.from_dict`."""
    try:
        return TrainConfig.from_dict(log["config"]) == cfg
    except (ValueError, TypeError):
        return False


def write_emergence(log: dict, name: str, out: Path, prefix: str) -> dict:
    em = emergence(log, run=name).to_dict()
    (out / f"{prefix}emergence.json").write_text(json.dumps(em, indent=1))
    cross = em["cross_step"]["0.3"]
    emergence_plot(em, out / f"{prefix}emergence.png",
                   title=f"Sink emergence ({name}, {log['config']['positional']} positions): first-token score "
                         f"> 0.3 first at step {cross}, from step {em['stable_step']['0.3']} on")
    print(f"emergence ({name}): alpha_0 > 0.3 first at step {cross}, from step {em['stable_step']['0.3']} on; "
          f"> 0.8 first at {em['cross_step']['0.8']}")
    return em


def cmd_packing(args) -> list[dict]:
    cfgs = [preset_config(args, packing=packing, fixed_bos=fixed_bos) for packing, fixed_bos in RECIPES]
    logs = run_many([(cfg, "packing", cfg.run_name) for cfg in cfgs], args)
    rows = [r for cfg in cfgs for r in summary_rows(logs[cfg.run_name], preset=args.preset, run=cfg.run_name)]
    out = Path(args.out)
    table = packing_table(rows)
    header = (f"# Packing experiment ({args.preset} preset, {rows[0]['data']}, T={rows[0]['context_length']}, "
              f"{rows[0]['steps']} steps, {hardware()})\n\n")
    (out / f"{args.prefix}packing.json").write_text(json.dumps(rows, indent=1))
    (out / f"{args.prefix}packing.md").write_text(header + table + "\n" + PAPER_TABLE2)
    training_curves(logs, out / f"{args.prefix}packing_curves.png",
                    title=f"Packing recipes ({args.preset} preset, {rows[0]['data']}): sink signals during training")
    name = run_name(EMERGENCE_RUN[0], EMERGENCE_RUN[1], rows[0]["context_length"])
    write_emergence(logs[name], name, out, args.prefix)
    print(table)
    print(f"wrote {out / (args.prefix + 'packing.json')}, packing.md, packing_curves.png, emergence.json, emergence.png")
    return rows


def positional_name(cfg: TrainConfig) -> str:
    return f"{cfg.positional}-{cfg.run_name}"


def cmd_positional(args) -> list[dict]:
    """Token or position? The fixed-`<bos>` recipe under each positional
    embedding, evaluated with and without `<bos>`."""
    specs, extras, logs = [], {}, {}
    for positional in args.positionals:
        cfg = preset_config(args, packing="causal", fixed_bos=True, positional=positional)
        name = positional_name(cfg)
        log = _reusable_log(cfg, args, "packing", cfg.run_name)
        if log is not None:
            print(f"{name}: reusing logs/packing/{args.prefix}{cfg.run_name}.json (same config)")
            logs[name] = log
            _save_log(log, args, "positional", name)
            extras[name] = {"reused_from": f"packing/{cfg.run_name}"}
        else:
            specs.append((cfg, "positional", name))
    logs.update(run_many(specs, args))
    names = [positional_name(preset_config(args, packing="causal", fixed_bos=True, positional=p))
             for p in args.positionals]
    logs = {n: logs[n] for n in names}
    rows = [r for n in names for r in summary_rows(logs[n], preset=args.preset, run=n, **extras.get(n, {}))]
    out = Path(args.out)
    (out / f"{args.prefix}positional.json").write_text(json.dumps(rows, indent=1))
    training_curves(logs, out / f"{args.prefix}positional_curves.png",
                    title=f"Positional embeddings, fixed <bos> ({args.preset} preset, {rows[0]['data']})")
    print(packing_table(rows))
    print(f"wrote {out / (args.prefix + 'positional.json')}, positional_curves.png")
    return rows


def _write_rows(args, experiment: str, rows: list[dict], logs: dict, title: str) -> None:
    """<experiment>.json and a figure: training curves for a few runs, the
    depth plot for the depth sweep (too many runs for one column each)."""
    out = Path(args.out)
    (out / f"{args.prefix}{experiment}.json").write_text(json.dumps(rows, indent=1))
    if experiment == "depth":
        depth_plot(rows, out / f"{args.prefix}depth.png", title=title)
        figure = "depth.png"
    else:
        training_curves(logs, out / f"{args.prefix}{experiment}_curves.png", title=title)
        figure = f"{experiment}_curves.png"
    print(packing_table(rows))
    print(f"wrote {out / (args.prefix + experiment + '.json')}, {figure}")


def cmd_mask_self(args) -> list[dict]:
    """The hypothesis test: rotary positions with every query's own key masked
    (queries >= 1), fixed `<bos>`, one run per seed, evaluated with and
    without `<bos>`."""
    cfgs = [preset_config(args, packing="causal", fixed_bos=True, positional="rotary", mask_self=True, seed=seed)
            for seed in args.seeds]
    names = [f"rotary-maskself-seed{cfg.seed}" for cfg in cfgs]
    logs = run_many([(cfg, "mask_self", n) for cfg, n in zip(cfgs, names)], args)
    rows = [r for n in names for r in summary_rows(logs[n], preset=args.preset, run=n)]
    _write_rows(args, "mask_self", rows, logs,
                f"Rotary, self key masked, fixed <bos> ({args.preset} preset, seeds {args.seeds})")
    return rows


def cmd_depth(args) -> list[dict]:
    """Does a deeper model lean on the sink more? The fixed-`<bos>` recipe at
    each depth and positional embedding, one run per seed (the 1-layer runs
    are reused from the positional experiment when their config matches)."""
    specs = []
    for i, seed in enumerate(args.seeds):  # seed-major: a cut-short sweep still has every depth
        for depth in args.depths:
            if depth > 1 and args.deep_seeds is not None and i >= args.deep_seeds:
                continue
            for positional in args.positionals:
                steps = args.deep_steps if (args.deep_steps and depth >= 4) else None
                over = dict(packing="causal", fixed_bos=True, positional=positional, n_layers=depth, seed=seed)
                if steps:
                    over.update(steps=steps, eval_every=min(PRESETS[args.preset]["eval_every"], steps))
                cfg = preset_config(args, **over)
                specs.append((cfg, "depth", f"{positional}-L{depth}-seed{seed}"))
    logs = {}
    for cfg, experiment, name in specs:
        # reuse the positional runs (seed 0 unprefixed, seedN_ otherwise; the 2-layer rotary explore_ run)
        prefix = "" if cfg.seed == 0 else f"seed{cfg.seed}_"
        for path in (Path(args.out) / "logs" / "positional" / f"{prefix}{positional_name(cfg)}.json",
                     Path(args.out) / "logs" / "positional" / f"explore_{positional_name(cfg)}.json"):
            if args.fresh or name in logs or (Path(args.out) / "logs" / experiment / f"{args.prefix}{name}.json").exists():
                continue
            if path.exists():
                log = json.loads(path.read_text())
                if same_config(log, cfg):
                    print(f"{name}: reusing {path} (same config)")
                    logs[name] = log
                    _save_log(log, args, experiment, name)
    logs.update(run_many([sp for sp in specs if sp[2] not in logs], args))
    rows = [r for _, _, n in specs for r in summary_rows(logs[n], preset=args.preset, run=n)]
    depths_seeds = {d: sorted({cfg.seed for cfg, _, _ in specs if cfg.n_layers == d}) for d in args.depths}
    title = ", ".join(f"{d} layer{'s' if d > 1 else ''}: seeds {','.join(map(str, ss))}" for d, ss in depths_seeds.items())
    steps = f"; depths >= 4 stop at step {args.deep_steps}" if args.deep_steps else ""
    _write_rows(args, "depth", rows, logs, f"Depth ({args.preset} preset, fixed <bos>; {title}{steps})")
    if args.deep_steps:
        # Every run read at the deep runs' length, from its log: depths compared at equal training.
        at = [r for _, _, n in specs for r in summary_rows(logs[n], at_step=args.deep_steps, preset=args.preset, run=n)]
        out = Path(args.out)
        (out / f"{args.prefix}depth_at_step.json").write_text(json.dumps(at, indent=1))
        depth_plot(at, out / f"{args.prefix}depth_at_step.png",
                   title=f"Depth, every run read at step {args.deep_steps} ({args.preset} preset, fixed <bos>; {title})")
        print(f"wrote {out / (args.prefix + 'depth_at_step.json')}, depth_at_step.png (every run at step "
              f"{args.deep_steps})")
    else:
        # Every depth ran the preset's steps: an earlier sweep's early-stop reading no longer matches depth.json.
        for stale in (Path(args.out) / f"{args.prefix}depth_at_step.json", Path(args.out) / f"{args.prefix}depth_at_step.png"):
            if stale.exists():
                stale.unlink()
                print(f"removed {stale}: it read an earlier sweep whose deep runs stopped early")
    return rows


def _recipe(run: str) -> str:
    """A text run's name without its seed: the runs that share it differ only in their seed."""
    return re.sub(r"-s\d+(?=-|$)", "", run)


def _recipe_then_seed(row: dict) -> tuple[str, int]:
    """Sort key for text rows (Python's sort is stable, so a run's with- and
    without-`<bos>` rows keep their order)."""
    return _recipe(row["run"]), row["seed"]


def cmd_text(args) -> list[dict]:
    """Natural text (the half-the-heads target's setting): every (depth, weight decay,
    fixed `<bos>` or not) combination asked, one run each."""
    specs = []
    for depth in args.depths:
        for wd in args.weight_decays:
            for fixed_bos in args.fixed_bos:
                cfg = preset_config(args, n_layers=depth, weight_decay=wd, fixed_bos=fixed_bos == "yes",
                                    packing="causal")
                name = f"text-L{depth}H{cfg.n_heads}-wd{wd:g}-{'fixedbos' if cfg.fixed_bos else 'nofixedbos'}-s{cfg.seed}"
                preset = PRESETS[args.preset]
                if cfg.d_model != preset["d_model"]:  # a wider (or narrower) run keeps its own row
                    name += f"-d{cfg.d_model}"
                if cfg.lr != preset["lr"]:
                    name += f"-lr{cfg.lr:g}"
                if cfg.steps != preset["steps"]:  # a longer (or shorter) run keeps its own row
                    name += f"-{cfg.steps}steps"
                specs.append((cfg, "text", name))
    logs = run_many(specs, args)
    path = Path(args.out) / f"{args.prefix}text.json"
    old = json.loads(path.read_text()) if path.exists() else []
    names = [n for _, _, n in specs]
    new = [r for n in names for r in summary_rows(logs[n], preset=args.preset, run=n)]
    rows = [r for r in old if r.get("run") not in names] + new  # earlier text runs stay
    rows.sort(key=_recipe_then_seed)  # a recipe's seeds side by side, in the table and the figure
    all_logs = {r["run"]: json.loads((Path(args.out) / "logs" / "text" / f"{args.prefix}{r['run']}.json").read_text())
                for r in rows}
    _write_rows(args, "text", rows, all_logs, "Natural text (byte-level, rotary): sink signals during training")
    return rows


MODE_EXPERIMENTS = ("positional", "mask_self", "depth")  # bigram-backcopy experiments whose heads modes.json reads


def cmd_modes(args) -> list[dict]:
    """Where each head's attention goes, on trigger queries and on the others
    (`sinkmech.train.modes`): first key, self, previous key (the copy source of
    a trigger query), other copies of the next token, the rest, and the
    normalised entropy, with `<bos>` prepended and without, for every layer
    and head of every run of the positional, mask-self and depth experiments
    under --out. Read from each run's final evaluation in its log (the
    held-out scoring prompts); no model is run."""
    out = Path(args.out)
    rows = []
    for experiment in MODE_EXPERIMENTS:
        path = out / f"{args.prefix}{experiment}.json"
        if not path.exists():
            continue
        for r in json.loads(path.read_text()):
            if not r["inference_bos"]:
                continue
            run = r.get("run") or f"{r['positional']}-{run_name(r['packing'], r['fixed_bos'], r['context_length'])}"
            log_path = out / "logs" / experiment / f"{args.prefix}{run}.json"
            if not log_path.exists():
                raise ValueError(f"no {log_path}: the log of a run in {path.name}")
            log = json.loads(log_path.read_text())
            if "attention" not in log["evals"][-1]["conditions"]["prepend"]:
                print(f"note: {log_path} predates the attention record (no per-class attention): not in modes.json")
                continue
            cfg = TrainConfig.from_dict({**log["config"]})
            if cfg.data != "bigram_backcopy":
                raise ValueError(f"{log_path}: modes need bigram_backcopy data, not {cfg.data}")
            for bos in CONDITIONS:
                att = log["evals"][-1]["conditions"][bos]["attention"]
                tables = {f"{c}_{k}": v for c in ("trigger", "other") for k, v in att[c].items()}
                rows.append({"experiment": experiment, "run": run, "positional": cfg.positional,
                             "fixed_bos": cfg.fixed_bos, "inference_bos": bos == "prepend", "seed": cfg.seed,
                             "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
                             **({"mask_self": True} if cfg.mask_self else {}), **tables,
                             "n_trigger": att["counts"]["trigger"], "n_other": att["counts"]["other"]})
    if not rows:
        raise ValueError(f"no {', '.join(MODE_EXPERIMENTS)} results under {out}: run those experiments first")
    (out / f"{args.prefix}modes.json").write_text(json.dumps(rows, indent=1))
    print(f"{'run':>28} {'bos':>5}  trigger: first  self  prev  rest | other: first  self  prev  rest  entropy"
          "  (per layer, head)")
    for r in rows:
        for l in range(r["n_layers"]):
            for h in range(r["n_heads"]):
                t = [r[f"trigger_{k}"][l][h] for k in ("first", "self", "prev", "rest")]
                o = [r[f"other_{k}"][l][h] for k in ("first", "self", "prev", "rest", "entropy")]
                print(f"{r['run'] + f' L{l}H{h}':>28} {str(r['inference_bos']):>5}  "
                      + " ".join(f"{v:.3f}" for v in t) + " | " + " ".join(f"{v:.3f}" for v in o))
    print(f"wrote {out / (args.prefix + 'modes.json')}")
    return rows


def cmd_context_length(args) -> list[dict]:
    lengths = args.lengths or CONTEXT_LENGTHS[args.preset]
    score = min(lengths) - 1  # every model is scored on the shortest context's content tokens
    cfgs = [preset_config(args, context_length=T, packing="causal", fixed_bos=args.fixed_bos, score_tokens=score)
            for T in lengths]
    logs = run_many([(cfg, "context_length", cfg.run_name) for cfg in cfgs], args)
    rows = [r for cfg in cfgs for r in summary_rows(logs[cfg.run_name], preset=args.preset, run=cfg.run_name)]
    out = Path(args.out)
    (out / f"{args.prefix}context_length.json").write_text(json.dumps(rows, indent=1))
    title = (f"Context length ({args.preset} preset, {rows[0]['data']}, {rows[0]['steps']} steps, equal tokens "
             f"per step, scored on {score} tokens)")
    context_length_plot(rows, out / f"{args.prefix}context_length.png", title=title)
    training_curves(logs, out / f"{args.prefix}context_length_curves.png", title=title)
    print(f"{'T':>6} {'bos':>5} {'rate.3':>7} {'rate.8':>7} {'max':>6} {'mean':>6} {'unif':>6} {'loss':>6}")
    for r in rows:
        print(f"{r['context_length']:>6} {str(r['inference_bos']):>5} {r['sink_rate']['0.3']:>7.2f} "
              f"{r['sink_rate']['0.8']:>7.2f} {r['max_head_score']:>6.3f} {r['mean_head_score']:>6.3f} "
              f"{r['uniform_score']:>6.3f} {r['val_loss']:>6.3f}")
    print(f"wrote {out / (args.prefix + 'context_length.json')}, context_length.png, context_length_curves.png")
    return rows


def cmd_replot(args) -> None:
    """Redraw the figures from the JSON an experiment wrote (no training)."""
    out = Path(args.out)
    for exp in ("packing", "positional", "context_length"):
        path = out / f"{args.prefix}{exp}.json"
        if not path.exists():
            continue
        rows = json.loads(path.read_text())
        if exp == "packing":
            keys = [run_name(r["packing"], r["fixed_bos"], r["context_length"]) for r in rows]
            title = f"Packing recipes ({rows[0]['preset']} preset, {rows[0]['data']}): sink signals during training"
        elif exp == "positional":
            keys = [f"{r['positional']}-{run_name(r['packing'], r['fixed_bos'], r['context_length'])}" for r in rows]
            title = f"Positional embeddings, fixed <bos> ({rows[0]['preset']} preset, {rows[0]['data']})"
        else:
            keys = [run_name("causal", r["fixed_bos"], r["context_length"]) for r in rows]
            title = (f"Context length ({rows[0]['preset']} preset, {rows[0]['data']}, {rows[0]['steps']} steps, "
                     f"equal tokens per step, scored on {rows[0]['score_tokens']} tokens)")
            context_length_plot(rows, out / f"{args.prefix}context_length.png", title=title)
        logs = {k: json.loads((out / "logs" / exp / f"{args.prefix}{k}.json").read_text()) for k in dict.fromkeys(keys)}
        training_curves(logs, out / f"{args.prefix}{exp}_curves.png", title=title)
        if exp == "packing":
            name = run_name(EMERGENCE_RUN[0], EMERGENCE_RUN[1], rows[0]["context_length"])
            write_emergence(logs[name], name, out, args.prefix)
        print(f"redrew the {exp} figures in {out}")


def findings(out: Path, prefix: str = "") -> dict:
    """The key numbers of every committed experiment as a flat dict of named
    values, read from the JSON under `out` (experiments not run are absent)."""
    flat: dict[str, float | int | None] = {}

    def add_rows(tag: str, rows: list[dict], key) -> None:
        for r in rows:
            base = f"train.{tag}.{key(r)}.{'prepend' if r['inference_bos'] else 'none'}"
            for eps, v in r["sink_rate"].items():
                flat[f"{base}.sink_rate.{eps}"] = v
            for k in ("max_head_score", "mean_head_score", "uniform_score", "val_loss"):
                flat[f"{base}.{k}"] = r[k]
            if r["inference_bos"]:
                flat[f"train.{tag}.{key(r)}.train_seconds"] = r["train_seconds"]

    def fixed(r: dict) -> str:
        return "fixedbos" if r["fixed_bos"] else "nofixedbos"

    path = out / f"{prefix}packing.json"
    if path.exists():
        add_rows("table2", json.loads(path.read_text()), lambda r: f"{r['packing']}.{fixed(r)}")
    path = out / f"{prefix}positional.json"
    if path.exists():
        add_rows("positional", json.loads(path.read_text()), lambda r: r["positional"])
    # modes.json, seedN_modes.json (rows named by experiment and run), explore_modes.json (older rows, named by
    # positional embedding, depth and width)
    for path in sorted(out.glob(f"{prefix}*modes.json")):
        tag = path.stem[len(prefix):]
        for r in json.loads(path.read_text()):
            cond = "prepend" if r["inference_bos"] else "none"
            if "run" in r:
                model = f"{r['experiment']}.{r['run']}"
            else:
                model = r["positional"] if "explore" not in tag else f"{r['positional']}.L{r['n_layers']}H{r['n_heads']}"
            stats = [k for k in r if k.startswith(("trigger_", "other_")) and isinstance(r[k], list)]
            for l, heads in enumerate(r["trigger_first"]):
                for h in range(len(heads)):
                    for k in stats:
                        flat[f"train.{tag}.{model}.{cond}.L{l}H{h}.{k}"] = r[k][l][h]
    path = out / f"{prefix}explore_positional.json"  # exploratory variants, named by their depth and width
    if path.exists():
        add_rows("explore", json.loads(path.read_text()),
                 lambda r: f"{r['positional']}.L{r['n_layers']}H{r['n_heads']}.steps{r['steps']}")
    path = out / f"{prefix}context_length.json"
    if path.exists():
        rows = json.loads(path.read_text())
        add_rows("context_length", rows, lambda r: f"T{r['context_length']}")
        flat["train.context_length.score_tokens"] = rows[0]["score_tokens"]
    path = out / f"{prefix}emergence.json"
    if path.exists():
        em = json.loads(path.read_text())
        for eps, step in em["cross_step"].items():
            flat[f"train.emergence.cross_step.{eps}"] = step
        for eps, step in em["stable_step"].items():
            flat[f"train.emergence.stable_step.{eps}"] = step
        flat["train.emergence.final.first_token_score"] = em["first_token_score"][-1]
        for k in ("bos_value_norm", "other_value_norm", "bos_resid_norm", "other_resid_norm"):
            flat[f"train.emergence.first.{k}"] = em[k][0]
            flat[f"train.emergence.final.{k}"] = em[k][-1]
        if em["loss_post_trigger"] is not None:
            for k in ("loss_post_trigger", "loss_rest"):
                flat[f"train.emergence.first.{k}"] = em[k][0]
                flat[f"train.emergence.final.{k}"] = em[k][-1]
    # More seeds (--seed N --prefix seedN_): the spread of each row over seeds.
    for exp, tag, key in (("packing", "table2_seeds", lambda r: f"{r['packing']}.{fixed(r)}"),
                          ("positional", "positional_seeds", lambda r: r["positional"]),
                          ("context_length", "context_length_seeds", lambda r: f"T{r['context_length']}")):
        seeds = sorted(out.glob(f"{prefix}seed*_{exp}.json"))
        if not seeds or not (out / f"{prefix}{exp}.json").exists():
            continue
        tables = [json.loads((out / f"{prefix}{exp}.json").read_text())]
        tables += [json.loads(p.read_text()) for p in seeds]
        flat[f"train.{tag}.n_seeds"] = len(tables)
        flat[f"train.{tag}.seeds"] = ",".join(str(t[0]["seed"]) for t in tables)
        for i, r in enumerate(tables[0]):
            base = f"train.{tag}.{key(r)}.{'prepend' if r['inference_bos'] else 'none'}"
            for name, get in (("sink_rate.0.3", lambda x: x["sink_rate"]["0.3"]),
                              ("sink_rate.0.8", lambda x: x["sink_rate"]["0.8"]),
                              ("max_head_score", lambda x: x["max_head_score"]), ("val_loss", lambda x: x["val_loss"])):
                vals = [get(t[i]) for t in tables if i < len(t) and key(t[i]) == key(r)]
                flat[f"{base}.{name}.mean"] = sum(vals) / len(vals)
                flat[f"{base}.{name}.min"] = min(vals)
                flat[f"{base}.{name}.max"] = max(vals)
    for path in sorted(out.glob(f"{prefix}seed*_emergence.json")):
        em = json.loads(path.read_text())
        seed = path.name[len(prefix):].split("_")[0]
        for eps, step in em["cross_step"].items():
            flat[f"train.emergence_seeds.{seed}.cross_step.{eps}"] = step
        for eps, step in em["stable_step"].items():
            flat[f"train.emergence_seeds.{seed}.stable_step.{eps}"] = step
    path = out / f"{prefix}mask_self.json"
    if path.exists():
        rows = json.loads(path.read_text())
        seed_findings(flat, "mask_self", rows, lambda r: "rotary")
        mask_self_contrasts(flat, out, prefix, rows)
        for r in rows:  # the sink's small value (Guo et al. 2024), per head
            for l, heads in enumerate(r.get("value_norm_first", [])):
                for h, v in enumerate(heads):
                    base = f"train.mask_self.rotary.seed{r['seed']}.{_cond(r)}.L{l}H{h}"
                    flat[f"{base}.value_norm_first"] = v
                    flat[f"{base}.value_norm_rest"] = r["value_norm_rest"][l][h]
    for tag in ("depth", "depth_at_step"):
        path = out / f"{prefix}{tag}.json"
        if path.exists():
            seed_findings(flat, tag, json.loads(path.read_text()), lambda r: f"{r['positional']}.L{r['n_layers']}")
    context_length_findings(flat, out, prefix)
    path = out / f"{prefix}text.json"
    if path.exists():
        rows = json.loads(path.read_text())
        text_findings(flat, rows)
        text_step_findings(flat, out / "logs" / "text", prefix, rows)
    path = out / f"{prefix}bench_train.json"
    if path.exists():
        bench = json.loads(path.read_text())
        for k, v in bench.items():
            if isinstance(v, (int, float)):
                flat[f"train.bench.{k}"] = v
    return flat


def _cond(r: dict) -> str:
    return "prepend" if r["inference_bos"] else "none"


def _with_twin(rows: list[dict]) -> list[tuple[dict, dict]]:
    """(with-`<bos>` row, its without-`<bos>` twin) pairs: rows evaluated both
    ways share every key but the inference condition's."""
    pairs = []
    for r in rows:
        if not r["inference_bos"]:
            continue
        twin = [t for t in rows if not t["inference_bos"] and t.get("run") == r.get("run") and t["seed"] == r["seed"]]
        if len(twin) != 1:
            raise ValueError(f"run {r.get('run')} (seed {r['seed']}) has {len(twin)} rows without <bos>, not 1")
        pairs.append((r, twin[0]))
    return pairs


def seed_findings(flat: dict, tag: str, rows: list[dict], key) -> None:
    """Per seed and inference condition: sink rates (whole model and per layer),
    max alpha_0, val loss; per setting, the mean and 95 % t interval over seeds
    of the sink rate, max alpha_0 and the loss gap without `<bos>`."""
    groups: dict[str, list[tuple[dict, dict]]] = {}
    for r, t in _with_twin(rows):
        groups.setdefault(key(r), []).append((r, t))
        for row in (r, t):
            base = f"train.{tag}.{key(r)}.seed{r['seed']}.{_cond(row)}"
            for eps, v in row["sink_rate"].items():
                flat[f"{base}.sink_rate.{eps}"] = v
            for eps, per_layer in row.get("layer_sink_rate", {}).items():
                for l, v in enumerate(per_layer):
                    flat[f"{base}.layer_sink_rate.L{l}.{eps}"] = v
            for k in ("max_head_score", "mean_head_score", "val_loss"):
                flat[f"{base}.{k}"] = row[k]
        flat[f"train.{tag}.{key(r)}.seed{r['seed']}.loss_gap"] = t["val_loss"] - r["val_loss"]
        flat[f"train.{tag}.{key(r)}.seed{r['seed']}.train_seconds"] = r["train_seconds"]
        flat[f"train.{tag}.{key(r)}.steps"] = r["steps"]
        flat[f"train.{tag}.{key(r)}.uniform_score"] = r["uniform_score"]
    for k, pairs in groups.items():
        flat[f"train.{tag}.{k}.n_seeds"] = len(pairs)
        series = {
            "prepend.sink_rate.0.3": [r["sink_rate"]["0.3"] for r, _ in pairs],
            "none.sink_rate.0.3": [t["sink_rate"]["0.3"] for _, t in pairs],
            "prepend.max_head_score": [r["max_head_score"] for r, _ in pairs],
            "none.max_head_score": [t["max_head_score"] for _, t in pairs],
            "prepend.val_loss": [r["val_loss"] for r, _ in pairs],
            "loss_gap": [t["val_loss"] - r["val_loss"] for r, t in pairs],
        }
        n_layers = pairs[0][0]["n_layers"]
        if all("layer_sink_rate" in r for r, _ in pairs):
            for l in range(n_layers):
                series[f"prepend.layer_sink_rate.L{l}.0.3"] = [r["layer_sink_rate"]["0.3"][l] for r, _ in pairs]
                series[f"none.layer_sink_rate.L{l}.0.3"] = [t["layer_sink_rate"]["0.3"][l] for _, t in pairs]
        for name, vals in series.items():
            flat[f"train.{tag}.{k}.{name}.min"] = min(vals)
            flat[f"train.{tag}.{k}.{name}.max"] = max(vals)
            if len(vals) >= 2:
                for stat, v in seed_interval(vals).items():
                    if stat != "n":
                        flat[f"train.{tag}.{k}.{name}.{stat}"] = v


def mask_self_contrasts(flat: dict, out: Path, prefix: str, rows: list[dict]) -> None:
    """Paired over seeds (a seed fixes the data and the initialisation): max
    alpha_0 with `<bos>` minus without, in the masked runs and in the unmasked
    rotary runs of the positional experiment; and masked minus unmasked, with
    `<bos>`. Mean and 95 % t interval of each difference."""
    unmasked = {}
    for path in [out / f"{prefix}positional.json", *sorted(out.glob(f"{prefix}seed*_positional.json"))]:
        if path.exists():
            for r in json.loads(path.read_text()):
                if r["positional"] == "rotary" and not r.get("mask_self"):
                    unmasked[(r["seed"], r["inference_bos"])] = r
    masked = {(r["seed"], r["inference_bos"]): r for r in rows}
    seeds = sorted({s for s, _ in masked})
    base = "train.mask_self.contrast"
    diffs = {
        "masked.bos_minus_nobos.max_head_score": [masked[(s, True)]["max_head_score"] - masked[(s, False)]["max_head_score"]
                                                  for s in seeds],
    }
    both = [s for s in seeds if (s, True) in unmasked and (s, False) in unmasked]
    if len(both) >= 2:
        diffs["unmasked.bos_minus_nobos.max_head_score"] = [
            unmasked[(s, True)]["max_head_score"] - unmasked[(s, False)]["max_head_score"] for s in both]
        diffs["masked_minus_unmasked.prepend.max_head_score"] = [
            masked[(s, True)]["max_head_score"] - unmasked[(s, True)]["max_head_score"] for s in both]
        diffs["masked_minus_unmasked.prepend.sink_rate.0.3"] = [
            masked[(s, True)]["sink_rate"]["0.3"] - unmasked[(s, True)]["sink_rate"]["0.3"] for s in both]
        diffs["masked_minus_unmasked.prepend.val_loss"] = [
            masked[(s, True)]["val_loss"] - unmasked[(s, True)]["val_loss"] for s in both]
        for s in both:
            for cond in (True, False):
                r = unmasked[(s, cond)]
                flat[f"{base}.unmasked.seed{s}.{'prepend' if cond else 'none'}.max_head_score"] = r["max_head_score"]
                flat[f"{base}.unmasked.seed{s}.{'prepend' if cond else 'none'}.sink_rate.0.3"] = r["sink_rate"]["0.3"]
    for name, vals in diffs.items():
        if len(vals) >= 2:
            for stat, v in seed_interval(vals).items():
                flat[f"{base}.{name}.{stat}"] = v


def context_length_findings(flat: dict, out: Path, prefix: str) -> None:
    """Across the seed tables of the context-length experiment: per context, the
    mean and 95 % t interval over seeds of max alpha_0 (with and without
    `<bos>`) and the loss gap; and per seed the least-squares slope of each on
    log2 T, with its interval over seeds (zero inside it: no detectable trend)."""
    paths = [out / f"{prefix}context_length.json", *sorted(out.glob(f"{prefix}seed*_context_length.json"))]
    tables = [json.loads(p.read_text()) for p in paths if p.exists()]
    if len(tables) < 2:
        return
    rows = [r for t in tables for r in t]
    by_t: dict[int, list[tuple[dict, dict]]] = {}
    for r in rows:
        if r["inference_bos"]:
            (twin,) = [t for t in rows if not t["inference_bos"] and t["seed"] == r["seed"]
                       and t["context_length"] == r["context_length"]]
            by_t.setdefault(r["context_length"], []).append((r, twin))
    lengths = sorted(by_t)
    series = {"prepend.max_head_score": lambda r, t: r["max_head_score"],
              "none.max_head_score": lambda r, t: t["max_head_score"],
              "prepend.sink_rate.0.3": lambda r, t: r["sink_rate"]["0.3"],
              "loss_gap": lambda r, t: t["val_loss"] - r["val_loss"]}
    base = "train.context_length_seeds"
    flat[f"{base}.lengths"] = ",".join(str(T) for T in lengths)
    for T in lengths:
        flat[f"{base}.T{T}.context_length"] = T
        for name, get in series.items():
            for stat, v in seed_interval([get(r, t) for r, t in by_t[T]]).items():
                flat[f"{base}.T{T}.{name}.{stat}"] = v
    seeds = sorted({r["seed"] for pairs in by_t.values() for r, _ in pairs})
    # The trend over every context, and over the contexts where the sink is robust: every seed's
    # with-<bos> model has alpha_0 > 0.3 on every prompt.
    robust = [T for T in lengths if all(r["sink_rate"]["0.3"] == 100.0 for r, _ in by_t[T])]
    flat[f"{base}.robust_lengths"] = ",".join(str(T) for T in robust)
    for tag, subset in (("slope_per_doubling", lengths), ("slope_per_doubling_robust", robust)):
        if len(subset) < 2:
            continue
        for name, get in series.items():
            slopes = []
            for seed in seeds:
                pts = [(math.log2(T), get(r, t)) for T in subset for r, t in by_t[T] if r["seed"] == seed]
                slopes.append(slope([x for x, _ in pts], [y for _, y in pts]))
            for stat, v in seed_interval(slopes).items():
                flat[f"{base}.{tag}.{name}.{stat}"] = v


def text_findings(flat: dict, rows: list[dict]) -> None:
    """Per natural-text run: sink rates (whole model, per layer), max alpha_0,
    val loss with and without `<bos>`, the loss gap, and the two conditions
    of the half-the-heads target (>= 50 % of (prompt, head) pairs > 0.3 with `<bos>`; that rate
    at most half as large without it)."""
    best = None
    for r, t in _with_twin(rows):
        base = f"train.text.{r['run']}"
        for row in (r, t):
            for eps, v in row["sink_rate"].items():
                flat[f"{base}.{_cond(row)}.sink_rate.{eps}"] = v
            for eps, per_layer in row.get("layer_sink_rate", {}).items():
                for l, v in enumerate(per_layer):
                    flat[f"{base}.{_cond(row)}.layer_sink_rate.L{l}.{eps}"] = v
            for k in ("max_head_score", "mean_head_score", "val_loss"):
                flat[f"{base}.{_cond(row)}.{k}"] = row[k]
        flat[f"{base}.loss_gap"] = t["val_loss"] - r["val_loss"]
        for k in ("steps", "train_seconds", "n_layers", "n_heads", "d_model", "context_length", "weight_decay",
                  "tokens_per_step", "uniform_score"):
            flat[f"{base}.{k}"] = r[k]
        if "lr" in r:
            flat[f"{base}.lr"] = r["lr"]
        flat[f"{base}.tokens_seen"] = r["steps"] * r["tokens_per_step"]
        rate, rate_none = r["sink_rate"]["0.3"], t["sink_rate"]["0.3"]
        flat[f"{base}.half_heads_sink_and_halved_without_bos"] = rate >= 50.0 and rate_none <= rate / 2
        if best is None or rate > best[1]:
            best = (r["run"], rate)
    if best is not None:
        flat["train.text.closest_run"] = best[0]
        flat["train.text.closest_run.prepend.sink_rate.0.3"] = best[1]
    text_seed_findings(flat, rows)


def text_step_findings(flat: dict, logs: Path, prefix: str, rows: list[dict]) -> None:
    """Per natural-text run, from its log: at every evaluation step, the sink
    rate at 0.3 and max alpha_0 with `<bos>` (under
    `train.text.<run>.at_step.<step>`), and the first step at which a head
    passed 0.3 (`first_sink_step`, absent if none did): does longer training
    add sink heads, or only sharpen the first?"""
    for run in dict.fromkeys(r["run"] for r in rows if r["inference_bos"]):
        path = logs / f"{prefix}{run}.json"
        if not path.exists():
            raise ValueError(f"no {path}: the log of a run in text.json")
        for e in json.loads(path.read_text())["evals"]:
            cond = e["conditions"]["prepend"]
            base = f"train.text.{run}.at_step.{e['step']}"
            flat[f"{base}.prepend.sink_rate.0.3"] = cond["sink_rate"]["0.3"]
            flat[f"{base}.prepend.max_head_score"] = cond["max_head_score"]
            if cond["max_head_score"] > 0.3 and f"train.text.{run}.first_sink_step" not in flat:
                flat[f"train.text.{run}.first_sink_step"] = e["step"]


def text_seed_findings(flat: dict, rows: list[dict]) -> None:
    """A natural-text recipe run with two or more seeds (run names equal but
    for `-s<seed>`): the mean over seeds and its 95 % t interval of the loss
    gap without `<bos>`, max alpha_0 in both conditions and the sink rate at
    0.3 with `<bos>`, under `train.text.seeds.<recipe>`."""
    recipes: dict[str, list[tuple[dict, dict]]] = {}
    for r, t in _with_twin(rows):
        recipes.setdefault(_recipe(r["run"]), []).append((r, t))
    for recipe, pairs in recipes.items():
        if len(pairs) < 2:
            continue
        pairs.sort(key=lambda pair: pair[0]["seed"])
        base = f"train.text.seeds.{recipe}"
        flat[f"{base}.seeds"] = ",".join(str(r["seed"]) for r, _ in pairs)
        stats = {"loss_gap": [t["val_loss"] - r["val_loss"] for r, t in pairs],
                 "prepend.max_head_score": [r["max_head_score"] for r, _ in pairs],
                 "none.max_head_score": [t["max_head_score"] for _, t in pairs],
                 "prepend.sink_rate.0.3": [r["sink_rate"]["0.3"] for r, _ in pairs]}
        for name, values in stats.items():
            for stat, v in seed_interval(values).items():
                flat[f"{base}.{name}.{stat}"] = v


def cmd_findings(args) -> dict:
    out = Path(args.out)
    flat = findings(out, args.prefix)
    if not flat:
        raise ValueError(f"no experiment JSON under {out}")
    (out / f"{args.prefix}findings_train.json").write_text(json.dumps(flat, indent=1))
    if "train.context_length_seeds.lengths" in flat:  # the intervals over seeds, drawn from the findings
        context_length_seeds_plot(flat, out / f"{args.prefix}context_length_seeds.png",
                                  title=f"Context length, seeds {flat['train.context_length_seeds.seeds']}: "
                                        "every model scored on the same tokens")
    print(f"wrote {len(flat)} values to {out / (args.prefix + 'findings_train.json')}")
    return flat


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="experiment", required=True)
    for name, func in (("packing", cmd_packing), ("positional", cmd_positional), ("context-length", cmd_context_length),
                       ("mask-self", cmd_mask_self), ("depth", cmd_depth), ("text", cmd_text)):
        p = sub.add_parser(name)
        p.add_argument("--preset", choices=sorted(PRESETS), default="text" if name == "text" else "cpu")
        p.add_argument("--jobs", type=int, default=1, help="independent runs trained at once, in separate processes")
        p.add_argument("--steps", type=int, default=None, help="override the preset's step count")
        p.add_argument("--threads", type=int, default=None, help="torch threads (cpu preset: 1)")
        p.add_argument("--data", choices=["text", "bigram_backcopy"], default=None, help="override the data source")
        p.add_argument("--seed", type=int, default=None)
        p.add_argument("--eval-every", type=int, default=None)
        p.add_argument("--out", default="figures/train", help="where JSON, markdown and figures go")
        p.add_argument("--runs-dir", default="runs/train", help="where checkpoints go")
        p.add_argument("--prefix", default="", help="prefix for output file names (e.g. 'gpu_')")
        p.add_argument("--quiet", action="store_true", help="no progress bars")
        p.add_argument("--set", nargs="+", default=None, metavar="KEY=VALUE",
                       help="override any TrainConfig field, e.g. --set tokens_per_step=512 val_windows=2")
        if name == "context-length":
            p.add_argument("--lengths", type=int, nargs="+", default=None)
            p.add_argument("--no-fixed-bos", dest="fixed_bos", action="store_false",
                           help="train without a fixed <bos> (default: with)")
        if name == "positional":
            p.add_argument("--positionals", nargs="+", choices=POSITIONALS, default=list(POSITIONAL_RUNS))
        if name in ("mask-self", "depth"):
            p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
        if name == "depth":
            p.add_argument("--depths", type=int, nargs="+", default=[1, 2, 4])
            p.add_argument("--positionals", nargs="+", choices=POSITIONALS, default=["rotary", "standard"])
            p.add_argument("--deep-steps", type=int, default=None, help="steps for depths >= 4 (default: the preset's)")
            p.add_argument("--fresh", action="store_true",
                           help="train the 1- and 2-layer runs anew instead of reusing the positional runs' logs")
            p.add_argument("--deep-seeds", type=int, default=None,
                           help="depths above 1 for the first N seeds only (default: every seed)")
        if name == "text":
            p.add_argument("--depths", type=int, nargs="+", default=[2])
            p.add_argument("--weight-decays", type=float, nargs="+", default=[0.1, 0.0])
            p.add_argument("--fixed-bos", nargs="+", choices=["yes", "no"], default=["yes", "no"])
        p.set_defaults(func=func)
    p = sub.add_parser("modes", help="where every head's attention goes, from the runs' logs")
    p.add_argument("--out", default="figures/train")
    p.add_argument("--prefix", default="")
    p.set_defaults(func=cmd_modes)
    for name, func, help_ in (("replot", cmd_replot, "redraw figures from the JSON under --out"),
                              ("findings", cmd_findings, "write findings_train.json from the JSON under --out")):
        p = sub.add_parser(name, help=help_)
        p.add_argument("--out", default="figures/train")
        p.add_argument("--prefix", default="")
        p.set_defaults(func=func)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    try:
        args.func(args)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
