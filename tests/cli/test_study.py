"""`sinkmech study NAME`: every study registered in `STUDIES` reads its Config
back from its dict, from a result that recorded it, from TOML and from its own
flags; answers `--help` and refuses a bad setting before torch loads; and the
compare study run again from its own result gives the same numbers."""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Literal, get_args, get_origin

import pytest

from helpers.probe import probe
from sinkmech.cli.main import build_parser
from sinkmech.cli.study import GENERIC, _strip_none, _text, study_config
from sinkmech.studies.config import ConfigError
from sinkmech.studies.configs import STUDIES, CompareConfig

NAMES = sorted(STUDIES)


def changed(value, hint):
    """Values of type `hint` other than `value` (each may still break a study's own checks)."""
    base, optional = _strip_none(hint)
    out = [None] if optional and value is not None else []
    if value is None:
        value = {bool: False, int: 2, float: 0.5, str: "x"}.get(base)
    if base is bool:
        out.append(not value)
    elif base is int:
        out += [value + 1, max(value - 1, 0)]
    elif base is float:
        out += [value / 2, value + 0.5]
    elif base is str:
        out.append(value + "_x" if value else "x")
    elif get_origin(base) is Literal:
        out += [c for c in get_args(base) if c != value]
    elif get_origin(base) is tuple:
        item, value = get_args(base)[0], value or ()
        if value:
            out += [tuple(reversed(value)), value[:1]]
        for first in changed(value[0] if value else None, item):
            if first is not None:
                out.append((first, *value[1:]))
    return [v for v in out if v != value]


def variants(cls):
    """Configs of `cls` that differ from the default in one field each (every field
    whose type allows a change the study's checks accept)."""
    hints = typing.get_type_hints(cls)
    default = cls()
    for f in dataclasses.fields(cls):
        for v in changed(getattr(default, f.name), hints[f.name]):
            try:
                yield f.name, dataclasses.replace(default, **{f.name: v})
            except ConfigError:
                continue


def as_flags(name: str, value) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return [flag if value else "--no-" + name.replace("_", "-")]
    if isinstance(value, tuple):
        return [flag, *map(_text, value)]
    return [flag, _text(value)]


def test_studies_are_registered_and_their_settings_do_not_shadow_the_generic_flags():
    assert {"compare", "train-packing", "train-text"} <= set(STUDIES)
    for name, cls in STUDIES.items():
        assert cls.study == name and cls.runner.count(":") == 1
        assert not {f.name for f in dataclasses.fields(cls)} & set(GENERIC), name


@pytest.mark.parametrize("name", NAMES)
def test_a_config_reads_back_from_its_dict_a_result_and_toml(name, tmp_path):
    cls = STUDIES[name]
    configs = [cls()] + [c for _, c in variants(cls)]
    assert len(configs) > 1, f"{name}: no field could be changed"
    for c in configs:
        assert cls.from_dict(c.to_dict()) == c
        assert cls.from_dict(json.loads(json.dumps(c.to_dict()))) == c  # through JSON: lists back to tuples
        result = tmp_path / "result.json"
        result.write_text(json.dumps({"models": [], "seconds": 1.0, "config": c.to_dict()}))
        assert cls.read(result) == c
        plain = {k: v for k, v in c.to_dict().items() if v is not None}  # TOML has no null: a None is the default
        toml = tmp_path / "c.toml"
        toml.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in plain.items()))
        assert cls.read(toml) == cls.from_dict(plain)


@pytest.mark.parametrize("name", NAMES)
def test_every_setting_has_a_flag_that_gives_it(name):
    cls, parser = STUDIES[name], build_parser()
    n = 0
    for field, c in variants(cls):
        value = getattr(c, field)
        if value == ():
            continue  # a list flag takes one value or more: the empty list is the file's or the default's
        assert study_config(parser.parse_args(["study", name, *as_flags(field, value)])) == c, (field, value)
        n += 1
    assert n >= 1


