"""The training studies' key numbers as one flat dict of named values
(`findings_train.json`), read from the JSON the studies wrote under `out`:
per run and inference condition, and over seeds the mean with its 95 % t
interval (`sinkmech.train.intervals`); studies not run are absent. Three
seeds give a t interval on 2 degrees of freedom (t = 4.30): an interval that
holds zero reads "not detected in these small models", never "does not
reproduce". Heads are named as everywhere in sinkmech
(`sinkmech.hooks.head_label`: `L0.H1`)."""

from __future__ import annotations

import math
from pathlib import Path

from sinkmech.files import json_text, write_text
from sinkmech.hooks import head_label
from sinkmech.train.contrasts import (
    depth_contrasts,
    mask_self_contrasts,
    self_masked_uniform_score,
    text_recipe_contrasts,
)
from sinkmech.train.intervals import seed_interval, slope
from sinkmech.train.parallel import read_json
from sinkmech.train.presets import recipe_name

# Gu et al. 2025 ("When attention sink emerges") trained their 60M-parameter models on 5B tokens (BPE, at
# least one byte of text each); the text runs here count bytes.
GU_ET_AL_TOKENS = 5_000_000_000


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
        add_rows("table2", read_json(path), lambda r: f"{r['packing']}.{fixed(r)}")
    path = out / f"{prefix}positional.json"
    if path.exists():
        add_rows("positional", read_json(path), lambda r: r["positional"])
    # modes.json, seedN_modes.json (rows named by experiment and run), explore_modes.json (older rows, named by
    # positional embedding, depth and width)
    for path in sorted(out.glob(f"{prefix}*modes.json")):
        tag = path.stem[len(prefix):]
        for r in read_json(path):
            cond = "prepend" if r["inference_bos"] else "none"
            if "run" in r:
                model = f"{r['experiment']}.{r['run']}"
            else:
                model = r["positional"] if "explore" not in tag else f"{r['positional']}.L{r['n_layers']}H{r['n_heads']}"
            stats = [k for k in r if k.startswith(("trigger_", "other_")) and isinstance(r[k], list)]
            for l, heads in enumerate(r["trigger_first"]):
                for h in range(len(heads)):
                    for k in stats:
                        flat[f"train.{tag}.{model}.{cond}.{head_label(l, h)}.{k}"] = r[k][l][h]
    path = out / f"{prefix}explore_positional.json"  # exploratory variants, named by their depth and width
    if path.exists():
        add_rows("explore", read_json(path),
                 lambda r: f"{r['positional']}.L{r['n_layers']}H{r['n_heads']}.steps{r['steps']}")
    path = out / f"{prefix}context_length.json"
    if path.exists():
        rows = read_json(path)
        add_rows("context_length", rows, lambda r: f"T{r['context_length']}")
        flat["train.context_length.score_tokens"] = rows[0]["score_tokens"]
    path = out / f"{prefix}emergence.json"
    if path.exists():
        em = read_json(path)
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
        tables = [read_json(out / f"{prefix}{exp}.json")]
        tables += [read_json(p) for p in seeds]
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
        em = read_json(path)
        seed = path.name[len(prefix):].split("_")[0]
        for eps, step in em["cross_step"].items():
            flat[f"train.emergence_seeds.{seed}.cross_step.{eps}"] = step
        for eps, step in em["stable_step"].items():
            flat[f"train.emergence_seeds.{seed}.stable_step.{eps}"] = step
    path = out / f"{prefix}mask_self.json"
    if path.exists():
        rows = read_json(path)
        seed_findings(flat, "mask_self", rows, lambda r: "rotary")
        mask_self_contrasts(flat, out, prefix, rows)
        # The rows' uniform_score ignores the mask; a self-masked head's uniform attention puts more on key 0.
        flat["train.mask_self.rotary.uniform_score"] = self_masked_uniform_score(rows[0]["score_tokens"] + 1)
        flat["train.mask_self.rotary.uniform_score_without_bos"] = self_masked_uniform_score(rows[0]["score_tokens"])
        for r in rows:  # the sink's small value (Guo et al. 2024), per head
            for l, heads in enumerate(r.get("value_norm_first", [])):
                for h, v in enumerate(heads):
                    base = f"train.mask_self.rotary.seed{r['seed']}.{_cond(r)}.{head_label(l, h)}"
                    flat[f"{base}.value_norm_first"] = v
                    flat[f"{base}.value_norm_rest"] = r["value_norm_rest"][l][h]
    for tag in ("depth", "depth_at_step"):
        path = out / f"{prefix}{tag}.json"
        if path.exists():
            seed_findings(flat, tag, read_json(path), lambda r: f"{r['positional']}.L{r['n_layers']}")
    context_length_findings(flat, out, prefix)
    path = out / f"{prefix}text.json"
    if path.exists():
        rows = read_json(path)
        text_findings(flat, rows)
        text_step_findings(flat, out / "logs" / "text", prefix, rows)
    path = out / f"{prefix}text_bos_cost.json"
    if path.exists():  # the <bos> cost the sink heads carry (the text_bos_cost study)
        from sinkmech.studies.text_bos_cost import bos_cost_findings  # torch: only when the control was run

        flat.update(bos_cost_findings(read_json(path)))
    path = out / f"{prefix}bench_train.json"
    if path.exists():
        bench = read_json(path)
        for k, v in bench.items():
            if isinstance(v, (int, float)):
                flat[f"train.bench.{k}"] = v
    return flat


def _cond(r: dict) -> str:
    return "prepend" if r["inference_bos"] else "none"


