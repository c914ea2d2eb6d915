"""`sinkmech patch`, `sinkmech ablate`, `sinkmech perturb`: the intervention commands."""

from __future__ import annotations

import json

from sinkmech.cli.main import _add_common, _conditions, _write_json


def _prompts_arg(args):
    """--prompts, cut to the first --n-prompts when given."""
    from sinkmech.prompts import load_prompts

    if args.n_prompts is None:
        return args.prompts
    if args.n_prompts < 1:
        raise ValueError(f"--n-prompts must be >= 1, got {args.n_prompts}")
    return load_prompts(args.prompts)[: args.n_prompts]


def _add_intervention_common(p) -> None:
    _add_common(p)
    p.add_argument("--n-prompts", type=int, default=None, help="use only the first N prompts")


def _add_metric(p) -> None:
    p.add_argument("--metric", choices=["kl", "logit_diff"], default="kl", help="kl: mean KL over content positions (default)")
    p.add_argument("--answers", nargs=2, metavar=("CORRECT", "INCORRECT"), default=None, help="tokens (strings) for --metric logit_diff")


def _answers(model, args):
    if args.answers is None:
        return None
    ids = []
    for text in args.answers:
        toks = model.tokenizer(text, add_special_tokens=False)["input_ids"] if model.tokenizer is not None else []
        if len(toks) != 1:
            raise ValueError(f"answer {text!r} must be exactly one token, got {len(toks)}")
        ids.append(toks[0])
    return tuple(ids)


def _limits(panels, signed: bool = False) -> dict:
    """One colour scale for all panels (heatmap_panels autoscales each otherwise)."""
    import numpy as np

    vals = np.concatenate([np.asarray(a, dtype=float).ravel() for _, a in panels])
    vals = vals[np.isfinite(vals)]
    hi = float(vals.max()) if vals.size else 1.0
    lo = float(vals.min()) if vals.size else 0.0
    return {"vmin": lo, "vmax": hi} if signed else {"vmin": 0.0, "vmax": max(hi, 1e-12)}


def _grid(values):
    """A 2-D array for a heatmap from a result tensor of 1-3 axes."""
    v = values.float()
    if v.ndim == 1:
        return v[:, None].numpy()
    if v.ndim == 3:
        return v.mean(-1).numpy()
    return v.numpy()


# sinkmech patch ------------------------------------------------------------

BOS_LABEL = {"prepend": "<bos> run", "none": "no-<bos> run"}


