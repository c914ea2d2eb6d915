"""The training studies as library code and as `sinkmech train study NAME`: the
committed outputs are reproduced from the committed logs, the single-run
`sinkmech train` keeps its flags, old study flag names still work with a warning."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sinkmech.cli.main import build_parser, main
from sinkmech.studies.training_findings import findings, findings_text
from sinkmech.train.parallel import read_json
from sinkmech.train.presets import PRESETS, StudySettings, parse_sets, recipe_name
from sinkmech.train.readouts import modes
from sinkmech.train.summary import SummaryRow, summary_rows
from helpers.paths import REPO

TRAIN = REPO / "figures" / "train"


def _committed_copy(tmp_path: Path, *names: str) -> Path:
    """The named JSON files of figures/train copied under tmp_path, beside a link to its logs (read only)."""
    out = tmp_path / "train"
    out.mkdir()
    for name in names:
        shutil.copy(TRAIN / name, out / name)
    (out / "logs").symlink_to(TRAIN / "logs", target_is_directory=True)
    return out


def test_summary_rows_rebuild_the_committed_rows_key_for_key():
    """`summary_rows` on a committed log gives the committed rows, keys in the
    same order: the typed row writes what the untyped dict wrote."""
    for study in ("mask_self", "context_length", "depth"):
        rows = read_json(TRAIN / f"{study}.json")
        run = rows[0]["run"]
        log = read_json(TRAIN / "logs" / study / f"{run}.json")
        rebuilt = [r.to_dict() for r in summary_rows(log, preset=rows[0]["preset"], run=run)]
        assert [list(r) for r in rebuilt] == [list(r) for r in rows[:2]], study
        assert rebuilt == rows[:2], study


def test_summary_row_leaves_out_unset_optional_fields():
    log = read_json(TRAIN / "logs" / "mask_self" / "rotary-maskself-seed0.json")
    (row, _) = summary_rows(log)
    d = row.to_dict()
    assert d["mask_self"] is True and "run" not in d and "preset" not in d and "run_steps" not in d
    assert isinstance(row, SummaryRow) and json.loads(row.to_json()) == json.loads(json.dumps(d))
    (at, _) = summary_rows(log, at_step=100, run="r")
    assert at.steps == 100 and at.run_steps == 3000 and list(at.to_dict())[-2:] == ["run_steps", "run"]
    with pytest.raises(ValueError, match="no evaluation at step 101"):
        summary_rows(log, at_step=101, run="r")


def test_findings_and_modes_reproduce_the_committed_files(tmp_path):
    """findings_train.json and modes.json, recomputed from the committed study
    JSON and logs, equal the committed files byte for byte (the flattening over
    every study and seed is checked as a whole)."""
    names = [p.name for p in TRAIN.glob("*.json") if p.name not in ("findings_train.json", "modes.json")]
    out = _committed_copy(tmp_path, *names)
    modes(out)
    assert (out / "modes.json").read_bytes() == (TRAIN / "modes.json").read_bytes()
    # write_findings writes exactly this text (and draws a figure, the slow part, left out here)
    assert findings_text(findings(out)).encode() == (TRAIN / "findings_train.json").read_bytes()


def test_settings_apply_the_preset_then_flags_then_overrides_then_sets(tmp_path):
    s = StudySettings(preset="cpu", steps=40, seed=3, sets=("n_layers=2", "mask_self=true"), out=tmp_path)
    cfg = s.config(n_layers=4, positional="rotary")
    assert (cfg.steps, cfg.seed, cfg.n_layers, cfg.mask_self, cfg.positional) == (40, 3, 2, True, "rotary")
    assert cfg.d_model == PRESETS["cpu"]["d_model"] and cfg.eval_every == 40 and cfg.warmup == 40
    assert s.log_path("depth", "r") == tmp_path / "logs" / "depth" / "r.json"
    for bad, message in (("n_layers", "KEY=VALUE"), ("nope=1", "KEY=VALUE"), ("packing=sideways", "one of"),
                         ("mask_self=yes", "true or false")):
        with pytest.raises(ValueError, match=message):
            parse_sets([bad])
    with pytest.raises(ValueError, match="unknown preset"):
        StudySettings(preset="tpu")
    assert recipe_name("text-L4H4-wd0.1-fixedbos-s12-d256") == "text-L4H4-wd0.1-fixedbos-d256"


def test_single_run_train_keeps_its_flags_and_study_is_a_subcommand(capsys):
    parser = build_parser()
    one = parser.parse_args(["train", "--out", "somewhere", "--layers", "3"])
    assert one.func.__name__ == "cmd_train" and one.layers == 3 and str(one.out) == "somewhere"
    study = parser.parse_args(["train", "study", "depth", "--layers", "1", "2", "--jobs", "2"])
    assert study.func.__name__ == "cmd_train_study" and study.layers == [1, 2] and study.jobs == 2
    assert study.out == Path("figures/train") and study.deprecated_flags == ()
    assert main(["train", "--steps", "2"]) == 2
    assert "needs --out" in capsys.readouterr().err


def test_old_study_flag_names_still_work_and_warn(tmp_path, capsys):
    parser = build_parser()
    old = parser.parse_args(["train", "study", "depth", "--depths", "1", "2"])
    new = parser.parse_args(["train", "study", "depth", "--layers", "1", "2"])
    assert old.layers == new.layers == [1, 2] and old.deprecated_flags == (("--depths", "--layers"),)
    assert parser.parse_args(["train", "study", "context-length", "--lengths", "32", "64"]).context_lengths == [32, 64]
    # The warning comes first; the bad --set is refused before anything trains.
    with pytest.warns(FutureWarning, match="--depths is deprecated: use --layers"):
        code = main(["train", "study", "depth", "--depths", "1", "--set", "bogus=1", "--out", str(tmp_path)])
    assert code == 2 and "--set takes KEY=VALUE" in capsys.readouterr().err
    assert main(["train", "study", "depth", "--layers", "0", "--out", str(tmp_path)]) == 2
    assert "--layers must be >= 1" in capsys.readouterr().err
