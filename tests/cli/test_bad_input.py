"""Bad input to the command line and the report fails fast and clearly: flags refused
before a model loads, outputs never half-written, one error line (prompt files: tests/unit/test_prompts.py)."""

from __future__ import annotations

import json

import pytest
from jaxtyping import TypeCheckError

from helpers.paths import REPO, TESTS
from helpers.tiny import TINY_RUN, toy_tokenizer
from helpers.backends import needs


def _section(key: str, fail: BaseException | None = None):
    from sinkmech.report import Section

    def make(ctx):
        figs = ctx.figure(key, lambda p: __import__("sinkmech.plots.core", fromlist=["x"]).layer_lines(
            {"a": [1.0, 2.0]}, p, title=key, ylabel="y"))
        if fail is not None:
            raise fail
        return Section(key, key, f"<p>{key}</p>", tuple(figs), {"run": key})

    make.__name__ = f"{key}_section"
    return make


@pytest.mark.slow
def test_interrupted_report_leaves_the_earlier_report_whole(tiny_model, tmp_path):
    from sinkmech.report import build_report

    out = tmp_path / "rep"
    kw = dict(prompts=[[5, 6, 7, 8]], n_prompts=1, options=TINY_RUN)
    build_report(tiny_model, out, sections=[_section("first")], **kw)
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(FileExistsError, match="--overwrite"):  # kept unless asked
        build_report(tiny_model, out, sections=[_section("second")], **kw)
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C half way through a new report
        build_report(tiny_model, out, sections=[_section("second"), _section("third", KeyboardInterrupt())],
                     overwrite=True, **kw)
    after = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before  # not one file of the interrupted run
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]  # no temporary folder left behind
    rep = build_report(tiny_model, out, sections=[_section("second")], overwrite=True, **kw)
    assert json.loads((out / "summary.json").read_text())["sections"] == {"second": {"run": "second"}}
    assert not (out / "figures" / "first.png").exists() and rep.index == out / "index.html"


def test_report_never_replaces_a_folder_it_did_not_write(tiny_model, tmp_path):
    from sinkmech.report import build_report

    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="did not write"):
        build_report(tiny_model, tmp_path, sections=[_section("x")], overwrite=True, prompts=[[5, 6, 7]],
                     n_prompts=1, options=TINY_RUN)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_json_output_never_holds_nan(tmp_path):
    from sinkmech.files import json_text

    text = json_text({"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": -float("inf")}})
    assert json.loads(text) == {"a": None, "b": [1.0, None], "c": {"d": None}}
    assert "NaN" not in text and "Infinity" not in text


def test_ctrl_c_exits_130_with_one_line(monkeypatch, capsys):
    from sinkmech.loading import models
    from sinkmech.cli import main

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "load_model", interrupt)
    assert main(["sinks", "--prompts", "nothing-here.txt"]) == 2  # a missing file fails first
    f = "/tmp/sinkmech-ctrl-c-prompts.txt"
    open(f, "w").write("a b c d\n")
    assert main(["sinks", "--prompts", f]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("interrupted")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sinks", "--max-tokens", "0"], "--max-tokens must be >= 1"),
        (["sinks", "--batch-size", "0"], "--batch-size must be >= 1"),
        (["sinks", "--n-prompts", "0"], "--n-prompts must be >= 1"),
        (["ablate", "--mode", "zero", "--n-prompts", "-1"], "--n-prompts must be >= 1"),
        (["heads", "--head", "abc"], "LAYER.HEAD"),
        (["patch", "--layers", "-1"], "--layers must be >= 0"),
        (["heads", "--high", "0.2", "--low", "0.5"], "--low < --high"),
        (["perturb", "--noise", "-1", "--position", "2"], "--noise must be >= 0"),
        (["perturb", "--noise", "nan", "--position", "2"], "finite number"),
        (["perturb", "--noise", "inf", "--position", "2"], "finite number"),
        (["sinks", "--png", "out.txt"], "--png must end in"),
        (["sinks", "--json", "/etc/hostname/x.json"], "is a file, not a folder"),
        (["sinks", "--eps", "1.5"], "--eps values must lie in"),
    ],
)
def test_bad_flags_fail_before_the_model_loads(argv, message, monkeypatch, capsys):
    from sinkmech.loading import models
    from sinkmech.cli import main

    def never(*a, **k):
        raise AssertionError("the model was loaded before the bad flag was caught")

    monkeypatch.setattr(models, "load_model", never)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_scan_on_too_few_queries_labels_no_head(tiny_model):
    from sinkmech.dormant.scan import scan_heads

    rows = [[5, 6, 7, 8]] * 3  # 3 prompts x 5 tokens: far too few queries for any label
    scan = scan_heads(tiny_model, rows, bos="prepend", options=TINY_RUN)
    assert scan.mode_counts()["insufficient"] == scan.n_layers * scan.n_heads
    assert scan.if_else_heads() == []
    assert f"only {scan.n_queries} queries" in scan.evidence[0][0][0]


