"""Benchmark: next-token losses from final residual rows, logits in a reused buffer vs new tensors.

Every loss sinkmech computes from a residual row (`sinkmech.measures.loss.next_token_nll`:
the no-op check, the sink-score loss, the sweeps' references) unembeds a chunk
of 256 rows at a time. Measured side by side in one run, on the same rows of a
real model's last block output:
- "reused": the logits go into one buffer kept across calls
  (`unembed(..., scratch=True)`) and the log-softmax at the target is taken in
  place (what `next_token_nll` does);
- "fresh": new tensors per chunk, `log_softmax(unembed(resid))` then the
  target's entry (what it did before).
The two run interleaved, round after round; seconds per chunk and the ratio
are printed, with each one's largest difference from a float64 log-softmax.

    python scripts/bench_unembed.py --model gemma3-270m --threads 2
"""

from __future__ import annotations

import argparse
import time


def fresh(model, resid, targets):
    import torch

    from sinkmech.loading.backend import unembed

    with torch.no_grad():
        lp = torch.log_softmax(unembed(model, resid).float(), dim=-1)
    return -lp.gather(-1, targets[..., None])[..., 0]


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
    error = {"reused": 0.0, "fresh": 0.0}  # largest difference from the float64 log-softmax
    for r, t in chunks:
        with torch.no_grad():
            exact = -torch.log_softmax(unembed(model, r).double(), -1).gather(-1, t[:, None])[:, 0]
        for name, f in (("reused", next_token_nll), ("fresh", fresh)):
            error[name] = max(error[name], float((f(model, r, t).double() - exact).abs().max()))
    seconds = {"reused": [], "fresh": []}
    for _ in range(args.rounds):
        for name, f in (("reused", next_token_nll), ("fresh", fresh)):
            t0 = time.perf_counter()
            for r, t in chunks:
                f(model, r, t)
            seconds[name].append((time.perf_counter() - t0) / len(chunks))
    best = {k: min(v) for k, v in seconds.items()}
    print(f"{args.model}: d_vocab {model.cfg.d_vocab}, {args.rows} rows a chunk, {torch.get_num_threads()} threads, "
          f"best of {args.rounds} rounds of {args.chunks} chunks")
    print(f"  reused buffer, in-place log-softmax: {best['reused']:.3f} s a chunk")
    print(f"  new tensors, log_softmax:            {best['fresh']:.3f} s a chunk ({best['fresh'] / best['reused']:.2f}x)")
    print(f"  largest difference from a float64 log-softmax: reused {error['reused']:.1e} nats, "
          f"new tensors {error['fresh']:.1e} nats")
    return {"model": args.model, "seconds_per_chunk": best, "max_abs_error": error}


if __name__ == "__main__":
    main()
