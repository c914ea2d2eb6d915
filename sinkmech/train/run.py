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

Evaluation every `eval_every` steps: validation loss with and without `<bos>`
(the same T-1 next-token targets in both conditions, so the numbers compare),
and `sink_scores` on held-out documents for both conditions.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable, Literal

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from safetensors.torch import load_file, save_file
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer, HookedTransformerConfig

from sinkmech.sinks import format_eps, sink_scores
from sinkmech.train.data import (
    TEXT_VOCAB,
    BigramBackcopy,
    BigramBackcopyStream,
    backcopy_documents,
    check_data_source,
    make_inputs,
    same_document,
    sample_windows,
    stream_documents,
    text_streams,
)

Packing = Literal["causal", "intra_doc"]
PACKINGS: tuple[str, ...] = ("causal", "intra_doc")
Positional = Literal["rotary", "standard"]
POSITIONALS: tuple[str, ...] = ("rotary", "standard")
EPS = ("0.3", "0.8")
CONDITIONS = ("prepend", "none")  # inference with <bos> at position 0, and without


@dataclass(frozen=True)
class TrainConfig:
    """Everything a run depends on; saved as JSON beside each checkpoint."""

    data: str = "text"
    packing: str = "causal"
    fixed_bos: bool = True
    context_length: int = 128
    tokens_per_step: int = 4096  # batch = tokens_per_step // context_length
    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    d_mlp: int | None = None  # default 4 * d_model
    positional: str = "rotary"
    steps: int = 500
    lr: float = 3e-3
    warmup: int = 50
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    seed: int = 0
    threads: int | None = None
    eval_every: int = 100
    eval_prompts: int = 32
    val_windows: int = 32
    text_limit_bytes: int | None = None  # text: use only the first N bytes of the corpus
    bb_vocab: int = 64  # bigram_backcopy: content tokens, triggers, document lengths
    bb_triggers: int = 3
    bb_trigger_prob: float = 0.15
    bb_doc_min: int = 16
    bb_doc_max: int = 512

    def __post_init__(self):
        check_data_source(self.data)
        if self.packing not in PACKINGS:
            raise ValueError(f"unknown packing {self.packing!r}: choose one of {PACKINGS}")
        if self.positional not in POSITIONALS:
            raise ValueError(f"unknown positional embedding {self.positional!r}: choose one of {POSITIONALS}")
        for name in ("context_length", "tokens_per_step", "n_layers", "d_model", "n_heads", "steps", "eval_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.context_length < 4:
            raise ValueError(f"context_length must be >= 4, got {self.context_length}")
        if self.tokens_per_step < self.context_length:
            raise ValueError(
                f"tokens_per_step ({self.tokens_per_step}) must be >= context_length ({self.context_length})"
            )
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.warmup < 0 or self.lr <= 0:
            raise ValueError(f"need lr > 0 and warmup >= 0, got lr {self.lr}, warmup {self.warmup}")

    @property
    def batch_size(self) -> int:
        return self.tokens_per_step // self.context_length

    @property
    def vocab(self) -> int:
        """Content tokens; `<bos>` is this id and pad the next."""
        return TEXT_VOCAB if self.data == "text" else self.bb_vocab

    @property
    def bos_id(self) -> int:
        return self.vocab

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "TrainConfig":
        known = {f.name for f in fields(TrainConfig)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown TrainConfig keys: {sorted(unknown)}")
        return TrainConfig(**d)


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
        positional_embedding_type=cfg.positional,
        default_prepend_bos=False,
        model_name=f"{cfg.data}-{cfg.packing}-{'fixedbos' if cfg.fixed_bos else 'nobos'}-T{cfg.context_length}",
        seed=cfg.seed,
        device=device,
    )
    return HookedTransformer(hcfg)


# --- data -------------------------------------------------------------------------


class TrainData:
    """Training batches, fixed validation windows and sink-scoring documents."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.bos_id = cfg.bos_id
        self.g = torch.Generator().manual_seed(cfg.seed)
        need = cfg.context_length + 1
        sink_len = sink_tokens(cfg)
        if cfg.data == "text":
            self.train_stream, val = text_streams(limit_bytes=cfg.text_limit_bytes)
            for name, s in (("training", self.train_stream), ("validation", val)):
                if len(s) <= need:
                    raise ValueError(
                        f"context_length {cfg.context_length} needs more than {need} tokens, but the "
                        f"{name} split of the text corpus has {len(s)}: lower the context length "
                        "or raise text_limit_bytes"
                    )
            self.bb = None
            val_g = torch.Generator().manual_seed(10_000 + cfg.seed)
            self.val_chunks = sample_windows(val, batch=cfg.val_windows, length=cfg.context_length, generator=val_g)
            self.prompts = stream_documents(val, bos_id=self.bos_id, min_len=sink_len, n=cfg.eval_prompts)
        else:
            self.bb = BigramBackcopy.make(
                vocab=cfg.bb_vocab, n_triggers=cfg.bb_triggers, trigger_prob=cfg.bb_trigger_prob,
                doc_min=cfg.bb_doc_min, doc_max=cfg.bb_doc_max, seed=cfg.seed,
            )
            self.stream = BigramBackcopyStream(self.bb, cfg.batch_size, seed=cfg.seed + 1)
            self.val_chunks = BigramBackcopyStream(self.bb, cfg.val_windows, seed=cfg.seed + 2).next(cfg.context_length)
            self.prompts = backcopy_documents(self.bb, cfg.eval_prompts, sink_len, seed=cfg.seed + 3)
        if not self.prompts:
            raise ValueError(f"no held-out document has {sink_len} tokens to score sinks on")

    def batch(self) -> tuple[Int[Tensor, "batch pos"], Int[Tensor, "batch pos"]]:
        """One training batch (inputs, targets) under the config's `fixed_bos`."""
        cfg = self.cfg
        n = cfg.context_length + (0 if cfg.fixed_bos else 1)
        if self.bb is None:
            chunk = sample_windows(self.train_stream, batch=cfg.batch_size, length=n, generator=self.g)
        else:
            chunk = self.stream.next(n)
        return make_inputs(chunk, fixed_bos=cfg.fixed_bos, bos_id=self.bos_id)


def sink_tokens(cfg: TrainConfig) -> int:
    """Content tokens per sink-scoring prompt: the paper's 64, or fewer if the
    context (which must also hold `<bos>`) is shorter."""
    return min(64, cfg.context_length - 1)


# --- forward passes ---------------------------------------------------------------


def intra_doc_hook(allowed: Bool[Tensor, "batch query_pos key_pos"]) -> Callable:
    """On `attn_scores`: -inf where query and key are in different documents.
    Returns a new tensor (never edits the activation)."""

    def hook(scores: Float[Tensor, "batch head_index query_pos key_pos"], hook):
        return scores.masked_fill(~allowed[:, None].to(scores.device), float("-inf"))

    return hook


def packing_hooks(tokens: Tensor, *, packing: str, bos_id: int, fixed_bos: bool) -> list:
    """The forward hooks a packing recipe needs on `tokens` (none for causal)."""
    if packing == "causal":
        return []
    allowed = same_document(tokens.cpu(), bos_id=bos_id, fixed_bos=fixed_bos)
    return [(lambda name: name.endswith("attn_scores"), intra_doc_hook(allowed))]


def lm_loss(
    model: HookedTransformer,
    inputs: Int[Tensor, "batch pos"],
    targets: Int[Tensor, "batch pos"],
    *,
    packing: str,
    bos_id: int,
    fixed_bos: bool,
    first: int = 0,
) -> Float[Tensor, ""]:
    """Mean next-token cross-entropy (nats/token) over positions >= `first`."""
    device = model.cfg.device
    hooks = packing_hooks(inputs, packing=packing, bos_id=bos_id, fixed_bos=fixed_bos)
    with model.hooks(fwd_hooks=hooks):
        logits = model(inputs.to(device), return_type="logits")
    logits = logits[:, first:]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets[:, first:].reshape(-1).to(device))