def test_top_heads_rejects_a_bad_k(tiny_model):
    from sinkmech.measures.sinks import sink_scores

    scores = sink_scores(tiny_model, [[5, 6, 7]], bos="prepend", options=TINY_RUN)
    for k in (-1, 0):
        with pytest.raises(ValueError, match="positive integer"):
            scores.top_heads(k)
    with pytest.raises((ValueError, TypeCheckError)):  # under pytest, beartype refuses a float first
        scores.top_heads(1.5)
    assert len(scores.top_heads(100)) == tiny_model.cfg.n_layers * tiny_model.cfg.n_heads


class CharTokenizer:
    """Just enough tokenizer for the CLI on the tiny model: one id per character."""

    bos_token_id, pad_token_id, padding_side = 1, 0, "right"

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [2 + (ord(c) % 40) for c in text][:200]}


@pytest.fixture
def cli_tiny(tiny_model, monkeypatch):
    """`sinkmech ...` runs on the tiny model, whatever --model says."""
    from sinkmech.loading import models

    toy_tokenizer(monkeypatch, tiny_model, CharTokenizer())
    monkeypatch.setattr(models, "load_model", lambda *a, **k: tiny_model)
    yield tiny_model


def test_an_output_that_fails_at_the_end_does_not_lose_the_others(cli_tiny, tmp_path, monkeypatch, capsys):
    """The figure fails to save after the run: the JSON is still written, and the error names the figure."""
    from sinkmech.cli import main
    from sinkmech.plots import sinks as figures_sinks  # the command imports its figure when it draws it

    def broken(*a, **k):
        raise OSError("cannot write figure to x.png: disk full")

    monkeypatch.setattr(figures_sinks, "sink_heatmap", broken)
    prompts = tmp_path / "p.txt"
    prompts.write_text("some text here\nmore text there\n")
    out = tmp_path / "s.json"
    assert main(["sinks", "--prompts", str(prompts), "--max-tokens", "8", "--json", str(out),
                 "--png", str(tmp_path / "x.png")]) == 1
    assert json.loads(out.read_text())["n_prompts"] == 2
    err = capsys.readouterr().err
    assert "--png" in err and "disk full" in err and "every other output was written" in err


COMMANDS = [  # each command imports its figure function from its module when it draws it
    (["patch"], "sinkmech.plots.core.save"),
    (["ablate", "--mode", "mask_first"], "sinkmech.plots.core.save"),
    (["perturb", "--noise", "0.1", "--position", "1"], "sinkmech.plots.core.save"),
    (["massive"], "sinkmech.plots.mechanisms.massive_figure"),
]


# The first command in the fast suite, the others in `make test` (slow).
FIRST_FAST = [c if i == 0 else pytest.param(*c, marks=pytest.mark.slow) for i, c in enumerate(COMMANDS)]


@pytest.mark.parametrize("command, figure", FIRST_FAST)
def test_every_command_keeps_its_json_when_the_figure_fails(cli_tiny, tmp_path, monkeypatch, capsys, command, figure):
    from sinkmech.cli import main

    def broken(*a, **k):
        raise OSError("cannot write figure: disk full")

    monkeypatch.setattr(figure, broken)
    prompts = tmp_path / "p.txt"
    prompts.write_text("some text here\nmore text there\n")
    out = tmp_path / "r.json"
    assert main([*command, "--prompts", str(prompts), "--max-tokens", "8", "--json", str(out),
                 "--png", str(tmp_path / "x.png")]) == 1
    assert json.loads(out.read_text())["model"]
    err = capsys.readouterr().err
    assert "--png" in err and "disk full" in err and "Traceback" not in err


