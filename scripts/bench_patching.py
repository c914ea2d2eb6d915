"""Benchmark: the exact batched ablation sweep vs one forward per head, on SmolLM2.

All measured in one run, side by side: the model load (from the converted-model
cache, with the imports), the exact sweep over all heads as `ablate` runs it by default (batched
copies, restarting at each head's layer, every prompt in one group), the
independent one-`run_with_hooks`-per-head loop, a plain forward pass, and
attribution patching (one batched forward + backward); with --prompt-batch-one
also the sweep with each prompt in its own group (`ablate --prompt-batch 1`).
The loop / sweep ratio is printed with the load added to both sides (what a
user waits for) and without it. The compute floor of any exact per-head sweep is
n_heads x (n_layers + 1) / 2 plain-forward equivalents (a head in layer l must
recompute layers l..L-1). With --loop-heads N the loop runs on N heads spread
evenly over the model, its time is extrapolated per head to all heads (said so
in the output), and its values are checked against the sweep on those heads.
Wall-clock and CPU (process) time are both printed: on a shared machine CPU
time is the fairer comparison.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from sinkmech.options import RunOptions


class Timer:
    def __enter__(self):
        self.w, self.c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.w, time.process_time() - self.c


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--mode", default="mask_first", choices=["mask_first", "all_to_first", "zero"])
    p.add_argument("--prompt-batch-one", action="store_true", help="also time the sweep one prompt per group")
    p.add_argument("--n-prompts", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32, help="content tokens per prompt (<bos> is prepended)")
    p.add_argument("--loop-heads", type=int, default=None, help="time the loop on N heads only and extrapolate (default: all)")
    p.add_argument("--samples", type=int, default=8, help="label draws for the KL attribution estimate")
    p.add_argument("--forward-repeats", type=int, default=3, help="plain forwards timed before, between and after the phases")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)

    with Timer() as tload:  # what a fresh `sinkmech ablate` pays before its sweep: the imports and the load
        import torch

        from sinkmech.interventions.ablation import ablation_hooks, ablation_setup, head_ablations
        from sinkmech.interventions.attribution import attribute_ablations, pearson
        from sinkmech.loading.models import load_model
        from sinkmech.prompts import default_corpus, tokenize
        from sinkmech.interventions.sweep import Intervention, loop, reference_logits

        model = load_model(args.model)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    batch = tokenize(model, default_corpus(args.n_prompts), bos="prepend", max_tokens=args.tokens)
    n_cells = L * H
    print(f"{args.model}: {L} layers x {H} heads = {n_cells} heads; {len(batch)} prompts x {args.tokens} tokens "
          f"(+<bos>); {args.mode}; imports + load {tload.wall:.1f} s")

    run = lambda: reference_logits(model, batch.tokens, batch.offset, args.tokens)  # noqa: E731
    run()  # warm-up
    fwd: list[Timer] = []

    def time_forwards() -> None:
        # Sampled between the phases: on a shared machine the load changes over the run.
        for _ in range(args.forward_repeats):
            with Timer() as t:
                run()
            fwd.append(t)

    time_forwards()
    with Timer() as ts:
        exact = head_ablations(model, batch, mode=args.mode, options=RunOptions(progress=True))
    time_forwards()
    one = None
    if args.prompt_batch_one:
        with Timer() as t1:
            one = head_ablations(model, batch, mode=args.mode, prompt_batch=1, options=RunOptions(progress=True))
        time_forwards()

    n_loop = n_cells if args.loop_heads is None else max(1, min(args.loop_heads, n_cells))
    picks = sorted({round(i * (n_cells - 1) / max(n_loop - 1, 1)) for i in range(n_loop)})
    cells = [Intervention(i // H, ablation_hooks(args.mode, i // H, i % H, None)) for i in picks]
    setup = ablation_setup(model, batch, mode=args.mode)  # the exact sweep's clean run and metric
    with Timer() as tl:
        looped = loop(model, batch.tokens, cells, score=setup.score, offset=batch.offset, n_content=setup.n_content)
    diff = float((looped - exact.effects.flatten()[picks]).abs().max())
    time_forwards()
    fwd_wall = min(t.wall for t in fwd)
    fwd_cpu = min(t.cpu for t in fwd)
    scale = n_cells / len(picks)

    with Timer() as ta:
        approx = attribute_ablations(model, batch, mode=args.mode, samples=args.samples)
    r = pearson(exact.effects, approx.effects)
    rank = pearson(exact.effects.flatten().argsort().argsort().float(), approx.effects.flatten().argsort().argsort().float())

    floor = H * (L + 1) / 2
    rows = {
        "imports + model load (converted-model cache)": (tload.wall, tload.cpu),
        f"plain forward (min of {len(fwd)}, sampled between phases)": (fwd_wall, fwd_cpu),
        f"exact sweep, {n_cells} heads": (ts.wall, ts.cpu),
        f"loop, {len(picks)} heads measured": (tl.wall, tl.cpu),
        f"loop, {n_cells} heads{' (extrapolated)' if len(picks) < n_cells else ''}": (tl.wall * scale, tl.cpu * scale),
        f"attribution ({args.samples} label draws)": (ta.wall, ta.cpu),
        f"compute floor = {H} x ({L}+1)/2 = {floor:g} forwards": (floor * fwd_wall, floor * fwd_cpu),
    }
    if one is not None:
        rows["exact sweep, one prompt per group (--prompt-batch 1)"] = (t1.wall, t1.cpu)
    print()
    print(f"{'':52} {'wall s':>9} {'cpu s':>9}")
    for k, (w, c) in rows.items():
        print(f"{k:52} {w:9.2f} {c:9.2f}")
    ratios = {
        "loop / exact sweep, load included": ((tload.wall + tl.wall * scale) / (tload.wall + ts.wall),
                                              (tload.cpu + tl.cpu * scale) / (tload.cpu + ts.cpu)),
        "loop / exact sweep": (tl.wall * scale / ts.wall, tl.cpu * scale / ts.cpu),
        "exact sweep / compute floor": (ts.wall / (floor * fwd_wall), ts.cpu / (floor * fwd_cpu)),
        "exact sweep / plain forward": (ts.wall / fwd_wall, ts.cpu / fwd_cpu),
        "exact sweep / attribution": (ts.wall / ta.wall, ts.cpu / ta.cpu),
    }
    if one is not None:
        ratios["loop / sweep one prompt per group, load included"] = (
            (tload.wall + tl.wall * scale) / (tload.wall + t1.wall), (tload.cpu + tl.cpu * scale) / (tload.cpu + t1.cpu))
        ratios["sweep one prompt per group / exact sweep"] = (t1.wall / ts.wall, t1.cpu / ts.cpu)
    print()
    print(f"{'ratio':52} {'wall':>9} {'cpu':>9}")
    for k, (w, c) in ratios.items():
        print(f"{k:52} {w:9.2f} {c:9.2f}")
    note = " (loop time extrapolated from the measured heads)" if len(picks) < n_cells else ""
    print(f"\nloop vs sweep on the {len(picks)} looped heads: max |difference| = {diff:.2e}{note}")
    if one is not None:
        print(f"sweep one prompt per group vs the sweep: max |difference| = "
              f"{float((one.effects - exact.effects).abs().max()):.2e}")
    print(f"attribution vs exact: Pearson r = {r:.3f}, Spearman rho = {rank:.3f}")
    print(f"largest exact effects: {exact.top_heads(5)}")
    result = {
        "model": args.model, "mode": args.mode, "n_prompts": len(batch), "tokens": args.tokens, "n_heads_total": n_cells,
        "loop_heads_measured": len(picks), "loop_extrapolated": len(picks) < n_cells,
        "seconds": {k: {"wall": w, "cpu": c} for k, (w, c) in rows.items()},
        "ratios": {k: {"wall": w, "cpu": c} for k, (w, c) in ratios.items()},
        "max_abs_diff_loop_vs_sweep": diff, "pearson_attribution": r, "spearman_attribution": rank,
        "torch_threads": torch.get_num_threads(),
    }
    if args.json:
        from sinkmech.files import json_text, write_text

        write_text(args.json, json_text(result))
    return result


if __name__ == "__main__":
    main()
