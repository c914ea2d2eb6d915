"""Benchmark: sink scores at long context, three ways, side by side in one run.

On transformers' own Gemma 3 270M (the module sinkmech's Bridge wraps), one
prompt of T tokens (<bos> first, then seeded random ids: time and memory do
not depend on the ids or the weights' values), alpha_0 of every head read by:

- fused: sinkmech's fused path (`sinkmech.measures.fused`): the attention runs
  through transformers' attention interface as `fused_attention` (PyTorch's
  fused causal kernel with its log-sum-exp; query chunks on the sliding-window
  layers); each query's attention on key 0 is exp(s_t0 - lse_t). No T x T tensor.
- pattern: eager attention, each layer's pattern reduced to alpha_0 by a hook
  as soon as the layer returns it (sinkmech's pattern path: one layer's
  batch x heads x T x T at a time, plus transformers' T x T masks).
- gu: Gu et al.'s method as their released code runs it: transformers eager,
  `generate` one token with `output_attentions=True`, every layer's T x T kept and
  concatenated, then their importance score of every key (alpha_k), of which
  alpha_0 is key 0's (`alpha0_gu`).
- floor: the model's forward pass with the attention itself skipped (each
  layer's attention returns zeros; embeddings, projections, norms and MLPs all
  run): the work every method does whatever it reads off attention. gu / floor
  bounds the ratio any sink measure could reach against Gu et al.'s at that
  length; fused / floor is what the fused path's attention and measuring cost
  on top of it.

Each (method, T) runs in its own process: the model loads (not timed), one
warm-up at 64 tokens, then the timed pass (the fastest of `--repeats` up to
4,096 tokens: a shared machine's other work only slows a pass); peak RSS of that process during the
pass (its resident high-water mark, reset after the warm-up: the weights
included, the load's transients not), on CUDA the peak GPU memory torch allocated. A method stops at the first T whose
predicted memory does not fit (`--memory-limit`, default 80 % of the memory
available at the start), or whose process fails; the table says which and why.
The three methods' alpha_0 are compared at every T where two of them ran.

    python scripts/bench_long.py [--lengths 256 1024 4096 16384] [--device cpu|cuda]
                                 [--random-weights | --model-dir DIR] [--threads N] [--out DIR]

Needs torch and transformers (and jaxtyping, which sinkmech.measures.fused
imports), with this repository on PYTHONPATH; not TransformerLens.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

METHODS = ("fused", "pattern", "gu", "floor")
DEFAULT_LENGTHS = (256, 1024, 4096, 16384)
REPEAT_UP_TO = 4096  # passes this long or shorter are timed --repeats times (the fastest counts); longer ones once
BOS = 2  # Gemma's <bos>
# Gemma 3 270M as its GGUF's config gives it (the folder sinkmech converts it
# into, ~/.cache/sinkmech/hf/*/config.json): the random-weights model is built from this.
GEMMA3_270M = dict(
    vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
    num_key_value_heads=1, head_dim=256, max_position_embeddings=32768, rms_norm_eps=1e-6,
    query_pre_attn_scalar=256, sliding_window=512, hidden_activation="gelu_pytorch_tanh",
    rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                     "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
    layer_types=["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"] * 5 + ["full_attention"]
    + ["sliding_attention"] * 5 + ["full_attention"],
    bos_token_id=2, eos_token_id=1, pad_token_id=0, tie_word_embeddings=True,
)


def predicted_gib(method: str, T: int, n_params: int, cfg) -> float:
    """Peak memory the method needs at T tokens (float32), from its largest
    tensors: the weights, O(T) activations, and the T x T ones it holds."""
    H, L = cfg.num_attention_heads, cfg.num_hidden_layers
    base = 4 * n_params + 4 * T * (12 * cfg.hidden_size + 4 * cfg.intermediate_size + 3 * H * cfg.head_dim)
    square = 4 * T * T
    # Gu et al.'s code holds every layer's pattern, their concatenation, the full-size
    # tensor of query counts and the quotient at once: four L x H x T x T tensors
    extra = {"fused": 0, "floor": 0, "pattern": square * (2 + 3 * H), "gu": square * (2 + 3 * H + 4 * L * H)}[method]
    return (base + extra) / 2 ** 30


def build_model(args):
    import torch
    from transformers import AutoModelForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig

    attn = "eager" if args.child_method in ("pattern", "gu") else "sdpa"
    if args.random_weights:
        torch.manual_seed(0)
        cfg = Gemma3TextConfig(**GEMMA3_270M, attn_implementation=attn)
        with torch.device(args.device):  # initialised where it runs (a GPU fills 270M weights at once)
            model = Gemma3ForCausalLM(cfg)
    else:
        model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32, attn_implementation=attn)
    return model.to(args.device).eval()


def alpha0_fused(model, ids):
    """alpha_0 [layer head] through sinkmech's fused attention."""
    import torch

    from sinkmech.measures.fused import recording, register

    model.config._attn_implementation = register()
    with torch.no_grad(), recording((0,)) as rec:
        model.model(input_ids=ids, use_cache=False)
    return torch.stack([rec.weights[l][0, :, 0].mean(-1) for l in sorted(rec.weights)])


