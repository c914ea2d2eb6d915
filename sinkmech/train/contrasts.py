"""Recipe against recipe, paired by seed. A seed fixes the data order and the
initialisation, so two recipes trained with the same seed differ only in the
recipe: the per-seed differences, their mean and 95 % t interval
(`sinkmech.train.intervals`), are the comparison; two intervals that overlap
are not (they can overlap while the paired difference excludes zero).

Also the self-masked runs against the unmasked ones (`mask_self_contrasts`), and the
uniform baseline of a self-masked head (`mask_self`): query 1 can see
only key 0, so uniform attention puts more on the first key than 1/(t+1)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sinkmech.train.intervals import seed_interval
from sinkmech.train.parallel import read_json

Pair = tuple[dict, dict]  # (a run's row with `<bos>`, its row without), one seed
# What a comparison reads from a (with, without) pair of summary rows.
PAIRED_STATS: dict[str, Callable[[dict, dict], float]] = {
    "loss_gap": lambda r, t: t["val_loss"] - r["val_loss"],
    "prepend.sink_rate.0.3": lambda r, t: r["sink_rate"]["0.3"],
    "prepend.max_head_score": lambda r, t: r["max_head_score"],
    "prepend.val_loss": lambda r, t: r["val_loss"],
}
# The natural-text recipe the others change one setting of.
TEXT_BASE_RECIPE = "text-L4H4-wd0.1-fixedbos"


def paired_differences(a: dict[int, Pair], b: dict[int, Pair]) -> dict | None:
    """B minus A, seed by seed, over the seeds both ran: {"seeds": "0,1,2",
    stat: {"mean", "lo", "hi", "n"}} for each of `PAIRED_STATS`; None with
    fewer than two common seeds."""
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        return None
    out: dict = {"seeds": ",".join(str(s) for s in seeds)}
    for name, get in PAIRED_STATS.items():
        out[name] = seed_interval([get(*b[s]) - get(*a[s]) for s in seeds])
    return out


def add_paired(flat: dict, base: str, diff: dict | None) -> None:
    """`diff` (from `paired_differences`) under `<base>.<stat>.<mean|lo|hi|n>`."""
    if diff is None:
        return
    flat[f"{base}.seeds"] = diff["seeds"]
    for name in PAIRED_STATS:
        for stat, v in diff[name].items():
            flat[f"{base}.{name}.{stat}"] = v


def text_recipe_contrasts(flat: dict, recipes: dict[str, dict[int, Pair]], base: str = TEXT_BASE_RECIPE) -> None:
    """Every text recipe against `base`, paired by seed, under
    `train.text.paired.<recipe>_minus_<base>` (recipes sharing fewer than two
    seeds with it are skipped)."""
    if base not in recipes:
        return
    flat["train.text.paired.base"] = base
    for recipe, runs in recipes.items():
        if recipe != base:
            add_paired(flat, f"train.text.paired.{recipe}_minus_{base}", paired_differences(recipes[base], runs))


def depth_contrasts(flat: dict, tag: str, settings: dict[str, dict[int, Pair]]) -> None:
    """Each depth against the shallowest of the same positional embedding,
    paired by seed: `train.<tag>.paired.<positional>.L<n>_minus_L<first>`.
    `settings` is keyed `<positional>.L<n_layers>` as in `seed_findings`."""
    by_pos: dict[str, dict[int, dict[int, Pair]]] = {}
    for key, runs in settings.items():
        pos, _, layers = key.rpartition(".L")
        by_pos.setdefault(pos, {})[int(layers)] = runs
    for pos, depths in by_pos.items():
        first = min(depths)
        for n, runs in sorted(depths.items()):
            if n != first:
                add_paired(flat, f"train.{tag}.paired.{pos}.L{n}_minus_L{first}", paired_differences(depths[first], runs))


def mask_self_contrasts(flat: dict, out: Path, prefix: str, rows: list[dict]) -> None:
    """Paired over seeds (a seed fixes the data and the initialisation): max
    alpha_0 with `<bos>` minus without, in the masked runs and in the unmasked
    rotary runs of the positional experiment; and masked minus unmasked, with
    `<bos>`. Mean and 95 % t interval of each difference."""
    unmasked = {}
    for path in [out / f"{prefix}positional.json", *sorted(out.glob(f"{prefix}seed*_positional.json"))]:
        if path.exists():
            for r in read_json(path):
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


def self_masked_uniform_score(n_tokens: int) -> float:
    """alpha_0 of a head attending uniformly when every query t >= 1 may not
    see its own key: query 0 sees only key 0, query 1 only key 0, query t >= 2
    the t keys 0..t-1; the mean over the `n_tokens` queries of the share on key 0."""
    if n_tokens < 1:
        raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
    return (min(n_tokens, 2) + sum(1.0 / t for t in range(2, n_tokens))) / n_tokens
