"""Natural-text and attention studies: where attention goes (per query class), the self-masked rotary
model, depth/seed experiments, intervals over seeds, the larger text corpus
and parallel runs."""

from __future__ import annotations

import json
import math

import pytest

from sinkmech.options import QUIET
import torch
from jaxtyping import TypeCheckError

from helpers.backends import needs
from sinkmech.cli.main import main
from sinkmech.hooks import act_name
from sinkmech.train.data import corpus_documents, python_docs, text_streams
from sinkmech.studies.training_findings import text_findings, text_seed_findings, text_step_findings
from sinkmech.train.intervals import seed_interval, slope
from sinkmech.train.modes import attention_breakdown, mode_attention, trigger_classes
from sinkmech.train.parallel import same_config
from sinkmech.train.run import TrainConfig, TrainData, build_model, load_checkpoint, save_checkpoint, train
from sinkmech.train.summary import layer_rates

pytestmark = needs("can_train")  # sinkmech.train builds its models from a config

TINY = dict(data="bigram_backcopy", context_length=32, tokens_per_step=256, n_layers=2, d_model=32, n_heads=2,
            eval_prompts=4, val_windows=4, threads=1, warmup=2, positional="rotary")


def study(argv: list[str]) -> int:
    """`sinkmech train study ...`: the training studies."""
    return main(["train", "study", *argv])


def _tokens(cfg: TrainConfig, bos: bool = True) -> torch.Tensor:
    prompts = torch.tensor(TrainData(cfg).prompts)
    return torch.cat([torch.full((len(prompts), 1), cfg.bos_id), prompts], 1) if bos else prompts


def _patterns(model, tokens) -> list[torch.Tensor]:
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("pattern"))
    return [cache[act_name("pattern", l)] for l in range(model.cfg.n_layers)]


def test_mask_self_hides_the_own_key_and_survives_a_reload(tmp_path):
    cfg = TrainConfig(steps=1, mask_self=True, **TINY)
    tokens = _tokens(cfg)
    masked, plain = build_model(cfg, "cpu"), build_model(TrainConfig(steps=1, **TINY), "cpu")
    for pattern in _patterns(masked, tokens):
        diag = pattern.diagonal(dim1=-2, dim2=-1)  # [batch, head, pos]
        assert diag[..., 0].eq(1).all() and diag[..., 1:].abs().max() == 0  # query 0 sees only itself
        assert torch.allclose(pattern.sum(-1), torch.ones(()), atol=1e-5)
    assert _patterns(plain, tokens)[0].diagonal(dim1=-2, dim2=-1)[..., 1:].min() > 0  # the control attends to itself
    save_checkpoint(masked, cfg, tmp_path)
    reloaded, cfg2 = load_checkpoint(tmp_path, device="cpu")
    assert cfg2.mask_self and _patterns(reloaded, tokens)[1].diagonal(dim1=-2, dim2=-1)[..., 1:].abs().max() == 0
    # The permanent hook stays through the hooked passes that evaluation uses.
    b = attention_breakdown(reloaded, tokens, trigger_classes(tokens, n_triggers=cfg.bb_triggers))
    assert all(float(stats["self"].abs().max()) == 0 for stats in b.classes.values())