def no_attention(module, query, key, value, attention_mask, **kwargs):
    """A transformers attention function that attends to nothing: zeros of the output's shape."""
    return query.new_zeros(query.shape[0], query.shape[2], query.shape[1], value.shape[-1]), None


def forward_only(model, ids):
    """The forward pass with every layer's attention skipped (no lm head, nothing measured): None."""
    import torch
    from transformers import AttentionInterface

    AttentionInterface.register("bench_no_attention", no_attention)
    model.config._attn_implementation = "bench_no_attention"
    with torch.no_grad():
        model.model(input_ids=ids, use_cache=False)
    return None


def alpha0_pattern(model, ids):
    """alpha_0 [layer head] from each layer's eager pattern, reduced in a hook and dropped."""
    import torch

    found = {}

    def hook(module, inputs, output):
        found[module.layer_idx] = output[1][0, :, :, 0].float().mean(-1).cpu()
        return (output[0], None)  # the pattern is not kept

    handles = [layer.self_attn.register_forward_hook(hook) for layer in model.model.layers]
    try:
        with torch.no_grad():
            model.model(input_ids=ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return torch.stack([found[l] for l in sorted(found)])


def alpha0_gu(model, ids):
    """alpha_0 [layer head] as Gu et al.'s released code reads it (eval_sink_open_source.py in
    sail-sg/Attention-Sink): `generate` one token with `output_attentions=True`, every layer's
    pattern concatenated into one tensor and taken to NumPy (their code saves it to a .npy file
    and loads it back: here it stays in memory), then each key's importance score
    alpha_k = sum_t A[t, k] / (T - k) for every key, divided by a full-size tensor of query
    counts as they compute it; alpha_0 is key 0's."""
    import numpy as np
    import torch

    with torch.no_grad():
        out = model.generate(input_ids=ids, output_attentions=True, return_dict_in_generate=True, max_new_tokens=1,
                             do_sample=False, pad_token_id=0)
    layers = torch.cat(list(out["attentions"][0]), dim=0)  # [layer * batch, head, query, key]
    scores = torch.from_numpy(np.ascontiguousarray(layers.float().cpu().numpy()))[None]
    del out, layers
    T = scores.shape[-1]
    ratios = torch.arange(T, 0, -1)[None, None, None, :].expand(*scores.shape).to(scores)
    importance = (scores / ratios).sum(dim=-2)  # [sample, layer, head, key]
    return importance[0, :, :, 0]


def child(args) -> None:
    """One (method, T): load, warm up, time one pass; print one JSON line."""
    import torch

    torch.set_num_threads(args.threads)
    fn = {"fused": alpha0_fused, "pattern": alpha0_pattern, "gu": alpha0_gu, "floor": forward_only}[args.child_method]
    model = build_model(args)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (1, args.child_length), generator=g)
    ids[:, 0] = BOS
    ids = ids.to(args.device)
    fn(model, ids[:, :64])  # warm-up: kernels chosen, buffers allocated
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the resident high-water mark restarts at the current level: the load's transients apart
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.repeats if args.child_length <= REPEAT_UP_TO else 1):
        start = time.perf_counter()
        scores = fn(model, ids)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    seconds = min(times)
    from sinkmech.files import json_text

    print(json_text({
        "method": args.child_method, "T": args.child_length, "seconds": seconds, "times": times,
        "peak_rss_gib": peak_rss_kib() / 2 ** 20,
        "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2 ** 30 if cuda else None,
        "alpha0": None if scores is None else scores.tolist(),
    }, indent=None))


