#!/usr/bin/env bash
# scripts/bench_long.py on a CUDA device: Gemma 3 270M's architecture with
# random weights (no model files needed: time and memory do not depend on the
# weights' values), the fused path, the pattern path and Gu et al.'s method at
# T = 1,024, 4,096, 16,384 and 32,768 (or the lengths given), each in its own
# process, in float32. Writes bench_long.md (the table), bench_long.json and
# bench_long.log into OUT_DIR.
#
# Needs python3 with torch (CUDA), transformers (5.x) and jaxtyping; nothing
# else of sinkmech's dependencies (no TransformerLens).
#
#   scripts/bench_long_gpu.sh OUT_DIR [LENGTH ...]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
  echo "usage: scripts/bench_long_gpu.sh OUT_DIR [LENGTH ...]" >&2
  exit 2
fi
OUT=$1
shift
LENGTHS=${*:-1024 4096 16384 32768}
PY=${PY:-python3}
if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "error: no CUDA device: this benchmark needs a GPU (scripts/bench_long.py runs on a CPU)" >&2
  exit 2
fi
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))" | tee "$OUT/bench_long.log"
# shellcheck disable=SC2086  # the lengths are words
$PY scripts/bench_long.py --device cuda --random-weights --lengths $LENGTHS --out "$OUT" 2>&1 | tee -a "$OUT/bench_long.log"