def learning_rate(cfg: TrainConfig, step: int) -> float:
    """Linear warmup to `lr`, then cosine decay to `min_lr_ratio * lr`."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def evaluate(model: HookedTransformer, data: TrainData) -> dict:
    """Validation loss and sink statistics, with `<bos>` at position 0 and without.

    Returns:
        {"val_loss": {cond: nats/token}, "conditions": {cond: {"sink_rate":
        {eps: percent}, "head_scores": [layer][head], "max_head_score",
        "mean_head_score", "uniform_score"}}} for cond in ("prepend", "none").
    """
    cfg = data.cfg
    was_training = model.training
    model.eval()
    chunk = data.val_chunks  # content c_0..c_{T-1}; both conditions predict c_1..c_{T-1}
    val_loss = {}
    for cond in CONDITIONS:
        with_bos = cond == "prepend"
        inputs, targets = make_inputs(chunk, fixed_bos=True, bos_id=data.bos_id)
        if not with_bos:
            inputs, targets = chunk[:, :-1], chunk[:, 1:]
        loss = lm_loss(
            model, inputs, targets, packing=cfg.packing, bos_id=data.bos_id,
            fixed_bos=with_bos, first=1 if with_bos else 0,
        )
        val_loss[cond] = float(loss)
    conditions = {}
    for cond in CONDITIONS:
        s = sink_scores(
            model, data.prompts, bos=cond, max_tokens=sink_tokens(cfg),
            batch_size=64, bos_token_id=data.bos_id, progress=False,
        )
        mean = s.mean_scores()
        conditions[cond] = {
            "sink_rate": {format_eps(e): s.sink_rate(e) for e in EPS},
            "head_scores": mean.tolist(),
            "max_head_score": float(mean.max()),
            "mean_head_score": float(mean.mean()),
            "uniform_score": s.uniform_score(),
        }
    model.train(was_training)
    return {"val_loss": val_loss, "conditions": conditions}


# --- training -----------------------------------------------------------------------


@dataclass(frozen=True)
class TrainResult:
    """A finished run: the model, its config, the log, and where it was saved."""

    model: HookedTransformer
    config: TrainConfig
    log: dict
    out_dir: Path | None = None
    seconds: float = 0.0

    def final(self) -> dict:
        return self.log["evals"][-1]

    def to_json(self) -> str:
        return json.dumps(self.log)


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
        "conditions", "elapsed_s"}], "seconds"}.
    """
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    data = TrainData(cfg)
    model = build_model(cfg, device)
    model.train()
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95),
    )
    log = {"config": cfg.to_dict(), "device": str(model.cfg.device), "n_params": sum(p.numel() for p in model.parameters()),
           "train_loss": [], "evals": []}
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
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        log["train_loss"].append(loss.item())
        done = step + 1
        if done % cfg.eval_every == 0 or done == cfg.steps:
            ev = evaluate(model, data)
            recent = log["train_loss"][-min(20, done):]
            log["evals"].append({"step": done, "train_loss": sum(recent) / len(recent),
                                 "elapsed_s": time.perf_counter() - start, **ev})
            bar.set_postfix(val=f"{ev['val_loss']['prepend']:.3f}/{ev['val_loss']['none']:.3f}")
    log["seconds"] = time.perf_counter() - start
    model.eval()
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        save_checkpoint(model, cfg, out)
        (out / "log.json").write_text(json.dumps(log))
    return TrainResult(model=model, config=cfg, log=log, out_dir=out, seconds=log["seconds"])


def save_checkpoint(model: HookedTransformer, cfg: TrainConfig, out_dir: str | Path) -> Path:
    """Weights to `model.safetensors` (never pickle), config to `config.json`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
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