def peak_rss_kib() -> int:
    """The process's resident high-water mark (VmHWM) in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def available_gib(device: str) -> float:
    """Memory free for the method: the GPU's free memory on CUDA, MemAvailable on a CPU."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.mem_get_info(torch.device(device))[0] / 2 ** 30
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2 ** 20
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def model_size(args) -> tuple[int, object]:
    """(parameter count, config) without building the model."""
    from transformers import AutoConfig, Gemma3TextConfig

    cfg = Gemma3TextConfig(**GEMMA3_270M) if args.random_weights else AutoConfig.from_pretrained(args.model_dir)
    cfg = getattr(cfg, "text_config", None) or cfg
    d, f, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    attn = d * cfg.head_dim * (2 * cfg.num_attention_heads + 2 * cfg.num_key_value_heads)
    return cfg.vocab_size * d + L * (attn + 3 * d * f), cfg


def run_all(args) -> list[dict]:
    n_params, cfg = model_size(args)
    limit = args.memory_limit if args.memory_limit else 0.8 * available_gib(args.device)
    rows = []
    for method in args.methods:
        stopped = None
        for T in sorted(args.lengths):
            if stopped:  # a longer prompt needs at least as much: say where the method stopped
                rows.append({"method": method, "T": T, "skipped": f"not tried: {method} stopped at a shorter length"})
                continue
            need = predicted_gib(method, T, n_params, cfg)
            if need > limit:
                stopped = f"predicted {need:.1f} GiB > limit {limit:.1f} GiB"
                rows.append({"method": method, "T": T, "skipped": stopped})
                continue
            cmd = [sys.executable, __file__, "--child-method", method, "--child-length", str(T),
                   "--device", args.device, "--threads", str(args.threads), "--repeats", str(args.repeats)]
            cmd += ["--random-weights"] if args.random_weights else ["--model-dir", str(args.model_dir)]
            print(f"{method} T={T} ...", file=sys.stderr, flush=True)
            done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
            if done.returncode != 0 or not lines:
                tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:160]
                why = "killed (out of memory)" if done.returncode in (-9, 137) else f"failed: {tail}"
                stopped = why
                rows.append({"method": method, "T": T, "skipped": why})
                continue
            row = json.loads(lines[-1])
            row["predicted_gib"] = need
            rows.append(row)
            print(f"  {row['seconds']:.2f} s, peak RSS {row['peak_rss_gib']:.2f} GiB", file=sys.stderr, flush=True)
    return rows


def agreement(rows: list[dict]) -> dict[int, float]:
    """Per T: the largest |alpha_0| difference between any two methods that ran."""
    import torch

    out = {}
    for T in sorted({r["T"] for r in rows}):
        ran = [torch.tensor(r["alpha0"]) for r in rows if r["T"] == T and r.get("alpha0") is not None]
        if len(ran) > 1:
            out[T] = max(float((a - b).abs().max()) for i, a in enumerate(ran) for b in ran[i + 1:])
    return out