def test_flags_override_a_config_file_and_a_bad_file_or_setting_is_refused(tmp_path):
    parser = build_parser()
    saved = tmp_path / "compare.json"
    saved.write_text(json.dumps({"config": CompareConfig(n_prompts=24, max_tokens=32).to_dict()}))
    got = study_config(parser.parse_args(["study", "compare", "--config", str(saved), "--max-tokens", "16"]))
    assert got == CompareConfig(n_prompts=24, max_tokens=16)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"config": {"study": "train-packing"}}))
    with pytest.raises(ConfigError, match="for the study 'train-packing', not 'compare'"):
        study_config(parser.parse_args(["study", "compare", "--config", str(other)]))
    bad = tmp_path / "bad.toml"
    bad.write_text("n_prompts = 'many'\n")
    with pytest.raises(ConfigError, match="n_prompts: expected an integer"):
        study_config(parser.parse_args(["study", "compare", "--config", str(bad)]))
    (tmp_path / "unknown.toml").write_text("n_promts = 3\n")
    with pytest.raises(ConfigError, match="unknown setting.*n_promts"):
        study_config(parser.parse_args(["study", "compare", "--config", str(tmp_path / "unknown.toml")]))


def test_help_and_bad_settings_answer_before_torch_loads(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("n_prompts = 0\n")
    cases = [(["study", "--help"], 0, "compare")]
    cases += [(["study", name, "--help"], 0, "--config") for name in NAMES]
    cases += [
        (["study", "compare", "--n-prompts", "0"], 2, "error: --n-prompts must be >= 1, got 0"),
        (["study", "compare", "--eps", "0.3", "x"], 2, "error: --eps takes numbers, got 'x'"),
        (["study", "compare", "--config", str(bad)], 2, "error: n_prompts must be >= 1, got 0"),
        (["study", "compare", "--config", str(tmp_path / "missing.toml")], 2, "error: config file"),
        (["study", "train-packing", "--sets", "lr=fast"], 2, "error: --sets lr takes a number, got 'fast'"),
        (["study", "train-depth", "--layers", "0"], 2, "error: --layers must be depths >= 1"),
        (["study", "train-text", "--fixed-bos", "maybe"], 2, "error: --fixed-bos takes true or false"),
        (["study", "compare", "--models", str(tmp_path / "none.gguf")], 2, "error: models: "),
    ]
    for (argv, code, text), got in zip(cases, probe(*(argv for argv, _, _ in cases))):
        assert got["code"] == code, got
        assert text in got["text"], got
        assert got["heavy"] == [], f"{' '.join(argv)} imported {got['heavy'][:5]}"
        if code == 2:
            assert got["text"].strip().count("\n") == 0 and "Traceback" not in got["text"], got


@pytest.mark.slow
def test_the_compare_study_runs_again_from_its_own_result(smollm2, tmp_path, monkeypatch):
    from sinkmech.cli.main import main
    from sinkmech.loading import models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: smollm2)
    first, again = tmp_path / "first.json", tmp_path / "again.json"
    argv = ["study", "compare", "--models", "smollm2", "--n-prompts", "4", "--max-tokens", "12", "--spread-prompts", "2",
            "--spread-tokens", "10", "--dormant-prompts", "0", "--quiet", "--json"]
    assert main([*argv, str(first)]) == 0
    assert main(["study", "compare", "--config", str(first), "--quiet", "--json", str(again)]) == 0
    a, b = (json.loads(p.read_text()) for p in (first, again))
    assert a["config"] == b["config"] == CompareConfig(models=("smollm2",), n_prompts=4, max_tokens=12,
                                                        spread_prompts=2, spread_tokens=10, dormant_prompts=0).to_dict()
    for d in (a, b):
        d.pop("seconds")
        for m in d["models"]:
            m.pop("timing_s")
    assert a == b
    assert a["models"][0]["n_prompts"] == 4 and a["table"][0]["model"] == "smollm2"
