"""Training throughput: `sinkmech.train.run.train` against a plain forward +
backward of the same model on one fixed batch, side by side in one process.

    python scripts/bench_train.py --preset cpu --steps 50

Times, per step: the data stream alone (`TrainData.batch`); a plain step (a
fixed batch through `model(...)`, cross-entropy, backward, gradient clipping,
AdamW); and `train` itself under causal and intra-document packing (data
generation, packing hooks and logging included, evaluations subtracted). The
ratio train / plain shows whether data generation and hooks dominate.
Writes bench_train.json under --out.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from sinkmech.files import json_text, write_text
from sinkmech.options import RunOptions
from sinkmech.train.presets import PRESETS
from sinkmech.train.run import TrainConfig, TrainData, build_model, train


def time_data(cfg: TrainConfig, steps: int) -> float:
    """Seconds per `TrainData.batch()` call."""
    data = TrainData(cfg)
    t = time.perf_counter()
    for _ in range(steps):
        data.batch()
    return (time.perf_counter() - t) / steps


def time_plain(cfg: TrainConfig, steps: int) -> float:
    """Seconds per plain step on one fixed batch: forward, loss, backward, clip, AdamW."""
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, "cpu")
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    inputs, targets = TrainData(cfg).batch()

    def step() -> None:
        logits = model(inputs, return_type="logits")
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    step()  # warm-up
    t = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t) / steps


def time_train(cfg: TrainConfig, steps: int) -> float:
    """Seconds per step of `train` (one evaluation at the end, subtracted)."""
    log = train(replace(cfg, steps=steps, eval_every=steps, warmup=min(cfg.warmup, steps)), None,
                options=RunOptions(progress=False, device="cpu")).log
    return (log["seconds"] - log["eval_seconds"]) / steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--set", nargs="+", default=None, metavar="KEY=VALUE",
                        help="TrainConfig overrides, e.g. tokens_per_step=256 (integers only)")
    parser.add_argument("--out", default="figures/train", help="where bench_train.json goes")
    args = parser.parse_args(argv)
    if args.steps < 1:
        print("error: --steps must be >= 1", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    kw = {**PRESETS[args.preset], "threads": args.threads}
    for item in args.set or []:
        key, _, value = item.partition("=")
        kw[key] = int(value)
    cfg = TrainConfig(**kw)
    n = args.steps
    data_s = time_data(cfg, n)
    plain_s = time_plain(cfg, n)
    train_causal_s = time_train(replace(cfg, packing="causal"), n)
    train_intra_s = time_train(replace(cfg, packing="intra_doc"), n)
    result = {
        "preset": args.preset,
        "steps": n,
        "threads": args.threads,
        "tokens_per_step": cfg.batch_size * cfg.context_length,
        "data_steps_per_s": 1 / data_s,
        "plain_steps_per_s": 1 / plain_s,
        "train_causal_steps_per_s": 1 / train_causal_s,
        "train_intra_doc_steps_per_s": 1 / train_intra_s,
        "data_share_of_train_step": data_s / train_causal_s,
        "ratio_train_causal_to_plain": train_causal_s / plain_s,
        "ratio_train_intra_doc_to_plain": train_intra_s / plain_s,
    }
    print(f"{'':<28}{'steps/s':>10}{'ms/step':>10}")
    for label, s in (("data stream only", data_s), ("plain fwd+bwd+AdamW", plain_s),
                     ("train, causal", train_causal_s), ("train, intra_doc", train_intra_s)):
        print(f"{label:<28}{1 / s:>10.2f}{1000 * s:>10.1f}")
    print(f"ratio train/plain: causal {result['ratio_train_causal_to_plain']:.2f}, "
          f"intra_doc {result['ratio_train_intra_doc_to_plain']:.2f} "
          f"(data is {100 * result['data_share_of_train_step']:.0f} % of a causal training step)")
    out = Path(args.out)
    write_text(out / "bench_train.json", json_text(result, indent=1))
    print(f"wrote {out / 'bench_train.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