def brute_force(pattern: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Test oracle: loop over every counted query of one layer."""
    B, H, P, _ = pattern.shape
    sums = {k: torch.zeros(H) for k in ("first", "self", "prev", "copy", "rest", "entropy")}
    n = 0
    for b in range(B):
        for q in range(2, P - 1):
            if not mask[b, q]:
                continue
            n += 1
            for h in range(H):
                row = pattern[b, h, q, : q + 1].double()
                parts = {"first": row[0], "self": row[q], "prev": row[q - 1]}
                parts["copy"] = sum(row[k] for k in range(1, q - 1) if tokens[b, k] == tokens[b, q + 1])
                parts["rest"] = 1 - sum(parts.values())
                parts["entropy"] = -sum(p * math.log(p) for p in row.tolist() if p > 0) / math.log(q + 1)
                for k, v in parts.items():
                    sums[k][h] += float(v)
    return {k: v / n for k, v in sums.items()}


def test_attention_breakdown_matches_a_brute_force_loop():
    cfg = TrainConfig(steps=1, **TINY)
    model = build_model(cfg, "cpu")
    tokens = _tokens(cfg)
    classes = trigger_classes(tokens, n_triggers=cfg.bb_triggers)
    b = attention_breakdown(model, tokens, classes)
    for l, pattern in enumerate(_patterns(model, tokens)):
        for c, mask in classes.items():
            want = brute_force(pattern, tokens, mask)
            for k, v in want.items():
                assert torch.allclose(b.classes[c][k][l], v.float(), atol=1e-4), (l, c, k)
    assert b.counts["trigger"] == int(classes["trigger"][:, 2:-1].sum())
    total = sum(b.classes["other"][k] for k in ("first", "self", "prev", "copy", "rest"))
    assert torch.allclose(total, torch.ones_like(total), atol=1e-5)


def test_planted_heads_read_self_uniform_and_if_else():
    """Head 0 of layer 0 planted on its own key (entropy 0); head 1 uniform
    (entropy 1, first = mean 1/(q+1)); layer 1 head 0 the ideal if-else head."""
    cfg = TrainConfig(steps=1, **TINY)
    model = build_model(cfg, "cpu")
    tokens = _tokens(cfg)
    T = tokens.shape[1]
    causal = torch.tril(torch.ones(T, T))
    trig = tokens < cfg.bb_triggers
    ideal = torch.zeros(len(tokens), T, T)
    q = torch.arange(1, T)
    ideal[:, :, 0] = 1.0
    ideal[:, q, 0] = torch.where(trig[:, q], 0.0, 1.0)
    ideal[:, q, q - 1] += torch.where(trig[:, q], 1.0, 0.0)

    def plant(pattern, hook):
        out = pattern.clone()
        if hook.layer() == 0:
            out[:, 0] = torch.eye(T)
            out[:, 1] = causal / causal.sum(-1, keepdim=True)
        else:
            out[:, 0] = ideal
        return out

    with model.hooks(fwd_hooks=[(act_name("pattern", l), plant) for l in range(2)]):
        m = mode_attention(model, tokens, n_triggers=cfg.bb_triggers)
    assert m.other_self[0, 0] == pytest.approx(1.0) and m.other_entropy[0, 0] == pytest.approx(0.0, abs=1e-5)
    assert m.trigger_self[0, 0] == pytest.approx(1.0) and m.other_rest[0, 0] == pytest.approx(0.0, abs=1e-5)
    assert m.other_entropy[0, 1] == pytest.approx(1.0, abs=1e-5)
    assert m.other_first[0, 1] == pytest.approx(float((1.0 / torch.arange(3, T)).mean()), rel=0.2)
    assert m.trigger_prev[1, 0] == pytest.approx(1.0) and m.other_first[1, 0] == pytest.approx(1.0)
    assert m.other_prev[1, 0] == pytest.approx(0.0) and m.trigger_entropy[1, 0] == pytest.approx(0.0, abs=1e-5)


def test_seed_interval_and_slope():
    iv = seed_interval([1.0, 2.0, 3.0])
    assert iv["mean"] == 2.0 and iv["n"] == 3
    assert iv["hi"] - 2.0 == pytest.approx(4.303 * 1.0 / math.sqrt(3), abs=1e-3)  # sd 1, t_{0.975,2} = 4.303 (table)
    assert seed_interval([5.0, 5.0])["lo"] == 5.0  # no spread, no width
    with pytest.raises(ValueError, match="at least 2"):
        seed_interval([1.0])
    assert slope([1.0, 2.0, 3.0], [2.0, 4.0, 6.0]) == pytest.approx(2.0) and slope([1.0, 2.0, 3.0], [5.0] * 3) == 0.0


def test_the_larger_text_corpus_adds_the_stdlib_sources():
    docs, both = python_docs(), corpus_documents("docs+source")
    assert both[: len(docs)] == docs and len(both) > len(docs) + 500
    assert any("def " in d and "import " in d for d in both[len(docs):len(docs) + 50])
    train_docs, _ = text_streams(limit_bytes=200_000)
    train_both, _ = text_streams(limit_bytes=200_000, corpus="docs+source")
    assert torch.equal(train_docs, train_both)  # the sources follow the docs: a small limit sees only docs
    # with a limit the documents are read one at a time, as far as the limit: the same ones, in order
    from itertools import islice

    from sinkmech.train.data import _documents_in_order

    assert tuple(islice(_documents_in_order("docs+source"), 600)) == docs[:600]  # the topics and some modules
    with pytest.raises((ValueError, TypeCheckError)):  # the literal is type-checked before __post_init__
        TrainConfig(text_corpus="web")


def test_eval_record_has_layer_rates_and_attention_per_class(tmp_path):
    cfg = TrainConfig(steps=2, eval_every=2, mask_self=True, **TINY)
    ev = train(cfg, options=QUIET).final()["conditions"]
    for cond in ("prepend", "none"):
        c = ev[cond]
        assert set(c["layer_sink_rate"]) == {"0.3", "0.8"} and len(c["layer_sink_rate"]["0.3"]) == 2
        # the whole-model rate is the mean of the per-layer rates (equal heads per layer)
        assert sum(c["layer_sink_rate"]["0.3"]) / 2 == pytest.approx(c["sink_rate"]["0.3"])
        assert set(c["attention"]) == {"trigger", "other", "counts"}
        assert c["attention"]["other"]["self"] == [[0.0, 0.0], [0.0, 0.0]]
    text = TrainConfig(data="text", text_limit_bytes=300_000, context_length=32, tokens_per_step=128, n_layers=1,
                       d_model=16, n_heads=2, steps=1, eval_every=1, eval_prompts=2, val_windows=2, threads=1)
    att = train(text, options=QUIET).final()["conditions"]["prepend"]["attention"]
    assert set(att) == {"all", "counts"}


@pytest.mark.slow
def test_mask_self_depth_modes_findings_and_jobs(tmp_path):
    small = ["--steps", "3", "--quiet", "--set", "val_windows=2", "eval_prompts=4"]
    common = ["--out", str(tmp_path / "fig"), "--runs-dir", str(tmp_path / "runs")]
    assert study(["mask-self", "--seeds", "0", "1", "--jobs", "2", *small, *common]) == 0
    rows = json.loads((tmp_path / "fig" / "mask_self.json").read_text())
    assert [(r["seed"], r["inference_bos"]) for r in rows] == [(0, True), (0, False), (1, True), (1, False)]
    assert all(r["mask_self"] is True and r["positional"] == "rotary" for r in rows)
    for r in rows:
        assert {"positional", "fixed_bos", "inference_bos", "sink_rate", "max_head_score", "n_layers", "n_heads",
                "d_model", "data", "seed", "context_length", "packing", "steps", "val_loss"} <= set(r)
    # --jobs 2 trains exactly what one process trains
    serial = tmp_path / "serial"
    assert study(["mask-self", "--seeds", "1", *small, "--out", str(serial), "--runs-dir", str(tmp_path / "r2")]) == 0
    assert json.loads((serial / "mask_self.json").read_text())[0]["val_loss"] == rows[2]["val_loss"]
    stale = tmp_path / "fig" / "depth_at_step.json"  # an earlier sweep whose deep runs stopped early
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text("[]")
    assert study(["depth", "--layers", "1", "2", "--seeds", "0", "1", "--positionals", "rotary", *small,
                     *common]) == 0
    assert not stale.exists()  # every depth ran the same steps: the early-stop reading is gone
    depth = json.loads((tmp_path / "fig" / "depth.json").read_text())
    assert sorted({(r["n_layers"], r["seed"]) for r in depth}) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert all(len(r["layer_sink_rate"]["0.3"]) == r["n_layers"] and "mask_self" not in r for r in depth)
    assert study(["modes", *common[:2]]) == 0
    modes = json.loads((tmp_path / "fig" / "modes.json").read_text())
    assert {r["experiment"] for r in modes} == {"mask_self", "depth"}
    assert all(r["other_self"] == [[0.0]] for r in modes if r.get("mask_self"))
    assert study(["findings", *common[:2]]) == 0
    flat = json.loads((tmp_path / "fig" / "findings_train.json").read_text())
    gaps = [r2["val_loss"] - r1["val_loss"] for r1, r2 in zip(depth[0::2], depth[1::2]) if r1["n_layers"] == 2]
    assert flat["train.depth.rotary.L2.loss_gap.mean"] == pytest.approx(sum(gaps) / 2)
    assert flat["train.depth.rotary.L2.n_seeds"] == 2 and "train.depth.rotary.L2.prepend.layer_sink_rate.L1.0.3.hi" in flat
    assert "train.modes.mask_self.rotary-maskself-seed1.prepend.L0.H0.other_entropy" in flat
    assert study(["depth", "--layers", "0", *small, *common]) == 2  # a bad depth: one clear error


def test_logs_that_predate_a_field_are_reused_only_for_its_default():
    cfg = TrainConfig(**TINY)
    old = {k: v for k, v in cfg.to_dict().items() if k not in ("mask_self", "text_corpus")}
    assert same_config({"config": old}, cfg)
    assert not same_config({"config": old}, TrainConfig(mask_self=True, **TINY))
    assert not same_config({"config": {**old, "n_layers": 3}}, cfg)
    assert not same_config({"config": {**old, "no_such_field": 1}}, cfg)
    rate = {"sink_rate": {"0.3": 40.0, "0.8": 0.0}}
    assert layer_rates(rate, 1) == {"layer_sink_rate": {"0.3": [40.0], "0.8": [0.0]}}
    assert layer_rates(rate, 2) == {}  # a 2-layer rate of 40 % cannot be split after the fact
    none = {"sink_rate": {"0.3": 0.0, "0.8": 0.0}}  # ... but 0 % means 0 % in every layer
    assert layer_rates(none, 2) == {"layer_sink_rate": {"0.3": [0.0, 0.0], "0.8": [0.0, 0.0]}}


def test_context_length_findings_score_each_model_at_its_own_length_too(tmp_path):
    """Three seed tables of two contexts: max alpha_0 at each model's own
    training length gets its own mean and interval over seeds and its own slope
    per doubling (by hand), beside the shortest-context scoring; tables without
    `own_length` give no such series (never a half-filled one)."""
    from sinkmech.studies.training_findings import context_length_findings

    def rows(seed: int, own: bool) -> list[dict]:
        out = []
        for T in (32, 64):
            for bos in (True, False):
                a = 0.1 * seed + T / 100 + (0.0 if bos else -0.2)
                r = {"seed": seed, "context_length": T, "inference_bos": bos, "max_head_score": a,
                     "sink_rate": {"0.3": 100.0 if bos else 0.0}, "val_loss": 2.0 + (0.0 if bos else 0.01 * seed)}
                if own and T == 32:  # the shortest context is scored on all its T - 1 tokens: no record needed
                    r |= {"score_tokens": 31, "max_head_score": a / 2, "sink_rate": {"0.3": 50.0 + seed}}
                elif own:
                    r["own_length"] = {"max_head_score": a / 2, "sink_rate": {"0.3": 50.0 + seed}}
                out.append(r)
        return out

    for own in (True, False):
        out = tmp_path / str(own)
        out.mkdir()
        for seed in (0, 1, 2):
            name = "context_length.json" if seed == 0 else f"seed{seed}_context_length.json"
            (out / name).write_text(json.dumps(rows(seed, own)))
        flat: dict = {}
        context_length_findings(flat, out, "")
        base = "train.context_length_seeds"
        assert flat[f"{base}.T64.prepend.max_head_score.mean"] == pytest.approx(0.74)
        assert flat[f"{base}.T64.none.max_head_score.mean"] == pytest.approx(0.54)
        if not own:
            assert not any(".own_length." in k for k in flat)
            continue
        own_alpha = [seed_interval([(0.1 * s + T / 100) / 2 for s in (0, 1, 2)]) for T in (32, 64)]
        for T, want in zip((32, 64), own_alpha):
            for stat in ("mean", "lo", "hi"):
                assert flat[f"{base}.T{T}.own_length.prepend.max_head_score.{stat}"] == pytest.approx(want[stat])
        assert flat[f"{base}.T32.own_length.prepend.sink_rate.0.3.mean"] == pytest.approx(51.0)
        # alpha_0 at its own length grows by 0.32 / 2 per doubling in every seed
        assert flat[f"{base}.slope_per_doubling.own_length.prepend.max_head_score.mean"] == pytest.approx(0.16)
        assert flat[f"{base}.slope_per_doubling.own_length.none.max_head_score.mean"] == pytest.approx(0.16)


def test_context_length_seeds_plot_reads_the_findings(tmp_path):
    from sinkmech.plots.training import context_length_seeds_plot

    base = "train.context_length_seeds"
    flat = {f"{base}.lengths": "32,64", f"{base}.robust_lengths": "64"}
    for T in (32, 64):
        for key in ("prepend.max_head_score", "none.max_head_score", "loss_gap"):
            flat.update({f"{base}.T{T}.{key}.{s}": v for s, v in (("mean", 0.5), ("lo", 0.4), ("hi", 0.6))})
    assert context_length_seeds_plot(flat, tmp_path / "c.png").stat().st_size > 0
    for T in (32, 64):  # with each model also scored at its own length: drawn dashed beside
        for key in ("own_length.prepend.max_head_score", "own_length.none.max_head_score"):
            flat.update({f"{base}.T{T}.{key}.{s}": v for s, v in (("mean", 0.3), ("lo", 0.2), ("hi", 0.4))})
    assert context_length_seeds_plot(flat, tmp_path / "o.png").stat().st_size > 0
    with pytest.raises(ValueError, match="no context-length"):
        context_length_seeds_plot({}, tmp_path / "d.png")


@pytest.mark.slow
def test_text_experiment_rows_and_half_heads_flags(tmp_path):
    common = ["--out", str(tmp_path / "fig"), "--runs-dir", str(tmp_path / "runs")]
    small = ["--steps", "2", "--quiet", "--set", "text_corpus=docs", "text_limit_bytes=400000", "context_length=32",
             "tokens_per_step=64", "d_model=16", "eval_prompts=2", "val_windows=2"]
    assert study(["text", "--weight-decays", "0.1", "--fixed-bos", "yes", "no", *small, *common]) == 0
    rows = json.loads((tmp_path / "fig" / "text.json").read_text())
    assert [(r["fixed_bos"], r["inference_bos"]) for r in rows] == [(True, True), (True, False), (False, True),
                                                                     (False, False)]
    assert {r["data"] for r in rows} == {"text"} and {r["n_layers"] for r in rows} == {2}
    assert study(["findings", *common[:2]]) == 0
    flat = json.loads((tmp_path / "fig" / "findings_train.json").read_text())
    run = rows[0]["run"]
    reached = rows[0]["sink_rate"]["0.3"] >= 50 and rows[1]["sink_rate"]["0.3"] <= rows[0]["sink_rate"]["0.3"] / 2
    assert flat[f"train.text.{run}.half_heads_sink_and_halved_without_bos"] is reached
    assert flat[f"train.text.{run}.loss_gap"] == pytest.approx(rows[1]["val_loss"] - rows[0]["val_loss"])
    # A second call adds its runs to text.json and keeps the earlier ones.
    assert study(["text", "--weight-decays", "0", "--fixed-bos", "yes", *small, *common]) == 0
    assert len(json.loads((tmp_path / "fig" / "text.json").read_text())) == 6
    # A run off the preset's width or learning rate is named for it and keeps its own row.
    assert study(["text", "--weight-decays", "0", "--fixed-bos", "yes", *small, "lr=0.006", *common]) == 0
    rows = json.loads((tmp_path / "fig" / "text.json").read_text())
    named = [r for r in rows if r["run"] == "text-L2H4-wd0-fixedbos-s0-d16-lr0.006-2steps"]
    assert len(rows) == 8 and len(named) == 2
    assert named[0]["lr"] == 0.006 and named[0]["d_model"] == 16
    # A later seed of a recipe sits beside its earlier seeds (in text.json and so in the figure),
    # not at the end, and each run's with-<bos> row comes before its without-<bos> twin.
    assert study(["text", "--weight-decays", "0.1", "--fixed-bos", "yes", "--seed", "1", *small, *common]) == 0
    rows = json.loads((tmp_path / "fig" / "text.json").read_text())
    runs = list(dict.fromkeys(r["run"] for r in rows))
    assert runs.index("text-L2H4-wd0.1-fixedbos-s1-d16-2steps") == runs.index("text-L2H4-wd0.1-fixedbos-s0-d16-2steps") + 1
    assert runs[-1] != "text-L2H4-wd0.1-fixedbos-s1-d16-2steps"
    assert all(rows[i]["inference_bos"] and not rows[i + 1]["inference_bos"] for i in range(0, len(rows), 2))


@pytest.mark.parametrize(("with_bos", "without", "reached"), [(60.0, 30.0, True), (60.0, 31.0, False),
                                                               (40.0, 0.0, False)])
def test_the_half_heads_target_needs_half_the_heads_and_half_the_rate_gone(with_bos, without, reached):

    def row(inference_bos: bool, rate: float) -> dict:
        return {"run": "r", "seed": 0, "inference_bos": inference_bos, "sink_rate": {"0.3": rate, "0.8": 0.0},
                "max_head_score": 0.5, "mean_head_score": 0.3, "val_loss": 1.0, "steps": 10, "train_seconds": 1.0,
                "n_layers": 2, "n_heads": 4, "d_model": 128, "context_length": 256, "weight_decay": 0.1,
                "tokens_per_step": 4096, "uniform_score": 0.07}

    flat: dict = {}
    text_findings(flat, [row(True, with_bos), row(False, without)])
    assert flat["train.text.r.half_heads_sink_and_halved_without_bos"] is reached and flat["train.text.closest_run"] == "r"


def test_text_seed_findings_pool_a_recipe_over_its_seeds_only():
    """Runs that differ only in their seed are pooled (mean and t interval over seeds); a recipe
    with one seed, or another weight decay, is not."""

    def pair(run: str, seed: int, gap: float, score: float) -> list[dict]:
        common = {"run": run, "seed": seed, "sink_rate": {"0.3": 10.0 * seed}, "max_head_score": score}
        return [{**common, "inference_bos": True, "val_loss": 1.0},
                {**common, "inference_bos": False, "val_loss": 1.0 + gap, "max_head_score": score / 10}]

    rows = [*pair("text-L4H4-wd0.1-fixedbos-s0", 0, 0.06, 0.8), *pair("text-L4H4-wd0.1-fixedbos-s1", 1, 0.10, 0.6),
            *pair("text-L4H4-wd0.5-fixedbos-s0", 0, 0.5, 0.9), *pair("text-L4H4-wd0.1-fixedbos-s2-4000steps", 2, 1, 1)]
    flat: dict = {}
    text_seed_findings(flat, rows)
    base = "train.text.seeds.text-L4H4-wd0.1-fixedbos"
    assert flat[f"{base}.seeds"] == "0,1" and flat[f"{base}.loss_gap.n"] == 2
    assert flat[f"{base}.loss_gap.mean"] == pytest.approx(0.08)
    # t(1) = 12.706: half-width 12.706 * sd / sqrt(2), sd = 0.02 * sqrt(2)
    assert flat[f"{base}.loss_gap.hi"] - flat[f"{base}.loss_gap.mean"] == pytest.approx(12.706 * 0.02, rel=1e-3)
    assert flat[f"{base}.none.max_head_score.mean"] == pytest.approx(0.07)
    assert flat[f"{base}.prepend.sink_rate.0.3.mean"] == pytest.approx(5.0)
    assert not any(k.startswith(("train.text.seeds.text-L4H4-wd0.5", "train.text.seeds.text-L4H4-wd0.1-fixedbos-4000"))
                   for k in flat)


def test_text_step_findings_read_each_run_log_and_find_the_first_sink_step(tmp_path):
    """The trajectory comes from the log: a run whose head passes 0.3 at step 20 gets
    first_sink_step 20; a run that never passes it gets none; a missing log is an error."""

    def log(name: str, scores: list[float]) -> None:
        evals = [{"step": 10 * (i + 1), "conditions": {"prepend": {"sink_rate": {"0.3": 25.0 * (s > 0.3)},
                                                                    "max_head_score": s}}}
                 for i, s in enumerate(scores)]
        (tmp_path / f"{name}.json").write_text(json.dumps({"evals": evals}))

    log("sink", [0.1, 0.31, 0.6])
    log("null", [0.1, 0.2, 0.29])
    rows = [{"run": n, "inference_bos": b} for n in ("sink", "null") for b in (True, False)]
    flat: dict = {}
    text_step_findings(flat, tmp_path, "", rows)
    assert flat["train.text.sink.first_sink_step"] == 20 and "train.text.null.first_sink_step" not in flat
    assert flat["train.text.sink.at_step.30.prepend.max_head_score"] == 0.6
    assert flat["train.text.sink.at_step.20.prepend.sink_rate.0.3"] == 25.0
    assert flat["train.text.null.at_step.30.prepend.sink_rate.0.3"] == 0.0
    with pytest.raises(ValueError, match="no .*gone.json"):
        text_step_findings({}, tmp_path, "", [{"run": "gone", "inference_bos": True}])
