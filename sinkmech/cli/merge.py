"""`sinkmech merge PARTS... --json OUT [--png OUT]`: join the partial results of a
sharded run (`--shard I/N`, see `sinkmech.sharding.format`) and write exactly what the
unsharded command writes. Refused, one line each: a missing or duplicate shard,
parts whose settings differ (the setting is named), a corrupt or truncated
part, a part of a newer format version, a kind of part this sinkmech does not
know (`sinkmech.sharding.format.KINDS`) or has no command for."""

from __future__ import annotations

import sys
from pathlib import Path

from sinkmech.cli.common import PNG_HELP, image_file, output_file, positive_int
from sinkmech.sharding.format import PartialError, check_kind, read_parts


def add_merge_parser(sub) -> None:
    p = sub.add_parser("merge", help="merge the partial results of a sharded run (--shard I/N) into the full result")
    p.add_argument("parts", nargs="+", type=Path, metavar="PART", help="the .partial.json files, in any order")
    p.add_argument("--json", type=output_file, default=None,
                   help="write the merged result as JSON here ('-': stdout, everything else then goes to stderr)")
    p.add_argument("--png", type=image_file, default=None, help=PNG_HELP)
    p.add_argument("--top", type=positive_int, default=10, help="rows of the printed table")
    p.add_argument("--batch-size", type=positive_int, default=16,
                   help="prompts per forward pass of what a merge runs on the model (heads parts: the no-op check; "
                        "default 16; give the run's own --batch-size to make the passes the unsharded run makes)")
    p.set_defaults(func=cmd_merge)


def mergers() -> dict:
    """Part kind (one of `sinkmech.sharding.format.KINDS`) -> the function that prints and
    writes its merged result: one for each kind a command writes."""
    from sinkmech.cli.ablate import merged_ablate
    from sinkmech.cli.heads import merged_heads
    from sinkmech.cli.length import merged_length, merged_length_scores
    from sinkmech.cli.massive import merged_massive
    from sinkmech.cli.patch import merged_patch
    from sinkmech.cli.perturb import merged_perturb
    from sinkmech.cli.sinks import merged_sinks

    return {"sinks": merged_sinks, "heads": merged_heads, "ablate": merged_ablate, "massive": merged_massive,
            "patch": merged_patch, "perturb": merged_perturb, "length": merged_length,
            "length_scores": merged_length_scores}


def cmd_merge(args) -> None:
    part = read_parts(args.parts)
    finish = mergers().get(check_kind(part.kind))
    if finish is None:  # a kind only the library writes (e.g. "value_weighted")
        raise PartialError(f"this sinkmech cannot merge '{part.kind}' parts")
    print(f"merged {len(part.shards)} shards, {part.n_prompts_total} prompts ({part.kind})", file=sys.stderr)
    finish(part, args)
