#!/usr/bin/env bash
# GPU figures for the README: sinks, heads, ablate (exact
# sweep vs one forward pass per head) and the report on CUDA, in bfloat16 and
# float32, for SmolLM2 and Gemma 3 270M, on the installed backend
# (`sinkmech --version` names it). Times and peak GPU memory per command go to
# $OUT/bench_gpu.tsv. Nothing else needs a GPU.
#
# UNTESTED: written on a machine without a GPU; run it once on one and check
# the table before quoting it.
#
#   scripts/bench_gpu.sh [OUT_DIR]      (default bench_gpu/)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench_gpu}
PY=${PY:-python}
mkdir -p "$OUT"
if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "error: no CUDA device: this benchmark needs a GPU" >&2
  exit 2
fi
$PY -m sinkmech.cli --version | tee "$OUT/version.txt"
TSV="$OUT/bench_gpu.tsv"
printf 'model\tdtype\tcommand\tseconds\tpeak_gpu_mib\n' > "$TSV"

# Runs one sinkmech command in a fresh process and records its wall time and
# the peak GPU memory torch allocated (torch.cuda.max_memory_allocated).
run() {
  local model=$1 dtype=$2 name=$3; shift 3
  local start end peak
  start=$(date +%s.%N)
  peak=$($PY - "$@" <<'EOF'
import sys, contextlib, io, torch
from sinkmech.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    rc = main(sys.argv[1:])
if rc:
    sys.exit(rc)
print(torch.cuda.max_memory_allocated() / 2**20)
EOF
)
  end=$(date +%s.%N)
  printf '%s\t%s\t%s\t%.1f\t%.0f\n' "$model" "$dtype" "$name" "$(echo "$end - $start" | bc)" "$peak" | tee -a "$TSV"
}

for model in smollm2 gemma3-270m; do
  # one warm-up load so the converted-model cache is built outside the timings
  $PY -m sinkmech.cli sinks --model "$model" --device cuda --max-tokens 8 --prompts <(echo "warm up") >/dev/null 2>&1 || true
  for dtype in bfloat16 float32; do
    common=(--model "$model" --device cuda --dtype "$dtype")
    run "$model" "$dtype" sinks sinks "${common[@]}" --bos both --json "$OUT/${model}_${dtype}_sinks.json"
    run "$model" "$dtype" heads heads "${common[@]}" --json "$OUT/${model}_${dtype}_heads.json"
    run "$model" "$dtype" ablate ablate "${common[@]}" --mode mask_first --n-prompts 16 --json "$OUT/${model}_${dtype}_ablate.json"
    run "$model" "$dtype" report report "${common[@]}" --out "$OUT/${model}_${dtype}_report" --overwrite
  done
done

# The exact sweep against one forward pass per head, same prompts, same device.
for model in smollm2 gemma3-270m; do
  for dtype in bfloat16 float32; do
    $PY - "$model" "$dtype" <<'EOF' | tee -a "$OUT/sweep_vs_loop.txt"
import sys, time, torch
from sinkmech.interventions.ablation import head_ablations
from sinkmech.loading.models import load_model
from sinkmech.corpora import default_corpus
model = load_model(sys.argv[1], device="cuda", dtype=sys.argv[2])
prompts = default_corpus()[:16]
times = {}
for method in ("sweep", "loop"):
    torch.cuda.synchronize(); t = time.perf_counter()
    r = head_ablations(model, prompts, mode="mask_first", method=method, max_tokens=64, progress=False)
    torch.cuda.synchronize(); times[method] = time.perf_counter() - t
print(f"{sys.argv[1]} {sys.argv[2]}: sweep {times['sweep']:.1f} s, loop {times['loop']:.1f} s, "
      f"loop/sweep {times['loop'] / times['sweep']:.1f}x")
EOF
  done
done
echo "wrote $TSV and $OUT/sweep_vs_loop.txt"
