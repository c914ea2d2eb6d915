"""`sinkmech sinks` with the sink interventions: --sink-value zero, --phantom-sink
paired|logits, --phantom-value, --phantom-mode, --sink-logits FILE.json,
--sink-layers, --sink-heads. Each bad combination is one `error:` line and exit 2
before any model loads (a --sink-logits file of the wrong shape: right after the
model loads, before any forward pass); the runs write the keys the JSON contract
names, equal to the library's."""

from __future__ import annotations

import json

import pytest
import torch

from helpers.tiny import serve_tiny
from sinkmech.options import QUIET

PROMPTS = "the cat sat on the warm mat today\na cat ran far away from the big dog\n"


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text(PROMPTS)
    return path


def sink_file(tmp_path, shape=(2, 4), values: int | None = None, fit_prompts=(), name="sinks"):
    path = tmp_path / f"{name}.json"
    L, H = shape
    data = {"model": "tiny", "sink_logits": [[0.5 + l - h / 4 for h in range(H)] for l in range(L)],
            "sink_values": None if values is None else [[[0.1] * values for _ in range(H)] for _ in range(L)],
            "fit_prompts": list(fit_prompts), "fit_token_hashes": []}
    path.write_text(json.dumps(data))
    return path


def refused(monkeypatch, capsys, argv) -> str:
    from sinkmech.cli import main
    from sinkmech.loading import models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(["sinks", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


@pytest.mark.parametrize("argv, message", [
    (["--bos", "none", "--sink-value", "zero"], "needs --bos prepend or both"),
    (["--bos", "prepend", "--phantom-sink", "paired"], "needs --bos none or both"),
    (["--phantom-sink", "logits"], "needs --sink-logits"),
    (["--phantom-value", "bos"], "give --phantom-sink paired"),
    (["--phantom-mode", "bias"], "give --phantom-sink paired"),
    (["--phantom-sink", "paired", "--phantom-mode", "bias", "--phantom-value", "zero"], "changes nothing"),
    (["--sink-layers", "1"], "choose where a sink intervention acts"),
    (["--sink-value", "zero", "--sink-layers", "1", "--sink-heads", "1.2"], "not both"),
    (["--sink-value", "zero", "--bos-position", "2"], "drop --bos-position"),
    (["--phantom-sink", "paired", "--keys", "all"], "--keys all"),
    (["--phantom-sink", "paired", "--shard", "1/2", "--json", "x.partial.json"], "one process"),
    (["--sink-value", "zero", "--sink-heads", "1"], "LAYER.HEAD"),
    (["--sink-value", "zero", "--sink-layers", "-1"], "must be >= 0"),
    (["--sink-logits", "missing.json"], "not found"),
    (["--sink-value", "zero", "--attention", "fused"], "--attention pattern"),
])
def test_bad_sink_flags_are_refused_before_the_model_loads(argv, message, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert message in refused(monkeypatch, capsys, argv)


def test_bad_sink_logit_files_are_refused_before_the_model_loads(monkeypatch, capsys, tmp_path, prompts):
    bad = tmp_path / "bad.json"
    for text, message in (("{", "not valid JSON"), ('{"x": 1}', "holds no 'sink_logits'"),
                          ('{"sink_logits": [[1, 2], [3]]}', "rows differ"),
                          ('{"sink_logits": [[1, "a"]]}', "finite number or null"),
                          ('{"sink_logits": [[1, 2]], "sink_values": [[[1], [2, 3]]]}', "[layer][head][d_head]")):
        bad.write_text(text)
        assert message in refused(monkeypatch, capsys, ["--sink-logits", str(bad)])
    with_values = sink_file(tmp_path, values=8)
    assert "drop --phantom-value" in refused(monkeypatch, capsys, ["--sink-logits", str(with_values),
                                                                   "--phantom-value", "bos"])
    assert "--phantom-sink paired" in refused(monkeypatch, capsys, ["--sink-logits", str(with_values),
                                                                    "--phantom-sink", "paired"])
    fitted = sink_file(tmp_path, fit_prompts=PROMPTS.splitlines()[1:])
    assert "fitted on" in refused(monkeypatch, capsys, ["--prompts", str(prompts), "--sink-logits", str(fitted)])


def test_a_sink_logit_file_of_another_shape_is_refused_before_any_forward_pass(monkeypatch, capsys, tmp_path,
                                                                               prompts):
    from sinkmech.cli import main
    from sinkmech.loading.backend import Model

    serve_tiny(monkeypatch)
    monkeypatch.setattr(Model, "forward", lambda *a, **k: pytest.fail("a forward pass ran"))
    for path, message in ((sink_file(tmp_path, shape=(3, 4), name="l3"), "do not fit this model (2 layers x 4 heads)"),
                          (sink_file(tmp_path, values=5, name="d5"), "d_head 8")):
        assert main(["sinks", "--prompts", str(prompts), "--sink-logits", str(path)]) == 2
        err = capsys.readouterr().err
        last = err.strip().splitlines()[-1]  # after 'loading ...'
        assert last.startswith("error: ") and message in last and "Traceback" not in err
    assert main(["sinks", "--prompts", str(prompts), "--sink-value", "zero", "--sink-layers", "5"]) == 2
    assert "out of range" in capsys.readouterr().err


def test_sink_runs_write_their_keys_equal_to_the_library(monkeypatch, tmp_path, prompts):
    """--bos prepend --sink-value zero: `conditions.prepend.loss` and `scores` are the
    value-less run's; --bos none --phantom-sink paired --phantom-value bos and
    --sink-logits: `conditions.none.loss` and `conditions.none.phantom_mass`
    [layer][head] are the phantom run's; findings never under the plain run's names."""
    from sinkmech.cli import main
    from sinkmech.interventions.phantom import PhantomSink, ValuelessBos
    from sinkmech.measures.sinks import sink_scores

    model = serve_tiny(monkeypatch, 2)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    out, findings = tmp_path / "s.json", tmp_path / "f.json"

    def run(*argv) -> dict:
        assert main(["sinks", "--prompts", str(prompts), "--json", str(out), "--findings", str(findings), *argv]) == 0
        return json.loads(out.read_text())["conditions"]

    def lib(bos, sink):
        return sink_scores(model, str(prompts), bos=bos, loss=True, options=QUIET, sink=sink)

    got = run("--bos", "prepend", "--sink-value", "zero")
    want = lib("prepend", ValuelessBos())
    assert got["prepend"]["loss"] == pytest.approx(want.loss, rel=1e-6)
    assert torch.allclose(torch.tensor(got["prepend"]["scores"]), want.mean_scores(), atol=1e-6)
    assert got["prepend"]["loss"] != pytest.approx(lib("prepend", None).loss, rel=1e-4)

    got = run("--bos", "none", "--phantom-sink", "paired", "--phantom-value", "bos", "--sink-heads", "1.0", "0.3")
    want = lib("none", PhantomSink("paired", "bos", heads=((1, 0), (0, 3))))
    assert got["none"]["loss"] == pytest.approx(want.loss, rel=1e-6)
    mass = torch.tensor(got["none"]["phantom_mass"])
    assert mass.shape == (L, H) and torch.allclose(mass, want.phantom_mass.mean(0), atol=1e-6)
    assert float(mass[1, 0]) > 0 and float(mass[0, 0]) == 0.0  # only the chosen heads take mass

    path = sink_file(tmp_path)
    got = run("--bos", "both", "--sink-logits", str(path))
    logits = torch.tensor(json.loads(path.read_text())["sink_logits"])
    want = lib("none", PhantomSink("logits", logits=logits))
    assert got["none"]["loss"] == pytest.approx(want.loss, rel=1e-6)
    assert torch.allclose(torch.tensor(got["none"]["phantom_mass"]), want.phantom_mass.mean(0), atol=1e-6)
    assert "phantom_mass" not in got["prepend"]

    names = json.loads(findings.read_text())
    assert any(".sinks.bos_default_sink_value_zero.prepend.loss" in k for k in names)
    assert any(".sinks.bos_default_phantom_paired_bos_heads_1.0_0.3.none.mean_phantom_mass" in k for k in names)
    assert any(".sinks.bos_default_phantom_logits_zero.none.loss" in k for k in names)
    assert not any(".sinks.bos_default." in k for k in names)
