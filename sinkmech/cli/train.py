"""`sinkmech train`: train a small model from scratch and track its sinks; and
`sinkmech train study NAME`: the training studies of `sinkmech.studies.training`
(several runs, their summary, figures and findings)."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path
from typing import get_args

from sinkmech.cli.common import UsageError, image_file, non_negative_int, positive_float, positive_int
from sinkmech.train.config import PACKINGS, DataSource, TrainConfig


def add_train_parser(sub) -> None:
    p = sub.add_parser("train", help="train a small model from scratch and track its sinks; `train study NAME`: "
                                     "the training studies",
                       description="One run (--out DIR), or a study of several runs: sinkmech train study NAME ...")
    p.add_argument("--data", choices=get_args(DataSource), default=TrainConfig.data,
                   help="text: the Python documentation, byte-level; bigram_backcopy: the paper's synthetic task (default %(default)s)")
    p.add_argument("--packing", choices=PACKINGS, default=TrainConfig.packing,
                   help="causal: documents packed, attention crosses them; intra_doc: each attends within its own (default %(default)s)")
    p.add_argument("--no-fixed-bos", dest="fixed_bos", action="store_false", help="no <bos> forced at position 0")
    p.add_argument("--context-length", type=positive_int, default=TrainConfig.context_length, help="tokens per training window (default %(default)s)")
    p.add_argument("--tokens-per-step", type=positive_int, default=TrainConfig.tokens_per_step,
                   help="tokens per optimiser step; batch = this // context length (default %(default)s)")
    p.add_argument("--layers", type=positive_int, default=TrainConfig.n_layers, help="transformer blocks (default %(default)s)")
    p.add_argument("--d-model", type=positive_int, default=TrainConfig.d_model, help="residual width (default %(default)s)")
    p.add_argument("--heads", type=positive_int, default=TrainConfig.n_heads, help="attention heads per layer (default %(default)s)")
    p.add_argument("--steps", type=positive_int, default=TrainConfig.steps, help="optimiser steps (default %(default)s)")
    p.add_argument("--lr", type=positive_float, default=TrainConfig.lr, help="peak learning rate, cosine decay (default %(default)s)")
    p.add_argument("--warmup", type=non_negative_int, default=TrainConfig.warmup, help="linear warm-up steps (default %(default)s)")
    p.add_argument("--seed", type=int, default=TrainConfig.seed, help="seed of the weights and the data order (default %(default)s)")
    p.add_argument("--threads", type=positive_int, default=TrainConfig.threads, help="torch CPU threads (default: torch's own choice)")
    p.add_argument("--eval-every", type=positive_int, default=TrainConfig.eval_every, help="steps between sink and loss evaluations (default %(default)s)")
    p.add_argument("--out", type=Path, default=None, help="directory for model.safetensors, config.json, log.json "
                   "(required for one run)")
    p.add_argument("--png", type=image_file, default=None, help="plot of the sink signals against step (.png, .svg or .pdf)")
    p.set_defaults(func=cmd_train)
    add_study_parsers(p)


def cmd_train(args) -> None:
    if args.out is None:
        raise UsageError("sinkmech train needs --out DIR for one run (or `sinkmech train study NAME` for a study)")
    from sinkmech.loading.backend import CAPABILITIES
    from sinkmech.plots.training import training_curves
    from sinkmech.prompts import CONDITIONS

    if not CAPABILITIES.can_train:
        raise UsageError(f"sinkmech train builds its models as TransformerLens 3.x HookedTransformers; this "
                         f"environment has {CAPABILITIES.described}: install transformer-lens<4 to train")
    from sinkmech.train.run import train  # the training code, once the backend can train

    cfg = TrainConfig(
        data=args.data, packing=args.packing, fixed_bos=args.fixed_bos, context_length=args.context_length,
        tokens_per_step=args.tokens_per_step, n_layers=args.layers, d_model=args.d_model, n_heads=args.heads,
        steps=args.steps, lr=args.lr, warmup=args.warmup, seed=args.seed, threads=args.threads,
        eval_every=args.eval_every,
    )
    result = train(cfg, args.out)
    final = result.final()
    print(f"trained in {result.seconds:.1f} s; wrote {args.out}")
    for cond in CONDITIONS:
        c = final["conditions"][cond]
        print(f"bos={cond:>7}: val loss {final['val_loss'][cond]:.3f}  sink rate {c['sink_rate']}  "
              f"max head {c['max_head_score']:.3f}  uniform {c['uniform_score']:.3f}")
    if args.png:
        print(f"wrote {training_curves({args.out.name: result.log}, args.png)}")


# --- sinkmech train study NAME ---------------------------------------------------------

TRAINING_STUDIES = ("packing", "positional", "context-length", "mask-self", "depth", "text")


class DeprecatedFlag(argparse.Action):
    """A study flag's old name: stores into the new flag's destination; the
    command warns once it runs (`warning: --old is deprecated: use --new`)."""

    def __init__(self, option_strings, dest, new: str, **kwargs):
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.deprecated_flags = (*getattr(namespace, "deprecated_flags", ()), (option_string, self.new))


def add_study_parsers(train) -> None:
    """`sinkmech train study NAME`: the flags of each study (made into its config,
    `sinkmech.studies.configs.TRAINING_STUDIES`; `sinkmech study train-NAME` runs the same)."""
    from sinkmech.train.presets import POSITIONAL_RUNS, PRESETS
    from sinkmech.train.config import POSITIONALS

    forms = train.add_subparsers(dest="train_form", metavar="study")
    study = forms.add_parser("study", help="a training study: several runs, their summary, figures and findings",
                             description="Training studies (sinkmech.studies.training); outputs under --out.")
    names = study.add_subparsers(dest="study", required=True)
    for name in TRAINING_STUDIES:
        p = names.add_parser(name, help=(_study_doc(name)))
        p.add_argument("--preset", choices=sorted(PRESETS), default="text" if name == "text" else "cpu")
        p.add_argument("--jobs", type=positive_int, default=1, help="independent runs trained at once, in separate processes")
        p.add_argument("--steps", type=positive_int, default=None, help="override the preset's step count")
        p.add_argument("--threads", type=positive_int, default=None, help="torch threads (cpu preset: 1)")
        p.add_argument("--data", choices=get_args(DataSource), default=None, help="override the data source")
        p.add_argument("--seed", type=int, default=None)
        p.add_argument("--eval-every", type=positive_int, default=None)
        p.add_argument("--out", type=Path, default=Path("figures/train"), help="where JSON, markdown and figures go")
        p.add_argument("--runs-dir", type=Path, default=Path("runs/train"), help="where checkpoints go")
        p.add_argument("--prefix", default="", help="prefix for output file names (e.g. 'gpu_')")
        p.add_argument("--quiet", action="store_true", help="no progress bars")
        p.add_argument("--set", dest="sets", nargs="+", default=(), metavar="KEY=VALUE",
                       help="override any TrainConfig field, e.g. --set tokens_per_step=512 val_windows=2")
        if name == "context-length":
            p.add_argument("--context-length", dest="context_lengths", type=positive_int, nargs="+", default=None,
                           help="the context lengths (default: the preset's)")
            p.add_argument("--lengths", dest="context_lengths", type=positive_int, nargs="+", action=DeprecatedFlag,
                           new="--context-length")
            p.add_argument("--no-fixed-bos", dest="fixed_bos", action="store_false",
                           help="train without a fixed <bos> (default: with)")
        if name == "positional":
            p.add_argument("--positionals", nargs="+", choices=POSITIONALS, default=list(POSITIONAL_RUNS))
        if name in ("mask-self", "depth"):
            p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
        if name in ("depth", "text"):
            p.add_argument("--layers", type=positive_int, nargs="+", default=[1, 2, 4] if name == "depth" else [2],
                           help="the depths (default %(default)s)")
            p.add_argument("--depths", dest="layers", type=positive_int, nargs="+", action=DeprecatedFlag,
                           new="--layers")
        if name == "depth":
            p.add_argument("--positionals", nargs="+", choices=POSITIONALS, default=["rotary", "standard"])
            p.add_argument("--deep-steps", type=positive_int, default=None, help="steps for depths >= 4 (default: the preset's)")
            p.add_argument("--fresh", action="store_true",
                           help="train the 1- and 2-layer runs anew instead of reusing the positional runs' logs")
            p.add_argument("--deep-seeds", type=non_negative_int, default=None,
                           help="depths above 1 for the first N seeds only (default: every seed)")
        if name == "text":
            p.add_argument("--weight-decays", type=float, nargs="+", default=[0.1, 0.0])
            p.add_argument("--fixed-bos", nargs="+", choices=["yes", "no"], default=["yes", "no"])
        p.set_defaults(func=cmd_train_study, deprecated_flags=())
    for name, help_ in (("modes", "where every head's attention goes, from the runs' logs (modes.json)"),
                        ("replot", "redraw the studies' figures from the JSON under --out"),
                        ("findings", "write findings_train.json from the JSON under --out")):
        p = names.add_parser(name, help=help_)
        p.add_argument("--out", type=Path, default=Path("figures/train"))
        p.add_argument("--prefix", default="")
        p.set_defaults(func=cmd_train_study, deprecated_flags=())


def _study_doc(name: str) -> str:
    return {
        "packing": "Table 2: both packings, with and without a fixed <bos>; and the emergence figure",
        "positional": "the fixed-<bos> recipe under each positional embedding",
        "context-length": "the same model at several context lengths, scored on the same tokens",
        "mask-self": "rotary positions with each query's own key masked, one run per seed",
        "depth": "the fixed-<bos> recipe at each depth and positional embedding, one run per seed",
        "text": "natural text: every (depth, weight decay, fixed <bos>) combination",
    }[name]


def cmd_train_study(args) -> None:
    from sinkmech.files import make_dir
    from sinkmech.train import readouts
    from sinkmech.studies import training_findings as findings

    for old, new in args.deprecated_flags:
        warnings.warn(f"{old} is deprecated: use {new}", FutureWarning, stacklevel=1)
    make_dir(args.out, "output folder")
    if args.study == "modes":
        readouts.modes(args.out, args.prefix)
    elif args.study == "replot":
        readouts.replot(args.out, args.prefix)
    elif args.study == "findings":
        findings.write_findings(args.out, args.prefix)
    else:
        run_study(args)


def train_study_config(args):
    """`sinkmech train study NAME`'s flags as the study's config (`sinkmech.studies.configs`),
    checked before anything trains."""
    from sinkmech.studies.configs import TRAINING_STUDIES

    shared = dict(preset=args.preset, steps=args.steps, threads=args.threads, data=args.data, seed=args.seed,
                  eval_every=args.eval_every, sets=tuple(args.sets), out=str(args.out), runs_dir=str(args.runs_dir),
                  prefix=args.prefix, jobs=args.jobs)
    own = {"positional": lambda: dict(positionals=tuple(args.positionals)),
           "context-length": lambda: dict(context_lengths=None if args.context_lengths is None
                                          else tuple(args.context_lengths), fixed_bos=args.fixed_bos),
           "mask-self": lambda: dict(seeds=tuple(args.seeds)),
           "depth": lambda: dict(seeds=tuple(args.seeds), layers=tuple(args.layers),
                                 positionals=tuple(args.positionals), deep_steps=args.deep_steps, fresh=args.fresh,
                                 deep_seeds=args.deep_seeds),
           "text": lambda: dict(layers=tuple(args.layers), weight_decays=tuple(args.weight_decays),
                                fixed_bos=tuple(b == "yes" for b in args.fixed_bos))}
    import dataclasses

    from sinkmech.studies.config import ConfigError

    cls = TRAINING_STUDIES[args.study]
    try:
        return cls(**shared, **own.get(args.study, dict)())
    except ConfigError as e:  # said in this command's flag names
        name = str(e).split(" ")[0]
        if name not in {f.name for f in dataclasses.fields(cls)}:
            raise
        flag = {"sets": "--set", "context_lengths": "--context-length"}.get(name, "--" + name.replace("_", "-"))
        raise ConfigError(flag + str(e)[len(name):]) from None


def run_study(args) -> list[dict]:
    """One of `TRAINING_STUDIES` with the parsed flags (as its config); its rows."""
    from sinkmech.loading.backend import CAPABILITIES
    from sinkmech.options import RunOptions
    from sinkmech.studies.training import run

    config = train_study_config(args)  # a bad setting is an error before anything trains
    if not CAPABILITIES.can_train:
        raise UsageError(f"training studies build their models as TransformerLens 3.x HookedTransformers; this "
                         f"environment has {CAPABILITIES.described}: install transformer-lens<4 to train")
    return list(run(None, config, RunOptions(progress=not args.quiet)).rows)
