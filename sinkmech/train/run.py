"""From-scratch training of small language models and the sink measurements
taken while they train (Barbero et al. 2025: packing with and without a fixed
`<bos>`, their Table 2; and the context-length experiment).

Packing recipes: `causal` (documents concatenated, attention crosses them) and
`intra_doc` (a hook on every layer's `attn_scores` adds -inf wherever query and
key lie in different documents; a fixed `<bos>` at position 0 stays visible to
every query). Positions are the window's positions 0..T-1 and are not reset
at document boundaries: with rotary embeddings (the default) attention depends
only on query-key offsets, so a document sees the same geometry wherever it
sits in the window.

Positional embeddings: `standard` (learned absolute), `rotary`, or `none`
(a `standard` model whose W_pos is zero and frozen: only the causal mask tells
positions apart). `mask_self`: a permanent hook on every layer's
`attn_scores` hides each query's own key (queries >= 1), so attending to
itself cannot serve as the head's no-op.

Evaluation every `eval_every` steps: validation loss with and without `<bos>`
(the same T-1 next-token targets in both conditions, so the numbers compare),
split on bigram-backcopy data into post-trigger positions (copies, which need
attention) and the rest (Guo et al. 2024); and `sink_scores` on held-out
documents for both conditions, with the first token's value and residual norms
against the other tokens' (the sink's mutual reinforcement, Guo et al. 2024).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from safetensors.torch import load_file, save_file
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer, HookedTransformerConfig

from sinkmech.files import json_text, write_text
from sinkmech.hooks import act_name
from sinkmech.prompts import CONDITIONS, DEFAULT_EPS, Bos
from sinkmech.results import Result
from sinkmech.sinks import format_eps, sink_scores
from sinkmech.train.config import PACKINGS, POSITIONALS, Packing, Positional, TrainConfig
from sinkmech.train.data import TrainData, make_inputs, post_trigger, same_document, sink_tokens
from sinkmech.train.modes import attention_breakdown, trigger_classes

# re-exported: `from sinkmech.train.run import TrainConfig, train` keeps working
__all__ = ["EvalResult", "ConditionEval", "PACKINGS", "POSITIONALS", "Packing", "Positional", "TrainConfig",
           "TrainData", "TrainResult", "build_model", "evaluate", "hardware", "load_checkpoint", "packed_token_losses",
           "save_checkpoint", "train", "train_to_log"]


def build_model(cfg: TrainConfig, device: str | None = None) -> HookedTransformer:
    """A freshly initialised HookedTransformer for `cfg` (no tokenizer; d_vocab =
    content tokens + `<bos>` + pad)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    hcfg = HookedTransformerConfig(
        n_layers=cfg.n_layers,
        d_model=cfg.d_model,
        n_heads=cfg.n_heads,
        d_head=cfg.d_model // cfg.n_heads,
        d_mlp=cfg.d_mlp or 4 * cfg.d_model,
        n_ctx=cfg.context_length,
        d_vocab=cfg.vocab + 2,
        act_fn="gelu",
        normalization_type="LN",
        positional_embedding_type="standard" if cfg.positional == "none" else cfg.positional,
        default_prepend_bos=False,
        model_name=f"{cfg.data}-{cfg.run_name}",
        seed=cfg.seed,
        device=device,
    )
    model = HookedTransformer(hcfg)
    if cfg.mask_self:
        for layer in range(cfg.n_layers):
            model.add_hook(act_name("attn_scores", layer), mask_self_hook, is_permanent=True)
    if cfg.positional == "none":
        with torch.no_grad():
            model.pos_embed.W_pos.zero_()
        model.pos_embed.W_pos.requires_grad_(False)
    return model


def mask_self_hook(scores: Float[Tensor, "batch head_index query_pos key_pos"], hook):
    """On `attn_scores`: -inf on every query's own key, for queries >= 1 (query
    0 sees only itself). Returns a new tensor (never edits the activation)."""
    n = scores.shape[-1]
    diag = torch.eye(n, dtype=torch.bool, device=scores.device)
    diag[0, 0] = False
    return scores.masked_fill(diag, float("-inf"))


# --- forward passes ---------------------------------------------------------------


