"""Evaluation during training: validation loss with and without `<bos>` (the
same T-1 next-token targets in both conditions, split on bigram-backcopy data
into post-trigger positions and the rest) and the sink statistics of both
conditions on held-out documents."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from sinkmech.loading.backend import Model
from sinkmech.prompts import CONDITIONS, DEFAULT_EPS, Bos
from sinkmech.measures.sinks import format_eps, sink_scores
from sinkmech.train.data import TrainData, make_inputs, post_trigger, sink_tokens
from sinkmech.train.model import packed_token_losses
from sinkmech.train.modes import attention_breakdown, trigger_classes
from sinkmech.options import RunOptions


@dataclass(frozen=True)
class ConditionEval:
    """Sink statistics of one inference condition on the held-out documents."""

    sink_rate: dict[str, float]  # eps (as written, "0.3") -> percent of (prompt, head) pairs
    layer_sink_rate: dict[str, list[float]]  # eps -> [layer] percent of (prompt, head) pairs in that layer
    head_scores: list[list[float]]  # [layer][head] mean alpha_0 over prompts
    max_head_score: float
    mean_head_score: float
    uniform_score: float
    # The sink's small value and massive activation (first token vs the others'
    # mean), averaged over prompts.
    value_norm_first: list[list[float]]  # [layer][head]
    value_norm_rest: list[list[float]]  # [layer][head]
    resid_norm_first: list[float]  # [layer], resid_post
    resid_norm_rest: list[float]  # [layer]
    # Where attention goes (`sinkmech.train.modes.attention_breakdown`): query
    # class ("trigger"/"other" on bigram-backcopy, "all" on text) -> "first",
    # "self", "prev", "copy", "rest", "entropy" -> [layer][head]; plus "counts".
    attention: dict


@dataclass(frozen=True)
class EvalResult:
    """One evaluation: validation loss (nats/token) and sink statistics, with
    `<bos>` at position 0 ("prepend") and without ("none"). `split_loss` (on
    bigram-backcopy data only, else None): the validation loss on post-trigger
    positions (copies) and on the rest."""

    val_loss: dict[Bos, float]
    split_loss: dict[Bos, dict[str, float]] | None
    conditions: dict[Bos, ConditionEval]

    def to_dict(self) -> dict:
        """{"val_loss": {cond: nats}, "split_loss": {cond: {"post_trigger",
        "rest"}} or None, "conditions": {cond: {"sink_rate", "head_scores",
        "max_head_score", "mean_head_score", "uniform_score", "value_norm_first",
        "value_norm_rest", "resid_norm_first", "resid_norm_rest", "layer_sink_rate",
        "attention"}}}: the shape of every `log["evals"]` entry."""
        return {"val_loss": dict(self.val_loss),
                "split_loss": None if self.split_loss is None else {c: dict(v) for c, v in self.split_loss.items()},
                "conditions": {c: asdict(e) for c, e in self.conditions.items()}}


@torch.no_grad()
def evaluate(model: Model, data: TrainData) -> EvalResult:
    """Validation loss and sink statistics, with `<bos>` at position 0 and without.

    Both conditions predict the same T-1 targets of the validation windows, so
    their losses compare; sinks are scored by `sinkmech.measures.sinks.sink_scores`.
    """
    cfg = data.cfg
    was_training = model.training
    model.eval()
    chunk = data.val_chunks  # content c_0..c_{T-1}; both conditions predict c_1..c_{T-1}
    val_loss: dict[Bos, float] = {}
    split_loss: dict[Bos, dict[str, float]] | None = None if data.bb is None else {}
    for cond in CONDITIONS:
        with_bos = cond == "prepend"
        inputs, targets = make_inputs(chunk, fixed_bos=True, bos_id=data.bos_id)
        if not with_bos:
            inputs, targets = chunk[:, :-1], chunk[:, 1:]
        first = 1 if with_bos else 0
        losses = packed_token_losses(
            model, inputs, targets, packing=cfg.packing, bos_id=data.bos_id, fixed_bos=with_bos
        )[:, first:].cpu()
        val_loss[cond] = float(losses.mean())
        if split_loss is not None:
            copy = post_trigger(inputs[:, first:], targets[:, first:], n_triggers=cfg.bb_triggers, bos_id=data.bos_id)
            split_loss[cond] = {"post_trigger": float(losses[copy].mean()) if copy.any() else float("nan"),
                                "rest": float(losses[~copy].mean())}
    conditions: dict[Bos, ConditionEval] = {}
    for cond in CONDITIONS:
        s = sink_scores(
            model, data.prompts, bos=cond, max_tokens=sink_tokens(cfg),
            options=RunOptions(batch_size=64, progress=False, bos_token_id=data.bos_id),
        )
        mean = s.mean_scores()
        prompts = torch.tensor([p[: sink_tokens(cfg)] for p in data.prompts])  # as sink_scores truncates them
        tokens = torch.cat([torch.full((len(prompts), 1), data.bos_id), prompts], 1) if cond == "prepend" else prompts
        if data.bb is None:
            classes = {"all": torch.ones_like(tokens, dtype=torch.bool)}
        else:
            classes = trigger_classes(tokens, n_triggers=cfg.bb_triggers)
        conditions[cond] = ConditionEval(
            sink_rate={format_eps(e): s.sink_rate(e) for e in DEFAULT_EPS},
            layer_sink_rate={format_eps(e): s.per_layer_sink_rate(e).tolist() for e in DEFAULT_EPS},
            head_scores=mean.tolist(),
            max_head_score=float(mean.max()),
            mean_head_score=float(mean.mean()),
            uniform_score=s.uniform_score(),
            value_norm_first=s.value_norm_first.mean(0).tolist(),
            value_norm_rest=s.value_norm_rest.mean(0).tolist(),
            resid_norm_first=s.resid_norm_first.mean(0).tolist(),
            resid_norm_rest=s.resid_norm_rest.mean(0).tolist(),
            attention=attention_breakdown(model, tokens, classes).to_dict(),
        )
    model.train(was_training)
    return EvalResult(val_loss, split_loss, conditions)
