"""Each flag is checked once, by the type it is declared with: a rejected value
is one `error: --flag ...` line (exit 2) while the arguments are read, before
any command runs; argparse's own errors (a bad choice) keep argparse's form."""

from __future__ import annotations

import pytest

from sinkmech.cli import main
from sinkmech.cli.common import at_least, eps_value, fraction, positive_float, positive_int


@pytest.mark.parametrize("argv, message", [
    (["sinks", "--max-tokens", "1.5"], "error: --max-tokens takes whole numbers, got '1.5'\n"),
    (["sinks", "--max-tokens", "0"], "error: --max-tokens must be >= 1, got 0\n"),
    (["heads", "--high", "1.5"], "error: --high must lie in [0, 1], got 1.5\n"),
    (["massive", "--threshold", "inf"], "error: --threshold must be a finite number, got inf\n"),
    (["perturb", "--sensitivity", "--sensitivity-tokens", "1"], "error: --sensitivity-tokens must be >= 2, got 1\n"),
    (["train", "--out", "unused", "--lr", "0"], "error: --lr must be > 0, got 0.0\n"),
    (["report", "--out", "unused", "--scan-prompts", "0"], "error: --scan-prompts must be >= 1, got 0\n"),
])
def test_a_rejected_value_is_one_error_line(argv, message, monkeypatch, capsys):
    from sinkmech.loading import models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(argv) == 2
    assert capsys.readouterr().err == message


def test_types_return_the_value_they_accept():
    assert positive_int("3") == 3 and positive_float("0.5") == 0.5 and fraction("1") == 1.0
    assert at_least(2)("2") == 2
    assert eps_value(" 0.30 ") == "0.30"  # kept as written: it is the JSON key


def test_train_defaults_are_the_config_defaults():
    from sinkmech.cli.main import build_parser
    from sinkmech.train.config import TrainConfig

    args = build_parser().parse_args(["train", "--out", "unused"])
    cfg = TrainConfig()
    assert (args.context_length, args.tokens_per_step, args.layers, args.d_model, args.heads, args.steps, args.lr,
            args.warmup, args.eval_every) == (cfg.context_length, cfg.tokens_per_step, cfg.n_layers, cfg.d_model,
                                              cfg.n_heads, cfg.steps, cfg.lr, cfg.warmup, cfg.eval_every)


@pytest.mark.parametrize("argv, start", [
    (["sinks", "--device", "nosuchdevice"], "error: --device names no usable device: "),
    (["sinks", "--shard", "3/2", "--json", "x.partial.json"], "error: --shard is written I/N with 1 <= I <= N"),
    (["sinks", "--ray", "--workers", "0"], "error: --workers must be >= 1, got 0"),
    (["heads", "--ray", "--shards", "-1"], "error: --shards must be >= 1, got -1"),
    (["sinks", "--model", "missing/file.gguf"], "error: --model is not loadable here: model file missing/file.gguf"),
    (["compare", "--out", "unused", "--models", "smollm2", "smollm2"], "error: --models lists smollm2 more than once"),
    (["length", "--lengths", "64", "1"], "error: --lengths must be >= 2, got 1"),
    (["massive", "--sun-min-ratio", "-1"], "error: --sun-min-ratio must be >= 0, got -1.0"),
    (["compare", "--out", "unused", "--noop-max-heads", "some"], "error: --noop-max-heads takes a whole number >= 1 or 'all'"),
    (["report", "--out", "unused", "--noop-max-heads", "0"], "error: --noop-max-heads must be >= 1, got 0"),
    (["study", "compare", "--noop-max-heads", "0"], "error: --noop-max-heads must be >= 1 or none (every head), got 0"),
])
def test_flags_added_since_are_checked_by_their_type(argv, start, monkeypatch, capsys):
    """The flags main gained after the first flag-type pass (--device, the shard and Ray
    flags, --model/--models, --lengths) are checked the same way: one line, exit 2,
    before any model loads."""
    from sinkmech.loading import models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(start) and err.count("\n") == 1, err


def test_compare_checks_its_default_models_by_the_same_type(monkeypatch, capsys, tmp_path):
    """argparse does not run a type over a list default: compare checks DEFAULT_MODELS
    with --models' type itself, before any model loads."""
    from sinkmech.loading import models
    from sinkmech.cli import compare as cli_compare

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    monkeypatch.setattr(cli_compare, "DEFAULT_MODELS", ["smollm2", "missing/other.gguf"])
    assert main(["compare", "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --models (default) is not loadable here: model file missing/other.gguf") and err.count("\n") == 1