def intra_doc_hook(allowed: Bool[Tensor, "batch query_pos key_pos"]) -> Callable:
    """On `attn_scores`: -inf where query and key are in different documents.
    Returns a new tensor (never edits the activation)."""

    def hook(scores: Float[Tensor, "batch head_index query_pos key_pos"], hook):
        return scores.masked_fill(~allowed[:, None].to(scores.device), float("-inf"))

    return hook


def packing_hooks(tokens: Tensor, *, packing: Packing, bos_id: int, fixed_bos: bool) -> list:
    """The forward hooks a packing recipe needs on `tokens` (none for causal)."""
    if packing == "causal":
        return []
    allowed = same_document(tokens.cpu(), bos_id=bos_id, fixed_bos=fixed_bos)
    return [(lambda name: name.endswith("attn_scores"), intra_doc_hook(allowed))]


def packed_token_losses(
    model: HookedTransformer,
    inputs: Int[Tensor, "batch pos"],
    targets: Int[Tensor, "batch pos"],
    *,
    packing: Packing,
    bos_id: int,
    fixed_bos: bool,
) -> Float[Tensor, "batch pos"]:
    """Next-token cross-entropy (nats) at every position of a packed training
    window, against explicit `targets`, under the run's packing (intra-document
    masking when asked); with gradients. Not `sinkmech.loss.token_losses`, which
    scores a prompt's own next tokens without gradients."""
    device = model.cfg.device
    hooks = packing_hooks(inputs, packing=packing, bos_id=bos_id, fixed_bos=fixed_bos)
    with model.hooks(fwd_hooks=hooks):
        logits = model(inputs.to(device), return_type="logits")
    flat = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1).to(device), reduction="none")
    return flat.reshape(targets.shape)


def lm_loss(
    model: HookedTransformer,
    inputs: Int[Tensor, "batch pos"],
    targets: Int[Tensor, "batch pos"],
    *,
    packing: Packing,
    bos_id: int,
    fixed_bos: bool,
    first: int = 0,
) -> Float[Tensor, ""]:
    """Mean next-token cross-entropy (nats/token) over positions >= `first`."""
    losses = packed_token_losses(model, inputs, targets, packing=packing, bos_id=bos_id, fixed_bos=fixed_bos)
    return losses[:, first:].mean()


def learning_rate(cfg: TrainConfig, step: int) -> float:
    """Linear warmup to `lr`, then cosine decay to `min_lr_ratio * lr`."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


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
def evaluate(model: HookedTransformer, data: TrainData) -> EvalResult:
    """Validation loss and sink statistics, with `<bos>` at position 0 and without.

    Both conditions predict the same T-1 targets of the validation windows, so
    their losses compare; sinks are scored by `sinkmech.sinks.sink_scores`.
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
            batch_size=64, bos_token_id=data.bos_id, progress=False,
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


# --- training -----------------------------------------------------------------------


@dataclass(frozen=True)
class TrainResult(Result):
    """A finished run: the model, its config, the log, and where it was saved."""

    model: HookedTransformer
    config: TrainConfig
    log: dict  # the JSON written to log.json; see `train`
    out_dir: Path | None = None
    seconds: float = 0.0
    evals: tuple[EvalResult, ...] = ()  # typed, in the order of log["evals"]

    def final(self) -> dict:
        """The last `log["evals"]` entry: {"step", "train_loss", "elapsed_s",
        **EvalResult.to_dict()}."""
        return self.log["evals"][-1]

    def final_eval(self) -> EvalResult:
        return self.evals[-1]

    def to_dict(self) -> dict:
        """The log (the content of `log.json`)."""
        return self.log

    def to_dataframe(self):
        """Long format: one row per (evaluation, condition) with its validation loss and sink rates."""
        import pandas as pd

        rows = []
        for ev in self.log["evals"]:
            for cond, c in ev["conditions"].items():
                rows.append({"step": ev["step"], "bos": cond, "val_loss": ev["val_loss"][cond],
                             "max_head_score": c["max_head_score"], "mean_head_score": c["mean_head_score"],
                             **{f"sink_rate_{e}": r for e, r in c["sink_rate"].items()}})
        return pd.DataFrame(rows)


