"""When do sinks form? The from-scratch training studies (`sinkmech.studies.training`)
at a chosen scale; the same as `sinkmech train study NAME ...`.

    python scripts/train_sinks.py packing --preset cpu          # Table 2 + emergence
    python scripts/train_sinks.py positional --preset cpu       # token or position?
    python scripts/train_sinks.py context-length --preset cpu
    python scripts/train_sinks.py mask-self --preset cpu --jobs 2
    python scripts/train_sinks.py depth --layers 1 2 4 --jobs 2
    python scripts/train_sinks.py text --layers 2 --weight-decays 0.1 0.0
    python scripts/train_sinks.py modes                         # active/dormant attention of those runs
    python scripts/train_sinks.py findings                      # findings_train.json from the JSON above
    python scripts/train_sinks.py replot                        # figures redrawn from the JSON
    python scripts/train_sinks.py packing --preset gpu --steps 3   # smoke test anywhere

Outputs (under --out, default figures/train): packing.json, packing.md,
packing_curves.png, emergence.json, emergence.png; positional.json,
positional_curves.png; context_length.json, context_length.png,
context_length_curves.png; mask_self.json, mask_self_curves.png; depth.json,
depth.png; text.json, text_curves.png; modes.json; findings_train.json;
logs/<study>/<prefix><run>.json. Checkpoints go to
--runs-dir/<study>/<prefix><run>/. `--help` after a study's name lists its flags.
"""

from __future__ import annotations

import sys

from sinkmech.cli.main import main as sinkmech_main


def main(argv: list[str] | None = None) -> int:
    """`sinkmech train study` with `argv` (default: this script's arguments)."""
    return sinkmech_main(["train", "study", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
