"""`sinkmech sinks` end to end on SmolLM2, and its error paths."""

from __future__ import annotations

import json

import matplotlib.image as mpimg
import pytest

from sinkmech.cli.main import main


@pytest.mark.slow
def test_sinks_cli_end_to_end(tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The quick brown fox jumps over the lazy dog.\nimport os\nprint(os.getcwd())\n")
    out_json, out_png = tmp_path / "s.json", tmp_path / "s.png"
    code = main(["sinks", "--model", "smollm2", "--prompts", str(prompts), "--max-tokens", "12",
                 "--bos", "both", "--eps", "0.3", "0.8", "--json", str(out_json), "--png", str(out_png)])
    assert code == 0
    data = json.loads(out_json.read_text())
    assert (data["model"], data["n_layers"], data["n_heads"], data["n_prompts"]) == ("smollm2", 30, 9, 3)
    lengths = data["conditions"]["none"]["lengths"]
    assert data["max_tokens"] == max(lengths) <= 12 and data["max_tokens_requested"] == 12  # what was scored, and asked
    assert data["conditions"]["prepend"]["lengths"] == [n + 1 for n in lengths]
    for cond in ("prepend", "none"):
        c = data["conditions"][cond]
        assert len(c["scores"]) == 30 and all(len(row) == 9 for row in c["scores"])
        assert set(c["sink_rate"]) == {"0.3", "0.8"}
        assert 0.0 <= c["sink_rate"]["0.8"] <= c["sink_rate"]["0.3"] <= 100.0
    image = mpimg.imread(out_png)
    assert image.shape[0] > 400 and image.shape[1] > 400 and image.std() > 0.05
    table = capsys.readouterr().out
    assert "sink rate" in table and "top sink heads" in table


def test_sinks_cli_errors(tmp_path, capsys):
    assert main(["sinks", "--prompts", str(tmp_path / "nope.txt")]) == 2
    assert "prompt file not found" in capsys.readouterr().err
    assert main(["sinks", "--eps", "1.5"]) == 2  # checked before any prompt or model is loaded
    assert "[0, 1)" in capsys.readouterr().err