def table(rows: list[dict], args) -> str:
    by = {(r["method"], r["T"]): r for r in rows}
    lengths = sorted({r["T"] for r in rows})
    gpu = args.device.startswith("cuda")
    head = "| T | " + " | ".join(f"{m} s | {m} peak {'GPU' if gpu else 'RSS'} GiB" for m in args.methods)
    lines = [head + " | gu / fused | pattern / fused | gu / floor | fused / floor | max alpha_0 gap |",
             "|" + "---|" * (1 + 2 * len(args.methods) + 5)]
    gaps = agreement(rows)

    def cell(r):
        if "skipped" in r:
            return "-", "-"
        mem = r["peak_gpu_gib"] if gpu else r["peak_rss_gib"]
        return f"{r['seconds']:.2f}", f"{mem:.2f}"

    for T in lengths:
        cells = [c for m in args.methods for c in cell(by[(m, T)])]
        def ratio(m: str, over: str) -> str:
            a, f = by.get((m, T), {}), by.get((over, T), {})
            return f"{a['seconds'] / f['seconds']:.1f}x" if "seconds" in a and "seconds" in f else "-"

        gap = f"{gaps[T]:.1e}" if T in gaps else "-"
        ratios = [ratio("gu", "fused"), ratio("pattern", "fused"), ratio("gu", "floor"), ratio("fused", "floor")]
        lines.append(f"| {T:,} | " + " | ".join(cells + ratios) + f" | {gap} |")
    notes = [f"- {r['method']} at T = {r['T']:,}: not run ({r['skipped']})" for r in rows if "skipped" in r]
    return "\n".join(lines + [""] + notes) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=list(DEFAULT_LENGTHS))
    ap.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3,
                    help=f"timed passes at T <= {REPEAT_UP_TO} (the fastest is reported; one pass above it)")
    ap.add_argument("--random-weights", action="store_true",
                    help="Gemma 3 270M's architecture with random weights (no weights on this machine)")
    ap.add_argument("--model-dir", type=Path, default=None,
                    help="a Hugging Face folder of the model (default: sinkmech's converted Gemma 3 270M)")
    ap.add_argument("--memory-limit", type=float, default=None,
                    help="GiB a method may predict to use (default: 80 %% of the free memory, of the GPU on CUDA)")
    ap.add_argument("--out", type=Path, default=None, help="write bench_long.json and bench_long.md here")
    ap.add_argument("--child-method", choices=METHODS, help=argparse.SUPPRESS)
    ap.add_argument("--child-length", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not args.random_weights and args.model_dir is None:
        args.model_dir = gemma_folder()
    if args.child_method:
        return child(args)
    rows = run_all(args)
    text = table(rows, args)
    print(text)
    if args.out is not None:
        from sinkmech.files import json_text, write_text

        import torch

        meta = {"device": args.device, "threads": args.threads, "repeats": args.repeats, "torch": torch.__version__,
                "random_weights": args.random_weights, "lengths": sorted(args.lengths)}
        write_text(args.out / "bench_long.json", json_text({"settings": meta, "rows": rows,
                                                              "max_alpha0_gap": agreement(rows)}))
        write_text(args.out / "bench_long.md", text)


def gemma_folder() -> Path:
    """The Hugging Face folder sinkmech converted Gemma 3 270M into (loaded once on the Bridge)."""
    root = Path(os.environ.get("SINKMECH_CACHE", Path.home() / ".cache" / "sinkmech")) / "hf"
    for folder in sorted(root.glob("*")):
        config = folder / "config.json"
        if config.is_file() and '"gemma3' in config.read_text():
            return folder
    raise SystemExit("error: no converted Gemma 3 270M under ~/.cache/sinkmech/hf: load it once with the Bridge "
                     "(.venv-tl4: sinkmech sinks --model gemma3-270m), or pass --random-weights")


if __name__ == "__main__":
    main()
