"""Benchmark: the weights' layout, on the report's sweeps.

sinkmech's TransformerLens 3.9 loaders keep every weight laid out as the
forward pass reads it (`sinkmech.loading.hooked._weights_as_linear_reads_them`):
TransformerLens builds W_Q, W_K, W_V [head, d_model, d_head], W_O [head,
d_head, d_model] and the gated MLP's W_in, W_gate, W_out in layouts its own
forward copies into the matrices `F.linear` takes, on every pass. Measured side
by side in one run, on the same model: the report's ablation sweep (mask_first
over every head, 4 prompts x 16 tokens, 512 rows a pass) and its resid_pre
patch (per layer, content positions 1..n-1), with the weights as the loaders
keep them and as TransformerLens builds them (contiguous copies swapped in for
the duration, outside the timing). Phases run interleaved, round after round;
medians and the ratio are printed, with the largest difference between the two
layouts' effects.

    python scripts/bench_layout.py --model smollm2
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import contextmanager, nullcontext


@contextmanager
def transformer_lens_layout(model):
    """Every parameter as a contiguous tensor (TransformerLens's own layout) for the duration."""
    import torch

    kept = {}
    for module in model.modules():
        for name, w in list(module._parameters.items()):
            if w is not None and not w.is_contiguous():
                kept[(module, name)] = w
                module._parameters[name] = torch.nn.Parameter(w.detach().contiguous(), requires_grad=w.requires_grad)
    try:
        yield len(kept)
    finally:
        for (module, name), w in kept.items():
            module._parameters[name] = w


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = p.parse_args(argv)
    import torch

    from sinkmech import default_corpus, load_model
    from sinkmech.interventions.ablation import head_ablations
    from sinkmech.interventions.patching import bos_pair, patch_resid_pre
    from sinkmech.options import QUIET, RunOptions
    from sinkmech.report.sections import ABLATION_ROWS

    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.model, device="cpu")
    prompts = default_corpus(80)[:4]
    pair = bos_pair(model, prompts, max_tokens=16)
    effects = {}

    def ablate(layout):
        effects[layout] = head_ablations(model, prompts, mode="mask_first", bos="prepend", max_tokens=16,
                                         options=RunOptions(batch_size=ABLATION_ROWS, progress=False)).effects

    def patched(layout):
        patch_resid_pre(model, pair, per_position=False, source="prepend", options=QUIET,
                        positions=range(1, pair.n_content))

    phases = {"ablate": ablate, "patch": patched}
    seconds = {f"{what}, {lay}": [] for what in phases for lay in ("kept", "as built")}
    n_moved = 0
    for _ in range(args.rounds):  # interleaved: each phase in each layout, round after round
        for what, f in phases.items():
            for layout in ("kept", "as built"):
                with (transformer_lens_layout(model) if layout == "as built" else nullcontext(0)) as moved:
                    n_moved = max(n_moved, moved)
                    t0 = time.perf_counter()  # the swap itself is not timed
                    f(layout)
                    seconds[f"{what}, {layout}"].append(time.perf_counter() - t0)
    seconds = {k: statistics.median(v) for k, v in seconds.items()}
    diff = float((effects["kept"] - effects["as built"]).abs().max())
    print(f"{args.model}: {n_moved} weights laid out as read, {torch.get_num_threads()} threads, "
          f"median of {args.rounds} rounds")
    for what in ("ablate", "patch"):
        kept, built = seconds[f"{what}, kept"], seconds[f"{what}, as built"]
        print(f"  {what}: {kept:.2f} s as kept vs {built:.2f} s as TransformerLens builds them ({built / kept:.2f}x)")
    print(f"  largest difference between the two layouts' ablation effects: {diff:.1e} nats")
    return {"model": args.model, "seconds": seconds, "max_abs_difference": diff}


if __name__ == "__main__":
    main()
