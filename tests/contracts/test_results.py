"""The one result protocol (`sinkmech.results`): every result class writes strict JSON.

Each result is built on the tiny model, then "poisoned": the first entries of
each float tensor field become NaN, +inf and -inf, and each float field +inf.
Its `to_json()` must parse under a strict JSON parser (no bare NaN/Infinity)
and carry the poison as null.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import pkgutil

import pytest
import torch

import sinkmech
from sinkmech.files import json_text
from sinkmech.results import Result
from helpers.tiny import TINY_RUN, TINY_BOS
from helpers.backends import needs
from helpers.paths import REPO
from sinkmech.options import QUIET, RunOptions


def strict_loads(text: str):
    def refuse(name):
        raise ValueError(f"bare {name} in JSON")

    return json.loads(text, parse_constant=refuse)


def all_result_classes() -> set[type]:
    for mod in pkgutil.walk_packages(sinkmech.__path__, "sinkmech."):
        if ".cli" not in mod.name:
            importlib.import_module(mod.name)
    out, todo = set(), [Result]
    while todo:
        for sub in todo.pop().__subclasses__():
            out.add(sub)
            todo.append(sub)
    return out


@pytest.fixture(scope="module")
def rows(tiny_tokens):
    return [tiny_tokens[i, : 12 - i].tolist() for i in range(4)]  # ragged: 12 .. 9 content tokens


@pytest.fixture(scope="module")
def batch(tiny_model, rows):
    from sinkmech.prompts import tokenize

    return tokenize(tiny_model, rows, bos="prepend", max_tokens=12, bos_token_id=TINY_BOS)


def _sink_scores(m, rows, batch):
    from sinkmech.measures.sinks import sink_scores

    return sink_scores(m, batch, loss=True, options=QUIET)


def _massive_dims(m, rows, batch):
    from sinkmech.measures.massive import massive_dims

    return massive_dims(m, batch, top_k=2, options=QUIET)


def _massive_reset(m, rows, batch):
    from sinkmech.measures.massive import reset_massive_dims

    return reset_massive_dims(m, batch, dims=(0, 1), from_layer=0, options=QUIET)


def _length_sweep(m, rows, batch):
    from sinkmech.context.length import sinks_vs_length

    return sinks_vs_length(m, batch, lengths=(4, 8), top_k=1, options=QUIET)


def _value_weighted(m, rows, batch):
    from sinkmech.measures.value_weighted import value_weighted_first

    return value_weighted_first(m, batch, options=QUIET)


COMPARE = dict(n_prompts=4, max_tokens=12, spread_prompts=2, spread_tokens=8, spread_position=3, dormant_prompts=4,
               noop_prompts=4, noop_heads=1)


def _comparison(m, rows, batch):
    from sinkmech.studies.compare import compare_model
    from sinkmech.studies.configs import CompareConfig

    return compare_model(m, rows, config=CompareConfig(**COMPARE),
                         options=TINY_RUN)


def _compare_study(m, rows, batch):
    from sinkmech.studies.compare import Comparison
    from sinkmech.studies.configs import CompareConfig

    return Comparison((_comparison(m, rows, batch),), CompareConfig(**COMPARE), 1.5)


def _spread(m, rows, batch):
    from sinkmech.interventions.perturb import EmbeddingNoise, perturbation_spread

    return perturbation_spread(m, rows, perturbation=EmbeddingNoise(0.3, 2), options=TINY_RUN)


def _stream(m, rows, batch):
    from sinkmech.prompts import tokenize
    from sinkmech.context.stream import stream_perplexity

    return stream_perplexity(m, tokenize(m, rows[:1], bos="prepend", bos_token_id=TINY_BOS), window=3, keep=(0, 1),
                             options=QUIET)


def _key_sinks(m, rows, batch):
    from sinkmech.measures.key_sinks import key_sink_scores

    return key_sink_scores(m, batch, top_k=2, min_queries=2, options=QUIET)


def _head_attention(m, rows, batch):
    from sinkmech.measures.attention import head_attention

    return head_attention(m, rows[0], ["0.1", "1.2"], options=RunOptions(bos_token_id=TINY_BOS))


def _ablation(m, rows, batch):
    from sinkmech.interventions.ablation import head_ablations

    return head_ablations(m, batch, mode="zero", options=QUIET)


def _patch(m, rows, batch):
    from sinkmech.interventions.patching import bos_pair, patch

    return patch(m, bos_pair(m, rows, max_tokens=8, bos_token_id=TINY_BOS), act="resid_pre", by="layer")


def _sensitivity(m, rows, batch):
    from sinkmech.theory.sensitivity import sensitivity

    return sensitivity(m, rows[:1], bos="prepend", max_tokens=4, options=RunOptions(bos_token_id=TINY_BOS))


def _sensitivity_study(m, rows, batch):
    from sinkmech.theory.sensitivity import sensitivity_study

    return sensitivity_study(m, rows[:2], max_tokens=4, options=TINY_RUN)


def _scan(m, rows, batch):
    from sinkmech.dormant.scan import scan_heads

    from sinkmech.dormant.labels import Thresholds

    return scan_heads(m, batch, thresholds=Thresholds(min_queries=1), options=QUIET)


def _noop(m, rows, batch):
    from sinkmech.dormant.noop import noop_check

    return noop_check(m, batch, [(0, 0)], options=QUIET)


def _train(m, rows, batch):
    from sinkmech.train.run import TrainConfig, TrainResult

    log = {"evals": [{"step": 1, "val_loss": {"prepend": 1.0, "none": 2.0},
                      "conditions": {c: {"max_head_score": 0.5, "mean_head_score": 0.25, "sink_rate": {"0.3": 10.0}}
                                     for c in ("prepend", "none")}}],
           "train_loss": [1.0]}
    return TrainResult(model=m, config=TrainConfig(), log=log)


def _contrast(m, rows, batch):
    from sinkmech.dormant.contrast import ContrastHead, HeadContrast

    head = ContrastHead(layer=0, head=1, dormant_a=0.5, dormant_b=0.25, mode_a="if_else", mode_b="sink",
                        diff_selected=0.3, diff_validated=0.2, diff_validated_ci=(0.1, 0.3), confirmed=True)
    return HeadContrast(heads=(head,), name_a="prose", name_b="code", n_prompts_a=8, n_prompts_b=8, high=0.8,
                        low=0.2, min_diff=0.2, level=0.95, mode_counts_a={"sink": 1}, mode_counts_b={"sink": 2})


def _bound_ranking(m, rows, batch):
    from sinkmech.studies.theory import bound_ranking

    return bound_ranking(m, rows[:4], max_tokens=5, n_probes=2, n_shuffles=5, options=TINY_RUN)


def _first_tokens(m, rows, batch):
    from sinkmech.studies.first_token import first_token_study

    return first_token_study(m, rows[:5], {"bos": [TINY_BOS], "none": []}, max_tokens=6, swap_position=2,
                             options=QUIET)


def _head_losses(m, rows, batch):
    from sinkmech.studies.bos_cost import head_loss_changes

    return head_loss_changes(m, batch, options=QUIET)


def _fitted_sinks(m, rows, batch):
    from sinkmech.interventions.fit_sinks import FitSettings, fit_sinks

    from sinkmech.prompts import tokenize

    none = tokenize(m, rows[:4], bos="none", max_tokens=6)
    return fit_sinks(m, none, FitSettings(steps=2, value=True), options=TINY_RUN)


def _decomposition(m, rows, batch):
    from sinkmech.studies.configs import DecompositionConfig
    from sinkmech.studies.decomposition import decompose

    config = DecompositionConfig(positions=(1,), top_k=(1,), layer_values=("bos",), learned_files=(), max_tokens=6)
    return decompose(m, rows[2:6], rows[:2], config, options=TINY_RUN)


def _summary_row(m, rows, batch):
    import json

    from sinkmech.train.summary import summary_rows

    log = REPO / "figures/train/logs/mask_self/rotary-maskself-seed0.json"
    return summary_rows(json.loads(log.read_text()))[0]  # a committed training log


def _domains(m, rows, batch):
    from sinkmech.studies.configs import DomainsConfig
    from sinkmech.studies.domains import Domains

    iv = {"value": 1.0, "ci": [0.5, 1.5], "method": "bca", "n_documents": 3}
    table = {"corpus": {"n_prompts": 8, "n_documents": 3}, "sink_rate": {c: {"0.3": iv} for c in ("prepend", "none")},
             "sink_rate_gap": {"0.3": iv}, "loss": {"prepend": iv, "none": iv}, "bos_cost": iv}
    return Domains({"tiny": {"pydoc": table, "licenses": table}}, DomainsConfig(models=("tiny",)), 1.0)


def _calibration(m, rows, batch):
    from sinkmech.studies.calibration import Calibration
    from sinkmech.studies.configs import CalibrationConfig

    cut = {"high": 0.5, "low": 0.2, "if_else_recovered": 1, "null_if_else": 0, "random_if_else": 0, "prompt_if_else": 0,
           "runs": 1, "recovered_by_strength": {"1": 1}, "prompt_triggers": []}
    return Calibration({"0.5_0.2": cut}, {"high": 0.5, "low": 0.2}, CalibrationConfig(strengths=(1.0,), seeds=1), 0.5)


def _theory(m, rows, batch):
    from sinkmech.studies.configs import TheoryConfig
    from sinkmech.studies.theory import Theory, correct

    br = _bound_ranking(m, rows, batch).to_dict()
    per_model = {"tiny": br}
    return Theory(per_model, correct(per_model), TheoryConfig(models=("tiny",)), 1.0)
def _training_study(m, rows, batch):
    from sinkmech.studies.configs import MaskSelfConfig
    from sinkmech.studies.training import TrainingStudy

    return TrainingStudy((_summary_row(m, rows, batch).to_dict(),), MaskSelfConfig(seeds=(0,)), 2.5)


def _long_context(m, rows, batch):
    from helpers.tiny import WordTokenizer, toy_tokenizer
    from sinkmech.studies.configs import LongContextConfig
    from sinkmech.studies.long_context import run

    config = LongContextConfig(lengths=(10, 20), n_prompts=2, buckets=(4, 16, 32), stream_length=20, stream_window=4,
                               collapse_repeats=(1, 3), collapse_prefix=4, learned_sinks=())
    with pytest.MonkeyPatch.context() as mp:
        toy_tokenizer(mp, m, WordTokenizer())
        return run(m, config, QUIET.replace(bos_token_id=TINY_BOS))


TRAIN_RESULTS = {"TrainResult", "SummaryRow", "TrainingStudy"}  # built by training a model (sinkmech.train)
FACTORIES = {
    "SinkScores": _sink_scores, "MassiveDims": _massive_dims, "MassiveIntervention": _massive_reset,
    "LengthSweep": _length_sweep, "ValueWeighted": _value_weighted, "ModelComparison": _comparison,
    "Comparison": _compare_study, "TrainingStudy": _training_study,
    "PerturbationSpread": _spread, "StreamResult": _stream, "KeySinks": _key_sinks,
    "HeadAttention": _head_attention, "HeadAblation": _ablation, "PatchResult": _patch,
    "Sensitivity": _sensitivity, "SensitivityStudy": _sensitivity_study, "HeadScan": _scan,
    "NoopCheck": _noop, "TrainResult": _train, "HeadContrast": _contrast,
    "BoundRanking": _bound_ranking, "FirstTokenRuns": _first_tokens, "HeadLossChanges": _head_losses,
    "SummaryRow": _summary_row, "Domains": _domains, "Calibration": _calibration, "Theory": _theory,
    "LongContextResult": _long_context, "FittedSinks": _fitted_sinks, "Decomposition": _decomposition,
}


def test_every_result_class_is_covered_and_complete():
    classes = all_result_classes()
    assert {c.__name__ for c in classes} == set(FACTORIES)
    for c in classes:
        assert dataclasses.is_dataclass(c) and c.__dataclass_params__.frozen, c
        for name in ("to_dict", "to_dataframe"):
            assert getattr(c, name) is not getattr(Result, name), f"{c.__name__} does not define {name}"
        assert c.to_json is Result.to_json, f"{c.__name__} writes its own JSON"


def _poisoned_tensors(v):
    """A dict (nested) of float tensors with NaN, +inf and -inf in each; None if it holds other things."""
    if isinstance(v, dict):
        out = {k: _poisoned_tensors(x) for k, x in v.items()}
        return out if v and all(x is not None for x in out.values()) else None
    if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() >= 3:
        v = v.clone()
        v.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), float("-inf")], dtype=v.dtype)
        return v
    return None


def poison(result, *, top: bool = True):
    """A copy with NaN, +inf and -inf in every float tensor field and +inf in
    every float field, nested result records included."""
    changes = {}
    for f in dataclasses.fields(result):
        v = getattr(result, f.name)
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() >= 3:
            v = v.clone()
            flat = v.view(-1)
            flat[0], flat[1], flat[2] = float("nan"), float("inf"), float("-inf")
            changes[f.name] = v
        elif isinstance(v, float):
            changes[f.name] = float("inf")
        elif dataclasses.is_dataclass(v) and hasattr(v, "to_dict"):  # a nested record, not settings
            changes[f.name] = poison(v, top=False)
        elif isinstance(v, dict) and v and all(dataclasses.is_dataclass(x) for x in v.values()):
            changes[f.name] = {k: poison(x, top=False) for k, x in v.items()}
        elif isinstance(v, dict) and v and _poisoned_tensors(v) is not None:  # name -> tensor, nested
            changes[f.name] = _poisoned_tensors(v)
        elif f.name == "log":  # TrainResult: the log itself
            changes[f.name] = {**v, "train_loss": [float("nan"), float("inf"), float("-inf")]}
    assert changes or not top, f"nothing to poison in {type(result).__name__}"
    return dataclasses.replace(result, **changes)


def nulls(value) -> int:
    if value is None:
        return 1
    if isinstance(value, dict):
        return sum(nulls(v) for v in value.values())
    if isinstance(value, list):
        return sum(nulls(v) for v in value)
    assert not (isinstance(value, float) and not math.isfinite(value))
    return 0


@pytest.mark.parametrize("name", [pytest.param(n, marks=needs("can_train") if n in TRAIN_RESULTS else ())
                                  for n in sorted(FACTORIES)])
def test_nan_and_infinities_are_written_as_null(name, tiny_model, rows, batch):
    result = FACTORIES[name](tiny_model, rows, batch)
    assert type(result).__name__ == name
    clean = strict_loads(result.to_json())
    assert clean == strict_loads(json_text(result.to_dict()))  # to_json is to_dict through the strict writer
    bad = poison(result)
    text = bad.to_json()
    assert "NaN" not in text and "Infinity" not in text
    assert nulls(strict_loads(text)) > nulls(clean), "the poisoned values did not reach the JSON as null"
    df = result.to_dataframe()
    assert len(df) > 0


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_strict_writer_nulls_every_non_finite_float(value):
    assert strict_loads(json_text({"a": value, "b": [1.0, value, {"c": (value,)}]})) == \
        {"a": None, "b": [1.0, None, {"c": [None]}]}
