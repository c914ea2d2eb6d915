"""`sinkmech report`: the one-page offline report (figures, summary.json, circuitsvis views)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from sinkmech.cli.common import (
    BATCH_HELP, MODEL_HELP, add_attention, dataclass_defaults, load_model_arg, count_or_all, model_name,
    non_negative_int, output_file, output_folder, positive_int, prompts_arg, run_options,
)
from sinkmech.dormant.first_look import NOOP_MAX_HEADS, NOOP_PROMPTS, first_look_note
from sinkmech.files import check_output_dir
from sinkmech.findings import record, report_findings
from sinkmech.loading.names import DEFAULT_MODEL


# ReportContext settings a user can change from the command line, besides the flags above.
SECTION_SIZES = ("spread_prompts", "scan_prompts", "noop_prompts", "ablation_prompts", "ablation_tokens",
                 "beyond_prompts", "stream_tokens", "stream_window", "length_prompts", "length_tokens", "length_steps")


NOOP_PROMPTS_HELP = (f"default 0: no no-op check (`sinkmech heads` runs it); {NOOP_PROMPTS}: a first look on at most "
                     "--noop-max-heads heads, and the run says what the whole check would take")


def add_report_parser(sub) -> None:
    defaults = dataclass_defaults("sinkmech.report.context", "ReportContext")
    p = sub.add_parser("report", help="one-page offline report: figures, summary.json and circuitsvis views")
    p.add_argument("--model", type=model_name, default=DEFAULT_MODEL, help=MODEL_HELP)
    p.add_argument("--out", type=output_folder, required=True,
                   help="output folder (index.html, summary.json, figures/; missing folders are created)")
    p.add_argument("--prompts", default=None, help="text file (one prompt per line) or JSONL with a 'text' field; default: the Python docs corpus")
    p.add_argument("--n-prompts", type=positive_int, default=defaults["n_prompts"],
                   help=f"prompts for the sink scores (default {defaults['n_prompts']}, as `make demo`; the paper's 170 "
                        "takes about a minute more on 2 CPU cores)")
    p.add_argument("--max-tokens", type=positive_int, default=64, help="content tokens per prompt (default 64)")
    p.add_argument("--batch-size", type=positive_int, default=16, help=BATCH_HELP)
    p.add_argument("--heads", type=positive_int, default=3, help="how many top / least sink-like heads to show up close")
    p.add_argument("--view-tokens", type=positive_int, default=32, help="tokens per prompt in the circuitsvis views")
    p.add_argument("--view-prompts", type=positive_int, default=3, help="prompts in the head-activity views")
    sizes = p.add_argument_group("section sizes (prompt counts are capped by --n-prompts)")
    for name in SECTION_SIZES:
        default = defaults[name]
        kind = non_negative_int if name == "noop_prompts" else positive_int  # 0: no no-op check
        sizes.add_argument(f"--{name.replace('_', '-')}", type=kind, default=default,
                           help=NOOP_PROMPTS_HELP if name == "noop_prompts" else f"default {default}")
    sizes.add_argument("--noop-max-heads", type=count_or_all, default=NOOP_MAX_HEADS, metavar="N|all",
                       help=f"check at most N of the no-op check's heads, the if-else heads first (default "
                            f"{NOOP_MAX_HEADS}, a first look; 'all': every one; the run says what that would take)")
    p.add_argument("--findings", type=output_file, default=None,
                   help="merge the quotable numbers into this findings file (e.g. figures/findings.json)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier report in --out (as a whole); without it an earlier report is kept")
    add_attention(p, needs_pattern="draws circuitsvis views of whole attention patterns and edits them in its ablations")
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> None:
    check_output_dir(args.out, overwrite=args.overwrite, what="report folder")  # before the slow model load
    if args.prompts is not None:
        prompts_arg(args)  # a bad prompt file fails before torch is imported (the report reads it again)
    from sinkmech.report.page import build_report

    t0 = time.perf_counter()
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
        noop_max_heads=args.noop_max_heads,
        **{name: getattr(args, name) for name in SECTION_SIZES},
    )
    if args.findings is not None:
        label = args.model if "/" not in args.model else Path(args.model).stem
        record(args.findings, report_findings(label, report.summary), replace_prefix=f"{label}.report")
        print(f"recorded findings in {args.findings}")
    noop = report.summary["sections"].get("dormant", {}).get("noop")
    note = noop and first_look_note(len(noop["heads"]), len(noop["heads_covered"]), noop["n_prompts"], noop["seconds"])
    if note:
        print(note, file=sys.stderr)
    elif not args.noop_prompts:
        print(f"note: no no-op check of the dormant heads here (--noop-prompts {NOOP_PROMPTS} adds a first look; "
              "`sinkmech heads` runs the check)", file=sys.stderr)
    rates = report.summary["sections"]["sinks"]["sink_rate"]
    for bos, r in rates.items():
        print(f"sink rate bos={bos}: " + ", ".join(f"eps {e}: {v:.1f}%" for e, v in r.items()))
    print(f"wrote {report.index} and {report.summary_json} ({len(report.figures)} figure files) "
          f"in {time.perf_counter() - t0:.0f} s")
