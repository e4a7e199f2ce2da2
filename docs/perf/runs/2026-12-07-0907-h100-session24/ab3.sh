#!/usr/bin/env bash
# Session 24's third call: the FMA exponent (bf16/fp16) with finish()'s NaN guard: the whole GPU suite, then the A/B.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/attnprof-gpu}; mkdir -p "$OUT"; T0=$SECONDS
CUDNN_DIR=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$CUDNN_DIR:$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
BUILD_TARGET="attnprof attnprof_cuda attnprof_gpu_tests" scripts/gpu.sh build >"$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; echo "BUILD FAILED"; exit 1; }
echo "[ab3] built at $((SECONDS - T0)) s"
timeout 40 build/gpu/tests/attnprof_gpu_tests --gtest_filter='*ScoreRangeCuda*:*NanCuda*' >"$OUT/score_range.txt" 2>&1; echo "rc $?" >>"$OUT/score_range.txt"
grep -E "^\[  (PASSED|FAILED)|Failure|nan_rows|rc " "$OUT/score_range.txt" | head -30
timeout 200 build/gpu/tests/attnprof_gpu_tests --gtest_brief=1 >"$OUT/tests_all.txt" 2>&1; echo "all gpu tests rc $?" >>"$OUT/tests_all.txt"
echo "[ab3] suite at $((SECONDS - T0)) s"
grep -E "PASSED|FAILED|tests rc" "$OUT/tests_all.txt" | tail -12
AB_SHAPES=3 AB_ROUNDS=2 timeout $((575 - (SECONDS - T0))) bash scripts/softmax_ab.sh
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee -a "$OUT/ab.txt"