def _condition_values(flat: dict, base: str, row: dict) -> None:
    """One run under one inference condition, under `<base>.<prepend|none>`:
    sink rates (whole model and per layer), max and mean alpha_0, val loss."""
    base = f"{base}.{_cond(row)}"
    for eps, v in row["sink_rate"].items():
        flat[f"{base}.sink_rate.{eps}"] = v
    for eps, per_layer in row.get("layer_sink_rate", {}).items():
        for l, v in enumerate(per_layer):
            flat[f"{base}.layer_sink_rate.L{l}.{eps}"] = v
    for k in ("max_head_score", "mean_head_score", "val_loss"):
        flat[f"{base}.{k}"] = row[k]


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
            _condition_values(flat, f"train.{tag}.{key(r)}.seed{r['seed']}", row)
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
    if tag.startswith("depth"):
        depth_contrasts(flat, tag, {k: {r["seed"]: (r, t) for r, t in pairs} for k, pairs in groups.items()})


def own_length(row: dict) -> dict | None:
    """A row's sink statistics at its model's own training length (T - 1
    content tokens): its `own_length` record, or the row itself where it was
    scored on all T - 1 tokens anyway (the shortest context); None for a row
    scored on fewer tokens that predates the record."""
    if row.get("own_length"):
        return row["own_length"]
    return row if row.get("score_tokens") == row["context_length"] - 1 else None


def context_length_findings(flat: dict, out: Path, prefix: str) -> None:
    """Across the seed tables of the context-length experiment: per context, the
    mean and 95 % t interval over seeds of max alpha_0 (with and without
    `<bos>`) and the loss gap; and per seed the least-squares slope of each on
    log2 T, with its interval over seeds (zero inside it: no detectable trend)."""
    paths = [out / f"{prefix}context_length.json", *sorted(out.glob(f"{prefix}seed*_context_length.json"))]
    tables = [read_json(p) for p in paths if p.exists()]
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
    if all(own_length(r) and own_length(t) for pairs in by_t.values() for r, t in pairs):
        # every model also scored at its own training length (T - 1 tokens), not only at the shortest context's
        series |= {"own_length.prepend.max_head_score": lambda r, t: own_length(r)["max_head_score"],
                   "own_length.none.max_head_score": lambda r, t: own_length(t)["max_head_score"],
                   "own_length.prepend.sink_rate.0.3": lambda r, t: own_length(r)["sink_rate"]["0.3"]}
    base = "train.context_length_seeds"
    flat[f"{base}.lengths"] = ",".join(str(T) for T in lengths)
    for T in lengths:
        flat[f"{base}.T{T}.context_length"] = T
        for name, get in series.items():
            for stat, v in seed_interval([get(r, t) for r, t in by_t[T]]).items():
                flat[f"{base}.T{T}.{name}.{stat}"] = v
    seeds = sorted({r["seed"] for pairs in by_t.values() for r, _ in pairs})
    # The trend over every context (the test); and, post hoc, over the contexts where the sink came out
    # robust (every seed's with-<bos> model has alpha_0 > 0.3 on every prompt): a subset chosen after
    # seeing these very rates, so its slope is exploratory, not a test.
    robust = [T for T in lengths if all(r["sink_rate"]["0.3"] == 100.0 for r, _ in by_t[T])]
    flat[f"{base}.robust_lengths"] = ",".join(str(T) for T in robust)
    flat[f"{base}.robust_lengths_chosen"] = "post hoc: after seeing the sink rates it is chosen on"
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
            _condition_values(flat, base, row)
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
        seen = max(r["steps"] * r["tokens_per_step"] for r in rows)  # bytes: the text source is byte-level
        flat["train.text.most_bytes_seen"] = seen
        flat["train.text.gu_et_al_tokens_over_most_bytes_seen"] = GU_ET_AL_TOKENS / seen
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
        for e in read_json(path)["evals"]:
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
    0.3 with `<bos>`, under `train.text.seeds.<recipe>`; and each recipe
    against the base recipe paired by seed (`text_recipe_contrasts`)."""
    recipes: dict[str, list[tuple[dict, dict]]] = {}
    for r, t in _with_twin(rows):
        recipes.setdefault(recipe_name(r["run"]), []).append((r, t))
    text_recipe_contrasts(flat, {k: {r["seed"]: (r, t) for r, t in pairs} for k, pairs in recipes.items()})
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


def findings_text(flat: dict) -> str:
    """The file's text: keys sorted, as `sinkmech.findings.record` writes them,
    so a value recorded there and a rewrite here agree."""
    return json_text(dict(sorted(flat.items())), indent=1) + "\n"


def write_findings(out: Path, prefix: str = "") -> dict:
    """`<prefix>findings_train.json` under `out` (and, with the context-length
    seeds, `context_length_seeds.png`, drawn from the findings)."""
    from sinkmech.plots.training import context_length_seeds_plot

    out = Path(out)
    flat = findings(out, prefix)
    if not flat:
        raise ValueError(f"no experiment JSON under {out}")
    write_text(out / f"{prefix}findings_train.json", findings_text(flat))
    if "train.context_length_seeds.lengths" in flat:  # the intervals over seeds, drawn from the findings
        context_length_seeds_plot(flat, out / f"{prefix}context_length_seeds.png",
                                  title=f"Context length, seeds {flat['train.context_length_seeds.seeds']} "
                                        "(mean and 95 % t interval over seeds)")
    print(f"wrote {len(flat)} values to {out / (prefix + 'findings_train.json')}")
    return flat
