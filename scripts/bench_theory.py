"""The Jacobian norms ||d h_j^(L) / d h_i^(0)||_F two ways, side by side: the
exact `jacrev` (T x d_model backward rows) and the forward-mode Hutchinson
estimate (T x probes `jvp` tangents), on the same prompts: seconds, the
speed-up, the relative error per entry and the Spearman correlations.

    python scripts/bench_theory.py --model smollm2 --tokens 8 --probes 4 16
"""

from __future__ import annotations

import argparse
import time


from sinkmech.loading import models
from sinkmech.studies.theory import pair_mask
from sinkmech.corpora import default_corpus
from sinkmech.prompts import tokenize
from sinkmech.theory.sensitivity import attention_patterns, jacobian_norms, jacobian_norms_hutchinson, path_weights, spearman


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--prompts", type=int, default=1)
    p.add_argument("--tokens", type=int, default=8, help="content tokens (with <bos>: one more position)")
    p.add_argument("--probes", type=int, nargs="+", default=[4, 16])
    p.add_argument("--chunk-size", type=int, default=32)
    args = p.parse_args(argv)
    model = models.load_model(args.model)
    batch = tokenize(model, default_corpus()[150 : 150 + args.prompts], bos="prepend", max_tokens=args.tokens)
    print(f"{args.model}: {args.prompts} prompt(s) x {args.tokens} content tokens + <bos>, d_model {model.cfg.d_model}")
    print(f"{'method':>16} {'seconds':>9} {'speed-up':>9} {'rel err median':>15} {'max':>7} {'rho(est, exact)':>16} "
          f"{'rho(path)':>10}")
    for p_i in range(args.prompts):
        seq = batch.tokens[p_i, : int(batch.lengths[p_i])]
        mask = pair_mask(len(seq), 0, "all")
        paths = path_weights(attention_patterns(model, seq, model.cfg.n_layers)).float().cpu()
        t0 = time.perf_counter()
        exact = jacobian_norms(model, seq, chunk_size=args.chunk_size).float().cpu()
        t_exact = time.perf_counter() - t0
        print(f"{'exact (jacrev)':>16} {t_exact:>9.1f} {1.0:>9.1f} {0.0:>15.3f} {0.0:>7.3f} {1.0:>16.3f} "
              f"{spearman(exact[mask], paths[mask]):>10.3f}")
        for k in args.probes:
            t0 = time.perf_counter()
            est = jacobian_norms_hutchinson(model, seq, n_probes=k, chunk_size=args.chunk_size).float().cpu()
            t_est = time.perf_counter() - t0
            rel = ((est[mask] - exact[mask]).abs() / exact[mask].clamp(min=1e-30))
            print(f"{f'hutchinson x{k}':>16} {t_est:>9.1f} {t_exact / t_est:>9.1f} {float(rel.median()):>15.3f} "
                  f"{float(rel.max()):>7.3f} {spearman(est[mask], exact[mask]):>16.3f} "
                  f"{spearman(est[mask], paths[mask]):>10.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
