"""Sink or token? First-token substitution and `<bos>` moved into the sequence
(`sinkmech.studies.first_token`), on Gemma 3 270M (trained with a fixed `<bos>`) and
SmolLM2 (the control).

At position 0 in turn: `<bos>`, `<eos>`, `<pad>` (where it differs from
`<eos>`), a newline, " the", a rare word (the highest-id token that is a space
and six or more lowercase letters, one token), `<bos>` twice, and nothing.
Then `<bos>` after K content tokens, K in --positions. Each is paired by prompt
against `<bos>` first, with 95 % bootstrap intervals over prompts.

    python scripts/first_token.py --out figures/first_token.json --findings figures/findings.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from sinkmech.loading import models
from sinkmech.files import json_text, write_text
from sinkmech.findings import flatten, record
from sinkmech.studies.first_token import bos_position_study, first_token_study
from sinkmech.corpora import default_corpus
from sinkmech.options import RunOptions


def rare_word(model) -> int:
    """The highest-id token that decodes to a space and >= 6 lowercase letters
    and tokenizes back to itself: a late BPE merge, so a rare word."""
    tok = model.tokenizer
    for i in range(model.cfg.d_vocab - 1, 0, -1):
        text = tok.decode([i])
        if re.fullmatch(r" [a-z]{6,}", text) and tok(text, add_special_tokens=False)["input_ids"] == [i]:
            return i
    raise ValueError("no rare single-token word in the vocabulary")


def one_token(model, text: str) -> int:
    ids = model.tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ValueError(f"{text!r} is {len(ids)} tokens, not one")
    return int(ids[0])


def first_tokens(model) -> tuple[dict[str, list[int]], dict[str, str]]:
    """name -> token ids put first, and the names left out with the reason."""
    tok, bos = model.tokenizer, models.bos_token_id(model)
    out = {"bos": [bos], "eos": [int(tok.eos_token_id)]}
    skipped = {}
    if tok.pad_token_id is None or tok.pad_token_id == tok.eos_token_id:
        skipped["pad"] = "the tokenizer's <pad> is its <eos>" if tok.pad_token_id is not None else "no <pad> token"
    else:
        out["pad"] = [int(tok.pad_token_id)]
    out |= {"newline": [one_token(model, "\n")], "the": [one_token(model, " the")], "rare": [rare_word(model)],
            "bos_bos": [bos, bos], "none": []}
    return out, skipped


def measure(name: str, *, n_prompts: int, max_tokens: int, positions: list[int], batch_size: int) -> dict:
    model = models.load_model(name)
    prompts = default_corpus()[:n_prompts]
    prefixes, skipped = first_tokens(model)
    t0 = time.perf_counter()
    runs = first_token_study(model, prompts, prefixes, max_tokens=max_tokens, options=RunOptions(batch_size=batch_size))
    out = {"first_token": runs.to_dict()["first_tokens"], "first_token_skipped": skipped,
           "n_prompts": n_prompts, "max_tokens": max_tokens, "swap_position": runs.swap_position}
    for k, ids in prefixes.items():
        out["first_token"][k]["text"] = "".join(model.tokenizer.decode([i]) for i in ids)
    out["first_token_seconds"] = round(time.perf_counter() - t0, 1)
    if positions:
        t0 = time.perf_counter()
        out["bos_position"] = bos_position_study(model, prompts, positions, max_tokens=max_tokens,
                                                 options=RunOptions(batch_size=batch_size))
        out["bos_position_seconds"] = round(time.perf_counter() - t0, 1)
    del model
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["gemma3-270m", "smollm2"])
    p.add_argument("--n-prompts", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--positions", type=int, nargs="*", default=[1, 2, 4, 8],
                   help="K values for <bos> moved after K content tokens (none: skip)")
    p.add_argument("--position-models", nargs="*", default=None,
                   help="models to run --positions on (default: all of --models)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--out", type=Path, required=True, help="JSON output (other models' results in it stay)")
    p.add_argument("--findings", type=Path, default=None,
                   help="merge into this findings file under <model>.first_token and <model>.bos_position")
    args = p.parse_args(argv)
    if args.n_prompts < 2 or args.max_tokens < 2 or args.batch_size < 1:
        print("error: --n-prompts and --max-tokens must be >= 2, --batch-size >= 1", file=sys.stderr)
        return 2
    if any(k < 1 or k >= args.max_tokens for k in args.positions):
        print(f"error: --positions must lie in [1, {args.max_tokens})", file=sys.stderr)
        return 2
    position_models = args.models if args.position_models is None else args.position_models
    results = json.loads(args.out.read_text()) if args.out.exists() else {}  # other models' results stay
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for name in args.models:  # each model written as soon as it is done
        print(f"{name} ...", file=sys.stderr, flush=True)
        r = results[name] = measure(name, n_prompts=args.n_prompts, max_tokens=args.max_tokens,
                                    positions=args.positions if name in position_models else [],
                                    batch_size=args.batch_size)
        write_text(args.out, json_text(results))
        if args.findings is not None:
            for key in ("first_token", "bos_position"):
                if key in r:
                    record(args.findings, flatten(f"{name}.{key}", r[key]), replace_prefix=f"{name}.{key}")
    results = {k: v for k, v in results.items() if k in args.models}
    for name, r in results.items():
        for k, e in r["first_token"].items():
            vs = e.get("vs_bos", {})
            cell = lambda v: f"{v[0]:+.3f} [{v[1]:+.3f}, {v[2]:+.3f}]" if v else "-"  # noqa: E731
            print(f"{name} {k:>8} ({e['text']!r}): sink rate 0.3 {e['sink_rate']['0.3'][0]:.1f} %, "
                  f"loss {e['loss'][0]:.3f}, spread {e['spread'][0]:.4f}; vs <bos>: loss {cell(vs.get('loss'))}, "
                  f"rate 0.3 {cell(vs.get('sink_rate', {}).get('0.3'))}, spread {cell(vs.get('spread'))}")
        for k, e in r.get("bos_position", {}).items():
            print(f"{name} <bos> at {k}: loss {e['loss'][0]:.3f}, key-0 rate 0.3 {e['sink_rate']['0.3'][0]:.1f} %"
                  + (f", <bos>-key rate 0.3 {e['bos_sink_rate']['0.3'][0]:.1f} %" if "bos_sink_rate" in e else ""))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
