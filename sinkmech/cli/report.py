"""`sinkmech report`: the one-page offline report (figures, summary.json, circuitsvis views)."""

from __future__ import annotations

import time
from pathlib import Path

from sinkmech.cli.common import (
    add_attention,
    BATCH_HELP, MODEL_HELP, dataclass_defaults, load_model_arg, model_name, output_file, output_folder, positive_int,
    run_options,
)
from sinkmech.files import check_output_dir
from sinkmech.findings import record, report_findings
from sinkmech.loading.names import DEFAULT_MODEL


# ReportContext settings a user can change from the command line, besides the flags above.
SECTION_SIZES = ("spread_prompts", "scan_prompts", "noop_prompts", "ablation_prompts", "ablation_tokens",
                 "beyond_prompts", "stream_tokens", "stream_window", "length_prompts", "length_tokens", "length_steps")


def add_report_parser(sub) -> None:
    defaults = dataclass_defaults("sinkmech.report.context", "ReportContext")
    p = sub.add_parser("report", help="one-page offline report: figures, summary.json and circuitsvis views")
    p.add_argument("--model", type=model_name, default=DEFAULT_MODEL, help=MODEL_HELP)
    p.add_argument("--out", type=output_folder, required=True,
                   help="output folder (index.html, summary.json, figures/; missing folders are created)")
    p.add_argument("--prompts", default=None, help="text file (one prompt per line) or JSONL with a 'text' field; default: the Python docs corpus")
    p.add_argument("--n-prompts", type=positive_int, default=170, help="prompts for the sink scores (default 170, as in the paper)")
    p.add_argument("--max-tokens", type=positive_int, default=64, help="content tokens per prompt (default 64)")
    p.add_argument("--batch-size", type=positive_int, default=16, help=BATCH_HELP)
    p.add_argument("--heads", type=positive_int, default=3, help="how many top / least sink-like heads to show up close")
    p.add_argument("--view-tokens", type=positive_int, default=32, help="tokens per prompt in the circuitsvis views")
    p.add_argument("--view-prompts", type=positive_int, default=3, help="prompts in the head-activity views")
    sizes = p.add_argument_group("section sizes (prompt counts are capped by --n-prompts)")
    for name in SECTION_SIZES:
        default = defaults[name]
        sizes.add_argument(f"--{name.replace('_', '-')}", type=positive_int, default=default, help=f"default {default}")
    p.add_argument("--findings", type=output_file, default=None,
                   help="merge the quotable numbers into this findings file (e.g. figures/findings.json)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier report in --out (as a whole); without it an earlier report is kept")
    add_attention(p, needs_pattern="draws circuitsvis views of whole attention patterns and edits them in its ablations")
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> None:
    from sinkmech.report.page import build_report

    check_output_dir(args.out, overwrite=args.overwrite, what="report folder")  # before the slow model load
    t0 = time.perf_counter()
    print(f"loading {args.model} ...", flush=True)
    model = load_model_arg(args)
    report = build_report(
        model,
        args.out,
        model_label=args.model,
        prompts=args.prompts,
        n_prompts=args.n_prompts,
        max_tokens=args.max_tokens,
        options=run_options(args),
        n_heads=args.heads,
        view_tokens=args.view_tokens,
        view_prompts=args.view_prompts,
        overwrite=args.overwrite,
        **{name: getattr(args, name) for name in SECTION_SIZES},
    )
    if args.findings is not None:
        label = args.model if "/" not in args.model else Path(args.model).stem
        record(args.findings, report_findings(label, report.summary), replace_prefix=f"{label}.report")
        print(f"recorded findings in {args.findings}")
    rates = report.summary["sections"]["sinks"]["sink_rate"]
    for bos, r in rates.items():
        print(f"sink rate bos={bos}: " + ", ".join(f"eps {e}: {v:.1f}%" for e, v in r.items()))
    print(f"wrote {report.index} and {report.summary_json} ({len(report.figures)} figure files) "
          f"in {time.perf_counter() - t0:.0f} s")