@pytest.mark.parametrize("command", [c[0] if i == 0 else pytest.param(c[0], marks=pytest.mark.slow)
                                     for i, c in enumerate(COMMANDS)])
def test_every_command_keeps_its_figure_when_the_json_fails(cli_tiny, tmp_path, monkeypatch, capsys, command):
    from sinkmech.cli import common, main

    def broken(path, text):
        raise OSError(f"cannot write {path}: disk full")

    monkeypatch.setattr(common, "write_text", broken)
    prompts = tmp_path / "p.txt"
    prompts.write_text("some text here\nmore text there\n")
    png = tmp_path / "x.png"
    assert main([*command, "--prompts", str(prompts), "--max-tokens", "8", "--json", str(tmp_path / "r.json"),
                 "--png", str(png)]) == 1
    assert png.stat().st_size > 0
    err = capsys.readouterr().err
    assert "--json" in err and "disk full" in err and "Traceback" not in err


def test_max_tokens_beyond_the_prompts_records_what_was_used(cli_tiny, tmp_path, capsys):
    from sinkmech.cli import main

    prompts = tmp_path / "p.txt"
    prompts.write_text("some text here\nmore text there!\n")  # 14 and 16 content tokens
    out = tmp_path / "s.json"
    # (past the named model's trained context --max-tokens is refused before it loads: test_cli_startup.py)
    assert main(["sinks", "--prompts", str(prompts), "--max-tokens", "5000", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["max_tokens"] == 16 and data["max_tokens_requested"] == 5000 and data["context_limit"] is None
    assert data["conditions"]["none"]["lengths"] == [14, 16]
    assert "2 of 2 prompts have fewer than 5000 content tokens" in capsys.readouterr().err


def test_a_prompt_longer_than_the_context_is_cut_the_same_in_both_conditions(cli_tiny, tmp_path, capsys):
    """The tiny model's context is 64 positions: a 100-token prompt keeps 63 content
    tokens with and without <bos>, and the JSON says the context cut it."""
    from sinkmech.cli import main

    prompts = tmp_path / "p.txt"
    prompts.write_text("x" * 100 + "\n" + "y" * 30 + "\n")
    out = tmp_path / "s.json"
    assert main(["sinks", "--prompts", str(prompts), "--max-tokens", "1000", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["max_tokens"] == 63 and data["max_tokens_requested"] == 1000 and data["context_limit"] == 64
    assert data["conditions"]["prepend"]["lengths"] == [64, 31] and data["conditions"]["none"]["lengths"] == [63, 30]
    assert "context of 64" in capsys.readouterr().err


def test_json_to_stdout_leaves_stdout_to_the_json_alone(cli_tiny, tmp_path, capsys):
    from sinkmech.cli import main

    prompts = tmp_path / "p.txt"
    prompts.write_text("some text here\nmore text there\n")
    assert main(["sinks", "--prompts", str(prompts), "--max-tokens", "8", "--json", "-"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["n_prompts"] == 2  # the whole of stdout is one JSON document
    assert "sink rate" in captured.err  # the table went to stderr


def test_every_flag_of_every_command_says_what_it_does():
    import argparse

    from sinkmech.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    silent, png = [], []
    for name, parser in sub.choices.items():
        for action in parser._actions:
            if action.option_strings and not action.help:
                silent.append(f"{name} {action.option_strings[0]}")
            if "--png" in action.option_strings and ".pdf" not in action.help:
                png.append(name)
    assert silent == [] and png == []


# Bad input met when the commands were tried as a user would.


def _never_load(monkeypatch):
    from sinkmech.loading import models

    def never(*a, **k):
        raise AssertionError("a model was loaded before the bad input was caught")

    monkeypatch.setattr(models, "load_model", never)


@pytest.mark.parametrize("bad", ["nosuchmodel", "missing/file.gguf"])
def test_compare_checks_every_model_name_before_loading_any(bad, tmp_path, monkeypatch, capsys):
    from sinkmech.cli import main

    _never_load(monkeypatch)
    assert main(["compare", "--models", "smollm2", bad, "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and bad in err and "Traceback" not in err


def test_compare_with_good_names_goes_on_to_load(tmp_path, monkeypatch, capsys):
    """The name check passes what can load (so the check above is not refusing everything)."""
    from sinkmech.loading import models
    from sinkmech.cli import main

    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")  # a Hugging Face model folder
    loaded = []

    def stop(name, **k):
        loaded.append(name)
        raise RuntimeError("stop after the check")

    monkeypatch.setattr(models, "load_model", stop)
    assert main(["compare", "--models", "smollm2", "gemma3-270m", "gpt2", str(folder), "--out", str(tmp_path / "c")]) == 1
    assert loaded == ["smollm2"] and "stop after the check" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["under_a_file", "in_proc"])
def test_an_unwritable_cache_names_the_cache_and_the_fix(where, tmp_path, monkeypatch, capsys):
    from helpers.tiny import make_tiny
    from sinkmech.cli import main
    from sinkmech.loading.cache import CacheNotWritableError, ModelCache, entry_key

    (tmp_path / "file").write_text("x")
    root = tmp_path / "file" / "cache" if where == "under_a_file" else "/proc/sinkmech-cache"
    monkeypatch.setenv("SINKMECH_CACHE", str(root))
    with pytest.raises(CacheNotWritableError, match=r"model cache .*\$SINKMECH_CACHE.*set SINKMECH_CACHE"):
        ModelCache().store(entry_key("ab" * 32), make_tiny())
    with pytest.raises(CacheNotWritableError, match="cannot be written"):
        ModelCache().file_sha256(tmp_path / "file")
    # The CLI: one line, exit 1, before any conversion (the SmolLM2 GGUF is hashed into the cache first).
    assert main(["sinks", "--model", "smollm2", "--n-prompts", "2"]) == 1
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if not line.startswith("loading ")]  # "loading smollm2 ..." first
    assert len(said) == 1 and str(root) in said[0] and "SINKMECH_CACHE" in err and "Traceback" not in err


def test_a_missing_cache_folder_is_created(tmp_path):
    from sinkmech.loading.cache import ModelCache

    cache = ModelCache(tmp_path / "not" / "yet")
    cache.ensure_writable()
    assert cache.root.is_dir() and list(cache.root.iterdir()) == []  # the write probe is gone


def test_repeated_lengths_are_refused_before_the_model_loads(monkeypatch, capsys):
    from sinkmech.cli import main

    _never_load(monkeypatch)
    assert main(["length", "--lengths", "32", "8", "8"]) == 2
    err = capsys.readouterr().err
    assert err == "error: --lengths lists 8 more than once: 32 8 8\n"


def test_short_prompt_warning_prints_once_for_both_conditions(cli_tiny, tmp_path, capsys):
    from sinkmech.cli import main

    prompts = tmp_path / "p.txt"
    prompts.write_text("some text here\nmore text there\n")
    assert main(["sinks", "--prompts", str(prompts), "--max-tokens", "60", "--bos", "both"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1 and "2 of 2 prompts have fewer than 60 content tokens" in warned[0]


@needs("from_config", why="the cache entry it corrupts holds a HookedTransformer's weights")
@pytest.mark.slow
def test_the_corrupt_cache_warning_is_one_line_without_python_source(tmp_path):
    """Run in a fresh interpreter: pytest captures warnings, so only a real
    process shows what a user sees on stderr."""
    import subprocess
    import sys

    script = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from helpers.tiny import make_tiny
from sinkmech.loading import models
from sinkmech.cli import main
from sinkmech.loading.cache import ModelCache, entry_key

cache, key = ModelCache({str(tmp_path)!r}), entry_key("ab" * 32)
weights = cache.store(key, make_tiny()) / "weights.safetensors"
data = bytearray(weights.read_bytes()); data[-5] ^= 0xFF; weights.write_bytes(bytes(data))

def load(*a, **k):
    cache.get_or_build(key, lambda: (make_tiny(), None))
    raise RuntimeError("stop after the load")

models.load_model = load
sys.exit(main(["sinks", "--n-prompts", "2"]))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=REPO)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 1, proc.stderr
    assert lines[-1] == "error: stop after the load"
    # The folder's own name holds "corrupt" (pytest names it after this test), so
    # the note about converting into it matches too: count the warnings themselves.
    warned = [line for line in lines if "discarding corrupt" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: discarding corrupt sinkmech cache entry")
    assert "UserWarning" not in proc.stderr and "warnings.warn" not in proc.stderr and ".py:" not in proc.stderr
