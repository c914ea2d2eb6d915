"""`<bos>` moved after K content tokens: the loss leaves out content token K (which
only the `<bos>` position would predict) in the moved run and in the references
it is paired with, token by token against the model run by hand; the dropped
target and the earlier all-targets loss reported beside it; the study from its Config."""

from __future__ import annotations

import pytest
import torch

from helpers.tiny import TINY_BOS, TINY_RUN
from sinkmech.measures.sinks import sink_scores
from sinkmech.options import QUIET
from sinkmech.studies.bos_position import bos_position_study


@pytest.fixture(scope="module")
def rows(tiny_tokens):
    r = tiny_tokens[:5].tolist()
    r[1] = r[1][:9]  # ragged: padding must never enter
    return r


@pytest.fixture(scope="module")
def study(tiny_model, rows):
    return bos_position_study(tiny_model, rows, [1, 4], options=TINY_RUN.replace(batch_size=2))


def nll_by_hand(model, ids: list[int], targets: dict[int, int]) -> float:
    """Summed -log p over {position of the token: content index} for one sequence."""
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids]))[0].double(), -1)
    return float(-sum(logp[q - 1, ids[q]] for q in targets))


def test_moved_loss_pairs_on_the_same_targets(tiny_model, rows, study):
    """Per K: the moved loss over content targets 1..n-1 but K, minus <bos> first's
    over the same targets, against both sequences run by hand."""
    for K in (1, 4):
        num, den, moved_sum = 0.0, 0, 0.0
        for r in rows:
            moved = r[:K] + [TINY_BOS] + r[K:]
            first = [TINY_BOS] + r
            keep = [j for j in range(1, len(r)) if j != K]
            m = nll_by_hand(tiny_model, moved, {(j if j < K else j + 1): j for j in keep})
            f = nll_by_hand(tiny_model, first, {j + 1: j for j in keep})
            num, den, moved_sum = num + m - f, den + len(keep), moved_sum + m
        e = study[str(K)]
        assert e["vs_bos"]["loss"][0] == pytest.approx(num / den, rel=1e-5)
        assert e["loss"][0] == pytest.approx(moved_sum / den, rel=1e-5)
        ref = sink_scores(tiny_model, rows, bos="prepend", bos_position=K, loss=True, options=TINY_RUN)
        assert ref.loss == pytest.approx(moved_sum / den, rel=1e-5)  # sink_scores scores the same targets


def test_the_dropped_target_and_the_old_definition(tiny_model, rows, study):
    """Content token K predicted from <bos> (the target the earlier loss kept), against
    <bos> first's prediction of it; and the all-targets difference that includes it."""
    K = 4
    from_bos = [nll_by_hand(tiny_model, r[:K] + [TINY_BOS] + r[K:], {K + 1: K}) for r in rows]
    first = [nll_by_hand(tiny_model, [TINY_BOS] + r, {K + 1: K}) for r in rows]
    d = study[str(K)]["dropped_target"]
    assert d["from_bos"][0] == pytest.approx(sum(from_bos) / len(rows), rel=1e-5)
    assert d["difference"][0] == pytest.approx((sum(from_bos) - sum(first)) / len(rows), rel=1e-5)
    n_all = sum(len(r) - 1 for r in rows)
    n_keep = n_all - len(rows)
    old = study[str(K)]["vs_bos"]["loss"][0] * n_keep + (sum(from_bos) - sum(first))
    assert study[str(K)]["vs_bos_all_targets"]["loss"][0] == pytest.approx(old / n_all, rel=1e-5)


def test_sink_rates_and_references(tiny_model, rows, study):
    moved = sink_scores(tiny_model, rows, bos="prepend", bos_position=4, options=TINY_RUN)
    assert study["4"]["bos_score"] == pytest.approx(float(moved.bos_scores.mean()))
    first = sink_scores(tiny_model, rows, bos="prepend", loss=True, options=TINY_RUN)
    assert study["bos"]["loss"][0] == pytest.approx(first.loss, rel=1e-5)
    assert set(study) == {"bos", "none", "1", "4"}
    with pytest.raises(ValueError, match="at or beyond"):
        bos_position_study(tiny_model, rows, [9], options=TINY_RUN)


def test_the_study_runs_from_its_config(tiny_model, monkeypatch):
    from sinkmech.studies.bos_position import run
    from sinkmech.studies.configs import BosPositionConfig

    from helpers.tiny import serve_windows

    windows = serve_windows(monkeypatch, 6)
    monkeypatch.setattr("sinkmech.loading.models.bos_token_id", lambda model: TINY_BOS)
    config = BosPositionConfig(models=("tiny",), n_prompts=4, max_tokens=7, positions=(2,))
    result = run(tiny_model, config, QUIET)
    d = result.to_dict()
    assert d["config"] == config.to_dict() and set(d["tiny"]["bos_position"]) == {"bos", "none", "2"}
    assert "tiny.bos_position.2.vs_bos.loss.0" in result.findings()["tiny.bos_position"]
    # windows of one document are resampled together: 4 prompts, 2 documents
    assert d["tiny"]["n_documents"] == 2 and d["tiny"]["interval"].startswith("95 % bca bootstrap over the 2 documents")
    rows = [list(p) for p in windows.prompts[:4]]
    grouped = bos_position_study(tiny_model, rows, [2], max_tokens=7, documents=("d0", "d0", "d1", "d1"), options=QUIET)
    assert d["tiny"]["bos_position"]["2"]["vs_bos"]["loss"] == grouped["2"]["vs_bos"]["loss"]
    assert grouped["2"]["vs_bos"]["loss"] != bos_position_study(tiny_model, rows, [2], max_tokens=7,
                                                                options=QUIET)["2"]["vs_bos"]["loss"]
