"""What the training studies' saved logs give without training anything: where
every head's attention goes (`modes`, from each run's last evaluation) and the
studies' figures redrawn from their JSON (`replot`)."""

from __future__ import annotations

from pathlib import Path

from sinkmech.files import json_text, write_text
from sinkmech.hooks import head_label
from sinkmech.prompts import CONDITIONS
from sinkmech.train.config import TrainConfig, run_name
from sinkmech.train.parallel import read_json
from sinkmech.train.presets import EMERGENCE_RUN
from sinkmech.studies.training import write_emergence

MODE_STUDIES = ("positional", "mask_self", "depth")  # bigram-backcopy studies whose heads modes.json reads


def modes(out: Path, prefix: str = "") -> list[dict]:
    """Where each head's attention goes, on trigger queries and on the others
    (`sinkmech.train.modes`): first key, self, previous key (the copy source of
    a trigger query), other copies of the next token, the rest, and the
    normalised entropy, with `<bos>` prepended and without, for every layer
    and head of every run of the positional, mask-self and depth studies
    under `out`. Read from each run's final evaluation in its log (the
    held-out scoring prompts); no model is run. Writes `<prefix>modes.json`."""
    out = Path(out)
    rows = []
    for study in MODE_STUDIES:
        path = out / f"{prefix}{study}.json"
        if not path.exists():
            continue
        for r in read_json(path):
            if not r["inference_bos"]:
                continue
            run = r.get("run") or f"{r['positional']}-{run_name(r['packing'], r['fixed_bos'], r['context_length'])}"
            log_path = out / "logs" / study / f"{prefix}{run}.json"
            if not log_path.exists():
                raise ValueError(f"no {log_path}: the log of a run in {path.name}")
            log = read_json(log_path)
            if "attention" not in log["evals"][-1]["conditions"]["prepend"]:
                print(f"note: {log_path} predates the attention record (no per-class attention): not in modes.json")
                continue
            cfg = TrainConfig.from_dict({**log["config"]})
            if cfg.data != "bigram_backcopy":
                raise ValueError(f"{log_path}: modes need bigram_backcopy data, not {cfg.data}")
            for bos in CONDITIONS:
                att = log["evals"][-1]["conditions"][bos]["attention"]
                tables = {f"{c}_{k}": v for c in ("trigger", "other") for k, v in att[c].items()}
                rows.append({"experiment": study, "run": run, "positional": cfg.positional,
                             "fixed_bos": cfg.fixed_bos, "inference_bos": bos == "prepend", "seed": cfg.seed,
                             "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
                             **({"mask_self": True} if cfg.mask_self else {}), **tables,
                             "n_trigger": att["counts"]["trigger"], "n_other": att["counts"]["other"]})
    if not rows:
        raise ValueError(f"no {', '.join(MODE_STUDIES)} results under {out}: run those experiments first")
    write_text(out / f"{prefix}modes.json", json_text(rows, indent=1))
    print(f"{'run':>28} {'bos':>5}  trigger: first  self  prev  rest | other: first  self  prev  rest  entropy"
          "  (per layer, head)")
    for r in rows:
        for l in range(r["n_layers"]):
            for h in range(r["n_heads"]):
                t = [r[f"trigger_{k}"][l][h] for k in ("first", "self", "prev", "rest")]
                o = [r[f"other_{k}"][l][h] for k in ("first", "self", "prev", "rest", "entropy")]
                print(f"{r['run'] + ' ' + head_label(l, h):>28} {str(r['inference_bos']):>5}  "
                      + " ".join(f"{v:.3f}" for v in t) + " | " + " ".join(f"{v:.3f}" for v in o))
    print(f"wrote {out / (prefix + 'modes.json')}")
    return rows


def replot(out: Path, prefix: str = "") -> None:
    """Redraw the packing, positional and context-length figures (and
    emergence.json / .png) from the JSON and logs a study wrote."""
    from sinkmech.plots.training import context_length_plot, training_curves

    out = Path(out)
    for exp in ("packing", "positional", "context_length"):
        path = out / f"{prefix}{exp}.json"
        if not path.exists():
            continue
        rows = read_json(path)
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
            context_length_plot(rows, out / f"{prefix}context_length.png", title=title)
        logs = {k: read_json(out / "logs" / exp / f"{prefix}{k}.json") for k in dict.fromkeys(keys)}
        training_curves(logs, out / f"{prefix}{exp}_curves.png", title=title)
        if exp == "packing":
            name = run_name(EMERGENCE_RUN[0], EMERGENCE_RUN[1], rows[0]["context_length"])
            write_emergence(logs[name], name, out, prefix)
        print(f"redrew the {exp} figures in {out}")