def train(
    cfg: TrainConfig, out_dir: str | Path | None = None, *, device: str | None = None, progress: bool = True
) -> TrainResult:
    """Train a model from scratch under `cfg`, evaluating every `cfg.eval_every` steps.

    Args:
        cfg: the run's configuration.
        out_dir: if given, writes `model.safetensors`, `config.json` and `log.json` there.
        device: "cpu" / "cuda"; default CUDA when present.

    Returns:
        TrainResult with the trained model and the log: {"config", "device",
        "train_loss": [per step], "evals": [{"step", "train_loss", "val_loss",
        "split_loss", "conditions", "elapsed_s"}], "seconds", "eval_seconds"}.
    """
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    data = TrainData(cfg)
    model = build_model(cfg, device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]  # positional "none" freezes W_pos
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95),
    )
    log = {"config": cfg.to_dict(), "device": str(model.cfg.device), "n_params": sum(p.numel() for p in params),
           "train_loss": [], "evals": []}
    evals: list[EvalResult] = []
    eval_seconds = 0.0
    start = time.perf_counter()
    bar = tqdm(range(cfg.steps), desc=f"train {model.cfg.model_name}", disable=not progress)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = learning_rate(cfg, step)
        inputs, targets = data.batch()
        loss = lm_loss(model, inputs, targets, packing=cfg.packing, bos_id=data.bos_id, fixed_bos=cfg.fixed_bos)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss is {loss.item()} at step {step}: lower the learning rate")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        log["train_loss"].append(loss.item())
        done = step + 1
        if done % cfg.eval_every == 0 or done == cfg.steps:
            t_eval = time.perf_counter()
            ev = evaluate(model, data)
            eval_seconds += time.perf_counter() - t_eval
            evals.append(ev)
            recent = log["train_loss"][-min(20, done):]
            log["evals"].append({"step": done, "train_loss": sum(recent) / len(recent),
                                 "elapsed_s": time.perf_counter() - start, **ev.to_dict()})
            bar.set_postfix(val=f"{ev.val_loss['prepend']:.3f}/{ev.val_loss['none']:.3f}")
    log["seconds"] = time.perf_counter() - start
    log["eval_seconds"] = eval_seconds  # of `seconds`; the rest is data, forward, backward, optimiser
    model.eval()
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        save_checkpoint(model, cfg, out)
        write_text(out / "log.json", json_text(log, indent=None))
    return TrainResult(model=model, config=cfg, log=log, out_dir=out, seconds=log["seconds"], evals=tuple(evals))


def hardware() -> str:
    """Where this process trains: "cuda: <device>" or "cpu: N thread(s)"."""
    if torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name(0)}"
    return f"cpu: {torch.get_num_threads()} thread(s)"


def train_to_log(cfg_dict: dict, out_dir: str, progress: bool = False) -> dict:
    """One run for a worker process (importable, so it pickles): train
    `TrainConfig.from_dict(cfg_dict)`, save the checkpoint to `out_dir`, and
    return the log with the process's `hardware()`."""
    result = train(TrainConfig.from_dict(cfg_dict), out_dir, progress=progress)
    return {**result.log, "hardware": hardware()}


def save_checkpoint(model: HookedTransformer, cfg: TrainConfig, out_dir: str | Path) -> Path:
    """Weights to `model.safetensors` (never pickle), config to `config.json`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"))
    write_text(out / "config.json", json_text(cfg.to_dict()))
    return out / "model.safetensors"


def load_checkpoint(out_dir: str | Path, device: str | None = None) -> tuple[HookedTransformer, TrainConfig]:
    """The model and config saved by `save_checkpoint` in `out_dir`."""
    out = Path(out_dir)
    for name in ("model.safetensors", "config.json"):
        if not (out / name).exists():
            raise FileNotFoundError(f"no {name} in {out}")
    cfg = TrainConfig.from_dict(json.loads((out / "config.json").read_text()))
    model = build_model(cfg, device)
    model.load_state_dict(load_file(str(out / "model.safetensors"), device=str(model.cfg.device)))
    model.eval()
    return model, cfg
