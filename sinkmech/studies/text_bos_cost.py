"""How much of a trained model's `<bos>` cost do its sink heads carry?

The control of `sinkmech.studies.bos_cost` (each head's `mask_first` loss
change on content targets, heads ranked on one set of windows, then the first
key masked in the top 1, 2, 4, ... heads at once on a disjoint set, against
removing `<bos>`) on a model trained here from scratch (`sinkmech.train.run`),
scored on the run's own held-out text: windows of the validation split
(`sinkmech.train.data.text_streams`), tokenized as in training with the fixed
`<bos>`: `<bos>` then `context_length - 1` stream tokens, the training
window's positions 0..T-1. The ranking windows come from the first half of the
validation stream and the held-out windows from the second (cut at a document
boundary), so no document is in both. Without `<bos>` the same content is
scored at positions 0..T-2, as in `sinkmech.train.evaluate`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from jaxtyping import Int
from torch import Tensor

from sinkmech.studies.bos_cost import bos_cost_batches
from sinkmech.findings import flatten
from sinkmech.hooks import head_label
from sinkmech.prompts import TokenBatch
from sinkmech.stats import excludes_zero
from sinkmech.train.config import TrainConfig
from sinkmech.train.data import text_streams
from sinkmech.options import STUDY_BATCH, RunOptions

FINDINGS_PREFIX = "train.text.bos_cost"


def split_stream(stream: Int[Tensor, " tokens"], *, bos_id: int) -> tuple[Tensor, Tensor]:
    """The stream cut in two at the first document start (`<bos>`) at or after
    its middle: no document lies in both halves."""
    starts = (stream == bos_id).nonzero().flatten()
    later = starts[starts >= len(stream) // 2]
    if len(later) == 0:
        raise ValueError("the validation stream has no document start in its second half to split at")
    cut = int(later[0])
    return stream[:cut], stream[cut:]


def stream_windows(stream: Int[Tensor, " tokens"], n: int, length: int, *, seed: int) -> Int[Tensor, "n length"]:
    """`n` non-overlapping windows of `length` consecutive tokens, drawn at
    random (fixed `seed`) among the stream's `len // length` aligned slots, in
    stream order."""
    slots = len(stream) // length
    if slots < n:
        raise ValueError(f"{n} windows of {length} tokens do not fit a stream of {len(stream)} tokens ({slots} fit)")
    pick = torch.randperm(slots, generator=torch.Generator().manual_seed(seed))[:n].sort().values
    return stream[pick[:, None] * length + torch.arange(length)]


def with_fixed_bos(windows: Int[Tensor, "n content"], bos_id: int) -> TokenBatch:
    """A training run's input: `<bos>` at position 0, then the window (a window
    may hold a later document's `<bos>`, as training windows do)."""
    tokens = torch.cat([torch.full((len(windows), 1), bos_id, dtype=torch.long), windows.long()], dim=1)
    lengths = torch.full((len(windows),), tokens.shape[1], dtype=torch.long)
    return TokenBatch(tokens, lengths, "prepend", bos_id)


def text_windows(cfg: TrainConfig, *, n_select: int, n_eval: int, seed: int = 0) -> tuple[TokenBatch, TokenBatch]:
    """(ranking windows, held-out windows) from the run's validation split:
    `<bos>` + `context_length - 1` content tokens each, the ranking windows
    from the first half of the stream, the held-out ones from the second."""
    if cfg.data != "text":
        raise ValueError(f"the run was trained on {cfg.data!r}: held-out windows are drawn from the text source")
    _, val = text_streams(limit_bytes=cfg.text_limit_bytes, corpus=cfg.text_corpus)
    first, second = split_stream(val, bos_id=cfg.bos_id)
    n = cfg.context_length - 1
    pick = with_fixed_bos(stream_windows(first, n_select, n, seed=seed), cfg.bos_id)
    held = with_fixed_bos(stream_windows(second, n_eval, n, seed=seed + 1), cfg.bos_id)
    return pick, held


def checkpoint_bos_cost(
    run_dir: str | Path,
    *,
    n_select: int = 32,
    n_eval: int = 128,
    ks: Sequence[int] | None = None,
    options: RunOptions = RunOptions(),
) -> dict:
    """`bos_cost_batches` on the checkpoint in `run_dir` (`save_checkpoint`'s
    files), with `text_windows`; `options`: batch size, progress bar, and the
    device the checkpoint is loaded on.

    Returns:
        `bos_cost`'s dict (its `n_prompts` count windows) plus "run" (the
        directory's name), "content_tokens" per window, the run's settings
        ("n_layers", "n_heads", "weight_decay", "seed", "steps") and, when the
        run's `log.json` is beside it, "sink_head" (`sink_head`).
    """
    from sinkmech.train.run import load_checkpoint

    model, cfg = load_checkpoint(run_dir, device=options.device)
    if not cfg.fixed_bos or cfg.packing != "causal" or cfg.mask_self:
        raise ValueError("the <bos> cost control runs on causal fixed-<bos> runs without mask_self "
                         f"(this run: packing {cfg.packing}, fixed_bos {cfg.fixed_bos}, mask_self {cfg.mask_self})")
    pick, held = text_windows(cfg, n_select=n_select, n_eval=n_eval)
    dev = model.cfg.device
    pick = TokenBatch(pick.tokens.to(dev), pick.lengths.to(dev), "prepend", cfg.bos_id)
    held = TokenBatch(held.tokens.to(dev), held.lengths.to(dev), "prepend", cfg.bos_id)
    log_path = Path(run_dir) / "log.json"
    log = json.loads(log_path.read_text()) if log_path.exists() else None
    sets = None
    if log is not None:  # the sink head against every other head
        l, h, _ = strongest_head(log)
        sets = {"sink_head": [(l, h)],
                "other_heads": [(a, b) for a in range(cfg.n_layers) for b in range(cfg.n_heads) if (a, b) != (l, h)]}
    out = bos_cost_batches(model, pick, held, ks=ks, head_sets=sets, options=options)
    settings = {k: getattr(cfg, k) for k in ("n_layers", "n_heads", "weight_decay", "seed", "steps")}
    res = {"run": Path(run_dir).name, "content_tokens": cfg.context_length - 1, **settings, **out}
    if log is not None:
        res["sink_head"] = sink_head(log, [t["head"] for t in out["select"]["top"]])
    return res


