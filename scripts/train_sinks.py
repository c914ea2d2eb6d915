"""When do sinks form? The paper's from-scratch experiments at a chosen scale.

    python scripts/train_sinks.py packing --preset cpu
    python scripts/train_sinks.py context-length --preset cpu
    python scripts/train_sinks.py packing --preset gpu --steps 3   # smoke test anywhere

`packing` (Barbero et al. 2025, Table 2): train with and without a fixed
`<bos>` (and with intra-document masking), evaluate each with and without
`<bos>` at inference. `context-length`: the same model at
several context lengths, tokens per step held constant (their context-length study).
Outputs (under --out, default figures/train): packing.json, packing.md,
packing_curves.png; context_length.json, context_length.png,
context_length_curves.png; logs/<experiment>/<run>.json. Checkpoints go to
--runs-dir/<experiment>/<run>/.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sinkmech.prompts import CONDITIONS  # noqa: E402
from sinkmech.train.config import DATA_SOURCES, PACKINGS, POSITIONALS, run_name  # noqa: E402
from sinkmech.train.run import TrainConfig, TrainResult, train  # noqa: E402
from sinkmech.train_figures import context_length_plot, training_curves  # noqa: E402

# Sizes. cpu: ~3 minutes per run on one core of a shared 2-core machine.
# gpu: ~10 minutes per experiment on one modern GPU (not measured: no GPU was lent).
PRESETS: dict[str, dict] = {
    "cpu": dict(data="bigram_backcopy", context_length=128, tokens_per_step=4096, n_layers=2, d_model=64,
                n_heads=4, steps=800, lr=3e-3, warmup=40, eval_every=100, threads=1),
    "gpu": dict(data="bigram_backcopy", context_length=512, tokens_per_step=65536, n_layers=6, d_model=512,
                n_heads=8, steps=1200, lr=1e-3, warmup=100, eval_every=100, eval_prompts=64, val_windows=64,
                bb_vocab=128, bb_doc_max=1024),
}
CONTEXT_LENGTHS = {"cpu": [32, 64, 128, 256], "gpu": [128, 256, 512, 1024, 2048]}
CONTEXT_STEPS = {"cpu": 600, "gpu": 1000}  # a bit fewer steps: four or five runs per experiment
# (packing, fixed_bos) in the paper's Table 2 order.
RECIPES = [("causal", False), ("causal", True), ("intra_doc", True)]
PAPER_TABLE2 = (
    "Paper (Barbero et al. 2025, Table 2; 120M parameters, 30B tokens; the notes we have do not say which epsilon):\n\n"
    "| trained with | inference `<bos>` | sink rate % | val loss |\n|---|---|---|---|\n"
    "| no fixed `<bos>` | yes | 65.10 | - |\n| no fixed `<bos>` | no | 65.15 | - |\n"
    "| fixed `<bos>` | yes | 90.84 | 2.69 |\n| fixed `<bos>` | no | 0.05 | 7.56 |\n"
)


def hardware() -> str:
    if torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name(0)}"
    return f"cpu: {torch.get_num_threads()} thread(s)"


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


def summary_rows(result: TrainResult, **extra) -> list[dict]:
    """One row per inference condition from a run's final evaluation."""
    final = result.final_eval()
    base = final.val_loss["prepend"]
    rows = []
    for cond in CONDITIONS:
        c = final.conditions[cond]
        rows.append({
            "packing": result.config.packing,
            "fixed_bos": result.config.fixed_bos,
            "inference_bos": cond == "prepend",
            "val_loss": final.val_loss[cond],
            "loss_gap": final.val_loss[cond] - base,
            "sink_rate": c.sink_rate,
            "max_head_score": c.max_head_score,
            "mean_head_score": c.mean_head_score,
            "uniform_score": c.uniform_score,
            "context_length": result.config.context_length,
            "data": result.config.data,
            "steps": result.config.steps,
            "tokens_per_step": result.config.batch_size * result.config.context_length,
            "n_params": result.log["n_params"],
            "train_seconds": round(result.seconds, 1),
            "hardware": hardware(),
            **extra,
        })
    return rows


