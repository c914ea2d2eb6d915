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

Here: the training loop and checkpoints. The model and its loss live in
`sinkmech.train.model`, the evaluation in `sinkmech.train.evaluate`.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from sinkmech.files import json_text, write_text
from sinkmech.loading.backend import Model
from sinkmech.options import QUIET, RunOptions
from sinkmech.results import Result
from sinkmech.train.config import PACKINGS, POSITIONALS, Packing, Positional, TrainConfig
from sinkmech.train.data import TrainData
from sinkmech.train.evaluate import ConditionEval, EvalResult, evaluate
from sinkmech.train.model import build_model, packed_token_losses

# re-exported: `from sinkmech.train.run import TrainConfig, train` keeps working
__all__ = ["EvalResult", "ConditionEval", "PACKINGS", "POSITIONALS", "Packing", "Positional", "TrainConfig",
           "TrainData", "TrainResult", "build_model", "evaluate", "hardware", "load_checkpoint", "packed_token_losses",
           "save_checkpoint", "train", "train_to_log"]


def learning_rate(cfg: TrainConfig, step: int) -> float:
    """Linear warmup to `lr`, then cosine decay to `min_lr_ratio * lr`."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


# --- training -----------------------------------------------------------------------


@dataclass(frozen=True)
class TrainResult(Result):
    """A finished run: the model, its config, the log, and where it was saved."""

    model: Model  # a HookedTransformer (`sinkmech.loading.backend.model_from_config`)
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


def train(cfg: TrainConfig, out_dir: str | Path | None = None, *, options: RunOptions = RunOptions()) -> TrainResult:
    """Train a model from scratch under `cfg`, evaluating every `cfg.eval_every` steps.

    Args:
        cfg: the run's configuration.
        out_dir: if given, writes `model.safetensors`, `config.json` and `log.json` there.
        options: the device ("cpu", "cuda"; default CUDA when present) and a progress bar.

    Returns:
        TrainResult with the trained model and the log: {"config", "device",
        "train_loss": [per step], "evals": [{"step", "train_loss", "val_loss",
        "split_loss", "conditions", "elapsed_s"}], "seconds", "eval_seconds"}.
    """
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    data = TrainData(cfg)
    model = build_model(cfg, options.device)
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
    bar = tqdm(range(cfg.steps), desc=f"train {model.cfg.model_name}", disable=not options.progress)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = learning_rate(cfg, step)
        inputs, targets = data.batch()
        loss = packed_token_losses(model, inputs, targets, packing=cfg.packing, bos_id=data.bos_id,
                                   fixed_bos=cfg.fixed_bos).mean()
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


def train_to_log(cfg_dict: dict, out_dir: str, options: RunOptions = QUIET) -> dict:
    """One run for a worker process (importable, so it pickles): train
    `TrainConfig.from_dict(cfg_dict)`, save the checkpoint to `out_dir`, and
    return the log with the process's `hardware()`."""
    result = train(TrainConfig.from_dict(cfg_dict), out_dir, options=options)
    return {**result.log, "hardware": hardware()}


def save_checkpoint(model: Model, cfg: TrainConfig, out_dir: str | Path) -> Path:
    """Weights to `model.safetensors` (never pickle), config to `config.json`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"))
    write_text(out / "config.json", json_text(cfg.to_dict()))
    return out / "model.safetensors"


def load_checkpoint(out_dir: str | Path, device: str | None = None) -> tuple[Model, TrainConfig]:
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
