"""Static figures: files written, readable size, clear errors on bad input."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import matplotlib.image
import numpy as np
import pytest

from sinkmech.plots import core, heads, patching, perturb, sinks

DPI = 200  # figures.save writes at 200 dpi
PAGE_W, COLUMN_W = 7.5, 3.9  # inches a figure may take: a page, a column (with margin)

rng = np.random.default_rng(0)
HEADS = ["L12.H3", "L20.H1", "L3.H4"]


def check_files(draw, tmp_path, name: str, max_width_in: float, max_height_in: float = 9.0) -> np.ndarray:
    """Draw as PNG and SVG; both exist and are non-empty; the PNG fits the given width."""
    png, svg = draw(tmp_path / f"{name}.png"), draw(tmp_path / f"{name}.svg")
    assert png.stat().st_size > 5000 and svg.stat().st_size > 5000
    assert ET.parse(svg).getroot().tag.endswith("svg")
    img = matplotlib.image.imread(png)
    h, w = img.shape[:2]
    assert 2.0 * DPI <= w <= max_width_in * DPI, f"{name}: {w} px wide"
    assert h >= 1.5 * DPI and h <= max_height_in * DPI, f"{name}: {h} px high"
    assert img[..., :3].std() > 0.05, f"{name} looks blank"
    return img


def test_sink_rate_lines(tmp_path):
    rates = {"prepend": 100 * rng.random(30), "none": 100 * rng.random(30)}
    check_files(lambda p: sinks.sink_rate_lines(rates, p, eps=0.3, model_name="m"), tmp_path, "rate", COLUMN_W)


def test_layer_lines_log(tmp_path):
    series = {"position 0": 10 ** rng.uniform(1, 3, 30), "other positions": rng.uniform(1, 2, 30)}
    check_files(lambda p: core.layer_lines(series, p, title="t", ylabel="norm", logy=True), tmp_path, "lines", COLUMN_W)


def test_spread_heatmaps(tmp_path):
    pos, layer = np.arange(64)[None], np.arange(30)[:, None]
    panels = {"prepend": np.where(pos >= 20, 1e-3 * (1 + layer), 0.0), "none": np.where(pos >= 20, 1e-2 * (1 + layer), 0.0)}
    check_files(lambda p: perturb.spread_heatmaps(panels, p, perturbed_pos=20), tmp_path, "spread", PAGE_W)


def test_head_norm_bars(tmp_path):
    values = {"first token": [0.2, 0.3, 0.5], "other tokens": [3.0, 2.5, 4.0]}
    check_files(lambda p: heads.head_norm_bars(HEADS, values, p), tmp_path, "value_bars", COLUMN_W)
    outputs = {"dormant": [0.1, 0.2, 0.3], "active": [1.0, 2.0, 3.0]}
    check_files(lambda p: heads.head_norm_bars(HEADS, values, p, output_norms=outputs), tmp_path, "both_bars", PAGE_W)


def test_band_heatmaps(tmp_path):
    q, k = rng.random((3, 32)), 5 * rng.random((3, 32))
    check_files(lambda p: heads.band_heatmaps(q, k, p, heads=HEADS), tmp_path, "bands", PAGE_W)


def test_patching_heatmaps(tmp_path):
    panels = {"prepend": rng.normal(size=(30, 9)), "none": rng.normal(size=(30, 9))}
    check_files(lambda p: patching.patching_heatmaps(panels, p), tmp_path, "patching", PAGE_W)


def test_spread_log_scale_keeps_the_untouched_positions_at_the_floor(tmp_path):
    # Positions before the perturbation change by exactly 0: on the log scale they
    # must sit at the floor colour, not turn into NaN holes.
    a = np.zeros((4, 10))
    a[:, 5:] = 0.1
    img = check_files(lambda p: perturb.spread_heatmaps({"prepend": a}, p, floor=1e-3), tmp_path, "floor", PAGE_W)
    assert np.isfinite(img).all()


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda p: sinks.sink_rate_lines({}, p, eps=0.3), "empty"),
        (lambda p: sinks.sink_rate_lines({"prepend": [120.0]}, p, eps=0.3), "percentages"),
        (lambda p: core.layer_lines({"a": []}, p, title="t", ylabel="y"), "non-empty 1-D"),
        (lambda p: perturb.spread_heatmaps({}, p), "empty"),
        (lambda p: perturb.spread_heatmaps({"prepend": np.ones(5)}, p), r"\[layer, pos\]"),
        (lambda p: perturb.spread_heatmaps({"prepend": -np.ones((2, 2))}, p), "negative"),
        (lambda p: heads.head_norm_bars([], {"a": []}, p), "no heads"),
        (lambda p: heads.head_norm_bars(HEADS, {}, p), "empty"),
        (lambda p: heads.head_norm_bars(HEADS, {"a": [1.0, 2.0]}, p), "2 values for 3 heads"),
        (lambda p: heads.head_norm_bars(HEADS, {"a": [0.0, 1.0, 2.0]}, p), "log scale"),
        (lambda p: heads.band_heatmaps(np.ones((3, 4)), np.ones((3, 5)), p, heads=HEADS), "differ in shape"),
        (lambda p: heads.band_heatmaps(np.ones((2, 4)), np.ones((2, 4)), p, heads=HEADS), "2 rows for 3 head"),
        (lambda p: patching.patching_heatmaps({}, p), "empty"),
        (lambda p: patching.patching_heatmaps({"prepend": np.ones((0, 9))}, p), "non-empty 2-D"),
    ],
)
def test_bad_input_is_a_clear_error(tmp_path, call, message):
    with pytest.raises(ValueError, match=message):
        call(tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_unwritable_folder_and_wrong_suffix_are_clear_errors(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(OSError, match="cannot write figure"):
        sinks.sink_rate_lines({"prepend": [50.0, 60.0]}, blocker / "sub" / "rate.png", eps=0.3)
    with pytest.raises(ValueError, match=".png, .svg or .pdf"):
        patching.patching_heatmaps({"prepend": np.ones((2, 2))}, tmp_path / "x.jpg")


def test_shared_colour_scale_and_heatmap_grid():
    panels = [("a", np.array([[0.5, np.nan], [2.0, 1.0]])), ("b", np.array([[-1.0, 3.0]]))]
    assert core.shared_limits(panels) == {"vmin": 0.0, "vmax": 3.0}
    assert core.shared_limits(panels, signed=True) == {"vmin": -1.0, "vmax": 3.0}
    assert core.shared_limits([("z", np.zeros((2, 2)))]) == {"vmin": 0.0, "vmax": 1e-12}
    assert core.heatmap_grid(np.arange(3.0)).shape == (3, 1)
    np.testing.assert_allclose(core.heatmap_grid(np.arange(8.0).reshape(2, 2, 2)), [[0.5, 2.5], [4.5, 6.5]])
    assert core.heatmap_grid(np.ones((2, 5))).shape == (2, 5)


@pytest.mark.slow
def test_training_curves_wrap_many_runs_onto_bands_of_three_rows(tmp_path, monkeypatch):
    """Seven runs at five per row draw two bands (six rows of panels), not seven narrow columns:
    the image is about as tall as wide, where one band of seven columns is three times as wide."""
    from matplotlib.figure import Figure

    from sinkmech.plots.training import training_curves

    real = Figure.savefig  # saved at 20 dpi: only the shape is read (at 200 dpi, 5,000-pixel images took seconds)
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **kw: real(fig, path, **{**kw, "dpi": 20}))

    cond = {"max_head_score": 0.5, "mean_head_score": 0.2, "uniform_score": 0.1, "sink_rate": {"0.3": 25.0, "0.8": 0.0}}
    log = {"train_loss": [3.0, 2.5, 2.0], "evals": [{"step": s, "val_loss": {"prepend": 2.0, "none": 2.1},
                                                     "conditions": {"prepend": cond, "none": cond}} for s in (1, 3)]}
    logs = {f"run{i}": log for i in range(7)}
    wrapped = matplotlib.image.imread(training_curves(logs, tmp_path / "wrapped.png"))
    flat = matplotlib.image.imread(training_curves(logs, tmp_path / "flat.png", per_row=7))
    assert wrapped.shape[0] / wrapped.shape[1] > 0.75
    assert flat.shape[1] / flat.shape[0] > 2.5


def test_names_of_nearby_confirmed_heads_never_overlap_and_stay_inside(tmp_path, monkeypatch):
    """SmolLM2's contrast had five confirmed heads within 0.01 of one another
    (L26.H4, L29.H2, L16.H8, L21.H4, L25.H2): their names printed on top of one
    another. Each name now has its own place, inside the axes."""
    from sinkmech.plots import heads as module

    drawn = {}
    real = module._name_lines

    def keep(fig, ax, named, **kw):
        texts = drawn["texts"] = real(fig, ax, named, **kw)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        drawn["boxes"] = [t.get_window_extent(renderer) for t in texts]
        drawn["axes"] = ax.get_window_extent(renderer)
        return texts

    monkeypatch.setattr(module, "_name_lines", keep)
    diffs = list(np.linspace(-0.2, 0.2, 200))
    marked = {"L26.H4": -0.250, "L29.H2": -0.248, "L16.H8": -0.245, "L21.H4": -0.245, "L25.H2": -0.244,
              "L27.H5": -0.321, "L15.H1": 0.199}  # the last at the right edge
    module.contrast_distribution(diffs, marked, {"median": 0.0, "ci": [-0.01, 0.01]}, tmp_path / "c.png")
    boxes, axes = drawn["boxes"], drawn["axes"]
    assert len(boxes) == len(marked)
    for i, a in enumerate(boxes):
        assert axes.x0 - 1 <= a.x0 and a.x1 <= axes.x1 + 1 and axes.y0 <= a.y0, drawn["texts"][i].get_text()
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), (a, b)
    # the names say which line is which: each carries its head's difference
    assert sorted(t.get_text() for t in drawn["texts"]) == sorted(f"{n} {x:+.3f}" for n, x in marked.items())
