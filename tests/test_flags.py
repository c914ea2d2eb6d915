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
    from sinkmech import models

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
