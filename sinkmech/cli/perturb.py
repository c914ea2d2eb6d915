"""`sinkmech perturb`: how far a small input change spreads over layers and later
positions, with and without `<bos>` (Barbero et al. 2025, Fig. 2); with
--sensitivity, how well the path-weight bound ranks the Jacobian norms (Sec. 4)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sinkmech.cli.common import (
    UsageError, add_bos_token, add_intervention_common, at_least, bos_token_arg, load_model_arg, non_negative_float,
    non_negative_int, positive_float, positive_int, prompts_arg, run_options, write_results,
)
from sinkmech.cli.shard import BosTokenTask, add_shard_flags, model_settings, sharded
from sinkmech.options import RunOptions

if TYPE_CHECKING:  # annotations only: the module is imported when the command runs
    from sinkmech.interventions.perturb import EmbeddingNoise, TokenSwap


def add_perturb_parser(sub) -> None:
    p = sub.add_parser("perturb", help="how far a small input change spreads, with and without <bos>")
    add_intervention_common(p)
    add_bos_token(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--swap", nargs=2, metavar=("ORIGINAL", "REPLACEMENT"), help="swap a token string (same tokenized length)")
    g.add_argument("--noise", type=non_negative_float, metavar="SCALE", help="add noise of this relative norm to one input embedding")
    p.add_argument("--position", type=non_negative_int, default=None, help="content position (required with --noise)")
    p.add_argument("--threshold", type=positive_float, default=0.1, help="relative change counted as reached")
    p.add_argument("--seed", type=int, default=0, help="seed of the --noise direction (default 0)")
    p.add_argument("--sensitivity", action="store_true",
                   help="also (or only) compare Jacobian norms with path weights, with and without <bos> (JSON key 'sensitivity')")
    p.add_argument("--sensitivity-prompts", type=positive_int, default=4, help="prompts for --sensitivity (default 4)")
    p.add_argument("--sensitivity-tokens", type=at_least(2), default=16, help="content tokens per prompt for --sensitivity (default 16)")
    add_shard_flags(p, ray=True)
    p.set_defaults(func=cmd_perturb)


def perturbation(args) -> TokenSwap | EmbeddingNoise:
    from sinkmech.interventions.perturb import EmbeddingNoise, TokenSwap

    return TokenSwap(*args.swap, position=args.position) if args.swap else EmbeddingNoise(args.noise, args.position, args.seed)


@dataclass(frozen=True, kw_only=True)
class SpreadTask(BosTokenTask):
    """The perturbation spread of one shard (`--shard`, or a Ray worker's): the
    noise of each prompt is the one the whole corpus' run draws for it."""

    perturbation: TokenSwap | EmbeddingNoise
    threshold: float
    batch_size: int

    def run(self, state, shard: int, n_shards: int, index: range, prompts: list):
        from sinkmech.interventions.perturb import perturbation_spread
        from sinkmech.sharding.interventions import spread_partial

        model, bos_id = state
        r = perturbation_spread(model, prompts, perturbation=self.perturbation, max_tokens=self.max_tokens,
                                threshold=self.threshold, first_prompt=index.start,
                                n_prompts_total=self.n_prompts_total,
                                options=RunOptions(batch_size=self.batch_size, progress=False, bos_token_id=bos_id))
        return spread_partial(r, {**self.settings, **model_settings(model), "bos_token_id": bos_id},
                              width=self.max_tokens, **self.where(shard, n_shards, index))


def merged_perturb(part, args) -> None:
    """`sinkmech merge` for perturb parts: the table and --json / --png as `perturb` writes them."""
    from sinkmech.sharding.interventions import spread_result

    spread, png_out = spread_output(spread_result(part), part.settings["model"], args)
    write_results(args, {"model": part.settings["model"], **spread}, png_out)


def cmd_perturb(args) -> None:
    if args.noise is not None and args.position is None:
        raise UsageError("--noise needs --position")
    if args.swap is None and args.noise is None and not args.sensitivity:
        raise UsageError("give --swap, --noise or --sensitivity")
    if args.png and args.swap is None and args.noise is None:
        raise UsageError("--png draws the spread of --swap or --noise; --sensitivity alone has no figure")
    prompts = prompts_arg(args)
    if args.shard is not None or args.ray is not None:
        if args.sensitivity or (args.swap is None and args.noise is None):
            raise UsageError("--shard / --ray shard the spread of --swap or --noise; --sensitivity is a study of "
                             "its first few prompts: run it without them")

    def task(settings: dict) -> SpreadTask:
        return SpreadTask.from_args(args, prompts, settings, perturbation=perturbation(args), threshold=args.threshold,
                                    batch_size=args.batch_size)

    extra = {"swap": args.swap, "noise": args.noise, "position": args.position, "threshold": args.threshold,
             "seed": args.seed}
    if sharded(args, prompts, "perturb", task, merged_perturb, **extra):
        return
    model = load_model_arg(args)
    bos_id = bos_token_arg(model, args)
    payload, png_out = {"model": args.model}, None
    if args.swap is not None or args.noise is not None:
        spread, png_out = _spread(model, prompts, bos_id, args)
        payload.update(spread)
    if args.sensitivity:
        payload["sensitivity"] = _sensitivity(model, prompts, bos_id, args)
    write_results(args, payload, png_out)


def _sensitivity(model, prompts, bos_id, args) -> dict:
    from sinkmech.prompts import CONDITION_LABELS
    from sinkmech.theory.sensitivity import sensitivity_study

    st = sensitivity_study(model, prompts[: args.sensitivity_prompts], max_tokens=args.sensitivity_tokens,
                           options=run_options(args, bos_token_id=bos_id))
    d = st.to_dict()
    print(f"\nsensitivity vs path-weight bound ({d['n_prompts']} prompts x {st.max_tokens} tokens, {st.n_layers} layers): "
          "Spearman correlation of ||dh_j/dh_i|| and path weight over pairs i <= j (i < j)")
    for c in st.conditions:
        print(f"  {CONDITION_LABELS[c]:>10}: {d['spearman_mean'][c]:+.3f} ({d['spearman_off_diagonal_mean'][c]:+.3f})  "
              "per prompt " + " ".join(f"{x:+.2f}" for x in d["spearman"][c]))
    print("rank collapse ||X - 1 mean X|| / ||X|| at the last layer, without / with the sink position")
    for c in st.conditions:
        print(f"  {CONDITION_LABELS[c]:>10}: {d['rank_collapse_without_first'][c][-1]:.3f} / {d['rank_collapse_with_first'][c][-1]:.3f}")
    return d


def _spread(model, prompts, bos_id, args) -> tuple[dict, Callable[[], None]]:
    """The spread study printed; its JSON part and a writer for --png."""
    from sinkmech.interventions.perturb import perturbation_spread

    r = perturbation_spread(model, prompts, perturbation=perturbation(args), max_tokens=args.max_tokens,
                            threshold=args.threshold, options=run_options(args, bos_token_id=bos_id))
    return spread_output(r, args.model, args)


def spread_output(r, model_name: str, args) -> tuple[dict, Callable[[], None]]:
    """A spread printed; its JSON part and a writer for --png."""
    from sinkmech.plots.core import heatmap_panels, save, shared_limits
    from sinkmech.prompts import CONDITION_LABELS

    s = r.per_layer()
    print(f"{r.kind}: over later positions, mean relative change / fraction > {r.threshold:g}")
    print(f"{'layer':>6} {'<bos>':>16} {'no <bos>':>16}")
    for l in range(s["mean_change"].shape[1]):
        print(f"{l:>6} " + " ".join(f"{float(s['mean_change'][c, l]):>7.3f} / {float(s['spread_fraction'][c, l]):>5.2f}" for c in range(2)))
    ent, norm = r.entropy.mean((1, 2)), r.normalized_entropy.nanmean((1, 2))
    print(f"mean normalised attention entropy H / log(n_keys): with <bos> {float(norm[0]):.3f}, without {float(norm[1]):.3f} "
          "(1 = uniform; queries with >= 2 keys)")
    print(f"mean raw attention entropy: with <bos> {float(ent[0]):.3f} nats, without {float(ent[1]):.3f} nats "
          "(not comparable: the <bos> run has one more key per query)")

    def png_out() -> None:
        mean = r.mean_change()
        panels = [(CONDITION_LABELS[c], np.nan_to_num(mean[i].numpy())) for i, c in enumerate(r.conditions)]
        fig = heatmap_panels(panels, title=f"Relative residual change, {r.kind} — {model_name}", xlabel="content position",
                             ylabel="layer (0 = embeddings)", cbar_label="||h' - h|| / ||h||", **shared_limits(panels))
        print(f"wrote {save(fig, args.png)}")

    return r.to_dict(), png_out
