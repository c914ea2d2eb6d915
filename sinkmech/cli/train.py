"""`sinkmech train`: train a small model from scratch and track its sinks (see scripts/train_sinks.py)."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

from sinkmech.cli.common import UsageError, image_file, non_negative_int, positive_float, positive_int
from sinkmech.train.config import PACKINGS, DataSource, TrainConfig


def add_train_parser(sub) -> None:
    p = sub.add_parser("train", help="train a small model from scratch and track its sinks (see scripts/train_sinks.py)")
    p.add_argument("--data", choices=get_args(DataSource), default=TrainConfig.data,
                   help="text: the Python documentation, byte-level; bigram_backcopy: the paper's synthetic task (default %(default)s)")
    p.add_argument("--packing", choices=PACKINGS, default=TrainConfig.packing,
                   help="causal: documents packed, attention crosses them; intra_doc: each attends within its own (default %(default)s)")
    p.add_argument("--no-fixed-bos", dest="fixed_bos", action="store_false", help="no <bos> forced at position 0")
    p.add_argument("--context-length", type=positive_int, default=TrainConfig.context_length, help="tokens per training window (default %(default)s)")
    p.add_argument("--tokens-per-step", type=positive_int, default=TrainConfig.tokens_per_step,
                   help="tokens per optimiser step; batch = this // context length (default %(default)s)")
    p.add_argument("--layers", type=positive_int, default=TrainConfig.n_layers, help="transformer blocks (default %(default)s)")
    p.add_argument("--d-model", type=positive_int, default=TrainConfig.d_model, help="residual width (default %(default)s)")
    p.add_argument("--heads", type=positive_int, default=TrainConfig.n_heads, help="attention heads per layer (default %(default)s)")
    p.add_argument("--steps", type=positive_int, default=TrainConfig.steps, help="optimiser steps (default %(default)s)")
    p.add_argument("--lr", type=positive_float, default=TrainConfig.lr, help="peak learning rate, cosine decay (default %(default)s)")
    p.add_argument("--warmup", type=non_negative_int, default=TrainConfig.warmup, help="linear warm-up steps (default %(default)s)")
    p.add_argument("--seed", type=int, default=TrainConfig.seed, help="seed of the weights and the data order (default %(default)s)")
    p.add_argument("--threads", type=positive_int, default=TrainConfig.threads, help="torch CPU threads (default: torch's own choice)")
    p.add_argument("--eval-every", type=positive_int, default=TrainConfig.eval_every, help="steps between sink and loss evaluations (default %(default)s)")
    p.add_argument("--out", type=Path, required=True, help="directory for model.safetensors, config.json, log.json")
    p.add_argument("--png", type=image_file, default=None, help="plot of the sink signals against step (.png, .svg or .pdf)")
    p.set_defaults(func=cmd_train)


def cmd_train(args) -> None:
    from sinkmech.backend import BACKEND, IS_BRIDGE
    from sinkmech.figures.training import training_curves
    from sinkmech.prompts import CONDITIONS

    if IS_BRIDGE:
        raise UsageError(f"sinkmech train builds its models as TransformerLens 3.x HookedTransformers; this "
                         f"environment has the {BACKEND} backend (TransformerLens 4): install transformer-lens<4 to train")
    from sinkmech.train.run import train  # TL 3.x only: imported once the backend is known

    cfg = TrainConfig(
        data=args.data, packing=args.packing, fixed_bos=args.fixed_bos, context_length=args.context_length,
        tokens_per_step=args.tokens_per_step, n_layers=args.layers, d_model=args.d_model, n_heads=args.heads,
        steps=args.steps, lr=args.lr, warmup=args.warmup, seed=args.seed, threads=args.threads,
        eval_every=args.eval_every,
    )
    result = train(cfg, args.out)
    final = result.final()
    print(f"trained in {result.seconds:.1f} s; wrote {args.out}")
    for cond in CONDITIONS:
        c = final["conditions"][cond]
        print(f"bos={cond:>7}: val loss {final['val_loss'][cond]:.3f}  sink rate {c['sink_rate']}  "
              f"max head {c['max_head_score']:.3f}  uniform {c['uniform_score']:.3f}")
    if args.png:
        print(f"wrote {training_curves({args.out.name: result.log}, args.png)}")