def strongest_head(log: dict) -> tuple[int, int, float]:
    """(layer, head, alpha_0): the head with the largest mean alpha_0 with
    `<bos>` at the run's last evaluation (on its held-out documents)."""
    scores = log["evals"][-1]["conditions"]["prepend"]["head_scores"]
    l, h = max(((l, h) for l in range(len(scores)) for h in range(len(scores[l]))), key=lambda lh: scores[lh[0]][lh[1]])
    return l, h, scores[l][h]


def sink_head(log: dict, ranking: Sequence[str]) -> dict:
    """{"head", "alpha_0", "loss_rank"}: `strongest_head` and its place (1 =
    first) in `ranking`, the heads by `mask_first` loss change (None if not listed)."""
    l, h, score = strongest_head(log)
    label = head_label(l, h)
    return {"head": label, "alpha_0": score, "loss_rank": ranking.index(label) + 1 if label in ranking else None}


def reproduction(log: dict, committed: dict) -> dict:
    """How closely a retrained run's log matches the committed one at the last
    evaluation: "same_config", and per inference condition the val loss, max
    alpha_0 and sink rate at 0.3 as [retrained, committed, difference]."""
    a, b = log["evals"][-1], committed["evals"][-1]
    out: dict = {"same_config": log["config"] == committed["config"], "step": [a["step"], b["step"]]}
    for cond in ("prepend", "none"):
        ca, cb = a["conditions"][cond], b["conditions"][cond]
        for name, x, y in (("val_loss", a["val_loss"][cond], b["val_loss"][cond]),
                           ("max_head_score", ca["max_head_score"], cb["max_head_score"]),
                           ("sink_rate.0.3", ca["sink_rate"]["0.3"], cb["sink_rate"]["0.3"])):
            out[f"{cond}.{name}"] = [x, y, x - y]
    return out


def bos_cost_findings(results: dict) -> dict:
    """The findings of `checkpoint_bos_cost` results keyed by run, under
    `train.text.bos_cost.<run>`: everything but the settings, flattened
    (intervals as `.0 .1 .2`: value, lo, hi), plus for each k and head set
    whether the share's interval excludes zero (`share_detectable`)."""
    flat: dict = {}
    for run, r in results.items():
        base = f"{FINDINGS_PREFIX}.{run}"
        flat.update(flatten(base, {k: r[k] for k in ("select", "eval", "content_tokens", "sink_head") if k in r}))
        for k, v in r["eval"]["top_k"].items():
            flat[f"{base}.eval.top_k.{k}.share_detectable"] = excludes_zero(v["share"])
        for name, v in r["eval"].get("head_sets", {}).items():
            flat[f"{base}.eval.head_sets.{name}.share_detectable"] = excludes_zero(v["share"])
        if "reproduction" in r:
            flat.update(flatten(f"{base}.reproduction", r["reproduction"]))
    return flat


def run(model_or_models=None, config=None, options: RunOptions = RunOptions()):
    """The study (`TextBosCostConfig`) on each checkpoint of `config.checkpoints`
    (models trained here: `model_or_models` is unused, each checkpoint is loaded
    in turn); each run's log compared with the committed one in `config.logs`.
    Findings under `train.text.bos_cost.<run>` (`bos_cost_findings`)."""
    import time

    from sinkmech.studies.config import StudyResult
    from sinkmech.studies.configs import TextBosCostConfig

    config = TextBosCostConfig() if config is None else config
    torch.set_num_threads(config.threads)
    sections, findings = {}, {}
    for run_dir in map(Path, config.checkpoints):
        t0 = time.perf_counter()
        r = checkpoint_bos_cost(run_dir, n_select=config.select, n_eval=config.eval, ks=list(config.ks),
                                options=options.replace(batch_size=options.batch(STUDY_BATCH)))
        name = r["run"]
        if config.logs is not None:
            committed, log = Path(config.logs) / f"{name}.json", run_dir / "log.json"
            if committed.exists() and log.exists():
                r["reproduction"] = reproduction(json.loads(log.read_text()), json.loads(committed.read_text()))
        r["seconds"] = round(time.perf_counter() - t0, 1)
        sections[name] = r
        findings[f"{FINDINGS_PREFIX}.{name}"] = bos_cost_findings({name: r})
    return StudyResult(config, sections, findings)
