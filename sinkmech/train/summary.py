"""A study's summary: one typed row per (run, inference condition) read from the
run's log, and the Markdown table in the shape of Barbero et al. 2025's Table 2.

`SummaryRow.to_dict()` is the row of `<study>.json`; the findings
(`sinkmech.studies.training_findings`) read those files back as plain dicts, because
committed rows from older code lack fields a newer row has."""

from __future__ import annotations

from dataclasses import dataclass, fields

from sinkmech.prompts import CONDITIONS
from sinkmech.results import Result
from sinkmech.train.config import TrainConfig
from sinkmech.train.contrasts import self_masked_uniform_score
from sinkmech.train.data import sink_tokens

PAPER_TABLE2 = (
    "Paper (Barbero et al. 2025, Table 2; 120M parameters, 30B tokens; the notes we have do not say which epsilon):\n\n"
    "| trained with | inference `<bos>` | sink rate % | val loss |\n|---|---|---|---|\n"
    "| no fixed `<bos>` | yes | 65.10 | - |\n| no fixed `<bos>` | no | 65.15 | - |\n"
    "| fixed `<bos>` | yes | 90.84 | 2.69 |\n| fixed `<bos>` | no | 0.05 | 7.56 |\n"
)

# Written only when set: a row keeps the keys of the older rows beside it.
_OPTIONAL = ("layer_sink_rate", "text_corpus", "mask_self", "run_steps", "preset", "run", "reused_from", "own_length")


@dataclass(frozen=True)
class SummaryRow(Result):
    """One run under one inference condition, at its final evaluation (or at
    step `steps` of a `run_steps`-step run). Scores are alpha_0, the mean
    attention on the first key; `[layer][head]` lists per head."""

    packing: str
    fixed_bos: bool
    positional: str
    inference_bos: bool
    val_loss: float
    loss_gap: float  # val loss minus the same run's with-`<bos>` val loss
    sink_rate: dict[str, float]  # eps -> % of (prompt, head) pairs with alpha_0 > eps
    max_head_score: float
    mean_head_score: float
    uniform_score: float  # alpha_0 of uniform attention on the same prompts (self-masked runs: over the keys left)
    context_length: int
    score_tokens: int
    n_layers: int
    n_heads: int
    d_model: int
    lr: float
    data: str
    steps: int
    seed: int
    tokens_per_step: int
    n_params: int
    train_seconds: float
    hardware: str
    weight_decay: float
    layer_sink_rate: dict[str, list[float]] | None
    head_scores: list[list[float]]  # [layer][head] mean alpha_0
    value_norm_first: list[list[float]]  # [layer][head]: the first token's value norm ...
    value_norm_rest: list[list[float]]  # ... and the other tokens' mean
    text_corpus: str | None = None
    mask_self: bool = False
    run_steps: int | None = None
    preset: str | None = None
    run: str | None = None
    reused_from: str | None = None  # "<study>/<run>": the log came from another study
    # scored at the run's own training length too (context_length - 1 tokens) where `score_tokens` is
    # shorter: "n_tokens", "sink_rate", "max_head_score", "mean_head_score", "uniform_score"; else None
    own_length: dict | None = None

    def to_dict(self) -> dict:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _OPTIONAL and (value is None or value is False):
                continue
            out[f.name] = value
        return out

    def to_dataframe(self):
        import pandas as pd

        return pd.DataFrame([{k: v for k, v in self.to_dict().items() if not isinstance(v, (dict, list))}])


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


def summary_rows(log: dict, at_step: int | None = None, *, preset: str | None = None, run: str | None = None,
                 reused_from: str | None = None) -> list[SummaryRow]:
    """One row per inference condition from a run's log: its final evaluation,
    or the one at step `at_step` (then `steps` is that step and `run_steps`
    the run's length)."""
    cfg = TrainConfig.from_dict(log["config"])
    final = log["evals"][-1]
    if at_step is not None:
        found = [e for e in log["evals"] if e["step"] == at_step]
        if not found:
            raise ValueError(f"the log of {run or 'a run'} has no evaluation at step {at_step}")
        final = found[0]
    if "hardware" in log:
        where = log["hardware"]
    else:
        from sinkmech.train.run import hardware  # torch: only for a log that predates the record

        where = hardware()
    base = final["val_loss"]["prepend"]
    rows = []
    for cond in CONDITIONS:
        c = final["conditions"][cond]
        rows.append(SummaryRow(
            packing=cfg.packing, fixed_bos=cfg.fixed_bos, positional=cfg.positional, inference_bos=cond == "prepend",
            val_loss=final["val_loss"][cond], loss_gap=final["val_loss"][cond] - base, sink_rate=c["sink_rate"],
            max_head_score=c["max_head_score"], mean_head_score=c["mean_head_score"],
            uniform_score=self_masked_uniform_score(sink_tokens(cfg) + (cond == "prepend")) if cfg.mask_self
            else c["uniform_score"], context_length=cfg.context_length, score_tokens=sink_tokens(cfg),
            n_layers=cfg.n_layers, n_heads=cfg.n_heads, d_model=cfg.d_model, lr=cfg.lr, data=cfg.data,
            steps=cfg.steps if at_step is None else at_step, seed=cfg.seed,
            tokens_per_step=cfg.batch_size * cfg.context_length, n_params=log["n_params"],
            train_seconds=round(log["seconds"], 1), hardware=where, weight_decay=cfg.weight_decay,
            layer_sink_rate=layer_rates(c, cfg.n_layers).get("layer_sink_rate"), head_scores=c["head_scores"],
            value_norm_first=c["value_norm_first"], value_norm_rest=c["value_norm_rest"],
            text_corpus=cfg.text_corpus if cfg.data == "text" else None, mask_self=cfg.mask_self,
            run_steps=cfg.steps if at_step is not None else None, preset=preset, run=run, reused_from=reused_from,
            own_length=(final.get("own_length") or {}).get(cond),
        ))
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
