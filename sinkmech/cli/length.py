"""`sinkmech length`: sink rate, mean first-token score against uniform
attention, and the top sink heads' mask_first cost as the evaluation length
grows (the same texts cut to each length; see sinkmech.eval_length)."""

from __future__ import annotations

from sinkmech.cli.common import (
    MODEL_HELP, PNG_HELP, Distinct, UsageError, at_least, head_spec, image_file, load_model_arg, model_name,
    output_file, positive_float, positive_int, write_results,
)
from sinkmech.eval_length import DEFAULT_LENGTHS, UNIFORM_MULTIPLES, long_prompts, sinks_vs_length
from sinkmech.figures.mechanisms import length_lines
from sinkmech.hooks import head_label, parse_head
from sinkmech.models import DEFAULT_MODEL
from sinkmech.prompts import DEFAULT_EPS
from sinkmech.sinks import format_eps


def add_length_parser(sub) -> None:
    p = sub.add_parser("length", help="sink rate and top-head mask_first cost against the evaluation length")
    p.add_argument("--model", type=model_name, default=DEFAULT_MODEL, help=MODEL_HELP)
    p.add_argument("--lengths", type=at_least(2), nargs="+", action=Distinct, default=list(DEFAULT_LENGTHS),
                   help="content lengths to measure (default 64 128 256 512 1024; longer than the context: skipped)")
    p.add_argument("--n-prompts", type=positive_int, default=8, help="texts of the Python docs, cut to each length (default 8)")
    p.add_argument("--bos", choices=["prepend", "none"], default="prepend", help="<bos> before each text (default prepend)")
    p.add_argument("--top", type=positive_int, default=3, help="strongest sink heads whose mask_first cost is measured (default 3)")
    p.add_argument("--uniform-multiples", type=positive_float, nargs="+", action=Distinct,
                   default=list(UNIFORM_MULTIPLES), metavar="M",
                   help="also count a head a sink when alpha_0 > M x H_T / T, the uniform share at that length "
                        "(default 2 4; 4 is eps 0.3 at T = 64)")
    p.add_argument("--head", type=head_spec, default=None,
                   help="the head tracked across every length, LAYER.HEAD (default: the top head at the shortest length)")
    p.add_argument("--batch-size", type=positive_int, default=8, help="prompts per forward pass (default 8)")
    p.add_argument("--json", type=output_file, default=None, help="write results as JSON here ('-': stdout)")
    p.add_argument("--png", type=image_file, default=None, help=PNG_HELP)
    p.set_defaults(func=cmd_length)


def print_length_table(sweep) -> None:
    print()
    fixed = None if sweep.fixed_layer is None else head_label(sweep.fixed_layer, sweep.fixed_head)
    print(f"{'length':>7} " + " ".join(f"{'rate>' + format_eps(e):>9}" for e in sweep.eps)
          + " " + " ".join(f"{'>' + format_eps(m) + 'xU':>8}" for m in sweep.uniform_multiples)
          + f" {'mean a0':>8} {'uniform':>8} {str(fixed) + ' a0/U':>12} {'its KL':>8}  top heads (mask_first KL)")
    for i, T in enumerate(sweep.lengths):
        heads = ", ".join(f"{head_label(int(sweep.top_layer[i, r]), int(sweep.top_head[i, r]))} ({float(sweep.mask_first_cost[i, r]):.4f})"
                          for r in range(sweep.top_layer.shape[1]))
        rel = " ".join("     n/a" if v is None else f"{v:>7.1f}%" for v in sweep.relative_rates(i).values())
        print(f"{T:>7} " + " ".join(f"{float(sweep.sink_rate[i, j]):>8.1f}%" for j in range(len(sweep.eps)))
              + f" {rel} {float(sweep.mean_score[i]):>8.3f} {float(sweep.uniform_score[i]):>8.3f}"
              + f" {float(sweep.fixed_score[i]) / float(sweep.uniform_score[i]):>12.2f} {float(sweep.fixed_cost[i]):>8.4f}"
              + f"  {heads}")
    if fixed is not None:
        how = (f"the top head at length {sweep.fixed_chosen_at}" if sweep.fixed_chosen_at is not None else "named by --head")
        print(f"fixed head {fixed} ({how}); xU: alpha_0 > M x H_T / T, the uniform share (n/a: M x H_T / T >= 1)")
    for T, why in sweep.skipped:
        print(f"skipped {T}: {why}")


def cmd_length(args) -> None:
    lengths = sorted(args.lengths)  # each >= 2 and none repeated: checked by the flag's type and action
    model = load_model_arg(args)
    if args.top > model.cfg.n_layers * model.cfg.n_heads:
        raise UsageError(f"--top must be <= {model.cfg.n_layers * model.cfg.n_heads} (the model's heads), got {args.top}")
    fixed = None if args.head is None else parse_head(args.head, model)
    batch = long_prompts(model, args.n_prompts, max(lengths), bos=args.bos)
    sweep = sinks_vs_length(model, batch, lengths=lengths, top_k=args.top, eps=DEFAULT_EPS,
                            uniform_multiples=args.uniform_multiples, fixed_head=fixed, batch_size=args.batch_size)
    print_length_table(sweep)

    def png_out() -> None:
        if not sweep.lengths:
            raise UsageError("every length was skipped: nothing to draw")
        print(f"wrote {length_lines(sweep, args.png, model_name=args.model)}")

    write_results(args, sweep.to_dict(), png_out)