def add_patch_parser(sub) -> None:
    p = sub.add_parser("patch", help="activation patching between the <bos> and no-<bos> runs")
    _add_intervention_common(p)
    p.add_argument("--act", choices=["resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "z", "q", "k", "v"], default="resid_pre")
    p.add_argument("--by", choices=["layer_pos", "layer", "head", "head_pos"], default=None, help="default: layer_pos for residual activations, head for z/q/k/v")
    p.add_argument("--source", choices=["prepend", "none", "both"], default="both", help="run the activations come from (patched into the other)")
    p.add_argument("--layers", type=int, nargs="+", default=None)
    _add_metric(p)
    p.set_defaults(func=cmd_patch)


def cmd_patch(args) -> None:
    from sinkmech.figures import heatmap_panels, save
    from sinkmech.models import load_model
    from sinkmech.interventions.patching import HEAD_ACTS, bos_pair, patch

    model = load_model(args.model)
    by = args.by or ("head" if args.act in HEAD_ACTS else "layer_pos")
    pair = bos_pair(model, _prompts_arg(args), max_tokens=args.max_tokens)
    results = {}
    for source in _conditions(args.source):
        r = patch(model, pair, act=args.act, by=by, source=source, metric=args.metric,
                  answers=_answers(model, args), layers=args.layers, max_rows=max(args.batch_size, 1) * 8)
        results[source] = r
        print(f"{BOS_LABEL[source]} -> {BOS_LABEL[r.target]}: unpatched {r.metric} {r.baseline:.4f}, "
              f"patched min {float(r.values.min()):.4f} max {float(r.values.max()):.4f}")
    if args.json:
        _write_json(args.json, {
            "model": args.model, "act": args.act, "by": by, "metric": args.metric,
            "n_layers": model.cfg.n_layers, "n_heads": model.cfg.n_heads, "n_prompts": len(pair.with_bos),
            "max_tokens": args.max_tokens, "results": {k: json.loads(r.to_json()) for k, r in results.items()},
        })
    if args.png:
        first = next(iter(results.values()))
        panels = [(f"{BOS_LABEL[k]} into {BOS_LABEL[r.target]}", _grid(r.values)) for k, r in results.items()]
        xlabel = {"layer_pos": "content position", "layer": "", "head": "head", "head_pos": "head (mean over positions)"}[by]
        fig = heatmap_panels(panels, title=f"Patching {args.act} across <bos> / no-<bos> — {args.model}",
                             xlabel=xlabel, ylabel="layer", cbar_label=f"{first.metric} vs source run", **_limits(panels, args.metric != "kl"))
        print(f"wrote {save(fig, args.png)}")


# sinkmech ablate -----------------------------------------------------------


def add_ablate_parser(sub) -> None:
    p = sub.add_parser("ablate", help="per-head sink ablations over every (layer, head)")
    _add_intervention_common(p)
    p.add_argument("--mode", choices=["mask_first", "all_to_first", "zero", "mean"], required=True)
    p.add_argument("--bos", choices=["prepend", "none"], default="prepend")
    p.add_argument("--attribution", action="store_true", help="also estimate by attribution patching and print its correlation")
    p.add_argument("--top", type=int, default=10)
    _add_metric(p)
    p.set_defaults(func=cmd_ablate)


def cmd_ablate(args) -> None:
    from sinkmech.interventions.ablation import head_ablations
    from sinkmech.interventions.attribution import attribute_ablations, pearson
    from sinkmech.figures import heatmap_panels, save
    from sinkmech.models import load_model

    model = load_model(args.model)
    kw = dict(mode=args.mode, bos=args.bos, metric=args.metric, answers=_answers(model, args), max_tokens=args.max_tokens)
    prompts = _prompts_arg(args)
    exact = head_ablations(model, prompts, max_rows=max(args.batch_size, 1) * 8, **kw)
    print(f"{args.mode} ablation (bos={args.bos}), {exact.metric}; clean run {exact.baseline:.4f}")
    for layer, head, value in exact.top_heads(args.top):
        print(f"  L{layer}.H{head}  {value:.4f}")
    payload = {"model": args.model, **exact.to_dict()}
    panels = [("exact", exact.effects.numpy())]
    if args.attribution:
        approx = attribute_ablations(model, prompts, **kw)
        r = pearson(exact.effects, approx.effects)
        print(f"attribution patching: Pearson r = {r:.3f} with the exact effects")
        payload["attribution"] = {"effects": approx.effects.tolist(), "pearson": r}
        panels.append((f"attribution (r = {r:.2f})", approx.effects.numpy()))
    if args.json:
        _write_json(args.json, payload)
    if args.png:
        fig = heatmap_panels(panels, title=f"Per-head {args.mode} ablation (bos={args.bos}) — {args.model}",
                             xlabel="head", ylabel="layer", cbar_label=f"{exact.metric} vs clean run", **_limits(panels, args.metric != "kl"))
        print(f"wrote {save(fig, args.png)}")


# sinkmech perturb ----------------------------------------------------------


def add_perturb_parser(sub) -> None:
    p = sub.add_parser("perturb", help="how far a small input change spreads, with and without <bos>")
    _add_intervention_common(p)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--swap", nargs=2, metavar=("ORIGINAL", "REPLACEMENT"), help="swap a token string (same tokenized length)")
    g.add_argument("--noise", type=float, metavar="SCALE", help="add noise of this relative norm to one input embedding")
    p.add_argument("--position", type=int, default=None, help="content position (required with --noise)")
    p.add_argument("--threshold", type=float, default=0.1, help="relative change counted as reached")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_perturb)


def cmd_perturb(args) -> None:
    from sinkmech.figures import heatmap_panels, save
    from sinkmech.models import load_model
    from sinkmech.perturb import EmbeddingNoise, TokenSwap, perturbation_spread

    if args.noise is not None and args.position is None:
        raise ValueError("--noise needs --position")
    model = load_model(args.model)
    pert = TokenSwap(*args.swap, position=args.position) if args.swap else EmbeddingNoise(args.noise, args.position, args.seed)
    r = perturbation_spread(model, _prompts_arg(args), perturbation=pert, max_tokens=args.max_tokens,
                            threshold=args.threshold, batch_size=args.batch_size)
    s = r.per_layer()
    print(f"{r.kind}: over later positions, mean relative change / fraction > {args.threshold}")
    print(f"{'layer':>6} {'<bos>':>16} {'no <bos>':>16}")
    for l in range(s["mean_change"].shape[1]):
        print(f"{l:>6} " + " ".join(f"{float(s['mean_change'][c, l]):>7.3f} / {float(s['spread_fraction'][c, l]):>5.2f}" for c in range(2)))
    ent = r.entropy.mean((1, 2))
    print(f"mean attention entropy: with <bos> {float(ent[0]):.3f} nats, without {float(ent[1]):.3f} nats")
    if args.json:
        _write_json(args.json, {"model": args.model, **r.to_dict()})
    if args.png:
        import numpy as np

        mean = r.mean_change()
        panels = [(f"with <bos>" if c == "prepend" else "without <bos>", np.nan_to_num(mean[i].numpy())) for i, c in enumerate(r.conditions)]
        fig = heatmap_panels(panels, title=f"Relative residual change, {r.kind} — {args.model}", xlabel="content position",
                             ylabel="layer (0 = embeddings)", cbar_label="||h' - h|| / ||h||", **_limits(panels))
        print(f"wrote {save(fig, args.png)}")

