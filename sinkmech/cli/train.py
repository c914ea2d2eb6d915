"""`sinkmech train`: train a small model from scratch and track its sinks (see scripts/train_sinks.py)."""

from __future__ import annotations

from pathlib import Path

from sinkmech.backend import BACKEND, IS_BRIDGE
from sinkmech.cli.common import UsageError
from sinkmech.prompts import CONDITIONS
from sinkmech.figures.training import training_curves


def add_train_parser(sub) -> None:
    p = sub.add_parser("train", help="train a small model from scratch and track its sinks (see scripts/train_sinks.py)")
    p.add_argument("--data", choices=["text", "bigram_backcopy"], default="text",
                   help="text: the Python documentation, byte-level; bigram_backcopy: the paper's synthetic task (default text)")
    p.add_argument("--packing", choices=["causal", "intra_doc"], default="causal",
                   help="causal: documents packed, attention crosses them; intra_doc: each attends within its own (default causal)")
    p.add_argument("--no-fixed-bos", dest="fixed_bos", action="store_false", help="no <bos> forced at position 0")
    p.add_argument("--context-length", type=int, default=128, help="tokens per training window (default 128)")
    p.add_argument("--tokens-per-step", type=int, default=4096,
                   help="tokens per optimiser step; batch = this // context length (default 4096)")
    p.add_argument("--layers", type=int, default=2, help="transformer blocks (default 2)")
    p.add_argument("--d-model", type=int, default=64, help="residual width (default 64)")
    p.add_argument("--heads", type=int, default=4, help="attention heads per layer (default 4)")
    p.add_argument("--steps", type=int, default=500, help="optimiser steps (default 500)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate, cosine decay (default 3e-3)")
    p.add_argument("--warmup", type=int, default=50, help="linear warm-up steps (default 50)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the data order (default 0)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's own choice)")
    p.add_argument("--eval-every", type=int, default=100, help="steps between sink and loss evaluations (default 100)")
    p.add_argument("--out", type=Path, required=True, help="directory for model.safetensors, config.json, log.json")
    p.add_argument("--png", type=Path, default=None, help="plot of the sink signals against step (.png, .svg or .pdf)")
    p.set_defaults(func=cmd_train)


def cmd_train(args) -> None:
    if IS_BRIDGE:
        raise UsageError(f"sinkmech train builds its models as TransformerLens 3.x HookedTransformers; this "
                         f"environment has the {BACKEND} backend (TransformerLens 4): install transformer-lens<4 to train")
    from sinkmech.train.run import TrainConfig, train

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
