"""Benchmark: next-token losses from final residual rows: the logits' buffer and the unembedding's layout.

Every loss sinkmech computes from a residual row (`sinkmech.measures.loss.next_token_nll`:
the no-op check, the sink-score loss, the sweeps' references) unembeds a chunk
of 256 rows at a time. Measured side by side in one run, on the same rows of a
real model's last block output:
- "reused": the logits go into one buffer kept across calls
  (`unembed(..., scratch=True)`) and the log-softmax at the target is taken in
  place (what `next_token_nll` does), with W_U stored by vocabulary rows (the
  transpose of a contiguous [d_vocab, d_model] tensor, as sinkmech's loaders keep it);
- "reused, W_U [d_model, d_vocab]": the same with W_U contiguous as
  TransformerLens builds it (what sinkmech did before);
- "fresh": new tensors per chunk, `log_softmax(unembed(resid))` then the
  target's entry.
They run interleaved, round after round; seconds per chunk and the ratios
are printed, with each one's largest difference from a float64 log-softmax.

    python scripts/bench_unembed.py --model gemma3-270m --threads 2
"""

from __future__ import annotations

import argparse
import time
from contextlib import contextmanager


def fresh(model, resid, targets):
    import torch

    from sinkmech.loading.backend import unembed

    with torch.no_grad():
        lp = torch.log_softmax(unembed(model, resid).float(), dim=-1)
    return -lp.gather(-1, targets[..., None])[..., 0]


@contextmanager
def d_model_major(model):
    """W_U as a contiguous [d_model, d_vocab] tensor for the duration."""
    import torch

    kept = model.unembed.W_U
    model.unembed.W_U = torch.nn.Parameter(kept.detach().contiguous(), requires_grad=kept.requires_grad)
    try:
        yield
    finally:
        model.unembed.W_U = kept


def reused_d_model_major(model, resid, targets):
    from sinkmech.measures.loss import next_token_nll

    with d_model_major(model):
        return next_token_nll(model, resid, targets)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--rows", type=int, default=256, help="rows per chunk (sinkmech's UNEMBED_ROWS)")
    p.add_argument("--chunks", type=int, default=8, help="chunks per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = p.parse_args(argv)
    import torch

    from sinkmech import load_model, tokenize
    from sinkmech.hooks import run
    from sinkmech.loading.backend import unembed
    from sinkmech.measures.loss import next_token_nll

    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.model, device="cpu")
    batch = tokenize(model, None, bos="prepend", max_tokens=64)
    need = args.rows * args.chunks
    n_prompts = -(-need // batch.tokens.shape[1])
    tokens = batch.tokens[:n_prompts]
    with torch.no_grad():
        resid = run(model, tokens, stop_at_layer=model.cfg.n_layers)
    rows = resid[:, :-1].reshape(-1, resid.shape[-1])[:need]
    targets = tokens[:, 1:].reshape(-1)[:need]
    chunks = [(rows[a : a + args.rows], targets[a : a + args.rows]) for a in range(0, need, args.rows)]
    variants = {"reused": next_token_nll, "reused, W_U [d_model, d_vocab]": reused_d_model_major, "fresh": fresh}
    error = dict.fromkeys(variants, 0.0)  # largest difference from the float64 log-softmax
    for r, t in chunks:
        with torch.no_grad():
            exact = -torch.log_softmax(unembed(model, r).double(), -1).gather(-1, t[:, None])[:, 0]
        for name, f in variants.items():
            error[name] = max(error[name], float((f(model, r, t).double() - exact).abs().max()))
    seconds = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, f in variants.items():
            if name == "reused, W_U [d_model, d_vocab]":  # the swap itself is not timed
                with d_model_major(model):
                    t0 = time.perf_counter()
                    for r, t in chunks:
                        next_token_nll(model, r, t)
            else:
                t0 = time.perf_counter()
                for r, t in chunks:
                    f(model, r, t)
            seconds[name].append((time.perf_counter() - t0) / len(chunks))
    best = {k: min(v) for k, v in seconds.items()}
    print(f"{args.model}: d_vocab {model.cfg.d_vocab}, {args.rows} rows a chunk, {torch.get_num_threads()} threads, "
          f"best of {args.rounds} rounds of {args.chunks} chunks")
    base = best["reused"]
    print(f"  reused buffer, in-place log-softmax, W_U by vocabulary rows: {base:.3f} s a chunk")
    for name, label in (("reused, W_U [d_model, d_vocab]", "the same, W_U [d_model, d_vocab] contiguous: "),
                        ("fresh", "new tensors, log_softmax:                    ")):
        print(f"  {label}{best[name]:.3f} s a chunk ({best[name] / base:.2f}x)")
    print("  largest difference from a float64 log-softmax: "
          + ", ".join(f"{name} {e:.1e} nats" for name, e in error.items()))
    return {"model": args.model, "seconds_per_chunk": best, "max_abs_error": error}


if __name__ == "__main__":
    main()