def packing_table(rows: list[dict]) -> str:
    """Markdown in the shape of the paper's Table 2, plus the continuous signals."""
    lines = [
        "| packing | trained with | inference `<bos>` | sink rate % (eps 0.3) | sink rate % (eps 0.8) "
        "| max head alpha_0 | mean head alpha_0 | uniform alpha_0 | val loss | loss gap |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['packing']} | {'fixed `<bos>`' if r['fixed_bos'] else 'no fixed `<bos>`'} "
            f"| {'yes' if r['inference_bos'] else 'no'} | {r['sink_rate']['0.3']:.2f} | {r['sink_rate']['0.8']:.2f} "
            f"| {r['max_head_score']:.3f} | {r['mean_head_score']:.3f} | {r['uniform_score']:.3f} "
            f"| {r['val_loss']:.3f} | {r['loss_gap']:+.3f} |"
        )
    return "\n".join(lines) + "\n"


def _run(cfg: TrainConfig, args, logs: dict, experiment: str) -> TrainResult:
    name = cfg.run_name
    t = time.perf_counter()
    result = train(cfg, Path(args.runs_dir) / experiment / name, progress=not args.quiet)
    print(f"{name}: {time.perf_counter() - t:.1f} s ({result.log['n_params']} parameters, {hardware()})", flush=True)
    logs[name] = result.log
    out = Path(args.out) / "logs" / experiment
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.prefix}{name}.json").write_text(json.dumps(result.log))
    return result


def cmd_packing(args) -> list[dict]:
    rows, logs = [], {}
    for packing, fixed_bos in RECIPES:
        cfg = preset_config(args, packing=packing, fixed_bos=fixed_bos)
        rows += summary_rows(_run(cfg, args, logs, "packing"), preset=args.preset)
    out = Path(args.out)
    table = packing_table(rows)
    header = (f"# Packing experiment ({args.preset} preset, {rows[0]['data']}, T={rows[0]['context_length']}, "
              f"{rows[0]['steps']} steps, {hardware()})\n\n")
    (out / f"{args.prefix}packing.json").write_text(json.dumps(rows, indent=1))
    (out / f"{args.prefix}packing.md").write_text(header + table + "\n" + PAPER_TABLE2)
    training_curves(logs, out / f"{args.prefix}packing_curves.png",
                    title=f"Packing recipes ({args.preset} preset, {rows[0]['data']}): sink signals during training")
    print(table)
    print(f"wrote {out / (args.prefix + 'packing.json')}, packing.md, packing_curves.png")
    return rows


def cmd_context_length(args) -> list[dict]:
    rows, logs = [], {}
    lengths = args.lengths or CONTEXT_LENGTHS[args.preset]
    steps = args.steps if args.steps is not None else CONTEXT_STEPS[args.preset]
    for T in lengths:
        cfg = preset_config(args, context_length=T, steps=steps, packing="causal", fixed_bos=args.fixed_bos)
        rows += summary_rows(_run(cfg, args, logs, "context_length"), preset=args.preset)
    out = Path(args.out)
    (out / f"{args.prefix}context_length.json").write_text(json.dumps(rows, indent=1))
    title = f"Context length ({args.preset} preset, {rows[0]['data']}, {rows[0]['steps']} steps, equal tokens per step)"
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
    for exp in ("packing", "context_length"):
        path = out / f"{args.prefix}{exp}.json"
        if not path.exists():
            continue
        rows = json.loads(path.read_text())
        if exp == "packing":
            keys = [run_name(r["packing"], r["fixed_bos"], r["context_length"]) for r in rows]
            title = f"Packing recipes ({rows[0]['preset']} preset, {rows[0]['data']}): sink signals during training"
        else:
            keys = [run_name("causal", r["fixed_bos"], r["context_length"]) for r in rows]
            title = (f"Context length ({rows[0]['preset']} preset, {rows[0]['data']}, {rows[0]['steps']} steps, "
                     "equal tokens per step)")
            context_length_plot(rows, out / f"{args.prefix}context_length.png", title=title)
        logs = {k: json.loads((out / "logs" / exp / f"{args.prefix}{k}.json").read_text()) for k in dict.fromkeys(keys)}
        training_curves(logs, out / f"{args.prefix}{exp}_curves.png", title=title)
        print(f"redrew the {exp} figures in {out}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="experiment", required=True)
    for name, func in (("packing", cmd_packing), ("context-length", cmd_context_length)):
        p = sub.add_parser(name)
        p.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
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
        p.set_defaults(func=func)
    p = sub.add_parser("replot", help="redraw figures from the JSON under --out")
    p.add_argument("--out", default="figures/train")
    p.add_argument("--prefix", default="")
    p.set_defaults(func=cmd_replot)
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
